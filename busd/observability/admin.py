"""The admin API's routes on the HTTP port (the operations are busd.broker.admin's).

    GET  /admin/queues                          every queue: properties, counts (`active` is
                                                ActiveMessageCount) and size_in_bytes
    GET  /admin/queues/{q}                      one queue
    GET  /admin/topics                          every topic: its subscriptions and their rules
    GET  /admin/shards                          where each queue and subscription is kept: per
                                                store server (shard), its partitions, sessions,
                                                messages; ?entity=Q for one
    GET  /admin/queues/{q}/messages             peek: ?dlq=1&session=S&from=N&count=N
    POST /admin/queues/{q}/messages             send: JSON {body | body_base64, session_id,
                                                application_properties, message_id, content_type,
                                                subject}
    GET  /admin/queues/{q}/sessions             the session inspector, one page:
                                                ?sort=id|locked|waiting|updated&after=C&top=N;
                                                the next page's cursor in X-Next-After
    GET|POST /admin/faults                      faults on demand (docs/faults.md): the list;
                                                set one: JSON {kind, entity, session,
                                                operations, count, fraction, duration_ms,
                                                delay_ms, condition, description}
    DELETE /admin/faults/{id}                   end one now
    POST /admin/queues/{q}/purge                delete every message: ?dlq=1 for the DLQ
    POST /admin/queues/{q}/dlq/resubmit         dead letters back to the queue: ?limit=N
    POST /admin/queues/{q}/sessions/{s}/dead-letter   the whole session and its state to the
                                                DLQ: JSON {reason, description}
    POST /admin/queues/{q}/sessions/{s}/resubmit      its dead letters back, in order
    POST /admin/queues/{q}/sessions/{s}/release       drop its lock, whoever holds it
    GET|PUT|DELETE /admin/queues/{q}/sessions/{s}/state   its state, raw bytes, with an ETag;
                                                PUT and DELETE take If-Match (an etag or *)
                                                and If-None-Match: * (create only)

Every request needs a SAS token signed with a key holding the Manage right whose audience covers
the queue (the namespace, for the list), as Service Bus's management operations, reads included
(busd.auth.rights). A queue name may hold `/`: clients send it percent-encoded (`orders%2Feu`);
a session id is always percent-encoded. Answers are JSON (but a session's state); a failure is
`{"error": "..."}` with 400 (bad request), 401 (no valid token, audience or right), 404
(unknown queue or route, no state), 405, 412 (a condition on the state failed), 413 (message
or state too large), or 503 (the store does not answer).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, quote, unquote

from busd.broker.admin import SESSION_PAGE, Admin, AdminError
from busd.broker.messages import MAX_SESSION_ID_LENGTH
from busd.storage.sessions import SESSION_SORTS

log = logging.getLogger("busd.http")

# How long one admin operation may take before the store counts as unreachable.
OPERATION_TIMEOUT_S = 30.0
# The body of a request that carries no message or state (a dead-letter reason, nothing).
BODY_LIMIT = 64 * 1024
_ACTIONS = ("/dlq/resubmit", "/messages", "/sessions", "/purge")


@dataclass
class Raw:
    """An answer that is not a JSON document, or that has headers of its own."""

    body: bytes
    content_type: str = "application/octet-stream"
    headers: dict[str, str] = field(default_factory=dict)


Response = tuple[int, Any]
# /admin/queues/<queue>/sessions/<session>/<operation>: the session's own routes
_SESSION_ROUTE = re.compile(
    r"^(?P<queue>.+)/sessions/(?P<session>[^/]+)"
    r"/(?P<operation>state|dead-letter|resubmit|release)$"
)


# The cursor of an inspector page sorted by anything but id: `<score>:<session id>`, the score
# as the store writes it (busd/storage/redis/lua/sessionPage.lua).
_SCORE_CURSOR = re.compile(r"[-+]?[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?:.*", re.DOTALL)


def _session_id(text: str) -> str:
    """A session id of a route, as the AMQP side takes them (docs/design.md §2.2): at most 128
    characters and no NUL, which separates ids in the store's keys."""
    if len(text) > MAX_SESSION_ID_LENGTH or "\0" in text:
        raise AdminError(
            400,
            f"a session id is at most {MAX_SESSION_ID_LENGTH} characters and holds no NUL "
            "character",
        )
    return text


def _cursor(sort: str, after: str | None) -> str | None:
    """The inspector's `after`, checked before the store reads it: the `X-Next-After` of the
    previous page of the same sort."""
    if after is None or sort not in SESSION_SORTS:
        return after  # no cursor; an unknown sort is refused with its own message
    if sort == "id":
        _session_id(after)
    elif not _SCORE_CURSOR.fullmatch(after) or len(after) > MAX_SESSION_ID_LENGTH + 40:
        raise AdminError(
            400,
            f"after must be the X-Next-After of the previous page sorted by {sort} "
            f"(<score>:<session id>), got {after[:60]!r}",
        )
    else:
        _session_id(after.partition(":")[2])
    return after


def _flag(query: dict[str, list[str]], name: str) -> bool:
    return (query.get(name) or ["0"])[-1].lower() in ("1", "true", "yes")


def _int(query: dict[str, list[str]], name: str, default: int | None) -> int | None:
    values = query.get(name)
    if not values:
        return default
    try:
        return int(values[-1])
    except ValueError:
        raise AdminError(400, f"{name} must be an integer, got {values[-1]!r}") from None


def _json_body(body: bytes) -> dict[str, Any]:
    try:
        document = json.loads(body or b"{}")
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AdminError(400, f"the request body is not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise AdminError(400, "the request body must be a JSON object")
    return document


def _message_body(document: dict[str, Any]) -> bytes:
    if "body_base64" in document:
        try:
            return base64.b64decode(str(document["body_base64"]), validate=True)
        except (binascii.Error, ValueError):
            raise AdminError(400, "body_base64 is not base64") from None
    body = document.get("body")
    if not isinstance(body, str):
        raise AdminError(400, "give the message body as a string `body` or as `body_base64`")
    return body.encode("utf-8")


def _optional_text(document: dict[str, Any], name: str) -> str | None:
    value = document.get(name)
    if value is not None and not isinstance(value, str):
        raise AdminError(400, f"{name} must be a string")
    return value


_PREFIX = "/admin/queues/"


def _split(path: str) -> tuple[str, str]:
    """(queue name, action) of a path under /admin/queues/; a session's route is the action
    `/session`."""
    rest = path[len(_PREFIX) :]
    session = _SESSION_ROUTE.match(rest)
    if session:
        return unquote(session["queue"]), "/session"
    action = next((a for a in _ACTIONS if rest.endswith(a)), "")
    return unquote(rest[: len(rest) - len(action)]), action


def admin_body_limit(broker, method: str, path: str) -> int:
    """The most body an admin request takes, read before any of it arrives: a message sent
    (its body base64-encoded in JSON, with its properties) or a session's state as large as
    its entity's largest message; anything else BODY_LIMIT."""
    if not path.startswith(_PREFIX) or method not in ("POST", "PUT"):
        return BODY_LIMIT
    name, action = _split(path)
    if action == "/messages" and method == "POST":
        target = broker.topic(name) or broker.receivable(name)
        if target is not None:
            return (target.max_message_size + 2) // 3 * 4 + BODY_LIMIT
    elif action == "/session" and method == "PUT":
        spec = broker.receivable(name)
        if spec is not None:
            return max(spec.max_message_size, BODY_LIMIT)
    return BODY_LIMIT  # an unknown entity's answer (404) is small


def entity_of(path: str) -> str:
    """The entity an admin request acts on, which its token must cover: a queue, or the
    whole namespace ("") for the list of queues and anything unknown."""
    return _split(path)[0] if path.startswith(_PREFIX) else ""


async def _dispatch(
    admin: Admin, method: str, path: str, query: dict, body: bytes, headers: dict[str, str]
) -> Response:
    if path in ("/admin/queues", "/admin/queues/"):
        if method != "GET":
            raise AdminError(405, "use GET")
        return 200, await admin.queues()
    if path in ("/admin/topics", "/admin/topics/"):
        if method != "GET":
            raise AdminError(405, "use GET")
        return 200, await admin.topics()
    if path.rstrip("/") == "/admin/faults" or path.startswith("/admin/faults/"):
        return await _faults(admin, method, path, body)
    if path in ("/admin/shards", "/admin/shards/"):
        if method != "GET":
            raise AdminError(405, "use GET")
        return 200, await admin.shards((query.get("entity") or [None])[-1])
    if not path.startswith(_PREFIX):
        raise AdminError(404, f"no route {path}")
    name, action = _split(path)
    if action == "/session":
        return await _session(
            admin, name, _SESSION_ROUTE.match(path[len(_PREFIX) :]), method, body, headers
        )
    allowed = {
        "": ("GET",),
        "/sessions": ("GET",),
        "/purge": ("POST",),
        "/dlq/resubmit": ("POST",),
        "/messages": ("GET", "POST"),
    }[action]
    if method not in allowed:
        raise AdminError(405, f"use {' or '.join(allowed)}")
    if action == "":
        return 200, await admin.queue_info(name)
    if action == "/sessions":
        sort = (query.get("sort") or ["id"])[-1]
        sessions, next_after, total = await admin.sessions(
            name,
            sort,
            _cursor(sort, (query.get("after") or [None])[-1]),
            _int(query, "top", SESSION_PAGE) or SESSION_PAGE,
        )
        headers = {"X-Total-Count": str(total)}
        if next_after is not None:
            headers["X-Next-After"] = quote(next_after, safe="")
        return 200, Raw(json.dumps(sessions).encode(), "application/json", headers)
    if action == "/purge":
        return 200, await admin.purge(name, dlq=_flag(query, "dlq"))
    if action == "/dlq/resubmit":
        return 200, await admin.resubmit(name, _int(query, "limit", None))
    if method == "GET":
        return 200, await admin.peek(
            name,
            dlq=_flag(query, "dlq"),
            session_id=(query.get("session") or [None])[-1],
            from_seq=_int(query, "from", 0) or 0,
            count=_int(query, "count", 20) or 20,
        )
    document = _json_body(body)
    properties = document.get("application_properties")
    if properties is not None and not isinstance(properties, dict):
        raise AdminError(400, "application_properties must be a JSON object")
    return 201, await admin.send(
        name,
        _message_body(document),
        session_id=_optional_text(document, "session_id"),
        application_properties=properties,
        message_id=_optional_text(document, "message_id"),
        content_type=_optional_text(document, "content_type"),
        subject=_optional_text(document, "subject"),
    )


async def _faults(admin: Admin, method: str, path: str, body: bytes) -> Response:
    fault_id = path.rstrip("/")[len("/admin/faults") :].lstrip("/")
    if fault_id:
        if method != "DELETE":
            raise AdminError(405, "use DELETE")
        return 200, await admin.delete_fault(unquote(fault_id))
    if method == "GET":
        return 200, await admin.faults()
    if method != "POST":
        raise AdminError(405, "use GET or POST")
    return 201, await admin.add_fault(_json_body(body))


def _etag_header(etag: str) -> dict[str, str]:
    return {"ETag": f'"{etag}"'}


def _condition(headers: dict[str, str]) -> tuple[str | None, bool]:
    """(If-Match's etag or "*", If-None-Match: *) of a write of a session's state."""
    if_match = headers.get("if-match")
    if_none_match = headers.get("if-none-match")
    if if_none_match is not None and if_none_match.strip() != "*":
        raise AdminError(400, "If-None-Match takes only * (create the state only if it has none)")
    if if_match is not None:
        if_match = if_match.strip()
        if if_match != "*":
            if_match = if_match.removeprefix("W/").strip('"')
    return if_match, if_none_match is not None


async def _session(
    admin: Admin, name: str, route: Any, method: str, body: bytes, headers: dict[str, str]
) -> Response:
    session_id, operation = _session_id(unquote(route["session"])), route["operation"]
    allowed = ("GET", "PUT", "DELETE") if operation == "state" else ("POST",)
    if method not in allowed:
        raise AdminError(405, f"use {' or '.join(allowed)}")
    if operation == "dead-letter":
        document = _json_body(body)
        return 200, await admin.dead_letter_session(
            name, session_id, document.get("reason"), document.get("description")
        )
    if operation == "resubmit":
        return 200, await admin.resubmit_session(name, session_id)
    if operation == "release":
        return 200, await admin.release_session_lock(name, session_id)
    if method == "GET":
        state, etag = await admin.session_state(name, session_id)
        if state is None or etag is None:
            raise AdminError(404, f"session {session_id!r} has no state")
        return 200, Raw(state, headers=_etag_header(etag))
    if_match, if_absent = _condition(headers)
    written = await admin.set_session_state(
        name, session_id, body if method == "PUT" else None, if_match=if_match, if_absent=if_absent
    )
    if written is None:
        return 200, {"etag": None}
    return 200, Raw(
        json.dumps({"etag": written}).encode(), "application/json", _etag_header(written)
    )


async def route_admin(
    broker, method: str, path: str, query: str, body: bytes, headers: dict[str, str] | None = None
) -> Response:
    """(HTTP status, JSON-ready answer or Raw) of one admin request."""
    try:
        return await asyncio.wait_for(
            _dispatch(Admin(broker), method, path, parse_qs(query), body, headers or {}),
            OPERATION_TIMEOUT_S,
        )
    except AdminError as error:
        return error.status, {"error": error.message}
    except Exception as exc:  # the store, most likely: say which
        try:
            reachable = await asyncio.wait_for(broker.store.ping(), 2)
        except Exception:
            reachable = False
        if not reachable or isinstance(exc, asyncio.TimeoutError):
            log.warning("admin %s %s: the store is unreachable: %s", method, path, exc)
            return 503, {"error": f"the store is unreachable: {exc or type(exc).__name__}"}
        log.exception("admin %s %s failed", method, path)
        return 500, {"error": f"{type(exc).__name__}: {exc}"}
