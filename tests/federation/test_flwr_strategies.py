"""The strategies (``frp_flwr.strategies``): Flower's own classes built from a job's spec, their
aggregates against hand computations, and the coalition models that re-apply them (ADR 0022)."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ArrayRecord
from flwr.serverapp import strategy as fl

from frp_flwr import strategies, task
from frp_flwr.task import RoundLog

UPDATES = [
    [np.array([[1.0, 2.0], [0.0, -1.0]]), np.array([0.5])],
    [np.array([[3.0, 0.0], [1.0, -2.0]]), np.array([1.5])],
    [np.array([[2.0, 5.0], [4.0, 0.0]]), np.array([-0.5])],
    [np.array([[2.5, 1.0], [2.0, -1.5]]), np.array([0.0])],
    [np.array([[40.0, -30.0], [9.0, 7.0]]), np.array([20.0])],  # a faulty site
]
EXAMPLES = [10, 30, 20, 40, 25]
CURRENT = [np.array([[1.0, 1.0], [1.0, -1.0]]), np.array([0.25])]


def _replies(updates=UPDATES, examples=EXAMPLES):
    return [
        strategies.train_reply(u, n, node=i + 2)
        for i, (u, n) in enumerate(zip(updates, examples, strict=True))
    ]


def _aggregate(spec, current=CURRENT, updates=UPDATES, examples=EXAMPLES, rnd=1, strategy=None):
    strategy = strategy or strategies.build_strategy(spec)
    arrays, _ = strategies.aggregate_train(
        strategy, rnd, ArrayRecord(current), _replies(updates, examples)
    )
    return [np.asarray(a) for a in arrays.to_numpy_ndarrays()]


def _stack(j):
    return np.stack([u[j] for u in UPDATES])


@pytest.mark.parametrize(
    ("spec", "cls", "attrs"),
    [
        ({"name": "fedavg"}, fl.FedAvg, {}),
        ({"name": "fedprox", "mu": 0.3}, fl.FedProx, {"proximal_mu": 0.3}),
        ({"name": "fedadam", "eta": 0.05, "tau": 0.01}, fl.FedAdam, {"eta": 0.05, "tau": 0.01}),
        ({"name": "fedyogi"}, fl.FedYogi, {"eta": 0.01, "beta_1": 0.9, "beta_2": 0.99}),
        ({"name": "fedadagrad", "eta_l": 0.2}, fl.FedAdagrad, {"eta": 0.1, "eta_l": 0.2}),
        ({"name": "fedmedian"}, fl.FedMedian, {}),
        ({"name": "fedtrimmedavg", "beta": 0.3}, fl.FedTrimmedAvg, {"beta": 0.3}),
        ({"name": "krum", "num_malicious_nodes": 1}, fl.Krum, {"num_malicious_nodes": 1}),
    ],
)
def test_build_strategy_is_flowers_class_with_the_jobs_parameters(spec, cls, attrs):
    strategy = strategies.build_strategy(spec)

    assert type(strategy) is cls
    for key, value in attrs.items():
        assert getattr(strategy, key) == value


def test_build_strategy_of_no_spec_is_fedavg():
    assert type(strategies.build_strategy(None)) is fl.FedAvg


@pytest.mark.parametrize("name", ["fedavg", "fedprox"])
def test_fedavg_and_fedprox_aggregate_the_example_weighted_mean(name):
    share = np.array(EXAMPLES, dtype=float) / sum(EXAMPLES)

    got = _aggregate({"name": name})

    for j in range(2):
        np.testing.assert_allclose(got[j], np.tensordot(share, _stack(j), axes=1))


def test_fedmedian_aggregates_the_coordinate_wise_median():
    got = _aggregate({"name": "fedmedian"})

    np.testing.assert_allclose(got[0], [[2.5, 1.0], [2.0, -1.0]])  # by hand: 3rd of 5 sorted
    np.testing.assert_allclose(got[1], [0.5])


def test_fedtrimmedavg_cuts_each_tail_then_averages():
    # beta 0.2 of 5 updates: the lowest and highest value of each coordinate are cut.
    got = _aggregate({"name": "fedtrimmedavg", "beta": 0.2})

    np.testing.assert_allclose(got[0], [[(2 + 2.5 + 3) / 3, (1 + 2 + 0) / 3], [7 / 3, -2.5 / 3]])
    np.testing.assert_allclose(got[1], [(0.5 + 1.5 + 0) / 3])


def test_krum_picks_the_update_closest_to_its_neighbours():
    flat = np.stack([np.concatenate([a.ravel() for a in u]) for u in UPDATES])
    dist = ((flat[:, None, :] - flat[None, :, :]) ** 2).sum(axis=2)
    closest = len(UPDATES) - 1 - 2  # n − f − 2 neighbours (Blanchard et al. 2017)
    scores = [np.sort(np.delete(dist[i], i))[:closest].sum() for i in range(len(UPDATES))]
    chosen = int(np.argmin(scores))

    got = _aggregate({"name": "krum", "num_malicious_nodes": 1})

    assert chosen != 4
    for j in range(2):
        np.testing.assert_allclose(got[j], UPDATES[chosen][j])


def test_fedadam_takes_the_adam_step_of_reddi_et_al():
    eta, tau, b1, b2 = 0.1, 1e-3, 0.9, 0.99
    share = np.array(EXAMPLES, dtype=float) / sum(EXAMPLES)
    strategy = strategies.build_strategy({"name": "fedadam", "eta": eta, "tau": tau})

    got1 = _aggregate(None, strategy=strategy, rnd=1)
    got2 = _aggregate(None, current=got1, strategy=strategy, rnd=2)

    m = [np.zeros_like(c) for c in CURRENT]
    v = [np.zeros_like(c) for c in CURRENT]
    x = [c.copy() for c in CURRENT]
    for t in (1, 2):  # Flower's bias correction uses t + 1
        mean = [np.tensordot(share, _stack(j), axes=1) for j in range(2)]
        for j in range(2):
            delta = mean[j] - x[j]
            m[j] = b1 * m[j] + (1 - b1) * delta
            v[j] = b2 * v[j] + (1 - b2) * delta**2
        eta_t = eta * np.sqrt(1 - b2 ** (t + 1)) / (1 - b1 ** (t + 1))
        x = [x[j] + eta_t * m[j] / (np.sqrt(v[j]) + tau) for j in range(2)]
        np.testing.assert_allclose((got1, got2)[t - 1][0], x[0], rtol=1e-10)
        np.testing.assert_allclose((got1, got2)[t - 1][1], x[1], rtol=1e-10)


def test_fedopt_needs_the_current_model_which_aggregate_train_sets():
    strategy = strategies.build_strategy({"name": "fedyogi"})

    got = _aggregate(None, strategy=strategy)

    assert all(np.isfinite(g).all() for g in got)
    np.testing.assert_array_equal(strategy.current_arrays["0"], CURRENT[0])


@pytest.mark.parametrize(
    ("raw", "where"),
    [
        ({"name": "fedsgd"}, "strategy.name"),
        ({"name": "fedprox", "mu": -1}, "strategy.mu"),
        ({"name": "fedprox", "mu": "0.1"}, "strategy.mu"),
        ({"name": "fedadam", "eta": 0}, "strategy.eta"),
        ({"name": "fedadam", "beta_1": 1.0}, "strategy.beta_1"),
        ({"name": "fedyogi", "tau": float("inf")}, "strategy.tau"),
        ({"name": "fedtrimmedavg", "beta": 0.5}, "strategy.beta"),
        ({"name": "krum", "num_malicious_nodes": 1.5}, "strategy.num_malicious_nodes"),
        ({"name": "krum", "num_malicious_nodes": True}, "strategy.num_malicious_nodes"),
        ({"name": "fedavg", "mu": 0.1}, "unknown field"),
    ],
)
def test_read_strategy_spec_refuses_bad_values_naming_the_field(raw, where):
    with pytest.raises(strategies.StrategySpecError, match=where):
        strategies.read_strategy_spec(raw)


def test_read_strategy_spec_fills_flowers_defaults():
    assert strategies.read_strategy_spec({"name": "fedyogi"}) == {
        "name": "fedyogi",
        "eta": 0.01,
        "eta_l": 0.0316,
        "tau": 1e-3,
        "beta_1": 0.9,
        "beta_2": 0.99,
    }
    assert strategies.read_strategy_spec({"name": "fedmedian"}) == {"name": "fedmedian"}


def test_krum_needs_more_than_2f_plus_2_sites():
    spec = {"name": "krum", "num_malicious_nodes": 1}

    assert "more than 4 sites" in strategies.krum_problem(spec, 4)
    assert strategies.krum_problem(spec, 5) == ""
    assert strategies.krum_problem({"name": "fedavg"}, 2) == ""


def test_client_settings_give_fedprox_mu_and_fedopt_eta_l():
    assert strategies.client_settings({"name": "fedavg"}, 0.3) == (0.3, 0.0)
    assert strategies.client_settings({"name": "fedprox", "mu": 0.5}, 0.3) == (0.3, 0.5)
    assert strategies.client_settings({"name": "fedadam", "eta_l": 0.05}, 0.3) == (0.05, 0.0)
    assert strategies.client_settings(None, 0.2) == (0.2, 0.0)


def test_describe_strategy_names_the_parameters():
    spec = strategies.read_strategy_spec({"name": "fedtrimmedavg", "beta": 0.1})

    assert strategies.describe_strategy(spec) == "FedTrimmedAvg (β = 0.1 cut per tail)"
    assert strategies.describe_strategy({"name": "fedavg"}) == "FedAvg"


def test_describe_strategy_words_and_symbols_for_fedprox_fedadam_krum():
    fedadam = strategies.read_strategy_spec({"name": "fedadam", "eta": 0.01, "tau": 1e-9})
    krum = strategies.read_strategy_spec({"name": "krum", "num_malicious_nodes": 1})

    assert strategies.describe_strategy({"name": "fedprox", "mu": 0.1}) == "FedProx (μ = 0.1)"
    assert strategies.describe_strategy(fedadam) == (
        "FedAdam (server learning rate 0.01, site learning rate 0.1, τ = 1e-9, β₁ = 0.9, β₂ = 0.99)"
    )
    assert strategies.describe_strategy(krum) == "Krum (f = 1 faulty sites tolerated)"


@pytest.mark.parametrize(
    ("value", "text"),
    [(0.1, "0.1"), (1e-9, "1e-9"), (1e-05, "1e-5"), (2.5e20, "2.5e20"), (3, "3"), (0.0, "0")],
)
def test_number_text_is_the_shortest_form_without_exponent_padding(value, text):
    assert strategies.number_text(value) == text


# ---------------------------------------------------------------------------------------------
# Coalition models re-apply the strategy
# ---------------------------------------------------------------------------------------------


def _logged_run(spec, rounds=3, players=4, seed=0):
    """A run as the ServerApp drives it: each round every player's update is the global model plus
    noise; the global model moves to the strategy's aggregate. Returns (initial, logs, final)."""
    rng = np.random.default_rng(seed)
    strategy = strategies.build_strategy(spec)
    initial = [rng.normal(size=(3, 2)), rng.normal(size=2)]
    current = [a.copy() for a in initial]
    logs = []
    for t in range(1, rounds + 1):
        who = [i for i in range(players) if not (t == 2 and i == 1)]  # player 1 misses round 2
        updates = {i: [c + rng.normal(scale=0.5, size=c.shape) for c in current] for i in who}
        examples = {i: int(rng.integers(5, 50)) for i in who}
        logs.append(RoundLog(start=[c.copy() for c in current], updates=updates, examples=examples))
        current = _aggregate(
            None,
            current=current,
            updates=[updates[i] for i in who],
            examples=[examples[i] for i in who],
            rnd=t,
            strategy=strategy,
        )
    return initial, logs, current


SPECS = [
    {"name": "fedavg"},
    {"name": "fedprox", "mu": 0.1},
    {"name": "fedadam"},
    {"name": "fedyogi"},
    {"name": "fedadagrad"},
    {"name": "fedmedian"},
    {"name": "fedtrimmedavg", "beta": 0.25},
    {"name": "krum", "num_malicious_nodes": 0},
]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s["name"])
def test_full_coalition_rebuilds_the_real_final_model(spec):
    initial, logs, final = _logged_run(spec)

    model, _ = strategies.coalition_models(
        spec, initial, logs, frozenset(range(4)), with_rounds=False
    )

    for got, want in zip(model, final, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s["name"])
def test_empty_coalition_keeps_the_initial_model(spec):
    initial, logs, _ = _logged_run(spec)

    model, _ = strategies.coalition_models(spec, initial, logs, frozenset(), with_rounds=False)

    for got, want in zip(model, initial, strict=True):
        np.testing.assert_array_equal(got, want)


def test_median_coalition_of_two_is_the_mean_of_their_steps():
    # By hand: the median of two values is their mean, so each round moves the coalition's model
    # by the mean of its members' steps (unweighted: FedMedian ignores example counts).
    spec = {"name": "fedmedian"}
    initial, logs, _ = _logged_run(spec)
    want = [a.copy() for a in initial]
    for log in logs:
        members = [i for i in (0, 1) if i in log.updates]
        for j in range(2):
            want[j] += np.mean([log.updates[i][j] - log.start[j] for i in members], axis=0)

    model, per_round = strategies.coalition_models(
        spec, initial, logs, frozenset({0, 1}), with_rounds=True
    )

    for got, w in zip(model, want, strict=True):
        np.testing.assert_allclose(got, w, rtol=1e-12)
    assert len(per_round) == len(logs)
    step = np.mean([logs[0].updates[i][0] - logs[0].start[0] for i in (0, 1)], axis=0)
    np.testing.assert_allclose(per_round[0][0], logs[0].start[0] + step, rtol=1e-12)


def test_fedavg_coalitions_are_todays_reconstruction():
    spec = {"name": "fedavg"}
    initial, logs, _ = _logged_run(spec)
    coalition = frozenset({0, 2})

    ours = strategies.coalition_models(spec, initial, logs, coalition, with_rounds=True)
    today = task.coalition_models(initial, logs, coalition, with_rounds=True)

    for a, b in zip(ours[0], today[0], strict=True):
        np.testing.assert_array_equal(a, b)
    assert len(ours[1]) == len(today[1]) == len(logs)


def test_fedopt_coalitions_have_no_per_round_models():
    initial, logs, _ = _logged_run({"name": "fedadam"})

    _, per_round = strategies.coalition_models(
        {"name": "fedadam"}, initial, logs, frozenset({0, 1}), with_rounds=True
    )

    assert per_round == []
    assert "not computed" in strategies.reconstruction_note({"name": "fedadam"})
