"""busd's pytest plugin as a user meets it: installed with busd, on by default, off with
`-p no:busd`. Each run here is a separate pytest process over a project with its own
pytest.ini (so none of this suite's conftest files or options reach it)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import redis

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "tests" / "sample_project"


def _run_pytest(args: list[str], cwd: Path = ROOT, timeout: float = 280) -> tuple[int, str]:
    # none of this run's pytest settings (PYTEST_ADDOPTS, xdist's worker variables)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return done.returncode, done.stdout + done.stderr


def _project(path: Path, files: dict[str, str]) -> Path:
    (path / "pytest.ini").write_text("[pytest]\n")
    for name, text in files.items():
        (path / name).write_text(textwrap.dedent(text))
    return path


def test_the_plugin_is_installed_as_pytest11_busd() -> None:
    found = importlib.metadata.entry_points(group="pytest11", name="busd")
    assert [ep.value for ep in found] == ["busd.testing.pytest_plugin"], (
        "busd's pytest plugin is not registered: reinstall busd (pip install -e .)"
    )


@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["one-process", "xdist-2-workers"])
def test_the_sample_project_passes_on_the_plugin_alone(xdist: list[str]) -> None:
    code, out = _run_pytest(["tests/sample_project", "-v", *xdist])
    assert code == 0, out
    assert "8 passed" in out, out
    if xdist:  # both workers ran tests, each with a busd of its own
        assert set(re.findall(r"\[(gw\d)\] \[[ \d]+%\] PASSED", out)) == {"gw0", "gw1"}, out


def test_entities_made_for_a_test_are_gone_after_it(tmp_path: Path, redis_url: str) -> None:
    """Test 1 makes a queue, a topic and a subscription; test 2 (same broker) finds none of
    them. With --busd-redis-url the broker's keys are gone from that store at the end."""
    project = _project(
        tmp_path,
        {
            "test_cleanup.py": """
        made = {}

        def test_1_make(busd_broker, busd_queue_factory, busd_topic_factory,
                        busd_subscription_factory):
            made["queue"] = busd_queue_factory(requires_session=True)
            made["topic"] = busd_topic_factory()
            made["subscription"] = busd_subscription_factory(made["topic"])
            management = busd_broker.management
            assert management.exists(made["queue"]) and management.exists(made["topic"])
            assert management.exists(made["topic"], made["subscription"])
            assert len({made["queue"], made["topic"], made["subscription"]}) == 3

        def test_2_gone(busd_broker):
            management = busd_broker.management
            assert not management.exists(made["queue"])
            assert not management.exists(made["topic"])
            assert not management.exists(made["topic"], made["subscription"])
    """
        },
    )
    code, out = _run_pytest(["-q", "--busd-redis-url", redis_url], cwd=project)
    assert code == 0, out
    assert "2 passed" in out, out
    client = redis.Redis.from_url(redis_url)
    try:
        left = list(client.scan_iter(match="*busd-test-*", count=1000))
    finally:
        client.close()
    assert left == []


def test_a_config_marker_and_an_ini_option(tmp_path: Path) -> None:
    """--busd-config seeds busd_broker; a marker's file seeds a broker of its own, shared by
    the tests naming that file."""
    queues = {"default.json": "from-ini", "marked.json": "from-marker"}
    for file, queue in queues.items():
        namespace = {"Name": "sbemulatorns", "Queues": [{"Name": queue, "Properties": {}}]}
        (tmp_path / file).write_text(json.dumps({"UserConfig": {"Namespaces": [namespace]}}))
    project = _project(
        tmp_path,
        {
            "test_seeded.py": """
        import pytest

        marked = []

        def test_default(busd_broker, busd_test_broker):
            assert busd_test_broker is busd_broker
            assert busd_broker.management.exists("from-ini")

        @pytest.mark.busd_config("marked.json")
        def test_marked(busd_test_broker, busd_broker, busd_queue_factory):
            assert busd_test_broker is not busd_broker
            management = busd_test_broker.management
            assert management.exists("from-marker") and not management.exists("from-ini")
            assert management.exists(busd_queue_factory())
            marked.append(busd_test_broker.port)

        @pytest.mark.busd_config("marked.json")
        def test_marked_again(busd_test_broker):
            assert marked == [busd_test_broker.port]
    """
        },
    )
    code, out = _run_pytest(["-q", "--busd-config", "default.json"], cwd=project)
    assert code == 0, out
    assert "3 passed" in out, out


def test_off_with_p_no_busd(tmp_path: Path) -> None:
    project = _project(tmp_path, {})
    code, out = _run_pytest(["--fixtures"], cwd=project)
    assert code == 0, out
    for name in (
        "busd_broker",
        "busd_queue_factory",
        "busd_topic_factory",
        "busd_subscription_factory",
        "busd_broker_factory",
        "busd_test_broker",
    ):
        assert name in out
    code, out = _run_pytest(["--fixtures", "-p", "no:busd"], cwd=project)
    assert code == 0, out
    assert "busd_broker" not in out


def test_loading_the_plugin_imports_nothing_of_the_broker() -> None:
    """pytest loads the plugin in every run of every project with busd installed."""
    heavy = [
        "proton",
        "redis",
        "click",
        "azure",
        "testcontainers",
        "docker",
        "busd.server.lifecycle",
        "busd.broker",
        "busd.storage",
        "busd.testing.management",
    ]
    code = (
        "import sys, busd.testing.pytest_plugin; "
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {heavy!r} "
        f"or any(m.startswith(h + '.') or m == h for h in {heavy!r})))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def _readme_example(name: str) -> str:
    """The code block of README.md that starts with `# <name>`."""
    text = (ROOT / "README.md").read_text()
    found = re.search(rf"```python\n(# {re.escape(name)}\n.*?)```", text, re.DOTALL)
    assert found, f"README.md has no example {name}"
    return found.group(1)


def test_the_readmes_lost_session_lock_example_passes(tmp_path: Path) -> None:
    """The README's testing section injects a lost session lock and its code recovers: that
    exact example, run as a user runs it."""
    project = _project(tmp_path, {"test_resilience.py": _readme_example("test_resilience.py")})
    code, out = _run_pytest([str(project), "-v"], cwd=project)
    assert code == 0, out
    assert "1 passed" in out, out


def test_busd_faults_sets_a_fault_for_one_test(tmp_path: Path) -> None:
    project = _project(
        tmp_path,
        {
            "test_busy.py": """
            import pytest
            from azure.servicebus import ServiceBusClient, ServiceBusMessage
            from azure.servicebus.exceptions import ServiceBusServerBusyError

            def test_1_busy(busd_broker, busd_queue_factory, busd_faults):
                queue = busd_queue_factory()
                busd_faults.inject("server-busy", queue, operations=["send"], count=2)
                assert [f["kind"] for f in busd_faults.list()] == ["server-busy"]
                with ServiceBusClient.from_connection_string(
                    busd_broker.connection_string, retry_total=0
                ) as client:
                    with client.get_queue_sender(queue) as sender:
                        with pytest.raises(ServiceBusServerBusyError):
                            sender.send_messages(ServiceBusMessage("x"))
                busd_faults.inject("server-busy", queue, duration_ms=60000)

            def test_2_cleared(busd_broker, busd_faults):
                assert busd_faults.list() == []
            """
        },
    )
    code, out = _run_pytest([str(project), "-v"], cwd=project)
    assert code == 0, out
    assert "2 passed" in out, out
