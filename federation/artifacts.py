"""The portal's model store: a finished job's final model as an artifact, its ``skops`` file and
model card, and the ServerApp's round checkpoints (issue 14, points 5 and 6; ADR 0026).

Objects (``settings.FRP_MODEL_STORE_URL``, through ``sandbox.storage``):

* ``models/job-<id>/model.json`` — the final model as the ServerApp reported it (``finished``):
  ``{"format": 1, "job": id, "kind": job.model, "task", "classes", "weights", "preprocessing"}``.
  The database row keeps only its key (``FederatedJob.model_key``); nothing leaves but through the
  airlock (the views check the release).
* ``checkpoints/job-<id>/…`` — written by the ServerApp (``frp_flwr.checkpoints``); read here only
  to tell the latest round a crashed job can resume from.

A store failure raises ``ArtifactError`` with the store's message (never its credentials).
"""

from __future__ import annotations

import json

from django.conf import settings

from federation import method
from federation.disclosure import (
    baseline_released,
    metric_shown,
    metrics_released,
    site_classes,
    site_held_out,
)
from federation.exporters import ExportError, ExportInput, export
from federation.models import ReleaseStatus
from frp_flwr import checkpoints
from sandbox.profile import released_total, safe_count
from sandbox.storage import ObjectStore, StorageError, store_from_url

FORMAT = 1


class ArtifactError(Exception):
    """The model store cannot be read or written; the message says which object and why."""


def model_store() -> ObjectStore:
    """The portal's model store (``settings.FRP_MODEL_STORE_URL``). Raises ``ArtifactError``."""
    try:
        return store_from_url(settings.FRP_MODEL_STORE_URL)
    except StorageError as exc:
        raise ArtifactError(f"FRP_MODEL_STORE_URL: {exc}") from None


def model_key(job_id: int) -> str:
    """The object key of job ``job_id``'s final model."""
    return f"models/job-{int(job_id)}/model.json"


def model_put(*, job, weights: list, classes: list[str], preprocessing: dict | None) -> str:
    """Write ``job``'s final model (``weights``: its layers as nested lists) to the store and
    return its key (the caller records it on the row). Raises ``ArtifactError``."""
    payload = {
        "format": FORMAT,
        "job": job.pk,
        "kind": job.model,
        "task": job.task,
        "classes": list(classes),
        "weights": weights,
        "preprocessing": preprocessing or {},
    }
    key = model_key(job.pk)
    try:
        checkpoints.put_bytes(model_store(), key, json.dumps(payload).encode())
    except StorageError as exc:
        raise ArtifactError(f"saving job {job.pk}'s model: {exc}") from None
    return key


def model_payload(job) -> dict | None:
    """``job``'s final model (``model_put``'s payload) or ``None`` when it has none. Rows from
    before the model store (the model inside ``final_metrics``) are read as they are. Raises
    ``ArtifactError`` when the store cannot give the object."""
    if not job.model_key:
        legacy = (job.final_metrics or {}).get("model")
        if not legacy:
            return None
        return {
            "format": FORMAT,
            "job": job.pk,
            "kind": job.model,
            "task": job.task,
            "classes": job.final_metrics.get("classes", []),
            "weights": legacy,
            "preprocessing": job.final_metrics.get("preprocessing") or {},
        }
    try:
        return json.loads(model_store().get_bytes(job.model_key))
    except StorageError as exc:
        raise ArtifactError(f"reading job {job.pk}'s model: {exc}") from None


def has_model(job) -> bool:
    """Whether ``job`` has a final model (in the store, or a legacy row's)."""
    return bool(job.model_key or (job.final_metrics or {}).get("model"))


def estimator(job):
    """``job``'s final model as a scikit-learn estimator (``federation.exporters``). Raises
    ``ExportError`` when its kind has no exporter or it has no model, ``ArtifactError``."""
    payload = model_payload(job)
    if payload is None:
        raise ExportError("the job has no final model")
    return export(
        payload.get("kind") or job.model,
        ExportInput(
            task=payload["task"],
            classes=list(payload.get("classes") or []),
            weights=payload["weights"],
            preprocessing=payload.get("preprocessing") or {},
        ),
    )


def skops_bytes(job) -> bytes:
    """``job``'s estimator as a ``.skops`` file (``skops.io.dumps``: no pickle; a researcher loads
    it with ``skops.io.load(path, trusted=skops.io.get_untrusted_types(file=path))`` after
    reading the listed types, which are scikit-learn's and NumPy's only). Raises
    ``ExportError``, ``ArtifactError``."""
    import zipfile

    import skops.io as sio

    # deflated: the pipeline's schema is repetitive JSON (~40× smaller, ADR 0026)
    return sio.dumps(estimator(job), compression=zipfile.ZIP_DEFLATED, compresslevel=9)


def _preparation_shown(preparation: dict | None) -> dict | None:
    """``job.preparation`` with each site's counts (rows, dropped, train/test rows, imputed
    cells) under the profile's disclosure rule (``sandbox.profile.safe_count``: ``0``,
    ``"≤7"``, or the nearest multiple of 5): a card is shared with every project member and
    beyond, and a site's exact row count is for its own stewards (issue 9, finding 5)."""
    if not preparation:
        return None
    sites = {}
    for slug, info in (preparation.get("sites") or {}).items():
        shown = {
            k: safe_count(int(v)) if isinstance(v, int) else v
            for k, v in info.items()
            if k != "imputed"
        }
        shown["imputed"] = {f: safe_count(int(n)) for f, n in (info.get("imputed") or {}).items()}
        sites[slug] = shown
    return {**preparation, "sites": sites}


def _pooled_rows_shown(total: int | None, held_out: list[int]) -> int | str | None:
    """The pooled held-out rows on the card: the sum of the sites' released counts
    (``sandbox.profile.released_total``: ``155 + 40 = 195``, ``"195 + ≤7"``), else — no site
    reported its own — the rule on the total. The rule on the exact total is not enough: less a
    site's own exact rows it narrows another site's to fewer values than its released count."""
    if total is None:
        return None
    return released_total(held_out) if held_out else safe_count(int(total))


def _pooled_metrics_shown(metrics, examples) -> dict | None:
    """The pooled metrics on the card: ``examples`` as :func:`_pooled_rows_shown`, confusion
    cells under the profile's rule (``safe_count``): the cells add up to the exact pooled rows."""
    if not isinstance(metrics, dict):
        return metrics
    out = dict(metrics)
    if "examples" in out:
        out["examples"] = examples
    if out.get("confusion"):
        out["confusion"] = [
            [safe_count(c) if isinstance(c, int) else c for c in row] for row in out["confusion"]
        ]
    return out


def _released(job) -> bool:
    release = getattr(job, "release", None)
    return release is not None and release.status == ReleaseStatus.APPROVED


def model_card(job) -> dict:
    """The model card of a finished ``job`` (shown on its page and downloadable as JSON):
    datasets and versions per site, preprocessing, model, strategy, rounds, metrics, ε (when a
    privacy setting recorded one), contribution, how to load the file. Raises nothing: a part
    that is not there is ``None``.

    ``preprocessing`` is the job's plans (``{"plans": [...]}``) until the airlock has released
    the model, then the fitted preprocessing the file carries: its one-hot and missing-indicator
    statistics are shares of the pooled training rows, exact in jobs fitted before issue 9,
    finding 5, and the card goes to every project member (ADR 0036)."""
    final = job.final_metrics or {}
    job_sites = list(job.sites.select_related("site", "dataset_version__dataset"))
    sites = [
        {
            "site": js.site.slug,
            "dataset": js.dataset_version.dataset.slug,
            "version": js.dataset_version.version,
            "status": js.status,
            "rounds_completed": js.rounds_completed,
        }
        for js in job_sites
    ]
    held_out = site_held_out(job_sites)
    pooled_rows = _pooled_rows_shown(final.get("eval_examples"), held_out)
    contribution = final.get("contribution") or {}
    try:
        exportable, why = True, ""
        if has_model(job):
            estimator(job)
    except (ExportError, ArtifactError) as exc:
        exportable, why = False, str(exc)
    # The job's own ε (charged at submission, and again for rounds a resume trains twice) and
    # its settings; the ServerApp reports none. Worded as on the job page (federation.method).
    privacy = dict(job.privacy or {})
    dp_on = method.dp_on(job) and privacy.get("dp", "off") != "off"
    return {
        "job": job.pk,
        "title": job.title,
        "project": job.project.title,
        "task": job.task,
        "model": job.model,
        "model_text": method.model_text(job),
        "strategy": job.strategy,
        "strategy_text": method.strategy_text(job),
        "rounds": final.get("rounds"),
        "num_rounds": job.num_rounds,
        "local_epochs": job.local_epochs,
        "learning_rate": job.learning_rate,
        "target": job.target_column,
        "features": list(job.feature_columns),
        "classes": final.get("classes", []),
        "preprocessing": (final.get("preprocessing") if _released(job) else None)
        or {"plans": job.preprocessing},
        "preparation": _preparation_shown(job.preparation),
        "datasets": sites,
        # Every project member reads the card: fractions over the held-out rows as released,
        # pooled held-out rows as the sum of the sites' released counts (issue 9, ADR 0036).
        "metrics": {
            "eval_accuracy": metric_shown(
                "eval_accuracy", final.get("eval_accuracy"), rows=held_out, exact=False
            ),
            "eval_loss": metric_shown(
                "eval_loss", final.get("eval_loss"), rows=held_out, exact=False
            ),
            # pooled held-out rows: less a site's own, another site's exact rows (finding 5)
            "eval_examples": pooled_rows,
            "pooled": metrics_released(
                _pooled_metrics_shown(final.get("metrics"), pooled_rows),
                rows=held_out,
                classes=site_classes(job_sites),
                exact=False,
            ),
            "baseline": baseline_released(final.get("baseline"), rows=held_out, exact=False),
        },
        "epsilon": float(job.epsilon) if dp_on else None,
        "delta": method.delta(job) if dp_on else None,
        "epsilon_text": method.epsilon_text(job.epsilon, method.delta(job)) if dp_on else "",
        "privacy": (
            {k: privacy[k] for k in ("dp", "noise_multiplier", "clipping_norm") if k in privacy}
            if dp_on
            else None
        ),
        "contribution": (
            {
                "method": contribution.get("method"),
                "players": contribution.get("players"),
                "utility": contribution.get("utility"),
                "error": contribution.get("error"),
            }
            if contribution
            else None
        ),
        "resumed": {"earlier_runs": list(job.earlier_runs), "from_round": job.resume_round}
        if job.earlier_runs
        else None,
        "file": {
            "format": "skops" if exportable else "json",
            "exportable": exportable,
            "why_not": why,
            "input": "a 2-D array with one column per feature, in the order of 'features'; "
            "numbers for numeric features (dates as days since 1970-01-01), text for "
            "categorical ones; NaN / None where missing",
            "load": "import skops.io as sio; model = sio.load(path, "
            "trusted=sio.get_untrusted_types(file=path))",
        },
    }


def checkpoint_round(job) -> int:
    """The round of ``job``'s latest checkpoint in the model store (0: none). Raises
    ``ArtifactError``."""
    try:
        return checkpoints.latest_round(model_store(), job.pk)
    except checkpoints.CheckpointError as exc:
        raise ArtifactError(str(exc)) from None


def checkpoint_active_sites(job, rnd: int) -> list[str]:
    """The sites still training in ``job``'s round-``rnd`` checkpoint. Raises ``ArtifactError``."""
    try:
        return checkpoints.load(model_store(), job.pk, rnd).active
    except checkpoints.CheckpointError as exc:
        raise ArtifactError(str(exc)) from None
