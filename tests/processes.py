"""Stopping a server process a test started."""

from __future__ import annotations

import subprocess


def stop(process: subprocess.Popen, timeout: float = 30.0) -> None:
    """SIGTERM ``process``, SIGKILL it if it has not exited within ``timeout`` seconds; reap."""
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=timeout)
