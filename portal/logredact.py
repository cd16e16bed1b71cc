"""Secrets in request paths never reach an access log (hostile re-test of issue 9, finding 8).

Some links carry a single-use credential in their path or query: allauth's password-reset key
(``/accounts/password/reset/key/<uidb36>-<key>/``), e-mail confirmation key
(``/accounts/confirm-email/<key>/``), the portal's invitation token (``/invitations/<token>/``),
and an IdP's authorization code and state on the sign-in callback (``?code=…&state=…``). Anyone who
reads a log line with one of them can use it (a log reader reset another user's password).

Contract:

- :func:`redact` — a path, request line or URL with those secrets replaced by ``[redacted]``; any
  other text unchanged.
- :class:`RedactSecretsFilter` — a ``logging.Filter`` that redacts the message and arguments of
  every record it sees; ``portal.settings.LOGGING`` puts it on every handler, so runserver's
  request log (``django.server``) and Django's request warnings (``django.request``) are covered.
- :class:`GunicornLogger` — gunicorn's logger (``--logger-class portal.logredact.GunicornLogger``)
  with the request line, path, query and referrer redacted in its access log.

compose's nginx logs with its own ``log_format`` that leaves the secret parts out (see
``docker-compose.yml``).
"""

from __future__ import annotations

import logging
import re

REDACTED = "[redacted]"

#: Path prefixes followed by a secret path segment (until the next ``/``, ``?``, space or quote).
SECRET_PATH_PREFIXES = (
    "/accounts/password/reset/key/",
    "/accounts/confirm-email/",
    "/invitations/",
)
#: Query parameters whose values are secrets (OAuth 2.0 / OIDC responses, generic tokens).
SECRET_QUERY_KEYS = (
    "code",
    "state",
    "token",
    "key",
    "password",
    "id_token",
    "access_token",
    "refresh_token",
    "session_state",
    "client_secret",
)

_PATH_RE = re.compile("(" + "|".join(re.escape(p) for p in SECRET_PATH_PREFIXES) + r")[^/?#\s\"']+")
_QUERY_RE = re.compile(
    r"([?&](?:" + "|".join(map(re.escape, SECRET_QUERY_KEYS)) + r")=)[^&#\s\"']*", re.I
)


def redact(text: str) -> str:
    """``text`` (a path, a request line, a URL or a log message) with secret parts redacted."""
    if not isinstance(text, str) or ("/" not in text and "=" not in text):
        return text
    return _QUERY_RE.sub(r"\1" + REDACTED, _PATH_RE.sub(r"\1" + REDACTED, text))


def _redact_arg(value):
    return redact(value) if isinstance(value, str) else value


class RedactSecretsFilter(logging.Filter):
    """Redacts a record's message and string arguments in place; never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(_redact_arg(a) for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {k: _redact_arg(v) for k, v in record.args.items()}
        return True


try:  # gunicorn is installed in the compose image, not in the embedded default
    from gunicorn.glogging import Logger as _GunicornBase
except ImportError:  # pragma: no cover — exercised where gunicorn is installed
    _GunicornBase = None

if _GunicornBase is not None:

    class GunicornLogger(_GunicornBase):
        """gunicorn's logger whose access-log atoms hold no secret path segment or query value."""

        def atoms(self, resp, req, environ, request_time):
            atoms = super().atoms(resp, req, environ, request_time)
            for key, value in atoms.items():
                if not isinstance(value, str):
                    continue
                if key == "q":  # the query string without its "?"
                    atoms[key] = redact("?" + value)[1:]
                else:  # request line, path, referrer, headers, environ values
                    atoms[key] = redact(value)
            return atoms
