"""Model × strategy quality in one process: the Flower App's own training code and Flower's own
aggregators, without a deployment (a quick companion of ``benchmarks/quality.py``).

Run from the repository root (a few minutes)::

    .venv/bin/python benchmarks/quality_inprocess.py [--datasets breast_cancer,wine] [--rounds 10]

For each scikit-learn dataset and split (IID: a seeded shuffle dealt to three sites; skew: rows
sorted by label, three contiguous parts), each model (``frp_flwr.models``: linear, mlp) and each
strategy (``frp_flwr.strategies``, Flower's defaults), every site trains locally with
``model.train`` (FedProx's μ and FedOpt's η_l as the ClientApp applies them) and the global model
moves to the Flower strategy's ``aggregate_train`` — the same calls the ServerApp makes. Each site
holds out 20 %; standardisation uses the pooled training rows. The centralised model of the same
family (``LogisticRegression`` or ``MLPClassifier`` with the same hidden layers) is fitted on the
pooled training rows in the same process. Printed: pooled held-out accuracy of both and the ratio,
then per dataset and split the best federated configuration. Nothing is timed.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "federation" / "flwr_app"), str(ROOT)]

from flwr.app import ArrayRecord  # noqa: E402

from frp_flwr import models, strategies  # noqa: E402

SITES = 3


def site_rows(y: np.ndarray, split: str, seed: int = 0) -> list[np.ndarray]:
    """Row indices per site (module doc)."""
    if split == "iid":
        order = np.random.default_rng(seed).permutation(len(y))
        return [order[i::SITES] for i in range(SITES)]
    order = np.argsort(y, kind="stable")
    return [np.sort(p) for p in np.array_split(order, SITES)]


def run(X, y, split: str, kind: str, name: str, *, rounds: int, epochs: int, lr: float):
    """``(federated accuracy, centralised accuracy)`` of one configuration."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import train_test_split
    from sklearn.neural_network import MLPClassifier

    parts = [train_test_split(idx, test_size=0.2, random_state=42) for idx in site_rows(y, split)]
    train = np.concatenate([p[0] for p in parts])
    test = np.concatenate([p[1] for p in parts])
    std = X[train].std(axis=0)
    Z = (X - X[train].mean(axis=0)) / np.where(std == 0, 1.0, std)
    model_spec = models.read_model_spec({"kind": kind})
    strategy_spec = strategies.read_strategy_spec({"name": name})
    model = models.model_for(model_spec)
    strategy = strategies.build_strategy(strategy_spec)
    site_lr, mu = strategies.client_settings(strategy_spec, lr)
    weights = model.init_params(X.shape[1], len(np.unique(y)), seed=42)
    for t in range(1, rounds + 1):
        replies = []
        for rows, _ in parts:
            new, _ = model.train(
                weights, Z[rows], y[rows], epochs=epochs, learning_rate=site_lr,
                batch_size=32, seed=t, task="classification", mu=mu,
            )  # fmt: skip
            replies.append(strategies.train_reply(new, len(rows)))
        arrays, _ = strategies.aggregate_train(strategy, t, ArrayRecord(weights), replies)
        weights = [np.asarray(a, dtype=np.float64) for a in arrays.to_numpy_ndarrays()]
    federated = models.loss_and_accuracy(model, weights, Z[test], y[test])[1]
    reference = (
        MLPClassifier(hidden_layer_sizes=tuple(model_spec["hidden"]), max_iter=2000, random_state=0)
        if kind == "mlp"
        else LogisticRegression(max_iter=5000)
    ).fit(Z[train], y[train])
    return federated, float(reference.score(Z[test], y[test]))


def main(argv=None) -> int:
    from sklearn import datasets

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", default="breast_cancer,wine")
    parser.add_argument("--splits", default="iid,skew")
    parser.add_argument("--models", default="linear,mlp")
    parser.add_argument("--strategies", default=",".join(strategies.STRATEGIES))
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--local-epochs", type=int, default=5)
    parser.add_argument("--learning-rate", type=float, default=0.05)
    args = parser.parse_args(argv)
    logging.getLogger("flwr").setLevel(logging.WARNING)
    logging.disable(logging.INFO)  # Flower logs every aggregation
    print(
        f"{'dataset':<14}{'split':<6}{'model':<8}{'strategy':<15}{'fed':>8}{'central':>9}{'ratio':>7}"
    )
    for name in args.datasets.split(","):
        bunch = getattr(datasets, f"load_{name}")()
        for split in args.splits.split(","):
            rows = []
            for kind in args.models.split(","):
                for strat in args.strategies.split(","):
                    fed, central = run(
                        bunch.data, bunch.target, split, kind, strat, rounds=args.rounds,
                        epochs=args.local_epochs, lr=args.learning_rate,
                    )  # fmt: skip
                    rows.append((fed, central, kind, strat))
                    print(
                        f"{name:<14}{split:<6}{kind:<8}{strat:<15}{fed:>8.4f}{central:>9.4f}"
                        f"{fed / central:>7.3f}",
                        flush=True,
                    )
            best = max(rows)
            top = max(r[1] for r in rows)
            print(
                f"  best {name} {split}: {best[2]}+{best[3]} {best[0]:.4f} / best centralised "
                f"{top:.4f} = {best[0] / top:.3f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
