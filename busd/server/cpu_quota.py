"""How many cores this process may use, for `--workers auto`: the CPUs it may run on
(`os.sched_getaffinity`, which honours `docker run --cpuset-cpus` and `taskset`), capped by
the CPU quota of its control group (`docker run --cpus`, Kubernetes' CPU limit, systemd's
CPUQuota): cgroup v2's `cpu.max`, or v1's `cpu.cfs_quota_us` / `cpu.cfs_period_us`.

A container sees every core of its host in `os.cpu_count()` and usually in its affinity too,
so without the quota a container limited to 2 CPUs on a 64-core host would start 64 workers,
each throttled to a sliver. A fractional quota counts up (1.5 CPUs: 2 workers), as Go's and
the JVM's runtimes count it: a worker waits on the network more than it computes.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
SELF_CGROUP = Path("/proc/self/cgroup")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _ancestors(mount: Path, cgroup_path: str) -> list[Path]:
    """The process's cgroup directory under `mount` and each one above it up to the mount,
    whose limits hold too; the mount alone when the path is not there (a container whose
    cgroup namespace shows its own cgroup as the root)."""
    own = mount / cgroup_path.strip("/")
    if not own.is_dir():
        return [mount]
    found = [own]
    while own != mount and own.parent != own:
        own = own.parent
        found.append(own)
    return found


def v2_limit(directory: Path) -> float | None:
    """CPUs that one cgroup v2 directory's `cpu.max` ("<quota> <period>", quota `max` for
    none) allows; None: no limit or no file."""
    text = _read(directory / "cpu.max")
    if not text:
        return None
    fields = text.split()
    if fields[0] == "max":
        return None
    try:
        quota = int(fields[0])
        period = int(fields[1]) if len(fields) > 1 else 100_000
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def v1_limit(directory: Path) -> float | None:
    """CPUs that one cgroup v1 cpu controller directory allows (`cpu.cfs_quota_us` -1: none)."""
    quota, period = _read(directory / "cpu.cfs_quota_us"), _read(directory / "cpu.cfs_period_us")
    try:
        q, p = int(quota or "-1"), int(period or "0")
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def quota_cpus(root: Path = CGROUP_ROOT, self_cgroup: Path = SELF_CGROUP) -> float | None:
    """The tightest CPU quota over the process's cgroup and its ancestors; None: unlimited.
    `root`: where the cgroup file systems are mounted; `self_cgroup`: /proc/self/cgroup."""
    limits: list[float] = []
    for line in (_read(self_cgroup) or "").splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":  # cgroup v2, unified
            mount = root / "unified" if (root / "unified" / "cgroup.controllers").exists() else root
            limits += filter(None, (v2_limit(d) for d in _ancestors(mount, path)))
        elif "cpu" in controllers.split(","):  # cgroup v1's cpu controller
            for name in (controllers, "cpu", "cpu,cpuacct"):
                if (root / name).is_dir():
                    limits += filter(None, (v1_limit(d) for d in _ancestors(root / name, path)))
                    break
    if not limits and not (_read(self_cgroup) or ""):  # no /proc: look at the root alone
        limits += filter(None, (v2_limit(root), v1_limit(root / "cpu")))
    return min(limits) if limits else None


def affinity_cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def usable_cores(
    root: Path = CGROUP_ROOT, self_cgroup: Path = SELF_CGROUP, affinity: int | None = None
) -> int:
    """`--workers auto`: the CPUs it may run on, capped by its quota rounded up; at least 1."""
    cores = affinity if affinity is not None else affinity_cpus()
    quota = quota_cpus(root, self_cgroup)
    if quota is not None:
        cores = min(cores, math.ceil(quota))
    return max(1, cores)
