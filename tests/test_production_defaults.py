"""Defaults that are safe outside a laptop: `busd serve` warns when it listens beyond loopback
with the well-known key, `--workers auto` counts a container's CPU quota (cgroup v2 and v1, read
from a cgroup tree the test writes), and every worker is named in `ps`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from busd.cli.exits import EXIT_UNAVAILABLE
from busd.server.cpu_quota import quota_cpus, usable_cores
from busd.server.exposure import default_key_warning, is_loopback

pytestmark = pytest.mark.timeout(90)

# An address of TEST-NET-1 (RFC 5737), on no interface here: busd logs its start-up warnings,
# then cannot bind it, so the test never listens beyond loopback.
UNREACHABLE = "192.0.2.1"
WARNING = "with the well-known key SAS_KEY_VALUE"
PORTS = ["--port", "0", "--http-port", "0", "--tls-port", "off", "--ws-port", "off"]


def _serve(tmp_path: Path, redis_url: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "busd", "serve", *PORTS, "--redis-url", redis_url, *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )


@pytest.mark.parametrize("workers", ["1", "2"])
def test_reachable_address_with_the_default_key_is_warned_about_once(tmp_path, redis_url, workers):
    run = _serve(tmp_path, redis_url, "--host", UNREACHABLE, "--workers", workers)
    output = run.stdout + run.stderr
    assert run.returncode == EXIT_UNAVAILABLE, output  # the address is not this machine's
    lines = [line for line in output.splitlines() if WARNING in line]
    assert len(lines) == 1, output
    assert f"listening on {UNREACHABLE}" in lines[0] and "--sas-key" in lines[0]


def test_own_key_or_loopback_is_not_warned_about(tmp_path, redis_url):
    own = _serve(
        tmp_path, redis_url, "--host", UNREACHABLE, "--sas-key", "RootManageSharedAccessKey=ours"
    )
    assert own.returncode == EXIT_UNAVAILABLE
    assert WARNING not in own.stdout + own.stderr
    assert default_key_warning("127.0.0.1", {"RootManageSharedAccessKey": "SAS_KEY_VALUE"}) is None
    assert default_key_warning("::1", {"RootManageSharedAccessKey": "SAS_KEY_VALUE"}) is None


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("", False),
        ("10.1.2.3", False),
        ("busd.example", False),
    ],
)
def test_loopback_addresses(host, loopback):
    assert is_loopback(host) is loopback


def test_a_key_from_the_entities_file_counts_too():
    warning = default_key_warning("0.0.0.0", {"ours": "x", "legacy": "SAS_KEY_VALUE"})
    assert warning is not None and "(legacy)" in warning


# --- --workers auto and CPU quotas -----------------------------------------------------------


def _tree(tmp_path: Path, files: dict[str, str], self_cgroup: str) -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    root.mkdir(parents=True, exist_ok=True)
    proc = tmp_path / "self-cgroup"
    proc.write_text(self_cgroup)
    return root, proc


def test_cgroup_v2_quota_caps_the_workers(tmp_path):
    # a container limited to 2.5 CPUs (docker run --cpus 2.5) on a 64-core host
    root, proc = _tree(tmp_path, {"cpu.max": "250000 100000"}, "0::/\n")
    assert quota_cpus(root, proc) == 2.5
    assert usable_cores(root, proc, affinity=64) == 3  # a fraction counts up
    assert usable_cores(root, proc, affinity=2) == 2  # the affinity is lower still


def test_cgroup_v2_without_a_limit_leaves_the_affinity(tmp_path):
    root, proc = _tree(tmp_path, {"cpu.max": "max 100000"}, "0::/\n")
    assert quota_cpus(root, proc) is None
    assert usable_cores(root, proc, affinity=8) == 8


def test_cgroup_v2_nested_limits_take_the_tightest(tmp_path):
    # a systemd service (CPUQuota=150%) in a slice limited to 4 CPUs, cgroup namespace off
    root, proc = _tree(
        tmp_path,
        {
            "cpu.max": "max 100000",
            "busd.slice/cpu.max": "400000 100000",
            "busd.slice/busd.service/cpu.max": "150000 100000",
        },
        "0::/busd.slice/busd.service\n",
    )
    assert quota_cpus(root, proc) == 1.5
    assert usable_cores(root, proc, affinity=16) == 2


def test_cgroup_v1_quota_caps_the_workers(tmp_path):
    root, proc = _tree(
        tmp_path,
        {
            "cpu,cpuacct/cpu.cfs_quota_us": "100000",
            "cpu,cpuacct/cpu.cfs_period_us": "50000",
        },
        "12:memory:/\n4:cpu,cpuacct:/\n",
    )
    assert quota_cpus(root, proc) == 2.0
    assert usable_cores(root, proc, affinity=32) == 2


def test_cgroup_v1_without_a_quota_and_a_quota_below_one_cpu(tmp_path):
    root, proc = _tree(
        tmp_path,
        {"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"},
        "3:cpu:/\n",
    )
    assert usable_cores(root, proc, affinity=6) == 6
    (root / "cpu/cpu.cfs_quota_us").write_text("20000\n")  # a fifth of a CPU
    assert usable_cores(root, proc, affinity=6) == 1


def test_unreadable_or_odd_files_are_no_limit(tmp_path):
    root, proc = _tree(tmp_path, {"cpu.max": "garbage"}, "0::/\n")
    assert usable_cores(root, proc, affinity=4) == 4
    root, proc = _tree(tmp_path / "none", {}, "")
    assert usable_cores(root, proc, affinity=4) == 4


def test_workers_auto_resolves_through_the_quota():
    """The command line's `auto` is the quota-aware count (the host's real cgroup here), with
    one Valkey (busd/cli/serve_options.py auto_workers)."""
    from busd.cli.serve_options import COUNT_OR_AUTO, auto_workers

    assert COUNT_OR_AUTO.convert("auto", None, None) is None  # resolved once shards are known
    assert auto_workers(1) == usable_cores()
