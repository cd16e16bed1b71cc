"""Pages at scale: every list page of the portal timed at 10,000 jobs on PostgreSQL (issue 12).

Run from the repository root (3–6 minutes on a 2-CPU machine; PostgreSQL on 127.0.0.1, as the
test suite uses it, or ``DATABASE_URL``)::

    .venv/bin/python benchmarks/pages.py [--jobs 10000] [--requests 30] [--explain]

What it does, all in this one process:

1. creates a throwaway PostgreSQL database (``connection.creation.create_test_db``: migrated from
   scratch, dropped at the end, also on failure) and fills it with ``bulk_create``: 10 institutions
   with one site each, 2,000 users, 50 projects (10 members each), 200 datasets with 2 versions,
   1,000 access requests, ``--jobs`` jobs at 3 sites each (30,000 job sites), 10 rounds each
   (100,000 round metrics, 300,000 site round metrics), a usage record, two billing entries and a
   ledger leaf per job site, 360 invoices, 4 accounting steps per job (5 % of jobs with a failed
   one), 3 audit events per job. Jobs' ``final_metrics`` hold a model and contribution figures as
   the ServerApp reports them (about 2 kB each).
2. signs in (``Client.force_login``, the session in the database as in production) as a
   *researcher* (member of half the projects: sees half the jobs), a *data steward* and an
   *institution admin* of the first institution (both see its sites' jobs) and a *platform admin*
   (``is_staff``: sees every job, the accounting list and Django's admin lists);
3. requests each list page found in the URL configuration ``--warmup`` times untimed and then
   ``--requests`` times, and prints p50/p95 wall time of the whole request (middleware, session,
   queries, template), the number of SQL queries and the response size; every page must answer
   200. The ratio column is p95 / the p95 of the job page (``/jobs/<pk>/``, one job with its sites
   and rounds), the reference the issue names (30–60 ms);
4. prints the same for ``/jobs/`` with main's query shape before this change (``SELECT DISTINCT``
   with two ``Count(distinct)`` annotations, and the paginator's ``COUNT(*)`` over it), swapped in
   for the selector in this process: the before/after ratio on the same rows.

``--explain`` prints PostgreSQL's ``EXPLAIN ANALYZE`` of the job list's queries.

Target (issue 12): every list page p95 < 100 ms at 10,000 jobs. The figures are wall times on a
possibly shared machine; the query count is what the tests pin (``tests/*/test_list_queries.py``:
flat as rows grow).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGET_MS = 100.0
BATCH = 5000


def _setup_django():
    """Django on a fresh PostgreSQL database (created here, dropped by the caller)."""
    var = tempfile.mkdtemp(prefix="frp-bench-pages-")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    os.environ["FRP_VAR_DIR"] = var
    os.environ.setdefault("CELERY_BROKER_URL", "memory://")
    import django

    django.setup()
    from django.conf import settings
    from django.db import connection

    if connection.vendor != "postgresql":
        raise SystemExit("benchmarks/pages.py measures PostgreSQL: set DATABASE_URL=postgres://…")
    settings.DEBUG = False
    settings.FRP_LEDGER_KEY_FILE = Path(var) / "ledger" / "signer.key"
    settings.FRP_LEDGER_SIGNER_KEY = ""
    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True)
    return connection, old_name


# --- the rows ---------------------------------------------------------------------------------


def build(*, n_jobs: int, seed: int = 12) -> dict:
    """Fill the database; returns the users and a job the page loop needs."""
    import datetime as dt
    from decimal import Decimal

    from django.contrib.auth import get_user_model
    from django.db import connection, transaction
    from django.utils import timezone

    from accounting.models import (
        BillingEntry,
        BillingKind,
        Invoice,
        JobAccountingStep,
        UsageRecord,
    )
    from federation.models import (
        ComputePool,
        FederatedJob,
        JobSite,
        JobStatus,
        RoundMetric,
        SiteRoundMetric,
    )
    from portal.ledger.leaves import canonical_json
    from portal.ledger.merkle import leaf_hash
    from portal.ledger.models import LedgerEntry
    from portal.models import (
        AuditEvent,
        Institution,
        Membership,
        Project,
        ProjectMember,
        Role,
        Site,
    )
    from sandbox.models import AccessRequest, AccessStatus, Dataset, DatasetVersion

    rng = random.Random(seed)
    User = get_user_model()
    now = timezone.now()
    t0 = time.perf_counter()
    with transaction.atomic():
        insts = Institution.objects.bulk_create(
            Institution(slug=f"inst-{i}", name=f"Institution {i:02d}", email_domain=f"i{i}.example")
            for i in range(10)
        )
        sites = Site.objects.bulk_create(
            Site(institution=inst, slug=f"site-{i}", name=f"Site {i}")
            for i, inst in enumerate(insts)
        )
        ComputePool.objects.bulk_create(ComputePool(site=s, name="default", slots=4) for s in sites)
        users = User.objects.bulk_create(
            User(
                username=f"user{i}",
                first_name=f"First{i}",
                last_name=f"Last{i:04d}",
                email=f"user{i}@i{i % 10}.example",
            )
            for i in range(2000)
        )
        researcher, steward, inst_admin, staff = users[0], users[1], users[2], users[3]
        User.objects.filter(pk=staff.pk).update(is_staff=True, is_superuser=True)
        memberships = [
            Membership(user=u, institution=insts[i % 10], role=Role.RESEARCHER)
            for i, u in enumerate(users)
        ]
        memberships += [
            Membership(user=steward, institution=insts[0], role=Role.DATA_STEWARD),
            Membership(user=inst_admin, institution=insts[0], role=Role.INSTITUTION_ADMIN),
        ]
        Membership.objects.bulk_create(memberships)
        projects = Project.objects.bulk_create(
            Project(slug=f"project-{p}", title=f"Project {p:02d}", institution=insts[p % 10])
            for p in range(50)
        )
        pm = []
        for p, project in enumerate(projects):
            members = {researcher} if p % 2 == 0 else set()
            members |= set(rng.sample(users[4:], 10 - len(members)))
            pm += [
                ProjectMember(project=project, user=u, role="pi" if i == 0 else "member")
                for i, u in enumerate(sorted(members, key=lambda u: u.pk))
            ]
        ProjectMember.objects.bulk_create(pm)
        schema = [{"name": f"x{i}", "type": "float"} for i in range(8)] + [
            {"name": "y", "type": "int"}
        ]
        datasets = Dataset.objects.bulk_create(
            Dataset(
                site=sites[d % 10], slug=f"data-{d}", title=f"Dataset {d:03d}", created_by=steward
            )
            for d in range(200)
        )
        versions = DatasetVersion.objects.bulk_create(
            DatasetVersion(
                dataset=ds,
                version=v,
                schema=schema,
                row_count=1000 + d,
                size_bytes=50_000,
                ciphertext_sha256="0" * 64,
                store_key=f"{ds.slug}/v{v}",
                profile={"columns": []},
            )
            for d, ds in enumerate(datasets)
            for v in (1, 2)
        )
        latest = {v.dataset_id: v for v in versions if v.version == 2}
        statuses = [AccessStatus.APPROVED] * 6 + [AccessStatus.PENDING] * 3 + [AccessStatus.REFUSED]
        AccessRequest.objects.bulk_create(
            AccessRequest(
                dataset=datasets[(p * 20 + k) % 200],
                project=project,
                requested_by=users[4 + p],
                purpose="Federated training of a readmission model.",
                status=statuses[k % len(statuses)],
            )
            for p, project in enumerate(projects)
            for k in range(20)
        )

        final = {
            "eval_accuracy": 0.81,
            "eval_loss": 0.43,
            "model": [[round(rng.random(), 6) for _ in range(9)] for _ in range(2)] + [[0.1, 0.2]],
            "contribution": {f"site-{s}": round(rng.random(), 4) for s in range(3)},
        }
        jobs = FederatedJob.objects.bulk_create(
            (
                FederatedJob(
                    project=projects[j % 50],
                    submitted_by=users[4 + (j % 500)],
                    title=f"Job {j}",
                    status=JobStatus.COMPLETED if j % 20 else JobStatus.FAILED,
                    target_column="y",
                    feature_columns=[f"x{i}" for i in range(8)],
                    num_rounds=10,
                    flower_run_id=str(10**12 + j),
                    final_metrics=final,
                    started_at=now,
                    finished_at=now,
                )
                for j in range(n_jobs)
            ),
            batch_size=BATCH,
        )
        job_sites = []
        for job in jobs:
            for s in rng.sample(range(10), 3):
                ds = datasets[(s + 10 * rng.randrange(20)) % 200]
                job_sites.append(
                    JobSite(
                        job=job,
                        site=sites[s],
                        dataset_version=latest[ds.pk],
                        status="completed",
                        rounds_completed=10,
                    )
                )
        job_sites = JobSite.objects.bulk_create(job_sites, batch_size=BATCH)
        RoundMetric.objects.bulk_create(
            (
                RoundMetric(
                    job=job,
                    round=r,
                    train_loss=0.5,
                    eval_loss=0.45,
                    eval_accuracy=0.8,
                    num_examples=3000,
                    sites_replied=3,
                    wall_seconds=1.0,
                )
                for job in jobs
                for r in range(1, 11)
            ),
            batch_size=BATCH,
        )
        SiteRoundMetric.objects.bulk_create(
            (
                SiteRoundMetric(
                    job_site=js,
                    round=r,
                    train_examples=800,
                    eval_examples=200,
                    train_loss=0.5,
                    eval_loss=0.45,
                    eval_accuracy=0.8,
                    cpu_seconds=0.1,
                    wall_seconds=0.2,
                )
                for js in job_sites
                for r in range(1, 11)
            ),
            batch_size=BATCH,
        )
        UsageRecord.objects.bulk_create(
            (
                UsageRecord(job_id=js.job_id, site_id=js.site_id, rounds=10, cpu_seconds=1.0)
                for js in job_sites
            ),
            batch_size=BATCH,
        )
        months = [dt.date(2024 + m // 12, m % 12 + 1, 1) for m in range(36)]
        invoices = Invoice.objects.bulk_create(
            Invoice(institution=inst, month=m, charges=Decimal("10.00"), total=Decimal("10.00"))
            for inst in insts
            for m in months
        )
        by_inst_month = {(i.institution_id, i.month): i for i in invoices}
        project_inst = {p.pk: p.institution_id for p in projects}
        job_project = {job.pk: job.project_id for job in jobs}
        site_inst = {s.pk: s.institution_id for s in sites}
        entries = []
        for js in job_sites:
            month = months[(js.job_id // 7) % 36]
            payer = project_inst[job_project[js.job_id]]
            payee = site_inst[js.site_id]
            entries += [
                BillingEntry(
                    job_id=js.job_id,
                    site_id=js.site_id,
                    kind=BillingKind.COMPUTE_CHARGE,
                    institution_id=payer,
                    amount=Decimal("1.00"),
                    invoice=by_inst_month[(payer, month)],
                ),
                BillingEntry(
                    job_id=js.job_id,
                    site_id=js.site_id,
                    kind=BillingKind.COMPUTE_CREDIT,
                    institution_id=payee,
                    amount=Decimal("1.00"),
                    invoice=by_inst_month[(payee, month)],
                ),
            ]
        BillingEntry.objects.bulk_create(entries, batch_size=BATCH)
        steps = []
        for j, job in enumerate(jobs):
            for k, step in enumerate(("usage", "contribution", "billing", "credit")):
                failed = j % 20 == 3 and k == 2
                steps.append(
                    JobAccountingStep(
                        job=job,
                        step=step,
                        status="failed" if failed else "done",
                        attempts=1,
                        error="The pool has no price rule in effect." if failed else "",
                    )
                )
        JobAccountingStep.objects.bulk_create(steps, batch_size=BATCH)
        leaves = []
        for n, js in enumerate(job_sites):
            data = canonical_json(
                {"kind": "usage", "job": js.job_id, "site": js.site_id, "cpu_seconds": "1.0"}
            )
            leaves.append(
                LedgerEntry(index=n, kind="usage", data=data.decode(), leaf_hash=leaf_hash(data))
            )
        LedgerEntry.objects.bulk_create(leaves, batch_size=BATCH)
        AuditEvent.objects.bulk_create(
            (
                AuditEvent(
                    actor_id=job.submitted_by_id,
                    institution_id=project_inst[job.project_id],
                    action=action,
                    target_type="job",
                    target_id=str(job.pk),
                    data={"title": job.title},
                )
                for job in jobs
                for action in ("job.submit", "job.launch", "job.finish")
            ),
            batch_size=BATCH,
        )
        # Spread the times as a real history would be (newest job last); bulk_create stamps now().
        with connection.cursor() as cur:
            cur.execute(
                "UPDATE federation_federatedjob SET created_at = now() - (%s - id) * interval "
                "'7 minutes', finished_at = now() - (%s - id) * interval '7 minutes'",
                [jobs[-1].pk, jobs[-1].pk],
            )
            cur.execute(
                "UPDATE portal_auditevent SET created_at = now() - (%s - id) * interval '2 minutes'",
                [AuditEvent.objects.order_by("-pk").values_list("pk", flat=True).first()],
            )
            cur.execute("ANALYZE")
    counts = {
        "jobs": len(jobs),
        "job sites": len(job_sites),
        "round metrics": RoundMetric.objects.count(),
        "site round metrics": SiteRoundMetric.objects.count(),
        "billing entries": len(entries),
        "ledger leaves": len(leaves),
        "audit events": AuditEvent.objects.count(),
        "accounting steps": len(steps),
    }
    return {
        "researcher": researcher,
        "steward": steward,
        "inst_admin": inst_admin,
        "staff": User.objects.get(pk=staff.pk),
        "institution": insts[0],
        "job": jobs[len(jobs) // 2],
        "project": projects[0],
        "dataset": datasets[0],
        "invoice": by_inst_month[(insts[0].pk, months[-1])],
        "counts": counts,
        "seconds": time.perf_counter() - t0,
    }


# --- main's query shape, for the before/after ratio -------------------------------------------


def jobs_for_user_main(*, user):
    """``federation.selectors.jobs_for_user`` as it was on main before issue 12 (the baseline)."""
    from django.db.models import Count, Q

    from federation.models import FederatedJob
    from portal.models import Membership, Role
    from portal.selectors import projects_for_user

    if user.is_staff:
        visible = FederatedJob.objects.all()
    else:
        roles = Membership.objects.filter(user=user)
        part_of = roles.filter(role__in=[Role.DATA_STEWARD, Role.INSTITUTION_ADMIN])
        admin_of = roles.filter(role=Role.INSTITUTION_ADMIN)
        visible = FederatedJob.objects.filter(
            Q(project__in=projects_for_user(user=user))
            | Q(sites__site__institution__in=part_of.values("institution"))
            | Q(project__institution__in=admin_of.values("institution"))
        ).distinct()
    return (
        visible.select_related("project", "submitted_by")
        .annotate(
            n_rounds=Count("round_metrics", distinct=True), n_sites=Count("sites", distinct=True)
        )
        .order_by("-created_at", "-id")
    )


# --- timing -----------------------------------------------------------------------------------


def pages(world: dict) -> list[tuple[str, str, str]]:
    """``(who, label, url)`` of every list page (and the job page, the reference)."""
    slug = world["institution"].slug
    return [
        ("researcher", "job page (reference)", f"/jobs/{world['job'].pk}/"),
        ("researcher", "dashboard", "/"),
        ("researcher", "jobs", "/jobs/"),
        ("researcher", "jobs, last page", "/jobs/?page=last"),
        ("researcher", "datasets", "/datasets/"),
        ("researcher", "dataset page (grants, versions)", f"/datasets/{world['dataset'].pk}/"),
        ("researcher", "projects", "/projects/"),
        (
            "researcher",
            "project page (members, grants, jobs)",
            f"/projects/{world['project'].slug}/",
        ),
        ("researcher", "ledger", "/ledger/"),
        ("steward", "jobs", "/jobs/"),
        ("steward", "access requests", "/access-requests/"),
        ("steward", "access requests, pending", "/access-requests/?status=pending"),
        ("inst_admin", "jobs", "/jobs/"),
        ("inst_admin", "institution members", f"/institutions/{slug}/members/"),
        ("inst_admin", "institution sites", f"/institutions/{slug}/sites/"),
        ("inst_admin", "institution audit", f"/institutions/{slug}/audit/"),
        (
            "inst_admin",
            "institution billing (invoices)",
            f"/accounting/institutions/{slug}/billing/",
        ),
        ("inst_admin", "invoice page (lines)", f"/accounting/invoices/{world['invoice'].pk}/"),
        ("inst_admin", "institution prices", f"/accounting/institutions/{slug}/prices/"),
        ("inst_admin", "institution accounting", f"/accounting/institutions/{slug}/jobs/"),
        ("staff", "jobs", "/jobs/"),
        ("staff", "accounting failures", "/accounting/jobs/"),
        ("staff", "admin: jobs", "/admin/federation/federatedjob/"),
        ("staff", "admin: accounting steps", "/admin/accounting/jobaccountingstep/"),
        ("staff", "admin: audit events", "/admin/portal/auditevent/"),
        ("staff", "admin: memberships", "/admin/portal/membership/"),
        ("staff", "admin: access requests", "/admin/sandbox/accessrequest/"),
    ]


def time_page(client, url: str, *, warmup: int, requests: int, show: bool = False) -> dict:
    """Wall times (ms) of ``requests`` GETs after ``warmup``; queries and bytes of the last."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    for _ in range(warmup):
        client.get(url)
    times = []
    for _ in range(requests):
        t = time.perf_counter()
        response = client.get(url)
        times.append((time.perf_counter() - t) * 1000)
        if response.status_code != 200:
            raise SystemExit(f"{url} answered {response.status_code}")
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    times.sort()
    if show:
        print(f"--- {url}: {len(queries.captured_queries)} queries")
        for q in sorted(queries.captured_queries, key=lambda q: -float(q["time"]))[:3]:
            print(f"    {float(q['time']) * 1000:7.1f} ms  {q['sql'][:300]}")
    return {
        "p50": statistics.median(times),
        "p95": times[min(len(times) - 1, int(round(0.95 * (len(times) - 1))))],
        "queries": len(queries.captured_queries),
        "kb": len(response.content) / 1024,
    }


def explain(world: dict) -> None:
    from django.core.paginator import Paginator
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from federation import selectors

    for who in ("researcher", "inst_admin", "staff"):
        with CaptureQueriesContext(connection) as q:
            page = Paginator(selectors.jobs_for_user(user=world[who]), 20).get_page(1)
            list(page)
        for sql in q.captured_queries:
            with connection.cursor() as cur:
                cur.execute("EXPLAIN ANALYZE " + sql["sql"])
                print(f"--- {who}: {sql['sql'][:200]}")
                print("\n".join(r[0] for r in cur.fetchall()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--explain", action="store_true")
    parser.add_argument(
        "--queries", action="store_true", help="print each page's three slowest queries"
    )
    args = parser.parse_args()

    connection, old_name = _setup_django()
    try:
        from django.test import Client

        from federation import selectors, views

        world = build(n_jobs=args.jobs)
        print(
            f"PostgreSQL {connection.pg_version // 10000}, database {connection.settings_dict['NAME']}"
            f" built in {world['seconds']:.1f} s: "
            + ", ".join(f"{v:,} {k}" for k, v in world["counts"].items())
        )
        if args.explain:
            explain(world)
        clients = {}
        for who in ("researcher", "steward", "inst_admin", "staff"):
            clients[who] = Client()
            clients[who].force_login(world[who])
        rows = []
        for who, label, url in pages(world):
            rows.append(
                (
                    who,
                    label,
                    url,
                    time_page(
                        clients[who],
                        url,
                        warmup=args.warmup,
                        requests=args.requests,
                        show=args.queries,
                    ),
                )
            )
        ref = rows[0][3]["p95"]
        print(
            f"\n{args.requests} requests per page after {args.warmup} untimed; wall ms of the whole "
            f"request (Django test client); ratio = p95 / p95 of the job page ({ref:.1f} ms)\n"
        )
        head = f"{'signed in as':<11} {'page':<38} {'p50 ms':>7} {'p95 ms':>7} {'ratio':>6} {'queries':>7} {'kB':>6}  target"
        print(head)
        print("-" * len(head))
        worst = 0.0
        for who, label, _url, r in rows:
            ok = "ok" if r["p95"] < TARGET_MS else "OVER"
            if label != "job page (reference)":
                worst = max(worst, r["p95"])
            print(
                f"{who:<11} {label:<38} {r['p50']:7.1f} {r['p95']:7.1f} {r['p95'] / ref:6.2f} "
                f"{r['queries']:7d} {r['kb']:6.1f}  {ok}"
            )
        print(f"\nslowest list page p95: {worst:.1f} ms (target < {TARGET_MS:.0f} ms)")

        # Before/after on the same rows: main's job-list query shape swapped in.
        print("\n/jobs/ with main's query shape (SELECT DISTINCT + two Count(distinct)) vs now:\n")
        print(
            f"{'signed in as':<11} {'before p50':>10} {'before p95':>10} {'now p95':>8} {'now/before':>10}"
        )
        now = {(who, label): r for who, label, _, r in rows}
        current = selectors.jobs_for_user
        try:
            selectors.jobs_for_user = jobs_for_user_main
            for who in ("researcher", "inst_admin", "staff"):
                r = time_page(clients[who], "/jobs/", warmup=args.warmup, requests=args.requests)
                after = now[(who, "jobs")]["p95"]
                print(
                    f"{who:<11} {r['p50']:10.1f} {r['p95']:10.1f} {after:8.1f} "
                    f"{after / r['p95']:10.3f}"
                )
        finally:
            selectors.jobs_for_user = current
        assert views.selectors is selectors
    finally:
        from django.db import connections

        for c in connections.all():
            c.close()
        connection.creation.destroy_test_db(old_name, verbosity=0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
