"""Integration: a real two-site, two-round Flower job driven through the services.

PostgreSQL (the test database), a real Celery worker with beat on Redis, a real SuperLink and two
SuperNodes, callbacks into the live server. Also the data-residency proof: canary values planted in
hospital-a's CSV appear nowhere in the portal database, the SuperLink database or any log — nor in
any reply the ServerApp received, including the sites' scores of the coalition models. Usage and
contribution (issue 5) are computed from what the real run posted.
"""

from __future__ import annotations

import base64
import json
import re
import stat
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest
from django.apps import apps
from django.core import serializers
from django.db import connection
from django.test import Client
from django.utils import timezone

from accounting.models import (
    BillingEntry,
    ContributionScore,
    CreditStatement,
    JobAccountingStep,
    PriceRule,
    UsageRecord,
)
from federation import callbacks, services
from federation.disclosure import contribution_released
from federation.models import FederatedJob, JobSiteStatus, JobStatus, RoundMetric, SiteRoundMetric
from frp_flwr import contract
from frp_flwr.signing import SignatureError, job_key, sign, verify
from portal.ledger.models import LedgerEntry
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
    usage: list
    scores: list
    site_bytes: dict
    billing: list
    credit_names: list
    ledger_kinds: Counter
    accounting_steps: dict
    forged_callbacks: dict  # run-config value used as the key → HTTP status of the callback
    real_key_callback: tuple  # (status, body) of a callback signed with the run's real key
    failure_reason_after: str
    opted_out: tuple  # _opted_out_job: the second job, run after everything above was read


def _run_to_the_end(w, *, title: str, rounds: int, epochs: int) -> FederatedJob:
    """Submit a job over every site of ``w`` through ``job_submit`` (the worker launches and
    reconciles), wait until it ends and, when it completed, until the worker's accounting chain
    has drafted its credit (the chain's last step). Returns the job as it ended."""
    job = services.job_submit(
        by=w.researcher,
        project=w.project,
        dataset_versions=w.versions,
        title=title,
        target_column="diagnosis",
        num_rounds=rounds,
        local_epochs=epochs,
        learning_rate=0.1,
    )

    def done():
        j = FederatedJob.objects.get(pk=job.pk)
        return j if j.is_terminal else None

    job = wait_for(done, timeout=240, what=f"job {title!r} to finish")
    if job.status == JobStatus.COMPLETED:
        wait_for(
            lambda: CreditStatement.objects.filter(job=job).exists(),
            timeout=60,
            what="the worker's accounting chain (its last step drafts the credit)",
        )
    return job


@pytest.fixture(scope="module")
def outcome(flower_job_world, django_db_blocker) -> Outcome:
    """Submit through ``job_submit`` (the worker launches and reconciles) and wait for the end."""
    w = flower_job_world
    with django_db_blocker.unblock():
        for version in w.versions:  # a price on every pool, so the worker bills the job
            PriceRule.objects.get_or_create(  # dear: a seconds-long job must cost whole cents
                pool=version.dataset.site.pools.get(),
                effective_from=timezone.localdate() - timedelta(days=1),
                defaults={"price_per_unit": Decimal("500"), "data_credit_rate": Decimal("0.5")},
            )
        job = _run_to_the_end(w, title="integration", rounds=2, epochs=3)
        forged, real = _forged_callbacks(w, job)
        usage = list(UsageRecord.objects.filter(job=job).select_related("site"))
        scores = list(ContributionScore.objects.filter(job=job).select_related("site"))
        statement = CreditStatement.objects.filter(job=job).first()
        result = Outcome(
            job=job,
            rounds=list(RoundMetric.objects.filter(job=job).order_by("round")),
            sites=list(job.sites.all()),
            ok_site_rounds=SiteRoundMetric.objects.filter(job_site__job=job, ok=True).count(),
            db_text=_portal_database_text(),
            usage=usage,
            scores=scores,
            site_bytes={
                js.site.slug: [
                    (m.bytes_received, m.bytes_sent) for m in js.round_metrics.order_by("round")
                ]
                for js in job.sites.select_related("site")
            },
            billing=list(BillingEntry.objects.filter(job=job).select_related("site")),
            credit_names=(
                [c.name for c in statement.contributors.all()] if statement is not None else []
            ),
            ledger_kinds=Counter(LedgerEntry.objects.values_list("kind", flat=True)),
            accounting_steps=dict(
                JobAccountingStep.objects.filter(job=job).values_list("step", "status")
            ),
            forged_callbacks=forged,
            real_key_callback=real,
            failure_reason_after=FederatedJob.objects.get(pk=job.pk).failure_reason,
            opted_out=(),
        )
        result.opted_out = _opted_out_job(w)
        return result


def _opted_out_job(w) -> tuple:
    """A second job in the same federation after hospital-b's steward turned Shapley values off
    (issue 9, F1; ADR 0036): ``(job, scores, entries)``, ``entries`` being what each site's
    ClientApp received, by site. Run inside ``outcome`` (the live server flushes the database
    after the first test)."""
    from django.contrib.auth import get_user_model

    from portal.models import Membership, Role
    from sandbox import services as sandbox_services
    from sandbox.models import Dataset

    b = next(v for v in w.versions if v.dataset.site.slug == "hospital-b").dataset
    b.refresh_from_db()
    steward = get_user_model().objects.create_user("bea", password="pw-for-tests-123")
    Membership.objects.create(user=steward, institution=b.site.institution, role=Role.DATA_STEWARD)
    sandbox_services.dataset_rules_set(
        by=steward, dataset=b, auto_release=b.auto_release, shapley_opt_in=False
    )
    assert Dataset.objects.get(pk=b.pk).shapley_opt_in is False
    job = _run_to_the_end(w, title="integration, hospital-b not opted in", rounds=1, epochs=2)
    scores = list(ContributionScore.objects.filter(job=job).select_related("site"))
    entries = {}
    for version in w.versions:
        site = version.dataset.site.slug
        lines = (w.received_log_dir / f"{site}.jsonl").read_text().splitlines()
        entries[site] = [json.loads(line) for line in lines]
    return job, scores, entries


FORGED = json.dumps({"event": "failed", "seq": 10**6, "reason": "forged"}).encode()


def _run_config_seen_by(w, site: str) -> dict:
    """The run config as ``site``'s ClientApp received it (its received log)."""
    first = (w.received_log_dir / f"{site}.jsonl").read_text().splitlines()[0]
    return json.loads(first)["run_config"]


def _forged_callbacks(w, job) -> tuple[dict, tuple]:
    """Post a ``failed`` event signed with each run-config value a site received (as a key), and
    once with the run's real key (the job has ended, so that one meets a 409, not a 403)."""
    client, url = Client(), f"/jobs/callback/{job.pk}/"
    forged = {}
    for key, value in _run_config_seen_by(w, w.versions[0].dataset.site.slug).items():
        headers = sign(str(value).encode(), FORGED)
        forged[key] = client.post(
            url, FORGED, content_type="application/json", headers=headers
        ).status_code
    real_key = callbacks.run_key(job_id=job.pk, run_id=job.flower_run_id)
    response = client.post(
        url, FORGED, content_type="application/json", headers=sign(real_key, FORGED)
    )
    return forged, (response.status_code, response.content)


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


def test_usage_recorded_per_site_from_real_metering(outcome):
    job = outcome.job
    assert job.status == JobStatus.COMPLETED
    assert sorted(u.site.slug for u in outcome.usage) == ["hospital-a", "hospital-b"]
    contribution = job.final_metrics["contribution"]
    for u in outcome.usage:
        assert u.rounds == 2 and u.cpu_seconds > 0 and u.wall_seconds >= u.cpu_seconds * 0.5
        # Every round: the global model in, the site's weights out (train); fused rounds (ADR
        # 0030) bring the model in once per round, and once more for the closing evaluation.
        per_round = outcome.site_bytes[u.site.slug]
        assert len(per_round) == 2
        assert all(r > 0 and 0 < s <= r for r, s in per_round), per_round
        assert per_round[-1][1] < per_round[-1][0]  # the last round: train and closing evaluate
        extra = contribution["sites"][u.site.slug]
        assert u.bytes_received == sum(r for r, _ in per_round) + extra["bytes_received"]
        assert extra["bytes_received"] > per_round[0][1]  # all coalition models in one message
        assert u.flower_compute_seconds is None  # Flower reports per run only
    flower = job.final_metrics["flower"]
    # Cross-check: the model payloads the sites metered fit inside Flower's own run traffic.
    assert sum(u.bytes_sent for u in outcome.usage) <= flower["bytes_inbound"]
    assert sum(u.bytes_received for u in outcome.usage) <= flower["bytes_outbound"]


def test_contribution_scores_from_the_real_run(outcome):
    job = outcome.job
    contribution = job.final_metrics["contribution"]
    assert contribution["method"] == "exact" and contribution["players"] == [
        "hospital-a",
        "hospital-b",
    ]
    run = contribution["utilities"]["0"]
    assert set(run) == {"", "0", "1", "0,1"}
    # The full coalition's rebuilt model is the real final model: its utility is the median over
    # the sites (ADR 0024) of the accuracy each site measured for the final model.
    per_site = [js.final_metrics["eval_accuracy"] for js in outcome.sites]
    assert len(per_site) == 2
    assert run["0,1"] == pytest.approx(float(np.median(per_site)), abs=1e-9)
    assert contribution["utilities"]["2"]["0,1"] == pytest.approx(run["0,1"], abs=1e-9)
    exact = [s for s in outcome.scores if s.method == "exact" and s.round == 0]
    assert len(exact) == 2
    assert sum(s.share for s in exact) == pytest.approx(1.0, abs=1e-9)
    # Efficiency, over the utilities as released (snapped to the grid of the smaller site's
    # released held-out rows: federation.disclosure, issue 9), from which the scores come.
    released = contribution_released(contribution, exact=False)["utilities"]["0"]
    assert abs(released["0,1"] - run["0,1"]) <= 0.5 / 8  # half a row of at least 8
    assert sum(s.raw_value for s in exact) == pytest.approx(
        released["0,1"] - released[""], abs=1e-9
    )
    assert {s.method for s in outcome.scores} == {"exact", "loo"}
    assert {s.round for s in outcome.scores if s.method == "exact"} == {0, 1, 2}
    print(
        "\ncontribution shares:",
        {s.site.slug: round(s.share, 4) for s in exact},
        "raw:",
        {s.site.slug: round(s.raw_value, 4) for s in exact},
        f"v(empty)={run['']:.4f} v(all)={run['0,1']:.4f}",
        f"evaluation wall time {contribution['wall_seconds']:.2f} s,",
        f"run elapsed {job.final_metrics['flower'].get('elapsed_seconds')} s",
    )


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
    # It is complete: one discovery reply per SuperNode, then a train reply per site and round
    # (2 sites, 2 rounds; round 2's also evaluates round 1's model), then one closing evaluation
    # per site with the coalition models' scores (fused rounds, ADR 0032) — so "absent from the
    # log" means "never received".
    assert Counter(r["message_type"] for r in replies) == {
        "query": 2,
        "query.quantiles": 2,  # the preparation: quantiles for the median fills,
        "query.design": 2,  # and the prepared matrix's statistics
        "train": 4,
        "evaluate": 2,
    }
    assert {r["node_id"] for r in replies} == {s.node_id for s in outcome.sites}
    scored = [r for r in replies if r["message_type"] == "evaluate"]
    assert all(len(r["content"]["coalitions"]["coalition-accuracy"]) == 12 for r in scored)
    assert any(r["content"] and "arrays" in r["content"] for r in replies)  # model updates logged
    log_text = log.read_text()
    for canary in (CANARY_TEXT, CANARY_NUMBER):
        assert canary not in log_text, f"{canary} reached the ServerApp"
    superlink_db = w.runtime_root / "superlink.db"
    assert superlink_db.exists() and superlink_db.stat().st_size > 0
    assert checked >= 5  # SuperLink db and logs, SuperNode logs, worker log, encrypted objects


def test_worker_bills_and_credits_the_finished_job(outcome):
    """The real worker's accounting chain ran after the end: bills, credit, ledger leaves."""
    assert outcome.job.status == JobStatus.COMPLETED
    assert outcome.accounting_steps == dict.fromkeys(
        ("usage", "contribution", "billing", "credit"), "done"
    )
    kinds = {(e.site.slug, e.kind) for e in outcome.billing}
    sites = {u.site.slug for u in outcome.usage}
    # Every site's compute is priced (a zero charge on the project's own institution's pool).
    assert {slug for slug, kind in kinds if kind == "compute_charge"} == sites
    assert any(kind == "data_credit" for _, kind in kinds)
    assert all(e.amount >= 0 for e in outcome.billing)
    assert len(outcome.credit_names) >= 1 + len(sites)  # the submitter and the institutions
    assert outcome.ledger_kinds["usage"] == len(sites)
    assert outcome.ledger_kinds["contribution"] >= len(sites)
    assert outcome.ledger_kinds["charge"] + outcome.ledger_kinds["credit"] == len(outcome.billing)


# ---------------------------------------------------------------------------------------------
# Issue 9, finding 1: no callback credential reaches a site
# ---------------------------------------------------------------------------------------------

_TOKEN_RE = re.compile(rb"[A-Za-z0-9+/=_.:-]{16,}")


def _site_bytes(w) -> dict[str, bytes]:
    """Every byte a SuperNode received or keeps, and the SuperLink's database, by where it was."""
    out: dict[str, bytes] = {}
    for log in sorted(w.received_log_dir.glob("*.jsonl")):  # messages + run/node config, as run
        out[str(log)] = log.read_bytes()
    for home in sorted(w.runtime_root.glob("supernode-*-home")):  # FLWR_HOME: the app (FAB) …
        for path in home.rglob("*"):
            if path.is_file():
                out[str(path)] = path.read_bytes()
    for path in sorted(w.runtime_root.glob("superlink.db*")):  # run configs, messages, state
        out[str(path)] = path.read_bytes()
    for path in sorted((w.runtime_root / "logs").glob("supernode-*.log")):
        out[str(path)] = path.read_bytes()
    for site, pid in w.federation.supernodes.items():  # the SuperNode's own environment
        out[f"/proc/{pid}/environ ({site})"] = Path(f"/proc/{pid}/environ").read_bytes()
    return out


def test_no_callback_credential_reaches_a_site(outcome, flower_job_world):
    """Read all a site receives, plus the SuperLink's database: no callback key is there, and a
    callback signed with anything found there is refused."""
    w, job = flower_job_world, outcome.job
    assert job.status == JobStatus.COMPLETED
    master = callbacks.master_key()
    key = callbacks.run_key(job_id=job.pk, run_id=job.flower_run_id)
    secrets = {
        master,
        key,
        key.hex().encode(),
        base64.b64encode(key),
        base64.urlsafe_b64encode(key),
    }
    blobs = _site_bytes(w)

    # The capture is complete: each site logged every message it handled (discovery, the two
    # preparation steps, 2 train, 1 closing evaluate with the coalition models; ADR 0032) with the
    # run config and node config it ran under.
    for version in w.versions:
        site = version.dataset.site.slug
        lines = (w.received_log_dir / f"{site}.jsonl").read_text().splitlines()
        entries = [json.loads(line) for line in lines]
        second = int(outcome.opted_out[0].flower_run_id)  # the module's second job
        entries = [e for e in entries if e["run_id"] != second]
        assert Counter(e["message_type"] for e in entries) == {
            "query": 1,
            "query.quantiles": 1,
            "query.design": 1,
            "train": 2,
            "evaluate": 1,
        }, site
        assert all(e["run_id"] == int(job.flower_run_id) for e in entries)
        assert set(entries[0]["run_config"]) == set(contract.RunConfig.keys())
        assert entries[0]["node_config"]["site"] == site
    assert any(name.endswith("superlink.db") for name in blobs)
    assert any("supernode-" in name and name.endswith(".toml") for name in blobs)  # the app

    for name, data in blobs.items():
        for secret in secrets:
            assert secret not in data, f"a callback credential is in {name}"
        assert b"FRP_CALLBACK_KEY" not in data or not name.startswith("/proc/"), name

    # Anything found there, used as a job key or as a platform key, signs nothing the portal takes.
    candidates = {m.group() for data in blobs.values() for m in _TOKEN_RE.finditer(data)}
    config = _run_config_seen_by(w, w.versions[0].dataset.site.slug)
    candidates |= {str(v).encode() for v in config.values()}
    assert len(candidates) > 100  # not vacuous: tokens of every file were tried
    body = FORGED
    for candidate in candidates:
        for forged in (candidate, job_key(candidate, job_id=job.pk, run_id=job.flower_run_id)):
            headers = sign(forged, body)
            with pytest.raises(SignatureError, match="does not match"):
                verify(
                    key,
                    body,
                    timestamp=headers["X-FRP-Timestamp"],
                    signature=headers["X-FRP-Signature"],
                )

    # Through the real endpoint (posted before the module's flush, see ``outcome``): each
    # run-config value as the key is refused (403); the real key passes the signature check and
    # meets the finished job's refusal instead (409). Nothing was written.
    assert set(outcome.forged_callbacks) == set(contract.RunConfig.keys())
    assert set(outcome.forged_callbacks.values()) == {403}
    status, content = outcome.real_key_callback
    assert status == 409 and b"callbacks are accepted only while" in content
    assert outcome.failure_reason_after == ""


def test_superlink_database_and_homes_are_private(outcome, flower_job_world):
    """Files that hold a run's state are 0600 in 0700 folders (umask 077 for every process)."""
    w = flower_job_world
    assert outcome.job.status == JobStatus.COMPLETED
    database = w.runtime_root / "superlink.db"
    assert stat.S_IMODE(database.stat().st_mode) == 0o600
    for folder in [w.runtime_root, *w.runtime_root.glob("*-home"), w.runtime_root / "logs"]:
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    for path in w.runtime_root.rglob("*"):
        if path.is_file():
            assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path


def test_opted_out_job_sends_no_coalition_model(outcome):
    """With one steward not opted in, no site receives a coalition model (the first job's
    closing message carried them: the check is not vacuous), the job completes, and every site
    is credited by data volume."""
    job, scores, entries = outcome.opted_out
    assert job.status == JobStatus.COMPLETED, job.status_detail
    assert job.shapley_consent is False
    first, second = int(outcome.job.flower_run_id), int(job.flower_run_id)
    for site, seen in entries.items():
        mine = [e for e in seen if e["run_id"] == second]
        assert Counter(e["message_type"] for e in mine)["evaluate"] == 1, site
        assert all(e["run_config"]["contribution"] is False for e in mine)
        for e in mine:
            assert "models" not in e["content"], site
            assert "coalition-keys" not in e["content"].get("config", {}), site
        before = [e for e in seen if e["run_id"] == first and e["message_type"] == "evaluate"]
        assert len(before) == 1 and "models" in before[0]["content"], site
        keys = set(before[0]["content"]["config"]["coalition-keys"])  # "round|members"
        assert {"0|", "0|0", "0|1", "0|0,1"} <= keys, site  # the whole run's ∅, {a}, {b}, {a,b}
        assert len(before[0]["content"]["models"][0]) == len(keys)  # one stacked model per key
    assert "contribution" not in job.final_metrics
    assert {s.method for s in scores} == {"data_volume"}
    assert {s.site.slug for s in scores} == {"hospital-a", "hospital-b"}
    assert sum(s.share for s in scores) == pytest.approx(1.0)
