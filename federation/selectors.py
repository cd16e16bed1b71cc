"""Reads of federated jobs, scoped to the user's projects, of the airlock, and of the local federation."""

from __future__ import annotations

import contextlib

from django.conf import settings
from django.db.models import Count, FloatField, IntegerField, OuterRef, Prefetch, Q, Subquery
from django.db.models.fields.json import KT
from django.db.models.functions import Cast, Coalesce

from federation import runtime, superlink
from federation.disclosure import (
    baseline_released,
    class_counts,
    contribution_released,
    metric_shown,
    metrics_released,
    site_classes,
    site_held_out,
)
from federation.models import (
    FederatedJob,
    JobSite,
    ModelRelease,
    ReleaseStatus,
    RoundMetric,
    SiteRoundMetric,
)
from federation.runtime import LocalSite
from frp_flwr.contract import SMALL_COUNT
from portal.models import Membership, Project, ProjectMember, Role, Site
from sandbox.selectors import shapley_not_opted_in as sandbox_shapley_not_opted_in
from sandbox.selectors import stewarded_institution_ids
from sandbox.sitestore import site_dir
from sandbox.templatetags.sandbox_tags import disclosed, disclosed_sum

# A job's columns that lists of jobs (and of their steps, lines …) do not show, the widest first
# (``final_metrics`` holds the model, about 2 kB): ``defer`` them there (issue 12).
JOB_WIDE_FIELDS = (
    "final_metrics",
    "feature_columns",
    "preprocessing",
    "preparation",
    "model_spec",
    "strategy_spec",
    "privacy",
    "earlier_runs",
    "status_detail",
    "failure_reason",
)


def _visible_jobs(user):
    """Jobs ``user`` may view (``portal.permissions`` ``job.view``), as one query.

    Each way in is an ``IN (subquery)`` on the job's own columns, so the result has one row per
    job without a ``DISTINCT`` over joined rows (issue 12): the job list and its count stay cheap
    at any number of jobs, sites and rounds."""
    if user.is_staff:
        return FederatedJob.objects.all()
    roles = Membership.objects.filter(user=user)
    part_of = roles.filter(role__in=[Role.DATA_STEWARD, Role.INSTITUTION_ADMIN])
    admin_of = roles.filter(role=Role.INSTITUTION_ADMIN)
    return FederatedJob.objects.filter(
        Q(project__in=ProjectMember.objects.filter(user=user).values("project_id"))
        | Q(
            pk__in=JobSite.objects.filter(
                site__institution__in=part_of.values("institution_id")
            ).values("job_id")
        )
        | Q(
            project__in=Project.objects.filter(
                institution__in=admin_of.values("institution_id")
            ).values("pk")
        )
    )


def _count_of(model, fk: str):
    """A correlated ``COUNT(*)`` of ``model`` rows whose ``fk`` is the outer job (0 when none)."""
    rows = (
        model.objects.filter(**{fk: OuterRef("pk")})
        .order_by()
        .values(fk)
        .annotate(n=Count("*"))
        .values("n")
    )
    return Coalesce(Subquery(rows, output_field=IntegerField()), 0)


def jobs_for_user(*, user):
    """Jobs the user may view, newest first: those of the user's projects, and those at the sites
    (or of projects) of institutions where the user is a data steward or admin.

    Each job has ``project`` and ``submitted_by`` joined and ``n_rounds`` (rounds reported),
    ``n_sites`` (participating sites) and ``accuracy`` (``final_metrics["eval_accuracy"]``,
    float or ``None``) annotated; ``final_metrics`` itself (which holds the model) is deferred.
    The counts are correlated subqueries, evaluated only for the rows of the page, and dropped
    from the paginator's ``COUNT(*)`` (issue 12)."""
    return (
        _visible_jobs(user)
        .select_related("project", "submitted_by")
        .defer("final_metrics", "feature_columns", "status_detail", "failure_reason")
        .annotate(
            n_rounds=_count_of(RoundMetric, "job"),
            n_sites=_count_of(JobSite, "job"),
            accuracy=Cast(KT("final_metrics__eval_accuracy"), FloatField()),
        )
        .order_by("-created_at", "-id")
    )


def accuracy_shown(jobs, *, user) -> list[FederatedJob]:
    """``jobs`` (a page of :func:`jobs_for_user`) as a list, each job's ``accuracy`` as ``user``
    may see it (``federation.disclosure``: exact for a steward of every site, else snapped to the
    grid of the sites' released held-out rows; issue 9). One query for the page's job sites."""
    jobs = list(jobs)
    shown = [j for j in jobs if getattr(j, "accuracy", None) is not None]
    if not shown:
        return jobs
    stewarded = stewarded_institution_ids(user=user)
    by_job: dict[int, list[JobSite]] = {j.pk: [] for j in shown}
    for js in (
        JobSite.objects.filter(job__in=list(by_job))
        .select_related("site")
        .only("job_id", "final_metrics", "site__institution_id")
    ):
        by_job[js.job_id].append(js)
    for j in shown:
        sites = by_job[j.pk]
        every = bool(sites) and all(js.site.institution_id in stewarded for js in sites)
        j.accuracy = metric_shown("accuracy", j.accuracy, rows=site_held_out(sites), exact=every)
    return jobs


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


def shapley_not_opted_in(*, job: FederatedJob) -> list[str]:
    """Slugs of ``job``'s sites whose dataset's steward has not opted in to Shapley-value
    contribution (``sandbox.selectors.shapley_not_opted_in``), sorted; ``[]`` when every one
    has. The live setting: what the job's next launch will run under (``job.shapley_consent``
    records what its last launch ran under). One query."""
    return sandbox_shapley_not_opted_in(version_ids=job.sites.values("dataset_version_id"))


def shown_count(count: int | None, *, exact: bool) -> int | str | None:
    """A site's row count as ``exact`` (its own stewards) or under the profile's disclosure rule
    (everyone else: ``"≈150"``, ``"≤7"``, ``"0"``; ``sandbox.profile.safe_count``)."""
    if count is None:
        return None
    return int(count) if exact else disclosed(count)


def job_progress(*, job: FederatedJob, user=None) -> dict:
    """Everything the live progress panel shows: rounds, per-site rows, chart series.

    Returns ``{"rounds": [RoundMetric], "sites": [JobSite], "site_rounds": {site_id: [SiteRoundMetric]},
    "chart": {"round": [int], "eval_accuracy": [float|None], "eval_loss": [...], "train_loss": [...]},
    "percent": int 0..100, "lost": [{"site": slug, "round": int, "error": text}],
    "final_metrics": dict}``. A site is *lost* in the first round it did not reply in (its
    SuperNode went offline, its ClientApp failed, it was dropped or its figures were refused);
    each site row also gets ``lost_round`` (``None`` when not lost). Each site carries
    ``train_rows``/``test_rows`` (its latest round's) and ``final_metrics`` the job's (without the
    model, and without the fitted preprocessing unless ``user`` stewards every site), with row
    counts exact only for ``user``'s own sites as a data steward, else under the disclosure rule
    (:func:`shown_count`): the examples a site trains and evaluates on are its dataset's rows.
    """
    rounds = list(RoundMetric.objects.filter(job=job).order_by("round"))
    sites = list(job.sites.select_related("site__institution", "dataset_version__dataset", "pool"))
    site_rounds: dict[int, list[SiteRoundMetric]] = {s.pk: [] for s in sites}
    for m in SiteRoundMetric.objects.filter(job_site__job=job).order_by("round"):
        site_rounds[m.job_site_id].append(m)
    stewarded = stewarded_institution_ids(user=user) if user is not None else set()
    exact = {s.site.slug: s.site.institution_id in stewarded for s in sites}
    lost = []
    for s in sites:
        s.round_rows = site_rounds[s.pk]
        s.last_round = site_rounds[s.pk][-1] if site_rounds[s.pk] else None
        last = s.last_round
        s.train_rows = shown_count(last.train_examples if last else None, exact=exact[s.site.slug])
        s.test_rows = shown_count(last.eval_examples if last else None, exact=exact[s.site.slug])
        failed = next((m for m in s.round_rows if not m.ok), None)
        s.lost_round = failed.round if failed else None
        if failed:
            lost.append({"site": s.site.slug, "round": failed.round, "error": failed.error})
        # Figures over the site's held-out rows, as the viewer may see them (issue 9): the
        # instances are for display only and never saved.
        for m in s.round_rows:
            _round_shown(m, [m.eval_examples], exact=exact[s.site.slug])
        final = s.final_metrics or {}
        accuracy = final.get("eval_accuracy")
        s.accuracy = metric_shown(
            "accuracy",
            accuracy if accuracy is not None else (last.eval_accuracy if last else None),
            rows=[int(final.get("eval_examples") or (last.eval_examples if last else 0))],
            exact=exact[s.site.slug],
        )
    every = bool(exact) and all(exact.values())
    rows_by_round: dict[int, list[int]] = {}
    for ms in site_rounds.values():
        for m in ms:
            if m.ok:
                rows_by_round.setdefault(m.round, []).append(m.eval_examples)
    for r in rounds:
        _round_shown(r, rows_by_round.get(r.round, []), exact=every)
    percent = 100 if job.status == "completed" else int(100 * len(rounds) / max(job.num_rounds, 1))
    held_out = site_held_out(sites, last={s.pk: s.last_round for s in sites})
    return {
        "rounds": rounds,
        "sites": sites,
        "final_metrics": _final_metrics_shown(
            job.final_metrics, exact, held_out, classes=site_classes(sites)
        ),
        "percent": min(percent, 100),
        "lost": lost,
        "chart": {
            "round": [r.round for r in rounds],
            "eval_accuracy": [r.eval_accuracy for r in rounds],
            "eval_loss": [r.eval_loss for r in rounds],
            "train_loss": [r.train_loss for r in rounds],
        },
    }


def _round_shown(metric, rows: list[int], *, exact: bool) -> None:
    """Sets a ``RoundMetric``'s or ``SiteRoundMetric``'s accuracy and losses (in memory, for
    display; never saved) as a viewer who is not ``exact`` may see them
    (``federation.disclosure``): the accuracy over ``rows``, the losses as measures."""
    if exact:
        return
    for key in ("eval_accuracy", "eval_loss", "train_loss"):
        value = getattr(metric, key)
        setattr(metric, key, metric_shown(key, value, rows=rows, exact=False))


def pooled_shown(total: int | None, site_counts: list[int], *, exact: bool) -> int | str | None:
    """A pooled held-out total as ``exact`` (a steward of every site) or, for everyone else, the
    sum of the sites' released counts (``disclosed_sum``; the rule on the exact total if no site
    count is known). The rule on the exact total is not enough: less one's own site's exact rows
    it narrows the other's to fewer values than its own released count, often to one."""
    if total is None or exact:
        return total
    return disclosed_sum(site_counts) if site_counts else disclosed(total)


def cell_shown(count, *, exact: bool):
    """A confusion-matrix cell as ``exact`` viewers see it (1–7 as ``"≤ 7"``, :func:`small`) or,
    for everyone else, under the profile's rule (``disclosed``: ``"≈45"``, ``"≤7"``, ``"0"``):
    exact cells add up to the held-out rows of the site (or of all sites), which others see only
    rounded (issue 9, finding 5)."""
    if exact or not isinstance(count, int):
        return small(count)
    return disclosed(count)


def metrics_shown(metrics, *, exact: bool, examples) -> dict | None:
    """A ``Metrics`` document with its ``examples`` replaced by ``examples`` (as shown) and its
    confusion cells by :func:`cell_shown`; anything else as it is."""
    if not isinstance(metrics, dict):
        return metrics
    out = dict(metrics)
    if "examples" in out:
        out["examples"] = examples
    if out.get("confusion"):
        out["confusion"] = [[cell_shown(c, exact=exact) for c in row] for row in out["confusion"]]
    return out


def _final_metrics_shown(
    final: dict, exact: dict[str, bool], held_out: list[int], *, classes=()
) -> dict:
    """``job.final_metrics`` without the model, its row counts under :func:`shown_count`: the
    total held-out rows (and the pooled metrics' examples and confusion cells) exact only for a
    steward of every site, else from the sites' released counts (:func:`pooled_shown`), each
    site's in the contribution only for its own stewards. The fitted ``preprocessing`` only for
    a steward of every site: its one-hot and missing-indicator statistics are shares of the
    pooled training rows, exact in jobs fitted before issue 9, finding 5 (ADR 0036); everyone
    else gets it in the model file once the airlock has released it. The metrics, the baseline
    and the coalition utilities are fractions over the held-out rows: exact for a steward of
    every site, else as ``federation.disclosure`` releases them (issue 9)."""
    out = {k: v for k, v in final.items() if k != "model"}
    every = bool(exact) and all(exact.values())
    if not every:
        out.pop("preprocessing", None)
        for key in ("eval_accuracy", "eval_loss"):
            if key in out:
                out[key] = metric_shown(key, out[key], rows=held_out, exact=False)
        if "baseline" in out:
            out["baseline"] = baseline_released(out["baseline"], rows=held_out, exact=False)
    if "eval_examples" in out:
        out["eval_examples"] = pooled_shown(out["eval_examples"], held_out, exact=every)
    if isinstance(out.get("metrics"), dict):
        examples = out["metrics"].get("examples")
        out["metrics"] = metrics_released(
            metrics_shown(
                out["metrics"], exact=every, examples=pooled_shown(examples, held_out, exact=every)
            ),
            rows=held_out,
            classes=classes,
            exact=every,
        )
    contribution = contribution_released(out.get("contribution"), site_rows=held_out, exact=every)
    if isinstance(contribution, dict):
        contribution = dict(contribution)
        contribution["examples"] = {
            site: shown_count(n, exact=exact.get(site, False))
            for site, n in (contribution.get("examples") or {}).items()
        }
        contribution["sites"] = {
            site: {
                **m,
                "examples": shown_count(m.get("examples"), exact=exact.get(site, False)),
            }
            for site, m in (contribution.get("sites") or {}).items()
        }
        out["contribution"] = contribution
    return out


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
        job_sites = list(release.job.sites.all())
        # Shown as a steward of these sites only may see it (issue 9; federation.disclosure).
        release.accuracy = metric_shown(
            "accuracy",
            (release.job.final_metrics or {}).get("eval_accuracy"),
            rows=site_held_out(job_sites),
            exact=bool(job_sites) and all(js.site_id in my_sites for js in job_sites),
        )
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


def job_estimates(
    *, project, versions, num_rounds: int, local_epochs: int, schedule: dict, model: str = "linear"
):
    """For each schedule policy, what the scheduler would plan for this job if submitted now:
    a list of dicts ``policy``, ``label``, ``action``, ``reason``, ``start``, ``end`` (aware
    datetimes or ``None``), ``cost`` (``Decimal`` or ``None``), ``energy_kwh``, ``emissions_g``,
    ``late`` and ``detail``; plus the estimated run time in seconds as ``duration_s``, from the
    history of jobs of the same ``model`` kind and the rows as released
    (``admission.job_duration_estimate``)."""
    from datetime import UTC, datetime
    from decimal import Decimal

    from federation import admission, scheduling
    from federation.models import SchedulePolicy

    duration = admission.job_duration_estimate(
        model=model, num_rounds=num_rounds, local_epochs=local_epochs, versions=versions
    )
    request = scheduling.Resources(
        int(schedule["cores"]), float(schedule["memory_gib"]), int(schedule["gpus"])
    )
    decisions = admission.policy_estimates(
        project=project,
        site_demands={v.dataset.site_id: request for v in versions},
        duration_s=duration,
        deadline=schedule.get("deadline"),
        budget_cap=schedule.get("budget_cap"),
    )

    def at(seconds):
        return datetime.fromtimestamp(seconds, tz=UTC) if seconds is not None else None

    rows = []
    for policy, label in SchedulePolicy.choices:
        d = decisions[policy]
        rows.append(
            {
                "policy": policy,
                "label": label,
                "action": str(d.action),
                "reason": "" if d.action == "start" else str(d.reason),
                "start": at(d.start_s),
                "end": at(d.end_s),
                "cost": Decimal(str(round(d.cost, 2))) if d.cost is not None else None,
                "energy_kwh": d.energy_kwh,
                "emissions_g": d.emissions_g,
                "late": d.late,
                "detail": d.detail,
            }
        )
    return {"duration_s": duration, "rows": rows}


def site_energy(*, site, cpu_seconds: float, start, end, gpu_seconds: float = 0.0, pool=None):
    """``(kWh, mean gCO2e/kWh, gCO2e)`` of ``cpu_seconds`` (and ``gpu_seconds``) of work at
    ``site`` during ``[start, end)``: the power figures of ``pool`` (the pool the job ran on,
    recorded on its ``JobSite``; the site's first pool when ``None``) and the time-weighted mean
    of its carbon readings over the run (``scheduling.energy``); the pool's default intensity
    where it has no reading. ``None`` when the site has no pool."""
    from federation.models import CarbonReading, ComputePool
    from federation.scheduling import energy

    if pool is None or pool.site_id != site.pk:
        pool = ComputePool.objects.filter(site=site).order_by("pk").first()
    if pool is None:
        return None
    kwh = energy.energy_kwh(
        cpu_seconds=cpu_seconds,
        gpu_seconds=gpu_seconds,
        watts_per_core=pool.watts_per_core,
        watts_per_gpu=pool.watts_per_gpu,
    )
    before = CarbonReading.objects.filter(pool=pool, at__lte=start).order_by("-at").first()
    readings = [(before.at, before.g_per_kwh)] if before else []
    readings += list(
        CarbonReading.objects.filter(pool=pool, at__gt=start, at__lt=end)
        .order_by("at")
        .values_list("at", "g_per_kwh")
    )
    intensity = energy.mean_intensity(readings, start=start, end=end, default=pool.carbon_default)
    return kwh, intensity, energy.emissions_g(kwh, intensity)


def job_energy(*, job: FederatedJob) -> list[dict]:
    """Energy and emissions per site of a job from its metering: ``[{"site", "cpu_seconds",
    "energy_kwh", "intensity_g_per_kwh", "emissions_g"}]`` (``site_energy`` per site, with the
    site's reserved GPUs × the seconds since the start as GPU seconds)."""
    from django.db.models import Sum
    from django.utils import timezone

    if job.started_at is None:
        return []
    end = job.finished_at or timezone.now()
    rows = []
    held = max(0.0, (end - job.started_at).total_seconds())
    for js in job.sites.select_related("site", "pool"):
        cpu = js.round_metrics.aggregate(s=Sum("cpu_seconds"))["s"] or 0.0
        figures = site_energy(
            site=js.site,
            pool=js.pool,
            cpu_seconds=cpu,
            gpu_seconds=js.gpus * held,  # no GPU time is metered: a reserved GPU is held
            start=job.started_at,
            end=end,
        )
        if figures is None:
            continue
        kwh, intensity, grams = figures
        rows.append(
            {
                "site": js.site,
                "cpu_seconds": cpu,
                "energy_kwh": kwh,
                "intensity_g_per_kwh": intensity,
                "emissions_g": grams,
            }
        )
    return rows


def small(count) -> int | str:
    """A count under the profile's small-count threshold (1–7) as ``"≤ 7"``; others as they are."""
    if isinstance(count, int) and 0 < count <= SMALL_COUNT:
        return f"≤ {SMALL_COUNT}"
    return count


_CLASSIFICATION_ROWS = [
    ("accuracy", "Accuracy"),
    ("balanced_accuracy", "Balanced accuracy"),
    ("macro_f1", "Macro-F1"),
    ("roc_auc", "ROC AUC"),
    ("log_loss", "Log loss (nats)"),
]
_REGRESSION_ROWS = [("rmse", "RMSE"), ("mae", "MAE"), ("r2", "R²")]


def _confusion_display(confusion: list, classes: list, *, exact: bool) -> dict | None:
    if not confusion:
        return None
    labels = classes if len(classes) == len(confusion) else [str(i) for i in range(len(confusion))]
    return {
        "labels": labels,
        "rows": [
            {"label": label, "cells": [cell_shown(c, exact=exact) for c in row]}
            for label, row in zip(labels, confusion, strict=True)
        ],
    }


def job_results(*, job: FederatedJob, user=None) -> dict:
    """The final results and data preparation as the job page shows them.

    Returns ``{"task", "metrics": [{"key", "label", "pooled", "bound": float|None (the most the
    pooled value can differ from the exact one: ROC AUC), "sites": [float|None]}],
    "site_names": [slug], "confusion": {"pooled": display|None, "sites": [(slug, display)]},
    "baseline": dict|None, "below_baseline": bool, "preparation": {"fills": [(feature, text)],
    "notes": [...], "columns": int, "sites": [{"site", "rows", "dropped_target",
    "dropped_rows", "train_rows", "test_rows", "imputed"}]} | None, "chart": {...}}`` —
    confusion cells of 1–7 as ``"≤ 7"`` for a steward of the site (pooled: of every site), else
    every cell under the disclosure rule (:func:`cell_shown`: a matrix's cells add up to the
    held-out rows); each site's preparation counts exact only for ``user`` as a data steward of
    that site, else under the disclosure rule (:func:`shown_count`).
    """
    stewarded = stewarded_institution_ids(user=user) if user is not None else set()
    final = job.final_metrics or {}
    pooled = final.get("metrics") or {}
    classes = final.get("classes") or []
    sites = list(job.sites.select_related("site").order_by("site__slug"))
    exact_sites = {js.site.slug for js in sites if js.site.institution_id in stewarded}
    every = bool(sites) and len(exact_sites) == len(sites)
    held_out = site_held_out(sites)
    # Fractions over the held-out rows as the viewer may see them (federation.disclosure): the
    # pooled ones exact for a steward of every site, a site's for its own stewards (issue 9).
    pooled = metrics_released(pooled, rows=held_out, classes=site_classes(sites), exact=every)
    site_metrics = []
    for js in sites:
        final_site = js.final_metrics or {}
        m = final_site.get("metrics") or {}
        site_metrics.append(
            (
                js.site.slug,
                metrics_released(
                    m,
                    rows=[int(final_site.get("eval_examples") or m.get("examples") or 0)],
                    classes=[class_counts(m.get("confusion"))],
                    exact=js.site.slug in exact_sites,
                ),
            )
        )
    rows = _REGRESSION_ROWS if job.task == "regression" else _CLASSIFICATION_ROWS
    metrics = [
        {
            "key": key,
            "label": label,
            "pooled": pooled.get(key),
            "bound": pooled.get(f"{key}_bound"),
            "sites": [m.get(key) for _, m in site_metrics],
        }
        for key, label in rows
        if pooled.get(key) is not None or any(m.get(key) is not None for _, m in site_metrics)
    ]
    preparation = None
    prep = job.preparation or {}
    if prep:
        preparation = {
            "fills": sorted((prep.get("fills") or {}).items()),
            "notes": prep.get("notes") or [],
            "columns": len(prep.get("columns") or []),
            "sites": [
                {
                    "site": slug,
                    **{
                        k: shown_count(v, exact=slug in exact_sites)
                        for k, v in info.items()
                        if k
                        in ("rows", "dropped_target", "dropped_rows", "train_rows", "test_rows")
                    },
                    "imputed": shown_count(
                        sum((info.get("imputed") or {}).values()), exact=slug in exact_sites
                    ),
                    "imputed_by_feature": {
                        f: shown_count(n, exact=slug in exact_sites)
                        for f, n in (info.get("imputed") or {}).items()
                        if n
                    },
                }
                for slug, info in sorted((prep.get("sites") or {}).items())
            ],
        }
    main = "rmse" if job.task == "regression" else "accuracy"
    baseline = baseline_released(final.get("baseline"), rows=held_out, exact=every)
    return {
        "task": job.task,
        "metrics": metrics,
        "site_names": [slug for slug, _ in site_metrics],
        "confusion": {
            "pooled": _confusion_display(
                pooled.get("confusion") or [],
                classes,
                exact=every,
            ),
            "sites": [
                (
                    slug,
                    _confusion_display(
                        m.get("confusion") or [], classes, exact=slug in exact_sites
                    ),
                )
                for slug, m in site_metrics
                if m.get("confusion")
            ],
        },
        "baseline": baseline,
        "below_baseline": job.below_baseline,
        "preparation": preparation,
        "chart": {
            "metric": main,
            "labels": ["pooled", *[slug for slug, _ in site_metrics]],
            "values": [pooled.get(main), *[m.get(main) for _, m in site_metrics]],
            "baseline": (baseline or {}).get("value"),
        },
    }


def public_final_metrics(final: dict) -> dict:
    """Final metrics for the JSON endpoint (``job_progress``'s ``final_metrics``: without the
    model, row counts under the disclosure rule, the fitted preprocessing for a steward of every
    site only), with confusion cells of 1–7 as ``"≤ 7"``."""
    out = {k: v for k, v in (final or {}).items() if k != "model"}
    metrics = out.get("metrics")
    if isinstance(metrics, dict) and metrics.get("confusion"):
        out["metrics"] = {
            **metrics,
            "confusion": [[small(c) for c in row] for row in metrics["confusion"]],
        }
    return out


def supernode_states(*, connection: superlink.Connection | None = None) -> dict:
    """Every SuperNode the SuperLink knows, with the site each serves, for admin pages.

    Returns ``{"nodes": [row], "error": str}``: one row per SuperNode, ``{"node_id": str,
    "site": slug | None, "status": "registered"|"online"|"offline"|"unregistered",
    "registered_at", "last_seen", "online_until": aware datetime | None}``, online first; the
    site is the name the node was registered under (node authentication), else the local
    federation's record of the SuperNodes it started (``runtime.node_sites``), else the site
    whose latest job discovered that node id. ``error`` is ``""`` unless the SuperLink did not
    answer (then ``nodes`` is empty). One Control API request.
    """
    from federation import services

    try:
        nodes = superlink.nodes_list(connection or services.superlink_connection())
    except superlink.SuperLinkError as exc:
        return {"nodes": [], "error": str(exc)}
    ids = [n.node_id for n in nodes]
    site_of: dict[str, str] = {}
    for node_id, slug in (
        JobSite.objects.filter(node_id__in=ids)
        .order_by("job__created_at", "pk")
        .values_list("node_id", "site__slug")
    ):
        site_of[node_id] = slug  # the latest job's mapping wins
    # the embedded default's own SuperNodes name themselves in their logs
    with contextlib.suppress(runtime.RuntimeError_):
        site_of.update(runtime.node_sites(runtime.load_state(settings.FRP_FEDERATION_DIR)))
    order = {"online": 0, "registered": 1, "offline": 2, "unregistered": 3}
    rows = [
        {
            "node_id": n.node_id,
            "site": n.name or site_of.get(n.node_id),
            "status": n.status,
            "registered_at": n.registered_at,
            "last_seen": n.last_seen,
            "online_until": n.online_until,
        }
        for n in nodes
    ]
    rows.sort(key=lambda r: (order.get(r["status"], 9), r["site"] or "~", r["node_id"]))
    return {"nodes": rows, "error": ""}
