"""Pages at scale: every list page of the portal timed at 10,000 jobs on PostgreSQL (issue 12).

Run from the repository root (3–6 minutes on a 2-CPU machine; PostgreSQL on 127.0.0.1, as the
test suite uses it, or ``DATABASE_URL``)::

    .venv/bin/python benchmarks/pages.py [--jobs 10000] [--requests 30] [--explain] [--reuse NAME]

What it does, all in this one process:

1. creates a throwaway PostgreSQL database (``connection.creation.create_test_db``: migrated from
   scratch, dropped at the end, also on failure) and fills it with ``bulk_create``
   (``tests.scale_world.build``, which the query-count tests share): 10 institutions
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
   queries, template), the median CPU time of this process per request (the Django side, less
   sensitive to other load on the machine than wall time), the queries' own wall time, the number
   of SQL queries and the response size; every page must answer 200. The ratio column is p95 / the p95 of the job page (``/jobs/<pk>/``, one job with its sites
   and rounds), the reference the issue names (30–60 ms);
4. prints the same for ``/jobs/`` with main's query shape before this change (``SELECT DISTINCT``
   with two ``Count(distinct)`` annotations, and the paginator's ``COUNT(*)`` over it), swapped in
   for the selector in this process: the before/after ratio on the same rows.

``--reuse NAME`` keeps the database, named ``NAME``, instead of dropping it, and on the next run
with the same name takes the world found there (``tests.scale_world.find``) rather than building
it again: the build is most of a run's 3–6 minutes. The kept database is migrated at every run
(new indexes apply; a migration that changes the rows ``build`` wrote needs a fresh one, and so
does another ``--jobs``); drop it with ``dropdb NAME``.

``--explain`` prints PostgreSQL's ``EXPLAIN ANALYZE`` of the job list's queries.

Target (issue 12): every list page p95 < 100 ms at 10,000 jobs. The figures are wall times on a
possibly shared machine (the load average is printed); the query count is what the tests pin
(``tests/portal/test_list_queries.py``: flat as rows grow).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGET_MS = 100.0
BATCH = 5000


def _setup_django(reuse: str = ""):
    """Django on a fresh PostgreSQL database (created here, dropped by the caller), or on the
    database named ``reuse`` (created if missing, migrated, kept)."""
    var = tempfile.mkdtemp(prefix="frp-bench-pages-")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    os.environ["FRP_VAR_DIR"] = var
    os.environ.setdefault("CELERY_BROKER_URL", "memory://")
    # PostgreSQL settings need a shared cache (portal.settings refuses local memory there): the
    # Redis server the tests use, as a deployment would (CACHE_URL overrides it)
    os.environ.setdefault("CACHE_URL", "redis://127.0.0.1:6379/12")
    import django

    django.setup()
    from django.conf import settings
    from django.db import connection

    if connection.vendor != "postgresql":
        raise SystemExit("benchmarks/pages.py measures PostgreSQL: set DATABASE_URL=postgres://…")
    settings.DEBUG = False
    settings.FRP_LEDGER_KEY_FILE = Path(var) / "ledger" / "signer.key"
    settings.FRP_LEDGER_SIGNER_KEY = ""
    if reuse:
        settings.DATABASES["default"].setdefault("TEST", {})["NAME"] = reuse
        connection.settings_dict.setdefault("TEST", {})["NAME"] = reuse
    old_name = connection.creation.create_test_db(
        verbosity=0, autoclobber=True, serialize=False, keepdb=bool(reuse)
    )
    return connection, old_name


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


def _load() -> str:
    try:
        return (
            " ".join(Path("/proc/loadavg").read_text().split()[:3]) + f" on {os.cpu_count()} CPUs"
        )
    except OSError:
        return "unknown"


def time_page(client, url: str, *, warmup: int, requests: int, show: bool = False) -> dict:
    """Wall times (ms) of ``requests`` GETs after ``warmup``; queries and bytes of the last."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    for _ in range(warmup):
        client.get(url)
    times, cpu = [], []
    for _ in range(requests):
        t, c = time.perf_counter(), time.process_time()
        response = client.get(url)
        times.append((time.perf_counter() - t) * 1000)
        cpu.append((time.process_time() - c) * 1000)
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
        "cpu": statistics.median(cpu),
        "sql": sum(float(q["time"]) for q in queries.captured_queries) * 1000,
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
        "--reuse",
        metavar="NAME",
        default="",
        help="keep the database NAME and take the world already built there on later runs",
    )
    parser.add_argument(
        "--queries", action="store_true", help="print each page's three slowest queries"
    )
    args = parser.parse_args()

    connection, old_name = _setup_django(args.reuse)
    try:
        from django.test import Client

        from federation import selectors, views
        from tests.scale_world import build, find, list_pages

        world = find() if args.reuse else None
        if world is None:
            world = build(n_jobs=args.jobs)
        elif world["counts"]["jobs"] != args.jobs:
            raise SystemExit(
                f"{args.reuse} holds {world['counts']['jobs']:,} jobs, not {args.jobs:,}: "
                f"dropdb {args.reuse}, or pass --jobs {world['counts']['jobs']}"
            )
        print(
            f"PostgreSQL {connection.pg_version // 10000}, database {connection.settings_dict['NAME']}"
            f" built in {world['seconds']:.1f} s: "
            + ", ".join(f"{v:,} {k}" for k, v in world["counts"].items())
            + f"; load average {_load()}"
        )
        if args.explain:
            explain(world)
        clients = {}
        for who in ("researcher", "steward", "inst_admin", "staff"):
            clients[who] = Client()
            clients[who].force_login(world[who])
        rows = []
        for who, label, url in list_pages(world):
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
        head = (
            f"{'signed in as':<11} {'page':<38} {'p50 ms':>7} {'p95 ms':>7} {'ratio':>6} "
            f"{'cpu ms':>6} {'sql ms':>6} {'queries':>7} {'kB':>6}  target"
        )
        print(head)
        print("-" * len(head))
        worst = 0.0
        for who, label, _url, r in rows:
            ok = "ok" if r["p95"] < TARGET_MS else "OVER"
            if label != "job page (reference)":
                worst = max(worst, r["p95"])
            print(
                f"{who:<11} {label:<38} {r['p50']:7.1f} {r['p95']:7.1f} {r['p95'] / ref:6.2f} "
                f"{r['cpu']:6.1f} {r['sql']:6.1f} {r['queries']:7d} {r['kb']:6.1f}  {ok}"
            )
        print(f"\nslowest list page p95: {worst:.1f} ms (target < {TARGET_MS:.0f} ms)")
        print(
            "cpu ms: median CPU time of this process per request (Django: middleware, ORM, "
            "templates); sql ms: the queries' wall time in one request (PostgreSQL and the "
            f"round trips). Load average at the end: {_load()}"
        )

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
        connection.creation.destroy_test_db(old_name, verbosity=0, keepdb=bool(args.reuse))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
