"""The `busd` command line. Every option is also an environment variable: `--redis-url` is
`BUSD_REDIS_URL`, `--port` is `BUSD_PORT`, and so on.

Users meet a bad setting as one line on stderr and a named exit code, not a traceback.
"""

from __future__ import annotations

import sys
import time

import click

from busd import __version__
from busd.broker.limits import Limits
from busd.config import DURABILITIES, LOG_FORMATS, LOG_LEVELS, ConfigError, Settings
from busd.cpu_quota import usable_cores
from busd.entity_tools import COMMANDS as ENTITY_COMMANDS
from busd.fault_tools import COMMANDS as FAULT_COMMANDS
from busd.message_tools import COMMANDS as MESSAGE_COMMANDS
from busd.session_tools import COMMANDS as SESSION_COMMANDS

EXIT_OK = 0
EXIT_FAILURE = 1  # the server stopped on an error at run time
EXIT_CONFIG = 78  # sysexits EX_CONFIG: a setting or the entities file is wrong
EXIT_STARTUP = 69  # sysexits EX_UNAVAILABLE: the store or a port could not be had

_DEFAULTS = Settings()


class _PortOrOff(click.ParamType):
    name = "port|off"

    def convert(self, value, param, ctx):
        if value is None or isinstance(value, int):
            return value
        if str(value).strip().lower() in ("off", "none", "no", "false"):
            return None
        try:
            return int(value)
        except ValueError:
            self.fail(f"{value!r} is neither a port number nor 'off'", param, ctx)


PORT_OR_OFF = _PortOrOff()


def _cores() -> int:
    """`--workers auto`: the cores this process may use, its container's CPU quota counted
    (busd/cpu_quota.py)."""
    return usable_cores()


class _CountOrAuto(click.ParamType):
    name = "count|auto"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        if str(value).strip().lower() == "auto":
            return _cores()
        try:
            return int(value)
        except ValueError:
            self.fail(f"{value!r} is neither a number nor 'auto'", param, ctx)


COUNT_OR_AUTO = _CountOrAuto()


class _ShardsOrAuto(click.ParamType):
    name = "count|auto"

    def convert(self, value, param, ctx):
        if value is None or isinstance(value, int):
            return value
        if str(value).strip().lower() == "auto":
            return None  # chosen from the cores where the store starts
        try:
            return int(value)
        except ValueError:
            self.fail(f"{value!r} is neither a number nor 'auto'", param, ctx)


SHARDS_OR_AUTO = _ShardsOrAuto()


def _fail(message: str, code: int) -> None:
    click.echo(f"busd: error: {message}", err=True)
    sys.exit(code)


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
        "Connections without a valid put-token yet, per process (0: no cap); more are closed "
        "as they are accepted. Not counted in --max-connections.",
    ),
    (
        "--max-unauthenticated-per-address",
        "unauthenticated_per_address",
        int,
        "Connections without a valid put-token yet from one peer address (0: no cap); more "
        "from it are closed as they are accepted.",
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


@click.group(context_settings={"auto_envvar_prefix": "BUSD", "help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="busd")
def cli() -> None:
    """busd: Azure Service Bus sessions over AMQP 1.0, with its state in Redis or Valkey."""


@cli.command()
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
    "its container's CPU quota counted), started, "
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
    "an idle one is closed, or the new one answered 503.",
)
@click.option(
    "--http-request-timeout",
    envvar="BUSD_HTTP_REQUEST_TIMEOUT",
    type=float,
    default=_DEFAULTS.http_request_timeout_s,
    show_default=True,
    help="Seconds an HTTP request's head (its line and headers) may take to arrive; then "
    "the connection is closed (408).",
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
def serve(
    host: str,
    port: int,
    config_path: str | None,
    redis_url: str | None,
    store_wait: float,
    data_dir: str,
    http_port: int,
    tls_port: int | None,
    ws_port: int | None,
    tls_cert: str | None,
    tls_key: str | None,
    log_level: str,
    log_format: str,
    sas_keys: tuple[str, ...],
    key_prefix: str,
    sweep_interval: float,
    store_connections: int,
    max_namespaces: int,
    transaction_timeout: float,
    workers: int,
    store_shards: int | None,
    durability: str,
    http_connections: int,
    http_request_timeout: float,
    hostnames: tuple[str, ...],
    allowed_origins: tuple[str, ...],
    **limits,
) -> None:
    """Run the broker until interrupted."""
    try:
        settings = Settings(
            host=host,
            port=port,
            redis_url=redis_url or None,
            store_wait_s=store_wait,
            data_dir=data_dir,
            config_path=config_path or None,
            http_port=http_port,
            tls_port=tls_port,
            ws_port=ws_port,
            tls_cert=tls_cert or None,
            tls_key=tls_key or None,
            log_level=log_level,
            log_format=log_format,
            key_prefix=key_prefix,
            sweep_interval_s=sweep_interval,
            store_connections=store_connections,
            max_namespaces=max_namespaces,
            transaction_timeout_s=transaction_timeout,
            workers=workers,
            store_shards=store_shards,
            durability=durability.lower(),
            limits=Limits(**limits),
            http_connections=http_connections,
            http_request_timeout_s=http_request_timeout,
            hostnames=list(hostnames),
            allowed_origins=list(allowed_origins),
        )
        keys = _parse_sas_keys(sas_keys)
        if keys:
            settings.sas_keys = keys
        settings.validate()
    except ConfigError as e:
        _fail(str(e), EXIT_CONFIG)

    # late: `busd --help` need not import the whole broker
    from busd.server import run
    from busd.storage.embedded import EmbeddedStoreError
    from busd.storage.waiting import StoreNotReady
    from busd.workers import run as run_workers

    try:
        code = run(settings) if settings.workers == 1 else run_workers(settings)
    except ConfigError as e:
        _fail(str(e), EXIT_CONFIG)
    except (EmbeddedStoreError, StoreNotReady) as e:
        _fail(str(e), EXIT_STARTUP)
    except OSError as e:  # typically a port already in use
        _fail(f"{e.strerror or e}" + (f": {e.filename}" if e.filename else ""), EXIT_STARTUP)
    except KeyboardInterrupt:
        code = EXIT_OK
    sys.exit(code or EXIT_OK)


@cli.command("sas-token")
@click.option(
    "--audience",
    required=True,
    help="What the token grants, e.g. sb://localhost:5672/myqueue "
    "(or sb://localhost:5672/ for all).",
)
@click.option(
    "--key-name", envvar="BUSD_SAS_KEY_NAME", default="RootManageSharedAccessKey", show_default=True
)
@click.option("--key", envvar="BUSD_SAS_KEY_VALUE", default="SAS_KEY_VALUE", show_default=True)
@click.option("--ttl", type=int, default=3600, show_default=True, help="Seconds of validity.")
def sas_token(audience: str, key_name: str, key: str, ttl: int) -> None:
    """Print a SharedAccessSignature token, as the Service Bus SDKs make them."""
    from busd.auth.sas import generate_sas_token

    click.echo(generate_sas_token(audience, key_name, key, int(time.time()) + ttl))


@cli.group("config")
def config_group() -> None:
    """The entities file (the emulator's Config.json) as code: export a running busd's
    namespace, or import an ARM template's Service Bus resources (docs/topology.md)."""


def _write_document(document: dict, output: str) -> None:
    import json

    text = json.dumps(document, indent=2) + "\n"
    if output == "-":
        click.echo(text, nl=False)
    else:
        with open(output, "w", encoding="utf-8") as out:
            out.write(text)


def _notes(notes: list[str]) -> None:
    for note in notes:
        click.echo(f"busd: note: {note}", err=True)


@config_group.command("export")
@click.option(
    "--output", "-o", default="-", metavar="PATH", help="Where to write it (default: stdout)."
)
@click.option(
    "--url",
    envvar="BUSD_URL",
    default="http://127.0.0.1:5300",
    show_default=True,
    help="busd's HTTP address (its --http-port; https:// too).",
)
@click.option(
    "--cacert", envvar="BUSD_CACERT", default=None, metavar="PATH", help="CA for https://."
)
def config_export(output: str, url: str, cacert: str | None) -> None:
    """Write the namespace busd serves at --url (the one BUSD_SAS_KEY's key name picks) as a
    Config.json that `busd serve --config` serves back: queues, topics, subscriptions,
    rules and their properties."""
    from busd.config_export import export_namespace
    from busd.entity_tools import AtomClient

    exported = export_namespace(AtomClient(url, cacert))
    _write_document(exported.document, output)
    _notes(exported.notes)


@config_group.command("import")
@click.argument("template", type=click.File("r", encoding="utf-8-sig"))
@click.option(
    "--parameter",
    "-p",
    "parameters",
    multiple=True,
    metavar="NAME=VALUE",
    help="A template parameter's value, over its defaultValue (repeatable).",
)
@click.option(
    "--parameters",
    "parameters_file",
    type=click.File("r", encoding="utf-8-sig"),
    default=None,
    metavar="PATH",
    help="An ARM parameters file (azuredeploy.parameters.json); --parameter wins over it.",
)
@click.option(
    "--key",
    "keys",
    multiple=True,
    metavar="NAME=KEY",
    help="The key of a namespace authorization rule (Azure makes them; default: a new one).",
)
@click.option(
    "--output", "-o", default="-", metavar="PATH", help="Where to write it (default: stdout)."
)
def config_import(
    template, parameters: tuple[str, ...], parameters_file, keys: tuple[str, ...], output: str
) -> None:
    """Convert an ARM template (JSON) with Service Bus resources into a Config.json for
    `busd serve --config`; refuse, naming the resource and property, what busd cannot honour."""
    import json

    from busd.arm import convert
    from busd.arm_expressions import TemplateError
    from busd.tools import EXIT_INVALID

    def pairs(values: tuple[str, ...], option: str) -> dict[str, str]:
        out = {}
        for value in values:
            name, sep, text = value.partition("=")
            if not sep or not name:
                raise click.BadParameter(f"takes NAME=VALUE, got {value!r}", param_hint=option)
            out[name] = text
        return out

    given: dict = {}
    try:
        document = json.load(template)
        if parameters_file is not None:
            given = {
                name: spec.get("value") if isinstance(spec, dict) else spec
                for name, spec in (json.load(parameters_file).get("parameters") or {}).items()
            }
    except (ValueError, AttributeError) as exc:
        _fail(f"not a JSON template or parameters file: {exc}", EXIT_INVALID)
    given.update(pairs(parameters, "--parameter"))
    try:
        converted = convert(document, given, pairs(keys, "--key"))
    except TemplateError as exc:
        _fail(f"{template.name}: {exc}", EXIT_INVALID)
    _write_document(converted.document, output)
    _notes(converted.notes)


# Operator tools over the admin HTTP API (busd.tools documents their exit codes).
for _command in (*MESSAGE_COMMANDS, *SESSION_COMMANDS, *FAULT_COMMANDS, *ENTITY_COMMANDS):
    cli.add_command(_command)


def main(argv: list[str] | None = None) -> None:
    cli.main(args=argv, prog_name="busd", auto_envvar_prefix="BUSD")
