"""A job's differential privacy at submission: its ε and the data stewards' budgets (ADR 0025).

ε comes from the accountant (``federation.privacy``, dp-accounting) for the job's noise
multiplier, rounds and sampling rate (every site trains every round: q = 1). A project's spending
on a dataset is the sum of the ε of its jobs on that dataset (basic sequential composition,
Dwork & Roth 2014, Theorem 3.16: conservative — tighter accounting across jobs is not
attempted), counting every job that may have released a model update: all but those that ended
without a round. Budgets are the stewards' (``sandbox.models.PrivacyBudget``).
"""

from __future__ import annotations

from dataclasses import dataclass

from federation import privacy as accountant
from federation.models import JobSite, JobStatus, RoundMetric
from sandbox.selectors import privacy_budgets


@dataclass(frozen=True)
class BudgetFigure:
    """One dataset's budget line: ε already spent by the project, this job's ε, the budget."""

    dataset_id: int
    dataset: str
    spent: float
    this_job: float
    budget: float

    @property
    def exceeded(self) -> bool:
        return self.spent + self.this_job > self.budget + 1e-12

    @property
    def left(self) -> float:
        return max(0.0, self.budget - self.spent)


def job_epsilon(privacy: dict, *, num_rounds: int, sites: int) -> float | None:
    """ε of a job (``None`` with dp off): every one of ``sites`` trains each of ``num_rounds``.
    Raises ``federation.privacy.PrivacyError`` for settings out of range."""
    return accountant.job_epsilon(
        privacy, rounds=num_rounds, sites_sampled=max(1, sites), sites=max(1, sites)
    )


def spent(*, project, dataset_ids) -> dict[int, float]:
    """dataset id → ε the project's DP jobs have spent on it (jobs that ended without a round
    released nothing and are not counted)."""
    rows = list(
        JobSite.objects.filter(
            job__project=project,
            job__epsilon__isnull=False,
            dataset_version__dataset_id__in=list(dataset_ids),
        ).values_list("dataset_version__dataset_id", "job_id", "job__epsilon", "job__status")
    )
    with_rounds = set(
        RoundMetric.objects.filter(job_id__in={r[1] for r in rows})
        .values_list("job_id", flat=True)
        .distinct()
    )
    out = {int(d): 0.0 for d in dataset_ids}
    for dataset_id, job_id, eps, status in rows:
        if status in JobStatus.terminal() and job_id not in with_rounds:
            continue
        out[dataset_id] = out.get(dataset_id, 0.0) + float(eps)
    return out


def budget_figures(*, project, versions, epsilon: float) -> list[BudgetFigure]:
    """The budget line of every chosen dataset version's dataset that has a budget."""
    datasets = {v.dataset_id: v.dataset for v in versions}
    budgets = privacy_budgets(project=project, dataset_ids=datasets)
    if not budgets:
        return []
    used = spent(project=project, dataset_ids=list(budgets))
    return [
        BudgetFigure(
            dataset_id=d,
            dataset=str(datasets[d]),
            spent=used.get(d, 0.0),
            this_job=epsilon,
            budget=budgets[d],
        )
        for d in sorted(budgets)
    ]


def refusal(figures: list[BudgetFigure]) -> list[str]:
    """One sentence per exceeded budget, with the figures (spent, this job, budget)."""
    return [
        f"{f.dataset}: this job's ε {f.this_job:.3g} would exceed the project's budget — "
        f"spent {f.spent:.3g}, this job {f.this_job:.3g}, budget {f.budget:.3g} "
        f"({f.left:.3g} left)."
        for f in figures
        if f.exceeded
    ]
