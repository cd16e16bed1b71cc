"""Benchmark of the reconcile tick's SuperLink read: the ``flwr ls`` process the portal started
each tick before (issue 12: 10–21 s under load against a 5 s beat) against the in-process Control
API call it makes now (``federation.superlink.runs_status``).

Run from the repository root (about a minute on a 2-CPU machine)::

    PYTHONPATH=$PWD .venv/bin/python benchmarks/reconcile.py [--runs 20] [--repeat 7]

Starts a real SuperLink (flwr 1.42.0) on a free port, starts ``--runs`` runs of the portal's Flower
App on it (stopped at once: there are no SuperNodes), then times both ways of reading every run's
status, alternated ``--repeat`` times, and prints medians: wall seconds, CPU seconds (this process
plus its children), and the ratios before / after. Both read the same runs from the same SuperLink
in the same process; the baseline is the exact command the old boundary ran
(``flwr ls FEDERATION --format json`` with ``FLWR_HOME`` set, its JSON parsed). The machine may be
shared: other load slows both arms alike.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "federation" / "flwr_app"))

from federation import runtime, superlink  # noqa: E402

RECONCILE_INTERVAL_SECONDS = 5.0  # FRP_RECONCILE_SECONDS' default


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def before(conn: superlink.Connection, run_ids: list[str]) -> dict:
    """The old tick: one ``flwr ls`` process, its JSON parsed, the runs picked out."""
    flwr = str(Path(sys.executable).with_name("flwr"))
    env = dict(os.environ, FLWR_HOME=str(conn.flwr_home), FLWR_TELEMETRY_ENABLED="0")
    proc = subprocess.run(
        [flwr, "ls", conn.federation, "--format", "json"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    payload = json.loads(proc.stdout)
    assert payload["success"], payload
    listed = {str(r["run-id"]): r for r in payload["runs"]}
    return {rid: listed[rid]["status"] for rid in run_ids if rid in listed}


def after(conn: superlink.Connection, run_ids: list[str]) -> dict:
    """The new tick's read: the Control API from inside this process."""
    found = superlink.runs_status(conn, run_ids)
    return {
        rid: r.status + (f":{r.sub_status}" if r.sub_status else "") for rid, r in found.items()
    }


def measure(fn, *args) -> tuple[float, float, dict]:
    c0, t0 = _cpu(), time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - t0, _cpu() - c0, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--runs", type=int, default=20, help="runs on the SuperLink (<= 20: one flwr ls page)"
    )
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="frp-bench-reconcile-") as tmp:
        root = Path(tmp)
        state = runtime.start(root / "federation", [])
        try:
            runtime.write_state_control_config(root / "control", "bench", state)
            conn = superlink.Connection(
                flwr_home=root / "control",
                federation="bench",
                app_dir=ROOT / "federation" / "flwr_app",
            )
            run_ids = []
            for job_id in range(1, args.runs + 1):
                run_id = superlink.run_submit(conn, {"job-id": job_id, "discovery-timeout": 1.0})
                superlink.run_stop(conn, run_id)
                run_ids.append(run_id)
            after(conn, run_ids)  # warm: flwr's modules imported once, as in a long-lived worker
            old, new = [], []
            for _ in range(args.repeat):
                wall, cpu, a = measure(before, conn, run_ids)
                old.append((wall, cpu))
                wall, cpu, b = measure(after, conn, run_ids)
                new.append((wall, cpu))
                assert a == b, (a, b)  # both arms read the same statuses
                assert len(b) == len(run_ids)
        finally:
            runtime.stop(state)

    old_wall = statistics.median(w for w, _ in old)
    old_cpu = statistics.median(c for _, c in old)
    new_wall = statistics.median(w for w, _ in new)
    new_cpu = statistics.median(c for _, c in new)
    print(
        f"reconcile tick's SuperLink read, {args.runs} runs, median of {args.repeat} (alternated)"
    )
    print(f"  before (flwr ls process):     {old_wall:8.3f} s wall  {old_cpu:8.3f} CPU-s")
    print(f"  after  (Control API in-proc): {new_wall:8.3f} s wall  {new_cpu:8.3f} CPU-s")
    print(
        f"  ratio before/after:           {old_wall / new_wall:8.1f} x wall  {old_cpu / max(new_cpu, 1e-6):8.1f} x CPU"
    )
    print(
        f"  share of the {RECONCILE_INTERVAL_SECONDS:.0f} s reconcile interval: before "
        f"{old_wall / RECONCILE_INTERVAL_SECONDS:.1%}, after {new_wall / RECONCILE_INTERVAL_SECONDS:.2%}"
    )


if __name__ == "__main__":
    main()
