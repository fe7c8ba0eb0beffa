"""Namespaces: several isolated ones in one busd (docs/design.md §3.17).

The default namespace is busd as it always was: its keys in the store under `--key-prefix`,
its catalog, its SAS keys. Every other namespace is a `Broker` of its own over the key prefix
`<prefix>:ns:<name>`: its own catalog, entities, messages, counts, sweep and forwarders, and
the default namespace's SAS keys (under their own names, and as `<name>/<key name>`).

A connection serves one namespace for its life, chosen by

- the host name the client connected to, `<name>.localhost` (the AMQP open frame's
  `hostname`, the HTTP `Host` header), as Service Bus names a namespace by its host; or
- where the client cannot reach such a host (`*.localhost` does not resolve everywhere), the
  SAS key name its token was signed with: `<name>/RootManageSharedAccessKey`.

Anything else (`localhost`, an address, any other host name, a plain key name) is the default
namespace. A namespace is made on first use, once a token signed with one of its keys holding
Manage shows that the client may run it (a test suite takes one per test), and recorded in the
store: from then on it exists, and any process serves it, made again there for any of its
valid keys (Send and Listen ones, its entities' own), as Service Bus's namespace accepts every
key of its own. A process serves at most `max_namespaces` (each costs store connections):
past that, the one least recently used that no connection holds is let go for the new one,
and when every one is in use the new one is refused (`NamespaceLimit`). A namespace no
connection holds and no authenticated request used for `IDLE_S` is let go by the process (its
broker stopped: its store connections and sweep); its data stays, and the next client makes
it again. Requests that do not show a valid token keep nothing alive.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote_plus

from busd.auth import rights, sas
from busd.entities.records import QueueEntity, TopicEntity, from_record

if TYPE_CHECKING:
    from busd.broker.broker import Broker

log = logging.getLogger("busd.broker")

# As Service Bus names namespaces (letters, digits, hyphens), lower-cased as host names are.
NAME = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,48}[a-z0-9])?")
LOCALHOST = "localhost"
IDLE_S = 300.0
MAX_NAMESPACES = 100
# A namespace used this recently is not let go to make room for another: a request that chose
# it may still be running on its broker.
IN_USE_S = 10.0


class NamespaceLimit(Exception):
    """The process serves as many namespaces as it may, all of them in use."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def namespace_of_host(host: str | None) -> str | None:
    """The namespace a host name (with or without `:port`) chooses: `<name>.localhost` names
    one; anything else is the default namespace (None)."""
    if not host or host.startswith("["):  # none, or an IPv6 literal
        return None
    name, dot, rest = host.lower().rstrip(".").partition(".")
    rest = rest.rsplit(":", 1)[0]
    return name if dot and rest == LOCALHOST and name else None


def namespace_of_key(key_name: str) -> str | None:
    """The namespace a SAS key name chooses: `<name>/<key name>`; a plain name: None."""
    # The Python SDK encodes the key name twice (busd.auth.sas): decoded once, `/` is `%2F`.
    name, slash, _ = unquote_plus(key_name).partition("/")
    return name.lower() if slash else None


class Namespaces:
    """The namespaces this process serves: the default one, and those made on first use."""

    def __init__(
        self,
        default: Broker,
        make: Callable[[str], Coroutine[Any, Any, Broker]],
        idle_s: float = IDLE_S,
        max_namespaces: int = MAX_NAMESPACES,
    ) -> None:
        self.default = default
        self._make = make  # a started Broker for a namespace name (busd.server.lifecycle)
        self._made: dict[str, asyncio.Task[Broker]] = {}
        self.idle_s = idle_s
        self.max_namespaces = max_namespaces
        self._holders: dict[object, int] = {}  # connections bound to a namespace's broker
        self._used: dict[str, float] = {}  # name -> when a request last used it (monotonic)
        self._reaper: asyncio.Task | None = None
        self._known: set[str] = set()  # names `known` found to exist

    def choose(self, host_namespace: str | None, key_name: str) -> str | None:
        """The namespace of a request whose host chose `host_namespace` and whose token names
        `key_name`; None: the default. Raises SasError when the two disagree or the name is
        not a namespace's."""
        by_key = namespace_of_key(key_name)
        if host_namespace and by_key and by_key != host_namespace:
            raise sas.SasError(
                f"the key {key_name!r} is not one of namespace "
                f"{host_namespace!r}, the host connected to"
            )
        name = host_namespace or by_key
        if name is not None and not NAME.fullmatch(name):
            raise sas.SasError(
                f"{name!r} is not a namespace name (letters, digits and hyphens, at most 50)"
            )
        return name

    def keys(self, name: str | None) -> Mapping[str, str]:
        """The SAS keys of a namespace: the default one's, also under `<name>/<key name>`."""
        keys = self.default.sas_keys
        if name is None:
            return keys
        return {**keys, **{f"{name}/{key_name}": key for key_name, key in keys.items()}}

    async def broker(self, name: str | None, use: bool = True) -> Broker:
        """The namespace's broker, made (and started) on first use; the caller has verified
        that the client may make it. `use`: a request uses it (else one made now is idle from
        the start: the first to be let go). Raises NamespaceLimit when the process serves as
        many as it may and none of them can be let go."""
        if name is None:
            return self.default
        made = self._made.get(name)
        if made is None or (made.done() and self._failed(made)):
            self._made.pop(name, None)
            await self._make_room()
            log.info("namespace %s: serving it", name)
            made = self._made[name] = asyncio.create_task(
                self._make(name), name=f"busd-namespace-{name}"
            )
            if not use:
                self._used[name] = time.monotonic() - max(self.idle_s, IN_USE_S)
            if self._reaper is None:
                self._reaper = asyncio.create_task(self._let_go_idle(), name="busd-namespaces-idle")
        if use:
            self._used[name] = time.monotonic()
        return await asyncio.shield(made)

    def served(self, name: str | None, use: bool = True) -> Broker | None:
        """The namespace's broker if this process serves it already; `use`: a request uses it
        (it is not idle)."""
        if name is None:
            return self.default
        made = self._made.get(name)
        if made is None or not made.done() or made.exception() is not None:
            return None
        if use:
            self._used[name] = time.monotonic()
        return made.result()

    def touch(self, name: str | None) -> None:
        """An authenticated request used the namespace: it is not idle."""
        if name is not None and name in self._made:
            self._used[name] = time.monotonic()

    async def _make_room(self) -> None:
        """Room for one more namespace under `max_namespaces`: when there is none, the one
        least recently used that no connection holds is let go (its data stays).
        NamespaceLimit when none may go."""
        if len(self._made) < self.max_namespaces:
            return
        now = time.monotonic()

        def may_go(name: str, made: asyncio.Task[Broker]) -> bool:
            if not made.done():
                return False  # being made for a client now
            if self._failed(made):
                return True
            return not self._held(made) and now - self._used.get(name, now) >= IN_USE_S

        idle = [
            (self._used.get(name, 0.0), name)
            for name, made in self._made.items()
            if may_go(name, made)
        ]
        if not idle:
            raise NamespaceLimit(
                f"this busd serves at most {self.max_namespaces} namespaces at once "
                "(--max-namespaces), all in use; try again when one is idle"
            )
        _, victim = min(idle)
        log.info("namespace %s: let go to make room for another (its data stays)", victim)
        await self._stop(victim)

    @staticmethod
    def _failed(made: asyncio.Task[Broker]) -> bool:
        return made.cancelled() or made.exception() is not None

    def _held(self, made: asyncio.Task[Broker]) -> bool:
        """Whether a connection serves the namespace `made` made."""
        return not self._failed(made) and made.result() in self._holders

    async def _stop(self, name: str) -> None:
        made = self._made.pop(name)
        self._used.pop(name, None)
        if self._failed(made):
            return
        try:
            await made.result().stop()
        except Exception as exc:  # the store, most likely: it is let go all the same
            log.warning("stopping namespace %s failed: %s", name, exc)

    def _serves(self, name: str) -> bool:
        """Whether this process serves the namespace, or is making it."""
        made = self._made.get(name)
        return made is not None and not (made.done() and self._failed(made))

    async def known(self, name: str) -> bool:
        """Whether the namespace `name` exists: served here, or made by a Manage key in any
        process. What keeps its host's certificate apart from other names'
        (busd.net.host_certificates)."""
        if name in self._known:
            return True
        if self._serves(name) or await self.default.store.namespace_known(name):
            self._known.add(name)  # a namespace is never unmade
            return True
        return False

    def serving(self) -> set[str]:
        """The names of the namespaces this process serves (or is making), the default aside."""
        return set(self._made)

    def hold(self, broker: object) -> None:
        """A connection serves `broker`'s namespace: it is not let go while one does."""
        if broker is not self.default:
            self._holders[broker] = self._holders.get(broker, 0) + 1

    def let_go(self, broker: object) -> None:
        """A connection that `hold` counted is gone."""
        held = self._holders.get(broker, 0) - 1
        if held > 0:
            self._holders[broker] = held
        else:
            self._holders.pop(broker, None)
        for name, made in self._made.items():
            if (
                made.done()
                and not made.cancelled()
                and made.exception() is None
                and made.result() is broker
            ):
                self._used[name] = time.monotonic()  # idle from now

    async def _let_go_idle(self) -> None:
        while True:
            await asyncio.sleep(min(self.idle_s, 60.0))
            now = time.monotonic()
            for name, made in list(self._made.items()):
                if not made.done() or made.cancelled() or made.exception() is not None:
                    continue
                broker = made.result()
                if broker in self._holders or now - self._used.get(name, now) < self.idle_s:
                    continue
                log.info(
                    "namespace %s: unused for %g s, let go (its data stays)", name, self.idle_s
                )
                await self._stop(name)

    async def authenticate(
        self, token: str, host_namespace: str | None
    ) -> tuple[Broker, rights.Grant]:
        """The namespace a token is for (with the host's choice), and what it grants there.
        The token is verified before the namespace is made (`_grant`). Raises SasError, or
        NamespaceLimit."""
        name = self.choose(host_namespace, sas.parse_sas_token(token).key_name)
        grant = await self._grant(name, token)
        return await self.broker(name), grant

    async def for_request(self, token: str, host: str | None) -> tuple[str | None, Broker | None]:
        """The namespace of an HTTP request (its `Host` and its `Authorization` token) and its
        broker; None when the namespace is not served and the token may not make it. Only a
        token that verifies marks the namespace used: requests without one keep nothing alive
        (the caller's own check then refuses them). Raises NamespaceLimit."""
        try:
            key_name = sas.parse_sas_token(token).key_name
        except sas.SasError:
            key_name = ""
        try:
            name = self.choose(namespace_of_host(host), key_name)
        except sas.SasError:
            return None, None
        if name is None:  # the default namespace: always served, never idle
            return name, self.default
        try:
            await self._grant(name, token)
        except sas.SasError:
            return name, self.served(name, use=False)
        return name, await self.broker(name)

    async def _grant(self, name: str | None, token: str) -> rights.Grant:
        """What `token` grants in the namespace `name`, verified so that a namespace this
        process does not serve is made only for a token that may make it; SasError otherwise.

        A namespace served (or being made) here takes any of its keys. One that is not is made
        for a namespace key holding Manage, which records it in the store (`namespace_add`);
        for any other of its keys (Send, Listen, an entity's) only when the store knows it was
        made (`namespace_known`): Service Bus's namespace, once it exists, takes every key of
        its own, whichever process serves it now. The namespace's keys are checked first,
        without a store call; a token they refuse costs store calls only when it may be an
        entity's key (its audience names an entity, it has not expired), whose rules only the
        namespace's catalog holds: in a namespace not served here, that entity's record is
        read from the store and the token checked with its keys before anything is made, so
        that a bogus token costs a refusal, not the start of a namespace."""
        if name is None:
            return rights.grant_of(token, self.keys(name), entity_keys=self.entity_keys(name))
        try:
            grant = rights.grant_of(token, self.keys(name))
        except sas.SasError:
            if self._serves(name):
                await self.broker(name, use=False)  # made: its catalog read
                return rights.grant_of(token, self.keys(name), entity_keys=self.entity_keys(name))
            if not self._may_be_entity_key(token):
                raise
            await self._check_known(name)
            return rights.grant_of(
                token, self.keys(name), entity_keys=await self._stored_entity_keys(name, token)
            )
        if self._serves(name):
            return grant
        if rights.allows(grant.claims, rights.MANAGE):
            await self.default.store.namespace_add(name)
        else:
            await self._check_known(name)
        return grant

    async def _check_known(self, name: str) -> None:
        """SasError unless the namespace was made (by a Manage key, in any process)."""
        if not await self.default.store.namespace_known(name):
            raise sas.SasError(
                f"the namespace {name!r} does not exist: only a key of the namespace holding "
                "Manage makes it (Send and Listen keys then reach it)"
            )

    async def _stored_entity_keys(self, name: str, token: str) -> rights.EntityKeys:
        """The own keys of the queue or topic a token's audience names, in the namespace
        `name` this process does not serve: from its record in the store, as `entity_keys`
        answers them once the namespace is served."""
        entity = rights.audience_entity(token)
        rules: list = []
        for kind in ("queue", "topic"):
            record = await self.default.store.namespace_record(name, kind, entity)
            stored = None if record is None else from_record(kind, record)
            if isinstance(stored, QueueEntity | TopicEntity):
                rules = stored.extra.get("AuthorizationRules") or []
                break
        found = _prefixed(name, rights.rule_keys(rules))
        return lambda path: found if path == entity else ()

    @staticmethod
    def _may_be_entity_key(token: str) -> bool:
        """Whether a token the namespace's keys refused may yet be signed with an entity's own
        key: its audience names an entity and it has not expired."""
        try:
            expiry = sas.parse_sas_token(token).expiry
            return expiry > time.time() and bool(rights.audience_entity(token))
        except sas.SasError:
            return False

    def entity_keys(self, name: str | None) -> rights.EntityKeys | None:
        """The keys of the entities' own rules in a namespace (docs/design.md §2.10), under
        their names and as `<name>/<key name>`, as the namespace's keys are. None while this
        process does not serve the namespace yet: its catalog is not read (`_grant` makes a
        namespace the store knows before it asks)."""
        broker = self.served(name, use=False)  # a token not verified yet keeps nothing alive
        if broker is None:
            return None
        access_keys = broker.catalog.access_keys
        if name is None:
            return access_keys

        return lambda entity: _prefixed(name, access_keys(entity))

    async def stop(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            await asyncio.gather(self._reaper, return_exceptions=True)
            self._reaper = None
        for made in list(self._made.values()):
            made.cancel()
        results = await asyncio.gather(*self._made.values(), return_exceptions=True)
        for broker in results:
            if not isinstance(broker, BaseException):
                await broker.stop()
        self._made.clear()


def _prefixed(name: str, entity_keys: Iterable[Mapping[str, str]]) -> tuple[Mapping[str, str], ...]:
    """An entity's keys in the namespace `name`: under their names and as `<name>/<key name>`,
    as the namespace's own keys are."""
    return tuple(
        {**keys, **{f"{name}/{key_name}": key for key_name, key in keys.items()}}
        for keys in entity_keys
    )
