"""Template tags for a resumed job's runs (``accounting.runs``): ``{% run_cell run runs id %}``
and ``{% line_run entry %}`` (a billing line's run)."""

from __future__ import annotations

from django import template
from django.utils.html import format_html

from accounting.runs import flower_run_id, flower_run_text, run_text, runs_of

register = template.Library()


@register.simple_tag
def run_cell(run: int, runs: int, flower_id: str = ""):
    """A table cell's content for run ``run`` of ``runs``: ``run 1 of 2`` and, below it,
    ``(Flower run 90817263…)`` with the whole id on hover."""
    if not flower_id:
        return run_text(run, runs)
    return format_html(
        '{} <span class="d-block text-secondary" title="Flower run {}">({})</span>',
        run_text(run, runs),
        flower_id,
        flower_run_text(flower_id),
    )


@register.simple_tag
def line_run(entry):
    """A billing line's run cell: its run of its job's runs for a compute line, "all runs" for a
    data line of a resumed job (written once on the value of every run), "—" for a job with one
    run. Uses ``entry.job`` (select it with the line)."""
    runs = runs_of(entry.job)
    if runs == 1:
        return "—"
    if entry.kind.startswith("compute"):
        return run_cell(entry.run, runs, flower_run_id(entry.job, entry.run))
    return "all runs"
