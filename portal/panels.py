"""Page panels: how an app on a higher floor adds a section to a page of a lower one.

A lower app's template marks a slot, ``{% load panels %}{% panels "job_detail" job=job %}``; an app
above registers panels for that slot in its ``AppConfig.ready()`` with :func:`register`. When the
page renders, each panel's ``context`` function is called with the request and the slot's objects
(as keywords) and returns the panel template's context, or ``None`` to show nothing; panels render
in ``order``, then in the order they were registered. The lower page never imports the app above:
without it, the slot is empty. JSON endpoints do the same with :func:`register_section` and
:func:`sections` (one key of the response per section).

Slots (the page that renders them, and what its panels receive):

* ``dashboard.actions`` (``projects``: the user's), ``dashboard.stats``, ``dashboard.main`` — the
  dashboard;
* ``institution.site`` — each site on an institution's *Sites & pools* page (``site``);
* ``steward_queue`` — the data steward's queue of the sandbox;
* ``job_detail`` — the federation's job page (``job``); section ``job_progress`` — its
  ``progress.json`` (``job``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.template import Context
from django.utils.safestring import SafeString, mark_safe


@dataclass(frozen=True)
class Panel:
    """One panel of a slot: its template and the function that makes the template's context."""

    slot: str
    template: str
    context: Callable[..., dict[str, Any] | None]
    order: int = 100


_panels: dict[str, list[Panel]] = {}
_sections: dict[str, dict[str, Callable[..., Any]]] = {}


def register(
    slot: str,
    *,
    template: str,
    context: Callable[..., dict[str, Any] | None],
    order: int = 100,
) -> None:
    """Add a panel to ``slot``: ``context(request=…, **objects)`` → the template's context or
    ``None`` (nothing shown). Registering the same template in a slot again replaces it (an
    ``AppConfig.ready()`` that runs twice adds nothing)."""
    panels = [p for p in _panels.get(slot, []) if p.template != template]
    panels.append(Panel(slot, template, context, order))
    _panels[slot] = sorted(panels, key=lambda p: p.order)  # stable: registration order kept


def panels_for(slot: str) -> list[Panel]:
    """The panels of ``slot`` in the order they render (``[]`` for a slot nobody fills)."""
    return list(_panels.get(slot, []))


def render(slot: str, context: Context, **objects) -> SafeString:
    """Every panel of ``slot`` rendered in ``context`` (the page's template context), as an
    inclusion tag renders: each template gets its own context plus the page's CSRF token. Every
    context function also receives ``request`` (the page's, or ``None``)."""
    request = context.get("request")
    engine = context.template.engine
    parts = []
    for panel in panels_for(slot):
        values = panel.context(request=request, **objects)
        if values is None:
            continue
        new = context.new(values)
        if "csrf_token" in context:
            new["csrf_token"] = context["csrf_token"]
        parts.append(engine.get_template(panel.template).render(new))
    return mark_safe("".join(parts))  # noqa: S308 — each part is a template's autoescaped output


def register_section(slot: str, key: str, data: Callable[..., Any]) -> None:
    """Add the section ``key`` to the JSON of ``slot``: ``data(request=…, **objects)`` → a
    JSON-ready value. Registering ``key`` again replaces it."""
    _sections.setdefault(slot, {})[key] = data


def sections(slot: str, *, request, **objects) -> dict[str, Any]:
    """``{key: value}`` of every section registered for ``slot`` (``{}`` when none is)."""
    return {key: data(request=request, **objects) for key, data in _sections.get(slot, {}).items()}
