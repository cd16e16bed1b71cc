"""A portal at scale, built in seconds with ``bulk_create``: for ``benchmarks/pages.py`` (10,000
jobs) and for the tests that check list pages keep a flat number of queries as rows grow
(``tests/portal/test_list_queries.py``, a few dozen jobs).

One world: 10 institutions with one site each (and a compute pool), ``n_users`` users (each a
researcher at one institution), ``n_projects`` projects of 10 members, ``n_datasets`` datasets
with 2 versions, 20 access requests per project, ``n_jobs`` jobs at 3 sites each with ``rounds``
round metrics (and 3 × ``rounds`` site round metrics), a usage record, two billing entries (on
``months`` monthly invoices per institution, up to this month) and a ledger leaf per job site, 4
accounting steps per job (one job in 20 with a failed step), 3 audit events per job. Jobs'
``final_metrics`` hold a model and contribution figures as the ServerApp reports them. Four users
to sign in as: a *researcher* (member of every second project), a *data steward* and an
*institution admin* of the first institution, and a *platform admin* (``is_staff``).
"""

from __future__ import annotations

import random
import time
from collections import Counter

BATCH = 5000


# --- the rows ---------------------------------------------------------------------------------


def build(
    *,
    n_jobs: int,
    n_users: int = 2000,
    n_projects: int = 50,
    n_datasets: int = 200,
    rounds: int = 10,
    months: int = 36,
    tag: str = "",
    seed: int = 12,
) -> dict:
    """Fill the database with one world (see the module docstring); ``tag`` keeps the slugs,
    user names and e-mail addresses of several worlds in one database apart.

    Returns ``{"researcher", "steward", "inst_admin", "staff": User, "institution": Institution
    (the first), "job": a job of the researcher's, "project", "dataset", "invoice" (the first
    institution's latest), "counts": {what: rows}, "seconds": float}``."""
    import datetime as dt
    from decimal import Decimal

    from django.contrib.auth import get_user_model
    from django.db import connection, transaction
    from django.utils import timezone

    from accounting.models import (
        BillingEntry,
        BillingKind,
        Invoice,
        JobAccountingStep,
        UsageRecord,
    )
    from federation.models import (
        ComputePool,
        FederatedJob,
        JobSite,
        JobStatus,
        RoundMetric,
        SiteRoundMetric,
    )
    from portal.ledger.leaves import canonical_json
    from portal.ledger.merkle import leaf_hash
    from portal.ledger.models import LedgerEntry
    from portal.models import (
        AuditEvent,
        Institution,
        Membership,
        Project,
        ProjectMember,
        Role,
        Site,
    )
    from sandbox.models import AccessRequest, AccessStatus, Dataset, DatasetVersion

    rng = random.Random(seed)
    User = get_user_model()
    now = timezone.now()
    t0 = time.perf_counter()
    with transaction.atomic():
        insts = Institution.objects.bulk_create(
            Institution(
                slug=f"inst{tag}-{i}",
                name=f"Institution{tag} {i:02d}",
                email_domain=f"i{i}{tag}.example",
            )
            for i in range(10)
        )
        sites = Site.objects.bulk_create(
            Site(institution=inst, slug=f"site{tag}-{i}", name=f"Site{tag} {i}")
            for i, inst in enumerate(insts)
        )
        ComputePool.objects.bulk_create(ComputePool(site=s, name="default", slots=4) for s in sites)
        users = User.objects.bulk_create(
            User(
                username=f"user{tag}{i}",
                first_name=f"First{i}",
                last_name=f"Last{i:04d}",
                email=f"user{tag}{i}@i{i % 10}{tag}.example",
            )
            for i in range(n_users)
        )
        researcher, steward, inst_admin, staff = users[0], users[1], users[2], users[3]
        User.objects.filter(pk=staff.pk).update(is_staff=True, is_superuser=True)
        memberships = [
            Membership(user=u, institution=insts[i % 10], role=Role.RESEARCHER)
            for i, u in enumerate(users)
        ]
        memberships += [
            Membership(user=steward, institution=insts[0], role=Role.DATA_STEWARD),
            Membership(user=inst_admin, institution=insts[0], role=Role.INSTITUTION_ADMIN),
        ]
        Membership.objects.bulk_create(memberships)
        projects = Project.objects.bulk_create(
            Project(
                slug=f"project{tag}-{p}", title=f"Project{tag} {p:02d}", institution=insts[p % 10]
            )
            for p in range(n_projects)
        )
        pm = []
        for p, project in enumerate(projects):
            members = {researcher} if p % 2 == 0 else set()
            members |= set(rng.sample(users[4:], min(10, len(users) - 4) - len(members)))
            pm += [
                ProjectMember(project=project, user=u, role="pi" if i == 0 else "member")
                for i, u in enumerate(sorted(members, key=lambda u: u.pk))
            ]
        ProjectMember.objects.bulk_create(pm)
        schema = [{"name": f"x{i}", "type": "float"} for i in range(8)] + [
            {"name": "y", "type": "int"}
        ]
        datasets = Dataset.objects.bulk_create(
            Dataset(
                site=sites[d % 10],
                slug=f"data-{d}",
                title=f"Dataset{tag} {d:03d}",
                created_by=steward,
            )
            for d in range(n_datasets)
        )
        versions = DatasetVersion.objects.bulk_create(
            DatasetVersion(
                dataset=ds,
                version=v,
                schema=schema,
                row_count=1000 + d,
                size_bytes=50_000,
                ciphertext_sha256="0" * 64,
                store_key=f"{ds.slug}/v{v}",
                profile={"columns": []},
            )
            for d, ds in enumerate(datasets)
            for v in (1, 2)
        )
        latest = {v.dataset_id: v for v in versions if v.version == 2}
        statuses = [AccessStatus.APPROVED] * 6 + [AccessStatus.PENDING] * 3 + [AccessStatus.REFUSED]
        AccessRequest.objects.bulk_create(
            AccessRequest(
                dataset=datasets[(p * 20 + k) % n_datasets],
                project=project,
                requested_by=users[4 + p % (n_users - 4)],
                purpose="Federated training of a readmission model.",
                status=statuses[k % len(statuses)],
            )
            for p, project in enumerate(projects)
            for k in range(20)
        )

        final = {
            "eval_accuracy": 0.81,
            "eval_loss": 0.43,
            "model": [[round(rng.random(), 6) for _ in range(9)] for _ in range(2)] + [[0.1, 0.2]],
            "contribution": {f"site-{s}": round(rng.random(), 4) for s in range(3)},
        }
        jobs = FederatedJob.objects.bulk_create(
            (
                FederatedJob(
                    project=projects[j % n_projects],
                    submitted_by=users[4 + j % (n_users - 4)],
                    title=f"Job {j}",
                    status=JobStatus.COMPLETED if j % 20 else JobStatus.FAILED,
                    target_column="y",
                    feature_columns=[f"x{i}" for i in range(8)],
                    num_rounds=rounds,
                    flower_run_id=str(10**12 + j),
                    final_metrics=final,
                    started_at=now,
                    finished_at=now,
                )
                for j in range(n_jobs)
            ),
            batch_size=BATCH,
        )
        job_sites = []
        for job in jobs:
            for s in rng.sample(range(10), 3):
                ds = datasets[(s + 10 * rng.randrange(max(1, n_datasets // 10))) % n_datasets]
                job_sites.append(
                    JobSite(
                        job=job,
                        site=sites[s],
                        dataset_version=latest[ds.pk],
                        status="completed",
                        rounds_completed=rounds,
                        final_metrics={"eval_examples": 200, "eval_accuracy": 0.8},
                    )
                )
        job_sites = JobSite.objects.bulk_create(job_sites, batch_size=BATCH)
        RoundMetric.objects.bulk_create(
            (
                RoundMetric(
                    job=job,
                    round=r,
                    train_loss=0.5,
                    eval_loss=0.45,
                    eval_accuracy=0.8,
                    num_examples=3000,
                    sites_replied=3,
                    wall_seconds=1.0,
                )
                for job in jobs
                for r in range(1, rounds + 1)
            ),
            batch_size=BATCH,
        )
        SiteRoundMetric.objects.bulk_create(
            (
                SiteRoundMetric(
                    job_site=js,
                    round=r,
                    train_examples=800,
                    eval_examples=200,
                    train_loss=0.5,
                    eval_loss=0.45,
                    eval_accuracy=0.8,
                    cpu_seconds=0.1,
                    wall_seconds=0.2,
                )
                for js in job_sites
                for r in range(1, rounds + 1)
            ),
            batch_size=BATCH,
        )
        UsageRecord.objects.bulk_create(
            (
                UsageRecord(
                    job_id=js.job_id,
                    site_id=js.site_id,
                    rounds=rounds,
                    cpu_seconds=1.0,
                    wall_seconds=2.0,
                    reserved_seconds=600.0,
                )
                for js in job_sites
            ),
            batch_size=BATCH,
        )
        today = timezone.localdate()
        n_months = months
        months = [
            dt.date(today.year - 3 + (today.month - 1 + m) // 12, (today.month - 1 + m) % 12 + 1, 1)
            for m in range(36 - n_months + 1, 36 + 1)
        ]
        invoices = Invoice.objects.bulk_create(
            Invoice(institution=inst, month=m, charges=Decimal("10.00"), total=Decimal("10.00"))
            for inst in insts
            for m in months
        )
        by_inst_month = {(i.institution_id, i.month): i for i in invoices}
        project_inst = {p.pk: p.institution_id for p in projects}
        job_project = {job.pk: job.project_id for job in jobs}
        site_inst = {s.pk: s.institution_id for s in sites}
        entries = []
        for js in job_sites:
            month = months[(js.job_id // 7) % len(months)]
            payer = project_inst[job_project[js.job_id]]
            payee = site_inst[js.site_id]
            entries += [
                BillingEntry(
                    job_id=js.job_id,
                    site_id=js.site_id,
                    kind=BillingKind.COMPUTE_CHARGE,
                    institution_id=payer,
                    amount=Decimal("1.00"),
                    service_units=Decimal("0.1667"),
                    invoice=by_inst_month[(payer, month)],
                ),
                BillingEntry(
                    job_id=js.job_id,
                    site_id=js.site_id,
                    kind=BillingKind.COMPUTE_CREDIT,
                    institution_id=payee,
                    amount=Decimal("1.00"),
                    service_units=Decimal("0.1667"),
                    invoice=by_inst_month[(payee, month)],
                ),
            ]
        BillingEntry.objects.bulk_create(entries, batch_size=BATCH)
        steps = []
        for j, job in enumerate(jobs):
            for k, step in enumerate(("usage", "contribution", "billing", "credit")):
                failed = j % 20 == 0 and k == 2
                steps.append(
                    JobAccountingStep(
                        job=job,
                        step=step,
                        status="failed" if failed else "done",
                        attempts=1,
                        error="The pool has no price rule in effect." if failed else "",
                    )
                )
        JobAccountingStep.objects.bulk_create(steps, batch_size=BATCH)
        leaves = []
        first = LedgerEntry.objects.count()
        for n, js in enumerate(job_sites, start=first):
            data = canonical_json(
                {"kind": "usage", "job": js.job_id, "site": js.site_id, "cpu_seconds": "1.0"}
            )
            leaves.append(
                LedgerEntry(index=n, kind="usage", data=data.decode(), leaf_hash=leaf_hash(data))
            )
        LedgerEntry.objects.bulk_create(leaves, batch_size=BATCH)
        AuditEvent.objects.bulk_create(
            (
                AuditEvent(
                    actor_id=job.submitted_by_id,
                    institution_id=project_inst[job.project_id],
                    action=action,
                    target_type="job",
                    target_id=str(job.pk),
                    data={"title": job.title},
                )
                for job in jobs
                for action in ("job.submit", "job.launch", "job.finish")
            ),
            batch_size=BATCH,
        )
        # Spread the times as a real history would be (newest job last); bulk_create stamps now().
        with connection.cursor() as cur:
            cur.execute(
                "UPDATE federation_federatedjob SET created_at = now() - (%s - id) * interval "
                "'7 minutes', finished_at = now() - (%s - id) * interval '7 minutes'",
                [jobs[-1].pk, jobs[-1].pk],
            )
            cur.execute(
                "UPDATE portal_auditevent SET created_at = now() - (%s - id) * interval '2 minutes'",
                [AuditEvent.objects.order_by("-pk").values_list("pk", flat=True).first()],
            )
            cur.execute("ANALYZE")
    counts = {
        "jobs": len(jobs),
        "job sites": len(job_sites),
        "round metrics": RoundMetric.objects.count(),
        "site round metrics": SiteRoundMetric.objects.count(),
        "billing entries": len(entries),
        "ledger leaves": len(leaves),
        "audit events": AuditEvent.objects.count(),
        "accounting steps": len(steps),
    }
    return {
        "researcher": researcher,
        "steward": steward,
        "inst_admin": inst_admin,
        "staff": User.objects.get(pk=staff.pk),
        "institution": insts[0],
        "job": jobs[(len(jobs) // 2) & ~1],  # an even index: a project of the researcher's
        "project": projects[0],
        "dataset": datasets[0],
        # the first institution's invoice with the most lines
        "invoice": Counter(
            e.invoice for e in entries if e.institution_id == insts[0].pk
        ).most_common(1)[0][0],
        "counts": counts,
        "seconds": time.perf_counter() - t0,
    }


def find(*, tag: str = "") -> dict | None:
    """The world ``build(tag=tag)`` left in the database (``benchmarks/pages.py --reuse``), as
    ``build`` returned it (``seconds`` 0), or None when there is none."""
    from collections import Counter as _Counter

    from django.contrib.auth import get_user_model

    from accounting.models import BillingEntry, JobAccountingStep
    from federation.models import FederatedJob, JobSite, RoundMetric, SiteRoundMetric
    from portal.ledger.models import LedgerEntry
    from portal.models import AuditEvent, Institution, Project
    from sandbox.models import Dataset

    User = get_user_model()
    institution = Institution.objects.filter(slug=f"inst{tag}-0").first()
    if institution is None:
        return None
    project = Project.objects.get(slug=f"project{tag}-0")
    jobs = FederatedJob.objects.filter(project__slug__startswith=f"project{tag}-").order_by("pk")
    n_jobs = jobs.count()
    by_invoice = _Counter(
        BillingEntry.objects.filter(institution=institution)
        .order_by("pk")
        .values_list("invoice", flat=True)
    )
    users = {
        who: User.objects.get(username=f"user{tag}{i}")
        for i, who in enumerate(("researcher", "steward", "inst_admin", "staff"))
    }
    return {
        **users,
        "institution": institution,
        "job": jobs[(n_jobs // 2) & ~1],
        "project": project,
        "dataset": Dataset.objects.filter(site__institution__slug__startswith=f"inst{tag}-")
        .order_by("pk")
        .first(),
        "invoice": institution.invoices.get(pk=by_invoice.most_common(1)[0][0]),
        "counts": {
            "jobs": n_jobs,
            "job sites": JobSite.objects.count(),
            "round metrics": RoundMetric.objects.count(),
            "site round metrics": SiteRoundMetric.objects.count(),
            "billing entries": BillingEntry.objects.count(),
            "ledger leaves": LedgerEntry.objects.count(),
            "audit events": AuditEvent.objects.count(),
            "accounting steps": JobAccountingStep.objects.count(),
        },
        "seconds": 0.0,
    }


def list_pages(world: dict) -> list[tuple[str, str, str]]:
    """``(who, label, url)`` of every list page of the URL configuration (and the job page, the
    benchmark's reference), ``who`` being the key of the user in ``world`` to sign in as. Pages
    the user sees as a list: catalogue, queues, members, audit, invoices, the ledger, the
    accounting lists and Django's admin lists of the big tables."""
    slug = world["institution"].slug
    return [
        ("researcher", "job page (reference)", f"/jobs/{world['job'].pk}/"),
        ("researcher", "dashboard", "/"),
        ("researcher", "jobs", "/jobs/"),
        ("researcher", "jobs, last page", "/jobs/?page=last"),
        ("researcher", "datasets", "/datasets/"),
        ("researcher", "dataset page (grants, versions)", f"/datasets/{world['dataset'].pk}/"),
        ("researcher", "projects", "/projects/"),
        (
            "researcher",
            "project page (members, grants, jobs)",
            f"/projects/{world['project'].slug}/",
        ),
        ("researcher", "ledger", "/ledger/"),
        ("steward", "jobs", "/jobs/"),
        ("steward", "access requests", "/access-requests/"),
        ("steward", "access requests, pending", "/access-requests/?status=pending"),
        ("inst_admin", "jobs", "/jobs/"),
        ("inst_admin", "institution members", f"/institutions/{slug}/members/"),
        ("inst_admin", "institution sites", f"/institutions/{slug}/sites/"),
        ("inst_admin", "institution audit", f"/institutions/{slug}/audit/"),
        (
            "inst_admin",
            "institution billing (invoices)",
            f"/accounting/institutions/{slug}/billing/",
        ),
        ("inst_admin", "invoice page (lines)", f"/accounting/invoices/{world['invoice'].pk}/"),
        ("inst_admin", "institution prices", f"/accounting/institutions/{slug}/prices/"),
        ("inst_admin", "institution accounting", f"/accounting/institutions/{slug}/jobs/"),
        ("staff", "jobs", "/jobs/"),
        ("staff", "accounting failures", "/accounting/jobs/"),
        ("staff", "admin: jobs", "/admin/federation/federatedjob/"),
        ("staff", "admin: accounting steps", "/admin/accounting/jobaccountingstep/"),
        ("staff", "admin: audit events", "/admin/portal/auditevent/"),
        ("staff", "admin: memberships", "/admin/portal/membership/"),
        ("staff", "admin: access requests", "/admin/sandbox/accessrequest/"),
    ]
