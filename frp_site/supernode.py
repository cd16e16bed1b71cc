"""The SuperNode's command line: one builder for the site tool, the local runtime and the compose file.

``command`` returns the ``flower-supernode`` argument list for flwr 1.42.0 (flags checked against
``flower-supernode --help``): TLS verified with the platform CA (``--root-certificates``), node
authentication with the site's own key (``--auth-supernode-private-key``), and the node config
the ClientApp reads (``site``, ``store``, ``keyring``; ``node_config_text`` quotes each value as a
TOML basic string, which is what ``--node-config`` parses). ``insecure=True`` gives ``--insecure``
instead of a CA (development only).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path


def node_config_text(config: Mapping[str, str | int | float | bool]) -> str:
    """``--node-config``'s value: space-separated ``key=value`` pairs, strings TOML-quoted."""
    parts = []
    for key, value in config.items():
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, int | float):
            text = repr(value)
        else:
            text = json.dumps(str(value))  # a JSON string is a valid TOML basic string
        parts.append(f"{key}={text}")
    return " ".join(parts)


def command(
    superlink: str,
    *,
    node_config: Mapping[str, str | int | float | bool],
    ca_cert: str | Path | None,
    auth_key: str | Path | None,
    port: int | None = None,
    host: str = "127.0.0.1",
    executable: str = "flower-supernode",
    insecure: bool = False,
    extra: list[str] | None = None,
) -> list[str]:
    """The ``flower-supernode`` command dialling ``superlink`` (``host:port``).

    ``port``: the SuperNode's own runtime API port on ``host`` (loopback; one per SuperNode on a
    host). Raises ``ValueError`` when TLS is asked for without a CA certificate.
    """
    if insecure:
        tls = ["--insecure"]
    elif not ca_cert:
        raise ValueError(
            "a SuperNode needs the platform's CA certificate (or --insecure in development)"
        )
    else:
        tls = [f"--root-certificates={ca_cert}"]
    args = [executable, *tls, f"--superlink={superlink}"]
    if auth_key:
        args.append(f"--auth-supernode-private-key={auth_key}")
    if port is not None:
        args += [f"--host={host}", f"--port={port}"]
    args.append(f"--node-config={node_config_text(node_config)}")
    return args + list(extra or [])
