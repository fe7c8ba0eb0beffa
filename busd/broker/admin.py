"""Operator tools: list queues, peek, list sessions, send, purge, resubmit dead letters; one
session's dead-lettering, resubmission and state (busd.broker.session_tools).

Each operation returns plain JSON-ready values, so the HTTP front (busd.observability.admin)
only routes. A message sent here takes the path of an AMQP send: it is encoded as an AMQP
message, read back by the same codec call a sender link uses, and stored by `store.send`, so
a receiver cannot tell it from one an SDK sent.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import time
import uuid
from collections.abc import Awaitable
from typing import Any, TypeVar

from busd.amqp import codec
from busd.amqp.addresses import AddressError, parse_address
from busd.broker import faults, messages, session_tools
from busd.errors import BusdError
from busd.rules import RuleError, rule_from_record, rule_to_dict
from busd.storage.messages import MessageState, StoredMessage
from busd.storage.sessions import SESSION_SORTS, SessionDetail
from busd.storage.specs import QueueSpec, TopicSpec

# Messages moved per resubmit call when the caller sets no limit: bounds one script's run.
RESUBMIT_CHUNK = 500
MAX_PEEK = 1000
# Partitions one `shards` call counts at once (one store call each).
SHARD_COUNTS_AT_ONCE = 16
T = TypeVar("T")


class AdminError(Exception):
    """A request the operation refuses; `status` is the HTTP status it maps to."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _names_a_dead_letter_queue(name: str) -> bool:
    """Whether `name` is a dead-letter (or transfer dead-letter) queue's address."""
    try:
        return parse_address(name).dlq
    except AddressError:
        return False  # not an address: the look-up answers 404


def iso(ms: int | None) -> str | None:
    """Milliseconds since the epoch as ISO 8601 UTC, e.g. 2026-01-02T03:04:05.678Z."""
    if ms is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"


# The session inspector's page: its default and largest size, and the state's preview bytes.
SESSION_PAGE = 100
MAX_SESSION_PAGE = 1000
STATE_PREVIEW = 32


def session_row(d: SessionDetail, spec: QueueSpec, now_ms: int) -> dict[str, Any]:
    """One session as the admin API shows it. Stuck: held, messages waiting, and nothing
    settled (nor accepted) for longer than the lock duration."""
    container, _, address = (d.client or "").partition("\0")
    held = d.locked_until_ms is not None
    idle_ms = now_ms - d.last_activity_ms if d.last_activity_ms else None
    preview = d.state_preview or b""
    return {
        "session_id": d.session_id,
        "locked": held,
        "locked_until": iso(d.locked_until_ms),
        "holder": d.holder,
        "holder_process": d.holder.rsplit(":", 1)[0] if d.holder else None,
        "holder_connection": container or None,
        "holder_address": address or None,
        "message_count": d.message_count,
        # as the entity's (queue_info): ActiveMessageCount's meaning, available plus in flight
        "active": d.active_message_count,
        "available": d.active,
        "in_flight": d.in_flight,
        "deferred": d.deferred,
        "scheduled": d.scheduled,
        "oldest_message_age_s": (
            max(0, now_ms - d.oldest_enqueued_ms) / 1000 if d.oldest_enqueued_ms else None
        ),
        "state_size": d.state_size,
        "state_preview": preview.decode("utf-8", errors="replace") if preview else None,
        "state_preview_base64": base64.b64encode(preview).decode() if preview else None,
        "state_updated": iso(d.state_updated_ms or None),
        "last_activity": iso(d.last_activity_ms or None),
        "stuck": bool(
            held
            and d.active_message_count > 0
            and idle_ms is not None
            and idle_ms > spec.lock_duration_ms
        ),
    }


def _json_value(value: Any) -> Any:
    """An AMQP value as JSON can hold it (timestamps, uuids, binary and the like as text)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    return str(value)


def _body(decoded: codec.DecodedMessage) -> dict[str, Any]:
    """The body as text when it is text, and always as base64 for a data body."""
    if decoded.body_type == "data":
        raw = b"".join(decoded.body)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        return {
            "body_type": "data",
            "body": text,
            "body_base64": base64.b64encode(raw).decode(),
            "body_size": len(raw),
        }
    if decoded.body_type == "value":
        value = decoded.body
        text = value if isinstance(value, str) else None
        return {"body_type": "value", "body": text, "body_value": _json_value(value)}
    if decoded.body_type == "sequence":
        return {"body_type": "sequence", "body": None, "body_value": _json_value(decoded.body)}
    return {"body_type": None, "body": None}


def message_view(m: StoredMessage) -> dict[str, Any]:
    if m.locked_until_ms is not None:
        state = "locked"
    else:
        state = {
            MessageState.ACTIVE: "active",
            MessageState.DEFERRED: "deferred",
            MessageState.SCHEDULED: "scheduled",
        }[m.state]
    view: dict[str, Any] = {
        "sequence_number": m.seq,
        "state": state,
        "enqueued_time": iso(m.enqueued_ms),
        "expires_at": iso(m.expires_ms),
        "locked_until": iso(m.locked_until_ms),
        "delivery_count": m.delivery_count,
        "session_id": m.session_id,
        "dead_letter_reason": m.dead_letter_reason,
        "dead_letter_description": m.dead_letter_description,
    }
    try:
        decoded = codec.decode_message(messages.delivery_payload(m, locked=False))
    except codec.CodecError as exc:  # stored by an older version, or damaged: show what we can
        view["error"] = f"cannot decode the stored message: {exc}"
        return view
    props = decoded.properties
    view["message_id"] = _json_value(props.get("message_id"))
    view["subject"] = _json_value(props.get("subject"))
    view["content_type"] = _json_value(props.get("content_type"))
    view["application_properties"] = _json_value(decoded.application_properties)
    view.update(_body(decoded))
    return view


def filter_text(rule_filter: dict[str, Any]) -> str:
    """A rule's filter in one line: its SQL, or a correlation filter's field=value pairs."""
    kind = rule_filter.get("type")
    if kind in ("true", "false"):
        return "1=1" if kind == "true" else "1=0"
    if kind == "sql":
        return str(rule_filter.get("expression"))
    pairs = [(k, v) for k, v in rule_filter.items() if k not in ("type", "properties")]
    pairs += list((rule_filter.get("properties") or {}).items())
    return ", ".join(f"{k}={v}" for k, v in pairs)


def _rule_view(name: str, record: Any) -> dict[str, Any]:
    try:
        rule = rule_to_dict(rule_from_record(name, record))
    except RuleError as exc:  # stored by an older version: show the name and why
        return {"name": name, "error": str(exc)}
    action = rule.get("action")
    return {
        "name": name,
        "filter": rule["filter"],
        "filter_text": filter_text(rule["filter"]),
        "action": action["expression"] if action else None,
    }


async def _refused_as_http(call: Awaitable[T]) -> T:
    """`call`'s result; its refusal (BusdError) as the AdminError of its condition's HTTP
    status (`BusdError.status_code`: the one table of them, which `$management` answers by
    too)."""
    try:
        return await call
    except BusdError as error:
        raise AdminError(error.status_code, error.description) from None


class Admin:
    """The operations, over one broker's entities and store."""

    def __init__(self, broker) -> None:
        self.broker = broker

    def queue(self, name: str) -> QueueSpec:
        """A queue or a subscription (`<topic>/Subscriptions/<name>`)."""
        spec = self.broker.receivable(name)
        if spec is None:
            raise AdminError(404, f"no queue or subscription named {name!r}")
        return spec

    async def queues(self) -> list[dict[str, Any]]:
        """Every queue and every topic's subscriptions (a topic holds no messages itself)."""
        out = []
        for name in sorted(self.broker.entities):
            out.append(await self.queue_info(name))
        return out

    async def topics(self) -> list[dict[str, Any]]:
        """Every topic, those without subscriptions too, with its subscriptions and their
        rules (a topic holds no messages itself: its subscriptions' counts are in queues())."""
        catalog = self.broker.catalog
        out = []
        for topic in sorted(catalog.topics(), key=lambda t: t.name):
            subscriptions = [
                {
                    "name": sub.name,
                    "path": f"{topic.name}/subscriptions/{sub.name}",
                    "requires_session": sub.requires_session,
                    "rules": [
                        _rule_view(r.name, r.rule) for r in catalog.rules(topic.name, sub.name)
                    ],
                }
                for sub in sorted(catalog.subscriptions(topic.name), key=lambda s: s.name)
            ]
            out.append({"name": topic.name, "subscriptions": subscriptions})
        return out

    async def shards(self, name: str | None = None) -> list[dict[str, Any]]:
        """Where each queue and subscription (or the one named) is kept, by store server (a
        Cluster's shard primary, `host:port`): its partitions there, and their sessions,
        available messages and totals sent and received, so that an uneven spread shows
        (docs/design.md §3.18)."""
        broker = self.broker
        specs = (
            [self.queue(name)] if name else [broker.entities[n] for n in sorted(broker.entities)]
        )
        out = []
        for spec, where in zip(specs, await broker.store.shards(specs)):
            parts = spec.partition_specs
            counts = []
            for start in range(0, len(parts), SHARD_COUNTS_AT_ONCE):
                chunk = parts[start : start + SHARD_COUNTS_AT_ONCE]
                counts += await asyncio.gather(*(broker.store.counts(p) for p in chunk))
            rows: dict[str, dict[str, Any]] = {}
            for shard, c in zip(where, counts):
                row = rows.setdefault(
                    shard,
                    {
                        "shard": shard,
                        "partitions": 0,
                        "sessions": 0,
                        "active": 0,
                        "sent": 0,
                        "received": 0,
                    },
                )
                row["partitions"] += 1
                row["sessions"] += c.sessions
                row["active"] += c.active_message_count
                row["sent"] += c.totals.get("sent", 0)
                row["received"] += c.totals.get("received", 0)
            out.append(
                {
                    "name": spec.name,
                    "partitions": spec.partitions,
                    "shards": sorted(rows.values(), key=lambda r: r["shard"]),
                }
            )
        return out

    async def queue_info(self, name: str) -> dict[str, Any]:
        spec = self.queue(name)
        store = self.broker.store
        counts, size = await asyncio.gather(store.counts(spec), store.size_in_bytes(spec))
        return {
            "name": spec.name,
            "kind": "queue" if spec.topic is None else "subscription",
            "topic": spec.topic,
            "properties": {
                k: v for k, v in dataclasses.asdict(spec).items() if k not in ("name", "topic")
            },
            # `active` is the management API's ActiveMessageCount (available plus locked),
            # so that the dashboard and the SDKs' admin clients show one number;
            # `available` is what a receiver can take now.
            "counts": {
                "active": counts.active_message_count,
                "available": counts.active,
                "locked": counts.locked,
                "scheduled": counts.scheduled,
                "deferred": counts.deferred,
                "dead_letter": counts.dead_letter,
                "sessions": counts.sessions,
                "locked_sessions": counts.locked_sessions,
                "message_count": counts.message_count,
            },
            "size_in_bytes": size,
            # What the store counted for the entity since it began (sent, received, ...; an
            # event that never happened is absent): the dashboard's rates are their change.
            "totals": dict(counts.totals),
        }

    async def peek(
        self,
        name: str,
        *,
        dlq: bool = False,
        session_id: str | None = None,
        from_seq: int = 0,
        count: int = 20,
    ) -> list[dict[str, Any]]:
        spec = self.queue(name)
        if not 1 <= count <= MAX_PEEK:
            raise AdminError(400, f"count must be 1..{MAX_PEEK}, got {count}")
        messages = await self.broker.store.peek(
            spec.dead_letter_queue if dlq else spec, max(from_seq, 0), count, session_id
        )
        return [message_view(m) for m in messages]

    async def sessions(
        self, name: str, sort: str = "id", after: str | None = None, top: int = SESSION_PAGE
    ) -> tuple[list[dict[str, Any]], str | None, int]:
        """One page of the session inspector (docs/management.md §7): (sessions, the cursor
        of the next page or None, sessions in the sort's index)."""
        spec = self.queue(name)
        if sort not in SESSION_SORTS:
            raise AdminError(400, f"sort must be one of {', '.join(SESSION_SORTS)}, got {sort!r}")
        if not 1 <= top <= MAX_SESSION_PAGE:
            raise AdminError(400, f"top must be 1..{MAX_SESSION_PAGE}, got {top}")
        page = await self.broker.store.session_page(spec, sort, after, top, STATE_PREVIEW)
        now = int(time.time() * 1000)
        return [session_row(d, spec, now) for d in page.sessions], page.next, page.total

    async def release_session_lock(self, name: str, session_id: str) -> dict[str, Any]:
        """Drop a (stuck) session lock, whoever holds it: its holder's next settle gets
        session-lock-lost; its unsettled messages are available again."""
        spec = self.queue(name)
        return {"released": await self.broker.store.drop_session_lock(spec, session_id)}

    async def dead_letter_session(
        self, name: str, session_id: str, reason: Any, description: Any
    ) -> dict[str, Any]:
        spec = self.queue(name)
        moved = await _refused_as_http(
            session_tools.dead_letter(self.broker.store, spec, session_id, reason, description)
        )
        return {"dead_lettered": moved}

    async def resubmit_session(self, name: str, session_id: str) -> dict[str, Any]:
        spec = self.queue(name)
        moved, left = await _refused_as_http(
            session_tools.resubmit(self.broker.store, spec, session_id)
        )
        return {"resubmitted": moved, "left": left}

    async def session_state(self, name: str, session_id: str) -> tuple[bytes | None, str | None]:
        """(state, etag) of a session, whoever holds it."""
        spec = self.queue(name)
        return await _refused_as_http(self.broker.store.read_session_state(spec, session_id, ""))

    async def set_session_state(
        self,
        name: str,
        session_id: str,
        state: bytes | None,
        *,
        if_match: str | None,
        if_absent: bool,
    ) -> str | None:
        """Write (None: clear) a session's state, whoever holds it, on the condition given;
        the new etag (None when cleared)."""
        spec = self.queue(name)
        return await _refused_as_http(
            self._write_state(spec, session_id, state, if_match, if_absent)
        )

    async def _write_state(
        self,
        spec: QueueSpec,
        session_id: str,
        state: bytes | None,
        if_match: str | None,
        if_absent: bool,
    ) -> str | None:
        session_tools.check_state_size(spec, state)
        return await self.broker.store.set_session_state(
            spec, session_id, "", state, if_match=if_match, if_absent=if_absent
        )

    async def send(
        self,
        name: str,
        body: bytes,
        *,
        session_id: str | None = None,
        application_properties: dict[str, Any] | None = None,
        message_id: str | None = None,
        content_type: str | None = None,
        subject: str | None = None,
    ) -> dict[str, Any]:
        spec: QueueSpec | TopicSpec
        topic = self.broker.topic(name)
        if topic is not None:
            spec = topic
        else:
            spec = self.queue(name)
            if spec.topic is not None:
                raise AdminError(400, f"{spec.name!r} is a subscription: send to its topic")
        if isinstance(spec, QueueSpec) and spec.requires_session and session_id is None:
            raise AdminError(400, f"queue {spec.name!r} requires sessions: give a session id")
        for key, value in (application_properties or {}).items():
            if not isinstance(value, (str, int, float, bool)) and value is not None:
                raise AdminError(400, f"application property {key!r}: only JSON scalars")
        properties = {
            "message_id": message_id or uuid.uuid4().hex,
            "group_id": session_id,
            "content_type": content_type,
            "subject": subject,
        }
        try:
            payload = codec.encode_message(
                properties=properties, application_properties=application_properties, data=body
            )
        except codec.CodecError as exc:
            raise AdminError(400, f"cannot build the message: {exc}") from None
        try:
            messages.check_size(spec, len(payload))
            message = messages.admit(spec, messages.parse_one(payload))
        except BusdError as error:  # too large (413) or not admissible (400)
            raise AdminError(error.status_code, error.description) from None
        (seq,) = await self.broker.send(spec, [message])
        return {
            "sequence_number": seq,
            "message_id": properties["message_id"],
            "duplicate": seq == 0,
        }

    async def purge(self, name: str, *, dlq: bool = False) -> dict[str, Any]:
        spec = self.queue(name)
        return {"purged": await self.broker.store.purge(spec.dead_letter_queue if dlq else spec)}

    # --- faults on demand (docs/faults.md) ---------------------------------------------------
    async def add_fault(self, document: dict[str, Any]) -> dict[str, Any]:
        name = document.get("entity")
        if not isinstance(name, str) or not name:
            raise AdminError(400, "entity must name a queue, topic or subscription")
        if _names_a_dead_letter_queue(name):
            # what receivable() resolves to its parent: a fault would land there
            raise AdminError(
                400,
                f"{name!r} is a dead-letter queue: faults on demand are set on a queue, topic "
                "or subscription, never on its dead-letter queue",
            )
        spec: QueueSpec | TopicSpec | None = self.broker.receivable(name)
        if spec is None:
            spec = self.broker.topic(name)
        if spec is None:
            raise AdminError(404, f"no queue, topic or subscription named {name!r}")
        try:
            fault = faults.parse(document, spec.name, int(time.time() * 1000))
        except faults.FaultError as exc:
            raise AdminError(400, str(exc)) from None
        if fault.kind in ("session-lock-lost", "message-lock-lost") and not isinstance(
            spec, QueueSpec
        ):
            raise AdminError(400, f"{fault.kind}: a topic holds no locks; name a subscription")
        if fault.kind == "session-lock-lost" and not spec.requires_session:  # type: ignore[union-attr]
            raise AdminError(400, f"{spec.name!r} does not require sessions")
        try:
            return await self.broker.faults.add(fault)
        except faults.FaultRefused as exc:
            raise AdminError(403, str(exc)) from None

    async def faults(self) -> list[dict[str, Any]]:
        return await self.broker.faults.listed()

    async def delete_fault(self, fault_id: str) -> dict[str, Any]:
        if not await self.broker.faults.delete(fault_id):
            raise AdminError(404, f"no fault {fault_id!r}")
        return {"deleted": fault_id}

    async def resubmit(self, name: str, limit: int | None = None) -> dict[str, Any]:
        """Move dead-lettered messages back: at most `limit`, or every one (in chunks)."""
        spec = self.queue(name)
        if limit is not None and limit < 1:
            raise AdminError(400, f"limit must be at least 1, got {limit}")
        store = self.broker.store
        moved = 0
        while limit is None or moved < limit:
            chunk = RESUBMIT_CHUNK if limit is None else min(RESUBMIT_CHUNK, limit - moved)
            n = await store.resubmit_dead_letters(spec, chunk)
            moved += n
            if n < chunk:
                break
        remaining = await store.counts(spec.dead_letter_queue)
        return {
            "resubmitted": moved,
            "remaining": remaining.active + remaining.deferred,
            "dead_letter": remaining.dead_letter,
        }
