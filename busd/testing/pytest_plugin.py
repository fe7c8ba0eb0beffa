"""busd's pytest plugin: a real busd for the test session, and queues, topics and
subscriptions made for one test and removed after it. Installed with busd (entry point
`pytest11`, name `busd`); `-p no:busd` turns it off.

Fixtures (all named busd_*, so they do not clash with a project's own):

    busd_broker                 session: a busd on free loopback ports with its embedded Valkey
                                (one per pytest-xdist worker); .connection_string,
                                .admin_connection_string, .http_url, .cert_path
    busd_broker_factory         session: busd_broker_factory(config="Config.json") -> a busd
                                seeded from that file (one per file and worker)
    busd_test_broker            the busd this test uses: busd_broker, or the one of the test's
                                @pytest.mark.busd_config("Config.json")
    busd_queue_factory          busd_queue_factory(requires_session=True, ...) -> a new queue's
                                unique name; deleted after the test
    busd_topic_factory          likewise for a topic
    busd_subscription_factory   busd_subscription_factory(topic, rules={...}, ...) -> name
    busd_faults                 faults on demand on the test's busd (docs/faults.md):
                                .inject(kind, entity, ...), removed after the test; the
                                broker's own .lose_session_lock(queue, session_id) too

Options: --busd-config (ini busd_config) seeds busd_broker from a Config.json; --busd-redis-url
(ini busd_redis_url) keeps the state in that Redis/Valkey instead, each broker under a key
prefix of its own that is deleted at the end.

pytest loads this module in every run of every project that has busd installed: it imports
nothing but pytest at import time; the broker is started, in a child process, by the first
test that asks for it.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from busd.testing.broker import BusdBroker
    from busd.testing.faults import Faults
    from busd.testing.management import Management

MARKER = "busd_config"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("busd", "busd broker for tests")
    group.addoption(
        "--busd-config",
        default=None,
        metavar="PATH",
        help="Config.json (the Service Bus emulator's format) to seed busd_broker from.",
    )
    group.addoption(
        "--busd-redis-url",
        default=None,
        metavar="URL",
        help="Redis/Valkey for the test brokers' state (default: each starts its "
        "own embedded Valkey).",
    )
    parser.addini(
        "busd_config",
        "Config.json to seed busd_broker from (relative to the ini file).",
        default=None,
    )
    parser.addini("busd_redis_url", "Redis/Valkey for the test brokers' state.", default=None)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(path): the test's busd (busd_test_broker and the entity factories) is "
        "seeded from this Config.json, relative to the test file; one broker per file.",
    )


def _option(config: pytest.Config, name: str) -> tuple[str | None, Path]:
    """An option's value and the directory a relative path in it is taken from."""
    value = config.getoption(f"--{name.replace('_', '-')}")
    if value:
        return value, config.invocation_params.dir
    ini = config.getini(name)
    return (str(ini) if ini else None), (
        config.inipath.parent if config.inipath else config.rootpath
    )


@pytest.fixture(scope="session")
def busd_broker_factory(
    pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., BusdBroker]]:
    """busd_broker_factory(config=None, **options) -> a started BusdBroker, one per distinct
    config and options in this session (this worker), all stopped at the session's end.
    `options` are BusdBroker's (e.g. args=["--lock-duration-floor", ...])."""
    from busd.testing.broker import BusdBroker

    redis_url, _ = _option(pytestconfig, "busd_redis_url")
    started: dict[tuple, BusdBroker] = {}

    def start(config: str | Path | None = None, **options: Any) -> BusdBroker:
        path = Path(config).resolve() if config is not None else None
        key = (path, tuple(sorted((k, repr(v)) for k, v in options.items())))
        if key not in started:
            options.setdefault("redis_url", redis_url)
            options.setdefault("data_dir", tmp_path_factory.mktemp("busd"))
            started[key] = BusdBroker(config=path, **options).start()
        return started[key]

    try:
        yield start
    finally:
        for broker in started.values():
            broker.stop()


@pytest.fixture(scope="session")
def busd_broker(
    pytestconfig: pytest.Config, busd_broker_factory: Callable[..., BusdBroker]
) -> BusdBroker:
    """The session's busd (this worker's, under pytest-xdist)."""
    config, base = _option(pytestconfig, "busd_config")
    return busd_broker_factory(base / config if config else None)


@pytest.fixture
def busd_test_broker(
    request: pytest.FixtureRequest, busd_broker_factory: Callable[..., BusdBroker]
) -> BusdBroker:
    """The busd of this test: the one of its @pytest.mark.busd_config(path), else busd_broker."""
    marker = request.node.get_closest_marker(MARKER)
    if marker is None:
        return request.getfixturevalue("busd_broker")
    if len(marker.args) != 1:
        raise pytest.UsageError(f"@pytest.mark.{MARKER} takes one path, got {marker.args!r}")
    path = Path(marker.args[0])
    if not path.is_absolute():
        path = request.path.parent / path
    return busd_broker_factory(path)


def _unique(request: pytest.FixtureRequest, prefix: str | None) -> str:
    """A name no other test (or worker) uses: the test's own name, shortened, and 8 random hex
    digits (a subscription's name has at most 50 characters)."""
    base = prefix or re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:24]
    return f"{base or 'test'}-{uuid.uuid4().hex[:8]}"


class _Made:
    """What one test made, removed in reverse order at its end."""

    def __init__(self, management: Management) -> None:
        self.management = management
        self.undo: list[Callable[[], object]] = []

    def remove(self) -> None:
        errors = []
        for undo in reversed(self.undo):
            try:
                undo()
            except Exception as exc:  # the broker went away: report, but remove the rest
                errors.append(str(exc))
        if errors:
            raise RuntimeError(
                "busd: could not remove entities made for the test: " + "; ".join(errors)
            )


@pytest.fixture
def _busd_made(busd_test_broker: BusdBroker) -> Iterator[_Made]:
    made = _Made(busd_test_broker.management)
    yield made
    made.remove()


def _factory(request: pytest.FixtureRequest, made: _Made, kind: str) -> Callable[..., str]:
    """A queue or topic factory: create(prefix=None, **properties) -> the new entity's name."""
    management = made.management
    make, remove = getattr(management, f"create_{kind}"), getattr(management, f"delete_{kind}")

    def create(prefix: str | None = None, **properties: Any) -> str:
        name: str = make(_unique(request, prefix), **properties)
        made.undo.append(lambda: remove(name))
        return name

    return create


@pytest.fixture
def busd_queue_factory(request: pytest.FixtureRequest, _busd_made: _Made) -> Callable[..., str]:
    """busd_queue_factory(prefix=None, **properties) -> the name of a new queue (properties as
    the SDK names them: requires_session=True, lock_duration=timedelta(seconds=5), ...),
    deleted after the test."""
    return _factory(request, _busd_made, "queue")


@pytest.fixture
def busd_topic_factory(request: pytest.FixtureRequest, _busd_made: _Made) -> Callable[..., str]:
    """busd_topic_factory(prefix=None, **properties) -> the name of a new topic, deleted with
    its subscriptions after the test."""
    return _factory(request, _busd_made, "topic")


@pytest.fixture
def busd_subscription_factory(
    request: pytest.FixtureRequest, _busd_made: _Made
) -> Callable[..., str]:
    """busd_subscription_factory(topic, prefix=None, rules=None, **properties) -> the name of
    a new subscription of `topic`; `rules`: name -> SQL filter (or a mapping with sql,
    correlation, action) replacing $Default. Deleted after the test."""

    def create(topic: str, prefix: str | None = None, **properties: Any) -> str:
        management = _busd_made.management
        name = management.create_subscription(topic, _unique(request, prefix), **properties)
        _busd_made.undo.append(lambda: management.delete_subscription(topic, name))
        return name

    return create


@pytest.fixture
def busd_faults(busd_test_broker: BusdBroker) -> Iterator[Faults]:
    """Faults on demand on the test's busd (busd.testing.faults, docs/faults.md):
    `busd_faults.inject("server-busy", queue, operations=["send"], count=2)`. Every fault left
    is removed after the test."""
    faults = busd_test_broker.faults
    yield faults
    faults.clear()
