"""Usage records from the ClientApp's metering (``accounting.services.usage``).

Round metering enters through the real callback service; expected sums are written out by hand.
"""

from __future__ import annotations

import json
from datetime import timedelta
from decimal import Decimal

import pytest

from accounting.models import UsageRecord
from accounting.services.usage import UsageError, usage_record_job
from portal.ledger.models import LedgerEntry
from tests.accounting.job_world import finish, post, running_job, utilities_event

pytestmark = pytest.mark.django_db

FLOWER_LS_RUN = {  # the shape `flwr ls --run-id 7 --format json` prints in flwr 1.42
    "run-id": 7,
    "status": "finished:completed",
    "elapsed": 31.5,
    "network-traffic": {"inbound-bytes": 52000, "outbound-bytes": 61000, "total-bytes": 113000},
    "compute-time": {"serverapp-seconds": 30.1, "clientapp-seconds": 4.25, "total-seconds": 34.35},
}


def _site(train, evaluated, cpu, wall, received, sent, ok=True):
    return {
        "ok": ok,
        "train_examples": train,
        "eval_examples": evaluated,
        "cpu_seconds": cpu,
        "wall_seconds": wall,
        "bytes_received": received,
        "bytes_sent": sent,
        "error": "" if ok else "timed out",
    }


@pytest.fixture
def metered_job():
    job = running_job(2)
    post(
        job,
        "round",
        round=1,
        sites={
            "s0": _site(40, 10, 0.25, 0.5, 1700, 850),
            "s1": _site(60, 15, 0.5, 1.0, 1700, 850),
        },
    )
    post(
        job,
        "round",
        round=2,
        sites={
            "s0": _site(40, 10, 0.125, 0.25, 1700, 850),
            "s1": _site(0, 0, 0.0, 0.0, 0, 0, ok=False),
        },
    )
    event = utilities_event(["s0", "s1"], {"0": {"": 0.5, "0": 0.6, "1": 0.7, "0,1": 0.8}})
    event["sites"] = {
        "s0": {
            "examples": 40,
            "cpu_seconds": 0.5,
            "wall_seconds": 0.75,
            "bytes_received": 4000,
            "bytes_sent": 0,
        },
    }
    post(job, "contribution", **event)
    return finish(job, raw=FLOWER_LS_RUN)


def test_usage_sums_rounds_and_contribution_work_per_site(metered_job):
    records = {r.site.slug: r for r in usage_record_job(job=metered_job)}

    s0, s1 = records["s0"], records["s1"]
    # s0: two rounds of 40 train + 10 eval examples, plus 40 coalition-model evaluations.
    assert (s0.rounds, s0.examples) == (2, 40 + 10 + 40 + 10 + 40)
    assert s0.cpu_seconds == pytest.approx(0.25 + 0.125 + 0.5)
    assert s0.wall_seconds == pytest.approx(0.5 + 0.25 + 0.75)
    assert (s0.bytes_received, s0.bytes_sent) == (1700 + 1700 + 4000, 850 + 850)
    # s1 failed round 2 and did not score coalitions.
    assert (s1.rounds, s1.examples, s1.bytes_received, s1.bytes_sent) == (1, 75, 1700, 850)
    assert s1.cpu_seconds == pytest.approx(0.5)


def test_usage_records_the_slot_held_from_start_to_end(metered_job):
    metered_job.started_at = metered_job.finished_at - timedelta(seconds=90.5)
    metered_job.save(update_fields=["started_at"])

    records = usage_record_job(job=metered_job)

    assert {r.reserved_seconds for r in records} == {90.5}


def test_usage_without_a_start_time_records_no_slot(metered_job):
    assert metered_job.started_at is None

    records = usage_record_job(job=metered_job)

    assert {r.reserved_seconds for r in records} == {None}  # billing then uses wall_seconds


def test_usage_flower_figures_are_per_run_only(metered_job):
    records = usage_record_job(job=metered_job)

    assert all(r.flower_compute_seconds is None and r.flower_bytes is None for r in records)
    assert metered_job.final_metrics["flower"] == {
        "elapsed_seconds": 31.5,
        "bytes_inbound": 52000,
        "bytes_outbound": 61000,
        "serverapp_seconds": 30.1,
        "clientapp_seconds": 4.25,
    }


def test_usage_twice_same_records_and_one_ledger_leaf_each(metered_job):
    first = usage_record_job(job=metered_job)
    second = usage_record_job(job=metered_job)

    assert [r.pk for r in first] == [r.pk for r in second]
    assert UsageRecord.objects.filter(job=metered_job).count() == 2
    assert LedgerEntry.objects.filter(kind="usage").count() == 2


def test_usage_ledger_leaf_holds_decimals_as_text(metered_job):
    usage_record_job(job=metered_job)

    leaf = json.loads(LedgerEntry.objects.get(kind="usage", data__contains='"s0"').data)
    assert leaf["kind"] == "usage" and leaf["job"] == metered_job.pk
    assert leaf["cpu_seconds"] == "0.875000" and Decimal(leaf["wall_seconds"]) == Decimal("1.5")
    assert (leaf["bytes_received"], leaf["bytes_sent"], leaf["rounds"]) == (7400, 1700, 2)
    assert leaf["memory_gib"] == "1.000"


def test_usage_ledger_leaf_commits_to_examples_without_disclosing_them(metered_job):
    """Hostile re-test, finding 5: the public usage leaf held ``examples`` = 5·189 + 38 = 983,
    from which every institution read hospital-b's exact row count (189; the dataset page says
    ≈190). The leaf now holds a salted commitment; the exact figure and the salt stay in the
    usage record and its audit event, and open the commitment."""
    from portal.ledger.leaves import commitment_matches
    from portal.models import AuditEvent

    (s0, _) = usage_record_job(job=metered_job)

    entry = LedgerEntry.objects.get(kind="usage", data__contains='"s0"')
    leaf = json.loads(entry.data)
    assert "examples" not in leaf and str(s0.examples) not in entry.data
    event = AuditEvent.objects.get(action="usage.record", target_id=str(s0.pk))
    assert event.data["examples"] == s0.examples == 40 + 10 + 40 + 10 + 40
    salt = event.data["examples_salt"]
    assert commitment_matches(
        str(s0.examples), commitment_hex=leaf["examples_commitment"], salt_hex=salt
    )
    # without the salt no guess can be confirmed; with it, only the true figure opens it
    assert not any(
        commitment_matches(str(n), commitment_hex=leaf["examples_commitment"], salt_hex=salt)
        for n in range(1000)
        if n != s0.examples
    )


def test_usage_of_running_job_refused_and_nothing_written():
    job = running_job(2)
    post(job, "round", round=1, sites={"s0": _site(4, 1, 0.1, 0.1, 10, 10)})

    with pytest.raises(UsageError, match="running"):
        usage_record_job(job=job)

    assert not UsageRecord.objects.exists() and not LedgerEntry.objects.exists()


def test_usage_site_without_metering_gets_no_record():
    job = running_job(3)
    post(job, "round", round=1, sites={"s0": _site(4, 1, 0.1, 0.1, 10, 10)})
    job = finish(job)

    assert [r.site.slug for r in usage_record_job(job=job)] == ["s0"]
