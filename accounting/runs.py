"""The runs of a job as accounting shows them (ADR 0028): a job resumed from a round checkpoint
has runs 1, 2, …, and its usage records and billing lines are kept per run. One wording for the
pages: ``"run 1 of 2 (Flower run 90817263…)"``."""

from __future__ import annotations

#: Flower run ids (uint64, up to 20 digits) longer than this are shortened on pages.
SHORT_ID = 8


def runs_of(job) -> int:
    """The number of runs of ``job``: 1 for its first Flower run, + 1 for each time it was
    resumed (``job.earlier_runs`` holds the run ids before the current one)."""
    return len(job.earlier_runs or []) + 1


def flower_run_id(job, run: int) -> str:
    """The Flower run id (text) of ``job``'s run ``run`` (1-based): ``job.earlier_runs`` then the
    current ``job.flower_run_id``; ``""`` when unknown."""
    ids = [*(job.earlier_runs or []), job.flower_run_id]
    return str(ids[run - 1] or "") if 0 < run <= len(ids) else ""


def run_text(run: int, runs: int) -> str:
    """``"run 1 of 2"``."""
    return f"run {run} of {runs}"


def flower_run_text(flower_id: str, *, short: bool = True) -> str:
    """``"Flower run 90817263…"``: the id shortened to ``SHORT_ID`` digits unless ``short`` is
    false; ``""`` for an unknown id."""
    if not flower_id:
        return ""
    shown = flower_id[:SHORT_ID] + "…" if short and len(flower_id) > SHORT_ID else flower_id
    return f"Flower run {shown}"
