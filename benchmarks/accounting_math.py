"""Benchmark of the accounting math: GTG-Shapley vs exact Shapley, and the Merkle log at 1M leaves.

Run from the repository root::

    .venv/bin/python benchmarks/accounting_math.py

Prints two tables:

* Shapley: for n = 10 synthetic sites drawn from a data-quality model (several draws), the
  distinct coalitions GTG-Shapley evaluates against the 2^10 = 1,024 of exact Shapley and the
  Pearson correlation of GTG values with exact values (targets: ratio <= 0.25 at r >= 0.95),
  then the wall time of GTG-Shapley at n = 50.
* Merkle: time to build a 1,000,000-leaf :class:`accounting.merkle.MerkleTree` from leaf
  hashes, and the mean time to generate + verify an inclusion proof (target < 5 ms) and a
  consistency proof at that size, each with its ratio to a plain ``hashlib`` baseline measured
  in the same process (the SHA-256 work the operation cannot avoid).

The data-quality model: site ``i`` holds ``n_i`` examples (200-3,000) with label-noise rate
``rho_i`` (0-35 %) and covers 2-5 of 5 classes. A coalition's clean information is
``E = sum n_i (1 - 2 rho_i)^2`` and its accuracy
``0.2 + 0.72 * (classes covered / 5) * (1 - exp(-E / scale))`` (a saturating learning curve,
``scale`` = 1000 for slow and 400 for fast saturation; fast saturation is where GTG's
within-round truncation fires); ``v(∅) = 0.2`` is chance level. Everything is seeded, so runs
are deterministic up to timing.
"""

from __future__ import annotations

import hashlib
import math
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from accounting.contribution import exact_shapley, gtg_shapley, leave_one_out  # noqa: E402
from accounting.merkle import (  # noqa: E402
    MerkleTree,
    leaf_hash,
    node_hash,
    verify_consistency,
    verify_inclusion,
)

CLASSES = 5
LEARNING_SCALES = (1000.0, 400.0)  # slow and fast saturation of the learning curve
MERKLE_LEAVES = 1_000_000
PROOF_SAMPLES = 2000


def site_model(n: int, seed: int, scale: float) -> Callable[[frozenset[int]], float]:
    """Deterministic utility of ``n`` synthetic sites (see the module docstring)."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(200, 3000, n)
    noise = rng.uniform(0.0, 0.35, n)
    covers = [
        frozenset(rng.choice(CLASSES, size=int(rng.integers(2, CLASSES + 1)), replace=False))
        for _ in range(n)
    ]
    information = sizes * (1 - 2 * noise) ** 2

    def utility(coalition: frozenset[int]) -> float:
        if not coalition:
            return 0.2
        clean = float(sum(information[i] for i in coalition))
        covered = len(frozenset().union(*(covers[i] for i in coalition))) / CLASSES
        return 0.2 + 0.72 * covered * (1 - math.exp(-clean / scale))

    return utility


def timed(function: Callable[[], object]) -> tuple[object, float]:
    start = time.perf_counter()
    result = function()
    return result, time.perf_counter() - start


def shapley_section() -> None:
    print("Shapley value: n = 10 synthetic sites, GTG-Shapley (eps=0.001, tol=0.05) vs exact")
    header = (
        f"{'scale':>5}  {'draw':>4}  {'exact evals':>11}  {'GTG evals':>9}  {'ratio':>6}  "
        f"{'perms':>5}  {'Pearson r':>9}  {'LOO r':>6}  {'exact s':>8}  {'GTG s':>7}"
    )
    print(header)
    print("-" * len(header))
    for scale in LEARNING_SCALES:
        ratios, correlations = [], []
        for draw in range(5):
            utility = site_model(10, seed=draw, scale=scale)
            exact, exact_seconds = timed(lambda u=utility: exact_shapley(10, u))
            estimate, gtg_seconds = timed(lambda u=utility: gtg_shapley(10, u))
            loo = leave_one_out(10, utility)
            ratio = estimate.evaluations / 2**10
            r = float(np.corrcoef(exact, estimate.values)[0, 1])
            r_loo = float(np.corrcoef(exact, loo)[0, 1])
            ratios.append(ratio)
            correlations.append(r)
            print(
                f"{scale:>5.0f}  {draw:>4}  {2**10:>11}  {estimate.evaluations:>9}  {ratio:>6.3f}  "
                f"{estimate.permutations:>5}  {r:>9.4f}  {r_loo:>6.3f}  {exact_seconds:>8.4f}  "
                f"{gtg_seconds:>7.4f}"
            )
        mean_ratio, min_r = float(np.mean(ratios)), float(min(correlations))
        ratio_ok = "met" if mean_ratio <= 0.25 else "MISSED"
        r_ok = "met" if min_r >= 0.95 else "MISSED"
        print(
            f"scale {scale:.0f}: mean ratio {mean_ratio:.3f} (target <= 0.25: {ratio_ok}), "
            f"min r {min_r:.4f} (target >= 0.95: {r_ok})"
        )
    utility = site_model(50, seed=0, scale=LEARNING_SCALES[0])
    estimate, seconds = timed(lambda: gtg_shapley(50, utility))
    print(
        f"GTG-Shapley n = 50: {seconds:.3f} s, {estimate.evaluations} evaluations, "
        f"{estimate.permutations} permutations (utility here costs microseconds; in a job each "
        "evaluation is a federated evaluation of a rebuilt model)"
    )


def merkle_section() -> None:
    print()
    print(f"Merkle log (RFC 9162), {MERKLE_LEAVES:,} leaves")
    entries = [i.to_bytes(8, "big") for i in range(MERKLE_LEAVES)]

    # Baselines: the SHA-256 calls each operation needs, made in a tight hashlib loop.
    _, leaf_baseline = timed(lambda: [hashlib.sha256(b"\x00" + e).digest() for e in entries])
    hashes, leaf_seconds = timed(lambda: [leaf_hash(e) for e in entries])
    pair = hashes[0] + hashes[1]
    _, node_baseline = timed(
        lambda: [hashlib.sha256(b"\x01" + pair).digest() for _ in range(MERKLE_LEAVES - 1)]
    )
    tree, build_seconds = timed(lambda: MerkleTree(hashes))
    assert isinstance(tree, MerkleTree)
    size = tree.size
    head = tree.root()

    rng = random.Random(0)
    indices = [rng.randrange(size) for _ in range(PROOF_SAMPLES)]
    old_size = size - 12_345  # an older checkpoint: its right edge is an incomplete subtree

    def inclusion_round() -> None:
        for index in indices:
            proof = tree.inclusion_proof(index)
            assert verify_inclusion(index, size, hashes[index], proof, head)

    old_root = tree.root(old_size)

    def consistency_round() -> None:
        for old in indices:
            proof = tree.consistency_proof(old + 1)
            assert verify_consistency(old + 1, size, tree.root(old + 1), head, proof)

    def old_inclusion_round() -> None:
        for index in indices:
            proof = tree.inclusion_proof(index % old_size, old_size)
            assert verify_inclusion(
                index % old_size, old_size, hashes[index % old_size], proof, old_root
            )

    depth = math.ceil(math.log2(size))

    def hash_baseline() -> None:
        left = hashes[0]
        for _ in range(PROOF_SAMPLES):
            value = left
            for _ in range(depth):
                value = node_hash(value, left)

    _, inclusion_seconds = timed(inclusion_round)
    _, old_inclusion_seconds = timed(old_inclusion_round)
    _, consistency_seconds = timed(consistency_round)
    _, path_baseline = timed(hash_baseline)

    per = 1000 / PROOF_SAMPLES
    rows = [
        ("leaf hashing (leaf_hash x 1M)", leaf_seconds, leaf_baseline, "s"),
        ("build tree from 1M leaf hashes", build_seconds, node_baseline, "s"),
        (
            "inclusion proof gen + verify (mean)",
            inclusion_seconds * per,
            path_baseline * per,
            "ms",
        ),
        (
            "  ... at an older size (mean)",
            old_inclusion_seconds * per,
            path_baseline * per,
            "ms",
        ),
        (
            "consistency proof gen + verify (mean)",
            consistency_seconds * per,
            path_baseline * per,
            "ms",
        ),
    ]
    header = f"{'operation':<40}  {'time':>10}  {'hashlib baseline':>16}  {'ratio':>6}"
    print(header)
    print("-" * len(header))
    for name, value, baseline, unit in rows:
        print(
            f"{name:<40}  {value:>8.3f} {unit:<2}  {baseline:>13.3f} {unit:<2}  "
            f"{value / baseline:>6.2f}"
        )
    mean_ms = inclusion_seconds * per
    print(
        "baselines: leaf hashing = sha256(0x00||entry) x 1M; build = sha256(0x01||l||r) x (1M-1);"
        f" proof = {depth} node hashes (one root recomputation)"
    )
    print(
        f"inclusion proof at {size:,} leaves: {mean_ms:.3f} ms "
        f"(target < 5 ms: {'met' if mean_ms < 5 else 'MISSED'})"
    )


def main() -> None:
    shapley_section()
    merkle_section()


if __name__ == "__main__":
    main()
