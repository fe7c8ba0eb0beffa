"""The Service Bus management (ATOM) API, as the SDKs' administration clients call it
(docs/management.md §3): queues, topics, subscriptions and rules, runtime counts, namespace
info.

Routing here; XML in busd.http.atom_xml; entities through `Entities` (busd.http.entities), which
keeps them in the store's catalog. Paths are matched case-insensitively with a trailing `/`
allowed, any `api-version` is accepted and `enrich` is ignored: every answer carries the
counts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, unquote

from busd.auth.rights import MANAGE, EntityKeys, Unauthorized, authorize_header
from busd.entities import properties as ep
from busd.entities.values import check_rule_name, normalize_entity_name
from busd.errors import ConfigError
from busd.http import atom_xml as ax
from busd.http.entities import Entities, Entity
from busd.http.server import Request, Response

log = logging.getLogger("busd.http")

DEFAULT_TOP = 100
MAX_TOP = 1000


def is_atom(request: Request) -> bool:
    """SDK requests all carry `api-version`; `$namespaceinfo` and `$Resources` are ours alone."""
    if "api-version" in request.params:
        return True
    first = unquote(request.path.lstrip("/")).split("/", 1)[0].lower()
    return first in ("$namespaceinfo", "$resources")


def _segments(request: Request) -> list[str]:
    raw = request.path.strip("/")
    return [unquote(s) for s in raw.split("/")] if raw else []


def _xml(status: int, element, content_type: str = ax.ENTRY_TYPE) -> Response:
    return Response(status, content_type, ax.serialize(element))


def error_response(status: int, detail: str) -> Response:
    return Response(status, ax.ERROR_TYPE, ax.error(status, detail))


class AtomApi:
    def __init__(
        self,
        entities: Entities,
        sas_keys: Mapping[str, str],
        name: str = ax.NAMESPACE_NAME,
        entity_keys: EntityKeys | None = None,
    ) -> None:
        self.entities = entities
        self.sas_keys = sas_keys
        # the keys of the entities' own rules: a token signed with one covers its entity only
        self.entity_keys = entity_keys
        self.name = name  # the namespace's, as $namespaceinfo answers it
        self.started_ms = int(time.time() * 1000)

    async def handle(self, request: Request) -> Response:
        try:
            return await self._route(request)
        except ax.AtomError as exc:
            if exc.status >= 500:
                log.warning("%s %s: %s", request.method, request.path, exc.detail)
            return error_response(exc.status, exc.detail)

    # --- authorization ------------------------------------------------------------------------
    def _authorize(self, request: Request, entity_path: str) -> None:
        """A valid SAS token over its `sr` exactly as sent (each SDK signs a different audience:
        docs/management.md §2), signed with a key holding the Manage right, whose audience
        covers the entity (for a list, the namespace or the list's own path, which the
        JavaScript SDK signs). Any host is accepted: behind a port mapping the client's host
        is not ours."""
        try:
            authorize_header(
                request.headers.get("authorization", ""),
                self.sas_keys,
                entity_path,
                MANAGE,
                self.entity_keys,
            )
        except Unauthorized as exc:
            raise ax.AtomError(401, f"Unauthorized: {exc.reason}") from None

    def authorize(self, request: Request) -> None:
        """Raise AtomError 401 unless the request's token allows it: from its path and headers
        alone, so that busd.http.front checks it before reading its body."""
        self._authorize(request, "/".join(_segments(request)))

    # --- routing ------------------------------------------------------------------------------
    async def _route(self, request: Request) -> Response:
        segments = _segments(request)
        self._authorize(request, "/".join(segments))
        lower = [s.lower() for s in segments]
        method = request.method
        if lower == ["$namespaceinfo"]:
            _only(method, "GET")
            url = f"{request.base_url}/$namespaceinfo{_api(request)}"
            return _xml(200, ax.namespace_info(url, self.started_ms, self.name))
        if len(lower) == 2 and lower[0] == "$resources" and lower[1] in ("queues", "topics"):
            _only(method, "GET")
            kind = lower[1][:-1]
            found = await self.entities.list(kind)
            return await self._feed(request, kind.capitalize() + "s", found)
        if not segments:
            raise ax.AtomError(404, "No service is hosted at the specified address.")
        if "subscriptions" in lower:
            at = lower.index("subscriptions")
            topic = _name("/".join(segments[:at]), "topic")
            rest = segments[at + 1 :]
            if not rest:
                _only(method, "GET")
                await self._topic(topic)
                return await self._feed(
                    request, "Subscriptions", await self.entities.list("subscription", topic)
                )
            sub = _name(rest[0], "subscription", nested=True)
            if len(rest) == 1:
                return await self._entity(request, "subscription", f"{topic}/{sub}")
            if rest[1].lower() != "rules" or len(rest) > 3:
                raise ax.AtomError(404, "No service is hosted at the specified address.")
            if len(rest) == 2:
                _only(method, "GET")
                await self._subscription(topic, sub)
                return await self._feed(
                    request, "Rules", await self.entities.list("rule", f"{topic}/{sub}")
                )
            rule = _rule_name(rest[2])
            return await self._rule(request, topic, sub, rule)
        name = _name("/".join(segments), "entity")
        return await self._entity(request, None, name)

    async def _topic(self, topic: str) -> Entity:
        found = await self.entities.get("topic", topic)
        if found is None:
            raise ax.AtomError(404, f"Entity '{topic}' was not found.", 40400)
        return found

    async def _subscription(self, topic: str, sub: str) -> Entity:
        found = await self.entities.get("subscription", f"{topic}/{sub}")
        if found is None:
            raise ax.AtomError(404, f"Entity '{topic}/Subscriptions/{sub}' was not found.", 40400)
        return found

    # --- queues, topics, subscriptions -------------------------------------------------------
    async def _entity(self, request: Request, kind: str | None, path: str) -> Response:
        """GET/PUT/DELETE of `/{name}` (a queue or a topic: `kind` None) or of a subscription."""
        method = request.method
        if method == "GET":
            found = await self._find(kind, path)
            if found is None:
                # Not a 404: the service answers 200 with this feed, and the Go SDK (KEDA,
                # Dapr) takes a 404 for a hard error.
                return _xml(200, ax.not_found_feed(), ax.FEED_TYPE)
            return _xml(200, await self._entry(request, found))
        if method == "DELETE":
            if not await self.entities.delete(kind or await self._kind_of(path), path):
                raise ax.AtomError(404, "No service is hosted at the specified address.", 40400)
            return Response(200, ax.ENTRY_TYPE, b"")
        if method == "PUT":
            if kind is None:
                kind = ax.entity_kind(request.body)
            properties = ax.parse_description(request.body, kind)
            if "if-match" in request.headers:
                existing = await self.entities.get(kind, path)
                if existing is None:
                    raise ax.AtomError(404, "Not Found. The Operation doesn't exist.", 40400)
                _validate(properties, existing.properties)
                updated = await self.entities.update(kind, path, properties)
                return _xml(200, await self._entry(request, updated))
            _validate(properties)
            if kind == "subscription":
                await self._topic(path.rsplit("/", 1)[0])
            if await self._find(None if kind != "subscription" else kind, path) is not None:
                raise ax.AtomError(
                    409,
                    "Conflict. You're requesting an operation that isn't "
                    f"allowed in the resource's current state: '{path}' exists.",
                    40900,
                )
            created = await self.entities.create(kind, path, properties)
            return _xml(201, await self._entry(request, created))
        raise ax.AtomError(405, f"{method} is not supported here")

    async def _find(self, kind: str | None, path: str) -> Entity | None:
        if kind is not None:
            return await self.entities.get(kind, path)
        return await self.entities.get("queue", path) or await self.entities.get("topic", path)

    async def _kind_of(self, path: str) -> str:
        found = await self._find(None, path)
        return found.kind if found is not None else "queue"

    # --- rules ---------------------------------------------------------------------------------
    async def _rule(self, request: Request, topic: str, sub: str, rule: str) -> Response:
        method = request.method
        path = f"{topic}/{sub}/{rule}"
        if method == "GET":
            found = await self.entities.get("rule", path)
            if found is None:  # rules, unlike the rest, are a real 404
                raise ax.AtomError(
                    404, f"Entity '{ax.NAMESPACE_NAME}:Topic:{topic}|{sub}|{rule}' was not found."
                )
            return _xml(200, await self._entry(request, found))
        if method == "DELETE":
            if not await self.entities.delete("rule", path):
                raise ax.AtomError(404, "No service is hosted at the specified address.", 40400)
            return Response(200, ax.ENTRY_TYPE, b"")
        if method == "PUT":
            description = ax.parse_rule(request.body, rule)
            await self._subscription(topic, sub)
            existing = await self.entities.get("rule", path)
            if "if-match" in request.headers:
                if existing is None:
                    raise ax.AtomError(404, "Not Found. The Operation doesn't exist.", 40400)
                found = await self.entities.update("rule", path, {"rule": description})
                return _xml(200, await self._entry(request, found))
            if existing is not None:
                raise ax.AtomError(409, f"Conflict: rule '{rule}' exists.", 40900)
            found = await self.entities.create("rule", path, {"rule": description})
            return _xml(201, await self._entry(request, found))
        raise ax.AtomError(405, f"{method} is not supported here")

    # --- answers -------------------------------------------------------------------------------
    def _url(self, request: Request, entity: Entity) -> str:
        if entity.kind in ("queue", "topic"):
            path = _part(entity.path)
        elif entity.kind == "subscription":
            topic, sub = entity.path.rsplit("/", 1)
            path = f"{_part(topic)}/Subscriptions/{_part(sub)}"
        else:
            topic, sub, _ = entity.path.rsplit("/", 2)
            path = f"{_part(topic)}/Subscriptions/{_part(sub)}/Rules/{_part(entity.name)}"
        return f"{request.base_url}/{path}{_api(request)}"

    async def _entry(self, request: Request, entity: Entity, base: str | None = None):
        url = self._url(request, entity)
        if entity.kind == "rule":
            content = ax.rule_description(entity.properties["rule"], entity.created_ms)
        else:
            runtime = await self.entities.runtime(entity)
            content = ax.description(entity.kind, entity.properties, runtime, request.host)
        return ax.entry(
            url,
            entity.name,
            content,
            updated_ms=entity.updated_ms,
            published_ms=entity.created_ms,
            author=ax.NAMESPACE_NAME if entity.kind in ("queue", "topic") else None,
            base=base,
        )

    async def _feed(self, request: Request, title: str, found: list[Entity]) -> Response:
        params = request.params
        skip = _int_param(params, "$skip", 0)
        top = min(_int_param(params, "$top", DEFAULT_TOP), MAX_TOP)
        if skip < 0 or top < 1:
            raise ax.AtomError(400, "$skip must be >= 0 and $top >= 1")
        ordered = sorted(found, key=lambda e: e.path)
        page = ordered[skip : skip + top]
        self_url = f"{request.base_url}{request.target}"
        next_url = None
        if skip + top < len(ordered):
            api = params.get("api-version", [""])[-1]
            next_url = f"{request.base_url}{request.path}?$skip={skip + top}&$top={top}" + (
                f"&api-version={quote(api)}" if api else ""
            )
        entries = [await self._entry(request, e, base=self_url) for e in page]
        return _xml(200, ax.feed(title, self_url, entries, next_url), ax.FEED_TYPE)


def _part(name: str) -> str:
    """A name in an entry's URL; `$Default` stays as is: JavaScript reads rule names from it."""
    return quote(name, safe="/$")


def _api(request: Request) -> str:
    api = request.params.get("api-version", [""])[-1]
    return f"?api-version={quote(api)}" if api else ""


def _only(method: str, allowed: str) -> None:
    if method != allowed:
        raise ax.AtomError(405, f"{method} is not supported here: use {allowed}")


def _int_param(params: dict[str, list[str]], name: str, default: int) -> int:
    values = params.get(name) or params.get(quote(name))
    if not values:
        return default
    try:
        return int(values[-1])
    except ValueError:
        raise ax.AtomError(400, f"{name} must be a whole number, got {values[-1]!r}") from None


def _name(name: str, what: str, nested: bool = False) -> str:
    try:
        normalized = normalize_entity_name(name, what)
    except ConfigError as exc:
        raise ax.AtomError(400, str(exc)) from None
    if nested and "/" in normalized:
        raise ax.AtomError(400, f"a {what} name cannot contain '/': {name!r}")
    return normalized


def _rule_name(name: str) -> str:
    """Rule names are not entity names: `$Default` is one (config.check_rule_name)."""
    try:
        return check_rule_name(name).lower()
    except ConfigError as exc:
        raise ax.AtomError(400, str(exc)) from None


def _validate(p: dict[str, Any], current: dict[str, Any] | None = None) -> None:
    """A description's values within the management API's bounds (busd.entities.properties,
    docs/design.md §2.1); `current`: the entity's properties, for a change (a message size
    below Premium's, which only the entities file sets, may be kept)."""
    try:
        ep.check(p, api=True, current=current)
    except ConfigError as exc:
        raise ax.AtomError(400, str(exc)) from None
