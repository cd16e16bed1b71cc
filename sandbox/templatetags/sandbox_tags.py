"""Template filters of the sandbox: figures shown under the profile's disclosure rule."""

from __future__ import annotations

from django import template
from django.contrib.humanize.templatetags.humanize import intcomma

from sandbox.profile import safe_count

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
