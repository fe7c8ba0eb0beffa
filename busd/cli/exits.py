"""How the `busd` command stops: its exit codes, and a bad setting met as one line on stderr
and a named exit code, not a traceback. The operator tools' own codes are busd.cli.tools'."""

from __future__ import annotations

import sys

import click

EXIT_OK = 0
EXIT_FAILURE = 1  # the server stopped on an error at run time
EXIT_CONFIG = 78  # sysexits EX_CONFIG: a setting or the entities file is wrong
EXIT_STARTUP = 69  # sysexits EX_UNAVAILABLE: the store or a port could not be had


def _fail(message: str, code: int) -> None:
    click.echo(f"busd: error: {message}", err=True)
    sys.exit(code)
