"""Tests of the portal ↔ Flower App contract (``frp_flwr/contract.py``).

The run-config keys and defaults are tied to the app's own ``[tool.flwr.app.config]`` (read with
``tomllib``, as Flower reads it); every event survives an encode/parse round trip; and the bodies
a hostile or buggy sender could post are refused with a message naming the field.
"""

from __future__ import annotations

import json
import math
import tomllib
from pathlib import Path

import pytest

from frp_flwr import contract

APP_PYPROJECT = Path(__file__).parents[2] / "federation" / "flwr_app" / "pyproject.toml"


def _app_config() -> dict:
    return tomllib.loads(APP_PYPROJECT.read_text())["tool"]["flwr"]["app"]["config"]


# --- run config ↔ [tool.flwr.app.config] ----------------------------------------------------------


def test_run_config_keys_are_exactly_the_apps_config_keys():
    assert contract.RunConfig.keys() == list(_app_config())


def test_run_config_defaults_and_types_are_the_apps():
    defaults = contract.RunConfig()  # the dataclass defaults
    app = _app_config()
    for key, value in app.items():
        ours = getattr(defaults, key.replace("-", "_"))
        assert ours == value and type(ours) is type(value), key


def test_run_config_from_the_apps_defaults_parses():
    config = contract.RunConfig.from_flower(_app_config())

    assert config == contract.RunConfig()


def test_run_config_round_trips_through_flower_form():
    spec = contract.JobSpec(
        sites={"hospital-a": contract.SitePointer("k/1", "bc", 1)}, target="y", min_sites=1
    )
    config = contract.RunConfig(job_id=3, job_spec=spec.to_text(), callback_url="https://p/cb/3/")

    again = contract.RunConfig.from_flower(config.to_flower())

    assert again == config and again.spec == spec


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"num-rounds": 0}, "num-rounds: 0 is outside 1..100"),
        ({"num-rounds": 10**30}, "outside"),
        ({"learning-rate": math.nan}, "not a finite number"),
        ({"test-fraction": 1.0}, "outside"),
        ({"contribution": "yes"}, "expected true or false"),
        ({"callback-token": "ab" * 32}, "unknown key(s) callback-token"),
        ({"callback-url": "ftp://portal/cb/"}, "http(s)"),
        ({"job-id": True}, "expected an integer"),
    ],
)
def test_run_config_refuses_bad_values(override, message):
    with pytest.raises(contract.ContractError) as err:
        contract.RunConfig.from_flower({**_app_config(), **override})
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("[]", "expected an object"),
        ('{"sites": {}, "target": "y"}', "no site"),
        (
            '{"sites": {"a b": {"store_key": "k", "dataset": "d", "version": 1}}, "target": "y"}',
            "a b",
        ),
        (
            '{"sites": {"a": {"store_key": "k", "dataset": "d", "version": 0}}, "target": "y"}',
            "version",
        ),
        ('{"target": "y"}', "missing field(s) sites"),
        ("{", "not JSON"),
    ],
)
def test_job_spec_refuses_bad_specs(spec, message):
    with pytest.raises(contract.ContractError, match="job-spec") as err:
        contract.JobSpec.from_json(spec)
    assert message in str(err.value)


# --- callback events --------------------------------------------------------------------------

SITE = {
    "node_id": "18446744073709551615",
    "ok": True,
    "train_examples": 40,
    "eval_examples": 10,
    "train_loss": 0.5,
    "eval_loss": 0.4,
    "eval_accuracy": 0.9,
    "cpu_seconds": 0.1,
    "wall_seconds": 0.2,
    "bytes_received": 3422,
    "bytes_sent": 1711,
}
EVENTS = [
    contract.Started(nodes={"a": "12", "b": "13"}, missing=["c"], errors={"d": "no data"}),
    contract.Round(
        round=2,
        sites={"a": contract.SiteRound.from_json(SITE)},
        train_loss=0.5,
        eval_accuracy=0.875,
        train_examples=80,
        wall_seconds=3.5,
    ),
    contract.Finished(
        rounds=2,
        eval_accuracy=0.9,
        eval_loss=0.3,
        classes=["0", "1"],
        model=[[[0.1, -0.2], [0.3, 0.4]], [0.0, 1.0]],
        sites={"a": contract.SiteEvaluation(eval_examples=10, eval_accuracy=1.0)},
    ),
    contract.Contribution(
        players=["a", "b"],
        method="exact",
        utilities={"0": {"": 0.5, "0": 0.7, "1": 0.6, "0,1": 0.9}},
        examples={"a": 10, "b": 12},
        models=4,
        sites={"a": contract.Metering(examples=10, cpu_seconds=0.2)},
        wall_seconds=1.5,
    ),
    contract.Contribution(players=["a", "b"], error="no site scored the coalition models"),
    contract.Failed(reason="only 1 of 2 sites ready"),
]


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: e.name)
def test_every_event_round_trips(event):
    body = contract.encode_event(event, seq=7)

    seq, again = contract.parse_event(body)

    assert (seq, again) == (7, event)
    assert json.loads(body)["event"] == event.name


def _body(payload) -> bytes:
    return json.dumps(payload).encode()


def _deep(levels: int) -> bytes:
    return b'{"event":"started","seq":1,"nodes":' + b"[" * levels + b"]" * levels + b"}"


ROUND = {"event": "round", "seq": 1, "round": 1, "sites": {"a": SITE}}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (_body([ROUND]), "must be a JSON object, not list"),
        (_body("round"), "must be a JSON object, not str"),
        (b"", "not JSON"),
        (b"\xff\xfe{", "not JSON"),
        (_body({**ROUND, "round": 10**30}), "round: 1000000000000000000000000000000 is outside"),
        (_body({**ROUND, "round": "1"}), "round: expected an integer, got str"),
        (_body({**ROUND, "round": True}), "round: expected an integer, got bool"),
        (_body({**ROUND, "sites": [SITE]}), "sites: expected an object, got list"),
        (_body({**ROUND, "sites": {"a": {**SITE, "eval_accuracy": 1.5}}}), "outside 0.0..1.0"),
        (_body({**ROUND, "sites": {"a": {**SITE, "bytes_sent": -1}}}), "bytes_sent: -1"),
        (_body({**ROUND, "sites": {"a": {**SITE, "ok": 1}}}), "expected true or false"),
        (_body({**ROUND, "sites": {"../x": SITE}}), "sites key"),
        (_body({**ROUND, "extra": 1}), "unknown field(s) 'extra'"),
        (_body({"event": "started", "seq": 1, "nodes": [1]}), "nodes: expected an object"),
        (_body({"event": "started", "seq": 1, "nodes": {"a": 12}}), "expected a string"),
        (_deep(100_000), "nested too deeply"),
        (_deep(50), "nodes: expected an object, got list"),
        (b'{"event":"finished","seq":1,"rounds":2,"eval_loss":NaN}', "NaN is not a number"),
        (b'{"event":"finished","seq":1,"rounds":2,"eval_accuracy":Infinity}', "Infinity"),
        (b'{"event":"finished","seq":1,"rounds":2,"eval_loss":1e999}', "not a finite number"),
        (_body({"event": "finished", "seq": 1, "rounds": 2, "model": [[[[[1.0]]]]]}), "deeper"),
        (
            _body({"event": "finished", "seq": 1, "rounds": 2, "model": [["x"]]}),
            "expected a number",
        ),
        (_body({"event": "finished", "seq": 1}), "missing field(s) rounds"),
        (_body({"event": "explode", "seq": 1}), "unknown event 'explode'"),
        (_body({"event": "failed"}), "seq: expected an integer, got null"),
        (_body({"event": "failed", "seq": 0}), "seq: 0 is outside"),
        (_body({"event": "failed", "seq": 1, "reason": "x" * 5000}), "longer than 4000"),
        (_body({"event": "failed", "seq": 1, "reason": 3}), "expected a string"),
        # A lone surrogate (valid JSON escape, not encodable text): the database write failed.
        (b'{"event":"failed","seq":1,"reason":"x\\ud800y"}', "not valid Unicode text"),
        (
            _body(
                {"event": "contribution", "seq": 1, "players": ["a"], "utilities": {"0": {"5": 1}}}
            ),
            "names no player",
        ),
        (
            _body({"event": "contribution", "seq": 1, "utilities": {"0": {"0": "NaN"}}}),
            "expected a number",
        ),
        (_body({"event": "contribution", "seq": 1, "players": ["a", "a"]}), "named twice"),
        (b" " * (contract.MAX_EVENT_BYTES + 1), "larger than"),
    ],
)
def test_parse_event_refuses_malformed_bodies(body, message):
    with pytest.raises(contract.ContractError) as err:
        contract.parse_event(body)
    assert message in str(err.value)


def test_encode_event_refuses_nan_before_sending():
    with pytest.raises(contract.ContractError, match="not a finite number"):
        contract.encode_event(contract.Round(round=1, eval_loss=math.nan), seq=1)


def test_finite_or_none_turns_nan_and_infinity_into_none():
    assert [contract.finite_or_none(x) for x in (math.nan, math.inf, 0.5, None)] == [
        None,
        None,
        0.5,
        None,
    ]


def test_callback_answer_round_trips_and_refuses_junk():
    answer = contract.CallbackAnswer(drop_sites=["b"])
    assert contract.CallbackAnswer.from_json(answer.to_json()) == answer
    with pytest.raises(contract.ContractError, match="drop_sites"):
        contract.CallbackAnswer.from_json({"ok": True, "drop_sites": "b"})


# --- site replies ----------------------------------------------------------------------------

TRAIN = {
    "num-examples": 40,
    "train-loss": 0.5,
    "bytes-received": 10,
    "bytes-sent": 10,
    "cpu-seconds": 0.1,
    "wall-seconds": 0.2,
}


def test_train_reply_round_trips_as_a_record():
    reply = contract.TrainReply.from_record(TRAIN)

    assert reply.as_record() == TRAIN and reply.num_examples == 40


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"train-loss": math.nan}, "not a finite number"),
        ({"num-examples": -5}, "num-examples: -5"),
        ({"num-examples": 4.5}, "expected an integer"),
        ({"cpu-seconds": 1e300}, "outside"),
    ],
)
def test_train_reply_a_site_could_lie_with_is_refused(change, message):
    with pytest.raises(contract.ContractError) as err:
        contract.TrainReply.from_record({**TRAIN, **change})
    assert message in str(err.value)


def test_train_reply_missing_a_metric_is_refused():
    with pytest.raises(contract.ContractError, match="missing wall-seconds"):
        contract.TrainReply.from_record({k: v for k, v in TRAIN.items() if k != "wall-seconds"})


def test_design_stats_refuse_mismatched_lengths_and_negative_m2():
    def record(**body):
        return contract.json_record(
            {"num_examples": 3, "mean": [1.0, 2.0], "m2": [1.0, 1.0], **body}
        )

    assert contract.DesignStats.from_record(record()).mean == [1.0, 2.0]
    with pytest.raises(contract.ContractError, match="one mean and one m2"):
        contract.DesignStats.from_record(record(m2=[1.0]))
    with pytest.raises(contract.ContractError, match="outside"):
        contract.DesignStats.from_record(record(m2=[1.0, -1.0]))
    with pytest.raises(contract.ContractError, match="not a number JSON allows"):
        contract.DesignStats.from_record({"json": '{"num_examples": 3, "mean": [NaN], "m2": [0]}'})


def test_job_spec_plans_are_checked_against_their_kind_and_the_features():
    base = {
        "sites": {"a": {"store_key": "k", "dataset": "d", "version": 1}},
        "target": "y",
        "features": ["x"],
    }

    def spec(**body):
        return contract.JobSpec.from_json(json.dumps({**base, **body}))

    plan = {"name": "x", "kind": "categorical", "missing": "most_frequent", "indicator": True}
    assert spec(plans=[plan]).plan("x") == contract.FeaturePlan(
        "x", "categorical", "most_frequent", True
    )
    assert spec().plan("x") == contract.FeaturePlan("x")  # numeric, median, no indicator
    with pytest.raises(contract.ContractError, match="does not apply to a categorical"):
        spec(plans=[{**plan, "missing": "mean"}])
    with pytest.raises(contract.ContractError, match="are not features"):
        spec(plans=[{**plan, "name": "z"}])
    with pytest.raises(contract.ContractError, match="not one of"):
        spec(task="clustering")


def test_site_info_of_a_non_member_leaves_out_empty_lists():
    info = contract.SiteInfo(site="a", member=False)

    assert info.as_record() == {"site": "a", "member": False}
    assert contract.SiteInfo.from_record(info.as_record()) == info
