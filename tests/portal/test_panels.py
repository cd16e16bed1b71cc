"""``portal.panels``: an upper app's panels fill a lower page's slot, in order, each with its own
context (``None`` shows nothing), and JSON sections add keys; the real registrations are checked
through the pages that render them (tests/federation/test_views.py, tests/federation/test_airlock.py,
tests/accounting/test_contribution_page.py)."""

from __future__ import annotations

import pytest
from django.template import Context, Template

from portal import panels


@pytest.fixture
def registry(monkeypatch, settings, tmp_path):
    """An empty registry and a folder of panel templates."""
    monkeypatch.setattr(panels, "_panels", {})
    monkeypatch.setattr(panels, "_sections", {})
    (tmp_path / "a.html").write_text("[A {{ word }} {{ csrf_token }}]")
    (tmp_path / "b.html").write_text("[B {{ word }}]")
    (tmp_path / "c.html").write_text("[C]")
    settings.TEMPLATES = [
        {**settings.TEMPLATES[0], "DIRS": [tmp_path, *settings.TEMPLATES[0]["DIRS"]]}
    ]
    return tmp_path


def _render(text: str, **context) -> str:
    return Template("{% load panels %}" + text).render(Context(context))


def test_panels_render_in_order_with_their_own_context(registry):
    seen = []

    def words(*, request, word):
        seen.append((request, word))
        return {"word": word.upper()}

    panels.register("s", template="b.html", context=words, order=20)
    panels.register("s", template="a.html", context=words, order=10)
    panels.register("s", template="c.html", context=lambda **kw: None)  # hidden

    out = _render('{% panels "s" word="hi" %}', csrf_token="tok")

    assert out == "[A HI tok][B HI]"
    assert seen == [(None, "hi"), (None, "hi")]


def test_registering_a_template_again_replaces_it(registry):
    panels.register("s", template="b.html", context=lambda **kw: {"word": "old"})
    panels.register("s", template="b.html", context=lambda **kw: {"word": "new"})

    assert _render('{% panels "s" %}') == "[B new]"
    assert len(panels.panels_for("s")) == 1


def test_a_slot_nobody_fills_renders_nothing(registry):
    assert _render('x{% panels "nobody" %}y') == "xy"


def test_panel_output_is_escaped_by_its_template(registry):
    panels.register("s", template="b.html", context=lambda **kw: {"word": "<script>"})

    assert _render('{% panels "s" %}') == "[B &lt;script&gt;]"


def test_sections_add_keys(registry):
    panels.register_section("j", "extra", lambda *, request, job: {"job": job})

    assert panels.sections("j", request=None, job=7) == {"extra": {"job": 7}}
    assert panels.sections("other", request=None) == {}
