"""Helpers for the fault tests (``test_fault_*.py``): a job submitted into a real world, its state
read from the database, its pages as a user sees them, processes found through /proc.

Every wait is on a condition with a generous bound (``conftest.wait_for``); nothing sleeps to
synchronise.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from django.test import Client

from federation import services, superlink
from federation.models import FederatedJob, RoundMetric
from tests.federation.conftest import wait_for


def submit(world, *, title: str, num_rounds: int, **kw) -> FederatedJob:
    """Submit a job with every site of ``world`` (the worker launches it)."""
    return services.job_submit(
        by=world.researcher,
        project=world.project,
        dataset_versions=world.versions,
        title=title,
        target_column="diagnosis",
        num_rounds=num_rounds,
        local_epochs=kw.pop("local_epochs", 1),
        learning_rate=0.1,
        **kw,
    )


def job(pk: int) -> FederatedJob:
    return FederatedJob.objects.get(pk=pk)


def wait_round(pk: int, rnd: int, *, timeout: float = 300) -> None:
    wait_for(
        lambda: RoundMetric.objects.filter(job_id=pk, round=rnd).exists(),
        timeout=timeout,
        what=f"round {rnd} of job {pk}",
    )


def wait_terminal(pk: int, *, timeout: float, world=None) -> FederatedJob:
    def done():
        j = job(pk)
        return j if j.is_terminal else None

    try:
        return wait_for(done, timeout=timeout, what=f"job {pk} to end")
    except BaseException:
        if world is not None:  # say what the worker saw
            print(world.worker_log.read_text(errors="replace")[-4000:])
        raise


def page(user, url: str) -> str:
    client = Client()
    client.force_login(user)
    response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    return response.content.decode()


def connection() -> superlink.Connection:
    return services.superlink_connection()


def runs_of(pk: int) -> list[superlink.RunStatus]:
    """Every run on the SuperLink whose run config names job ``pk``."""
    return [
        r for r in superlink.runs_list(connection(), limit=1000) if r.run_config.get("job-id") == pk
    ]


def children_of(pid: int) -> list[int]:
    """Pids whose parent is ``pid`` (from /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out.append(int(entry.name))
    return out


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def is_sentence(text: str) -> bool:
    """Starts with a capital letter, ends with a full stop, carries no Python class repr."""
    return bool(text) and text[0].isupper() and text.rstrip().endswith(".") and "<class" not in text


def descendants(pid: int) -> list[int]:
    """Every process under ``pid`` (children, their children, …), from /proc."""
    out, todo = [], [pid]
    while todo:
        kids = children_of(todo.pop())
        out += kids
        todo += kids
    return out


def freeze_sites(world) -> list[int]:
    """SIGSTOP every SuperNode of ``world`` with its SuperExec and ClientApps; their pids (for
    ``thaw``). A process that ends between the listing and the signal is skipped."""
    frozen = []
    for pid in world.federation.supernodes.values():
        for p in [pid, *descendants(pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGSTOP)
                frozen.append(p)
    return frozen


def thaw(pids: list[int]) -> None:
    """SIGCONT the processes ``freeze_sites`` stopped (those still there)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
