"""Round checkpoints of a job's ServerApp (issue 14, point 5): saved after every round to the
portal's model store, read back when the portal resumes a crashed job with a new Flower run.

Where: the store named by ``FRP_MODEL_STORE_URL`` in the **ServerApp host's environment**
(``file:///abs/path`` or ``s3://host:port/bucket``; S3 credentials from the URL or from
``FRP_S3_ACCESS_KEY``/``FRP_S3_SECRET_KEY`` there), through the sandbox's object-store boundary
(``sandbox.storage``). Nothing of it is in the run config, which reaches every site: the run
config carries only ``resume-round`` (a round number). Unset: no checkpoints (a run cannot be
resumed).

Keys: ``checkpoints/job-<id>/round-<k>.npz`` (the state after round ``k``) and
``checkpoints/job-<id>/latest.json`` (``{"round": k, "key": …}``, written after the round's
object, so it never names an object that is not complete: ``put_file`` is atomic).

Format: one NumPy ``.npz`` (no pickles: read with ``allow_pickle=False``) holding every array —
the global model (``global/i``), the initial model (``initial/i``), each logged round's start and
each player's returned weights (``h<r>/start/i``, ``h<r>/p<player>/i``, for the contribution,
ADR 0010), the strategy's state (``strategy/<attr>/<name>``) — and ``manifest``: UTF-8 JSON as a
``uint8`` array (round, players, active sites, the fitted preprocessing, the preparation, the
training label counts, the example counts of the logged rounds, the strategy's class and the
layout of its state). ``Checkpoint.from_bytes`` checks the format version and shapes (a
``uint8`` booster of ``frp_flwr.trees`` grows: its shape is not checked) and raises
``CheckpointError``.

Strategy state: :func:`strategy_state` / :func:`strategy_restore` keep the attributes of Flower's
strategies that carry state between rounds (FedOpt's ``current_arrays``/``m_t``/``v_t``,
FedAvgM's ``momentum_vector``; FedAvg has none). A strategy with other state registers its own
pair with :func:`register_strategy_state`.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from frp_flwr.task import RoundLog

#: The ServerApp host's variable naming the portal's model store (never in a run config).
STORE_ENV = "FRP_MODEL_STORE_URL"
FORMAT = 1


class CheckpointError(Exception):
    """A checkpoint cannot be written, found or read; the message says which and why."""


# ---------------------------------------------------------------------------------------------
# Strategy state
# ---------------------------------------------------------------------------------------------

#: Attributes of Flower's Message-API strategies that carry state from round to round.
STATE_ATTRIBUTES = ("current_arrays", "m_t", "v_t", "momentum_vector")

#: ``save(strategy) -> {name: array}`` and ``restore(strategy, {name: array})``.
StateSave = Callable[[Any], dict[str, np.ndarray]]
StateRestore = Callable[[Any, dict[str, np.ndarray]], None]
_STATE: dict[str, tuple[StateSave, StateRestore]] = {}


def register_strategy_state(class_name: str, save: StateSave, restore: StateRestore) -> None:
    """Register how a strategy class (by ``type(strategy).__name__``) saves and restores the
    state it carries between rounds (arrays only: ``{name: np.ndarray}``)."""
    _STATE[class_name] = (save, restore)


def _generic_save(strategy) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for attr in STATE_ATTRIBUTES:
        value = getattr(strategy, attr, None)
        if value is None:
            continue
        if hasattr(value, "to_numpy_ndarrays"):  # an ArrayRecord
            value = list(value.to_numpy_ndarrays())
        if isinstance(value, dict):
            out.update({f"{attr}/d/{k}": np.asarray(v) for k, v in value.items()})
        elif isinstance(value, list | tuple):
            out.update({f"{attr}/l/{i}": np.asarray(v) for i, v in enumerate(value)})
    return out


def _generic_restore(strategy, state: dict[str, np.ndarray]) -> None:
    from flwr.app import ArrayRecord

    for attr in STATE_ATTRIBUTES:
        as_dict = {k.split("/", 2)[2]: v for k, v in state.items() if k.startswith(f"{attr}/d/")}
        as_list = {
            int(k.split("/", 2)[2]): v for k, v in state.items() if k.startswith(f"{attr}/l/")
        }
        if as_dict:
            setattr(strategy, attr, as_dict)
        elif as_list:
            layers = [as_list[i] for i in sorted(as_list)]
            current = getattr(strategy, attr, None)
            is_record = attr == "current_arrays" and not isinstance(current, dict)
            setattr(strategy, attr, ArrayRecord(layers) if is_record else layers)


def _inner(strategy):
    """The strategy a wrapper (Flower's DP wrappers keep it as ``.strategy``) aggregates with."""
    while hasattr(strategy, "strategy"):
        strategy = strategy.strategy
    return strategy


def strategy_state(strategy) -> dict[str, np.ndarray]:
    """The arrays ``strategy`` (or the strategy a DP wrapper wraps) carries between rounds
    (``{}`` for FedAvg)."""
    strategy = _inner(strategy)
    save, _ = _STATE.get(type(strategy).__name__, (_generic_save, _generic_restore))
    return save(strategy)


def strategy_restore(strategy, state: dict[str, np.ndarray]) -> None:
    """Put ``state`` (from :func:`strategy_state`) back into a fresh ``strategy``."""
    strategy = _inner(strategy)
    _, restore = _STATE.get(type(strategy).__name__, (_generic_save, _generic_restore))
    restore(strategy, state)


# ---------------------------------------------------------------------------------------------
# The checkpoint
# ---------------------------------------------------------------------------------------------


@dataclass
class Checkpoint:
    """A job's ServerApp state after round ``round`` (module doc).

    ``weights``/``initial``: the global and initial model (one ``float64`` array per layer);
    ``history``: one :class:`task.RoundLog` per round done (player index → weights, examples);
    ``players``: site ids, index = player; ``active``: the sites still training;
    ``fitted``: the fitted preprocessing (``preprocess.Fitted.to_text()``); ``preparation``:
    ``contract.Preparation.to_json()``; ``train_labels``: label → training rows (as released:
    ``server_app.Prepared``);
    ``strategy``: the strategy's class name, ``state`` its arrays (:func:`strategy_state`).
    """

    job_id: int
    round: int
    weights: list[np.ndarray]
    initial: list[np.ndarray]
    history: list[RoundLog]
    players: list[str]
    active: list[str]
    fitted: str
    preparation: dict
    train_labels: dict[str, int] = field(default_factory=dict)
    strategy: str = "FedAvg"
    state: dict[str, np.ndarray] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        """The ``.npz`` bytes (module doc)."""
        arrays: dict[str, np.ndarray] = {}
        arrays.update({f"global/{i}": a for i, a in enumerate(self.weights)})
        arrays.update({f"initial/{i}": a for i, a in enumerate(self.initial)})
        rounds = []
        for r, log in enumerate(self.history):
            arrays.update({f"h{r}/start/{i}": a for i, a in enumerate(log.start)})
            for p, layers in log.updates.items():
                arrays.update({f"h{r}/p{p}/{i}": a for i, a in enumerate(layers)})
            rounds.append({"players": sorted(log.updates), "examples": log.examples})
        arrays.update({f"strategy/{k}": v for k, v in self.state.items()})
        manifest = {
            "format": FORMAT,
            "job_id": self.job_id,
            "round": self.round,
            "layers": len(self.weights),
            "rounds": [
                {"players": r["players"], "examples": {str(k): v for k, v in r["examples"].items()}}
                for r in rounds
            ],
            "players": self.players,
            "active": self.active,
            "fitted": self.fitted,
            "preparation": self.preparation,
            "train_labels": self.train_labels,
            "strategy": self.strategy,
            "state": sorted(self.state),
        }
        arrays["manifest"] = np.frombuffer(json.dumps(manifest).encode(), dtype=np.uint8)
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, raw: bytes) -> Checkpoint:
        """Read :meth:`to_bytes`' output. Raises ``CheckpointError`` for anything else."""
        try:
            with np.load(io.BytesIO(raw), allow_pickle=False) as npz:
                arrays = {k: npz[k] for k in npz.files}
            manifest = json.loads(bytes(arrays.pop("manifest")).decode())
            if manifest.get("format") != FORMAT:
                raise CheckpointError(f"checkpoint format {manifest.get('format')!r} unknown")
            layers = int(manifest["layers"])

            def model(prefix: str) -> list[np.ndarray]:
                return [arrays[f"{prefix}/{i}"] for i in range(layers)]

            history = []
            for r, entry in enumerate(manifest["rounds"]):
                history.append(
                    RoundLog(
                        start=model(f"h{r}/start"),
                        updates={int(p): model(f"h{r}/p{p}") for p in entry["players"]},
                        examples={int(k): int(v) for k, v in entry["examples"].items()},
                    )
                )
            weights = model("global")
            booster = len(weights) == 1 and weights[0].dtype == np.uint8  # trees' JSON bytes
            if not booster and [a.shape for a in weights] != [a.shape for a in model("initial")]:
                raise CheckpointError("checkpoint: global and initial models differ in shape")
            return cls(
                job_id=int(manifest["job_id"]),
                round=int(manifest["round"]),
                weights=weights,
                initial=model("initial"),
                history=history,
                players=list(manifest["players"]),
                active=list(manifest["active"]),
                fitted=str(manifest["fitted"]),
                preparation=dict(manifest["preparation"]),
                train_labels={str(k): int(v) for k, v in manifest["train_labels"].items()},
                strategy=str(manifest["strategy"]),
                state={k: arrays[f"strategy/{k}"] for k in manifest["state"]},
            )
        except CheckpointError:
            raise
        except (ValueError, KeyError, TypeError, OSError, EOFError, zipfile.BadZipFile) as exc:
            raise CheckpointError(
                f"not a readable checkpoint: {type(exc).__name__}: {exc}"
            ) from None


def round_key(job_id: int, rnd: int) -> str:
    """The object key of job ``job_id``'s checkpoint after round ``rnd``."""
    return f"checkpoints/job-{int(job_id)}/round-{int(rnd):03d}.npz"


def latest_key(job_id: int) -> str:
    """The object key of job ``job_id``'s pointer to its latest checkpoint."""
    return f"checkpoints/job-{int(job_id)}/latest.json"


def store_from_environ(environ=None):
    """The model store named by ``FRP_MODEL_STORE_URL`` in this host's environment (``None``
    when unset). Raises ``CheckpointError`` for a URL the store boundary refuses."""
    from sandbox.storage import StorageError, store_from_url

    environ = os.environ if environ is None else environ
    url = environ.get(STORE_ENV, "")
    if not url:
        return None
    try:
        return store_from_url(url)
    except StorageError as exc:
        raise CheckpointError(f"{STORE_ENV}: {exc}") from None


def put_bytes(store, key: str, data: bytes) -> None:
    """Write ``data`` as object ``key`` (atomic, through a 0600 temporary file)."""
    fd, tmp = tempfile.mkstemp(prefix=".frp-ckpt-")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        store.put_file(key, Path(tmp))
    finally:
        os.unlink(tmp)


def save(store, checkpoint: Checkpoint) -> str:
    """Write ``checkpoint`` and then the job's ``latest.json`` pointing at it; return its key.
    Raises ``CheckpointError`` (the store's ``StorageError`` text)."""
    from sandbox.storage import StorageError

    key = round_key(checkpoint.job_id, checkpoint.round)
    pointer = json.dumps({"round": checkpoint.round, "key": key}).encode()
    try:
        put_bytes(store, key, checkpoint.to_bytes())
        put_bytes(store, latest_key(checkpoint.job_id), pointer)
    except StorageError as exc:
        raise CheckpointError(f"saving the round {checkpoint.round} checkpoint: {exc}") from None
    return key


def latest_round(store, job_id: int) -> int:
    """The round of job ``job_id``'s latest checkpoint (``0``: none). Raises
    ``CheckpointError`` when the store cannot be read or the pointer is malformed."""
    from sandbox.storage import StorageError

    try:
        if not store.exists(latest_key(job_id)):
            return 0
        pointer = json.loads(store.get_bytes(latest_key(job_id)))
        return int(pointer["round"])
    except StorageError as exc:
        raise CheckpointError(f"reading job {job_id}'s checkpoints: {exc}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"job {job_id}'s checkpoint pointer is malformed: {exc}") from None


def load(store, job_id: int, rnd: int) -> Checkpoint:
    """Job ``job_id``'s checkpoint after round ``rnd``. Raises ``CheckpointError`` when it is
    missing, unreadable or another job's/round's."""
    from sandbox.storage import StorageError

    try:
        checkpoint = Checkpoint.from_bytes(store.get_bytes(round_key(job_id, rnd)))
    except StorageError as exc:
        raise CheckpointError(f"no round {rnd} checkpoint of job {job_id}: {exc}") from None
    if (checkpoint.job_id, checkpoint.round) != (job_id, rnd):
        raise CheckpointError(
            f"the checkpoint under {round_key(job_id, rnd)} is job {checkpoint.job_id}'s round "
            f"{checkpoint.round}"
        )
    return checkpoint
