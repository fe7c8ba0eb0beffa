"""scripts/test runs pytest in the environment it is given, adding the test tools only when
some are missing (they are all here: it must not reinstall anything), in pytest-xdist
workers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_scripts_test_runs_pytest_in_the_given_environment_without_reinstalling() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHON"] = sys.executable
    done = subprocess.run(
        [str(ROOT / "scripts" / "test"), "tests/auth/test_sas.py", "-q", "-p", "no:cacheprovider"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "passed" in done.stdout
    assert "installing" not in done.stdout + done.stderr
    assert "bringing up nodes" in done.stdout  # pytest-xdist's workers
