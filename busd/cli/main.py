"""The `busd` command line. Every option is also an environment variable: `--redis-url` is
`BUSD_REDIS_URL`, `--port` is `BUSD_PORT`, and so on.

Users meet a bad setting as one line on stderr and a named exit code, not a traceback
(busd.cli.exits). This module is the group; its commands live with their concern:
`serve` in busd.cli.serve (its option types in busd.cli.serve_options), `config` in
busd.cli.config, the operator tools in busd.*_tools.
"""

from __future__ import annotations

import time

import click

from busd import __version__
from busd.auth.sas import DEFAULT_SAS_KEY, DEFAULT_SAS_KEY_NAME
from busd.cli.config import config_group
from busd.cli.entities import COMMANDS as ENTITY_COMMANDS
from busd.cli.faults import COMMANDS as FAULT_COMMANDS
from busd.cli.messages import COMMANDS as MESSAGE_COMMANDS
from busd.cli.serve import serve
from busd.cli.sessions import COMMANDS as SESSION_COMMANDS


@click.group(context_settings={"auto_envvar_prefix": "BUSD", "help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="busd")
def cli() -> None:
    """busd: Azure Service Bus sessions over AMQP 1.0, with its state in Redis or Valkey."""


@cli.command("sas-token")
@click.option(
    "--audience",
    required=True,
    help="What the token grants, e.g. sb://localhost:5672/myqueue "
    "(or sb://localhost:5672/ for all).",
)
@click.option(
    "--key-name", envvar="BUSD_SAS_KEY_NAME", default=DEFAULT_SAS_KEY_NAME, show_default=True
)
@click.option("--key", envvar="BUSD_SAS_KEY_VALUE", default=DEFAULT_SAS_KEY, show_default=True)
@click.option("--ttl", type=int, default=3600, show_default=True, help="Seconds of validity.")
def sas_token(audience: str, key_name: str, key: str, ttl: int) -> None:
    """Print a SharedAccessSignature token, as the Service Bus SDKs make them."""
    from busd.auth.sas import generate_sas_token

    click.echo(generate_sas_token(audience, key_name, key, int(time.time()) + ttl))


cli.add_command(serve)
cli.add_command(config_group)

# Operator tools over the admin HTTP API (busd.cli.output documents their exit codes).
for _command in (*MESSAGE_COMMANDS, *SESSION_COMMANDS, *FAULT_COMMANDS, *ENTITY_COMMANDS):
    cli.add_command(_command)


def main(argv: list[str] | None = None) -> None:
    cli.main(args=argv, prog_name="busd", auto_envvar_prefix="BUSD")
