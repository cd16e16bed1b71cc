"""Pool adapters: what a compute pool has now and whether it is up, read from where the
institution keeps that knowledge. The one boundary to an institution's batch system (Slurm).

Contract. An adapter's ``read()`` returns a ``Reading``: the pool's ``total`` and ``free``
``Capacity`` (cores, memory in GiB, GPUs by model), its ``Health`` (up / drained / down) with a
reason, and the time of the reading; or raises ``AdapterError`` (``SlurmError`` for Slurm) with a
sentence an admin can act on. No Django here; the portal stores readings
(``pool_services.pool_reading_refresh``) and the scheduler's snapshot uses them
(``admission.pool_capacity``).

- ``StaticAdapter``: the pool's own figures (the form's cores, GiB, GPUs), always up.
- ``SlurmAdapter``: one partition of a Slurm cluster, through ``scontrol --oneliner show
  partition NAME`` and ``scontrol --oneliner show node`` (plain text: the same format from Slurm
  20.11 to 24.x, unlike ``--json`` whose schema changes with each data_parser version), run
  with a timeout and ``SLURM_CONF`` when the pool names a slurm.conf. Nodes whose state is
  DOWN, DRAIN (draining or drained), FAIL, NOT_RESPONDING (``*``), FUTURE, MAINT, REBOOT or an
  invalid registration are unavailable; the rest lend ``CPUEfctv − CPUAlloc`` cores,
  ``RealMemory − AllocMem`` MiB and their GPUs (``Gres=gpu:MODEL:N``) minus those in
  ``AllocTRES`` (``gres/gpu:MODEL=N``). A partition whose own state is not UP lends nothing.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum

#: Seconds one ``scontrol`` call may take before the read fails (``FRP_SLURM_TIMEOUT_SECONDS``).
DEFAULT_TIMEOUT = 10.0
#: A partition name as Slurm accepts it (no spaces, commas or shell characters).
PARTITION_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


class Health(StrEnum):
    """A pool's health from its adapter: ``up`` (lends capacity), ``drained`` (every node
    drained by an admin: no new work), ``down`` (no node usable, or the read failed)."""

    UP = "up"
    DRAINED = "drained"
    DOWN = "down"


@dataclass(frozen=True, slots=True)
class Capacity:
    """Cores, memory in GiB and GPUs by model (``{"a100": 2}``; ``""`` for GPUs Slurm lists
    without a type)."""

    cores: int = 0
    memory_gib: float = 0.0
    gpus: Mapping[str, int] = field(default_factory=dict)

    def gpu_count(self, model: str = "") -> int:
        """GPUs of ``model`` (case-insensitive; a model that names one of Slurm's types, e.g.
        "NVIDIA A100 80GB" for type ``a100``, counts it; GPUs without a type count for any
        model); all GPUs when ``model`` is empty."""
        if not model:
            return sum(self.gpus.values())
        want = model.lower()
        return sum(n for m, n in self.gpus.items() if not m or m.lower() in want)

    def to_json(self) -> dict:
        return {"cores": self.cores, "memory_gib": self.memory_gib, "gpus": dict(self.gpus)}

    @classmethod
    def from_json(cls, data: Mapping) -> Capacity:
        return cls(
            int(data.get("cores", 0)),
            float(data.get("memory_gib", 0.0)),
            {str(k): int(v) for k, v in (data.get("gpus") or {}).items()},
        )


@dataclass(frozen=True, slots=True)
class Reading:
    """One read of a pool: ``total`` (every node of the pool), ``free`` (what usable nodes have
    unallocated), ``health`` and ``reason`` (empty when all is well), ``read_at`` (aware UTC),
    ``nodes`` / ``nodes_up`` (0 / 0 for a static pool)."""

    total: Capacity
    free: Capacity
    health: Health
    reason: str
    read_at: datetime
    nodes: int = 0
    nodes_up: int = 0

    def to_json(self) -> dict:
        """The stored form (``ComputePool.reading``): capacities and node counts."""
        return {
            "total": self.total.to_json(),
            "free": self.free.to_json(),
            "nodes": self.nodes,
            "nodes_up": self.nodes_up,
        }


class AdapterError(Exception):
    """A pool's capacity and health could not be read; ``str(exc)`` says why, for the admin."""


class SlurmError(AdapterError):
    """Slurm could not be read. ``kind``: ``missing`` (no scontrol), ``timeout``, ``failed``
    (scontrol exited non-zero, e.g. the controller does not answer), ``unknown-partition``,
    ``unparsable`` (output not in the format this module reads)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class PoolAdapter:
    """The interface: ``name`` and ``read() -> Reading`` (raises ``AdapterError``)."""

    name = ""

    def read(self) -> Reading:  # pragma: no cover - interface
        raise NotImplementedError


def _now() -> datetime:
    return datetime.now(UTC)


class StaticAdapter(PoolAdapter):
    """Today's behaviour: the capacity the admin typed in, always up (the SuperNode's own health
    comes from the SuperLink, not from here)."""

    name = "static"

    def __init__(self, *, cores: int, memory_gib: float, gpus: int = 0, gpu_model: str = ""):
        gpu = {gpu_model: gpus} if gpus else {}
        self.capacity = Capacity(int(cores), float(memory_gib), gpu)

    def read(self) -> Reading:
        return Reading(self.capacity, self.capacity, Health.UP, "", _now())


# ---------------------------------------------------------------------------------------------
# Slurm: parsing scontrol's one-line records
# ---------------------------------------------------------------------------------------------

_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_]*)=")
#: Base states and flags that make a node unusable for new work.
_DOWN_BASES = {"DOWN", "FUTURE", "UNKNOWN"}
_DOWN_FLAGS = {"FAIL", "FAILING", "NOT_RESPONDING", "MAINT", "REBOOT_ISSUED", "INVALID_REG"}
_DOWN_FLAGS |= {"REBOOT_REQUESTED", "PERFCTRS", "RESERVED_FOR_REBOOT", "INVALID"}
_DRAIN_FLAGS = {"DRAIN", "DRAINED", "DRAINING"}


def parse_record(line: str) -> dict[str, str]:
    """``Key=value Key=value …`` → dict. Values may hold spaces (``OS=Linux 6.1 #1 SMP``,
    ``Reason=disk failed [root@2026-12-05T07:56:37]``): a value runs to the next `` Key=``;
    ``Reason`` is Slurm's last field and runs to the end of the line. Raises ``SlurmError``
    (``unparsable``) for a line without a ``Key=`` at its start."""
    line = line.strip()
    head, sep, reason = line.partition(" Reason=")
    matches = list(_KEY.finditer(head))
    if not matches or matches[0].start() != 0:
        raise SlurmError("unparsable", f"scontrol printed a line that is not Key=value: {line!r}")
    out = {}
    for m, nxt in zip(matches, [*matches[1:], None], strict=True):
        out[m.group(1)] = head[m.end() : nxt.start() if nxt else len(head)].strip()
    if sep:
        out["Reason"] = reason.strip()
    return out


def parse_records(text: str) -> list[dict[str, str]]:
    """Every non-empty line of ``scontrol --oneliner show …`` as a record."""
    return [parse_record(line) for line in text.splitlines() if line.strip()]


def _int(rec: Mapping[str, str], key: str, default: int | None = None) -> int:
    value = rec.get(key)
    if value is None or value in ("", "N/A", "(null)"):
        if default is not None:
            return default
        raise SlurmError("unparsable", f"scontrol's node record has no {key}")
    try:
        return int(value)
    except ValueError as exc:
        raise SlurmError("unparsable", f"scontrol's {key}={value!r} is not a number") from exc


_GRES_GPU = re.compile(r"^gpu(?::([^:(]+))?(?::(\d+))?")


def parse_gres_gpus(gres: str) -> dict[str, int]:
    """GPUs of a node's ``Gres`` (``gpu:a100:2(S:0-1),gpu:v100:1,shard:4`` → ``{"a100": 2,
    "v100": 1}``; ``gpu:2`` → ``{"": 2}``; ``(null)`` → ``{}``)."""
    out: dict[str, int] = {}
    if not gres or gres == "(null)":
        return out
    for part in re.split(r",(?![^()]*\))", gres):
        m = _GRES_GPU.match(part.strip())
        if not m:
            continue
        model, count = m.group(1) or "", m.group(2)
        if model.isdigit() and count is None:  # gpu:2
            model, count = "", model
        out[model] = out.get(model, 0) + int(count or 1)
    return out


def parse_alloc_gpus(alloc_tres: str) -> dict[str, int]:
    """GPUs allocated, from ``AllocTRES`` (``cpu=2,mem=1G,gres/gpu=2,gres/gpu:a100=2`` →
    ``{"a100": 2}``; only the untyped ``gres/gpu=N`` → ``{"": N}``)."""
    typed: dict[str, int] = {}
    untyped = 0
    for part in (alloc_tres or "").split(","):
        key, _, value = part.partition("=")
        if key == "gres/gpu":
            untyped = int(value or 0)
        elif key.startswith("gres/gpu:"):
            typed[key.split(":", 1)[1]] = int(value or 0)
    if typed:
        return typed
    return {"": untyped} if untyped else {}


@dataclass(frozen=True, slots=True)
class Node:
    """One node of the partition as read: its state words, reason and capacity."""

    name: str
    state: str
    reason: str
    total: Capacity
    free: Capacity
    usable: bool
    drained: bool


def node_from_record(rec: Mapping[str, str]) -> Node:
    """A ``Node`` from one ``scontrol show node`` record; raises ``SlurmError`` (unparsable)."""
    name = rec.get("NodeName") or ""
    state = rec.get("State") or ""
    if not name or not state:
        raise SlurmError("unparsable", "scontrol's node record lacks NodeName or State")
    words = state.upper().split("+")
    base = words[0].rstrip("*")
    flags = set(words[1:])
    if any(w.endswith("*") for w in words):
        flags.add("NOT_RESPONDING")
    drained = bool(flags & _DRAIN_FLAGS)
    down = base in _DOWN_BASES or bool(flags & _DOWN_FLAGS)
    cores = _int(rec, "CPUEfctv", _int(rec, "CPUTot"))
    mem_mib = _int(rec, "RealMemory")
    gpus = parse_gres_gpus(rec.get("Gres", ""))
    alloc_gpus = parse_alloc_gpus(rec.get("AllocTRES", ""))
    if "" in alloc_gpus and "" not in gpus:  # untyped allocation of typed GPUs: any model
        left = alloc_gpus.pop("")
        for m in gpus:
            take = min(left, gpus[m] - alloc_gpus.get(m, 0))
            alloc_gpus[m] = alloc_gpus.get(m, 0) + take
            left -= take
    free_gpus = {m: max(0, n - alloc_gpus.get(m, 0)) for m, n in gpus.items()}
    total = Capacity(_int(rec, "CPUTot"), round(mem_mib / 1024, 3), gpus)
    free = Capacity(
        max(0, cores - _int(rec, "CPUAlloc", 0)),
        round(max(0, mem_mib - _int(rec, "AllocMem", 0)) / 1024, 3),
        free_gpus,
    )
    reason = re.sub(r"\s*\[[^\]]*@[^\]]*\]$", "", rec.get("Reason", "")).strip()
    return Node(name, state, reason, total, free, not (down or drained), drained)


def _sum(caps: list[Capacity]) -> Capacity:
    gpus: dict[str, int] = {}
    for c in caps:
        for m, n in c.gpus.items():
            gpus[m] = gpus.get(m, 0) + n
    return Capacity(sum(c.cores for c in caps), round(sum(c.memory_gib for c in caps), 3), gpus)


def _describe(node: Node) -> str:
    what = node.state.lower()
    return f"{node.name} {what}" + (f": {node.reason}" if node.reason else "")


def reading_from_output(
    partition: str, partition_text: str, nodes_text: str, *, read_at: datetime
) -> Reading:
    """The ``Reading`` of ``partition`` from the outputs of ``scontrol --oneliner show partition
    NAME`` and ``scontrol --oneliner show node``. Raises ``SlurmError`` (``unknown-partition``
    when the partition text does not describe it, ``unparsable``)."""
    parts = [r for r in parse_records(partition_text) if r.get("PartitionName") == partition]
    if not parts:
        raise SlurmError("unknown-partition", f"Slurm has no partition {partition!r}")
    part = parts[0]
    nodes = [
        node_from_record(r)
        for r in parse_records(nodes_text)
        if partition in (r.get("Partitions") or "").split(",")
    ]
    total = _sum([n.total for n in nodes])
    usable = [n for n in nodes if n.usable]
    free = _sum([n.free for n in usable])
    pstate = (part.get("State") or "").upper()
    unusable = [n for n in nodes if not n.usable]
    if pstate != "UP":
        health = Health.DRAINED if pstate == "DRAIN" else Health.DOWN
        reason = f"partition {partition} is {pstate or 'in no state'}"
        free = Capacity()
    elif not nodes:
        health, reason = Health.DOWN, f"partition {partition} has no nodes"
    elif not usable:
        only_drained = all(n.drained and "DOWN" not in n.state.upper() for n in unusable)
        health = Health.DRAINED if only_drained else Health.DOWN
        reason = "; ".join(_describe(n) for n in unusable)
    else:
        health = Health.UP
        reason = (
            f"{len(unusable)} of {len(nodes)} nodes unavailable: "
            + "; ".join(_describe(n) for n in unusable)
            if unusable
            else ""
        )
    return Reading(total, free, health, reason, read_at, len(nodes), len(usable))


# ---------------------------------------------------------------------------------------------
# Slurm: running scontrol
# ---------------------------------------------------------------------------------------------


class SlurmAdapter(PoolAdapter):
    """One Slurm partition read with ``scontrol`` (module docstring).

    ``partition``: its name; ``conf``: path of its slurm.conf (``SLURM_CONF``; empty: Slurm's
    default); ``timeout``: seconds per call; ``scontrol``: the program (name on ``PATH`` or a
    path). ``read()`` raises ``SlurmError``.
    """

    name = "slurm"

    def __init__(
        self,
        *,
        partition: str,
        conf: str = "",
        timeout: float = DEFAULT_TIMEOUT,
        scontrol: str = "scontrol",
        clock: Callable[[], datetime] = _now,
    ):
        if not PARTITION_RE.match(partition or ""):
            raise SlurmError("unknown-partition", f"not a Slurm partition name: {partition!r}")
        self.partition = partition
        self.conf = conf
        self.timeout = timeout
        self.scontrol = scontrol
        self.clock = clock

    def _run(self, *args: str) -> str:
        env = dict(os.environ)
        if self.conf:
            env["SLURM_CONF"] = self.conf
        cmd = [self.scontrol, "--oneliner", *args]
        try:
            done = subprocess.run(
                cmd, capture_output=True, text=True, timeout=self.timeout, env=env, check=False
            )
        except FileNotFoundError as exc:
            raise SlurmError(
                "missing", f"{self.scontrol} not found: is Slurm's client installed here?"
            ) from exc
        except subprocess.TimeoutExpired as exc:
            raise SlurmError(
                "timeout", f"scontrol {' '.join(args)} did not answer within {self.timeout:g} s"
            ) from exc
        except OSError as exc:
            raise SlurmError("failed", f"{self.scontrol} could not be run: {exc}") from exc
        if done.returncode != 0:
            message = (done.stderr or done.stdout).strip().splitlines()
            text = message[-1] if message else f"exit status {done.returncode}"
            if args[:2] == ("show", "partition") and (
                "not found" in text or "Invalid partition" in text
            ):
                raise SlurmError("unknown-partition", f"Slurm has no partition {self.partition!r}")
            raise SlurmError("failed", f"scontrol {' '.join(args)} failed: {text}")
        return done.stdout

    def outputs(self) -> tuple[str, str]:
        """The raw ``(partition text, nodes text)`` (for recording); raises ``SlurmError``."""
        return self._run("show", "partition", self.partition), self._run("show", "node")

    def read(self) -> Reading:
        partition_text, nodes_text = self.outputs()
        return reading_from_output(self.partition, partition_text, nodes_text, read_at=self.clock())
