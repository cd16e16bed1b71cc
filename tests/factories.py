"""factory_boy factories for the core models (tests build what they need, nothing more)."""

from __future__ import annotations

from datetime import timedelta

import factory
from django.contrib.auth import get_user_model
from django.utils import timezone

from federation.models import ComputePool, Site
from portal.models import Institution, Membership, Project, ProjectMember, ProjectRole, Role
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

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.org")
    password = factory.django.Password("pw-for-tests-123")


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


class PoolFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = ComputePool

    institution = factory.SubFactory(InstitutionFactory)
    name = factory.Sequence(lambda n: f"pool-{n}")
    slots = 1


class SiteFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Site

    institution = factory.SubFactory(InstitutionFactory)
    pool = factory.SubFactory(PoolFactory, institution=factory.SelfAttribute("..institution"))
    slug = factory.Sequence(lambda n: f"site-{n}")
    name = factory.LazyAttribute(lambda s: f"Site {s.slug}")


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
