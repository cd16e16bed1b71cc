"""Portal overhead: the same job through the portal and by raw ``flwr run``, on one federation.

Run from the repository root (6–10 minutes with the defaults on a 2-CPU machine)::

    .venv/bin/python benchmarks/overhead.py [--repeat 2] [--rounds 3] [--check]

Everything happens in this one process and run, in a fresh temporary ``FRP_VAR_DIR`` (SQLite,
filesystem Celery broker, site stores): ``migrate``, ``demo_seed`` (three hospitals), then ONE local
federation (a SuperLink and one SuperNode per site, ``federation.runtime``) that both arms share, a
real web server (``manage.py runserver --noreload``, for the ServerApp's callbacks) and a real Celery
worker with beat (``celery -A portal worker -B --concurrency 1``, as ``run.sh`` starts them). One
deviation from ``run.sh``: kombu's filesystem transport is patched (in this process and the worker)
to publish each message atomically — as is, a race in it stopped the worker after ~25 s in a trial at
a 1 s beat (see ``patch_kombu_filesystem_put``); ``--unpatched-broker`` runs it unpatched.

The two arms, alternated (raw, portal, raw, portal, …) ``--repeat`` times after an untimed warm-up
of each (one round; ``--warmup 0`` skips it):

* **raw** — what a Flower user would type: ``flwr run federation/flwr_app <federation> --format
  json -c <toml>`` with the run config the portal would send for the same job
  (``services.job_run_config`` of a job submitted and rolled back, so nothing is recorded), except
  ``callback-url = ""``, so the ServerApp reports to nobody. Timed from the CLI call until ``flwr ls
  --run-id N`` says ``finished:completed``; ``flwr ls`` is started every ``--poll`` seconds (1 s,
  at a fixed rate, back to back when one call takes longer) — the same cadence as the portal's
  reconcile, whose beat interval is set to the same value.
* **portal** — the whole portal path: ``services.job_submit`` (validation, grants, audit) queues
  ``job_launch`` on the broker; the worker admits the job and submits the Flower run; the ServerApp
  posts signed callbacks to the web server after every round; the periodic reconcile reads ``flwr
  ls`` and marks the job COMPLETED. Timed from the ``job_submit`` call until the job is COMPLETED in
  the database (read every 0.1 s, so this observer adds at most 0.1 s; the job page a user watches
  polls every 2 s on top of that, which is not counted).

* **flower** (issue 12; ``--no-flower-defaults`` skips it) — the raw arm again, on a SECOND
  federation of the same sites started with Flower's defaults (``runtime.start(...,
  superexec_poll=None)``: SuperExec task poll 1 s), with main's round structure as the app has it:
  what a Flower user gets from ``flwr run`` out of the box. Reported: portal/flower (target ≤ 0.5)
  and the portal's job time / the sites' handler time (the ClientApps' metered wall seconds on the
  slowest site of each round, summed: the limit no orchestration can beat).

The raw and portal arms use the same SuperLink, SuperNodes, datasets, rounds and hyper-parameters. Per run the
table splits the wall time into: *queue* (portal only: ``job_submit`` → the worker starts the
launch, ``job.started_at``), *submit* (``flwr run`` until the run id is known — for the portal the
``job.launch`` audit event), *run* (the SuperLink's own running → finished time of the run, ``flwr ls``
``elapsed``; callbacks, if any, happen inside it) and *rest* (total minus those: the ServerApp's
start on the SuperLink plus the delay until the end is noticed). Reported: per-run times, medians,
the ratio of the medians portal/raw (target ≤ 1.10), the paired ratios, and seconds per round.
Also per run: the CPUs this benchmark's processes kept busy on average, the CPUs *other* work on the
machine used meanwhile (``/proc/stat`` minus this process tree; a shared machine makes the times
noisy, and this column shows by how much), and the broker messages still waiting when the run ended.

Memory (Linux only, read from ``/proc``): every 0.5 s the RSS of each process tree is summed —
each SuperNode with its ClientApp processes, the SuperLink with its ServerApp processes, the portal
(web server + Celery worker and their children, e.g. the ``flwr ls`` of the reconcile) and the raw
arm's own ``flwr`` CLI calls — and the peak per arm is printed, plus each SuperNode's ``VmHWM``.

Every process started here is stopped at the end (also on Ctrl-C or SIGTERM). The temporary
directory is removed unless ``--keep`` is given or something failed (its logs are then kept).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import tomli_w

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from federation import runtime  # noqa: E402  (no Django: safe before django.setup())

TARGET_RATIO = 1.10
TARGET_FLOWER_RATIO = 0.5  # issue 12: the portal's job / raw ``flwr run`` on Flower's defaults
DB_POLL_SECONDS = 0.1
PROC = Path("/proc")
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class BenchmarkError(Exception):
    """A run failed or a process did not come up; the message says which and where the logs are."""


# ---------------------------------------------------------------------------------------------
# Memory: peak RSS of process trees, sampled from /proc
# ---------------------------------------------------------------------------------------------


def _status_fields(pid: int, names: tuple[str, ...]) -> dict[str, int]:
    """Integer fields (kB for Vm*) of ``/proc/<pid>/status``; empty when the process is gone."""
    out: dict[str, int] = {}
    try:
        text = (PROC / str(pid) / "status").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in names:
            out[key] = int(value.split()[0])
    return out


def _process_table() -> dict[int, tuple[int, int]]:
    """pid → (ppid, RSS in kB) for every process visible in /proc."""
    table: dict[int, tuple[int, int]] = {}
    for entry in os.scandir(PROC):
        if entry.name.isdigit():
            f = _status_fields(int(entry.name), ("PPid", "VmRSS"))
            if "PPid" in f:
                table[int(entry.name)] = (f["PPid"], f.get("VmRSS", 0))
    return table


def _subtree(root: int, children: dict[int, list[int]]) -> set[int]:
    seen, stack = set(), [root]
    while stack:
        pid = stack.pop()
        if pid not in seen:
            seen.add(pid)
            stack.extend(children.get(pid, []))
    return seen


def cpu_snapshot() -> tuple[float, float] | None:
    """(busy CPU seconds of the whole machine, CPU seconds of this process and its descendants).

    The machine's figure comes from ``/proc/stat`` (user + nice + system + irq + softirq + steal),
    ours from ``/proc/<pid>/stat`` (utime + stime + cutime + cstime) summed over this process's
    tree, so processes that ended and were reaped inside the tree still count. Between two snapshots
    the difference is the CPU other work on the machine used. ``None`` without /proc.
    """
    try:
        fields = (PROC / "stat").read_text().split("\n", 1)[0].split()[1:9]
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields)
    busy = user + nice + system + irq + softirq + steal
    stats: dict[int, tuple[int, int]] = {}
    for entry in os.scandir(PROC):
        if not entry.name.isdigit():
            continue
        try:
            rest = (PROC / entry.name / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        stats[int(entry.name)] = (int(rest[1]), sum(int(x) for x in rest[11:15]))
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    ours = sum(stats[p][1] for p in _subtree(os.getpid(), children) if p in stats)
    return busy / CLK_TCK, ours / CLK_TCK


class MemorySampler(threading.Thread):
    """Samples the summed RSS of named process trees; keeps the peak per (phase, tree)."""

    def __init__(self, interval: float = 0.5):
        super().__init__(name="memory-sampler", daemon=True)
        self.interval = interval
        self.roots: dict[str, list[int]] = {}  # tree name → root pids
        self.phase: str | None = None  # "raw" / "portal" while a timed run is in progress
        self.peaks: dict[str, dict[str, int]] = {}  # phase → tree → peak kB
        self._halt = threading.Event()

    @staticmethod
    def available() -> bool:
        return (PROC / "self" / "status").exists()

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        while not self._halt.wait(self.interval):
            phase = self.phase
            if phase is None:
                continue
            with contextlib.suppress(Exception):  # a sampling hiccup must not end the benchmark
                self._sample(phase)

    def _sample(self, phase: str) -> None:
        table = _process_table()
        children: dict[int, list[int]] = {}
        for pid, (ppid, _) in table.items():
            children.setdefault(ppid, []).append(pid)
        claimed: set[int] = set()
        sums: dict[str, int] = {}
        for name, roots in list(self.roots.items()):
            pids = set().union(*(_subtree(r, children) for r in roots)) & table.keys()
            claimed |= pids
            sums[name] = sum(table[p][1] for p in pids)
        # The raw arm's flwr CLI calls: this process's other descendants.
        me = os.getpid()
        cli = (_subtree(me, children) - claimed - {me}) & table.keys()
        sums["flwr CLI calls of the raw arm"] = sum(table[p][1] for p in cli)
        peaks = self.peaks.setdefault(phase, {})
        for name, kb in sums.items():
            peaks[name] = max(peaks.get(name, 0), kb)


# ---------------------------------------------------------------------------------------------
# Phases: the SuperNodes' log lines, time-stamped as they are written
# ---------------------------------------------------------------------------------------------


class LogStamper(threading.Thread):
    """Reads the SuperNodes' logs every 20 ms and stamps each message's arrival and reply.

    flwr 1.42's SuperNode logs ``Receiving: <type> message`` / ``Received successfully`` when it has
    pulled a message (and its objects) and ``Sending: <type> message`` when it pushes the reply,
    without times. ``events`` holds ``(monotonic time, log, "recv" | "sent", message type)``.
    """

    def __init__(self, logs: dict[str, Path], interval: float = 0.02):
        super().__init__(name="log-stamper", daemon=True)
        self.logs, self.interval = logs, interval
        self.events: list[tuple[float, str, str, str]] = []
        self._offsets = {k: (p.stat().st_size if p.exists() else 0) for k, p in logs.items()}
        self._partial = dict.fromkeys(logs, "")
        self._last_type = dict.fromkeys(logs, "")
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        while not self._halt.wait(self.interval):
            now = time.monotonic()
            for key, path in self.logs.items():
                with contextlib.suppress(OSError):
                    with path.open("rb") as fh:
                        fh.seek(self._offsets[key])
                        chunk = fh.read()
                    self._offsets[key] += len(chunk)
                    text = self._partial[key] + chunk.decode(errors="replace")
                    *lines, self._partial[key] = text.split("\n")
                    for line in lines:
                        self._line(now, key, line)

    def _line(self, now: float, key: str, line: str) -> None:
        if "Receiving: " in line:
            self._last_type[key] = line.split("Receiving: ", 1)[1].split(" message", 1)[0]
        elif "Received successfully" in line:
            self.events.append((now, key, "recv", self._last_type[key]))
        elif "Sending: " in line:
            mtype = line.split("Sending: ", 1)[1].split(" message", 1)[0]
            self.events.append((now, key, "sent", mtype))


def phases(
    events: list[tuple[float, str, str, str]], nodes: list[str], t0: float, t1: float
) -> dict:
    """Per-phase split of one run from the SuperNodes' stamped log lines (``LogStamper``).

    A phase is one message type sent to every node (query, train, evaluate, …). Per node and
    phase: *ClientApp* = reply sent − message received (the SuperExec's task poll, a new
    interpreter with flwr's imports, the app's load, the handler, the reply's upload);
    *between* = message received − the previous phase's last reply sent by any node (the
    ServerApp's poll for replies, its aggregation and push, the SuperNode's idle poll, 3 s in
    flwr 1.42). Returns ``{"phases": [type, …], "clientapp": [s, …], "between": [s, …],
    "start": s until the first message arrived, "end": s after the last reply}``; empty when the
    logs said nothing in ``[t0, t1]``.
    """
    seq: dict[str, list[tuple[float, float, str]]] = {}
    pending: dict[str, float] = {}
    for t, key, kind, mtype in events:
        if not t0 <= t <= t1 or key not in nodes:
            continue
        if kind == "recv":
            pending[key] = t
        elif key in pending:
            seq.setdefault(key, []).append((pending.pop(key), t, mtype))
    if not seq:
        return {}
    n = min(len(v) for v in seq.values())
    clientapp, between, types = [], [], []
    for k in range(n):
        types.append(next(iter(seq.values()))[k][2])
        for node in seq:
            recv, sent, _ = seq[node][k]
            clientapp.append(sent - recv)
            if k:
                between.append(recv - max(v[k - 1][1] for v in seq.values()))
    first = min(v[0][0] for v in seq.values())
    last = max(v[n - 1][1] for v in seq.values())
    return {
        "phases": types,
        "clientapp": clientapp,
        "between": between,
        "start": first - t0,
        "end": t1 - last,
    }


# ---------------------------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------------------------


def _terminate(proc: subprocess.Popen | None, *, timeout: float = 15.0) -> None:
    """SIGTERM the process group of ``proc`` (started with a new session), then SIGKILL."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)


def _tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return "(no log)"


def _start(cmd: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=dict(os.environ),
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _wait_http(url: str, proc: subprocess.Popen, log: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BenchmarkError(f"the web server exited ({proc.returncode}):\n{_tail(log)}")
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(url, timeout=1),  # noqa: S310 — our own loopback URL
        ):
            return
        time.sleep(0.2)
    raise BenchmarkError(f"the web server did not answer {url} within {timeout:.0f} s")


def _wait_log(text: str, proc: subprocess.Popen, log: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BenchmarkError(f"the Celery worker exited ({proc.returncode}):\n{_tail(log)}")
        if text in _tail(log, 20000):
            return
        time.sleep(0.2)
    raise BenchmarkError(f"the Celery worker was not ready within {timeout:.0f} s:\n{_tail(log)}")


# ---------------------------------------------------------------------------------------------
# The filesystem broker's write race (kombu 5.7.0), worked around in this benchmark only
# ---------------------------------------------------------------------------------------------


def patch_kombu_filesystem_put() -> None:
    """Make kombu's filesystem transport publish atomically (temporary file, then rename).

    kombu's ``Channel._put`` creates ``<ms>_<uuid>.<queue>.msg`` and only then locks and writes it,
    while ``Channel._get`` moves and reads any ``*.msg`` file without taking the lock. A consumer
    that lists the folder between the two reads an empty file, ``json.loads("")`` raises, and the
    Celery worker stops with "Unrecoverable error: JSONDecodeError". With a 1 s reconcile beat this
    ended the first trial run's worker after ~25 messages. Writing to a name ``_get`` ignores and
    renaming it into place removes the window without changing the transport's behaviour otherwise.
    """
    import uuid

    from kombu.transport import filesystem
    from kombu.utils.json import dumps

    def _put(self, queue, payload, **kwargs):
        name = f"{round(time.monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = final + ".part"  # ``_get`` takes only names whose suffix is ``<queue>.msg``
        try:
            with open(partial, "wb") as fh:
                fh.write(dumps(payload).encode())
            os.replace(partial, final)
        except OSError as exc:
            raise filesystem.ChannelError(f"Cannot add file {final!r} to directory") from exc

    filesystem.Channel._put = _put


def celery_worker(argv: list[str]) -> None:
    """``overhead.py celery-worker ARGS``: ``celery ARGS`` with the patch above (when asked)."""
    if os.environ.get("FRP_BENCH_PATCH_BROKER") == "1":
        patch_kombu_filesystem_put()
    from celery.__main__ import main as celery_main

    sys.argv = ["celery", *argv]
    celery_main()  # exits


# ---------------------------------------------------------------------------------------------
# The two arms
# ---------------------------------------------------------------------------------------------


@dataclass
class RunResult:
    arm: str
    rounds: int
    total: float  # s, submission → completion observed
    submit: float  # s, flwr run → run id known
    run: float  # s, the SuperLink's running → finished ("elapsed")
    queue: float | None = None  # s, portal only: job_submit → the worker starts the launch
    run_id: str = ""
    extra: dict = field(default_factory=dict)
    cpu_ours: float | None = None  # CPUs busy on average with this benchmark's processes
    cpu_other: float | None = None  # CPUs busy on average with anything else on the machine
    backlog: int | None = None  # broker messages waiting when the run ended

    @property
    def rest(self) -> float:
        return self.total - (self.queue or 0.0) - self.submit - self.run


@dataclass
class World:
    """What both arms share: settings, the demo project and researcher, the chosen datasets."""

    flwr_home: Path
    federation: str
    app_dir: Path
    project: object
    researcher: object
    versions: list
    poll: float
    timeout: float
    tmp: Path
    worker: subprocess.Popen
    worker_log: Path
    queue_dir: Path
    sampler: MemorySampler | None = None
    flower_home: Path | None = None  # FLWR_HOME naming the federation on Flower's defaults
    stamper: LogStamper | None = None
    nodes: dict[str, list[str]] = field(default_factory=dict)  # arm → its SuperNodes' log keys

    def timing_over(self) -> None:
        """Stop attributing memory to the arm (what follows is the benchmark's own bookkeeping)."""
        if self.sampler is not None:
            self.sampler.phase = None


def _flwr(world: World, args: list[str], home: Path | None = None) -> dict:
    """One raw ``flwr`` CLI call with ``--format json``; returns its JSON (raises unless success).
    ``home``: the ``FLWR_HOME`` naming the SuperLink (default: the portal's)."""
    env = dict(os.environ, FLWR_HOME=str(home or world.flwr_home), FLWR_TELEMETRY_ENABLED="0")
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    flwr = Path(sys.executable).with_name("flwr")
    proc = subprocess.run(
        [str(flwr) if flwr.exists() else "flwr", *args, "--format", "json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    try:
        payload = json.loads(proc.stdout.strip() or "{}")
    except json.JSONDecodeError as exc:
        raise BenchmarkError(
            f"flwr {args[0]}: no JSON: {(proc.stdout + proc.stderr)[-500:]}"
        ) from exc
    if not payload.get("success"):
        raise BenchmarkError(f"flwr {args[0]} failed: {payload.get('error-message') or payload}")
    return payload


def _submit_kwargs(world: World, rounds: int, args: argparse.Namespace, title: str) -> dict:
    return {
        "by": world.researcher,
        "project": world.project,
        "dataset_versions": world.versions,
        "title": title,
        "target_column": "diagnosis",
        "num_rounds": rounds,
        "local_epochs": args.local_epochs,
        "learning_rate": args.learning_rate,
    }


def raw_run_config(world: World, rounds: int, args: argparse.Namespace) -> dict:
    """The portal's exact run config for this job, with no callback (the job is rolled back)."""
    from django.db import transaction

    from federation import services

    with transaction.atomic():
        job = services.job_submit(**_submit_kwargs(world, rounds, args, "overhead benchmark (raw)"))
        config = services.job_run_config(job).to_flower()
        transaction.set_rollback(True)  # nothing recorded, and the queued launch never fires
    config["callback-url"] = ""
    return config


def run_flower(world: World, rounds: int, args: argparse.Namespace) -> RunResult:
    """The raw arm on the second federation, which runs on Flower's defaults."""
    return run_raw(world, rounds, args, home=world.flower_home, arm="flower")


def run_raw(
    world: World,
    rounds: int,
    args: argparse.Namespace,
    *,
    home: Path | None = None,
    arm: str = "raw",
) -> RunResult:
    """``flwr run`` the Flower App with the job's run config; poll ``flwr ls`` until it finishes
    (on the portal's federation, or the one ``home`` names)."""

    config = raw_run_config(world, rounds, args)
    toml = world.tmp / "raw-run-config.toml"
    toml.write_text(tomli_w.dumps(config))  # flwr's own TOML writer (a flwr dependency)

    t0 = time.monotonic()
    payload = _flwr(world, ["run", str(world.app_dir), world.federation, "-c", str(toml)], home)
    run_id = str(payload.get("run-id", ""))
    t_submitted = time.monotonic()
    if not run_id:
        raise BenchmarkError(f"flwr run returned no run id: {payload}")
    next_poll = t_submitted + world.poll
    while True:
        time.sleep(max(0.0, next_poll - time.monotonic()))
        next_poll += world.poll  # fixed rate, like Celery beat; back to back if a call is slower
        run = _flwr(world, ["ls", world.federation, "--run-id", run_id], home)["runs"][0]
        if str(run.get("status", "")).startswith("finished"):
            break
        if time.monotonic() - t0 > world.timeout:
            _flwr(world, ["stop", run_id, world.federation], home)
            raise BenchmarkError(f"raw run {run_id} did not finish within {world.timeout:.0f} s")
        next_poll = max(next_poll, time.monotonic())
    total = time.monotonic() - t0
    world.timing_over()
    if run["status"] != "finished:completed":
        raise BenchmarkError(f"raw run {run_id} ended {run['status']}: {run.get('status-details')}")
    return RunResult(
        arm=arm,
        rounds=rounds,
        total=total,
        submit=t_submitted - t0,
        run=float(run["elapsed"]),
        run_id=run_id,
    )


def run_portal(world: World, rounds: int, args: argparse.Namespace) -> RunResult:
    """Submit through ``job_submit``; wait until the job is terminal in the database."""
    from federation import services, superlink
    from federation.models import FederatedJob, JobStatus, RoundMetric, SiteRoundMetric
    from portal.models import AuditEvent

    t0_wall = time.time()
    t0 = time.monotonic()
    job = services.job_submit(**_submit_kwargs(world, rounds, args, "overhead benchmark (portal)"))
    terminal = JobStatus.terminal()
    while True:
        status = FederatedJob.objects.filter(pk=job.pk).values_list("status", flat=True).get()
        if status in terminal:
            break
        if world.worker.poll() is not None:
            raise BenchmarkError(
                f"the Celery worker exited ({world.worker.returncode}) while job {job.pk} was "
                f"{status}; log tail:\n{_tail(world.worker_log, 1500)}"
            )
        if time.monotonic() - t0 > world.timeout:
            raise BenchmarkError(f"portal job {job.pk} still {status} after {world.timeout:.0f} s")
        time.sleep(DB_POLL_SECONDS)
    total = time.monotonic() - t0
    world.timing_over()
    job.refresh_from_db()
    if job.status != JobStatus.COMPLETED:
        raise BenchmarkError(f"portal job {job.pk} ended {job.status}: {job.status_detail}")
    launched = (
        AuditEvent.objects.filter(
            action="job.launch", target_type="federation.federatedjob", target_id=str(job.pk)
        )
        .values_list("created_at", flat=True)
        .first()
    )
    queue = job.started_at.timestamp() - t0_wall
    submit = (launched.timestamp() - job.started_at.timestamp()) if launched else float("nan")
    run = superlink.run_status(services.superlink_connection(), job.flower_run_id)
    round_walls = [
        w
        for w in RoundMetric.objects.filter(job=job).values_list("wall_seconds", flat=True)
        if w is not None
    ]
    # The sites' own work: each ClientApp meters its handlers (wall and CPU seconds of the
    # train and evaluate messages of a round, summed); a round waits for its slowest site.
    per_round: dict[int, list[tuple[float, float]]] = {}
    for rnd, wall, cpu in SiteRoundMetric.objects.filter(job_site__job=job).values_list(
        "round", "wall_seconds", "cpu_seconds"
    ):
        per_round.setdefault(rnd, []).append((wall, cpu))
    handler_wall = sum(max(w for w, _ in sites) for sites in per_round.values())
    handler_cpu = sum(c for sites in per_round.values() for _, c in sites)
    return RunResult(
        arm="portal",
        rounds=rounds,
        total=total,
        submit=submit,
        run=float(run.raw["elapsed"]),
        queue=queue,
        run_id=job.flower_run_id,
        extra={
            "job_id": job.pk,
            "rounds_reported": len(round_walls),
            "handler_wall": handler_wall,
            "handler_cpu": handler_cpu,
            "server_round_walls": round_walls,
        },
    )


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


def _fmt(value: float | None, width: int = 8) -> str:
    return f"{'–':>{width}}" if value is None else f"{value:>{width}.2f}"


def report(
    results: list[RunResult], args: argparse.Namespace, sampler: MemorySampler | None, hwm: dict
) -> float:
    """Print the tables; return the ratio of the median wall times portal/raw."""
    print()
    print(
        f"Portal overhead — {args.rounds} rounds, local-epochs {args.local_epochs}, "
        f"learning-rate {args.learning_rate}, 3 sites, one SuperLink + SuperNodes for both arms; "
        f"status poll every {args.poll:g} s in both arms"
    )
    print()
    head = (
        f"{'#':>2}  {'arm':<6} {'total s':>8} {'queue s':>8} {'submit s':>8} {'run s':>8} "
        f"{'rest s':>8} {'s/round':>8} {'our CPU':>8} {'other CPU':>9} {'backlog':>7}  run id"
    )
    print(head)
    print("-" * len(head))
    for i, r in enumerate(results, 1):
        backlog = "–" if r.backlog is None else str(r.backlog)
        print(
            f"{i:>2}  {r.arm:<6} {_fmt(r.total)} {_fmt(r.queue)} {_fmt(r.submit)} {_fmt(r.run)} "
            f"{_fmt(r.rest)} {_fmt(r.total / r.rounds)} {_fmt(r.cpu_ours)} "
            f"{_fmt(r.cpu_other, 9)} {backlog:>7}  {r.run_id}"
        )
    print()
    print(
        "total = submission → completion seen; queue = job_submit → the worker starts the launch "
        "(portal); submit = flwr run → run id; run = SuperLink running → finished; rest = the "
        "ServerApp's start + noticing the end; our/other CPU = CPUs busy on average with this "
        f"benchmark's processes / with anything else (this machine has {os.cpu_count()}); "
        "backlog = broker messages waiting at the end"
    )

    def med(arm: str, attr: str) -> float:
        return statistics.median(getattr(r, attr) for r in results if r.arm == arm)

    raw_t, portal_t = med("raw", "total"), med("portal", "total")
    ratio = portal_t / raw_t
    flower_t = med("flower", "total") if any(r.arm == "flower" for r in results) else None
    raws = [r for r in results if r.arm == "raw"]
    portals = [r for r in results if r.arm == "portal"]
    paired = [p.total / r.total for r, p in zip(raws, portals, strict=False)]
    print()
    print(f"{'median':<28} {'raw':>9} {'portal':>9} {'portal−raw':>11}")
    for label, attr in (
        ("total wall time (s)", "total"),
        ("submit (s)", "submit"),
        ("Flower run elapsed (s)", "run"),
        ("rest (s)", "rest"),
    ):
        a, b = med("raw", attr), med("portal", attr)
        print(f"{label:<28} {a:>9.2f} {b:>9.2f} {b - a:>+11.2f}")
    print(f"{'queue (s)':<28} {'–':>9} {med('portal', 'queue'):>9.2f}")
    if all(r.cpu_other is not None for r in results):
        a, b = med("raw", "cpu_other"), med("portal", "cpu_other")
        print(f"{'other CPU load (CPUs)':<28} {a:>9.2f} {b:>9.2f} {b - a:>+11.2f}")
    print(
        f"{'wall time per round (s)':<28} {raw_t / args.rounds:>9.2f} "
        f"{portal_t / args.rounds:>9.2f} {(portal_t - raw_t) / args.rounds:>+11.2f}"
    )
    print(
        f"{'Flower run per round (s)':<28} {med('raw', 'run') / args.rounds:>9.2f} "
        f"{med('portal', 'run') / args.rounds:>9.2f}"
    )
    print()
    print(
        f"ratio of medians portal/raw = {ratio:.3f}  (target ≤ {TARGET_RATIO:.2f}: "
        f"{'met' if ratio <= TARGET_RATIO else 'NOT met'}); paired ratios: "
        + ", ".join(f"{x:.3f}" for x in paired)
    )
    if flower_t is not None:
        flowers = [r for r in results if r.arm == "flower"]
        paired_f = [p.total / f.total for f, p in zip(flowers, portals, strict=False)]
        print(
            f"ratio of medians portal/flower (raw flwr run on Flower's defaults) = "
            f"{portal_t / flower_t:.3f}  (target ≤ {TARGET_FLOWER_RATIO:.2f}: "
            f"{'met' if portal_t / flower_t <= TARGET_FLOWER_RATIO else 'NOT met'}); paired: "
            + ", ".join(f"{x:.3f}" for x in paired_f)
        )
    walls = [r.extra["handler_wall"] for r in portals if r.extra.get("handler_wall")]
    if walls:
        hw = statistics.median(walls)
        hc = statistics.median(r.extra["handler_cpu"] for r in portals)
        print(
            f"ratio portal job time / the sites' handler time = {portal_t / hw:.1f}  (the limit "
            f"this is bounded by: the handlers' wall time on the slowest site of each round, "
            f"summed, {hw:.2f} s; all sites' handler CPU {hc:.2f} CPU-s; metered by the "
            "ClientApps)"
        )

    others = [r.cpu_other for r in results if r.cpu_other is not None]
    if others and max(others) > 0.25:
        print(
            f"NOTE: other work used up to {max(others):.2f} of {os.cpu_count()} CPUs during the "
            "runs; the times are disturbed by it (compare the paired ratios and the other-CPU "
            "column; more --repeat helps)."
        )

    split = [r for r in results if r.extra.get("phases")]
    if split:
        print()
        print(
            "Per phase (one message type sent to every site), from the SuperNodes' log lines "
            "stamped as written (every 20 ms), medians over sites and phases of each run:"
        )
        head = (
            f"  {'arm':<7} {'phases':>6} {'start s':>8} {'between s':>10} {'ClientApp s':>12} "
            f"{'end s':>7}  message types"
        )
        print(head)
        for r in split:
            ph = r.extra["phases"]
            between = statistics.median(ph["between"]) if ph["between"] else float("nan")
            print(
                f"  {r.arm:<7} {len(ph['phases']):>6} {ph['start']:>8.2f} {between:>10.2f} "
                f"{statistics.median(ph['clientapp']):>12.2f} {ph['end']:>7.2f}  "
                + ", ".join(ph["phases"])
            )
        handler = [
            r.extra["handler_wall"] / (2 * r.rounds) for r in portals if r.extra.get("handler_wall")
        ]
        print(
            "  start = submission → the first message at a site (portal: queue, admission, flwr "
            "run, ServerApp start; raw: flwr run, ServerApp start); between = a phase's last reply "
            "sent → the next message received (ServerApp poll, aggregation, push, SuperNode idle "
            "poll — 3 s in flwr 1.42, no setting); ClientApp = message received → reply sent "
            "(SuperExec task poll, a new interpreter with flwr's imports, app load, handler, "
            "upload); end = the last reply → completion seen (ServerApp end, status check)."
        )
        if handler:
            print(
                f"  the handler itself (metered by the ClientApp, per train or evaluate message, "
                f"slowest site): {statistics.median(handler):.3f} s"
            )

    if sampler is not None and sampler.peaks:
        print()
        print("Peak RSS (MiB), summed over each process tree, sampled every 0.5 s:")
        names = sorted({n for peaks in sampler.peaks.values() for n in peaks})
        print(f"  {'process tree':<44} {'raw':>8} {'portal':>8}")
        for name in names:
            cells = [sampler.peaks.get(arm, {}).get(name) for arm in ("raw", "portal")]
            print(
                f"  {name:<44} "
                + " ".join(f"{'–':>8}" if c is None else f"{c / 1024:>8.0f}" for c in cells)
            )
        if hwm:
            print(
                "  SuperNode process VmHWM (MiB): "
                + ", ".join(f"{site} {kb / 1024:.0f}" for site, kb in hwm.items())
            )
    return ratio


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=2, help="runs per arm (default 2)")
    p.add_argument("--rounds", type=int, default=3, help="FedAvg rounds per run (default 3)")
    p.add_argument("--local-epochs", type=int, default=5)
    p.add_argument("--learning-rate", type=float, default=0.1)
    p.add_argument(
        "--poll", type=float, default=1.0, help="status poll = reconcile interval, s (default 1)"
    )
    p.add_argument("--warmup", type=int, default=1, help="untimed 1-round runs per arm first")
    p.add_argument("--timeout", type=float, default=600.0, help="per run, s")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    p.add_argument(
        "--unpatched-broker",
        action="store_true",
        help="use kombu's filesystem transport as is (its write race can stop the worker)",
    )
    p.add_argument("--check", action="store_true", help=f"exit 1 if the ratio > {TARGET_RATIO}")
    p.add_argument(
        "--superexec-poll",
        type=float,
        default=runtime.SUPEREXEC_POLL_SECONDS,
        help="the portal's federation: SuperExec task poll, s (default: the portal's)",
    )
    p.add_argument(
        "--no-flower-defaults",
        action="store_true",
        help="skip the third arm (raw flwr run on a second federation with Flower's defaults)",
    )
    return p.parse_args(argv)


def _configure_environment(tmp: Path, web_port: int, poll: float) -> Path:
    """Point settings at a fresh var dir, SQLite and the filesystem broker (before django.setup)."""
    var = tmp / "var"
    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "portal.settings",
            "FRP_VAR_DIR": str(var),
            "DATABASE_URL": f"sqlite:///{var / 'portal.sqlite3'}",
            "CELERY_BROKER_URL": "filesystem://",
            "CELERY_TASK_ALWAYS_EAGER": "false",
            "FRP_FLWR_HOME": str(var / "flwr-control"),
            "FRP_SITES_DIR": str(var / "sites"),
            "FRP_CALLBACK_BASE_URL": f"http://127.0.0.1:{web_port}",
            "FRP_RECONCILE_SECONDS": f"{poll:g}",
            "FLWR_TELEMETRY_ENABLED": "0",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return var


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.repeat < 1 or args.rounds < 1:
        raise SystemExit("--repeat and --rounds must be at least 1")

    def _sigterm(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _sigterm)
    tmp = Path(tempfile.mkdtemp(prefix="frp-overhead-"))
    web_port = runtime.free_port()
    var = _configure_environment(tmp, web_port, args.poll)
    if not args.unpatched_broker:
        os.environ["FRP_BENCH_PATCH_BROKER"] = "1"  # read by the worker (see celery_worker)
        patch_kombu_filesystem_put()  # this process publishes job_launch
    logs = tmp / "logs"
    logs.mkdir()
    state = web = worker = world = None
    states: list = []
    sampler = MemorySampler() if MemorySampler.available() else None
    ok = interrupted = False
    ratio = float("nan")
    try:
        import django

        django.setup()
        from django.conf import settings
        from django.contrib.auth import get_user_model
        from django.core.management import call_command

        from demo.seed import demo_seed
        from federation import callbacks
        from federation.selectors import local_sites
        from sandbox.selectors import usable_versions

        step = time.monotonic()
        print(f"[setup] temporary FRP_VAR_DIR {var}", flush=True)
        if not args.unpatched_broker:
            print(
                "[setup] kombu's filesystem transport writes messages atomically here "
                "(benchmark-only patch; --unpatched-broker to run it as is)",
                flush=True,
            )
        call_command("migrate", interactive=False, verbosity=0)
        project = demo_seed()
        researcher = get_user_model().objects.get(username="ada")
        versions = usable_versions(projects=[project])
        print(
            f"[setup] migrated and seeded: {len(versions)} datasets "
            f"({', '.join(v.dataset.site.slug for v in versions)})",
            flush=True,
        )

        state = runtime.start(
            var / "federation",
            local_sites(),
            superlink_env=callbacks.serverapp_environment(),
            superexec_poll=args.superexec_poll,
        )
        states.append(state)
        runtime.write_state_control_config(
            settings.FRP_FLWR_HOME, settings.FRP_FEDERATION_NAME, state
        )
        print(
            f"[setup] SuperLink {state.superlink_address}; SuperNodes "
            f"{', '.join(f'{s} (pid {p})' for s, p in state.supernodes.items())}",
            flush=True,
        )
        flower_state = None
        if not args.no_flower_defaults:
            flower_state = runtime.start(
                var / "federation-flower-defaults",
                local_sites(),
                superlink_env=callbacks.serverapp_environment(),
                superexec_poll=None,
            )
            states.append(flower_state)
            runtime.write_state_control_config(
                var / "flwr-flower-defaults", settings.FRP_FEDERATION_NAME, flower_state
            )
            print(
                f"[setup] second federation on Flower's defaults (SuperExec poll 1 s): SuperLink "
                f"{flower_state.superlink_address}",
                flush=True,
            )
        web_log, worker_log = logs / "web.log", logs / "worker.log"
        manage = str(ROOT / "manage.py")
        web = _start(
            [sys.executable, manage, "runserver", f"127.0.0.1:{web_port}", "--noreload"], web_log
        )
        worker = _start(
            [
                sys.executable,
                str(Path(__file__).resolve()),
                "celery-worker",
                "-A",
                "portal",
                "worker",
                "-B",
                "--concurrency",
                "1",
                "--loglevel",
                "INFO",
                "--schedule",
                str(tmp / "celerybeat-schedule"),
            ],
            worker_log,
        )
        _wait_http(f"http://127.0.0.1:{web_port}/accounts/login/", web, web_log)
        _wait_log(" ready.", worker, worker_log)
        print(
            f"[setup] web server on 127.0.0.1:{web_port}, Celery worker + beat ready "
            f"({time.monotonic() - step:.0f} s)",
            flush=True,
        )

        if sampler is not None:
            sampler.roots = {
                "SuperLink + ServerApp processes": [state.superlink_pid],
                **{f"SuperNode {s} + ClientApps": [p] for s, p in state.supernodes.items()},
                "portal: web server + Celery worker": [web.pid, worker.pid],
            }
            if flower_state is not None:
                sampler.roots["second federation (Flower's defaults)"] = [
                    flower_state.superlink_pid,
                    *flower_state.supernodes.values(),
                ]
            sampler.start()

        world = World(
            flwr_home=settings.FRP_FLWR_HOME,
            federation=settings.FRP_FEDERATION_NAME,
            app_dir=settings.FRP_FLWR_APP_DIR,
            project=project,
            researcher=researcher,
            versions=versions,
            poll=args.poll,
            timeout=args.timeout,
            tmp=tmp,
            worker=worker,
            worker_log=worker_log,
            queue_dir=Path(settings.CELERY_BROKER_TRANSPORT_OPTIONS["data_folder_in"]),
            sampler=sampler,
            flower_home=None if flower_state is None else var / "flwr-flower-defaults",
        )
        arms = {"raw": run_raw, "portal": run_portal}
        if world.flower_home is not None:
            arms = {"flower": run_flower, **arms}
        stamped = {f"portal:{s}": Path(state.logs[f"supernode-{s}"]) for s in state.supernodes}
        world.nodes = {"raw": list(stamped), "portal": list(stamped)}
        if flower_state is not None:
            flower_logs = {
                f"flower:{s}": Path(flower_state.logs[f"supernode-{s}"])
                for s in flower_state.supernodes
            }
            stamped.update(flower_logs)
            world.nodes["flower"] = list(flower_logs)
        world.stamper = LogStamper(stamped)
        world.stamper.start()
        for i in range(args.warmup):
            for arm, fn in arms.items():
                r = fn(world, 1, args)
                print(f"[warm-up {i + 1}] {arm:<6} 1 round  {r.total:6.1f} s (not counted)")
                time.sleep(2)
        results: list[RunResult] = []
        for i in range(args.repeat):
            for arm, fn in arms.items():
                if sampler is not None:
                    sampler.phase = arm
                before, t_before = cpu_snapshot(), time.monotonic()
                r = fn(world, args.rounds, args)
                after, wall = cpu_snapshot(), time.monotonic() - t_before
                if world.stamper is not None:
                    time.sleep(0.1)  # the stamper's last read
                    r.extra["phases"] = phases(
                        world.stamper.events, world.nodes[arm], t_before, t_before + wall
                    )
                if before and after:
                    r.cpu_ours = (after[1] - before[1]) / wall
                    r.cpu_other = max(0.0, (after[0] - before[0]) - (after[1] - before[1])) / wall
                r.backlog = sum(1 for f in world.queue_dir.iterdir() if f.name.endswith(".msg"))
                results.append(r)
                reported = (
                    f", rounds reported by callback {r.extra['rounds_reported']}/{r.rounds}"
                    if "rounds_reported" in r.extra
                    else ""
                )
                print(
                    f"[run {i + 1}/{args.repeat}] {arm:<6} {args.rounds} rounds {r.total:6.1f} s "
                    f"(Flower run {r.run:.1f} s, run id {r.run_id}{reported})",
                    flush=True,
                )
                time.sleep(2)  # let the last ServerApp/ClientApp processes exit before the next
        hwm = {
            site: _status_fields(pid, ("VmHWM",)).get("VmHWM", 0)
            for site, pid in state.supernodes.items()
        }
        ratio = report(results, args, sampler, {s: v for s, v in hwm.items() if v})
        ok = True
    except KeyboardInterrupt:
        interrupted = True
        print("\ninterrupted; stopping every process", file=sys.stderr)
    except (BenchmarkError, runtime.RuntimeError_) as exc:
        print(f"\nbenchmark failed: {exc}", file=sys.stderr)
    finally:
        if sampler is not None:
            sampler.stop()
        if world is not None and world.stamper is not None:
            world.stamper.stop()
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not skip the cleanup
        _terminate(worker)
        _terminate(web)
        for started in states:
            runtime.stop(started)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if ok and not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"kept {tmp} (logs: {logs}, {var / 'federation' / 'logs'})", file=sys.stderr)
    if not ok:
        return 130 if interrupted else 1
    return 1 if args.check and ratio > TARGET_RATIO else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["celery-worker"]:
        sys.exit(celery_worker(sys.argv[2:]))
    sys.exit(main())
