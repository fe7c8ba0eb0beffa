"""Settings of one busd process.

`Settings` only holds values; `Settings.validate()` checks them once at start-up. The CLI maps
its options one to one onto the fields (busd/cli/serve.py); the entities file the settings
name is read by busd.config.entities_file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from busd.auth.sas import DEFAULT_SAS_KEY, DEFAULT_SAS_KEY_NAME
from busd.broker.limits import Limits
from busd.broker.settings import BrokerSettings
from busd.entities import properties as ep
from busd.errors import ConfigError
from busd.net import origins
from busd.units import KIB, MIB

DEFAULT_MAX_MESSAGE_SIZE = 1 * MIB
MAX_MESSAGE_SIZE_LIMIT = ep.MAX_MESSAGE_SIZE_KB * KIB  # Service Bus premium's largest message

LOG_LEVELS = ("trace", "debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")
DURABILITIES = ("local", "fsync", "replicated")

# URL schemes --redis-url takes; `+cluster` names a Redis/Valkey Cluster
# (busd.storage.redis.store, as does a `?cluster=true` parameter), `+sentinel` the Sentinels
# of a primary and its replicas.
REDIS_URL_SCHEMES = (
    "redis://",
    "rediss://",
    "unix://",
    "valkey://",
    "valkeys://",
    "redis+cluster://",
    "rediss+cluster://",
    "valkey+cluster://",
    "valkeys+cluster://",
    "redis+sentinel://",
    "rediss+sentinel://",
    "valkey+sentinel://",
    "valkeys+sentinel://",
)


@dataclass
class Settings:
    host: str = "127.0.0.1"
    port: int = 5672
    redis_url: str | None = None  # None: start the embedded Valkey in data_dir
    store_wait_s: float = 30.0  # how long start-up waits for --redis-url to answer
    data_dir: str = "./busd-data"
    config_path: str | None = None  # the entities file (emulator Config.json)
    http_port: int = 5300  # health, metrics, admin
    tls_port: int | None = 5671  # AMQP over TLS (the SDKs' port outside the emulator); None: off
    ws_port: int | None = 5443  # AMQP over WebSockets, ws and wss (Service Bus: 443); None: off
    tls_cert: str | None = None  # PEM files; None: busd's own, its CA's, kept in data_dir
    tls_key: str | None = None
    log_level: str = "info"
    log_format: str = "text"
    sas_keys: dict[str, str] = field(
        default_factory=lambda: {DEFAULT_SAS_KEY_NAME: DEFAULT_SAS_KEY}
    )
    sweep_interval_s: float = BrokerSettings.sweep_interval_s  # each process's sweep
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE  # default for queues that set none
    key_prefix: str = "busd"  # every store key starts with it, so one Redis can host several
    # store calls one process has in flight at once (pipelined on one connection); more wait
    # for a turn
    store_connections: int = 64
    # what one client may make the process hold (busd/broker/limits.py)
    limits: Limits = field(default_factory=Limits)
    transaction_timeout_s: float = BrokerSettings.transaction_timeout_s
    # busd processes serving the same ports of this host (busd/server/workers.py)
    workers: int = 1
    # whether `workers` came from `--workers auto` (said in the banner)
    workers_auto: bool = False
    # valkey-servers the embedded store runs as one local Cluster (None: auto, from the
    # cores); above 1, entities are partitioned by default (busd/storage/redis/embedded.py)
    store_shards: int | None = 1
    # what the store must have done with a write before busd acknowledges it: local (ran),
    # fsync (in the primary's append-only file), replicated (and received by a replica);
    # docs/design.md §3.9
    durability: str = "local"
    # namespaces other than the default one a process serves at once (docs/design.md §3.17)
    max_namespaces: int = 100
    # HTTP (busd/http/server.py): connections open at once (0: no cap), and from one peer
    # address; how long a request's head (an unauthenticated one's head and body) may take
    http_connections: int = 256
    http_connections_per_address: int = 64
    http_request_timeout_s: float = 5.0
    # the host names clients reach busd by beyond localhost and its addresses, and the web
    # origins that may open WebSockets beyond those hosts' (busd/net/origins.py)
    hostnames: list[str] = field(default_factory=list)
    allowed_origins: list[str] = field(default_factory=list)
    faults: bool = BrokerSettings.faults  # faults on demand (docs/faults.md): for tests

    def broker_settings(self) -> BrokerSettings:
        """What every broker of this server takes from these settings (one for all)."""
        return BrokerSettings(
            sweep_interval_s=self.sweep_interval_s,
            limits=self.limits,
            transaction_timeout_s=self.transaction_timeout_s,
            faults=self.faults,
        )

    def validate(self) -> None:
        """Raise ConfigError on the first invalid value; normalises log level and format case."""
        for name in ("port", "http_port", "tls_port", "ws_port"):
            value = getattr(self, name)
            if value is None and name in ("tls_port", "ws_port"):
                continue
            if not isinstance(value, int) or not 0 <= value <= 65535:
                raise ConfigError(f"{name} must be a TCP port (0..65535), got {value!r}")
        self.log_level = str(self.log_level).lower()
        if self.log_level not in LOG_LEVELS:
            raise ConfigError(
                f"log level must be one of {', '.join(LOG_LEVELS)}, got {self.log_level!r}"
            )
        self.log_format = str(self.log_format).lower()
        if self.log_format not in LOG_FORMATS:
            raise ConfigError(
                f"log format must be one of {', '.join(LOG_FORMATS)}, got {self.log_format!r}"
            )
        if not 1 <= self.max_message_size <= MAX_MESSAGE_SIZE_LIMIT:
            raise ConfigError(
                f"max message size must be 1..{MAX_MESSAGE_SIZE_LIMIT} bytes (100 MiB), "
                f"got {self.max_message_size}"
            )
        if not self.store_wait_s >= 0:
            raise ConfigError(f"store wait must be 0 or more seconds, got {self.store_wait_s}")
        if not self.sweep_interval_s > 0:
            raise ConfigError(f"sweep interval must be positive, got {self.sweep_interval_s}")
        if not self.transaction_timeout_s > 0:
            raise ConfigError(
                f"transaction timeout must be positive, got {self.transaction_timeout_s}"
            )
        if not self.sas_keys:
            raise ConfigError("at least one SAS key is needed (name and key)")
        for key_name, key in self.sas_keys.items():
            if not key_name or not key:
                raise ConfigError(f"SAS key {key_name!r} needs both a name and a key")
        if not 1 <= self.store_connections <= 10_000:
            raise ConfigError(f"store connections must be 1..10000, got {self.store_connections}")
        if self.durability not in DURABILITIES:
            raise ConfigError(
                f"durability must be one of {', '.join(DURABILITIES)}, got {self.durability!r}"
            )
        if not 1 <= self.max_namespaces <= 10_000:
            raise ConfigError(f"max namespaces must be 1..10000, got {self.max_namespaces}")
        if not 1 <= self.workers <= 1024:
            raise ConfigError(f"workers must be 1..1024, got {self.workers}")
        if self.store_shards is not None and not 1 <= self.store_shards <= 16:
            raise ConfigError(f"store shards must be 1..16 or auto, got {self.store_shards}")
        if self.store_shards != 1 and self.durability == "replicated":
            # local shards have no replicas (fsync works: each waits for its own append-only
            # file); a Cluster of the user's with replicas (--redis-url) takes replicated
            raise ConfigError(
                "--durability replicated needs replicas, which --store-shards' local shards do "
                "not have; give a Cluster with replicas as --redis-url instead"
            )
        if self.store_shards != 1 and self.redis_url:
            raise ConfigError(
                "--store-shards starts the embedded store as local shards; with --redis-url "
                "the store is the one it names"
            )
        if self.http_connections < 0:
            raise ConfigError(f"max HTTP connections must be 0 or more: {self.http_connections}")
        if self.http_connections_per_address < 0:
            raise ConfigError(
                "max HTTP connections per address must be 0 or more: "
                f"{self.http_connections_per_address}"
            )
        if not self.http_request_timeout_s > 0:
            raise ConfigError(
                f"HTTP request timeout must be positive, got {self.http_request_timeout_s}"
            )
        for hostname in self.hostnames:
            name = hostname.lower().rstrip(".")
            named = ":" not in name and origins.split_host(name) == name
            if not (named or origins.is_address(hostname)):
                raise ConfigError(f"--hostname takes a host name or address, got {hostname!r}")
        for origin in self.allowed_origins:
            if origins.normalize_origin(origin) is None:
                raise ConfigError(
                    "--allowed-origin takes an origin (scheme://host[:port]), null or *, "
                    f"got {origin!r}"
                )
        if (problem := self.limits.problem()) is not None:
            raise ConfigError(problem)
        if not self.key_prefix or any(c in self.key_prefix for c in "{} "):
            raise ConfigError("key prefix must be non-empty, without braces or spaces")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("--tls-cert and --tls-key go together: give both or neither")
        for what, value in (("TLS certificate", self.tls_cert), ("TLS key", self.tls_key)):
            if value and not Path(value).is_file():
                raise ConfigError(f"{what} {value} does not exist or is not a file")
        if self.config_path is not None and not Path(self.config_path).is_file():
            raise ConfigError(f"entities file {self.config_path} does not exist or is not a file")
        if self.redis_url is not None and not self.redis_url.startswith(REDIS_URL_SCHEMES):
            raise ConfigError(
                "redis url must start with redis://, rediss://, unix:// (or valkey://, "
                "valkeys://; redis+cluster://, rediss+cluster:// for a cluster; "
                f"redis+sentinel://host:port,.../service for Sentinel), "
                f"got {self.redis_url!r}"
            )

        url = self.redis_url or ""
        if "+sentinel://" in url and not url.split("://", 1)[1].partition("/")[2].strip("/"):
            raise ConfigError(
                "a Sentinel URL names its service: "
                "redis+sentinel://host:port[,host:port...]/service"
            )

    def connection_string(self) -> str:
        """The connection string clients use to reach this process (printed at start-up)."""
        host = "localhost" if self.host in ("", "0.0.0.0", "::", "127.0.0.1") else self.host
        if ":" in host:  # a bare IPv6 address
            host = f"[{host}]"
        key_name, key = next(iter(self.sas_keys.items()))
        return (
            f"Endpoint=sb://{host}:{self.port};SharedAccessKeyName={key_name};"
            f"SharedAccessKey={key};UseDevelopmentEmulator=true;"
        )


# --- the entities file -------------------------------------------------------------------------
