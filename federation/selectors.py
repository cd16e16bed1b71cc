"""Reads of federated jobs, scoped to the user's projects, of the airlock, and of the local federation."""

from __future__ import annotations

from django.db.models import Count, Prefetch, Q

from federation.models import (
    FederatedJob,
    JobSite,
    ModelRelease,
    ReleaseStatus,
    RoundMetric,
    SiteRoundMetric,
)
from federation.runtime import LocalSite
from portal.models import Membership, Role, Site
from portal.selectors import projects_for_user
from sandbox.sitestore import site_dir


def _visible_jobs(user):
    """Jobs ``user`` may view (``portal.permissions`` ``job.view``), as one query."""
    if user.is_staff:
        return FederatedJob.objects.all()
    roles = Membership.objects.filter(user=user)
    part_of = roles.filter(role__in=[Role.DATA_STEWARD, Role.INSTITUTION_ADMIN])
    admin_of = roles.filter(role=Role.INSTITUTION_ADMIN)
    return FederatedJob.objects.filter(
        Q(project__in=projects_for_user(user=user))
        | Q(sites__site__institution__in=part_of.values("institution"))
        | Q(project__institution__in=admin_of.values("institution"))
    ).distinct()


def jobs_for_user(*, user):
    """Jobs the user may view, newest first, with project, submitter and round count: those of
    the user's projects, and those at the sites (or of projects) of institutions where the user
    is a data steward or admin."""
    return (
        _visible_jobs(user)
        .select_related("project", "submitted_by")
        .annotate(
            n_rounds=Count("round_metrics", distinct=True), n_sites=Count("sites", distinct=True)
        )
        .order_by("-created_at", "-id")
    )


def job_detail(*, user, pk: int) -> FederatedJob:
    """One job the user may view, with sites and their datasets; ``DoesNotExist`` otherwise."""
    return (
        _visible_jobs(user)
        .select_related("project", "submitted_by")
        .prefetch_related(
            Prefetch(
                "sites",
                queryset=JobSite.objects.select_related(
                    "site__institution", "dataset_version__dataset"
                ),
            )
        )
        .get(pk=pk)
    )


def job_progress(*, job: FederatedJob) -> dict:
    """Everything the live progress panel shows: rounds, per-site rows, chart series.

    Returns ``{"rounds": [RoundMetric], "sites": [JobSite], "site_rounds": {site_id: [SiteRoundMetric]},
    "chart": {"round": [int], "eval_accuracy": [float|None], "eval_loss": [...], "train_loss": [...]},
    "percent": int 0..100}``.
    """
    rounds = list(RoundMetric.objects.filter(job=job).order_by("round"))
    sites = list(job.sites.select_related("site__institution", "dataset_version__dataset"))
    site_rounds: dict[int, list[SiteRoundMetric]] = {s.pk: [] for s in sites}
    for m in SiteRoundMetric.objects.filter(job_site__job=job).order_by("round"):
        site_rounds[m.job_site_id].append(m)
    for s in sites:
        s.round_rows = site_rounds[s.pk]
        s.last_round = site_rounds[s.pk][-1] if site_rounds[s.pk] else None
    percent = 100 if job.status == "completed" else int(100 * len(rounds) / max(job.num_rounds, 1))
    return {
        "rounds": rounds,
        "sites": sites,
        "percent": min(percent, 100),
        "chart": {
            "round": [r.round for r in rounds],
            "eval_accuracy": [r.eval_accuracy for r in rounds],
            "eval_loss": [r.eval_loss for r in rounds],
            "train_loss": [r.train_loss for r in rounds],
        },
    }


def release_waiting_sites(*, job: FederatedJob, release) -> list:
    """Sites of ``job`` whose steward has not yet decided on ``release`` (``[]`` without one)."""
    if release is None:
        return []
    decided = set(release.decisions.values_list("site_id", flat=True))
    return [js.site for js in job.sites.select_related("site") if js.site_id not in decided]


def releases_for_steward(*, user):
    """Pending model releases with a participating site of an institution where ``user`` stewards,
    each with ``sites_to_decide``: that steward's sites that have not decided yet."""
    my_sites = set(
        Site.objects.filter(
            institution__memberships__user=user, institution__memberships__role=Role.DATA_STEWARD
        ).values_list("pk", flat=True)
    )
    releases = (
        ModelRelease.objects.filter(status=ReleaseStatus.PENDING, job__sites__site__in=my_sites)
        .select_related("job__project", "requested_by")
        .prefetch_related("decisions", "job__sites__site")
        .distinct()
    )
    out = []
    for release in releases:
        decided = {d.site_id for d in release.decisions.all()}
        release.sites_to_decide = [
            js.site
            for js in release.job.sites.all()
            if js.site_id in my_sites and js.site_id not in decided
        ]
        if release.sites_to_decide:
            out.append(release)
    return out


def local_sites() -> list[LocalSite]:
    """Every site registered in the portal that has a local directory (``sandbox.sitestore``):
    the local federation that ``manage.py federation_up`` starts, one SuperNode per site. Each
    SuperNode's authentication key lives in its site's directory (``supernode.key``)."""
    return [
        LocalSite(
            site=s.slug,
            store_url=f"file://{site_dir(s.slug) / 'store'}",
            keyring=str(site_dir(s.slug) / "keyring"),
            auth_key=str(site_dir(s.slug) / "supernode.key"),
        )
        for s in Site.objects.order_by("slug")
        if site_dir(s.slug).exists()
    ]
