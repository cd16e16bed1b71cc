"""Privacy: accuracy of the real Flower App against ε, as ratios to the run without DP (ε = ∞).

Run from the repository root (a few minutes on a 2-CPU machine)::

    .venv/bin/python benchmarks/privacy.py [--epsilons 1,3,8] [--rounds 3] [--clip 0.5]

One bundled scikit-learn dataset (breast cancer by default, IID over three sites, prepared and
ingested as in ``benchmarks/quality.py``), ONE real local federation (a SuperLink and three
SuperNodes, no simulation), one job per ε submitted with ``flwr run`` and the run config the portal
would send. For each target ε the noise multiplier σ is calibrated with the portal's accountant
(``federation.privacy.epsilon``, dp-accounting's PLD accountant: every site every round, q = 1,
δ = ``--delta``) by bisection; the job then runs with server-side fixed clipping (``--clip``) and
that σ (Flower's ``DifferentialPrivacyServerSideFixedClipping``, ``frp_flwr.privacy``). ε = ∞ is
the same job with dp off, run in the same process: the ratios are federated accuracy(ε) /
accuracy(∞). The noise is random, so ``--repeats`` runs each setting several times and reports the
mean. Site-level DP over three sites is a hard regime: the whole site is the unit protected.

Structured as functions with a ``main`` (``accuracy_vs_epsilon``; other measurements — SecAgg+
overhead — can be added beside it). Nothing is timed against a threshold.
"""

from __future__ import annotations

import argparse
import math
import os
import secrets
import shutil
import signal
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "federation" / "flwr_app"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import quality  # noqa: E402  (the data, ingest and callback helpers of benchmarks/quality.py)

from federation import runtime, superlink  # noqa: E402  (no Django)
from federation.privacy import epsilon as accountant_epsilon  # noqa: E402
from frp_flwr import contract  # noqa: E402
from frp_flwr.signing import KEY_ENV, master_key_from_text  # noqa: E402
from sandbox.ingest import ingest_csv  # noqa: E402
from sandbox.keyring import SiteKeyring  # noqa: E402
from sandbox.storage import FilesystemStore  # noqa: E402

SITES = quality.SITES


def calibrate_noise(
    target: float, *, rounds: int, delta: float, sampling_rate: float = 1.0
) -> float:
    """The noise multiplier σ whose ε after ``rounds`` rounds at ``delta`` is ``target`` (within
    0.1 %), by bisection on the accountant (ε falls as σ grows). σ is searched in [0.3, 1e3]:
    below 0.3 the PLD accountant's discretisation becomes very slow, and ε is above 50 there."""
    lo, hi = 0.3, 1e3
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        eps = accountant_epsilon(
            noise_multiplier=mid, rounds=rounds, delta=delta, sampling_rate=sampling_rate
        )
        if abs(eps - target) <= 1e-3 * target:
            return mid
        lo, hi = (mid, hi) if eps > target else (lo, mid)
    return math.sqrt(lo * hi)


@dataclass
class Federation:
    """One local federation with the dataset ingested at every site, and the callback server."""

    conn: superlink.Connection
    events: quality.Events
    url: str
    spec: contract.JobSpec


@contextmanager
def federation(dataset: str, root: Path):
    """Ingest ``dataset`` (IID over ``SITES``, 10 % missing at one site, as benchmarks/quality.py)
    and start a SuperLink and a SuperNode per site; stop everything after."""
    master_text = secrets.token_hex(32)
    events = quality.Events(master_key_from_text(master_text, source="benchmark"))
    server = ThreadingHTTPServer(("127.0.0.1", 0), events.handler())
    threading.Thread(target=server.serve_forever, daemon=True).start()
    state = None
    try:
        X, y, names, task = quality.load_dataset(dataset)
        slug = f"{dataset.replace('_', '-')}-iid"
        for i, (site, rows) in enumerate(zip(SITES, quality.split_rows(y, "iid"), strict=True)):
            store = FilesystemStore(root / "sites" / site / "store")
            kek = SiteKeyring(root / "sites" / site / "keyring").create(site)
            path = root / f"{site}.csv"
            quality.write_csv(
                path, X[rows], y[rows], names, missing=site == quality.MISSING_SITE, seed=i
            )
            ingest_csv(path, site=site, dataset=slug, version=1, store=store, kek=kek)
            path.unlink()
        spec = contract.JobSpec(
            sites={
                s: contract.SitePointer(store_key=f"{s}/{slug}/v1.csv.enc", dataset=slug, version=1)
                for s in SITES
            },
            target="target",
            features=names,
            min_sites=len(SITES),
            task=task,
            plans=[
                contract.FeaturePlan(name=f, kind="numeric", missing="median", indicator=True)
                for f in names
            ],
        )
        state = runtime.start(
            root / "federation",
            [
                runtime.LocalSite(
                    site=s,
                    store_url=f"file://{root / 'sites' / s / 'store'}",
                    keyring=str(root / "sites" / s / "keyring"),
                )
                for s in SITES
            ],
            superlink_env={KEY_ENV: master_text},
        )
        flwr_home = root / "flwr-control"
        runtime.write_state_control_config(flwr_home, "local", state)  # its CA when TLS is on
        conn = superlink.Connection(
            flwr_home=flwr_home, federation="local", app_dir=ROOT / "federation" / "flwr_app"
        )
        url = f"http://127.0.0.1:{server.server_address[1]}/callback/"
        yield Federation(conn, events, url, spec)
    finally:
        if state is not None:
            runtime.stop(state)
        server.shutdown()


def run_job(
    fed: Federation, job_id: int, privacy: contract.Privacy, *, args, timeout: float = 900.0
) -> float | None:
    """Submit one job with ``privacy``; its pooled held-out accuracy (``None`` if it failed)."""
    from dataclasses import replace

    cfg = contract.RunConfig(
        job_id=job_id,
        job_spec=replace(fed.spec, privacy=privacy).to_text(),
        callback_url=f"{fed.url}{job_id}",
        num_rounds=args.rounds,
        local_epochs=args.local_epochs,
        learning_rate=args.learning_rate,
        test_fraction=quality.TEST_FRACTION,
        split_seed=quality.SPLIT_SEED,
        round_timeout=args.round_timeout,
        contribution=False,
    )
    deadline = time.monotonic() + 120
    while True:  # a SuperLink still starting on a loaded machine resets the first connections
        try:
            run_id = superlink.run_submit(fed.conn, cfg.to_flower())
            break
        except superlink.SuperLinkError as exc:
            if time.monotonic() > deadline:
                raise
            print(f"job {job_id}: submit failed ({exc}); retrying", flush=True)
            time.sleep(2)
    fed.events.run_ids[job_id] = str(run_id)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if fed.events.of(job_id, contract.Finished) or fed.events.of(job_id, contract.Failed):
            break
        time.sleep(0.5)
    finished = fed.events.of(job_id, contract.Finished)
    if not finished:
        reasons = [e.reason for e in fed.events.of(job_id, contract.Failed)]
        print(f"job {job_id} ({privacy.dp}): FAILED {reasons or 'timed out'}", flush=True)
        return None
    return finished[0].metrics.accuracy


def accuracy_vs_epsilon(fed: Federation, args) -> list[tuple[float, float | None, list[float]]]:
    """Rows ``(ε, σ, accuracies)`` for ε = ∞ (dp off, σ None) and each ``--epsilons`` value."""
    targets = [math.inf] + [float(e) for e in args.epsilons.split(",")]
    rows, job_id = [], 0
    for eps in targets:
        sigma = (
            None if math.isinf(eps) else calibrate_noise(eps, rounds=args.rounds, delta=args.delta)
        )
        privacy = (
            contract.Privacy()
            if sigma is None
            else contract.Privacy(
                dp="server", noise_multiplier=sigma, clipping_norm=args.clip, delta=args.delta
            )
        )
        accuracies = []
        for _ in range(args.repeats):
            job_id += 1
            acc = run_job(fed, job_id, privacy, args=args)
            if acc is not None:
                accuracies.append(acc)
            print(f"ε={eps:g} σ={sigma if sigma else 0:.3f}: accuracy {acc}", flush=True)
        rows.append((eps, sigma, accuracies))
    return rows


def print_accuracy_table(rows, args) -> None:
    base = rows[0][2]
    base_mean = sum(base) / len(base) if base else float("nan")
    print()
    print(
        f"Privacy: {args.dataset} (IID, {len(SITES)} sites), real Flower App, {args.rounds} rounds × "
        f"{args.local_epochs} local epochs, lr {args.learning_rate}; server-side fixed clipping "
        f"C = {args.clip}; δ = {args.delta:g}; σ from dp-accounting (PLD, q = 1); "
        f"{args.repeats} run(s) per row"
    )
    header = f"{'ε':>6}{'σ':>10}{'accuracy':>10}{'ratio to ε=∞':>14}"
    print(header)
    print("-" * len(header))
    for eps, sigma, accs in rows:
        mean = sum(accs) / len(accs) if accs else float("nan")
        print(
            f"{'∞' if math.isinf(eps) else f'{eps:g}':>6}"
            f"{'—' if sigma is None else f'{sigma:.3f}':>10}"
            f"{mean:>10.4f}{mean / base_mean:>14.3f}"
        )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="breast_cancer")
    parser.add_argument("--epsilons", default="1,3,8")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--local-epochs", type=int, default=5)
    parser.add_argument("--learning-rate", type=float, default=0.05)
    parser.add_argument("--clip", type=float, default=0.5, help="clipping norm C")
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--round-timeout", type=float, default=600.0, help="seconds a site may take per message"
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="frp-privacy-"))
    try:
        with federation(args.dataset, root) as fed:
            rows = accuracy_vs_epsilon(fed, args)
        print_accuracy_table(rows, args)
        return 0 if all(accs for _, _, accs in rows) else 1
    finally:
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)  # runs the finally blocks: every process started is stopped


if __name__ == "__main__":
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    raise SystemExit(main())
