"""``{% job_contribution job %}``: the job page's contribution chart and table, and usage per site."""

from __future__ import annotations

from django import template

from accounting.selectors.contribution import job_contribution as select_job_contribution

register = template.Library()


@register.inclusion_tag("accounting/contribution/_job.html", takes_context=True)
def job_contribution(context, job):
    """Render contribution (Shapley shares, leave-one-out) and usage of ``job`` for the viewer."""
    request = context.get("request")
    user = getattr(request, "user", None)
    return {"job": job, "c": select_job_contribution(user=user, job=job)}


@register.filter
def bytes_human(value) -> str:
    """Bytes as KiB/MiB/GiB (binary prefixes), one decimal; ``None`` → an em dash."""
    if value is None:
        return "—"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


@register.filter
def percent(value, places: int = 1) -> str:
    """A share in 0..1 as a percentage with ``places`` decimals (``0.625`` → ``62.5 %``)."""
    if value is None:
        return "—"
    return f"{float(value) * 100:.{int(places)}f} %"
