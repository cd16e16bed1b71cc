"""The sites' own API for data registered at the site (``frp-site ingest`` / ``key rotate``).

Authenticated as the site by the credential of its kit (``portal.sites.site_from_request``),
JSON in and out, no cookies (hence no CSRF). The portal never sees the rows or the site's key:
the site encrypts with its own key-encryption key and sends only what ``IngestResult`` holds
(schema, counts, hashes, the store key, the suppressed profile, how the source was read).

- ``GET  datasets/<slug>/next-version`` → ``{"version": n}``
- ``POST datasets`` ``{"dataset", "title", "description", "version", "result": {…IngestResult}}``
  → 201 ``{"id", "dataset", "version"}``; 409 when the version was taken meanwhile
- ``GET  datasets`` → ``{"versions": [{"id", "dataset", "version", "store_key", "size_bytes",
  "ciphertext_sha256"}]}`` (the site's own)
- ``POST versions/<id>/object`` ``{"size_bytes", "ciphertext_sha256"}``: after a key rotation
  re-wrapped the object (only its header changed)

Bad input is a 400 with ``{"error": …}``; nothing is written then.
"""

from __future__ import annotations

import json
import re

from django.conf import settings
from django.db import IntegrityError, transaction
from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from portal.services import audit_record
from portal.sites import SiteError, site_from_request
from sandbox import services
from sandbox.ingest import IngestResult, store_key_for
from sandbox.models import DatasetVersion
from sandbox.profile import MAX_CATEGORIES, PROFILE_FORMAT, SUPPRESSED

MAX_BODY = 1024 * 1024  # a profile of 1,000 columns fits easily
_SLUG = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,99}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_TYPES = {"int", "float", "bool", "date", "str"}
#: Largest count or size the database holds (PostgreSQL ``bigint``, SQLite ``INTEGER``).
MAX_INT = 2**63 - 1
MAX_NAME_CHARS = 1000  # a column name or a category value


class BadRequest(Exception):
    """The body is not what the API takes (message for the site)."""


def _error(status: int, message: str) -> JsonResponse:
    return JsonResponse({"error": message}, status=status)


def _body(request) -> dict:
    if len(request.body) > MAX_BODY:
        raise BadRequest(f"the body exceeds {MAX_BODY} bytes")
    try:
        body = json.loads(request.body or b"{}")
    except (ValueError, RecursionError) as exc:
        raise BadRequest("the body is not JSON") from exc
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


def _int(value, what: str, lo: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= MAX_INT:
        raise BadRequest(f"{what} must be an integer from {lo} to {MAX_INT}")
    return value


def _count(value, what: str, *, nullable: bool = False) -> None:
    """A profile count: an integer ≥ 0 or ``"≤7"`` (``sandbox.profile.safe_count``)."""
    if value is None and nullable:
        return
    if value != SUPPRESSED:
        _int(value, what)


def _number(value, what: str) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise BadRequest(f"{what} must be a number or null")
    if abs(value) == float("inf"):
        raise BadRequest(f"{what} must be a finite number or null")


_COLUMN_KEYS = {"name", "type", "type_source", "missing", "count", "identifier", "not_numbers"}
_KIND_KEYS = {
    "int": {"mean", "std"},
    "float": {"mean", "std"},
    "date": {"min_year", "max_year"},
    "str": {"categories", "other"},
    "bool": {"categories", "other"},
}


def _profile_column(entry, column: dict, where: str) -> None:
    """One column of a profile as ``sandbox.profile.compute_profile`` writes it."""
    if not isinstance(entry, dict):
        raise BadRequest(f"{where} must be an object")
    if entry.get("name") != column["name"] or entry.get("type") != column["type"]:
        raise BadRequest(f"{where} must have the name and type of schema column {column['name']!r}")
    extra = set(entry) - _COLUMN_KEYS - _KIND_KEYS[column["type"]]
    if extra:
        raise BadRequest(f"{where} has unknown keys: {sorted(extra)[:5]}")
    if entry.get("type_source", "inferred") not in ("inferred", "override"):
        raise BadRequest(f"{where}.type_source must be 'inferred' or 'override'")
    if not isinstance(entry.get("identifier", False), bool):
        raise BadRequest(f"{where}.identifier must be true or false")
    for key in ("missing", "count", "not_numbers"):
        _count(entry.get(key, 0), f"{where}.{key}")
    if column["type"] in ("int", "float"):
        for key in ("mean", "std"):
            _number(entry.get(key), f"{where}.{key}")
    elif column["type"] == "date":
        for key in ("min_year", "max_year"):
            if entry.get(key) is not None:
                _int(entry[key], f"{where}.{key}")
    else:
        categories = entry.get("categories")
        _count(entry.get("other"), f"{where}.other", nullable=True)
        if categories is None:
            return
        if not isinstance(categories, list) or len(categories) > MAX_CATEGORIES:
            raise BadRequest(f"{where}.categories must be a list of at most {MAX_CATEGORIES}")
        for i, c in enumerate(categories):
            if (
                not isinstance(c, dict)
                or set(c) != {"value", "count"}
                or not isinstance(c["value"], str)
                or len(c["value"]) > MAX_NAME_CHARS
            ):
                raise BadRequest(
                    f'{where}.categories[{i}] must be {{"value": str, "count": count}}'
                )
            _count(c["count"], f"{where}.categories[{i}].count")


def _profile(raw, schema: list[dict]) -> dict:
    """The suppressed profile, checked against the shape ``sandbox.profile.compute_profile``
    gives (one entry per schema column, in order): every researcher's dataset page, the job
    form and job submission read it, so a malformed one must not reach them (a 500 for all)."""
    if not isinstance(raw, dict):
        raise BadRequest("result.profile must be an object")
    if set(raw) - {"format", "rows", "columns"}:
        raise BadRequest("result.profile has keys other than format, rows and columns")
    if raw.get("format", PROFILE_FORMAT) != PROFILE_FORMAT:
        raise BadRequest(f"result.profile.format must be {PROFILE_FORMAT}")
    _count(raw.get("rows", 0), "result.profile.rows")
    columns = raw.get("columns")
    if not isinstance(columns, list) or len(columns) != len(schema):
        raise BadRequest("result.profile.columns must be a list with one entry per schema column")
    for i, (entry, column) in enumerate(zip(columns, schema, strict=True)):
        _profile_column(entry, column, f"result.profile.columns[{i}]")
    return raw


def _str(value, what: str, max_len: int = 200) -> str:
    if not isinstance(value, str) or len(value) > max_len:
        raise BadRequest(f"{what} must be a string of at most {max_len} characters")
    return value


def _result(raw, *, site: str, dataset: str, version: int) -> IngestResult:
    if not isinstance(raw, dict):
        raise BadRequest("result must be an object")
    schema = raw.get("schema")
    if (
        not isinstance(schema, list)
        or not schema
        or not all(
            isinstance(c, dict)
            and isinstance(c.get("name"), str)
            and c.get("type") in _TYPES
            and set(c) <= {"name", "type"}
            for c in schema
        )
    ):
        raise BadRequest(
            'result.schema must be a list of {"name": str, "type": int|float|bool|date|str}'
        )
    if len(schema) > settings.FRP_MAX_COLUMNS:  # the limit of a web upload (issue 9, finding 6)
        raise BadRequest(
            f"result.schema has {len(schema):,} columns; at most {settings.FRP_MAX_COLUMNS:,} "
            "(FRP_MAX_COLUMNS)"
        )
    names = [c["name"] for c in schema]
    if not all(0 < len(n) <= MAX_NAME_CHARS for n in names) or len(set(names)) != len(names):
        raise BadRequest(
            f"result.schema's column names must be distinct, of 1 to {MAX_NAME_CHARS} characters"
        )
    expected_key = store_key_for(site=site, dataset=dataset, version=version)
    if raw.get("store_key") != expected_key:
        raise BadRequest(f"result.store_key must be {expected_key!r}")
    for name in ("ciphertext_sha256", "source_sha256"):
        if not _SHA256.fullmatch(str(raw.get(name, ""))):
            raise BadRequest(f"result.{name} must be 64 lower-case hex digits")
    profile = _profile(raw.get("profile"), schema)
    markers = raw.get("missing_values", [""])
    if not isinstance(markers, list) or not all(
        isinstance(m, str) and len(m) <= 50 for m in markers
    ):
        raise BadRequest("result.missing_values must be a list of short strings")
    return IngestResult(
        store_key=expected_key,
        schema=schema,
        row_count=_int(raw.get("row_count"), "result.row_count"),
        size_bytes=_int(raw.get("size_bytes"), "result.size_bytes", lo=1),
        ciphertext_sha256=raw["ciphertext_sha256"],
        profile=profile,
        encoding=_str(raw.get("encoding", "utf-8"), "result.encoding", 40),
        encoding_source=_str(raw.get("encoding_source", "detected"), "result.encoding_source", 20),
        delimiter=_str(raw.get("delimiter", ","), "result.delimiter", 2),
        delimiter_source=_str(
            raw.get("delimiter_source", "detected"), "result.delimiter_source", 20
        ),
        missing_values=tuple(markers),
        source_bytes=_int(raw.get("source_bytes", 0), "result.source_bytes"),
        source_sha256=raw["source_sha256"],
    )


def _site_or_401(request):
    return site_from_request(request)


@csrf_exempt
@require_GET
def next_version(request, slug: str):
    try:
        site = _site_or_401(request)
    except SiteError as exc:
        return _error(401, str(exc))
    if not _SLUG.fullmatch(slug):
        return _error(400, "a dataset id has letters, digits, '-' and '_' (at most 100)")
    return JsonResponse({"version": services.dataset_next_version(site=site, slug=slug)})


@csrf_exempt
@require_http_methods(["GET", "POST"])
def datasets(request):
    try:
        site = _site_or_401(request)
    except SiteError as exc:
        return _error(401, str(exc))
    if request.method == "GET":
        versions = (
            DatasetVersion.objects.filter(dataset__site=site)
            .select_related("dataset")
            .order_by("pk")
        )
        return JsonResponse(
            {
                "versions": [
                    {
                        "id": v.pk,
                        "dataset": v.dataset.slug,
                        "version": v.version,
                        "store_key": v.store_key,
                        "size_bytes": v.size_bytes,
                        "ciphertext_sha256": v.ciphertext_sha256,
                    }
                    for v in versions
                ]
            }
        )
    try:
        body = _body(request)
        slug = _str(body.get("dataset"), "dataset", 100)
        if not _SLUG.fullmatch(slug):
            raise BadRequest("a dataset id has letters, digits, '-' and '_' (at most 100)")
        version = _int(body.get("version"), "version", lo=1)
        title = _str(body.get("title", ""), "title").strip()
        description = _str(body.get("description", ""), "description", 5000).strip()
        result = _result(body.get("result"), site=site.slug, dataset=slug, version=version)
        if version != services.dataset_next_version(site=site, slug=slug):
            return _error(409, f"version {version} of {site.slug}/{slug} is taken: ingest again")
        if not title and not site.datasets.filter(slug=slug).exists():
            raise BadRequest("a new dataset needs a title")
    except BadRequest as exc:
        return _error(400, str(exc))
    try:
        with transaction.atomic():
            dv = services.dataset_version_register(
                by=None,
                site=site,
                slug=slug,
                title=title,
                version=version,
                result=result,
                description=description,
            )
    except IntegrityError:
        return _error(409, f"version {version} of {site.slug}/{slug} is taken: ingest again")
    return JsonResponse({"id": dv.pk, "dataset": slug, "version": version}, status=201)


@csrf_exempt
@require_POST
def version_object(request, pk: int):
    try:
        site = _site_or_401(request)
    except SiteError as exc:
        return _error(401, str(exc))
    dv = DatasetVersion.objects.filter(pk=pk, dataset__site=site).first()
    if dv is None:
        return _error(404, "no such version of this site")
    try:
        body = _body(request)
        size = _int(body.get("size_bytes"), "size_bytes", lo=1)
        sha = _str(body.get("ciphertext_sha256"), "ciphertext_sha256", 64)
        if not _SHA256.fullmatch(sha):
            raise BadRequest("ciphertext_sha256 must be 64 lower-case hex digits")
    except BadRequest as exc:
        return _error(400, str(exc))
    with transaction.atomic():
        DatasetVersion.objects.filter(pk=dv.pk).update(size_bytes=size, ciphertext_sha256=sha)
        audit_record(
            by=None,
            action="dataset.object_rewrap",
            target=dv,
            institution=site.institution,
            sha256=sha,
        )
    return JsonResponse({"id": dv.pk, "size_bytes": size, "ciphertext_sha256": sha})
