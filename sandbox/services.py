"""Writes of the sandbox: dataset ingest and registration (metadata only), site key rotation and
access decisions.

Access decisions (approve, refuse, revoke) each append a leaf to the portal's ledger
(``portal.ledger.services.ledger_append``) in the same transaction as the decision, so the Merkle
log and the database never disagree.

Ingest and key rotation touch a site's object store, which no database transaction covers; they are
ordered so that a failure leaves nothing behind (ingest: the object is deleted when its row cannot be
written) or can be finished by running them again (rotation). Concurrent ingests of one dataset, and
an ingest during a key rotation of its site, are kept apart by PostgreSQL advisory locks.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Max
from django.utils import timezone

from portal.ledger.services import ledger_append
from portal.services import audit_record
from sandbox.crypto import associated_data
from sandbox.ingest import IngestError, ingest_csv, store_key_for
from sandbox.keyring import KeyringError, SiteKeyring, rewrap_object
from sandbox.models import AccessRequest, AccessStatus, Dataset, DatasetVersion
from sandbox.storage import ObjectStore, StorageError

log = logging.getLogger(__name__)

__all__ = [
    "AccessError",
    "DatasetError",
    "IngestError",
    "KeyRotation",
    "KeyringError",
    "StorageError",
]


def _ledger(kind: str, **record) -> None:
    """Append a ledger leaf (inside the caller's transaction)."""
    ledger_append(kind=kind, record=record)


def _user_id(user) -> int | None:
    return user.pk if getattr(user, "is_authenticated", False) else None


def dataset_next_version(*, site, slug: str) -> int:
    """The version number the next ingest of ``site``/``slug`` must use (it is bound into the AAD)."""
    latest = DatasetVersion.objects.filter(dataset__site=site, dataset__slug=slug).aggregate(
        v=Max("version")
    )["v"]
    return (latest or 0) + 1


def _site_store_and_keyring(site, store, keyring, *, missing: str):
    """``store`` and ``keyring``, each defaulting to the site's own on this machine
    (``sandbox.sitestore``); ``DatasetError(missing)`` when one is needed and the site has none."""
    from sandbox.sitestore import local_site_storage

    if store is not None and keyring is not None:
        return store, keyring
    local = local_site_storage(site)
    if local is None:
        raise DatasetError(missing)
    return (
        store if store is not None else local.store(),
        keyring if keyring is not None else local.keyring(),
    )


@transaction.atomic
def dataset_version_register(
    *, by, site, slug: str, title: str, version: int, result, description: str = ""
) -> DatasetVersion:
    """Record the metadata of a finished site-side ingest (``sandbox.ingest.IngestResult``).

    The rows stay in the site's store; only schema, counts, hashes, key, the suppressed profile and
    how the source was read (encoding, delimiter, missing-value markers, source size and SHA-256)
    are stored. ``by`` may be ``None`` (a site operator's command). Raises ``IntegrityError`` when
    ``version`` was taken meanwhile.
    """
    dataset, _ = Dataset.objects.get_or_create(
        site=site,
        slug=slug,
        defaults={
            "title": title,
            "description": description,
            "created_by": by if _user_id(by) else None,
        },
    )
    dv = DatasetVersion.objects.create(
        dataset=dataset,
        version=version,
        schema=result.schema,
        row_count=result.row_count,
        size_bytes=result.size_bytes,
        ciphertext_sha256=result.ciphertext_sha256,
        store_key=result.store_key,
        profile=result.profile,
        encoding=result.encoding,
        encoding_source=result.encoding_source,
        delimiter=result.delimiter,
        delimiter_source=result.delimiter_source,
        missing_values=list(result.missing_values),
        source_bytes=result.source_bytes,
        source_sha256=result.source_sha256,
        created_by=by if _user_id(by) else None,
    )
    audit_record(
        by=by,
        action="dataset.register",
        target=dv,
        institution=site.institution,
        rows=result.row_count,
        sha256=result.ciphertext_sha256,
    )
    return dv


# ---------------------------------------------------------------------------------------------
# Ingest: a CSV file at the site → an encrypted object in the site's store + a version row
# ---------------------------------------------------------------------------------------------


class DatasetError(Exception):
    """A dataset cannot be ingested or its site's key rotated; the message says why."""


_LOCK_CLASS = 0x53424F58  # "SBOX": first key of the (int, int) advisory locks below


def _dataset_lock_key(site, slug: str) -> int:
    digest = hashlib.sha256(f"frp-dataset/{site.pk}/{slug}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


@contextlib.contextmanager
def _advisory_lock(*, site, slug: str | None, busy: str):
    """Hold PostgreSQL session advisory locks while the body runs, or raise ``DatasetError(busy)``.

    With ``slug``: the site lock shared (other datasets of the site may ingest meanwhile) and an
    exclusive lock on the dataset. Without: the site lock exclusive (key rotation). Non-blocking:
    a concurrent holder makes this fail at once with ``busy``. No-op on other databases.
    """
    if connection.vendor != "postgresql":
        yield
        return
    taken: list[tuple[str, list]] = []
    try:
        with connection.cursor() as cursor:
            wanted = (
                [
                    ("pg_try_advisory_lock_shared(%s, %s)", [_LOCK_CLASS, site.pk]),
                    ("pg_try_advisory_lock(%s)", [_dataset_lock_key(site, slug)]),
                ]
                if slug is not None
                else [("pg_try_advisory_lock(%s, %s)", [_LOCK_CLASS, site.pk])]
            )
            for call, args in wanted:
                cursor.execute(f"SELECT {call}", args)
                if not cursor.fetchone()[0]:
                    raise DatasetError(busy)
                taken.append((call.replace("pg_try_advisory_lock", "pg_advisory_unlock"), args))
        yield
    finally:
        with connection.cursor() as cursor:
            for call, args in reversed(taken):
                cursor.execute(f"SELECT {call}", args)


def _object_sha256(store: ObjectStore, key: str) -> str | None:
    digest = hashlib.sha256()
    try:
        with store.open(key) as stream:
            while block := stream.read(1 << 20):
                digest.update(block)
    except StorageError:
        return None
    return digest.hexdigest()


def _discard_object(store: ObjectStore, key: str, sha256: str) -> None:
    """Delete object ``key`` if it is still the one this ingest wrote (its SHA-256 is ``sha256``):
    a concurrent writer that won the version keeps its object."""
    with contextlib.suppress(StorageError):
        if _object_sha256(store, key) == sha256:
            store.delete(key)


def _site_key(keyring: SiteKeyring, site) -> bytes:
    """The site's KEK; created on the site's very first ingest only (a missing key later is an
    error: the site's existing objects need it)."""
    if keyring.exists(site.slug):
        return keyring.get(site.slug)
    if DatasetVersion.objects.filter(dataset__site=site).exists():
        return keyring.get(site.slug)  # raises KeyringError naming the places it looked
    return keyring.create(site.slug)


def dataset_ingest(
    *,
    by,
    site,
    path: Path,
    slug: str,
    title: str = "",
    description: str = "",
    store: ObjectStore | None = None,
    keyring: SiteKeyring | None = None,
    encoding: str | None = None,
    delimiter: str | None = None,
    missing_values: Sequence[str] = ("",),
    schema_override: Mapping[str, str] | None = None,
    tmp_dir: Path | None = None,
) -> DatasetVersion:
    """Ingest the CSV at ``path`` into ``site``'s store and register it as the next version.

    The site-side half is ``sandbox.ingest.ingest_csv`` (streaming, constant memory; ``encoding``
    and ``delimiter`` ``None`` = detect; ``missing_values`` the dataset's markers;
    ``schema_override`` ``{column: "int"|"float"|"bool"|"date"|"str"}``). The version number is
    ``dataset_next_version``; the dataset ``slug`` is created with ``title`` and ``description``
    on its first version (an existing dataset keeps its own). ``store`` and ``keyring`` default to
    the site's local ones (``sandbox.sitestore``); the site's KEK is created on its very first
    ingest. ``by`` is the data steward (checked: ``dataset.register`` on the site), or ``None``
    for a site operator's command.

    Not one transaction — the object is written before its row: if the row cannot be written
    (another ingest took the version) the object is deleted again, so a failure leaves no object
    and no row; an unregistered object at the new version's key (left by a crash between the two
    writes) is removed first. Concurrent ingests of one dataset are refused (advisory lock), as is an ingest
    while the site's key is being rotated.

    The returned version carries ``ingest_warnings`` (``IngestResult.warnings``: for the steward,
    not stored), e.g. a numeric column read as text because of an undeclared marker.

    Raises ``IngestError`` for a bad file (its message names the line and column), ``DatasetError``
    for a refused request (permission, no local store, missing title, lost race, busy),
    ``KeyringError`` for a missing or insecure key, ``StorageError`` when the store fails.
    """
    from portal.permissions import can

    if by is not None and not can(by, "dataset.register", site):
        raise DatasetError(f"only a data steward of {site.institution} registers datasets")
    slug = (slug or "").strip()
    if not Dataset.objects.filter(site=site, slug=slug).exists() and not (title or "").strip():
        raise DatasetError("a new dataset needs a title")
    store, keyring = _site_store_and_keyring(
        site,
        store,
        keyring,
        missing=f"site {site.slug!r} has no store on this machine: ingest where the site runs, "
        "with manage.py dataset_ingest --store URL --keyring DIR",
    )
    with _advisory_lock(
        site=site,
        slug=slug,
        busy=f"another ingest of {site.slug}/{slug}, or a key rotation of site {site.slug}, is "
        "running: try again when it has finished",
    ):
        kek = _site_key(keyring, site)
        version = dataset_next_version(site=site, slug=slug)
        orphan = store_key_for(site=site.slug, dataset=slug, version=version)
        if store.exists(orphan):
            # No row names it and we hold the dataset's lock: an earlier ingest crashed between
            # writing the object and its row. It was never registered, so nothing refers to it.
            log.warning("removing unregistered object %s left by an interrupted ingest", orphan)
            store.delete(orphan)
        result = ingest_csv(
            Path(path),
            site=site.slug,
            dataset=slug,
            version=version,
            store=store,
            kek=kek,
            tmp_dir=tmp_dir,
            encoding=encoding,
            delimiter=delimiter,
            missing_values=missing_values,
            schema_override=schema_override,
            max_columns=settings.FRP_MAX_COLUMNS,
            max_line_chars=settings.FRP_MAX_LINE_CHARS,
        )
        try:
            with transaction.atomic():
                dv = dataset_version_register(
                    by=by,
                    site=site,
                    slug=slug,
                    title=title.strip(),
                    version=version,
                    result=result,
                    description=description.strip(),
                )
            dv.ingest_warnings = list(result.warnings)  # for the steward who ingested, not stored
            return dv
        except IntegrityError:
            _discard_object(store, result.store_key, result.ciphertext_sha256)
            raise DatasetError(
                f"version {version} of {site.slug}/{slug} was registered by another ingest "
                "meanwhile; nothing was kept from this one: run it again"
            ) from None
        except BaseException:
            _discard_object(store, result.store_key, result.ciphertext_sha256)
            raise


# ---------------------------------------------------------------------------------------------
# Key rotation: a new KEK for a site, every data key re-wrapped (data never re-encrypted)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KeyRotation:
    """Outcome of ``site_key_rotate``: versions re-wrapped now (``rewrapped``) and found already
    re-wrapped by an interrupted earlier run (``already_done``); ``resumed`` when this run
    finished an earlier rotation instead of starting one; ``retired`` the numbers of the previous
    keys deleted at the end."""

    site: str
    rewrapped: int
    already_done: int
    resumed: bool
    retired: list[int] = field(default_factory=list)


def _rewrap_any(store, key: str, *, olds: list[bytes], new: bytes, aad: bytes, tmp_dir):
    """``rewrap_object`` trying each previous key (newest first); the last error if none fits."""
    error: KeyringError | None = None
    for old in olds:
        try:
            return rewrap_object(store, key, old_kek=old, new_kek=new, aad=aad, tmp_dir=tmp_dir)
        except KeyringError as exc:
            error = exc
    raise error or KeyringError(f"object {key!r}: no previous key to re-wrap from")


def site_key_rotate(
    *,
    by,
    site,
    store: ObjectStore | None = None,
    keyring: SiteKeyring | None = None,
    tmp_dir: Path | None = None,
) -> KeyRotation:
    """Rotate ``site``'s key-encryption key and re-wrap the data key of every version of its datasets.

    Steps: ``SiteKeyring.rotate`` (the old key stays as ``<site>.kek.<n>``); for each
    ``DatasetVersion`` of the site, ``keyring.rewrap_object`` (only the 68-byte header changes) and
    the object's new ``size_bytes``/``ciphertext_sha256`` written to its row at once; finally every
    previous key is retired (deleted), so the old KEK opens nothing any more, and an audit event.

    Crash-safe: while previous keys exist a rotation is unfinished, and this call finishes it
    instead of rotating again — ``rewrap_object`` leaves objects already under the new key as
    they are (reporting their hash, so a row not yet updated is corrected). ``store`` and
    ``keyring`` default to the site's local ones (``sandbox.sitestore``); ``by`` is a data steward
    of the site (checked) or ``None`` for a site operator.

    Raises ``DatasetError`` (permission, no local store, an ingest running), ``KeyringError`` (no
    key, a key set by environment variable, an object no kept key opens — the previous keys are
    then kept, so nothing becomes unreadable) or ``StorageError``.
    """
    from portal.permissions import can

    if by is not None and not can(by, "dataset.register", site):
        raise DatasetError(f"only a data steward of {site.institution} rotates its site key")
    store, keyring = _site_store_and_keyring(
        site, store, keyring, missing=f"site {site.slug!r} has no store and keyring on this machine"
    )
    with _advisory_lock(
        site=site,
        slug=None,
        busy=f"an ingest or another key rotation of site {site.slug} is running: try again later",
    ):
        previous = keyring.previous(site.slug)
        resumed = bool(previous)
        if not resumed:
            keyring.rotate(site.slug)
            previous = keyring.previous(site.slug)
        new = keyring.get(site.slug)
        olds = [keyring.get_previous(site.slug, n) for n in reversed(previous)]
        rewrapped = already = 0
        versions = (
            DatasetVersion.objects.filter(dataset__site=site)
            .select_related("dataset")
            .order_by("pk")
        )
        for dv in versions:
            aad = associated_data(site=site.slug, dataset=dv.dataset.slug, version=dv.version)
            out = _rewrap_any(store, dv.store_key, olds=olds, new=new, aad=aad, tmp_dir=tmp_dir)
            rewrapped += out.changed
            already += not out.changed
            if (dv.size_bytes, dv.ciphertext_sha256) != (out.size_bytes, out.ciphertext_sha256):
                DatasetVersion.objects.filter(pk=dv.pk).update(
                    size_bytes=out.size_bytes, ciphertext_sha256=out.ciphertext_sha256
                )
        for n in previous:
            keyring.retire(site.slug, n)
        with transaction.atomic():
            audit_record(
                by=by,
                action="site.key_rotate",
                target=site,
                institution=site.institution,
                rewrapped=rewrapped,
                already_done=already,
                resumed=resumed,
                retired=previous,
            )
    return KeyRotation(
        site=site.slug,
        rewrapped=rewrapped,
        already_done=already,
        resumed=resumed,
        retired=list(previous),
    )


@transaction.atomic
def access_request_create(*, by, dataset: Dataset, project, purpose: str) -> AccessRequest:
    """A researcher asks to use ``dataset`` in ``project`` for ``purpose``."""
    request = AccessRequest.objects.create(
        dataset=dataset, project=project, requested_by=by, purpose=purpose
    )
    audit_record(
        by=by, action="access.request", target=request, institution=dataset.site.institution
    )
    return request


@transaction.atomic
def access_request_approve(
    *, by, request: AccessRequest, expires_at: datetime | None, reason: str = ""
) -> AccessRequest:
    """The owning institution's data steward approves a pending request until ``expires_at``."""
    request = AccessRequest.objects.select_for_update().get(pk=request.pk)
    if request.status != AccessStatus.PENDING:
        raise ValueError(f"request is {request.status}, not pending")
    request.status = AccessStatus.APPROVED
    request.decided_by = by
    request.decided_at = timezone.now()
    request.expires_at = expires_at
    request.decision_reason = reason
    request.save()
    audit_record(
        by=by,
        action="access.approve",
        target=request,
        institution=request.dataset.site.institution,
        expires_at=expires_at.isoformat() if expires_at else None,
    )
    _ledger_access(request, decision="approve")
    return request


def _ledger_access(request: AccessRequest, *, decision: str) -> None:
    """The ledger leaf of an access decision (``approve``, ``refuse``, ``revoke``); a reason goes
    in as ``portal.ledger.leaves.commitment`` only, its salt into an audit event beside the text."""
    from portal.ledger.leaves import commitment

    committed, salt = commitment(request.decision_reason) if request.decision_reason else (None, "")
    _ledger(
        "access_decision",
        access_request=request.pk,
        dataset=request.dataset_id,
        project=request.project_id,
        decision=decision,
        by=request.decided_by_id,
        time=request.decided_at.isoformat(),
        expires_at=request.expires_at.isoformat() if request.expires_at else None,
        # The reason is free text: only a salted commitment to it goes into the public ledger
        # (it can be proved later with the salt); an unsalted hash let anyone confirm a guessed
        # short reason (hostile re-test of issue 9, finding 4). The text and the salt stay in the
        # audit log, which only the parties read.
        reason_commitment=committed,
    )
    if salt:
        from portal.services import audit_record

        audit_record(
            by=None,
            action="access.reason_commitment",
            target=request,
            institution=request.dataset.site.institution,
            decision=decision,
            reason=request.decision_reason,
            reason_salt=salt,
        )


@transaction.atomic
def dataset_rules_set(*, by, dataset: Dataset, auto_release: bool, shapley_opt_in: bool) -> Dataset:
    """A data steward of ``dataset``'s institution sets its standing rules: ``auto_release`` (the
    airlock approves releases of models trained on it) and ``shapley_opt_in`` (jobs using it may
    send coalition models to their sites to measure Shapley values, ADR 0036). A change is audited
    and appended to the ledger (identifiers and the two flags only), so what a job ran under can
    be proved later (with the ``job.launch`` leaf that records the consent a run started
    under, and ``job.shapley_ended`` when it ends mid-run). Saving the same
    values writes nothing. Raises ``AccessError`` for anyone who is not such a steward.
    """
    from portal.permissions import can

    if not can(by, "access.decide", dataset):
        raise AccessError("only a data steward of the dataset's institution sets its rules")
    dataset = Dataset.objects.select_for_update().get(pk=dataset.pk)
    before = {"auto_release": dataset.auto_release, "shapley_opt_in": dataset.shapley_opt_in}
    after = {"auto_release": bool(auto_release), "shapley_opt_in": bool(shapley_opt_in)}
    if before == after:
        return dataset
    dataset.auto_release, dataset.shapley_opt_in = after["auto_release"], after["shapley_opt_in"]
    dataset.save(update_fields=["auto_release", "shapley_opt_in"])
    audit_record(
        by=by,
        action="dataset.rules",
        target=dataset,
        institution=dataset.site.institution,
        before=before,
        after=after,
    )
    _ledger(
        "dataset.rules",
        dataset=dataset.pk,
        site=dataset.site.slug,
        at=timezone.now().isoformat(),
        **after,
    )
    return dataset


def _check_steward(by, request: AccessRequest) -> None:
    from portal.permissions import can

    if not can(by, "access.decide", request.dataset):
        raise AccessError("only a data steward of the dataset's institution decides")


class AccessError(Exception):
    """An access request cannot be made or decided; the message says why."""


@transaction.atomic
def access_request_submit(*, by, dataset: Dataset, project, purpose: str) -> AccessRequest:
    """A project member asks for ``dataset`` with a stated ``purpose`` (checked, then recorded)."""
    from portal.permissions import can

    if not can(by, "project.view", project):
        raise AccessError("you are not a member of this project")
    if not purpose.strip():
        raise AccessError("state the purpose of the request")
    if AccessRequest.objects.filter(
        dataset=dataset, project=project, status=AccessStatus.PENDING
    ).exists():
        raise AccessError("this project already has a pending request for this dataset")
    return access_request_create(by=by, dataset=dataset, project=project, purpose=purpose.strip())


@transaction.atomic
def access_request_decide(
    *, by, request_id: int, approve: bool, expires_at: datetime | None = None, reason: str = ""
) -> AccessRequest:
    """The steward approves until ``expires_at`` (required, in the future) or refuses with a reason."""
    request = (
        AccessRequest.objects.select_for_update().select_related("dataset__site").get(pk=request_id)
    )
    _check_steward(by, request)
    if request.status != AccessStatus.PENDING:  # decided already (another steward, another tab)
        raise AccessError(
            f"this request was already decided ({request.get_status_display().lower()}); "
            "nothing was changed"
        )
    if approve:
        if expires_at is None or expires_at <= timezone.now():
            raise AccessError("an approval needs an expiry date in the future")
        return access_request_approve(by=by, request=request, expires_at=expires_at, reason=reason)
    if not reason.strip():
        raise AccessError("give the researcher a reason for the refusal")
    return _access_close(request, by=by, status=AccessStatus.REFUSED, reason=reason.strip())


def _access_close(request: AccessRequest, *, by, status: str, reason: str) -> AccessRequest:
    """Refuse or revoke ``request`` (already locked and checked), audited as ``access.<verb>``."""
    request.status = status
    request.decided_by = by
    request.decided_at = timezone.now()
    request.decision_reason = reason
    request.save()
    verb = {AccessStatus.REFUSED: "refuse", AccessStatus.REVOKED: "revoke"}[status]
    audit_record(
        by=by,
        action=f"access.{verb}",
        target=request,
        institution=request.dataset.site.institution,
        reason=reason,
    )
    _ledger_access(request, decision=verb)
    return request


@transaction.atomic
def access_grant_revoke(*, by, request_id: int, reason: str) -> AccessRequest:
    """Revoke an approved grant: future jobs cannot use it and running jobs drop the site next round.

    Raises ``AccessError`` when ``reason`` is blank (the researchers are told why, as for a
    refusal), the request is not approved, or ``by`` is not the dataset's data steward.
    """
    request = (
        AccessRequest.objects.select_for_update().select_related("dataset__site").get(pk=request_id)
    )
    _check_steward(by, request)
    if request.status != AccessStatus.APPROVED:
        raise AccessError(f"request is {request.status}, not approved")
    if not reason.strip():
        raise AccessError("Give the researchers a reason for revoking the grant.")
    return _access_close(request, by=by, status=AccessStatus.REVOKED, reason=reason.strip())


#: The largest ε budget a steward may set (beyond it a budget protects nothing).
MAX_EPSILON_BUDGET = 1000.0


@transaction.atomic
def privacy_budget_set(*, by, request_id: int, epsilon: float | None):
    """Set (or, with ``epsilon=None``, remove) the ε budget of the project and dataset of the
    approved grant ``request_id``; returns the ``PrivacyBudget`` (``None`` when removed).

    ``epsilon``: total ε the project may spend on the dataset over all its DP jobs, in
    (0, ``MAX_EPSILON_BUDGET``]. Raises ``AccessError`` when ``by`` is not the dataset's data
    steward, the grant is not approved, or ``epsilon`` is out of range. Audited as
    ``privacy_budget.set``; a ledger leaf records the figure.
    """
    from sandbox.models import PrivacyBudget

    request = AccessRequest.objects.select_related("dataset__site", "project").get(pk=request_id)
    _check_steward(by, request)
    if request.status != AccessStatus.APPROVED:
        raise AccessError(f"request is {request.status}, not approved")
    if epsilon is not None and not 0 < epsilon <= MAX_EPSILON_BUDGET:
        raise AccessError(f"An ε budget must be above 0 and at most {MAX_EPSILON_BUDGET:g}.")
    if epsilon is None:
        PrivacyBudget.objects.filter(project=request.project, dataset=request.dataset).delete()
        budget = None
    else:
        budget, _ = PrivacyBudget.objects.update_or_create(
            project=request.project,
            dataset=request.dataset,
            defaults={"epsilon": float(epsilon), "set_by": by},
        )
    audit_record(
        by=by,
        action="privacy_budget.set",
        target=request,
        institution=request.dataset.site.institution,
        epsilon=epsilon,
    )
    ledger_append(
        kind="privacy_budget",
        record={
            "project": request.project_id,
            "dataset": request.dataset_id,
            "epsilon": None if epsilon is None else repr(float(epsilon)),
        },
    )
    return budget
