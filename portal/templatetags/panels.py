"""``{% panels "slot" name=value … %}``: the panels that apps above have added to this page's slot
(see ``portal.panels``)."""

from __future__ import annotations

from django import template

from portal import panels as registry

register = template.Library()


@register.simple_tag(takes_context=True)
def panels(context, slot: str, **objects):
    """Render every panel registered for ``slot``, passing ``objects`` to their context functions."""
    return registry.render(slot, context, **objects)
