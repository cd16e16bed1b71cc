"""What a site's trees tell the other sites about its row count (issue 9, finding 5; ADR 0023).

A site's train reply is XGBoost's JSON model of its new trees; the ServerApp bags every reply into
the global booster that every site receives the next round. Unstripped, those trees give a site's
exact training rows back to everyone: ``sum_hessian`` at the root is the row count under
``reg:squarederror`` and ``n·b(1 − b)`` for the first ``binary:logistic`` tree (``b`` the
base score every site is sent), and XGBoost's split gain (Chen & Guestrin 2016, eq. 7, without
the ½ and γ as XGBoost stores it),

    loss_change = w_L²(H_L + λ) + w_R²(H_R + λ) − w²(H + λ),   w = −G / (H + λ),

is linear in the node's hessian sum ``H`` once the children's share of it is known, so the
gains and the internal nodes' weights give ``H`` back even without ``sum_hessian``.

Checked here on the bytes exactly as a site sends them (``trees.train_local``, what the
ClientApp's train hook puts in its reply): every gain is 0, every internal weight 0, every cover
the number of leaves under the node (the tree's shape, no data); the attacks above recover the
count from the unstripped trees and fail on the sent ones; and the sent trees predict exactly
what the unstripped ones do (margins, probabilities, SHAP values' sums). The ServerApp refuses a
reply that still carries the statistics.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import xgboost as xgb
from sklearn.datasets import load_breast_cancer, load_diabetes, load_iris

from frp_flwr import trees
from frp_flwr.contract import ContractError, read_model_choice, released

MODEL = {"max_depth": 3, "eta": 0.3, "local_rounds": 3, "reg_lambda": 1.0}


def _params(task: str, classes: int, base_score: float = 0.5) -> dict:
    spec = read_model_choice({"kind": "xgboost", **MODEL}, "model")
    return trees.xgb_params(spec, task=task, num_classes=classes, base_score=base_score, seed=0)


def _regression():
    X, y = load_diabetes(return_X_y=True)  # 442 rows
    return X, (y - y.mean()) / y.std(), _params("regression", 0)


def _binary():
    X, y = load_breast_cancer(return_X_y=True)  # 569 rows
    return X, y, _params("classification", 2, base_score=float(np.mean(y == 1)))


def _multiclass():
    X, y = load_iris(return_X_y=True)  # 150 rows, multi_output_tree
    return X, y, _params("classification", 3)


def _sent_and_unstripped(X, y, params) -> tuple[bytes, xgb.Booster]:
    """The reply's bytes as a site sends them, and the same trees as XGBoost grew them (the
    local boosting of ``trees.train_local``, repeated: XGBoost is deterministic here)."""
    packed, _, _ = trees.train_local(b"", X, y, params=params, local_rounds=MODEL["local_rounds"])
    sent = trees.booster_bytes(trees.to_record(packed))  # what crosses the network
    data = xgb.DMatrix(X, label=y)
    booster = trees.load_booster(b"", params, [data])
    for i in range(MODEL["local_rounds"]):
        booster.update(data, i)
    return sent, booster


def _trees_of(raw: bytes) -> list[dict]:
    return json.loads(raw)["learner"]["gradient_booster"]["model"]["trees"]


def _unstripped_trees(booster: xgb.Booster) -> list[dict]:
    return _trees_of(bytes(booster.save_raw("json")))


def _leaves_under(tree: dict, node: int = 0) -> int:
    left, right = tree["left_children"][node], tree["right_children"][node]
    if left == -1:
        return 1
    return _leaves_under(tree, left) + _leaves_under(tree, right)


def _solve_hessian(tree: dict, node: int, share_left: float, lam: float) -> float:
    """An attacker's ``H`` of ``node`` from its gain and the three weights (module doc), given
    the left child's share of ``H`` (read off ``sum_hessian``, or known otherwise)."""
    left, right = tree["left_children"][node], tree["right_children"][node]
    w, wl, wr = (tree["base_weights"][i] for i in (node, left, right))
    gain = tree["loss_changes"][node]
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(
            np.float64(gain - lam * (wl**2 + wr**2 - w**2))
            / np.float64(wl**2 * share_left + wr**2 * (1 - share_left) - w**2)
        )


@pytest.mark.parametrize("data", [_regression, _binary, _multiclass])
def test_sent_trees_carry_no_gain_no_internal_weight_and_covers_of_the_shape_only(data):
    X, y, params = data()
    sent, _ = _sent_and_unstripped(X, y, params)

    for tree in _trees_of(sent):
        width = max(1, int(tree["tree_param"]["size_leaf_vector"]))
        for node, left in enumerate(tree["left_children"]):
            assert tree["loss_changes"][node] == 0.0
            assert tree["sum_hessian"][node] == _leaves_under(tree, node)
            weights = tree["base_weights"][node * width : (node + 1) * width]
            if left != -1:  # internal: prediction never reads its weight
                assert weights == [0.0] * width
        assert tree["sum_hessian"][0] != len(y)


def test_a_regression_sites_rows_are_not_its_root_cover_nor_solvable_from_its_gains():
    X, y, params = _regression()
    sent, booster = _sent_and_unstripped(X, y, params)
    lam = params["lambda"]

    for before, after in zip(_unstripped_trees(booster), _trees_of(sent), strict=True):
        left = before["left_children"][0]
        assert before["left_children"][left] != -1  # the root's children are splits
        share = before["sum_hessian"][left] / before["sum_hessian"][0]  # the true share
        # the attack works on the trees as XGBoost grew them ...
        assert before["sum_hessian"][0] == len(y)
        assert round(_solve_hessian(before, 0, share, lam)) == len(y)
        # ... and not on the sent ones, even handed the true share of the left child
        assert after["sum_hessian"][0] != len(y)
        solved = _solve_hessian(after, 0, share, lam)
        assert not np.isfinite(solved) or abs(solved - len(y)) > 0.5


def test_a_binary_sites_rows_are_not_its_first_trees_cover_over_the_base_scores_variance():
    X, y, params = _binary()
    sent, booster = _sent_and_unstripped(X, y, params)
    b = params["base_score"]

    first_before, first_after = _unstripped_trees(booster)[0], _trees_of(sent)[0]

    assert round(first_before["sum_hessian"][0] / (b * (1 - b))) == len(y)  # the attack works
    assert round(first_after["sum_hessian"][0] / (b * (1 - b))) != len(y)
    share = (
        first_before["sum_hessian"][first_before["left_children"][0]]
        / (first_before["sum_hessian"][0])
    )
    solved = _solve_hessian(first_after, 0, share, params["lambda"])
    assert not np.isfinite(solved) or abs(solved - len(y) * b * (1 - b)) > 0.5


@pytest.mark.parametrize("data", [_regression, _binary, _multiclass])
def test_stripped_trees_predict_exactly_what_the_grown_trees_predict(data):
    """Stripping the statistics (``pack_trees``) changes no prediction; the leaf values a site
    sends are the released ones (the tests below), which do."""
    X, y, params = data()
    _, booster = _sent_and_unstripped(X, y, params)
    stripped = trees.load_booster(trees.pack_trees(booster, 0), params)
    d = xgb.DMatrix(X)

    np.testing.assert_array_equal(stripped.predict(d), booster.predict(d))
    np.testing.assert_array_equal(
        stripped.predict(d, output_margin=True), booster.predict(d, output_margin=True)
    )
    if data is _multiclass:
        return  # XGBoost computes no SHAP values for vector-leaf (multi_output_tree) trees
    # SHAP values stay defined (covers of the shape: no 0/0) and add up to the margin
    contribs = stripped.predict(d, pred_contribs=True)
    assert np.isfinite(contribs).all()
    np.testing.assert_allclose(
        contribs.sum(axis=-1), stripped.predict(d, output_margin=True), atol=1e-4
    )


def test_the_serverapp_refuses_a_reply_that_still_carries_training_statistics():
    X, y, params = _regression()
    sent, booster = _sent_and_unstripped(X, y, params)
    doc = json.loads(sent)
    doc["learner"]["gradient_booster"]["model"]["trees"] = _unstripped_trees(booster)
    hostile = json.dumps(doc).encode()

    assert trees.check_reply(trees.to_record(sent)) == MODEL["local_rounds"]
    with pytest.raises(ContractError, match="training statistics"):
        trees.check_reply(trees.to_record(hostile))


@pytest.mark.parametrize("key", ["loss_changes", "sum_hessian", "base_weights"])
def test_one_changed_statistic_is_enough_for_a_refusal(key):
    X, y, params = _regression()
    sent, _ = _sent_and_unstripped(X, y, params)
    doc = json.loads(sent)
    tree = doc["learner"]["gradient_booster"]["model"]["trees"][1]
    tree[key][0] = 442.0

    with pytest.raises(ContractError, match="training statistics"):
        trees.check_reply(trees.to_record(json.dumps(doc).encode()))


def test_a_reply_with_a_cycle_in_its_tree_is_refused_not_looped_over():
    X, y, params = _regression()
    sent, _ = _sent_and_unstripped(X, y, params)
    doc = json.loads(sent)
    tree = doc["learner"]["gradient_booster"]["model"]["trees"][0]
    tree["left_children"][1] = 0  # node 1 points back at the root

    with pytest.raises(ContractError, match="not an XGBoost tree"):
        trees.check_reply(trees.to_record(json.dumps(doc).encode()))


def test_the_binary_base_score_is_a_share_of_released_counts():
    # two sites' training labels; the exact pooled share 68/266 = 34/133 at full precision is
    # a fraction a continued-fraction expansion finds, and with one's own 220 rows, the other's
    sites = [{"no": 157, "yes": 63}, {"no": 41, "yes": 5}]

    released = trees.released_labels(sites)
    score = trees.base_score(released, ["no", "yes"])

    assert released == {"no": 155 + 40, "yes": 65 + 4}  # "≤7" stands for 4 (ADR 0036)
    assert score == 69 / 264
    assert trees.released_labels([]) == {}


def test_the_flower_apps_released_count_is_the_profiles():
    from frp_flwr.contract import released_floor
    from sandbox.profile import released_count
    from sandbox.profile import released_floor as profile_floor

    assert [released(n) for n in range(0, 300)] == [released_count(n) for n in range(0, 300)]
    assert [released_floor(n) for n in range(300)] == [profile_floor(n) for n in range(300)]


# --- leaf values (the hostile re-test of issue 9; ADR 0036, amendment) -------------------------


def _exact_leaf(g, h, *, eta, reg_lambda, min_child_weight, regression):
    """XGBoost's own leaf (``CalcWeight``): ``−η G / (H + λ)``, 0 when ``H < min_child_weight``."""
    big_g, big_h = g.sum(axis=0), h.sum(axis=0)
    value = np.where(big_h >= min_child_weight, -eta * big_g / (big_h + reg_lambda), 0.0)
    return value if g.ndim == 2 else float(value)


def _leaf_values(tree: dict) -> dict[int, list[float]]:
    width = max(1, int(tree["tree_param"]["size_leaf_vector"]))
    out = {}
    for node, left in enumerate(tree["left_children"]):
        if left == -1:
            if width == 1:
                out[node] = [tree["split_conditions"][node]]
            else:
                j = tree["right_children"][node]
                out[node] = tree["leaf_weights"][j * width : (j + 1) * width]
    return out


@pytest.mark.parametrize("data", [_regression, _binary, _multiclass])
def test_the_leaf_refit_with_exact_sums_is_xgboosts_own_leaves(data, monkeypatch):
    """The refit's gradients, hessians and margins are XGBoost's: with the exact sums in place of
    the released ones it gives back every leaf XGBoost grew (float32), for all three objectives
    (the binary and softmax hessians, the min_child_weight rule, trees in boosting order)."""
    X, y, params = data()
    _, booster = _sent_and_unstripped(X, y, params)
    monkeypatch.setattr(trees, "released_leaf", _exact_leaf)
    refit, margin = trees.release_leaves(booster, 0, xgb.DMatrix(X, label=y), y, params)

    grown = _unstripped_trees(booster)
    for before, after in zip(grown, _trees_of(refit), strict=True):
        want, got = _leaf_values(before), _leaf_values(after)
        assert want.keys() == got.keys()
        for node in want:
            np.testing.assert_allclose(got[node], want[node], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        margin, booster.predict(xgb.DMatrix(X), output_margin=True), atol=1e-5
    )


def _first_tree_leaf_rows(X, y, params) -> tuple[list[dict], dict[int, tuple[int, int]]]:
    """The sent trees and, per leaf of the first one, its (rows, positives) on ``X``."""
    sent, _ = _sent_and_unstripped(X, y, params)
    one = trees.load_booster(sent, params)
    leaves = np.asarray(one.predict(xgb.DMatrix(X), pred_leaf=True), dtype=int).reshape(len(y), -1)
    counts = {}
    for node in np.unique(leaves[:, 0]):
        rows = leaves[:, 0] == node
        counts[int(node)] = (int(rows.sum()), int(y[rows].sum()))
    return _trees_of(sent), counts


def _first_leaf(n: int, n1: int, b: float, params: dict, leaf=trees.released_leaf) -> float:
    """A first binary tree's leaf over ``n`` rows with ``n1`` positives: every row predicts
    ``b``, so g = b − y and h = b(1 − b)."""
    g = np.array([b - 1.0] * n1 + [b] * (n - n1))
    h = np.full(n, b * (1 - b))
    return leaf(
        g,
        h,
        eta=params["eta"],
        reg_lambda=params["lambda"],
        min_child_weight=params["min_child_weight"],
        regression=False,
    )


def test_a_binary_sites_first_tree_leaves_give_back_only_released_counts():
    """The attack: a first tree's leaf is ``−η (n·b − n₁)/(n·b(1 − b) + λ)`` with ``b``, ``η``,
    ``λ`` known, so searching every (n, n₁) finds the leaf's exact rows and positives. On XGBoost's
    own leaves the search finds them; on the sent leaves every count the released one allows
    (all n' with the same released figure) reaches the sent value with some n₁', so the value
    tells no more than the released count does."""
    X, y, params = _binary()
    b = params["base_score"]
    sent, counts = _first_tree_leaf_rows(X, y, params)
    values = _leaf_values(sent[0])
    checked = 0
    for node, (n, n1) in counts.items():
        exact = _first_leaf(n, n1, b, params, leaf=_exact_leaf)
        solutions = {
            (m, k)
            for m in range(1, len(y) + 1)
            for k in range(m + 1)
            if abs(-params["eta"] * (m * b - k) / (m * b * (1 - b) + params["lambda"]) - exact)
            <= 1e-12 * max(1.0, abs(exact))
        }
        assert solutions == {(n, n1)}  # the attack works on the exact leaf
        value = values[node][0]
        assert value == pytest.approx(_first_leaf(n, n1, b, params), abs=1e-12)
        if n <= 7:
            assert value == 0.0
            continue
        checked += 1
        assert abs(value - exact) > 1e-9 or n % 5 == 0  # not XGBoost's float
        for m in [m for m in range(max(1, n - 4), n + 5) if released(m) == released(n)]:
            assert any(
                _first_leaf(m, k, b, params) == pytest.approx(value, abs=1e-12)
                for k in range(m + 1)
            ), (n, n1, m)
    assert checked >= 2


def test_released_leaves_keep_the_model_close_to_xgboosts():
    """What the release costs, on the rows the trees were grown on: the training loss of the
    released leaves within 10 % of XGBoost's own for the two classification objectives."""
    for data in (_binary, _multiclass):
        X, y, params = data()
        packed, loss, _ = trees.train_local(b"", X, y, params=params, local_rounds=3)
        _, booster = _sent_and_unstripped(X, y, params)
        own = trees._scores(booster, X, y, params)[0]
        assert loss == pytest.approx(
            trees.loss_and_accuracy(packed, X, y, params)[0], rel=1e-5
        )  # the reported loss is the sent trees'
        assert own <= loss <= own * 1.10, (data.__name__, own, loss)
