"""Integration: a real two-site, two-round Flower job driven through the services.

PostgreSQL (the test database), a real Celery worker with beat on Redis, a real SuperLink and two
SuperNodes, callbacks into the live server. Also the data-residency proof: canary values planted in
hospital-a's CSV appear nowhere in the portal database, the SuperLink database or any log.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass

import pytest
from django.apps import apps
from django.core import serializers
from django.db import connection

from federation import services
from federation.models import FederatedJob, JobSiteStatus, JobStatus, RoundMetric, SiteRoundMetric
from sandbox.keyring import SiteKeyring
from sandbox.loader import load_table
from sandbox.storage import FilesystemStore
from tests.federation.conftest import CANARY_NUMBER, CANARY_TEXT, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _portal_database_text() -> str:
    models = [m for m in apps.get_models() if m._meta.managed]
    text = "\n".join(serializers.serialize("json", m.objects.all()) for m in models)
    with connection.cursor() as cur:  # and the raw JSON columns, in case a serializer skips one
        cur.execute(
            "SELECT string_agg(profile::text || schema::text, '') FROM sandbox_datasetversion"
        )
        return text + (cur.fetchone()[0] or "")


@dataclass
class Outcome:
    """What the job left behind, read before pytest-django's live server flushes the database."""

    job: FederatedJob
    rounds: list
    sites: list
    ok_site_rounds: int
    db_text: str


@pytest.fixture(scope="module")
def outcome(flower_job_world, django_db_blocker) -> Outcome:
    """Submit through ``job_submit`` (the worker launches and reconciles) and wait for the end."""
    w = flower_job_world
    with django_db_blocker.unblock():
        job = services.job_submit(
            by=w.researcher,
            project=w.project,
            dataset_versions=w.versions,
            title="integration",
            target_column="diagnosis",
            num_rounds=2,
            local_epochs=3,
            learning_rate=0.1,
        )

        def done():
            j = FederatedJob.objects.get(pk=job.pk)
            return j if j.is_terminal else None

        job = wait_for(done, timeout=240, what="the job to finish")
        return Outcome(
            job=job,
            rounds=list(RoundMetric.objects.filter(job=job).order_by("round")),
            sites=list(job.sites.all()),
            ok_site_rounds=SiteRoundMetric.objects.filter(job_site__job=job, ok=True).count(),
            db_text=_portal_database_text(),
        )


def test_job_completes_with_round_metrics(outcome, flower_job_world):
    job = outcome.job
    assert job.status == JobStatus.COMPLETED, (
        job.status_detail,
        flower_job_world.worker_log.read_text()[-3000:],
    )
    assert job.flower_run_id.isdigit()
    assert [r.round for r in outcome.rounds] == [1, 2]
    assert all(r.sites_replied == 2 for r in outcome.rounds)
    assert outcome.rounds[-1].eval_accuracy >= 0.85
    assert job.final_metrics["eval_accuracy"] == pytest.approx(outcome.rounds[-1].eval_accuracy)
    assert {s.status for s in outcome.sites} == {JobSiteStatus.COMPLETED}
    assert all(s.node_id.isdigit() and s.rounds_completed == 2 for s in outcome.sites)
    assert outcome.ok_site_rounds == 4


def test_canary_never_leaves_the_site(outcome, flower_job_world):
    w = flower_job_world
    assert outcome.job.status == JobStatus.COMPLETED
    assert "diagnosis" in outcome.db_text  # the dump is real: it holds the schema
    for canary in (CANARY_TEXT, CANARY_NUMBER):
        assert canary not in outcome.db_text, f"{canary} reached the portal database"

    checked = 0
    for path in [*w.runtime_root.rglob("*"), w.worker_log, *w.sites_dir.rglob("*.enc")]:
        if path.is_file():
            data = path.read_bytes()
            checked += 1
            for canary in (CANARY_TEXT, CANARY_NUMBER):
                assert canary.encode() not in data, f"{canary} found in {path}"
    # Positive control: the canaries are in hospital-a's data, readable only with its key.
    site = w.versions[0].dataset.site.slug
    table = load_table(
        store=FilesystemStore(w.sites_dir / site / "store"),
        kek=SiteKeyring(w.sites_dir / site / "keyring").get(site),
        store_key=w.versions[0].store_key,
        site=site,
        dataset="bc",
        version=1,
    )
    assert CANARY_TEXT in table.data["patient_ref"].tolist()
    assert float(CANARY_NUMBER) in table.data["mean_radius"].tolist()
    # Every message the ServerApp received (the reply log): updates and metrics, and no canary.
    (log,) = w.reply_log_dir.glob(f"job-{outcome.job.pk}-replies.jsonl")
    replies = [json.loads(line) for line in log.read_text().splitlines()]
    kinds = {r["message_type"] for r in replies}
    assert {"query", "train", "evaluate"} <= kinds, kinds
    # It is complete: one discovery reply per SuperNode, then a train and an evaluate reply per
    # site and round (2 sites, 2 rounds) — so "absent from the log" means "never received".
    assert Counter(r["message_type"] for r in replies) == {"query": 2, "train": 4, "evaluate": 4}
    assert {r["node_id"] for r in replies} == {s.node_id for s in outcome.sites}
    assert any(r["content"] and "arrays" in r["content"] for r in replies)  # model updates logged
    log_text = log.read_text()
    for canary in (CANARY_TEXT, CANARY_NUMBER):
        assert canary not in log_text, f"{canary} reached the ServerApp"
    superlink_db = w.runtime_root / "superlink.db"
    assert superlink_db.exists() and superlink_db.stat().st_size > 0
    assert checked >= 5  # SuperLink db and logs, SuperNode logs, worker log, encrypted objects
