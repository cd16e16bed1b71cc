"""Helpers for callback tests: events as the ServerApp sends them, signed with the run's key.

``record`` feeds an event dict through the contract's parser into ``job_callback_record`` with the
job's next sequence number, as the view does after checking the signature. ``signed`` builds the
body and headers of a real HTTP callback.
"""

from __future__ import annotations

import json

from federation import callbacks, services
from federation.models import FederatedJob
from frp_flwr import contract
from frp_flwr.signing import sign


def event_of(payload: dict) -> contract.Event:
    """The contract event of ``{"event": name, **fields}`` (raises ``ContractError``)."""
    fields = {k: v for k, v in payload.items() if k not in ("event", "seq")}
    return contract.EVENTS[payload["event"]].from_json(fields)


def next_seq(job: FederatedJob) -> int:
    return FederatedJob.objects.get(pk=job.pk).callback_seq + 1


def record(job: FederatedJob, payload: dict, *, seq: int | None = None) -> dict:
    """``job_callback_record`` of ``payload`` as the job's next event; the answer as JSON."""
    answer = services.job_callback_record(
        job_id=job.pk, seq=next_seq(job) if seq is None else seq, event=event_of(payload)
    )
    return answer.to_json()


def body_of(payload: dict, *, seq: int) -> bytes:
    """The JSON body the ServerApp would post (no validation: tests send malformed ones too)."""
    return json.dumps({**payload, "seq": seq}).encode()


def run_key(job: FederatedJob) -> bytes:
    """The key the job's ServerApp signs with (job id, recorded Flower run id)."""
    return callbacks.run_key(job_id=job.pk, run_id=job.flower_run_id)


def signed(job: FederatedJob, body: bytes, *, key: bytes | None = None, **sign_kw) -> dict:
    """Signature headers of ``body`` with the job's run key (or ``key``)."""
    return sign(run_key(job) if key is None else key, body, **sign_kw)


def post(client, job: FederatedJob, body: bytes, headers: dict | None = None):
    return client.post(
        f"/jobs/callback/{job.pk}/",
        data=body,
        content_type="application/json",
        headers=headers or {},
    )


def record_round(job: FederatedJob, rnd: int, train_examples: dict[str, int]) -> dict:
    """Record round ``rnd`` in which every site of ``train_examples`` (slug → rows) trained,
    with a quarter as many held-out rows; the portal's answer as JSON."""
    site = {
        "ok": True,
        "train_loss": 0.5,
        "cpu_seconds": 0.1,
        "wall_seconds": 0.1,
        "bytes_received": 10,
        "bytes_sent": 10,
    }
    sites = {
        slug: {**site, "train_examples": n, "eval_examples": max(1, n // 4)}
        for slug, n in train_examples.items()
    }
    return record(job, {"event": "round", "round": rnd, "sites": sites})


def record_one_round(job: FederatedJob, train_examples: dict[str, int]) -> None:
    """:func:`record_round` 1, then ``finished`` (accuracy 0.9, a 1×1 model)."""
    record_round(job, 1, train_examples)
    record(job, {"event": "finished", "rounds": 1, "eval_accuracy": 0.9, "model": [[1.0]]})
