"""The server lifecycle: startup(), serve until a signal, shutdown() - in that order."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import ssl
import sys
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from proton import Condition, symbol

from busd import __version__
from busd.amqp.protocol import AmqpProtocol
from busd.broker.broker import Broker
from busd.broker.links.connection import LIVE_CONNECTIONS, ConnectionHandler, kept_endpoints
from busd.broker.namespaces import Namespaces
from busd.config.entities_file import EntitiesFile, load_entities
from busd.config.settings import Settings
from busd.net import origins, ports
from busd.net.host_certificates import HostIssuer
from busd.net.listener import Admission, Pending
from busd.net.ports import ServicePort, Services
from busd.net.tls import Tls
from busd.net.tls import load as load_tls
from busd.server import stop_request
from busd.server.exposure import default_key_warning
from busd.server.seeding import seed_catalog
from busd.storage import keys as keyspace
from busd.storage.redis.waiting import wait_for_store

uvloop: Any
try:
    import uvloop
except ImportError:  # not built for this platform (Windows): the stock event loop
    uvloop = None

if TYPE_CHECKING:
    from busd.amqp.websocket import WebSocketServer
    from busd.http.server import HttpService
    from busd.observability.peers import Peers
    from busd.server.worker_role import WorkerRole
    from busd.storage.redis.embedded import EmbeddedCluster, EmbeddedValkey

log = logging.getLogger("busd")

# How long shutdown waits for clients to finish before closing their sockets.
GRACE_S = 3.0
# The Service Bus emulator's line once it serves: what launchers that wait for the emulator
# (Testcontainers, compose health scripts) watch its output for. Printed after the banner,
# once every listener and the store are ready (docs/design.md §3.1).
READY_LINE = "Emulator Service is Successfully Up!"


def redacted(url: str) -> str:
    """A store URL fit for logs: its password replaced by ***."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


def _names(entities, shown: int = 10) -> str:
    names = sorted(entities)
    more = f", ... {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def client_host(settings: Settings) -> str:
    """The host a client on this machine names: localhost for loopback or every address."""
    loopback_or_any = settings.host in ("127.0.0.1", "0.0.0.0", "::")
    return "localhost" if loopback_or_any else settings.host


def connection_string(
    settings: Settings, host: str | None = None, port: int | None = None, tls: bool = False
) -> str:
    """What clients paste; `port`: the one actually bound (with --port 0). `tls`: the string
    for the TLS listener, without the emulator flag (the SDKs then speak TLS; most of them
    connect to port 5671 whatever the string says)."""
    key_name, key = next(iter(settings.sas_keys.items()))
    host = host or client_host(settings)
    emulator = "" if tls else "UseDevelopmentEmulator=true;"
    return (
        f"Endpoint=sb://{host}:{port or settings.port};SharedAccessKeyName={key_name};"
        f"SharedAccessKey={key};{emulator}"
    )


def admin_clients(cert: str) -> list[str]:
    """What ServiceBusAdministrationClient needs besides the connection string, per SDK: every
    AMQP port answers its management API too (busd/net/ports.py), so the one string serves both
    clients, but the Python and JavaScript admin clients speak HTTPS whatever the string says
    (docs/management.md §1), and must trust busd's certificate."""
    return [
        "  admin clients: the connection string below too; those of Python and JavaScript speak"
        " HTTPS to its port, trusting busd's certificate so:",
        "    Python:     ServiceBusAdministrationClient.from_connection_string(conn, "
        f'connection_verify="{cert}")',
        f"    JavaScript: NODE_EXTRA_CA_CERTS={cert} node app.js",
        "    .NET:       nothing more (plain HTTP with UseDevelopmentEmulator=true)",
    ]


class Server:
    """Process scope: the store (embedded or remote), the broker, the listeners."""

    def __init__(
        self,
        settings: Settings,
        entities: EntitiesFile | None = None,
        role: WorkerRole | None = None,
    ) -> None:
        self.settings = settings
        # One worker of several on this host (busd/server/workers.py): its listening sockets and
        # its peers come from its parent, which also runs the embedded store.
        self.role = role
        self.peers: Peers | None = None
        self.entities = entities or EntitiesFile()
        self.embedded: EmbeddedValkey | EmbeddedCluster | None = None
        self.broker: Broker | None = None  # the default namespace's
        self.namespaces: Namespaces | None = None
        self.listener: ServicePort | None = None  # --port
        self.http: ServicePort | None = None  # --http-port
        self.http_service: HttpService | None = None
        self.protocols: set[AmqpProtocol] = set()
        self.tls_context: ssl.SSLContext | None = None
        self.tls: Tls | None = None
        self.tls_listener: ServicePort | None = None  # --tls-port
        self.ws: WebSocketServer | None = None

    @property
    def port(self) -> int:
        assert self.listener is not None, "not started"
        return self.listener.port

    @property
    def tls_port(self) -> int | None:
        return None if self.tls_listener is None else self.tls_listener.port

    async def startup(self) -> None:
        from busd.storage.partitioned.router import wrap
        from busd.storage.redis.store import RedisStore

        settings = self.settings
        url = settings.redis_url
        if not url:
            from busd.storage.redis.embedded import embedded_store, shard_count

            self.embedded = embedded_store(settings.data_dir, shard_count(settings.store_shards))
            # On this thread, not a worker thread: its servers end when the thread that
            # started them does (busd/process/children.py). Nothing is served yet to wait.
            self.embedded.start()
            url = self.embedded.url

        def process_id() -> str | None:
            """A worker's start with the prefix its parent chose (busd/server/worker_role.py)."""
            return self.role.new_process_id() if self.role is not None else None

        broker_settings = settings.broker_settings()

        def make_broker(prefix: str, sas_keys: dict[str, str], metrics=None) -> Broker:
            """A broker over its own key prefix of the store (the default namespace's, or
            another's: docs/design.md §3.17), with the server's broker settings."""
            store = wrap(
                RedisStore(
                    url,
                    prefix=prefix,
                    max_calls=settings.store_connections,
                    durability=settings.durability,
                    process_id=process_id(),
                )
            )
            return Broker(store, sas_keys=sas_keys, settings=broker_settings, metrics=metrics)

        metrics = None
        try:
            from busd.observability.metrics import Metrics

            metrics = Metrics()
            metrics.set_census(lambda: len(LIVE_CONNECTIONS), kept_endpoints)
        except ImportError:
            pass
        self.broker = make_broker(settings.key_prefix, settings.sas_keys, metrics)
        if metrics is not None:  # every connection's buffers count in the default broker's
            buffers = self.broker.buffers
            metrics.set_buffers(lambda: buffers.held)
        await self.broker.start()

        async def namespace(name: str) -> Broker:
            """A namespace other than the default: a broker of its own over its own key
            prefix, with the default namespace's keys (docs/design.md §3.17)."""
            assert self.namespaces is not None
            prefix = keyspace.namespace_prefix(settings.key_prefix, name)
            broker = make_broker(prefix, dict(self.namespaces.keys(name)))
            if self.role is not None:
                self.role.serving(prefix)
            await broker.start()
            return broker

        self.namespaces = Namespaces(self.broker, namespace, max_namespaces=settings.max_namespaces)
        # The certificate of every TLS listener; made (RSA key generation) off the event loop.
        self.tls = await asyncio.to_thread(
            load_tls,
            settings.tls_cert,
            settings.tls_key,
            settings.data_dir,
            [settings.host, *settings.hostnames],
        )
        self.tls_context = self.tls.context
        if isinstance(self.tls_context.sni_callback, HostIssuer):
            self.tls_context.sni_callback.known = self.namespaces.known
        await seed_catalog(self.broker.catalog, self.entities)
        if self.role is not None:
            await self._join_peers(self.role.peer_dir, metrics)
        role = self.role

        def listen(name: str, port: int, plain: bool = True) -> ServicePort:
            # a worker of several listens on the socket its parent's role gives it
            sock = role.socket(name, settings.host) if role is not None else None
            return ports.listen(
                settings.host, port, services, name, plain, sock=sock, admission=admission
            )

        # AMQP and HTTP on every port (busd/net/ports.py): the AMQP port, the TLS port (TLS only)
        # and the HTTP port; port 0: any free port (the banner tells which).
        from busd.http import front
        from busd.http.server import HttpLimits, HttpService

        # the hosts HTTP serves, the pages WebSockets serve (busd.net.origins); --host when a name
        hostnames = [*settings.hostnames]
        if settings.host and not origins.is_address(settings.host):
            hostnames.append(settings.host)
        origins.configure(origins.HostPolicy.of(hostnames, settings.allowed_origins))
        routes = front.handler(self)
        self.http_service = HttpService(
            routes.handle,
            routes.admit,
            HttpLimits(
                settings.http_connections,
                settings.http_request_timeout_s,
                settings.http_connections_per_address,
            ),
            metrics,
        )
        # every port's unauthenticated connections, counted and timed together
        limits = settings.limits
        admission = Admission(
            limits.handshake_timeout_s,
            limits.unauthenticated,
            limits.unauthenticated_per_address,
            metrics,
        )
        services = Services(self._new_protocol, self.http_service.protocol, self.tls_context)
        self.listener = listen("amqp", settings.port)
        if settings.tls_port is not None:
            self.tls_listener = listen("tls", settings.tls_port, plain=False)
        if settings.ws_port is not None:
            # AMQP over WebSockets, ws and wss: the same engine behind the WebSocket framing.
            from busd.amqp import websocket

            self.ws = await websocket.start(
                settings.host,
                settings.ws_port,
                self.tls_context,
                self._new_protocol,
                sock=role.socket("ws", settings.host) if role is not None else None,
                admission=admission,
            )
        self.http = listen("http", settings.http_port)

    async def _join_peers(self, directory: str, metrics) -> None:
        """Answer the other workers for this one's figures, and gather theirs at a scrape
        (busd/observability/peers.py)."""
        from busd.observability.peers import Peers

        def report() -> dict[str, Any]:
            return {
                "pid": os.getpid(),
                "connections": len(self.protocols),
                "metrics": metrics.process_text() if metrics is not None else "",
            }

        async def host_figures() -> list[str]:
            assert self.peers is not None
            return [r["metrics"] for r in await self.peers.reports()]

        self.peers = Peers(directory, report)
        await self.peers.start()
        if metrics is not None:
            metrics.host_figures = host_figures

    def _new_protocol(self, pending: Pending | None = None) -> AmqpProtocol:
        broker, namespaces = self.broker, self.namespaces
        assert broker is not None, "not started"
        return AmqpProtocol(
            lambda p: ConnectionHandler(p, broker, namespaces),
            on_closed=self.protocols.discard,
            on_opened=self.protocols.add,
            pending=pending,
        )

    def banner(self) -> str:
        settings = self.settings
        store_detail: list[str] = []
        if self.embedded or (self.role is not None and self.role.embedded):
            from busd.storage.redis.embedded import allocator, default_partitions, shard_count

            store = f"embedded Valkey in {os.path.abspath(settings.data_dir)}"
            store_detail.append(f"  allocator: {allocator()}")
            shards = shard_count(settings.store_shards)
            if shards > 1:
                store = (
                    f"embedded Valkey Cluster of {shards} shards"
                    + (f" (auto: {_cores()} cores)" if settings.store_shards is None else "")
                    + f" in {os.path.abspath(settings.data_dir)}/shard-*"
                )
                store_detail.append(
                    f"  partitions: queues and topics in {default_partitions(shards)} by "
                    "default, spread evenly over the shards"
                )
        else:
            store = redacted(settings.redis_url or "")
        assert self.broker is not None
        catalog = self.broker.catalog
        queues = [q.name for q in catalog.queues()]
        topics = catalog.topics()
        subscriptions = sum(len(catalog.subscriptions(t.name)) for t in topics)
        lines = [
            f"busd {__version__} listening on amqp://{settings.host}:{self.port}",
            f"  store:    {store}",
            *store_detail,
            f"  entities: {len(queues)} queue(s)"
            + (f" ({_names(queues)})" if queues else "")
            + f", {len(topics)} topic(s)"
            + (
                f" ({_names(t.name for t in topics)}; {subscriptions} subscription(s))"
                if topics
                else ""
            )
            + (f"; seeded from {settings.config_path}" if settings.config_path else ""),
        ]
        if self.tls_port is not None:
            lines.append(f"  amqps:    amqps://{settings.host}:{self.tls_port}")
        if self.ws is not None:
            lines.append(
                f"  ws:       ws://{settings.host}:{self.ws.port}/$servicebus/websocket (and wss)"
            )
        if self.http is not None:
            lines.append(
                f"  http:     http://{settings.host}:{self.http.port}/health, /metrics, /admin"
            )
        if self.http is not None:
            lines.append(f"  dashboard: http://{client_host(settings)}:{self.http.port}/")
        if settings.faults:
            lines.append("  faults:   on demand, over /admin/faults (--faults: for tests only)")
        if self.tls is not None:
            made = " (busd's CA, for local names only)" if self.tls.generated else ""
            lines.append(f"  certificate: {os.path.abspath(self.tls.cert_path)}{made}")
        if self.tls_port is not None:
            lines.append(
                "  TLS connection string: "
                + connection_string(self.settings, port=self.tls_port, tls=True)
            )
        if self.tls is not None:
            lines.extend(admin_clients(os.path.abspath(self.tls.cert_path)))
        # last: a launcher reading the banner knows it has all of it once this line is there;
        # the data and the admin clients' string alike
        lines.append(f"  connection string: {connection_string(self.settings, port=self.port)}")
        return "\n".join(lines)

    async def shutdown(self) -> None:
        for port in (self.listener, self.tls_listener, self.ws, self.http):
            if port is not None:
                await port.close()
        if self.http_service is not None:
            await self.http_service.close()
        closing = Condition(
            "amqp:connection:forced",
            "The broker is shutting down.",
            {symbol("tracking-id"): "busd"},
        )
        for proto in list(self.protocols):
            proto.shutdown(closing)
        # Let the connections' clean-up (session releases) reach the store before it closes:
        # a connection starts it once its socket is closed (a turn of the event loop later,
        # or when a peer that does not read is cut off), so first wait for every socket.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + GRACE_S
        while self.protocols and loop.time() < deadline:
            await asyncio.sleep(0.01)
        current = asyncio.current_task()
        pending = [
            t
            for t in asyncio.all_tasks()
            if t is not current and not t.done() and not (t.get_name() or "").startswith("busd-")
        ]
        if pending:
            await asyncio.wait(pending, timeout=max(0.1, deadline - loop.time()))
        if self.peers is not None:
            await self.peers.close()
        if self.namespaces is not None:
            await self.namespaces.stop()
        if self.broker is not None:
            await self.broker.stop()
        if self.embedded is not None:
            await asyncio.to_thread(self.embedded.stop)


# Where the Service Bus emulator reads its entities: honoured when no --config is given, so
# busd can take the emulator's place in a compose file unchanged.
EMULATOR_CONFIG = "/ServiceBus_Emulator/ConfigFiles/Config.json"


def entities_file(settings: Settings) -> str | None:
    """--config; without it, the emulator's file where the emulator reads it, if there."""
    if settings.config_path:
        return settings.config_path
    return EMULATOR_CONFIG if os.path.exists(EMULATOR_CONFIG) else None


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


async def serve(settings: Settings, role: WorkerRole | None = None) -> int:
    entities = EntitiesFile()
    partition_by_default(settings)
    settings.config_path = entities_file(settings)
    if settings.config_path:
        entities = load_entities(settings.config_path, settings.max_message_size)
        for warning in entities.warnings:
            log.warning("%s", warning)
        # The file's keys join those of --sas-key (or the default key).
        settings.sas_keys = {**settings.sas_keys, **entities.keys}
    else:
        log.warning("no --config given: entities are those already in the store")
    exposed = default_key_warning(settings.host, settings.sas_keys)
    if exposed and role is None:  # a worker's parent warned once for all (busd/server/workers.py)
        log.warning("%s", exposed)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if role is not None:
        role.on_parent_gone(loop, stop.set)
    if stop_request.asked():  # before the loop took the signal over
        return 0
    if settings.redis_url and role is None:  # its parent waited (busd/server/workers.py)
        shown = redacted(settings.redis_url)
        waiting = wait_for_store(settings.redis_url, settings.store_wait_s, shown, log.warning)
        if not await unless_stopped(waiting, stop):
            return 0
    server = Server(settings, entities, role)
    try:
        await server.startup()
    except BaseException:
        await server.shutdown()
        raise
    # What start-up made (modules, the filter grammar's tables, settings) lives as long as
    # the process: the collector need not walk it again on every full collection.
    gc.freeze()
    if role is None:
        print(f"{server.banner()}\n{READY_LINE}", flush=True)
    else:
        role.ready(server.banner())
    await stop.wait()
    log.info("shutting down")
    await server.shutdown()
    return 0


async def unless_stopped(work: Coroutine[Any, Any, None], stop: asyncio.Event) -> bool:
    """Run `work` unless `stop` is set first (then cancel it): whether it ran to its end."""
    task = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait((task, stopped), return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return False
    task.result()  # its exception, if it failed
    return True


def partition_by_default(settings: Settings) -> None:
    """Over local shards of the embedded store (`--store-shards` above 1), entities that do
    not say otherwise are partitioned, in a multiple of the shard count (docs/design.md
    §3.9); before the entities file is read."""
    from busd.entities import properties as entity_properties
    from busd.storage.redis.embedded import default_partitions, shard_count

    shards = shard_count(settings.store_shards)  # 1 with --redis-url (Settings.validate)
    entity_properties.partition_by_default(default_partitions(shards) if shards > 1 else None)


def run(settings: Settings, role: WorkerRole | None = None) -> int:
    from busd.observability.logs import configure

    configure(settings.log_level, settings.log_format)
    try:
        if uvloop is not None:  # libuv's event loop: measured, the stock one's own work was
            # about a third of busd's CPU per session (socket calls, callbacks, polling)
            return uvloop.run(serve(settings, role))
        return asyncio.run(serve(settings, role))
    except KeyboardInterrupt:
        return 0
    finally:
        sys.stdout.flush()
