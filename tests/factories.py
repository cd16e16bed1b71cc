"""factory_boy factories for the core models (tests build what they need, nothing more)."""

from __future__ import annotations

from datetime import timedelta

import factory
from django.contrib.auth import get_user_model
from django.utils import timezone

from federation.models import ComputePool
from portal.models import Institution, Membership, Project, ProjectMember, ProjectRole, Role, Site
from sandbox.models import AccessRequest, AccessStatus, Dataset, DatasetVersion

SCHEMA = [
    {"name": "x1", "type": "float"},
    {"name": "x2", "type": "float"},
    {"name": "label", "type": "str"},
]


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.org")
    password = factory.django.Password("pw-for-tests-123")

    @factory.post_generation
    def email_verified(self, create, extracted, **kwargs):
        """An onboarded account has confirmed its address (``email_verified=False`` to not)."""
        if create and self.email and extracted is not False:
            from allauth.account.models import EmailAddress

            EmailAddress.objects.get_or_create(
                user=self, email=self.email, defaults={"verified": True, "primary": True}
            )


class InstitutionFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Institution

    slug = factory.Sequence(lambda n: f"inst-{n}")
    name = factory.Sequence(lambda n: f"Institution {n}")


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    user = factory.SubFactory(UserFactory)
    institution = factory.SubFactory(InstitutionFactory)
    role = Role.RESEARCHER


class SiteFactory(factory.django.DjangoModelFactory):
    """A site with one compute pool of one slot (``pool__name=…``, ``pool__slots=…`` set it;
    ``pool=None`` makes a site without a pool)."""

    class Meta:
        model = Site
        skip_postgeneration_save = True

    institution = factory.SubFactory(InstitutionFactory)
    slug = factory.Sequence(lambda n: f"site-{n}")
    name = factory.LazyAttribute(lambda s: f"Site {s.slug}")
    pool = factory.RelatedFactory("tests.factories.PoolFactory", factory_related_name="site")


class PoolFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = ComputePool

    site = factory.SubFactory(SiteFactory, pool=None)
    name = factory.Sequence(lambda n: f"pool-{n}")
    slots = 1


class ProjectFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Project

    slug = factory.Sequence(lambda n: f"project-{n}")
    title = factory.Sequence(lambda n: f"Project {n}")
    institution = factory.SubFactory(InstitutionFactory)


class ProjectMemberFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = ProjectMember

    project = factory.SubFactory(ProjectFactory)
    user = factory.SubFactory(UserFactory)
    role = ProjectRole.MEMBER


class DatasetFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Dataset

    site = factory.SubFactory(SiteFactory)
    slug = factory.Sequence(lambda n: f"dataset-{n}")
    title = factory.LazyAttribute(lambda d: d.slug.title())
    # The test world's stewards opt in to Shapley values (most tests measure them); the product's
    # default is off (ADR 0036), and the tests of that path set it so.
    shapley_opt_in = True


class DatasetVersionFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = DatasetVersion

    dataset = factory.SubFactory(DatasetFactory)
    version = 1
    schema = factory.LazyFunction(lambda: list(SCHEMA))
    row_count = 100
    size_bytes = 4096
    ciphertext_sha256 = "0" * 64
    store_key = factory.LazyAttribute(
        lambda v: f"{v.dataset.site.slug}/{v.dataset.slug}/v1.csv.enc"
    )


class GrantFactory(factory.django.DjangoModelFactory):
    """An approved access request (a grant) valid for 30 days."""

    class Meta:
        model = AccessRequest

    dataset = factory.SubFactory(DatasetFactory)
    project = factory.SubFactory(ProjectFactory)
    purpose = "testing"
    status = AccessStatus.APPROVED
    expires_at = factory.LazyFunction(lambda: timezone.now() + timedelta(days=30))


# --- billing (accounting.services.billing) ------------------------------------------------------


class BillingJobFactory(factory.django.DjangoModelFactory):
    """A completed job of a project, finished at ``finished_at`` (no JobSite rows: add them)."""

    class Meta:
        model = "federation.FederatedJob"

    project = factory.SubFactory(ProjectFactory)
    submitted_by = factory.SubFactory(UserFactory)
    title = factory.Sequence(lambda n: f"Billed job {n}")
    target_column = "label"
    status = "completed"
    finished_at = factory.LazyFunction(timezone.now)


class BillingUsageFactory(factory.django.DjangoModelFactory):
    """A usage record (what the usage service writes after a job) for one job and site."""

    class Meta:
        model = "accounting.UsageRecord"

    job = factory.SubFactory(BillingJobFactory)
    site = factory.SubFactory(SiteFactory)
    rounds = 3
    cpu_seconds = 100.0
    wall_seconds = 3600.0
    cores = 1
    memory_gib = 1
    gpus = 0


class BillingShareFactory(factory.django.DjangoModelFactory):
    """A whole-run (round 0) contribution score of one site to one job."""

    class Meta:
        model = "accounting.ContributionScore"

    job = factory.SubFactory(BillingJobFactory)
    site = factory.SubFactory(SiteFactory)
    method = "exact"
    round = 0
    raw_value = factory.LazyAttribute(lambda s: s.share)
    share = 0.5


class PriceRuleFactory(factory.django.DjangoModelFactory):
    """A pool's price rule, written directly (the service refuses past start days)."""

    class Meta:
        model = "accounting.PriceRule"

    pool = factory.SubFactory(PoolFactory)
    effective_from = factory.LazyFunction(lambda: timezone.localdate().replace(year=2020))
    cpu_weight = 1
    memory_weight = 0
    gpu_weight = 0
    price_per_unit = "0.05"
    currency = "EUR"
    data_credit_rate = 0
