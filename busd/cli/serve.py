"""`busd serve`: its options (each also an environment variable, `--port` is `BUSD_PORT`) and
the run of the server, in this process or as `--workers` processes."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import fields
from typing import Any

import click

from busd.broker.limits import Limits
from busd.cli.exits import EXIT_CONFIG, EXIT_OK, EXIT_UNAVAILABLE, _fail
from busd.cli.serve_options import (
    COUNT_OR_AUTO,
    PORT_OR_OFF,
    SHARDS_OR_AUTO,
    _limit_options,
    _parse_sas_keys,
    auto_workers,
)
from busd.config.settings import DURABILITIES, LOG_FORMATS, LOG_LEVELS, ConfigError, Settings

_DEFAULTS = Settings()
_FIELDS = {f.name: f for f in fields(Settings)}


def _option(option: str, field: str = "", **kw: Any) -> Callable[[Any], Any]:
    """An option of `busd serve` for the Settings field `field` (by default named after it):
    its environment variable BUSD_<OPTION>, its default the field's (shown where there is one;
    a repeatable option's none)."""
    name = option.removeprefix("--").replace("-", "_")
    field = field or name
    if not kw.get("multiple"):
        kw["default"] = default = getattr(_DEFAULTS, field)
        if default is not None and not kw.get("is_flag"):
            kw["show_default"] = True
    return click.option(option, field, envvar="BUSD_" + name.upper(), **kw)


@click.command()
@_option("--host", help="Address to listen on for AMQP (0.0.0.0 in a container).")
@_option("--port", type=int, help="AMQP port (HTTP and HTTPS answered on it too).")
@_option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    help="Entities file: the Service Bus emulator's Config.json, as is.",
)
@_option(
    "--redis-url",
    help="Redis/Valkey to keep state in (redis+cluster://host:port for a Cluster, "
    "redis+sentinel://host:port[,host:port...]/service for Sentinel); none: "
    "start an embedded Valkey.",
)
@_option(
    "--store-wait",
    "store_wait_s",
    type=float,
    help="Seconds start-up waits for --redis-url to answer, trying it every second (0: "
    "one try); then busd stops, exit code 69.",
)
@_option("--data-dir", help="Where the embedded Valkey keeps its files.")
@_option(
    "--http-port", type=int, help="Port for health, metrics and admin over HTTP (0: any free port)."
)
@_option(
    "--tls-port",
    type=PORT_OR_OFF,
    help="Port for AMQP over TLS and HTTPS (0: any free port, off: none).",
)
@_option(
    "--ws-port",
    type=PORT_OR_OFF,
    help="Port for AMQP over WebSockets, ws and wss, at /$servicebus/websocket "
    "(0: any free port, off: none).",
)
@_option(
    "--tls-cert",
    type=click.Path(dir_okay=False),
    help="PEM certificate (chain) for TLS; none: busd's own, signed by its certificate "
    "authority for local names, both kept in the data directory.",
)
@_option("--tls-key", type=click.Path(dir_okay=False), help="PEM private key of --tls-cert.")
@_option("--log-level", type=click.Choice(LOG_LEVELS, case_sensitive=False))
@_option("--log-format", type=click.Choice(LOG_FORMATS, case_sensitive=False))
@_option(
    "--sas-key",
    "sas_keys",
    multiple=True,
    metavar="NAME=KEY[:RIGHTS]",
    help="A shared access key clients may sign tokens with (repeatable; in "
    "BUSD_SAS_KEY separated by spaces), with its rights, e.g. "
    "reader=KEY:Listen or app=KEY:Send,Listen (none given: Send, Listen and "
    "Manage); default RootManageSharedAccessKey=SAS_KEY_VALUE, as the emulator.",
)
@_option("--key-prefix", help="Prefix of every store key: several brokers can share one Redis.")
@_option(
    "--sweep-interval",
    "sweep_interval_s",
    type=float,
    help="Seconds between sweeps for expired locks, TTL and scheduled messages.",
)
@_option(
    "--store-connections",
    type=int,
    help="Store calls in flight at once (pipelined on one connection); more wait "
    "for a turn, and one that waits 30 s is answered com.microsoft:server-busy.",
)
@_option(
    "--max-namespaces",
    type=int,
    help="Namespaces besides the default one served at once; past it the least recently "
    "used idle one is let go, and when all are in use a new one is refused (403).",
)
@_option(
    "--workers",
    type=COUNT_OR_AUTO,
    help="busd processes serving the same ports (auto: one per core it may use, "
    "its container's CPU quota counted, less one per --store-shards shard), started, "
    "restarted and stopped by this one; the embedded Valkey is started once.",
)
@_option(
    "--store-shards",
    type=SHARDS_OR_AUTO,
    help="valkey-servers the embedded store runs as one local Cluster, each with its own "
    "data under --data-dir (auto: half the cores); above 1, queues and topics are "
    "partitioned over them unless they say otherwise.",
)
@_option(
    "--durability",
    type=click.Choice(DURABILITIES, case_sensitive=False),
    help="When a send, settlement, session-state write or commit is acknowledged: "
    "once the store ran it (local), once the primary fsynced it (fsync), or "
    "once a replica has it too (replicated); both need appendonly yes.",
)
@_limit_options
@_option(
    "--transaction-timeout",
    "transaction_timeout_s",
    type=float,
    help="Seconds after its first operation a transaction is rolled back.",
)
@_option(
    "--max-http-connections",
    "http_connections",
    type=int,
    help="HTTP connections this process serves at once, on all ports (0: no cap); past it "
    "the oldest one not inside an authenticated request is closed, or the new one answered "
    "503.",
)
@_option(
    "--max-http-connections-per-address",
    "http_connections_per_address",
    type=int,
    help="HTTP connections this process serves at once from one peer address (0: no cap); "
    "past it that address's oldest one not inside an authenticated request is closed, or "
    "the new one answered 503.",
)
@_option(
    "--http-request-timeout",
    "http_request_timeout_s",
    type=float,
    help="Seconds an HTTP request's head (its line and headers), and the body of one sent "
    "without a key (health, the dashboard), may take to arrive; then the connection is "
    "closed (408).",
)
@_option(
    "--hostname",
    "hostnames",
    multiple=True,
    help="A host name clients reach busd by beyond localhost and its addresses (repeatable; "
    "in BUSD_HOSTNAME separated by spaces), e.g. the service's name in a container network: "
    "HTTP requests naming another host are refused (421).",
)
@_option(
    "--allowed-origin",
    "allowed_origins",
    multiple=True,
    help="A web origin (https://app.example:8080, or * for any) whose pages may open AMQP "
    "over WebSockets, beyond pages of localhost and of --hostname (repeatable).",
)
@_option(
    "--faults",
    is_flag=True,
    help="Accept faults on demand over the admin API (docs/faults.md): for resilience tests, "
    "never in production.",
)
def serve(**options: Any) -> None:
    """Run the broker until interrupted."""
    try:
        settings = settings_from_options(options)
    except ConfigError as e:
        _fail(str(e), EXIT_CONFIG)

    # Ctrl-C before the server runs (SIGTERM then is only noted: busd/server/stop_request.py)
    try:
        code = _run(settings)
    except KeyboardInterrupt:
        code = EXIT_OK
    sys.exit(code or EXIT_OK)


def _run(settings: Settings) -> int:
    """Run the server (one process or workers) until stopped; its exit code, or a failure to
    start as one line and its code."""
    # late: `busd --help` need not import the whole broker
    from busd.server.lifecycle import run
    from busd.server.workers import run as run_workers
    from busd.storage.redis.embedded import EmbeddedStoreError
    from busd.storage.redis.waiting import StoreNotReady

    try:
        return run(settings) if settings.workers == 1 else run_workers(settings)
    except ConfigError as e:
        _fail(str(e), EXIT_CONFIG)
    except (EmbeddedStoreError, StoreNotReady) as e:
        _fail(str(e), EXIT_UNAVAILABLE)
    except OSError as e:  # typically a port already in use
        _fail(f"{e.strerror or e}" + (f": {e.filename}" if e.filename else ""), EXIT_UNAVAILABLE)
    return EXIT_OK  # not reached: _fail exits


def settings_from_options(options: dict[str, Any]) -> Settings:
    """`busd serve`'s options as Settings, checked: each option is named after its field (a
    client limit after its field of `Limits`), so a new setting needs its field, its option
    and the code that uses it, nothing here."""
    limits = Limits(**{f.name: options.pop(f.name) for f in fields(Limits)})
    sas_keys = _parse_sas_keys(options.pop("sas_keys"))
    values: dict[str, Any] = {}
    for name, value in options.items():
        if isinstance(value, tuple):  # a repeatable option
            value = list(value)
        elif value == "" and _FIELDS[name].default is None:  # BUSD_REDIS_URL= and the like
            value = None
        values[name] = value
    values["durability"] = values["durability"].lower()
    values["workers_auto"] = values["workers"] is None
    if values["workers"] is None:
        from busd.storage.redis.embedded import shard_count

        # a store of its own only without --redis-url (Settings.validate refuses shards there)
        stores = 1 if values["redis_url"] else shard_count(values["store_shards"])
        values["workers"] = auto_workers(stores)
    settings = Settings(**values, limits=limits)
    if sas_keys:
        settings.sas_keys = sas_keys
    settings.validate()
    return settings
