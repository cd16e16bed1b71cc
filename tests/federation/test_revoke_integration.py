"""Integration: revoking a grant while a job runs drops that site at its next round (real Flower).

A three-site, three-round job on the real SuperLink and SuperNodes, a real Celery worker and the live
server's callback endpoint. When the ServerApp's round-1 callback reaches the portal, the data steward
of hospital-c revokes the project's grant (through ``access_grant_revoke``, in the live server just
before the callback is recorded — so the moment is exact, not a race with the test thread). The
portal's answer names hospital-c in ``drop_sites``; the ServerApp leaves it out of rounds 2 and 3; the
job completes on the other two sites, and a new submission with hospital-c's dataset is refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from unittest import mock

import pytest

from accounting.models import CreditStatement
from federation import services
from federation.models import FederatedJob, JobSiteStatus, JobStatus, RoundMetric, SiteRoundMetric
from frp_flwr import contract
from portal.models import Membership, Role
from sandbox import services as sandbox_services
from sandbox.models import AccessRequest, AccessStatus
from tests.federation.conftest import flower_world, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SITES = ("hospital-a", "hospital-b", "hospital-c")
REVOKED = "hospital-c"
ROUNDS = 3


@pytest.fixture(scope="module")
def three_site_world(django_db_setup, django_db_blocker, live_server, tmp_path_factory):
    with flower_world(
        SITES,
        root=tmp_path_factory.mktemp("flower-revoke"),
        live_server=live_server,
        django_db_blocker=django_db_blocker,
    ) as world:
        yield world


@dataclass
class Outcome:
    job: FederatedJob
    revoked_at_round: list
    sites: dict
    site_rounds: dict
    rounds: list
    grant: AccessRequest
    resubmit_error: services.JobError | None
    jobs_after_resubmit: int


@pytest.fixture(scope="module")
def outcome(three_site_world, django_db_blocker) -> Outcome:
    w = three_site_world
    with django_db_blocker.unblock():
        version_c = next(v for v in w.versions if v.dataset.site.slug == REVOKED)
        grant = AccessRequest.objects.get(dataset=version_c.dataset, project=w.project)
        steward_c = w.researcher.__class__.objects.create_user("steward-c", password="pw-123456!")
        Membership.objects.create(
            user=steward_c, institution=version_c.dataset.site.institution, role=Role.DATA_STEWARD
        )
        revoked_at_round: list[int] = []
        real_record = services.job_callback_record

        def revoke_at_round_one(*, job_id, seq, event):
            """Runs in the live server: the steward revokes as round 1's callback arrives."""
            first_round = isinstance(event, contract.Round) and event.round == 1
            if first_round and not revoked_at_round:
                sandbox_services.access_grant_revoke(
                    by=steward_c, request_id=grant.pk, reason="consent withdrawn"
                )
                revoked_at_round.append(1)
            return real_record(job_id=job_id, seq=seq, event=event)

        with mock.patch.object(services, "job_callback_record", revoke_at_round_one):
            job = services.job_submit(
                by=w.researcher,
                project=w.project,
                dataset_versions=w.versions,
                title="revoke mid-run",
                target_column="diagnosis",
                num_rounds=ROUNDS,
                local_epochs=1,
                learning_rate=0.1,
            )

            def done():
                j = FederatedJob.objects.get(pk=job.pk)
                return j if j.is_terminal else None

            job = wait_for(done, timeout=300, what="the job to finish")
            if job.status == JobStatus.COMPLETED:  # let the worker's accounting task finish
                wait_for(
                    lambda: CreditStatement.objects.filter(job=job).exists(),
                    timeout=60,
                    what="the worker's accounting chain (its last step drafts the credit)",
                )
        site_rounds = {
            slug: sorted(
                SiteRoundMetric.objects.filter(
                    job_site__job=job, job_site__site__slug=slug, ok=True
                ).values_list("round", flat=True)
            )
            for slug in SITES
        }
        grant.refresh_from_db()
        # A new job with the revoked site's dataset (read here: the live server's teardown after
        # each test flushes the database).
        resubmit_error = None
        try:
            services.job_submit(
                by=w.researcher,
                project=w.project,
                dataset_versions=w.versions,
                title="again",
                target_column="diagnosis",
                num_rounds=1,
                local_epochs=1,
                learning_rate=0.1,
            )
        except services.JobError as exc:
            resubmit_error = exc
        return Outcome(
            job=job,
            revoked_at_round=revoked_at_round,
            sites={js.site.slug: js for js in job.sites.select_related("site")},
            site_rounds=site_rounds,
            rounds=list(RoundMetric.objects.filter(job=job).order_by("round")),
            grant=grant,
            resubmit_error=resubmit_error,
            jobs_after_resubmit=FederatedJob.objects.count(),
        )


def test_revoked_site_is_dropped_and_job_completes_with_the_others(outcome, three_site_world):
    o = outcome
    assert o.revoked_at_round == [1] and o.grant.status == AccessStatus.REVOKED
    assert o.job.status == JobStatus.COMPLETED, (
        o.job.status_detail,
        three_site_world.worker_log.read_text()[-3000:],
    )
    assert o.site_rounds[REVOKED] == [1]  # replied in round 1, never after
    for slug in ("hospital-a", "hospital-b"):
        assert o.site_rounds[slug] == list(range(1, ROUNDS + 1))
        assert o.sites[slug].status == JobSiteStatus.COMPLETED
    dropped = o.sites[REVOKED]
    assert dropped.status == JobSiteStatus.DROPPED
    assert "access grant no longer valid" in dropped.last_error
    assert [r.round for r in o.rounds] == list(range(1, ROUNDS + 1))
    assert [r.sites_replied for r in o.rounds] == [3] + [2] * (ROUNDS - 1)


def test_serverapp_received_nothing_from_the_revoked_site_after_round_one(
    outcome, three_site_world
):
    """The reply log (every message the ServerApp received) agrees with the portal's records."""
    (log,) = three_site_world.reply_log_dir.glob(f"job-{outcome.job.pk}-replies.jsonl")
    replies = [json.loads(line) for line in log.read_text().splitlines()]
    node = outcome.sites[REVOKED].node_id
    from_revoked = [r["message_type"] for r in replies if r["node_id"] == node]
    # Before round 1 every site answers discovery ("query") and the preprocessing steps
    # ("query.quantiles", "query.design"); after that the revoked site trained in round 1 and
    # answered round 2's train message, which evaluated round 1's model (fused rounds, ADR 0032:
    # round 1's callback, where the grant is revoked, follows it; that round-2 update is
    # discarded), and nothing after.
    assert "query" in from_revoked
    assert all(t.split(".")[0] in ("query", "train", "evaluate") for t in from_revoked)
    assert sorted(t for t in from_revoked if t.split(".")[0] != "query") == ["train", "train"]
    others = [r for r in replies if r["node_id"] != node and r["message_type"] == "train"]
    assert len(others) == 2 * ROUNDS


def test_new_submission_with_the_revoked_dataset_is_refused(outcome):
    assert outcome.resubmit_error is not None
    assert str(outcome.resubmit_error) == "no valid grant"
    assert REVOKED in str(outcome.resubmit_error.field_errors["datasets"])
    assert outcome.jobs_after_resubmit == 1
