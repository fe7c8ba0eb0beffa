"""What `busd serve`'s options take beyond click's own types: a port or `off`, a count or
`auto`, `--sas-key` NAME=KEY pairs, and the options of every client limit
(busd/broker/limits.py), one per field of `Limits`."""

from __future__ import annotations

import click

from busd.broker.limits import Limits
from busd.config.settings import ConfigError
from busd.server.cpu_quota import usable_cores


class _NumberOr(click.ParamType):
    """A whole number, or None for one of `words` (the first one is the option's)."""

    def __init__(self, name: str, what: str, words: tuple[str, ...]) -> None:
        self.name, self.what, self.words = name, what, words

    def convert(self, value, param, ctx):
        if value is None or isinstance(value, int):
            return value
        if str(value).strip().lower() in self.words:
            return None
        try:
            return int(value)
        except ValueError:
            self.fail(f"{value!r} is neither {self.what} nor {self.words[0]!r}", param, ctx)


PORT_OR_OFF = _NumberOr("port|off", "a port number", ("off", "none", "no", "false"))
# auto: for --workers, resolved where the store's shards are known; for --store-shards, chosen
# from the cores where the store starts
COUNT_OR_AUTO = SHARDS_OR_AUTO = _NumberOr("count|auto", "a number", ("auto",))


def _cores() -> int:
    """The cores this process may use, its container's CPU quota counted (server/cpu_quota.py)."""
    return usable_cores()


def auto_workers(local_shards: int, cores: int | None = None) -> int:
    """`--workers auto`: one per core this process may use, less one per shard of the
    embedded store's local Cluster (`--store-shards`), which runs beside the workers on the
    same cores. A primary's core is busy about as long per message as a worker's, and workers
    past the cores left carried no more on a 16-core host, each message costing busd more
    CPU (docs/design.md §3.19)."""
    cores = _cores() if cores is None else cores
    return max(1, cores - local_shards) if local_shards > 1 else cores


def _parse_sas_keys(values: tuple[str, ...]) -> dict[str, str] | None:
    from busd.auth.rights import parse_key

    if not values:
        return None
    keys: dict[str, str] = {}
    for value in values:
        try:
            name, key = parse_key(value)
        except ValueError as exc:
            raise ConfigError(f"--sas-key: {exc}") from None
        keys[name] = key
    return keys


_LIMITS = Limits()
# (option, field, type, help): what one client may make the process hold (busd/broker/limits.py)
_LIMIT_OPTIONS = [
    (
        "--link-buffer",
        "link_buffer",
        int,
        "Bytes one link may buffer of an unfinished transfer (0: its queue's max message size "
        "+ 64 KiB); past it the transfer is refused, amqp:link:message-size-exceeded.",
    ),
    (
        "--connection-buffer",
        "connection_buffer",
        int,
        "Bytes of unfinished transfers one connection may buffer (default 16 MiB, at least the "
        "largest queue's max message size); past it the link is detached, "
        "amqp:resource-limit-exceeded.",
    ),
    (
        "--process-buffer",
        "process_buffer",
        int,
        "Bytes of unfinished transfers the process may buffer (default 32 MiB); past it the "
        "link is detached, amqp:resource-limit-exceeded.",
    ),
    (
        "--cbs-request-size",
        "cbs_request",
        int,
        "Largest $cbs request (a put-token is a few KB); past it the link is detached, "
        "amqp:link:message-size-exceeded.",
    ),
    (
        "--max-links-per-connection",
        "links_per_connection",
        int,
        "Links one connection may have; more are refused, amqp:resource-limit-exceeded.",
    ),
    (
        "--max-connections",
        "connections",
        int,
        "Authenticated connections this process serves at once (0: no cap); more are "
        "closed, amqp:resource-limit-exceeded.",
    ),
    (
        "--auth-timeout",
        "auth_timeout_s",
        float,
        "Seconds a connection may stay without a valid put-token (0: no limit); then it is "
        "closed, amqp:unauthorized-access.",
    ),
    (
        "--handshake-timeout",
        "handshake_timeout_s",
        float,
        "Seconds from a connection's accept to its AMQP open, TLS and WebSocket upgrade "
        "included (0: no limit); then its socket is closed.",
    ),
    (
        "--max-unauthenticated-connections",
        "unauthenticated",
        int,
        "Connections without a valid put-token yet, per process (0: no cap); past it a new "
        "one takes the place of the oldest of the address holding the most. Not counted in "
        "--max-connections.",
    ),
    (
        "--max-unauthenticated-per-address",
        "unauthenticated_per_address",
        int,
        "Connections without a valid put-token yet from one peer address (0: no cap); past "
        "it a new one from it takes the place of that address's oldest.",
    ),
]


def _limit_options(command):
    for option, name, kind, text in reversed(_LIMIT_OPTIONS):
        envvar = "BUSD_" + option.removeprefix("--").replace("-", "_").upper()
        command = click.option(
            option,
            name,
            envvar=envvar,
            type=kind,
            default=getattr(_LIMITS, name),
            show_default=True,
            help=text,
        )(command)
    return command
