"""Reads of contribution and usage for the job page (``{% job_contribution job %}``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from accounting.models import ContributionMethod, ContributionScore, UsageRecord
from accounting.runs import runs_of
from federation.disclosure import contribution_released, small_site
from federation.models import FederatedJob, SiteRoundMetric
from portal.permissions import can
from sandbox.profile import released_count
from sandbox.selectors import stewarded_institution_ids
from sandbox.templatetags.sandbox_tags import disclosed_sum

#: What a figure shown only to a site's own data stewards reads for everyone else.
HIDDEN = "—"

#: Where a site's contribution share comes from, best first: the job page's chart and "share"
#: column, the credit statement and the data credits of billing all use the first one present.
SHARE_METHODS = (ContributionMethod.EXACT, ContributionMethod.GTG, ContributionMethod.DATA_VOLUME)


def whole_run_shares(*, job) -> tuple[str, dict[int, float]]:
    """``(method, {site_id: share})`` of the first of ``SHARE_METHODS`` with whole-run (round 0)
    scores for ``job``; ``("", {})`` when there are none. One query."""
    rows = ContributionScore.objects.filter(job=job, round=0, method__in=SHARE_METHODS).values_list(
        "method", "site_id", "share"
    )
    by_method: dict[str, dict[int, float]] = {}
    for method, site_id, share in rows:
        by_method.setdefault(method, {})[site_id] = share
    for method in SHARE_METHODS:
        if method in by_method:
            return str(method), by_method[method]
    return "", {}


def volume_rounds(*, job) -> dict[str, list[int]]:
    """``{site slug: [training examples of each round it completed]}`` of ``job``, by slug then
    round: what a data-volume contribution counts. One query."""
    rows = (
        SiteRoundMetric.objects.filter(job_site__job=job, ok=True)
        .order_by("job_site__site__slug", "round")
        .values_list("job_site__site__slug", "train_examples")
    )
    out: dict[str, list[int]] = {}
    for slug, n in rows:
        out.setdefault(slug, []).append(int(n or 0))
    return out


def released_volume(counts: list[int]) -> int:
    """A site's data volume as released: the sum over its rounds of the training rows under the
    profile's rule (``sandbox.profile.released_count``: rounded to 5, ``"≤7"`` counting as 4).
    Data-volume shares are these over their sum, so a share, or a data credit split by it, gives
    back no more than the released counts: with exact counts, ``rows_B = share_B / share_A ×
    rows_A`` gave every site's exact rows to anyone who knows one site's (issue 9, finding 5)."""
    return sum(released_count(n) for n in counts)


@dataclass
class ContributionRow:
    """One site's line: its main score (exact, GTG or data volume) and the leave-one-out check."""

    site: object
    method: str
    method_label: str
    raw_value: float
    share: float
    evaluations: int
    loo_raw: float | None = None
    loo_share: float | None = None
    #: ``raw_value`` as the page shows it: a data-volume raw value is a count of training
    #: examples (rounds × rows), so exact only for the site's own stewards, else the sum of the
    #: rounds' released rows (``disclosed_sum``: ``"≈775"``, ``"≤35"``), the figure its share is
    #: computed from
    raw_shown: object = None


#: Why a job is credited by data volume instead of Shapley values: the job page says it.
VOLUME_REASONS = {
    "secure_aggregation": "individual updates were hidden by secure aggregation, so no coalition "
    "model could be rebuilt",
    "tree_bagging": "the model is gradient-boosted trees bagged across sites (FedXgbBagging): "
    "each site's trees were grown on the residuals of a global model every site's earlier trees "
    "shaped, so a coalition's model cannot be rebuilt from the logged updates, and retraining "
    "without each site (leave-one-out) would cost a full run per site (ADR 0023)",
    "no_opt_in": "the data steward of a dataset the job trained on had not opted in to Shapley "
    "values when it was launched, or withdrew the opt-in or the grant during the run; their "
    "closing evaluation sends every site the model trained on each site's data alone "
    "(ADR 0036)",
    "small_site": "a site evaluated on 1–7 held-out rows: a coalition's utility, the median of "
    "the sites' accuracies, may be that site's, which would say how many rows it holds (they "
    "show as ≤7), so no coalition utility can be released (issue 9)",
}


def volume_basis(job: FederatedJob) -> str:
    """Why ``job`` is credited by data volume (a key of :data:`VOLUME_REASONS`), or ``""``."""
    if job.final_metrics.get("updates_hidden"):
        return "secure_aggregation"
    if job.model == "xgboost":
        return "tree_bagging"
    if job.shapley_consent is False:
        return "no_opt_in"
    if small_site(job.final_metrics.get("contribution")):
        return "small_site"
    return ""


@dataclass
class JobContribution:
    """Everything the job page shows about contribution and usage (no further queries needed).

    ``rows``: per site, ordered by site slug; ``rounds``: ``{round: {site slug: share}}`` of the
    per-round exact Shapley values (empty when not computed); ``usage``: ``UsageRecord`` list (by site, then run);
    ``utilities``: v(∅) and v(N) of the whole run; ``hidden``: updates were hidden (secure
    aggregation), so only data volume is shown; ``error``: why no contribution was measured.
    """

    visible: bool
    rows: list[ContributionRow] = field(default_factory=list)
    rounds: dict[int, dict[str, float]] = field(default_factory=dict)
    usage: list = field(default_factory=list)
    #: the job's runs (``accounting.runs.runs_of``): above 1, usage is listed per site and run
    runs: int = 1
    usage_totals: dict = field(default_factory=dict)
    flower: dict = field(default_factory=dict)
    v_empty: float | None = None
    v_full: float | None = None
    hidden: bool = False
    #: why data volume is used (``services.contribution.VOLUME_REASONS``); "" when it is not
    volume_reason: str = ""
    volume_basis: str = ""
    error: str = ""
    eval_wall_seconds: float | None = None
    models_scored: int = 0

    @property
    def chart(self) -> dict:
        """Chart.js data: site names and shares (0–1) of the main method."""
        return {
            "labels": [r.site.name for r in self.rows],
            "shares": [round(r.share, 6) for r in self.rows],
            "loo": [round(r.loo_share, 6) if r.loo_share is not None else None for r in self.rows],
            "method": self.rows[0].method_label if self.rows else "",
        }


def job_contribution(*, user, job: FederatedJob) -> JobContribution:
    """Contribution scores and usage records of ``job`` for ``user``.

    Returns ``JobContribution(visible=False)`` when ``user`` may not view the job (``job.view``).
    Queries: the permission check, scores (with sites), usage records (with sites).
    """
    if not can(user, "job.view", job):
        return JobContribution(visible=False)
    scores = list(ContributionScore.objects.filter(job=job).select_related("site"))
    usage = list(UsageRecord.objects.filter(job=job).select_related("site"))
    stewarded = stewarded_institution_ids(user=user)
    whole = [s for s in scores if s.round == 0]
    main_method = next((m for m in SHARE_METHODS if any(s.method == m for s in whole)), None)
    loo = {s.site_id: s for s in whole if s.method == ContributionMethod.LOO}
    volume = volume_rounds(job=job) if main_method == ContributionMethod.DATA_VOLUME else {}
    rows = [
        ContributionRow(
            site=s.site,
            method=s.method,
            method_label=ContributionMethod(s.method).label,
            raw_value=s.raw_value,
            share=s.share,
            evaluations=s.evaluations,
            loo_raw=loo[s.site_id].raw_value if s.site_id in loo else None,
            loo_share=loo[s.site_id].share if s.site_id in loo else None,
            raw_shown=(
                round(s.raw_value)
                if s.site.institution_id in stewarded
                else disclosed_sum(volume.get(s.site.slug, []))
            )
            if s.method == ContributionMethod.DATA_VOLUME
            else s.raw_value,
        )
        for s in sorted(whole, key=lambda s: s.site.slug)
        if s.method == main_method
    ]
    rounds: dict[int, dict[str, float]] = {}
    for s in scores:
        if s.round and s.method == ContributionMethod.EXACT:
            rounds.setdefault(s.round, {})[s.site.slug] = s.share
    posted = job.final_metrics.get("contribution") or {}
    # The utilities as released (federation.disclosure): the scores are computed from them.
    released = contribution_released(posted, exact=False) or {}
    released_table = (released.get("utilities") or {}).get("0") or {}
    players = posted.get("players") or []
    totals = {
        k: sum(getattr(u, k) for u in usage)
        for k in ("cpu_seconds", "wall_seconds", "examples", "bytes_received", "bytes_sent")
    }
    # A site's examples are rounds × (train + test rows) + test rows: exact only for its own
    # stewards. The profile's rule applied to that product gives the rows back (5 × 196 = 980 →
    # "≈980", 980 / 5 = 196), so everyone else sees none (issue 9, finding 5); the
    # contribution's data volume shows released figures.
    for u in usage:
        u.examples_shown = u.examples if u.site.institution_id in stewarded else HIDDEN
    totals["examples"] = (
        totals["examples"]
        if usage and all(u.site.institution_id in stewarded for u in usage)
        else HIDDEN
    )
    return JobContribution(
        visible=True,
        rows=rows,
        rounds=dict(sorted(rounds.items())),
        usage=sorted(usage, key=lambda u: (u.site.slug, u.run)),
        runs=runs_of(job),
        usage_totals=totals,
        flower=job.final_metrics.get("flower") or {},
        v_empty=released_table.get(""),
        v_full=released_table.get(",".join(str(i) for i in range(len(players)))),
        hidden=bool(volume_basis(job)),
        volume_basis=volume_basis(job),
        volume_reason=VOLUME_REASONS.get(volume_basis(job), ""),
        error=str(posted.get("error", "")),
        eval_wall_seconds=posted.get("wall_seconds"),
        models_scored=int(posted.get("models") or 0),
    )
