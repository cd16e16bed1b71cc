"""Template filters of the sandbox: figures shown under the profile's disclosure rule."""

from __future__ import annotations

import math

from django import template
from django.contrib.humanize.templatetags.humanize import intcomma

from sandbox.profile import SMALL_COUNT, released_parts, safe_count

register = template.Library()


@register.filter
def disclosed(count) -> str:
    """A row count as researchers see it (``sandbox.profile.safe_count``, the profile's rule):
    ``0``, ``≤7`` for 1–7, else ``≈`` the count rounded to the nearest 5 (``"≈1,235"``)."""
    if count is None or count == "":
        return "—"
    shown = safe_count(int(count))
    if isinstance(shown, str) or shown == 0:
        return str(shown)
    return f"≈{intcomma(shown)}"


@register.filter
def significant(value, digits: int = 3) -> str:
    """A number the profile rounded to ``digits`` significant figures, written without false
    precision: ``105.0`` → ``"105"``, ``1200.0`` → ``"1,200"``, ``0.0123`` → ``"0.0123"``;
    ``"—"`` for ``None`` or a value that is not a finite number."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return "—"
    if not math.isfinite(v):
        return "—"
    if v == 0:
        return "0"
    decimals = max(0, int(digits) - 1 - math.floor(math.log10(abs(v))))
    return f"{v:,.{decimals}f}"


def disclosed_sum(counts) -> str:
    """A sum of counts (``Iterable[int]``: e.g. a site's training rows in each round) as the sum
    of the counts as researchers see them (``sandbox.profile.released_parts``), never the rule
    applied to the exact sum (the rule on ``5 × 157 = 785`` shows ``"≈785"``, and 785 / 5 = 157):
    ``"≈775"`` for five rounds of 157 rows (``≈155`` each), ``"≤35"`` for five rounds of
    ``"≤7"``, ``"≈775 + ≤7"`` for both, ``"0"`` for none. Tells nothing the released counts do
    not."""
    total, small = released_parts(counts)
    bound = f"≤{intcomma(small * SMALL_COUNT)}"
    if not total:
        return bound if small else "0"
    return f"≈{intcomma(total)} + {bound}" if small else f"≈{intcomma(total)}"
