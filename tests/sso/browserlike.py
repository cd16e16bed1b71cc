"""A requests-based stand-in for a browser in SSO flows: follows redirects, reads and submits forms."""

from __future__ import annotations

from dataclasses import dataclass, field
from html.parser import HTMLParser
from urllib.parse import urljoin

import requests


@dataclass
class Form:
    action: str
    method: str
    fields: dict[str, str] = field(default_factory=dict)
    buttons: list[tuple[str, str]] = field(default_factory=list)


class _FormParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.forms: list[Form] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "form":
            self.forms.append(Form(a.get("action") or "", (a.get("method") or "get").lower()))
        elif self.forms and tag == "input" and a.get("name"):
            if a.get("type") in ("submit", "button"):
                self.forms[-1].buttons.append((a["name"], a.get("value") or ""))
            elif a.get("type") not in ("checkbox", "radio") or "checked" in a:
                self.forms[-1].fields[a["name"]] = a.get("value") or ""
        elif self.forms and tag == "button" and a.get("name"):
            self.forms[-1].buttons.append((a["name"], a.get("value") or ""))


def forms(html: str) -> list[Form]:
    parser = _FormParser()
    parser.feed(html)
    return parser.forms


def form_with(html: str, name: str) -> Form:
    """The first form with an input called ``name``; AssertionError if none."""
    for f in forms(html):
        if name in f.fields:
            return f
    raise AssertionError(f"no form with field {name!r} in page:\n{html[:2000]}")


def submit(
    session: requests.Session, page: requests.Response, form: Form, **values
) -> requests.Response:
    """Submit ``form`` found on ``page`` with ``values`` overriding its fields (follows redirects)."""
    data = {**form.fields, **values}
    url = urljoin(page.url, form.action or page.url)
    if form.method == "post":
        return session.post(url, data=data, headers={"Referer": page.url}, timeout=30)
    return session.get(url, params=data, timeout=30)
