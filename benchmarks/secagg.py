"""Wall-time overhead of secure aggregation (SecAgg+) against plain FedAvg, with the real Flower App.

Run from the repository root (about 10 minutes on a 2-CPU machine with the defaults)::

    .venv/bin/python benchmarks/secagg.py [--sites 3 10] [--rounds 3] [--repeat 1]

In this one process and run, for each site count N: the demo breast-cancer data split over N
hospitals, ingested site-side (``sandbox.ingest``, encrypted stores, no portal), ONE local
federation (a SuperLink and N SuperNodes, ``federation.runtime``) that both arms share, then the
same job submitted alternately (plain, secagg, plain, secagg, … ``--repeat`` times, after an untimed
one-round plain warm-up; ``--no-warmup`` skips it) through the portal's control-API boundary
(``federation.superlink.run_submit``), with no callback URL and no contribution step:

* **plain** — the app's FedAvg round (one ``train`` message per site per round);
* **secagg** — ``privacy.secagg`` on: each round's training is Flower's ``SecAggPlusWorkflow``
  (four ``train`` exchanges per site: setup, share keys, collect masked vectors, unmask; ADR 0027).

Each run is timed from the submit call until ``run_status`` says finished (polled every 0.2 s),
and by the SuperLink's own ``elapsed``. Reported per N: the medians and the ratio secagg / plain of
both (the overhead), and the seconds per round. No timed asserts: figures only.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "federation" / "flwr_app")]

from federation import runtime, superlink  # noqa: E402
from frp_flwr import contract  # noqa: E402
from sandbox import demo_data  # noqa: E402
from sandbox.ingest import ingest_csv  # noqa: E402
from sandbox.keyring import SiteKeyring  # noqa: E402
from sandbox.storage import FilesystemStore  # noqa: E402

POLL_SECONDS = 0.2
ROUND_TIMEOUT = 900.0
FEDERATION = "bench"


class BenchmarkError(Exception):
    """A run did not complete; the message says which and why."""


@dataclass
class Federation:
    state: runtime.FederationState
    conn: superlink.Connection
    sites: dict[str, contract.SitePointer]
    features: list[str]


def federation_start(root: Path, n: int) -> Federation:
    """N hospitals' encrypted stores (the demo data split N ways) and a SuperLink + N SuperNodes."""
    slugs = tuple(f"hospital-{i:02d}" for i in range(n))
    paths = demo_data.write_site_csvs(root / "incoming", slugs)
    sites, local = {}, []
    for slug in slugs:
        home = root / "sites" / slug
        kek = SiteKeyring(home / "keyring").create(slug)
        result = ingest_csv(
            paths[slug],
            site=slug,
            dataset="bc",
            version=1,
            store=FilesystemStore(home / "store"),
            kek=kek,
        )
        sites[slug] = contract.SitePointer(store_key=result.store_key, dataset="bc", version=1)
        local.append(
            runtime.LocalSite(
                site=slug, store_url=f"file://{home / 'store'}", keyring=str(home / "keyring")
            )
        )
    state = runtime.start(root / "federation", local)
    home = root / "flwr-home"
    runtime.write_state_control_config(home, FEDERATION, state)
    conn = superlink.Connection(
        flwr_home=home, federation=FEDERATION, app_dir=ROOT / "federation" / "flwr_app"
    )
    features = list(demo_data.split_breast_cancer(slugs)[slugs[0]][0])
    return Federation(state, conn, sites, features)


def run_config(fed: Federation, *, rounds: int, secagg: bool) -> dict:
    """The run config of the benchmark job (the 30 numeric features, 3 local epochs)."""
    spec = contract.JobSpec(
        sites=fed.sites,
        target="diagnosis",
        features=fed.features,
        min_sites=2,
        privacy={"secagg": True} if secagg else {},
    )
    return contract.RunConfig(
        job_spec=spec.to_text(),
        num_rounds=rounds,
        local_epochs=3,
        contribution=False,
        round_timeout=ROUND_TIMEOUT,  # per exchange: generous, a shared machine is slow
        discovery_timeout=ROUND_TIMEOUT,
    ).to_flower()


def timed_run(fed: Federation, *, rounds: int, secagg: bool, timeout: float) -> tuple[float, float]:
    """Submit one run; return ``(seconds from submit to finished, SuperLink elapsed seconds)``.
    Raises ``BenchmarkError`` unless it completes within ``timeout`` seconds."""
    t0 = time.monotonic()
    run_id = superlink.run_submit(fed.conn, run_config(fed, rounds=rounds, secagg=secagg))
    while True:
        status = superlink.run_status(fed.conn, run_id)
        if status.is_finished:
            break
        if time.monotonic() - t0 > timeout:
            superlink.run_stop(fed.conn, run_id)
            raise BenchmarkError(f"run {run_id} did not finish within {timeout:.0f} s")
        time.sleep(POLL_SECONDS)
    total = time.monotonic() - t0
    if status.sub_status != "completed":
        raise BenchmarkError(f"run {run_id} ended {status.sub_status}: {status.details}")
    return total, float(status.raw.get("elapsed") or float("nan"))


def measure(
    root: Path, n: int, *, rounds: int, repeat: int, timeout: float, warmup: bool = True
) -> dict:
    """Both arms at ``n`` sites on one federation; the medians and ratios (module docstring)."""
    fed = federation_start(root / f"n{n}", n)
    try:
        if warmup:  # untimed: the SuperNodes install the app (both arms run the same one)
            timed_run(fed, rounds=1, secagg=False, timeout=timeout)
        times: dict[str, list[tuple[float, float]]] = {"plain": [], "secagg": []}
        for _ in range(repeat):
            for arm in ("plain", "secagg"):
                times[arm].append(
                    timed_run(fed, rounds=rounds, secagg=arm == "secagg", timeout=timeout)
                )
    finally:
        runtime.stop(fed.state)
    med = {
        arm: (statistics.median(t for t, _ in v), statistics.median(e for _, e in v))
        for arm, v in times.items()
    }
    return {
        "sites": n,
        "rounds": rounds,
        "runs": times,
        "median": med,
        "ratio_total": med["secagg"][0] / med["plain"][0],
        "ratio_elapsed": med["secagg"][1] / med["plain"][1],
    }


def report(rows: list[dict]) -> str:
    """The table of figures (seconds; ratios secagg / plain)."""
    lines = [
        "SecAgg+ overhead against plain FedAvg (real Flower App; medians; s per round in brackets)",
        f"{'sites':>5} {'plain s':>10} {'secagg s':>10} {'ratio':>6} "
        f"{'plain elapsed':>14} {'secagg elapsed':>15} {'ratio':>6}",
    ]
    for r in rows:
        (pt, pe), (st, se) = r["median"]["plain"], r["median"]["secagg"]
        k = r["rounds"]
        lines.append(
            f"{r['sites']:>5} {pt:>7.1f} ({pt / k:.1f}) {st:>6.1f} ({st / k:.1f}) "
            f"{r['ratio_total']:>6.2f} {pe:>14.1f} {se:>15.1f} {r['ratio_elapsed']:>6.2f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sites", type=int, nargs="+", default=[3, 10])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--no-warmup", action="store_true")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="frp-secagg-bench-") as tmp:
        for n in args.sites:
            print(f"[{n} sites] starting", flush=True)
            rows.append(
                measure(
                    Path(tmp),
                    n,
                    rounds=args.rounds,
                    repeat=args.repeat,
                    timeout=args.timeout,
                    warmup=not args.no_warmup,
                )
            )
            print(report(rows[-1:]), flush=True)
    print()
    print(report(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
