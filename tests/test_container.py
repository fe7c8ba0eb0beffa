"""The container set-up without a container engine: the Dockerfile's and compose.yaml's
commands run here as processes (on loopback and free ports instead of 0.0.0.0:5672/5300),
compose.yaml passes `docker-compose config`, and docs/emulator.md agrees with it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml

from busd.auth.sas import generate_sas_token
from busd.config.entities_file import load_entities
from busd.config.settings import Settings
from busd.net.tls import CERT_FILE, KEY_FILE
from busd.net.tls import load as load_tls
from busd.server.lifecycle import EMULATOR_CONFIG, connection_string, entities_file
from tests.e2e.conftest import BANNER, HTTP_BANNER

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = yaml.safe_load((ROOT / "compose.yaml").read_text())
BUSD = COMPOSE["services"]["busd"]


def dockerfile_cmd() -> list[str]:
    cmds = re.findall(r"^CMD\s+(\[.*\])\s*$", (ROOT / "Dockerfile").read_text(), re.M)
    assert cmds, "the Dockerfile has no exec-form CMD"
    return json.loads(cmds[-1])


def dockerfile_env() -> dict[str, str]:
    return dict(re.findall(r"^ENV\s+(BUSD_\w+)=(\S+)\s*$", (ROOT / "Dockerfile").read_text(), re.M))


def compose_default(text: str) -> str:
    """compose.yaml's text with each ${VAR:-default} as its default (the variable unset)."""
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", text)


def compose_value(text: str, shell: dict[str, str]) -> str:
    """An ${VAR:-default} value of compose.yaml as compose makes it from the shell's
    variables."""
    return re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: shell.get(m.group(1)) or m.group(2), text)


def volume_mounts() -> dict[str, Path]:
    """Container path -> host path of the busd service's file mounts."""
    mounts = {}
    for volume in BUSD.get("volumes", []):
        source, target = compose_default(volume).split(":")[:2]
        mounts[target] = (ROOT / source).resolve()
    return mounts


def published_ports(shell: dict[str, str] | None = None) -> list[tuple[str, str, str]]:
    """(host address, host port, container port) of each port compose.yaml publishes for
    busd, as compose makes them from the shell's variables."""
    found = []
    for text in BUSD["ports"]:
        address, host_port, container_port = compose_value(text, shell or {}).rsplit(":", 2)
        found.append((address, host_port, container_port))
    return found


def test_compose_publishes_every_port_on_loopback_unless_told_otherwise():
    """The well-known key must not face a network by default (docs/design.md §2.10)."""
    assert [p[1:] for p in published_ports()] == [
        ("5672", "5672"),
        ("5671", "5671"),
        ("5443", "5443"),
        ("5300", "5300"),
    ]
    assert {p[0] for p in published_ports()} == {"127.0.0.1"}
    wide = published_ports({"BUSD_PUBLISH_ADDRESS": "0.0.0.0"})
    assert {p[0] for p in wide} == {"0.0.0.0"}
    # and the key to give busd when publishing wider goes through, empty by default
    assert compose_value(BUSD["environment"]["BUSD_SAS_KEY"], {}) == ""
    assert compose_value(BUSD["environment"]["BUSD_SAS_KEY"], {"BUSD_SAS_KEY": "a=b"}) == "a=b"


def option(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def replace_option(argv: list[str], name: str, value: str) -> list[str]:
    out = list(argv)
    out[out.index(name) + 1] = value
    return out


def runnable(argv: list[str]) -> list[str]:
    """The container's command for this machine: the installed `busd`, loopback only, free
    ports (the flags given last win)."""
    assert argv[0] == "busd"
    exe = shutil.which("busd")
    head = [exe] if exe else [sys.executable, "-m", "busd"]
    return (
        head
        + replace_option(argv[1:], "--host", "127.0.0.1")
        + ["--port", "0", "--http-port", "0", "--tls-port", "0", "--ws-port", "0"]
    )


def start(
    argv: list[str], tmp_path: Path, env: dict[str, str]
) -> tuple[subprocess.Popen, str, Path]:
    log_path = tmp_path / f"busd-{uuid.uuid4().hex[:6]}.log"
    out = open(log_path, "wb")
    # the container's environment: none of this machine's BUSD_* settings
    clean = {k: v for k, v in os.environ.items() if not k.startswith("BUSD_")}
    proc = subprocess.Popen(
        argv,
        stdout=out,
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
        env={**clean, "PYTHONUNBUFFERED": "1", **env},
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        text = log_path.read_text(errors="replace")
        if BANNER.search(text) and "connection string:" in text:
            return proc, f"http://127.0.0.1:{HTTP_BANNER.search(text).group(1)}", log_path
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    stop(proc)
    raise AssertionError(f"busd did not start:\n{log_path.read_text(errors='replace')}")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def get_json(url: str) -> tuple[int, object]:
    request = urllib.request.Request(url)
    # Signed with the default key, as the `busd` tools do (admin routes want a token).
    request.add_header(
        "Authorization",
        generate_sas_token(
            "sb://localhost/", "RootManageSharedAccessKey", "SAS_KEY_VALUE", int(time.time()) + 300
        ),
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def healthcheck(http_url: str) -> list[str]:
    """compose.yaml's health check of busd, pointed at this process's HTTP port."""
    test = BUSD["healthcheck"]["test"]
    assert test[0] == "CMD" and test[1] == "python"
    port = http_url.rsplit(":", 1)[1]
    return [sys.executable] + [
        arg.replace("127.0.0.1:5300", f"127.0.0.1:{port}") for arg in test[2:]
    ]


def test_image_runs_busd_serve_on_every_interface_as_a_user():
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.\d+-slim\s*$", text, re.M)
    assert re.search(r"^USER busd\s*$", text, re.M)
    assert dockerfile_cmd() == ["busd", "serve", "--host", "0.0.0.0", "--workers", "auto"]
    assert re.search(r"^EXPOSE 5672 5671 5443 5300\s*$", text, re.M)


def dockerfile_healthcheck() -> tuple[dict[str, str], list[str]]:
    """The Dockerfile's HEALTHCHECK: its --options and its exec-form command."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    match = re.search(r"^HEALTHCHECK\s+((?:--\S+\s+)*)CMD\s+(\[.*\])\s*$", text, re.M)
    assert match, "the Dockerfile has no exec-form HEALTHCHECK"
    options = dict(o.removeprefix("--").split("=") for o in match.group(1).split())
    return options, json.loads(match.group(2))


def test_image_checks_its_health_as_compose_does():
    """`docker run` and compose files without a health test of their own (the emulator's)
    get compose.yaml's."""
    options, command = dockerfile_healthcheck()
    compose = BUSD["healthcheck"]
    assert ["CMD", *command] == compose["test"]
    assert options == {
        "interval": compose["interval"],
        "timeout": compose["timeout"],
        "start-period": compose["start_period"],
        "retries": str(compose["retries"]),
    }


def test_image_is_told_its_version_or_says_the_fallback():
    """The build has no git metadata: BUSD_VERSION, or pyproject.toml's fallback_version."""
    text = (ROOT / "Dockerfile").read_text()
    (default,) = re.findall(r"^ARG BUSD_VERSION=(\S+)\s*$", text, re.M)
    fallback = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools_scm"]
    assert default == fallback["fallback_version"]
    assert 'SETUPTOOLS_SCM_PRETEND_VERSION_FOR_BUSD="$BUSD_VERSION"' in text
    assert BUSD["build"]["args"]["BUSD_VERSION"] == f"${{BUSD_VERSION:-{default}}}"


def test_image_command_starts_with_its_embedded_store_and_answers_health(tmp_path):
    env = dockerfile_env()
    assert env["BUSD_DATA_DIR"] == "/data"
    data = tmp_path / "data"  # the image's /data
    proc, http_url, log_path = start(
        runnable(dockerfile_cmd()), tmp_path, {"BUSD_DATA_DIR": str(data)}
    )
    try:
        assert get_json(http_url + "/health") == (
            200,
            {"status": "healthy", "message": "Service is healthy."},
        )
        status, health = get_json(http_url + "/health/detail")
        assert (status, health["status"], health["store"]) == (200, "ok", True)
        # a worker per core, each a whole busd over the one embedded store
        assert len(health["workers"]) == len(os.sched_getaffinity(0))
        assert f"store:    embedded Valkey in {data}" in log_path.read_text()
        check = subprocess.run(healthcheck(http_url), timeout=20)
        assert check.returncode == 0
    finally:
        stop(proc)


def test_compose_command_serves_the_mounted_config_from_valkey(tmp_path, redis_url):
    argv = BUSD["command"]
    mounted = option(argv, "--config")
    assert mounted == EMULATOR_CONFIG
    host_file = volume_mounts()[mounted]
    argv = replace_option(argv, "--config", str(host_file))
    argv = replace_option(argv, "--redis-url", redis_url)
    proc, http_url, _ = start(
        runnable(argv), tmp_path, {"BUSD_KEY_PREFIX": f"container-{uuid.uuid4().hex[:8]}"}
    )
    try:
        assert get_json(http_url + "/health")[0] == 200
        status, queues = get_json(http_url + "/admin/queues")
        loaded = load_entities(str(host_file), 1024 * 1024)
        # what receivers take from: the queues and the topics' subscriptions
        expected = [q.name for q in loaded.queues] + [s.path for s in loaded.subscriptions]
        assert status == 200
        assert [q["name"] for q in queues] == sorted(expected)
        assert subprocess.run(healthcheck(http_url), timeout=20).returncode == 0
    finally:
        stop(proc)
    # and the health check fails once busd is gone
    failed = subprocess.run(healthcheck(http_url), capture_output=True, timeout=20)
    assert failed.returncode != 0


def test_without_config_busd_reads_the_emulator_file(tmp_path, monkeypatch):
    emulator_file = tmp_path / "Config.json"
    monkeypatch.setattr("busd.server.lifecycle.EMULATOR_CONFIG", str(emulator_file))
    assert entities_file(Settings()) is None
    emulator_file.write_text("{}")
    assert entities_file(Settings()) == str(emulator_file)
    assert entities_file(Settings(config_path="mine.json")) == "mine.json"


def test_compose_runs_busd_next_to_valkey_with_an_append_only_file():
    valkey = COMPOSE["services"]["valkey"]
    command = valkey["command"]
    assert option(command, "--appendonly") == "yes"
    assert option(command, "--maxmemory-policy") == "noeviction"
    assert any(v.endswith(":/data") for v in valkey["volumes"])
    assert "healthcheck" in valkey
    assert BUSD["depends_on"]["valkey"]["condition"] == "service_healthy"
    assert option(BUSD["command"], "--redis-url") == "redis://valkey:6379"
    assert option(BUSD["command"], "--host") == "0.0.0.0"
    assert option(BUSD["command"], "--workers") == "auto"
    # every listener reachable: AMQP, AMQP over TLS, WebSockets, HTTP(S)
    assert [p[1:] for p in published_ports()] == [(p, p) for p in ("5672", "5671", "5443", "5300")]


def test_compose_serves_the_certificate_its_environment_names(tmp_path, redis_url):
    """Without BUSD_TLS_CERT/KEY the container makes its certificate in the /data volume; with
    them it serves the files mounted at /certs, here a host directory in its place."""
    mounts = volume_mounts()
    assert "/data" in mounts and "/certs" in mounts
    assert BUSD["environment"] == {
        # what other containers call it: served over HTTP, named by its certificate
        "BUSD_HOSTNAME": "${BUSD_HOSTNAME:-busd}",
        "BUSD_TLS_CERT": "${BUSD_TLS_CERT:-}",
        "BUSD_TLS_KEY": "${BUSD_TLS_KEY:-}",
        # empty: the well-known key (the ports are then published on loopback only)
        "BUSD_SAS_KEY": "${BUSD_SAS_KEY:-}",
    }
    certs = tmp_path / "certs"  # the container's /certs
    load_tls(None, None, certs)  # its server certificate and key: a pair as a user brings one
    cert = certs / CERT_FILE
    given = {"BUSD_TLS_CERT": str(cert), "BUSD_TLS_KEY": str(certs / KEY_FILE)}
    argv = replace_option(BUSD["command"], "--redis-url", redis_url)
    argv = replace_option(argv, "--config", str(mounts[EMULATOR_CONFIG]))
    for env, expected in (({}, "(busd's CA, for local names only)"), (given, str(cert))):
        environment = {name: compose_value(v, env) for name, v in BUSD["environment"].items()}
        proc, http_url, log_path = start(
            runnable(argv),
            tmp_path,
            {**environment, "BUSD_KEY_PREFIX": f"certs-{uuid.uuid4().hex[:8]}"},
        )
        try:
            banner = log_path.read_text()
            line = next(x for x in banner.splitlines() if "certificate:" in x)
            assert expected in line, banner
            served = ssl.create_default_context(cafile=line.split()[1])
            https = http_url.replace("http://", "https://")
            with urllib.request.urlopen(https + "/health", timeout=5, context=served) as answer:
                assert answer.status == 200
        finally:
            stop(proc)


def test_compose_file_passes_docker_compose_config():
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.skip("docker-compose is not installed (CI installs it: .ci/run)")
    result = subprocess.run(
        [exe, "-f", str(ROOT / "compose.yaml"), "config", "-q"],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr


def doc_page(name: str) -> str:
    return (ROOT / "docs" / name).read_text()


def test_the_emulator_page_matches_compose():
    section = doc_page("emulator.md")
    assert EMULATOR_CONFIG in section
    assert EMULATOR_CONFIG in volume_mounts()
    for _, host_port, _ in published_ports():
        assert f"`{host_port}`" in section
    assert "BUSD_PUBLISH_ADDRESS" in section
    assert connection_string(Settings()) in section
    # the one-line change: the emulator image for busd's, which honours the mounted file
    assert "-    image: mcr.microsoft.com/azure-messaging/servicebus-emulator:latest" in section
    assert "+    image: busd" in section
    assert "docker build -t busd ." in section
    mount_source = next(v.split(":")[0] for v in BUSD["volumes"] if EMULATOR_CONFIG in v)
    assert mount_source.removeprefix("./") in section
    assert "appendfsync everysec" in section
    assert option(COMPOSE["services"]["valkey"]["command"], "--appendfsync") == "everysec"


def test_the_tools_page_names_every_command():
    from busd.cli.main import cli

    section = doc_page("tools.md")
    for command in ("queues", "peek", "sessions", "send", "purge", "dlq resubmit"):
        assert f"busd {command} " in section or f"busd {command}\n" in section, command
        assert command.split()[0] in cli.commands


# --- the switch from Microsoft's emulator (docs/emulator.md) ----------------------------------

EMULATOR_DIR = ROOT / "tests" / "data" / "emulator"
EMULATOR_COMPOSE = EMULATOR_DIR / "compose.yaml"


def emulator_diff() -> list[str]:
    """The diff docs/emulator.md gives, line by line."""
    (block,) = re.findall(r"```diff\n(.*?)```", doc_page("emulator.md"), re.S)
    return block.splitlines()


def test_the_emulator_switch_is_the_documented_diff_applied():
    """The compose file run below is Microsoft's emulator file with the diff of
    docs/emulator.md applied: the diff's new side, line for line."""
    diff = emulator_diff()
    assert all(line[:1] in (" ", "-", "+") for line in diff)
    fixture = [
        line for line in EMULATOR_COMPOSE.read_text().splitlines() if not line.startswith("#")
    ]
    assert [line[1:] for line in diff if not line.startswith("-")] == fixture
    # the old side is the emulator's file: its image, pulled every time, next to SQL Server
    old = yaml.safe_load("\n".join(line[1:] for line in diff if not line.startswith("+")))
    emulator = old["services"]["emulator"]
    assert emulator["image"] == "mcr.microsoft.com/azure-messaging/servicebus-emulator:latest"
    assert emulator["pull_policy"] == "always"
    assert emulator["depends_on"] == ["sqledge"]


def test_the_emulator_switch_has_what_busd_needs_there():
    services = yaml.safe_load(EMULATOR_COMPOSE.read_text())["services"]
    assert list(services) == ["emulator"]  # no SQL Server
    busd = services["emulator"]
    assert busd["image"] == "busd"
    assert busd["pull_policy"] == "never"  # built here, in no registry
    assert f"${{CONFIG_PATH}}:{EMULATOR_CONFIG}" in busd["volumes"]
    assert "busd-data:/data" in busd["volumes"]  # kept across down and up
    assert busd["ports"] == ["5672:5672", "5300:5300"]
    # every name the network knows it by: the service, its alias, its container
    names = busd["environment"]["BUSD_HOSTNAME"].split()
    assert {"emulator", busd["container_name"], *busd["networks"]["sb-emulator"]["aliases"]} == set(
        names
    )


def test_the_emulator_switch_passes_docker_compose_config(tmp_path):
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.skip("docker-compose is not installed (CI installs it: .ci/run)")
    compose = EMULATOR_COMPOSE
    version = subprocess.run([exe, "version", "--short"], capture_output=True, text=True)
    if version.stdout.strip().startswith("1."):
        # Debian's docker-compose 1.x predates the Compose Specification's top-level `name`
        # (Microsoft's file has one); every other key it checks as Compose v2 does
        document = yaml.safe_load(EMULATOR_COMPOSE.read_text())
        assert document.pop("name") == "microsoft-azure-servicebus-emulator"
        compose = tmp_path / "compose.yaml"
        compose.write_text(yaml.safe_dump(document))
    result = subprocess.run(
        [exe, "-f", str(compose), "config", "-q"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "CONFIG_PATH": str(ROOT / "config" / "Config.json")},
    )
    assert result.returncode == 0, result.stderr


SDK_ROUND_TRIP = """
import json, sys, urllib.request
from azure.servicebus import ServiceBusClient, ServiceBusMessage
host = sys.argv[1]
conn = (f"Endpoint=sb://{host}:5672;SharedAccessKeyName=RootManageSharedAccessKey;"
        "SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;")
with ServiceBusClient.from_connection_string(conn, retry_total=10) as client:
    with client.get_queue_sender("session-queue") as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}", session_id="s") for i in range(10)])
    with client.get_queue_receiver("session-queue", session_id="s", max_wait_time=10) as r:
        got = []
        while len(got) < 10:
            batch = r.receive_messages(max_message_count=10, max_wait_time=10)
            if not batch:
                break
            for m in batch:
                got.append(str(m))
                r.complete_message(m)
with urllib.request.urlopen(f"http://{host}:5300/health/detail", timeout=10) as answer:
    health = json.loads(answer.read())
print(json.dumps({"received": got, "health": health}))
"""


def container_tools() -> tuple[str, list[str]]:
    """(engine, compose command), or skip where there are none."""
    for engine, compose in (("docker", ["docker", "compose"]), ("podman", ["podman-compose"])):
        if shutil.which(engine) and shutil.which(compose[0]):
            probe = subprocess.run(
                [*compose, "version"], capture_output=True, text=True, timeout=30
            )
            found = re.search(r"compose(?:r)? version:?\s+v?(\d+)\.(\d+)", probe.stdout, re.I)
            # podman-compose before 1.1 reads neither ${VAR:-} defaults nor networks declared
            # without settings
            old = engine == "podman" and found and (int(found[1]), int(found[2])) < (1, 1)
            if probe.returncode == 0 and not old:
                return engine, compose
    pytest.skip("no container engine with compose here (docker compose, podman-compose 1.1+)")


def sdk_packages(dest: Path) -> Path:
    """The SDK and what it imports, copied from this environment: pure Python, so the image's
    Python runs them (the image has no SDK of its own)."""
    import sysconfig

    import azure.servicebus  # noqa: F401

    site = Path(sysconfig.get_paths()["purelib"])
    for name, module in list(sys.modules.items()):
        # a namespace package (azure) has a __path__ and no __file__
        paths = list(getattr(module, "__path__", []))
        where = Path(getattr(module, "__file__", None) or (paths[0] if paths else "/"))
        if where.is_relative_to(site) and "." not in name and not name.startswith("_"):
            top = site / where.relative_to(site).parts[0]
            target = dest / top.name
            if top.is_dir() and not target.exists():
                shutil.copytree(top, target, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
            elif top.is_file():
                shutil.copy2(top, target)
    return dest


@pytest.mark.timeout(300)
def test_the_emulator_switch_runs_and_busd_answers_by_its_service_name(tmp_path):
    """The file of docs/emulator.md, up: an SDK client in another container of its network
    sends and receives session messages calling busd `emulator`, and reads /health/detail
    there (421 without BUSD_HOSTNAME)."""
    engine, compose = container_tools()
    if (
        subprocess.run(
            [engine, "image", "exists" if engine == "podman" else "inspect", "busd"],
            capture_output=True,
            timeout=30,
        ).returncode
        != 0
    ):
        pytest.skip("no image named busd here: `docker build -t busd .` first")
    # this machine's ports may be taken: the same file, published on free loopback ports, no
    # fixed container name
    shape = yaml.safe_load(EMULATOR_COMPOSE.read_text())
    service = shape["services"]["emulator"]
    del service["container_name"]
    service["ports"] = [f"127.0.0.1::{p.split(':')[-1]}" for p in service["ports"]]
    (tmp_path / "compose.yaml").write_text(yaml.safe_dump(shape))
    project = f"busd-emulator-{uuid.uuid4().hex[:8]}"
    run = [*compose, "-p", project, "-f", str(tmp_path / "compose.yaml")]
    env = {**os.environ, "CONFIG_PATH": str(ROOT / "config" / "Config.json")}
    (tmp_path / "sdk").mkdir()
    (tmp_path / "sdk" / "round_trip.py").write_text(SDK_ROUND_TRIP)
    sdk_packages(tmp_path / "sdk")
    try:
        up = subprocess.run(
            [*run, "up", "-d"], capture_output=True, text=True, env=env, timeout=120
        )
        assert up.returncode == 0, up.stdout + up.stderr
        client = subprocess.run(
            [
                engine,
                "run",
                "--rm",
                "--user",
                "root",
                "--network",
                f"{project}_sb-emulator",
                "-v",
                f"{tmp_path / 'sdk'}:/sdk:ro",
                "-e",
                "PYTHONPATH=/sdk",
                "busd",
                "python",
                "/sdk/round_trip.py",
                "emulator",
            ],
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert client.returncode == 0, client.stdout + client.stderr
        answer = json.loads(client.stdout.strip().splitlines()[-1])
        assert answer["received"] == [f"m{i}" for i in range(10)]
        assert answer["health"]["store"] is True
    finally:
        subprocess.run([*run, "down", "-v"], capture_output=True, env=env, timeout=120)
