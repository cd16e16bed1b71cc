"""The contribution plan: which coalitions of a job's sites are scored, and how they are named.

One place for what the ServerApp and the portal must agree on (ADR 0010): the ServerApp scores the
coalitions of :func:`contribution_plan` and posts their utilities under :func:`coalition_key`; the
portal's Shapley math (``accounting.contribution``) asks only for those coalitions, walking the same
:func:`guided_permutations`. Pure numpy, no Django: the Flower App ships it and the portal imports it.

Players are the sites of one job, numbered ``0 .. n-1``. Source of the sampling: Z. Liu et al.,
"GTG-Shapley", ACM TIST 13(4), article 60, 2022, Algorithm 1 (guided sampling).
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice

import numpy as np

#: Most sites for which every coalition (2^n) is evaluated and the whole-run value is exact
#: Shapley; above it, GTG-Shapley on the coalitions of its guided permutations.
EXACT_MAX_SITES = 8

#: Ceiling on whole-run coalitions when sampling (GTG-Shapley).
MAX_SAMPLED_COALITIONS = 2048

#: GTG-Shapley samples at least ``max(GTG_MIN_PERMUTATIONS, n)`` permutations (the authors'
#: reference implementation).
GTG_MIN_PERMUTATIONS = 30


def coalition_key(coalition: frozenset[int]) -> str:
    """A coalition as text: member indices, ascending, comma-separated (``""`` is the empty one)."""
    return ",".join(str(i) for i in sorted(coalition))


def iter_guided_permutations(n: int, seed: int) -> Iterator[list[int]]:
    """GTG-Shapley's guided permutations of ``n >= 1`` players, without end, in sampling order.

    Permutation ``k`` puts player ``k mod n`` first (every player leads equally often) and the
    others in the order of ``numpy.random.default_rng(seed).permutation``, one generator call per
    permutation: the same ``seed`` gives the same sequence wherever it is drawn.
    """
    rng = np.random.default_rng(seed)
    k = 0
    while True:
        leader = k % n
        others = np.array([p for p in range(n) if p != leader], dtype=np.int64)
        yield [leader, *rng.permutation(others).tolist()]
        k += 1


def guided_permutations(n: int, count: int, seed: int) -> list[list[int]]:
    """The first ``count`` permutations of :func:`iter_guided_permutations`."""
    return list(islice(iter_guided_permutations(n, seed), count))


def _ordered(coalitions: set[frozenset[int]]) -> list[frozenset[int]]:
    return sorted(coalitions, key=lambda c: (len(c), sorted(c)))


def contribution_plan(n: int, *, seed: int = 0) -> tuple[str, list[frozenset[int]], int]:
    """Which whole-run coalitions to evaluate for ``n`` players.

    Returns ``(method, coalitions, permutations)``: ``"exact"`` with all ``2^n`` coalitions when
    ``n <= EXACT_MAX_SITES``; else ``"gtg"`` with ∅, N, every N∖{i} (leave-one-out) and every
    prefix of the first ``permutations`` guided permutations — at least one whole cycle of ``n``,
    at most ``max(GTG_MIN_PERMUTATIONS, n)`` rounded up to whole cycles, fewer when the prefixes
    would exceed ``MAX_SAMPLED_COALITIONS``. Coalitions are distinct, sorted by size then members.
    """
    everyone = frozenset(range(n))
    if n <= EXACT_MAX_SITES:
        return (
            "exact",
            _ordered({frozenset(i for i in range(n) if m >> i & 1) for m in range(1 << n)}),
            0,
        )
    wanted = -(-max(GTG_MIN_PERMUTATIONS, n) // n) * n
    fixed = {frozenset(), everyone, *(everyone - {i} for i in range(n))}
    per_cycle = n * n  # new prefixes at most, per cycle of n permutations
    cycles = max(1, min(wanted // n, (MAX_SAMPLED_COALITIONS - len(fixed)) // per_cycle))
    permutations = cycles * n
    coalitions = set(fixed)
    for order in guided_permutations(n, permutations, seed):
        for k in range(1, n + 1):
            coalitions.add(frozenset(order[:k]))
    return "gtg", _ordered(coalitions), permutations
