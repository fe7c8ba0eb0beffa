"""`busd serve`: its options (each also an environment variable, `--port` is `BUSD_PORT`) and
the run of the server, in this process or as `--workers` processes."""

from __future__ import annotations

import sys
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


@click.command()
@click.option(
    "--host",
    envvar="BUSD_HOST",
    default=_DEFAULTS.host,
    show_default=True,
    help="Address to listen on for AMQP (0.0.0.0 in a container).",
)
@click.option(
    "--port",
    envvar="BUSD_PORT",
    type=int,
    default=_DEFAULTS.port,
    show_default=True,
    help="AMQP port (HTTP and HTTPS answered on it too).",
)
@click.option(
    "--config",
    "config_path",
    envvar="BUSD_CONFIG",
    default=None,
    type=click.Path(dir_okay=False),
    help="Entities file: the Service Bus emulator's Config.json, as is.",
)
@click.option(
    "--redis-url",
    envvar="BUSD_REDIS_URL",
    default=None,
    help="Redis/Valkey to keep state in (redis+cluster://host:port for a Cluster, "
    "redis+sentinel://host:port[,host:port...]/service for Sentinel); none: "
    "start an embedded Valkey.",
)
@click.option(
    "--store-wait",
    "store_wait_s",
    envvar="BUSD_STORE_WAIT",
    type=float,
    default=_DEFAULTS.store_wait_s,
    show_default=True,
    help="Seconds start-up waits for --redis-url to answer, trying it every second (0: "
    "one try); then busd stops, exit code 69.",
)
@click.option(
    "--data-dir",
    envvar="BUSD_DATA_DIR",
    default=_DEFAULTS.data_dir,
    show_default=True,
    help="Where the embedded Valkey keeps its files.",
)
@click.option(
    "--http-port",
    envvar="BUSD_HTTP_PORT",
    type=int,
    default=_DEFAULTS.http_port,
    show_default=True,
    help="Port for health, metrics and admin over HTTP (0: any free port).",
)
@click.option(
    "--tls-port",
    envvar="BUSD_TLS_PORT",
    type=PORT_OR_OFF,
    default=_DEFAULTS.tls_port,
    show_default=True,
    help="Port for AMQP over TLS and HTTPS (0: any free port, off: none).",
)
@click.option(
    "--ws-port",
    envvar="BUSD_WS_PORT",
    type=PORT_OR_OFF,
    default=_DEFAULTS.ws_port,
    show_default=True,
    help="Port for AMQP over WebSockets, ws and wss, at /$servicebus/websocket "
    "(0: any free port, off: none).",
)
@click.option(
    "--tls-cert",
    envvar="BUSD_TLS_CERT",
    default=None,
    type=click.Path(dir_okay=False),
    help="PEM certificate (chain) for TLS; none: busd's own, signed by its certificate "
    "authority for local names, both kept in the data directory.",
)
@click.option(
    "--tls-key",
    envvar="BUSD_TLS_KEY",
    default=None,
    type=click.Path(dir_okay=False),
    help="PEM private key of --tls-cert.",
)
@click.option(
    "--log-level",
    envvar="BUSD_LOG_LEVEL",
    default=_DEFAULTS.log_level,
    show_default=True,
    type=click.Choice(LOG_LEVELS, case_sensitive=False),
)
@click.option(
    "--log-format",
    envvar="BUSD_LOG_FORMAT",
    default=_DEFAULTS.log_format,
    show_default=True,
    type=click.Choice(LOG_FORMATS, case_sensitive=False),
)
@click.option(
    "--sas-key",
    "sas_keys",
    envvar="BUSD_SAS_KEY",
    multiple=True,
    metavar="NAME=KEY[:RIGHTS]",
    help="A shared access key clients may sign tokens with (repeatable; in "
    "BUSD_SAS_KEY separated by spaces), with its rights, e.g. "
    "reader=KEY:Listen or app=KEY:Send,Listen (none given: Send, Listen and "
    "Manage); default RootManageSharedAccessKey=SAS_KEY_VALUE, as the emulator.",
)
@click.option(
    "--key-prefix",
    envvar="BUSD_KEY_PREFIX",
    default=_DEFAULTS.key_prefix,
    show_default=True,
    help="Prefix of every store key: several brokers can share one Redis.",
)
@click.option(
    "--sweep-interval",
    "sweep_interval_s",
    envvar="BUSD_SWEEP_INTERVAL",
    type=float,
    default=_DEFAULTS.sweep_interval_s,
    show_default=True,
    help="Seconds between sweeps for expired locks, TTL and scheduled messages.",
)
@click.option(
    "--store-connections",
    envvar="BUSD_STORE_CONNECTIONS",
    type=int,
    default=_DEFAULTS.store_connections,
    show_default=True,
    help="Store calls in flight at once (pipelined on one connection); more wait "
    "for a turn, and one that waits 30 s is answered com.microsoft:server-busy.",
)
@click.option(
    "--max-namespaces",
    envvar="BUSD_MAX_NAMESPACES",
    type=int,
    default=_DEFAULTS.max_namespaces,
    show_default=True,
    help="Namespaces besides the default one served at once; past it the least recently "
    "used idle one is let go, and when all are in use a new one is refused (403).",
)
@click.option(
    "--workers",
    envvar="BUSD_WORKERS",
    type=COUNT_OR_AUTO,
    default=_DEFAULTS.workers,
    show_default=True,
    help="busd processes serving the same ports (auto: one per core it may use, "
    "its container's CPU quota counted, less one per --store-shards shard), started, "
    "restarted and stopped by this one; the embedded Valkey is started once.",
)
@click.option(
    "--store-shards",
    envvar="BUSD_STORE_SHARDS",
    type=SHARDS_OR_AUTO,
    default=_DEFAULTS.store_shards,
    show_default=True,
    help="valkey-servers the embedded store runs as one local Cluster, each with its own "
    "data under --data-dir (auto: half the cores); above 1, queues and topics are "
    "partitioned over them unless they say otherwise.",
)
@click.option(
    "--durability",
    envvar="BUSD_DURABILITY",
    default=_DEFAULTS.durability,
    show_default=True,
    type=click.Choice(DURABILITIES, case_sensitive=False),
    help="When a send, settlement, session-state write or commit is acknowledged: "
    "once the store ran it (local), once the primary fsynced it (fsync), or "
    "once a replica has it too (replicated); both need appendonly yes.",
)
@_limit_options
@click.option(
    "--transaction-timeout",
    "transaction_timeout_s",
    envvar="BUSD_TRANSACTION_TIMEOUT",
    type=float,
    default=_DEFAULTS.transaction_timeout_s,
    show_default=True,
    help="Seconds after its first operation a transaction is rolled back.",
)
@click.option(
    "--max-http-connections",
    "http_connections",
    envvar="BUSD_MAX_HTTP_CONNECTIONS",
    type=int,
    default=_DEFAULTS.http_connections,
    show_default=True,
    help="HTTP connections this process serves at once, on all ports (0: no cap); past it "
    "the oldest one not inside an authenticated request is closed, or the new one answered "
    "503.",
)
@click.option(
    "--max-http-connections-per-address",
    "http_connections_per_address",
    envvar="BUSD_MAX_HTTP_CONNECTIONS_PER_ADDRESS",
    type=int,
    default=_DEFAULTS.http_connections_per_address,
    show_default=True,
    help="HTTP connections this process serves at once from one peer address (0: no cap); "
    "past it that address's oldest one not inside an authenticated request is closed, or "
    "the new one answered 503.",
)
@click.option(
    "--http-request-timeout",
    "http_request_timeout_s",
    envvar="BUSD_HTTP_REQUEST_TIMEOUT",
    type=float,
    default=_DEFAULTS.http_request_timeout_s,
    show_default=True,
    help="Seconds an HTTP request's head (its line and headers), and the body of one sent "
    "without a key (health, the dashboard), may take to arrive; then the connection is "
    "closed (408).",
)
@click.option(
    "--hostname",
    "hostnames",
    envvar="BUSD_HOSTNAME",
    multiple=True,
    help="A host name clients reach busd by beyond localhost and its addresses (repeatable; "
    "in BUSD_HOSTNAME separated by spaces), e.g. the service's name in a container network: "
    "HTTP requests naming another host are refused (421).",
)
@click.option(
    "--allowed-origin",
    "allowed_origins",
    envvar="BUSD_ALLOWED_ORIGIN",
    multiple=True,
    help="A web origin (https://app.example:8080, or * for any) whose pages may open AMQP "
    "over WebSockets, beyond pages of localhost and of --hostname (repeatable).",
)
@click.option(
    "--faults",
    envvar="BUSD_FAULTS",
    is_flag=True,
    default=_DEFAULTS.faults,
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
