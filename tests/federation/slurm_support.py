"""A real Slurm cluster of one node on loopback for tests: Debian's ``slurm-wlm`` and ``munge``.

``slurm_cluster(tmp)`` writes a slurm.conf under ``tmp`` (cluster ``frptest``, controller and
node ``localhost`` on 127.0.0.1, ports picked by the OS, state/spool/logs under ``tmp``,
``proctrack/linuxproc``, ``task/none``, ``select/cons_tres``, ``auth/munge`` with a fresh key and
its own munged socket), starts munged, ``slurmctld -D`` and ``slurmd -D -N localhost`` as child
processes, waits until ``sinfo`` reports the node idle, and stops all three (and any job) after.
The node is declared with ``CPUS`` cores and ``MEMORY_MIB`` MiB whatever the machine has
(``SlurmdParameters=config_overrides``), so readings are the same on every machine.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

BINARIES = ("munged", "slurmctld", "slurmd", "scontrol", "sinfo", "sbatch", "scancel")
SBIN_PATH = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
PARTITION = "frp"
CPUS = 2
MEMORY_MIB = 1024
#: Generous bound for the daemons to come up or a state change to show (seconds).
WAIT_SECONDS = 60.0


def missing_binaries() -> list[str]:
    """The programs of ``BINARIES`` not installed (apt-get install slurm-wlm munge)."""
    return [b for b in BINARIES if shutil.which(b, path=SBIN_PATH) is None]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class SlurmCluster:
    root: Path
    conf: Path
    env: dict
    procs: dict[str, subprocess.Popen]
    partition: str = PARTITION

    def run(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
        """Run a Slurm client command against this cluster (``SLURM_CONF`` set)."""
        done = subprocess.run(
            list(cmd), env=self.env, capture_output=True, text=True, timeout=30, check=False
        )
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} failed: {done.stderr or done.stdout}")
        return done

    def node_state(self) -> str:
        """``sinfo``'s long state of the node (``idle``, ``mixed``, ``drained`` …)."""
        out = self.run("sinfo", "-h", "-N", "-p", self.partition, "-o", "%T", check=False)
        return out.stdout.strip() if out.returncode == 0 else ""

    def wait(self, predicate: Callable[[], bool], what: str, timeout: float = WAIT_SECONDS):
        """Poll ``predicate`` until true; fail after ``timeout`` s naming ``what`` and the logs."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise AssertionError(f"{name} exited ({proc.returncode}):\n{self.logs()}")
            time.sleep(0.2)
        raise AssertionError(f"timed out after {timeout:g} s waiting for {what}:\n{self.logs()}")

    def logs(self) -> str:
        out = []
        for path in sorted((self.root / "log").glob("*")):
            text = path.read_text(errors="replace").splitlines()[-15:]
            out.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(out)


def _conf_text(root: Path, ctld_port: int, d_port: int, sock: Path) -> str:
    return f"""# written by tests/federation/slurm_support.py
ClusterName=frptest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={sock}
CredType=cred/munge
MailProg=/bin/true
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName=localhost NodeAddr=127.0.0.1 CPUs={CPUS} RealMemory={MEMORY_MIB} State=UNKNOWN
PartitionName={PARTITION} Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the process group, SIGKILL it after 15 s; reap."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)


@contextlib.contextmanager
def slurm_cluster(root: Path) -> Iterator[SlurmCluster]:
    """Start munged, slurmctld and slurmd under ``root``; yield the cluster; stop them all."""
    for sub in ("state", "spool", "log", "munge"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    munge_dir = root / "munge"
    munge_dir.chmod(0o700)
    key = munge_dir / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    sock = munge_dir / "munge.socket"
    conf = root / "slurm.conf"
    conf.write_text(_conf_text(root, _free_port(), _free_port(), sock))
    env = {**os.environ, "SLURM_CONF": str(conf), "PATH": SBIN_PATH}
    procs: dict[str, subprocess.Popen] = {}
    cluster = SlurmCluster(root=root, conf=conf, env=env, procs=procs)

    def start(name: str, *cmd: str) -> None:
        log = open(root / "log" / f"{name}.out", "wb")  # noqa: SIM115 - closed with the process
        procs[name] = subprocess.Popen(
            list(cmd), env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()

    try:
        start(
            "munged",
            "munged",
            "--foreground",
            "--force",
            f"--key-file={key}",
            f"--socket={sock}",
            f"--pid-file={munge_dir / 'munged.pid'}",
            f"--log-file={root / 'log' / 'munged.log'}",
            f"--seed-file={munge_dir / 'munged.seed'}",
        )
        cluster.wait(sock.exists, "munged's socket")
        start("slurmctld", "slurmctld", "-D", "-f", str(conf))
        start("slurmd", "slurmd", "-D", "-N", "localhost", "-f", str(conf))
        cluster.wait(lambda: cluster.node_state() == "idle", "sinfo to report the node idle")
        yield cluster
    finally:
        if "slurmctld" in procs and procs["slurmctld"].poll() is None:
            cluster.run("scancel", "--partition", PARTITION, check=False)
        for name in ("slurmd", "slurmctld", "munged"):
            if name in procs:
                _stop(procs[name])
