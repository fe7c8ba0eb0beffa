"""`<entity>/$management`: the request/response operations of docs/wire.md §8.4.

Every request gets exactly one response with the request's message-id as correlation-id and
an integer `statusCode` (a dropped response makes the SDK wait forever, docs/wire.md §8.3).
Failures carry `errorCondition`, which selects the SDK's exception class.
"""

from __future__ import annotations

import logging
import uuid

from busd.amqp import codec
from busd.broker.nodes import RequestEndpoint
from busd.broker.receiving import new_tokens
from busd.errors import BusdError, Condition, StoreStatus, store_error
from busd.storage.api import (
    EntityRef,
    NewMessage,
    Outcome,
    QueueSpec,
    ReceiveMode,
    Settlement,
    StoredMessage,
)

log = logging.getLogger("busd.broker")

# DateTime.MaxValue in ms: "no filter" for get-message-sessions (docs/wire.md §8.4.10).
DATETIME_MAX_MS = 253402300800000
DISPOSITIONS = {
    "completed": Outcome.COMPLETE,
    "abandoned": Outcome.ABANDON,
    "defered": Outcome.DEFER,  # sic: the SDK's spelling
    "deferred": Outcome.DEFER,
    "suspended": Outcome.DEAD_LETTER,
}


class ManagementEndpoint(RequestEndpoint):
    def __init__(self, conn, link, queue: QueueSpec, *, dlq: bool) -> None:
        super().__init__(conn, link)
        self.queue = queue
        self.entity = EntityRef(queue, dlq=dlq)

    async def handle(self, payload: bytes):
        try:
            request = codec.decode_message(payload)
        except codec.CodecError as exc:
            log.info("$management: undecodable request: %s", exc)
            return None, None
        props = request.properties
        message_id = props.get("message_id")
        reply_to = props.get("reply_to")
        app = request.application_properties or {}
        operation = str(app.get("operation") or "")
        body = request.body if isinstance(request.body, dict) else {}
        handler = OPERATIONS.get(operation.removeprefix("com.microsoft:"))
        try:
            if handler is None:
                raise BusdError(
                    Condition.NOT_IMPLEMENTED, f"The operation {operation!r} is not supported."
                )
            status, result = await handler(self, body, app)
        except BusdError as error:
            log.debug("$management %s failed: %s", operation, error)
            return _response(message_id, error.status_code, error.description, None,
                             condition=error.condition.value), reply_to
        except Exception:
            log.exception("$management %s failed", operation)
            return _response(message_id, 500, "Internal error.", None,
                             condition=Condition.INTERNAL.value), reply_to
        return _response(message_id, status, "OK" if status < 300 else "", result), reply_to

    # --- helpers ------------------------------------------------------------------------------
    def receiver_for(self, app: dict):
        """The receiver link named by `associated-link-name`, if it lives on this connection."""
        name = app.get("associated-link-name")
        return self.conn.links_by_name.get(name) if name else None

    def session_holder(self, app: dict, session_id: str) -> tuple[str, object]:
        receiver = self.receiver_for(app)
        if receiver is None or getattr(receiver, "session_id", None) != session_id:
            # Only the receiver holding the session lock may act on the session.
            for endpoint in self.conn.endpoints:
                if getattr(endpoint, "session_id", None) == session_id and hasattr(
                    endpoint, "lock_renewed"
                ):
                    receiver = endpoint
                    break
            else:
                raise BusdError(
                    Condition.SESSION_LOCK_LOST,
                    f"The session lock for '{session_id}' is not held by this client.",
                )
        return receiver.holder, receiver

    def encode(self, message: StoredMessage, *, state: bool = False) -> bytes:
        return codec.encode_delivery(
            message.blob,
            seq=message.seq,
            enqueued_ms=message.enqueued_ms,
            delivery_count=message.delivery_count,
            locked_until_ms=message.locked_until_ms,
            message_state=int(message.state) if state else None,
            dead_letter_reason=message.dead_letter_reason,
            dead_letter_description=message.dead_letter_description,
            properties_patch=message.properties_patch,
        )


def _response(message_id, status: int, description: str, body, *, condition: str | None = None):
    app = {"statusCode": codec.Int(status), "statusDescription": description}
    if condition is not None:
        app["errorCondition"] = codec.Symbol(condition)
    kwargs = {}
    if body is not None:
        kwargs["value"] = body
    return codec.encode_message(
        properties={"correlation_id": message_id}, application_properties=app, **kwargs
    )


def _session_id(body: dict) -> str | None:
    value = body.get("session-id")
    return str(value) if value is not None else None


def _tokens(body: dict) -> list[bytes]:
    tokens = body.get("lock-tokens") or []
    return [t.bytes if isinstance(t, uuid.UUID) else bytes(t) for t in tokens]


def _ints(values) -> list[int]:
    return [int(v) for v in (values or [])]


# --- operations (each returns (status, body)) ------------------------------------------------
async def renew_lock(ep: ManagementEndpoint, body: dict, app: dict):
    expirations = await ep.broker.store.renew_message_locks(ep.entity, _tokens(body))
    return 200, {"expirations": codec.Array(codec.Timestamp, [codec.Timestamp(e) for e in expirations])}


async def renew_session_lock(ep: ManagementEndpoint, body: dict, app: dict):
    session_id = _session_id(body) or ""
    holder, receiver = ep.session_holder(app, session_id)
    locked_until = await ep.broker.store.renew_session_lock(ep.queue, session_id, holder)
    receiver.lock_renewed(locked_until)
    return 200, {"expiration": codec.Timestamp(locked_until)}


async def get_session_state(ep: ManagementEndpoint, body: dict, app: dict):
    session_id = _session_id(body) or ""
    holder, _ = ep.session_holder(app, session_id)
    state = await ep.broker.store.get_session_state(ep.queue, session_id, holder)
    return 200, {"session-state": state}


async def set_session_state(ep: ManagementEndpoint, body: dict, app: dict):
    session_id = _session_id(body) or ""
    state = body.get("session-state")
    if isinstance(state, str):
        state = state.encode("utf-8")
    if state is not None and len(state) > ep.queue.max_message_size:
        raise BusdError(
            Condition.MESSAGE_SIZE_EXCEEDED,
            f"The session state of {len(state)} bytes exceeds the limit of "
            f"{ep.queue.max_message_size} bytes.",
        )
    holder, _ = ep.session_holder(app, session_id)
    await ep.broker.store.set_session_state(ep.queue, session_id, holder, state)
    return 200, None


async def peek_message(ep: ManagementEndpoint, body: dict, app: dict):
    from_seq = int(body.get("from-sequence-number") or 1)
    count = int(body.get("message-count") or 1)
    messages = await ep.broker.store.peek(ep.entity, from_seq, count, _session_id(body))
    if not messages:
        return 204, None
    return 200, {"messages": [{"message": ep.encode(m, state=True)} for m in messages]}


async def update_disposition(ep: ManagementEndpoint, body: dict, app: dict):
    status_name = str(body.get("disposition-status") or "").lower()
    # The SDK comes here for deferred messages, and when a link settlement went unanswered:
    # worth seeing in the log, since the latter costs the client 60 s.
    log.info("settlement through $management update-disposition (%s)", status_name)
    outcome = DISPOSITIONS.get(status_name)
    if outcome is None:
        raise BusdError(Condition.ARGUMENT_ERROR, f"Unknown disposition-status {status_name!r}.")
    session_id = _session_id(body)
    patch = body.get("properties-to-modify")
    settlements = [
        Settlement(
            token=token,
            outcome=outcome,
            session_id=session_id,
            dead_letter_reason=body.get("deadletter-reason") or None,
            dead_letter_description=body.get("deadletter-description") or None,
            properties_patch=codec.encode_properties_patch(patch) if patch else None,
        )
        for token in _tokens(body)
    ]
    holder = None
    if session_id is not None:
        receiver = ep.receiver_for(app)
        holder = getattr(receiver, "holder", None)
    statuses = await ep.broker.store.settle(ep.entity, settlements, holder)
    for status in statuses:
        if status != StoreStatus.OK:
            raise store_error(status)
    return 200, None


async def receive_by_sequence_number(ep: ManagementEndpoint, body: dict, app: dict):
    seqs = _ints(body.get("sequence-numbers"))
    mode = ReceiveMode(1 if int(body.get("receiver-settle-mode", 1)) else 0)
    session_id = _session_id(body)
    holder = None
    if session_id is not None:
        holder, _ = ep.session_holder(app, session_id)
    tokens = new_tokens(len(seqs)) if mode == ReceiveMode.PEEK_LOCK else []
    messages = await ep.broker.store.receive_deferred(
        ep.entity, seqs, mode, tokens, session_id, holder
    )
    out = []
    for message in messages:
        item = {"message": ep.encode(message)}
        if message.lock_token is not None:
            item["lock-token"] = uuid.UUID(bytes=message.lock_token)
        out.append(item)
    return 200, {"messages": out}


async def schedule_message(ep: ManagementEndpoint, body: dict, app: dict):
    from busd.broker.sending import MAX_SESSION_ID_LENGTH

    new: list[NewMessage] = []
    for item in body.get("messages") or []:
        payload = item.get("message") or b""
        if len(payload) > ep.queue.max_message_size:
            raise BusdError(Condition.MESSAGE_SIZE_EXCEEDED, "A scheduled message is too large.")
        try:
            incoming = codec.parse_incoming(bytes(payload))
        except codec.CodecError as exc:
            raise BusdError(Condition.DECODE_ERROR, f"Malformed message: {exc}") from None
        session_id = incoming.session_id or item.get("session-id")
        if ep.queue.requires_session and not session_id:
            raise BusdError(Condition.NOT_ALLOWED, "The SessionId was not set on a message.")
        if session_id is not None and len(session_id) > MAX_SESSION_ID_LENGTH:
            raise BusdError(Condition.ARGUMENT_OUT_OF_RANGE, "The session id is too long.")
        new.append(
            NewMessage(
                blob=incoming.blob,
                session_id=session_id if ep.queue.requires_session else None,
                message_id=incoming.message_id,
                ttl_ms=incoming.ttl_ms,
                scheduled_ms=incoming.scheduled_ms,
            )
        )
    seqs = await ep.broker.store.schedule(ep.queue, new)
    return 200, {"sequence-numbers": codec.Array(codec.Long, [codec.Long(s) for s in seqs])}


async def cancel_scheduled_message(ep: ManagementEndpoint, body: dict, app: dict):
    await ep.broker.store.cancel_scheduled(ep.queue, _ints(body.get("sequence-numbers")))
    return 200, None


async def get_message_sessions(ep: ManagementEndpoint, body: dict, app: dict):
    updated = body.get("last-updated-time")
    updated_after = None if updated is None or int(updated) >= DATETIME_MAX_MS else int(updated)
    skip = int(body.get("skip") or 0)
    top = int(body.get("top") or 100)
    ids = await ep.broker.store.list_sessions(ep.queue, skip, top, updated_after)
    if not ids:
        return 204, None
    return 200, {"skip": codec.Int(skip), "sessions-ids": codec.Array(str, ids)}


OPERATIONS = {
    "renew-lock": renew_lock,
    "renew-session-lock": renew_session_lock,
    "get-session-state": get_session_state,
    "set-session-state": set_session_state,
    "peek-message": peek_message,
    "update-disposition": update_disposition,
    "receive-by-sequence-number": receive_by_sequence_number,
    "schedule-message": schedule_message,
    "cancel-scheduled-message": cancel_scheduled_message,
    "get-message-sessions": get_message_sessions,
}
