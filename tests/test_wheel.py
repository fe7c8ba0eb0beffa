"""The wheel built from this repository runs busd alone: built from a copy of the source,
installed into a new virtual environment, started from a directory outside the checkout with
its embedded store, it answers /health, serves its dashboard and carries a session message.

The virtual environment sees the system's packages (python-qpid-proton ships as source only and
takes minutes to build), so the dependencies come from there; busd itself must come from the
wheel, which the test checks by where `busd` is imported from. The wheel must also hold every
file of the package that is not Python (Lua scripts, the dashboard), as pyproject.toml's
package-data says.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import venv
import zipfile
from pathlib import Path

import pytest
from proton import Message

from busd.testing.broker import BANNER, BANNER_END, HTTP_BANNER
from tests.e2e.amqp_client import ProtonCbsClient

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "busd"
QUEUE = "wheel-orders"


def _pip_available() -> bool:
    probe = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True)
    return probe.returncode == 0


if not _pip_available():
    pytest.skip("needs pip to build and install the wheel", allow_module_level=True)


def _source_copy(dest: Path) -> Path:
    """What a fresh clone holds that the build reads: the top-level files and the package,
    without byte code; a copy, so that no build/ or egg-info left in the checkout by an earlier
    build (whose files may be gone from the source since) can reach the wheel."""
    dest.mkdir()
    for item in ROOT.iterdir():
        if item.is_file():
            shutil.copy2(item, dest / item.name)
    shutil.copytree(PACKAGE, dest / "busd", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


def _can_build_offline() -> bool:
    """Whether this Python's own setuptools makes wheels as pyproject.toml's build-system asks
    (setuptools 77+, which reads the SPDX license string and has bdist_wheel, and
    setuptools-scm for the version): then the build needs no package index."""
    probe = (
        "import setuptools, setuptools_scm, sys\n"
        "from setuptools.command import bdist_wheel\n"
        "major, minor = (int(p) for p in setuptools.__version__.split('.')[:2])\n"
        "sys.exit(0 if (major, minor) >= (77, 0) else 1)\n"
    )
    return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


def _build_wheel(source: Path, out: Path) -> Path:
    out.mkdir()
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out)]
    if _can_build_offline():
        cmd.append("--no-build-isolation")
    result = subprocess.run(
        [*cmd, str(source)], capture_output=True, text=True, timeout=180, cwd=out
    )
    if result.returncode != 0 and "No matching distribution found for setuptools" in (
        result.stdout + result.stderr
    ):  # no build backend here, and no package index to fetch one from
        pytest.skip("setuptools>=77 is neither installed nor reachable: the wheel cannot be built")
    assert result.returncode == 0, f"pip wheel failed:\n{result.stdout}\n{result.stderr}"
    (wheel,) = out.glob("busd-*.whl")
    return wheel


def _clean_env() -> dict[str, str]:
    """The environment without what would make Python import busd from the checkout."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _bin(env_dir: Path, name: str) -> Path:
    return env_dir / ("Scripts" if os.name == "nt" else "bin") / name


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path]:
    """(the wheel, the virtual environment it is installed in)."""
    work = tmp_path_factory.mktemp("wheel")
    wheel = _build_wheel(_source_copy(work / "src"), work / "dist")
    env_dir = work / "venv"
    # pip comes from the system packages too: creating the environment stays fast
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(env_dir)
    python = _bin(env_dir, "python")
    # --no-index: the wheel's dependencies must already be there (the system's); nothing is
    # fetched, and a dependency the wheel names that is missing fails the install
    result = subprocess.run(
        [str(python), "-m", "pip", "install", "--no-index", "--quiet", str(wheel)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=work,
        env=_clean_env(),
    )
    assert result.returncode == 0, f"pip install failed:\n{result.stdout}\n{result.stderr}"
    return wheel, env_dir


def test_the_wheel_holds_every_file_of_the_package(installed):
    wheel, _ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    tracked = subprocess.run(
        ["git", "ls-files", "busd"], capture_output=True, text=True, cwd=ROOT
    ).stdout.split()
    on_disk = [p for p in PACKAGE.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    files = tracked or [str(p.relative_to(ROOT)) for p in on_disk]  # not a git checkout
    files = [f for f in files if (ROOT / f).is_file()]  # deleted but not yet committed: gone
    missing = sorted(f.replace(os.sep, "/") for f in files if f.replace(os.sep, "/") not in names)
    assert not missing, f"not in the wheel (pyproject.toml's package-data): {missing}"
    assert any(n.startswith("busd/storage/redis/lua/includes/") for n in names)
    assert "busd/http/dashboard.html" in names


def test_busd_runs_from_the_wheel_alone(installed, tmp_path):
    _, env_dir = installed
    python = _bin(env_dir, "python")
    env = _clean_env()
    run_dir = tmp_path / "elsewhere"  # no busd/ beside the process: nothing but the venv's
    run_dir.mkdir()

    found = subprocess.run(
        [str(python), "-c", "import busd, sys; print(busd.__file__); print(sys.prefix)"],
        capture_output=True,
        text=True,
        cwd=run_dir,
        env=env,
        timeout=30,
    )
    assert found.returncode == 0, found.stderr
    module_file, prefix = found.stdout.split()
    assert Path(module_file).resolve().is_relative_to(env_dir.resolve()), (
        f"busd imported from {module_file}, not from the wheel in {env_dir}"
    )
    assert Path(prefix).resolve() == env_dir.resolve()

    config = run_dir / "Config.json"
    queue = {"Name": QUEUE, "Properties": {"RequiresSession": True, "LockDuration": "PT30S"}}
    namespace = {"Name": "sbemulatorns", "Queues": [queue], "Topics": []}
    config.write_text(json.dumps({"UserConfig": {"Namespaces": [namespace]}}))
    log_path = run_dir / "busd.log"
    command = [
        str(_bin(env_dir, "busd")),  # the console script the wheel installed
        "serve",
        "--host", "127.0.0.1",
        "--port", "0",
        "--http-port", "0",
        "--tls-port", "off",
        "--ws-port", "off",
        "--data-dir", str(run_dir / "data"),
        "--config", str(config),
    ]  # fmt: skip
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=run_dir, env=env)
    try:
        amqp_port, http_port = _wait_for_banner(proc, log_path)
        _wait_for_health(f"http://127.0.0.1:{http_port}/health", proc, log_path)
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/", timeout=5) as page:
            assert page.status == 200
            assert b"<html" in page.read().lower()  # dashboard.html, read from the package

        with ProtonCbsClient(amqp_port) as client:
            client.authorize(QUEUE)
            sender = client.sender(QUEUE)
            sender.send(Message(body="from the wheel", group_id="order-1"))
            receiver = client.receiver(QUEUE, session="order-1")
            message = receiver.receive(timeout=10)
            assert message.body == "from the wheel"
            assert message.group_id == "order-1"
            receiver.accept()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
    assert code == 0, log_path.read_text(errors="replace")
    pid_file = run_dir / "data" / "valkey.pid"  # the embedded store stopped with busd
    if pid_file.exists():
        assert not _alive(int(pid_file.read_text().strip()))


def _wait_for_banner(proc: subprocess.Popen, log_path: Path) -> tuple[int, int]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        text = log_path.read_text(errors="replace")
        amqp, http = BANNER.search(text), HTTP_BANNER.search(text)
        if amqp and http and BANNER_END.search(text):
            return int(amqp.group(1)), int(http.group(1))
        assert proc.poll() is None, f"busd exited ({proc.returncode}):\n{text}"
        time.sleep(0.1)
    raise AssertionError(f"no banner within 30 s:\n{log_path.read_text(errors='replace')}")


def _wait_for_health(url: str, proc: subprocess.Popen, log_path: Path) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        assert proc.poll() is None, log_path.read_text(errors="replace")
        time.sleep(0.1)
    raise AssertionError(f"{url} not 200 within 20 s:\n{log_path.read_text(errors='replace')}")


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, gone but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True
