"""Processes busd starts end with it, however it ends (kill -9 included): each asks the kernel
for SIGTERM when its parent dies (Linux's PR_SET_PDEATHSIG), which stops a valkey-server as
SHUTDOWN does (its append-only file fsynced) and a worker as SIGTERM stops any busd.

The kernel sends it when the *thread* that started the child ends, not the process: busd
starts its children from its main thread (or one that lives as long as the process)."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # prctl's option: the signal this process gets when its parent dies


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def end_with_parent(parent: int, sig: int = signal.SIGTERM) -> bool:
    """Ask for `sig` when this process's parent dies; if `parent` (the pid it was started by)
    is gone already, nobody would send it: exit now. False where the system cannot."""
    prctl = _prctl()
    if prctl is None or prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
        return False
    if os.getppid() != parent:  # died before the request: the signal will not come
        os._exit(0)
    return True


def ending_with_us() -> Callable[[], None] | None:
    """A `preexec_fn` for subprocess.Popen that makes the child end with this process (None
    where the system cannot): it runs in the child between fork and exec, so it serves a
    program of any kind."""
    prctl = _prctl()  # resolved before the fork: the child only makes the call
    if prctl is None:
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(0)

    return preexec
