"""Reads of credit statements: which jobs' credit a user may see, a job's statement (or the draft
it would get), and the draft computed from the job's sites, contribution scores and project PIs.

The draft rules (``credit_draft_lines``) live here because they only read; the service
``accounting.services.credit.credit_statement_draft`` stores what they return.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

from django.db.models import Q

from accounting import credit
from accounting.models import (
    ContributorKind,
    CreditStatement,
    ShareMethod,
    UsageRecord,
)
from accounting.selectors.contribution import VOLUME_REASONS, volume_basis, whole_run_shares
from federation.method import method_document
from federation.models import FederatedJob, JobSite, JobStatus
from federation.selectors import shapley_not_opted_in
from frp_flwr.coalitions import EXACT_MAX_SITES
from portal.models import ProjectMember, ProjectRole
from portal.selectors import administered_institutions


def person_name(user) -> str:
    """A user's display name: full name, else username."""
    return user.get_full_name() or user.username


@dataclass(frozen=True)
class CreditLine:
    """One contributor as the pages and exports show it (stored, or drafted but not stored).

    ``roles``: slugs in the standard's order; ``share`` in [0, 1] or ``None``;
    ``share_method``: a ``ShareMethod`` value; ``pk`` is ``None`` for a line not stored yet.
    """

    name: str
    kind: str
    roles: tuple[str, ...]
    share: float | None = None
    share_method: str = ""
    user_id: int | None = None
    institution_id: int | None = None
    pk: int | None = None

    @property
    def contributor(self) -> credit.Contributor:
        return credit.Contributor(
            name=self.name,
            kind=self.kind,
            roles=self.roles,
            share=self.share,
            share_method=self.share_method,
        )

    @property
    def role_objects(self) -> list[credit.CreditRole]:
        return [credit.role(s) for s in self.roles if s in credit.ROLES_BY_SLUG]

    @property
    def share_text(self) -> str:
        """``"42 %"``, or ``""`` when not measured."""
        return credit.format_share(self.share)

    @property
    def share_percent(self) -> float:
        """The share in percent (0–100) for a bar's width; 0 when not measured."""
        return round(100 * (self.share or 0.0), 1)

    @property
    def share_method_label(self) -> str:
        return ShareMethod(self.share_method).label if self.share_method else ""

    @property
    def kind_label(self) -> str:
        return ContributorKind(self.kind).label


@dataclass
class CreditView:
    """A job's credit: the stored ``statement`` with its ``lines``, or (``statement`` ``None``)
    the draft it would get today."""

    job: FederatedJob
    statement: CreditStatement | None
    lines: list[CreditLine] = field(default_factory=list)

    @property
    def is_preview(self) -> bool:
        """True when nothing is stored yet: the lines are the draft computed now."""
        return self.statement is None

    @property
    def is_edited(self) -> bool:
        return self.statement is not None and self.statement.edited_at is not None

    @property
    def contributors(self) -> list[credit.Contributor]:
        return [line.contributor for line in self.lines]

    @property
    def roles_used(self) -> list[credit.CreditRole]:
        """The roles someone holds in this statement, in the standard's order."""
        used = {slug for line in self.lines for slug in line.roles}
        return [r for r in credit.ROLES if r.slug in used]

    @property
    def roles_unused(self) -> list[credit.CreditRole]:
        used = {r.slug for r in self.roles_used}
        return [r for r in credit.ROLES if r.slug not in used]

    @property
    def paragraph(self) -> str:
        """The paper's contribution section (``credit.contribution_paragraph``)."""
        return credit.contribution_paragraph(self.contributors)

    @property
    def share_note(self) -> str:
        return credit.share_note(self.contributors)

    @property
    def state(self) -> str:
        """``"preview"`` (nothing stored), ``"draft"`` (stored, not edited) or ``"edited"``."""
        if self.statement is None:
            return "preview"
        return "edited" if self.is_edited else "draft"

    @cached_property
    def method(self) -> dict:
        """How the job was trained and credited (``federation.method.method_document`` with
        ``"contribution"``: :func:`contribution_basis`); read from the job's spec, which does not
        change after submission, so a stored statement and its exports always agree with it."""
        return {**method_document(self.job), "contribution": contribution_basis(job=self.job)}

    @cached_property
    def footprint(self) -> dict | None:
        """Energy and emissions of the job (:func:`job_footprint`), ``None`` before usage."""
        return job_footprint(job=self.job)

    @property
    def method_lines(self) -> list[tuple[str, str]]:
        """``(label, text)`` lines of :attr:`method` (``credit.method_lines``)."""
        return credit.method_lines(self.method)

    @property
    def text(self) -> str:
        """The text export: the paragraph, then the method lines (``credit.statement_text``),
        then, once usage is recorded, one ``Energy and emissions:`` line (total, then per site)."""
        text = credit.statement_text(self.paragraph, self.method)
        fp = self.footprint
        if fp is None:
            return text
        sites = "; ".join(
            f"{r['site']} {r['energy_kwh']:.3f} kWh, {r['emissions_g']:.0f} gCO2e"
            for r in fp["sites"]
        )
        return (
            text + f"Energy and emissions: {fp['energy_kwh']:.3f} kWh, "
            f"{fp['emissions_g']:.0f} gCO2e ({sites})\n"
        )

    def document(self) -> dict:
        """The JSON export (``credit.statement_document``, schema ``frp-credit/1``)."""
        statement = self.statement
        editor = statement.edited_by if statement is not None else None
        document = credit.statement_document(
            job={"id": self.job.pk, "title": self.job.title, "status": self.job.status},
            project={"slug": self.job.project.slug, "title": self.job.project.title},
            contributors=self.contributors,
            method=self.method,
            state=self.state,
            edited_by=person_name(editor) if editor is not None else None,
            edited_at=statement.edited_at.isoformat()
            if statement is not None and statement.edited_at
            else None,
        )
        document["footprint"] = self.footprint
        return document


# ---------------------------------------------------------------------------------------------
# Scoping
# ---------------------------------------------------------------------------------------------


def credit_jobs_for_user(*, user):
    """Jobs whose credit ``user`` may read (as ``can(user, "credit.view", job)``): jobs of the
    user's projects, and for institution admins the jobs of projects their institution leads or
    whose sites took part; platform admins see all."""
    jobs = FederatedJob.objects.select_related("project__institution", "submitted_by")
    if user.is_staff:
        return jobs
    administered = administered_institutions(user=user)
    return jobs.filter(
        Q(project__memberships__user=user)
        | Q(project__institution__in=administered)
        | Q(sites__site__institution__in=administered)
    ).distinct()


def credit_job(*, user, pk: int) -> FederatedJob:
    """One job whose credit the user may read; raises ``FederatedJob.DoesNotExist`` otherwise."""
    return credit_jobs_for_user(user=user).get(pk=pk)


# ---------------------------------------------------------------------------------------------
# The draft
# ---------------------------------------------------------------------------------------------


def _clamp_share(value: float) -> float:
    """A summed share rounded to 9 decimals and kept inside [0, 1] (floating-point sums of
    normalised shares may land a hair outside)."""
    return min(1.0, max(0.0, round(value, 9)))


def credit_draft_lines(*, job) -> list[CreditLine]:
    """The statement a job gets by default, computed from the database now (nothing is written).

    - Each institution whose site took part (``JobSite``) gets Data curation and Resources, with
      the sum of its sites' whole-run (round 0) contribution shares from the best method measured:
      exact Shapley, else GTG-Shapley, else data volume; ``None`` when no such score exists yet.
    - The submitting researcher gets Investigation, Methodology and Software.
    - Each principal investigator of the project (``ProjectMember`` with role ``pi``) gets
      Project administration and Supervision — a default the PI can change: the portal knows who
      leads the project, not who conceived it or wrote the paper.

    One line per person (a PI who submitted holds both sets of roles) and per institution (sites
    of one institution are summed). Order: the submitter, then the other PIs by name, then the
    institutions by share (largest first, unmeasured last), then by name.
    """
    method, shares = whole_run_shares(job=job)
    institutions: dict[int, dict] = {}
    for js in JobSite.objects.filter(job=job).select_related("site__institution"):
        inst = js.site.institution
        entry = institutions.setdefault(inst.pk, {"institution": inst, "shares": []})
        if js.site_id in shares:
            entry["shares"].append(shares[js.site_id])

    people: dict[int, dict] = {}
    submitter = job.submitted_by
    people[submitter.pk] = {"user": submitter, "roles": set(credit.SUBMITTER_ROLES), "rank": 0}
    pis = ProjectMember.objects.filter(
        project_id=job.project_id, role=ProjectRole.PRINCIPAL_INVESTIGATOR
    ).select_related("user")
    for member in pis:
        entry = people.setdefault(member.user_id, {"user": member.user, "roles": set(), "rank": 1})
        entry["roles"].update(credit.PI_ROLES)

    lines = [
        CreditLine(
            name=person_name(p["user"]),
            kind=ContributorKind.PERSON,
            roles=tuple(credit.normalise_roles(p["roles"])),
            user_id=p["user"].pk,
        )
        for p in sorted(
            people.values(), key=lambda p: (p["rank"], person_name(p["user"]), p["user"].pk)
        )
    ]
    inst_lines = [
        CreditLine(
            name=e["institution"].name,
            kind=ContributorKind.INSTITUTION,
            roles=tuple(credit.normalise_roles(credit.DATA_PROVIDER_ROLES)),
            share=_clamp_share(sum(e["shares"])) if e["shares"] else None,
            share_method=method if e["shares"] else "",
            institution_id=e["institution"].pk,
        )
        for e in institutions.values()
    ]
    inst_lines.sort(
        key=lambda line: (line.share is None, -(line.share or 0.0), line.name, line.institution_id)
    )
    return lines + inst_lines


# ---------------------------------------------------------------------------------------------
# How the shares were measured
# ---------------------------------------------------------------------------------------------

#: The contribution methods of a statement's shares, as its method line names them.
BASIS_NAMES = {
    "exact": "exact Shapley value over the whole run",
    "gtg": "GTG-Shapley value over the whole run (Liu et al. 2022)",
    "data_volume": "data volume (training examples, from the row counts as released)",
}


def contribution_basis(*, job) -> dict:
    """Which contribution method the job's shares come from, and why.

    ``{"method": "exact" | "gtg" | "data_volume", "measured": bool, "reason": str,
    "description": str}``. ``method`` is the one the whole-run scores were measured by
    (``whole_run_shares``; ``measured`` true), else the one the job will get
    (``accounting.services.contribution``: data volume under secure aggregation or for bagged
    trees, exact Shapley for up to ``EXACT_MAX_SITES`` sites, GTG-Shapley above).
    ``reason``: ``"secure_aggregation"``, ``"tree_bagging"``, ``"no_opt_in"`` or ``"small_site"``
    (keys of ``VOLUME_REASONS``; ``no_opt_in`` also before launch, from the datasets' settings),
    ``"all_coalitions"`` (exact) or ``"many_sites"`` (GTG). ``description`` is the sentence the
    statement shows. One query when measured, up to three otherwise.
    """
    measured, shares = whole_run_shares(job=job)
    if job.status == JobStatus.QUEUED:  # its next launch decides: the stewards' rules now
        hidden = (
            ("secure_aggregation" if job.secure_aggregation else "")
            or ("tree_bagging" if job.model == "xgboost" else "")
            or ("no_opt_in" if shapley_not_opted_in(job=job) else "")
        )
    else:
        hidden = volume_basis(job) or ("secure_aggregation" if job.secure_aggregation else "")
    sites = len(shares) if measured else JobSite.objects.filter(job=job).count()
    method = measured or (
        "data_volume" if hidden else "exact" if sites <= EXACT_MAX_SITES else "gtg"
    )
    rebuilt = "each coalition's model could be rebuilt from the sites' logged updates"
    if method == "data_volume":
        reason = hidden
        why = VOLUME_REASONS.get(hidden, "")
    elif method == "exact":
        reason = "all_coalitions"
        why = (
            f"{rebuilt} and {sites} sites (at most {EXACT_MAX_SITES}) let every coalition be scored"
        )
    else:
        reason = "many_sites"
        why = (
            f"{rebuilt} but {sites} sites (more than {EXACT_MAX_SITES}) are too many to score "
            "every coalition"
        )
    description = BASIS_NAMES[method] + (f", because {why}" if why else "")
    if not measured:
        description += " (not measured yet)"
    return {
        "method": method,
        "measured": bool(measured),
        "reason": reason,
        "description": description,
    }


# ---------------------------------------------------------------------------------------------
# A job's credit
# ---------------------------------------------------------------------------------------------


def job_footprint(*, job) -> dict | None:
    """The job's energy and emissions per site, summed over its runs' usage records (issue 15).

    ``{"sites": [{"site": slug, "institution": name, "energy_kwh": float (kWh), "emissions_g":
    float (gCO2e)}] by site slug, "energy_kwh": total, "emissions_g": total}``; a record without
    figures counts 0. ``None`` when the job has no usage record yet. One query.
    """
    rows = (
        UsageRecord.objects.filter(job=job)
        .order_by("site__slug", "run")
        .values_list("site__slug", "site__institution__name", "energy_kwh", "emissions_g")
    )
    sites: dict[str, dict] = {}
    for slug, institution, kwh, grams in rows:
        row = sites.setdefault(
            slug, {"site": slug, "institution": institution, "energy_kwh": 0.0, "emissions_g": 0.0}
        )
        row["energy_kwh"] += kwh or 0.0
        row["emissions_g"] += grams or 0.0
    if not sites:
        return None
    lines = list(sites.values())
    return {
        "sites": lines,
        "energy_kwh": sum(r["energy_kwh"] for r in lines),
        "emissions_g": sum(r["emissions_g"] for r in lines),
    }


def statement_lines(statement: CreditStatement) -> list[CreditLine]:
    """The stored lines of ``statement`` in position order."""
    return [
        CreditLine(
            name=c.name,
            kind=c.kind,
            roles=tuple(c.roles),
            share=c.share,
            share_method=c.share_method,
            user_id=c.user_id,
            institution_id=c.institution_id,
            pk=c.pk,
        )
        for c in statement.contributors.order_by("position", "id")
    ]


def credit_for_job(*, job) -> CreditView:
    """The job's stored statement, or the draft it would get now (``CreditView.is_preview``).

    No permission check: callers scope with ``credit_job`` or ``can(user, "credit.view", job)``.
    """
    statement = CreditStatement.objects.select_related("edited_by").filter(job_id=job.pk).first()
    if statement is None:
        return CreditView(job=job, statement=None, lines=credit_draft_lines(job=job))
    return CreditView(job=job, statement=statement, lines=statement_lines(statement))


def lines_equal(a: Sequence[CreditLine], b: Sequence[CreditLine]) -> bool:
    """True when two statements say the same (ignoring stored primary keys)."""

    def key(line: CreditLine) -> tuple:
        return (
            line.name,
            line.kind,
            tuple(line.roles),
            line.share,
            line.share_method,
            line.user_id,
            line.institution_id,
        )

    return [key(x) for x in a] == [key(x) for x in b]
