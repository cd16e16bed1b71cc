"""The demo federation: three hospitals, their sites, pools, stewards, datasets and a project.

``demo_seed`` is what the README's first command runs after ``migrate``. The site-side half (writing
each hospital's CSV, ingesting it into that site's own encrypted store with that site's key) runs
through ``sandbox.ingest`` exactly as a site operator would; only the resulting metadata is registered
in the portal through ``sandbox.services``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

from allauth.account.models import EmailAddress
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from accounting.services.billing import price_rule_create
from federation.models import ComputePool
from portal.models import Institution, Project, Role, Site
from portal.services import membership_grant, project_create, project_member_add
from sandbox import demo_data
from sandbox import services as sandbox_services
from sandbox.ingest import ingest_csv
from sandbox.keyring import SiteKeyring
from sandbox.sitestore import site_dir
from sandbox.storage import FilesystemStore

DEMO_PASSWORD = "federated-demo-2026"  # noqa: S105 — printed by the run command; demo only
# EUR per service unit of each hospital's pool (1 SU per core-hour, 0.25 SU per GiB-hour): what a
# trusted research environment might charge for a core-hour of secure compute.
DEMO_PRICE_PER_UNIT = (Decimal("0.8000"), Decimal("0.6000"), Decimal("0.5000"))


@dataclass(frozen=True)
class DemoInstitution:
    slug: str
    name: str
    domain: str
    site: str
    site_name: str


INSTITUTIONS = (
    DemoInstitution(
        "st-aurelia",
        "St Aurelia University Hospital",
        "st-aurelia.example",
        "hospital-a",
        "St Aurelia oncology node",
    ),
    DemoInstitution(
        "northfield",
        "Northfield Medical Centre",
        "northfield.example",
        "hospital-b",
        "Northfield research node",
    ),
    DemoInstitution(
        "lakeside",
        "Lakeside Clinical Institute",
        "lakeside.example",
        "hospital-c",
        "Lakeside data centre node",
    ),
)


def _user(username: str, *, first: str, last: str, domain: str, staff: bool = False):
    User = get_user_model()
    user, created = User.objects.get_or_create(
        username=username,
        defaults={
            "email": f"{username}@{domain}",
            "first_name": first,
            "last_name": last,
            "is_staff": staff,
            "is_superuser": staff,
        },
    )
    if created:
        user.set_password(DEMO_PASSWORD)
        user.save()
    # Onboarded demo accounts have confirmed their address (sign-in requires it: mandatory
    # e-mail verification).
    EmailAddress.objects.update_or_create(
        user=user, email=user.email, defaults={"verified": True, "primary": True}
    )
    return user


def ingest_site_dataset(*, site: Site, steward, csv_path: Path, slug: str, title: str):
    """Site-side ingest of ``csv_path`` into the site's store, then register its metadata."""
    keyring = SiteKeyring(site_dir(site.slug) / "keyring")
    kek = keyring.get(site.slug) if keyring.exists(site.slug) else keyring.create(site.slug)
    version = sandbox_services.dataset_next_version(site=site, slug=slug)
    result = ingest_csv(
        csv_path,
        site=site.slug,
        dataset=slug,
        version=version,
        store=FilesystemStore(site_dir(site.slug) / "store"),
        kek=kek,
    )
    return sandbox_services.dataset_version_register(
        by=steward, site=site, slug=slug, title=title, version=version, result=result
    )


#: Mean grid intensity of each hospital's region (gCO2e/kWh), for the demo's carbon curves.
DEMO_CARBON_BASE = [380.0, 220.0, 520.0]


def _demo_pool_calendar(pool, n: int) -> None:
    """Night-time price bands (×0.6, 22–06 h) and a 7-day hourly carbon curve with a midday
    solar dip (amplitude 40 %) for a demo pool."""
    import math
    from datetime import timedelta

    from federation.models import CarbonReading, PriceBand

    night = pool.base_price * Decimal("0.6")
    for day in range(7):
        PriceBand.objects.create(
            pool=pool, weekday=day, start_minute=0, end_minute=360, price=night
        )
        PriceBand.objects.create(
            pool=pool, weekday=day, start_minute=1320, end_minute=1440, price=night
        )
    start = timezone.now().replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
    CarbonReading.objects.bulk_create(
        [
            CarbonReading(
                pool=pool,
                at=start + timedelta(hours=h),
                g_per_kwh=round(
                    DEMO_CARBON_BASE[n]
                    * (1 - 0.4 * math.cos(2 * math.pi * (((start.hour + h) % 24) - 13) / 24)),
                    1,
                ),
                source="csv",
            )
            for h in range(7 * 24 + 1)
        ]
    )


def demo_seed(*, canary: str | None = None) -> Project:
    """Create the demo world (idempotent): returns the demo project.

    Users (password ``DEMO_PASSWORD``): ``ada`` (researcher, St Aurelia, project PI), ``ben``
    (researcher, Northfield), ``steward-a/-b/-c`` (data stewards), ``admin-a`` (institution admin),
    ``platform`` (Django staff).
    """
    existing = Project.objects.filter(slug="breast-cancer-fl").first()
    if existing:
        return existing
    with transaction.atomic():
        platform = _user(
            "platform", first="Platform", last="Admin", domain="portal.example", staff=True
        )
        stewards, sites = {}, {}
        for n, spec in enumerate(INSTITUTIONS):
            inst = Institution.objects.create(
                slug=spec.slug, name=spec.name, email_domain=spec.domain
            )
            sites[spec.site] = Site.objects.create(
                institution=inst, slug=spec.site, name=spec.site_name
            )
            pool = ComputePool.objects.create(
                site=sites[spec.site],
                name=f"{spec.slug}-cpu",
                slots=2,
                cores=8,
                memory_gib=Decimal("32"),
                base_price=DEMO_PRICE_PER_UNIT[n],
                memory_weight=Decimal("0.25"),
                currency=settings.FRP_BILLING_CURRENCY,
                carbon_source="csv",
                carbon_default=DEMO_CARBON_BASE[n],
            )
            _demo_pool_calendar(pool, n)
            price_rule_create(
                by=platform,
                pool=pool,
                effective_from=timezone.localdate(),
                cpu_weight=Decimal("1"),
                memory_weight=Decimal("0.25"),
                gpu_weight=Decimal("0"),
                price_per_unit=DEMO_PRICE_PER_UNIT[n],
                currency=settings.FRP_BILLING_CURRENCY,
                data_credit_rate=Decimal("0.50"),
            )
            steward = _user(
                f"steward-{spec.site[-1]}",
                first=("Alma", "Bruno", "Chidi")[n],  # the data steward of each hospital
                last="Steward",
                domain=spec.domain,
            )
            membership_grant(by=platform, user=steward, institution=inst, role=Role.DATA_STEWARD)
            stewards[spec.site] = steward
            if n == 0:
                admin = _user("admin-a", first="Iris", last="Admin", domain=spec.domain)
                membership_grant(
                    by=platform, user=admin, institution=inst, role=Role.INSTITUTION_ADMIN
                )
        ada = _user("ada", first="Ada", last="Lovelace", domain=INSTITUTIONS[0].domain)
        ben = _user("ben", first="Ben", last="Okafor", domain=INSTITUTIONS[1].domain)
        first = Institution.objects.get(slug=INSTITUTIONS[0].slug)
        membership_grant(by=platform, user=ada, institution=first, role=Role.RESEARCHER)
        membership_grant(
            by=platform,
            user=ben,
            institution=Institution.objects.get(slug=INSTITUTIONS[1].slug),
            role=Role.RESEARCHER,
        )
        project = project_create(
            by=ada,
            slug="breast-cancer-fl",
            title="Federated breast-cancer diagnosis",
            institution=first,
            description="Logistic regression on the Wisconsin diagnostic features, across three hospitals.",
        )
        project_member_add(by=ada, project=project, user=ben)

    # Site side: each hospital writes and ingests its own CSV (outside the portal's transaction).
    incoming = settings.FRP_SITES_DIR / "_incoming"
    paths = demo_data.write_site_csvs(incoming, tuple(sites), canary=canary)
    for slug, site in sites.items():
        dv = ingest_site_dataset(
            site=site,
            steward=stewards[slug],
            csv_path=paths[slug],
            slug="breast-cancer",
            title="Breast cancer diagnostics",
        )
        # The demo's stewards opt in to Shapley-value contribution (off by default, ADR 0036):
        # the demo job shows each hospital's Shapley value.
        sandbox_services.dataset_rules_set(
            by=stewards[slug], dataset=dv.dataset, auto_release=False, shapley_opt_in=True
        )
        request = sandbox_services.access_request_create(
            by=ada,
            dataset=dv.dataset,
            project=project,
            purpose="Train a diagnostic classifier across hospitals (demo).",
        )
        sandbox_services.access_request_approve(
            by=stewards[slug],
            request=request,
            expires_at=timezone.now() + timedelta(days=180),
        )
        paths[slug].unlink()  # the plaintext was only ever the site's own incoming file
    return project
