"""How the `busd` command stops: a bad setting met as one line on stderr and a named exit
code (busd.errors, where every exit code is), not a traceback."""

from __future__ import annotations

import sys

import click

from busd.errors import EXIT_CONFIG, EXIT_FAILURE, EXIT_OK, EXIT_UNAVAILABLE

__all__ = ["EXIT_CONFIG", "EXIT_FAILURE", "EXIT_OK", "EXIT_UNAVAILABLE"]


def _fail(message: str, code: int) -> None:
    click.echo(f"busd: error: {message}", err=True)
    sys.exit(code)
