"""docker/ without Docker: what the images and the compose files rely on exists and agrees
with the code. docker/test.sh builds and runs them for real (docs/docker.md)."""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from crashdrill.server import serve_cli
from tests.support.lab import free_port
from tests.support.quickstart import quickstart

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
DOCKERFILES = sorted(DOCKER.glob("*.Dockerfile"))
COMPOSE_FILES = [DOCKER / "compose.yaml", DOCKER / "compose.hostnet.yaml"]


def compose(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))
    return data


def with_defaults(words: list[str]) -> list[str]:
    """Compose's ${VAR:-default} as the default (what runs when VAR is unset)."""
    return [re.sub(r"\$\{[A-Z0-9_]+:-([^}]*)\}", r"\1", w) for w in words]


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"^\s*#.*\n", "", dockerfile.read_text(encoding="utf-8"), flags=re.M)
    text = text.replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


class Health(BaseHTTPRequestHandler):
    answer: tuple[int, dict[str, Any]] = (200, {"ready": True})

    def do_GET(self) -> None:
        status, body = self.answer
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def health_server() -> Iterator[HTTPServer]:
    server = HTTPServer(("127.0.0.1", 0), Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def probe(url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(DOCKER / "healthcheck.py")],
        env={"CRASHDRILL_HEALTH_URL": url, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_the_image_healthcheck_passes_only_while_the_lab_says_ready(
    health_server: HTTPServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"http://127.0.0.1:{health_server.server_address[1]}/api/health"
    monkeypatch.setattr(Health, "answer", (200, {"ready": True, "database": "postgres"}))
    assert probe(url).returncode == 0
    monkeypatch.setattr(Health, "answer", (503, {"detail": "the lab's database is unreachable"}))
    assert probe(url).returncode == 1
    monkeypatch.setattr(Health, "answer", (200, {"ready": False}))
    assert probe(url).returncode == 1
    closed = free_port()  # a port that nothing listens on
    refused = probe(f"http://127.0.0.1:{closed}/api/health")
    assert refused.returncode == 1 and "not ready" in refused.stderr


def test_the_healthcheck_asks_the_route_the_server_has() -> None:
    from starlette.routing import Route

    from crashdrill.server.api.health import router

    source = (DOCKER / "healthcheck.py").read_text(encoding="utf-8")
    url = re.search(r'DEFAULT_URL = "http://127\.0\.0\.1:8000(/[^"]+)"', source)
    assert url is not None
    assert url.group(1) in {route.path for route in router.routes if isinstance(route, Route)}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_every_file_a_dockerfile_copies_exists_and_the_build_context_lets_it_through(
    dockerfile: Path,
) -> None:
    allowed = [
        line[1:].rstrip("/")
        for line in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.startswith("!")
    ]
    missing, ignored = [], []
    for word, args in instructions(dockerfile):
        if word != "COPY" or args.startswith("--from"):
            continue
        *sources, _dest = shlex.split(args)
        for source in sources:
            if not (ROOT / source).exists():
                missing.append(source)
            if not any(source.rstrip("/") == a or source.startswith(a + "/") for a in allowed):
                ignored.append(source)
    assert not missing, f"{dockerfile.name} copies what does not exist: {missing}"
    assert not ignored, f"{dockerfile.name} copies what .dockerignore leaves out: {ignored}"


def test_the_server_image_runs_crashdrill_serve_with_arguments_it_accepts() -> None:
    steps = dict(instructions(DOCKER / "server.Dockerfile"))
    entrypoint, cmd = json.loads(steps["ENTRYPOINT"]), json.loads(steps["CMD"])
    assert entrypoint[0] == "tini" and entrypoint[-2:] == ["crashdrill", "serve"]
    parser = argparse.ArgumentParser()
    serve_cli._add_arguments(parser)
    assert parser.parse_args(cmd).host == "0.0.0.0"
    hostnet = compose(DOCKER / "compose.hostnet.yaml")["services"]["lab"]["command"]
    args = parser.parse_args(with_defaults(hostnet))
    assert (args.host, args.port) == ("127.0.0.1", 8001)  # behind lab-proxy on 8000


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda p: p.name)
def test_every_crashdrill_variable_the_compose_files_give_the_server_is_one_it_reads(
    path: Path,
) -> None:
    read = (ROOT / "server" / "settings.py").read_text(encoding="utf-8")
    for declared in sorted((ROOT / "server" / "settings_sections").glob("*.py")):
        read += declared.read_text(encoding="utf-8")
    read += (DOCKER / "healthcheck.py").read_text(encoding="utf-8")
    services = compose(path)["services"]
    env = services["server" if "server" in services else "lab"]["environment"]
    names = [n for n in env if n.startswith("CRASHDRILL_")]
    assert names
    unread = [n for n in names if f'"{n}"' not in read]
    assert not unread, f"{path.name} sets variables nothing reads: {unread}"


def test_the_compose_stack_shares_one_mirror_volume_between_the_server_and_every_worker() -> None:
    services = compose(DOCKER / "compose.yaml")["services"]
    mirror = services["server"]["environment"]["CRASHDRILL_MIRROR"]
    assert mirror == "${CRASHDRILL_MIRROR:-/mirror}"
    for name in ("server", "worker", "worker-gpu"):
        assert "mirror:/mirror" in services[name]["volumes"], name
    assert "${CRASHDRILL_POSTGRES_PASSWORD:?" in services["db"]["environment"]["POSTGRES_PASSWORD"]


def test_the_server_and_the_worker_image_install_torch_with_the_same_lines() -> None:
    """Two builds with one BASE and torch then share the layer (docker/test.sh builds both)."""

    def torch_stage(dockerfile: str) -> list[str]:
        lines = (DOCKER / dockerfile).read_text(encoding="utf-8").splitlines()
        start = lines.index("FROM ${BASE} AS build")
        end = next(i for i in range(start, len(lines)) if lines[i].startswith("ARG EXTRAS="))
        return lines[start:end]  # TORCH_INDEX's default is set above the first FROM

    server = torch_stage("server.Dockerfile")
    assert any("pip install" in line for line in server)
    assert server == torch_stage("worker.Dockerfile")


@pytest.mark.parametrize("dockerfile", ["server.Dockerfile", "worker.Dockerfile"])
def test_the_images_install_every_package_but_torch_at_the_locked_versions(dockerfile: str) -> None:
    """The lock of every extra is the constraints of the image's install, so whatever EXTRAS
    names comes at the versions the tests passed with; no version is written in the
    Dockerfile beside it but torch's own (which the lock leaves to the machine)."""
    runs = [args for word, args in instructions(DOCKER / dockerfile) if word == "RUN"]
    installs = [r for r in runs if '".[${EXTRAS}]"' in r]
    assert len(installs) == 1, installs
    words = shlex.split(installs[0].split("pip install", 1)[1].split(";", 1)[0])
    assert words == ["-c", "requirements/test.txt", "-r", "requirements/torch.in", ".[${EXTRAS}]"]
    copied = [args for word, args in instructions(DOCKER / dockerfile) if word == "COPY"]
    assert "requirements/test.txt requirements/torch.in requirements/" in copied
    pins = re.findall(r"[A-Za-z0-9_.\[\]-]+==[0-9][^\s\"']*", (DOCKER / dockerfile).read_text())
    assert pins == ["torch==2.13.0"], f"versions the lock should hold: {pins}"
    qs = quickstart()
    assert qs.lock_problem("test") is None  # compiled from pyproject's extras as they are
    default = next(a for w, a in instructions(DOCKER / dockerfile) if a.startswith("EXTRAS="))
    chosen = [default.split("=", 1)[1]]
    if dockerfile == "server.Dockerfile":
        chosen.append(
            compose(DOCKER / "compose.yaml")["services"]["server"]["build"]["args"]["EXTRAS"]
        )
    for extras in chosen:  # the lock pins what each build's extras bring
        assert set(extras.split(",")) <= set(qs.INSTALL_SETS["test"]), extras


def proxy_env(service: dict[str, Any]) -> dict[str, str]:
    return {k: v for k, v in service["environment"].items() if k.startswith("CRASHDRILL_PROXY_")}


def test_the_lab_believes_forwarded_addresses_from_its_proxy_alone() -> None:
    """compose.yaml: only the proxy is published, from the address the lab trusts, pinned
    on the stack's network; compose.hostnet.yaml: the proxy reaches the lab from 127.0.0.2,
    the one address the lab trusts, so a local client going to the lab's port is not it."""
    import ipaddress

    stack = compose(DOCKER / "compose.yaml")
    services = stack["services"]
    assert "ports" not in services["server"], "the lab must be reached through the proxy"
    trusted = with_defaults([services["server"]["environment"]["CRASHDRILL_TRUSTED_PROXIES"]])
    pinned = with_defaults([services["proxy"]["networks"]["default"]["ipv4_address"]])
    ipam = stack["networks"]["default"]["ipam"]["config"][0]
    subnet, dynamic = with_defaults([ipam["subnet"], ipam["ip_range"]])
    assert trusted == pinned
    proxy_address = ipaddress.ip_address(pinned[0])
    assert proxy_address in ipaddress.ip_network(subnet)
    network, within = ipaddress.ip_network(subnet), ipaddress.ip_network(dynamic)
    assert isinstance(network, ipaddress.IPv4Network) and isinstance(within, ipaddress.IPv4Network)
    assert within.subnet_of(network)
    assert proxy_address not in ipaddress.ip_network(dynamic), "Docker could give it away"
    assert with_defaults(services["proxy"]["ports"]) == ["127.0.0.1:8000:8080"]
    assert proxy_env(services["proxy"])["CRASHDRILL_PROXY_UPSTREAM"] == "server:8000"

    host = compose(DOCKER / "compose.hostnet.yaml")["services"]
    lab, proxy = host["lab"], proxy_env(host["lab-proxy"])
    assert lab["environment"]["CRASHDRILL_TRUSTED_PROXIES"] == proxy["CRASHDRILL_PROXY_SOURCE"]
    lab_port = with_defaults(lab["command"])[lab["command"].index("--port") + 1]
    assert with_defaults([proxy["CRASHDRILL_PROXY_UPSTREAM"]]) == [f"127.0.0.1:{lab_port}"]
    assert with_defaults([proxy["CRASHDRILL_PROXY_LISTEN"]]) == ["127.0.0.1:8000"]
    assert lab_port in with_defaults([lab["environment"]["CRASHDRILL_HEALTH_URL"]])[0]


def test_every_variable_the_compose_files_give_the_proxy_is_one_its_entrypoint_reads() -> None:
    entrypoint = (DOCKER / "proxy-entrypoint.sh").read_text(encoding="utf-8")
    given = {
        name
        for path, service in [
            (DOCKER / "compose.yaml", "proxy"),
            (DOCKER / "compose.hostnet.yaml", "lab-proxy"),
        ]
        for name in proxy_env(compose(path)["services"][service])
    }
    assert "CRASHDRILL_PROXY_TLS" in given
    unread = sorted(n for n in given if n not in entrypoint)
    assert not unread, f"the compose files give the proxy variables nothing reads: {unread}"


def test_every_placeholder_of_the_proxy_template_is_filled_in_by_its_entrypoint() -> None:
    template = (DOCKER / "proxy-nginx.conf").read_text(encoding="utf-8")
    entrypoint = (DOCKER / "proxy-entrypoint.sh").read_text(encoding="utf-8")
    names = set(re.findall(r"@([A-Z_]+)@", template))
    assert {"LISTEN", "UPSTREAM", "CONNECTIONS_PER_ADDRESS", "TLS_LINES"} <= names
    unfilled = sorted(n for n in names if f"@{n}@" not in entrypoint)
    assert not unfilled, f"placeholders the entrypoint leaves in nginx.conf: {unfilled}"


def test_the_proxy_passes_every_event_stream_of_the_lab_unbuffered() -> None:
    """The template's unbuffered location matches each streaming route, and no other."""
    from starlette.responses import StreamingResponse

    from crashdrill.server.api import health, instructor, live, pairs, runs

    template = (DOCKER / "proxy-nginx.conf").read_text(encoding="utf-8")
    found = re.search(r"location ~ (\S+) \{\n((?:.*\n)*?)\s*\}", template)
    assert found is not None and "proxy_buffering off;" in found.group(2)
    unbuffered = re.compile(found.group(1))
    paths = {
        route.path: getattr(route, "response_class", None)
        for module in (health, instructor, live, pairs, runs)
        for route in module.router.routes
    }
    streams = {
        p
        for p, cls in paths.items()
        if isinstance(cls, type) and issubclass(cls, StreamingResponse)
    }
    assert streams, "no streaming route found"
    assert all(unbuffered.match(p) for p in streams), streams
    others = [p for p in paths if p not in streams and unbuffered.match(p)]
    assert not others, f"buffered routes the proxy would not buffer: {others}"


@pytest.mark.parametrize(
    ("variable", "value", "allowed"),
    [
        ("CRASHDRILL_PROXY_CONNECTIONS_PER_ADDRESS", "lots", "a whole number in 1..100000"),
        ("CRASHDRILL_PROXY_HEADER_TIMEOUT_S", "0", "a whole number in 1..600"),
        ("CRASHDRILL_PROXY_LISTEN", "localhost:80", "a port, or ADDRESS:PORT"),
        ("CRASHDRILL_PROXY_TLS", "maybe", "1 (https with"),
    ],
)
def test_the_proxy_refuses_a_bad_setting_naming_it_and_what_is_allowed(
    variable: str, value: str, allowed: str
) -> None:
    done = subprocess.run(
        ["sh", str(DOCKER / "proxy-entrypoint.sh")],
        env={"PATH": "/usr/bin:/bin", variable: value},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2, done
    assert f"{variable} = '{value}': {allowed}" in done.stderr
