"""Writes of credit statements (CRediT, ANSI/NISO Z39.104-2022): the draft stored from a job's data,
and the principal investigator's edit. Each writes its audit event in the same transaction.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.utils import timezone

from accounting import credit
from accounting.models import ContributorKind, CreditContributor, CreditStatement, ShareMethod
from accounting.selectors.credit import CreditLine, credit_draft_lines, lines_equal, statement_lines
from federation.models import FederatedJob
from portal.permissions import can
from portal.services import audit_record

NAME_MAX = 200
SHARE_SUM_TOLERANCE = 1e-6


class CreditError(Exception):
    """An edit is invalid. ``row_errors`` maps a row's index to ``{field: [messages]}`` (fields:
    ``name``, ``kind``, ``roles``, ``share``, ``id``); ``errors`` are about the statement as a
    whole (``str(exc)`` joins them)."""

    def __init__(
        self,
        errors: Sequence[str] = (),
        row_errors: Mapping[int, Mapping[str, list[str]]] | None = None,
    ):
        self.errors = list(errors)
        self.row_errors = {i: dict(e) for i, e in (row_errors or {}).items()}
        parts = list(self.errors) + [
            f"row {i + 1}: {field}: {msg}"
            for i, fields in sorted(self.row_errors.items())
            for field, msgs in fields.items()
            for msg in msgs
        ]
        super().__init__("; ".join(parts) or "invalid credit statement")


def _summary(lines: Sequence[CreditLine]) -> list[dict]:
    return [{"name": x.name, "roles": list(x.roles), "share": x.share} for x in lines]


def _store(statement: CreditStatement, lines: Sequence[CreditLine]) -> None:
    """Replace the statement's contributors by ``lines`` (positions 0, 1, … in order)."""
    statement.contributors.all().delete()
    CreditContributor.objects.bulk_create(
        CreditContributor(
            statement=statement,
            user_id=line.user_id,
            institution_id=line.institution_id,
            kind=line.kind,
            name=line.name,
            roles=list(line.roles),
            share=line.share,
            share_method=line.share_method,
            position=i,
        )
        for i, line in enumerate(lines)
    )


@transaction.atomic
def credit_statement_draft(*, job: FederatedJob) -> CreditStatement:
    """Store the job's default statement (``credit_draft_lines``) and return it.

    Idempotent: a statement a PI has edited (``edited_at`` set) is returned untouched; a stored
    draft is refreshed only when the job's data now give a different one (e.g. contribution
    scores arrived), so calling it twice writes nothing the second time. Called by the system
    after a job (audit actor: none), or on a PI's request before the first edit.
    """
    FederatedJob.objects.select_for_update().filter(pk=job.pk).first()  # one writer per job
    statement, created = CreditStatement.objects.get_or_create(job=job)
    if statement.edited_at is not None:
        return statement
    lines = credit_draft_lines(job=job)
    if not created and lines_equal(statement_lines(statement), lines):
        return statement
    _store(statement, lines)
    statement.save(update_fields=["updated_at"])
    audit_record(
        by=None,
        action="credit.draft",
        target=statement,
        institution=job.project.institution,
        job=job.pk,
        refreshed=not created,
        contributors=_summary(lines),
    )
    return statement


def _clean_rows(rows: Sequence[Mapping], existing: Mapping[int, CreditContributor]) -> list[dict]:
    """Validate the edited rows; return them normalised or raise ``CreditError``."""
    errors: list[str] = []
    row_errors: dict[int, dict[str, list[str]]] = {}
    cleaned: list[dict] = []
    seen_names: dict[str, int] = {}
    seen_ids: dict[int, int] = {}

    def err(i: int, field: str, msg: str) -> None:
        row_errors.setdefault(i, {}).setdefault(field, []).append(msg)

    for i, row in enumerate(rows):
        pk = row.get("id")
        if pk is not None and pk not in existing:
            err(i, "id", "This contributor is not part of the statement.")
        elif pk is not None and pk in seen_ids:
            # two rows naming one stored contributor: the second overwrote the first, and the
            # contributor it replaced was removed unseen (hostile re-test F5)
            err(i, "id", f"The same contributor as row {seen_ids[pk] + 1}: reload the page.")
        elif pk is not None:
            seen_ids[pk] = i
        name = " ".join(str(row.get("name") or "").split())
        if not name:
            err(i, "name", "Give the contributor's name.")
        elif len(name) > NAME_MAX:
            err(i, "name", f"At most {NAME_MAX} characters.")
        elif name.casefold() in seen_names:
            err(i, "name", f"Already listed in row {seen_names[name.casefold()] + 1}.")
        else:
            seen_names[name.casefold()] = i
        kind = row.get("kind") or ContributorKind.PERSON
        if kind not in ContributorKind.values:
            err(i, "kind", "Choose person or institution.")
        slugs = list(row.get("roles") or [])
        unknown = [s for s in slugs if s not in credit.ROLES_BY_SLUG]
        if unknown:
            err(i, "roles", f"Not CRediT roles: {', '.join(map(str, unknown))}.")
        elif not slugs:
            err(i, "roles", "Choose at least one role.")
        share = row.get("share")
        if share is not None:
            try:
                share = float(share)
            except (TypeError, ValueError):
                share = math.nan
            if not (0.0 <= share <= 1.0):
                err(i, "share", "A share is between 0 % and 100 %.")
        cleaned.append(
            {
                "pk": pk,
                "name": name,
                "kind": kind,
                "roles": tuple(credit.normalise_roles(slugs)) if not unknown else (),
                "share": share,
            }
        )
    if not rows:
        errors.append("A statement needs at least one contributor.")
    if not row_errors:
        total = sum(r["share"] for r in cleaned if r["share"] is not None)
        if total > 1.0 + SHARE_SUM_TOLERANCE:
            errors.append(f"The shares add up to {total * 100:.1f} %; at most 100 %.")
    if errors or row_errors:
        raise CreditError(errors, row_errors)
    return cleaned


@transaction.atomic
def credit_statement_update(
    *, by, statement: CreditStatement, contributors: Sequence[Mapping]
) -> CreditStatement:
    """Replace the statement's contributors with ``contributors``, as a PI of the job's project.

    ``contributors``: in the order to show, each ``{"id": int | None, "name": str,
    "kind": "person" | "institution", "roles": [role slug, ...], "share": float in [0, 1] | None}``.
    ``id`` names a stored contributor of this statement (updated in place; its link to a portal
    user or institution, and so its kind, is kept); rows without ``id`` are new; stored contributors not listed are removed. A share
    kept unchanged keeps the method it was measured by; a changed or new share is marked as set by
    the PI. Sets ``edited_by``/``edited_at``, so drafting never overwrites it again.

    Raises ``PermissionDenied`` unless ``can(by, "credit.edit", statement.job)``, and
    ``CreditError`` (nothing written) for: no contributors, an empty, over-long or repeated name,
    an unknown kind, no role or an unknown role slug, a share outside [0, 1], shares summing to
    more than 1, an ``id`` of another statement or of another row.
    """
    job = statement.job
    if not can(by, "credit.edit", job):
        raise PermissionDenied("Only a principal investigator of the project edits its credit.")
    FederatedJob.objects.select_for_update().filter(pk=job.pk).first()
    existing = {c.pk: c for c in statement.contributors.all()}
    rows = _clean_rows(contributors, existing)
    before = statement_lines(statement)
    lines = []
    keep: set[int] = set()
    for position, row in enumerate(rows):
        old = existing.get(row["pk"])
        if row["share"] is None:
            method = ShareMethod.NONE
        elif old is not None and old.share == row["share"]:
            method = old.share_method
        else:
            method = ShareMethod.PI
        kind = row["kind"]
        if old is not None and old.institution_id is not None:
            kind = ContributorKind.INSTITUTION
        elif old is not None and old.user_id is not None:
            kind = ContributorKind.PERSON
        fields = {
            "name": row["name"],
            "kind": str(kind),
            "roles": list(row["roles"]),
            "share": row["share"],
            "share_method": str(method),
            "position": position,
        }
        if old is None:
            CreditContributor.objects.create(statement=statement, **fields)
        else:
            keep.add(old.pk)
            for name, value in fields.items():
                setattr(old, name, value)
            old.save(update_fields=list(fields))
        lines.append(
            CreditLine(
                name=row["name"],
                kind=str(kind),
                roles=row["roles"],
                share=row["share"],
                share_method=str(method),
            )
        )
    statement.contributors.exclude(pk__in=keep).filter(pk__in=existing).delete()
    statement.edited_by = by
    statement.edited_at = timezone.now()
    statement.save(update_fields=["edited_by", "edited_at", "updated_at"])
    audit_record(
        by=by,
        action="credit.edit",
        target=statement,
        institution=job.project.institution,
        job=job.pk,
        before=_summary(before),
        after=_summary(lines),
    )
    return statement
