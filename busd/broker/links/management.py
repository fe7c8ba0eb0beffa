"""`<entity>/$management`: the request/response operations of docs/wire.md §8.4.

Every request gets exactly one response with the request's message-id as correlation-id and
an integer `statusCode` (a dropped response makes the SDK wait forever, docs/wire.md §8.3).
Failures carry `errorCondition`, which selects the SDK's exception class.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from busd.amqp import codec
from busd.auth.rights import LISTEN, MANAGE, SEND
from busd.broker import messages, rule_management, session_tools
from busd.broker.lease import SessionLease
from busd.broker.links import staging
from busd.broker.links.base import ConnectionScope, Receiver, SessionHolder
from busd.broker.links.nodes import RequestEndpoint
from busd.broker.messages import delivery_payload, new_tokens
from busd.errors import BusdError, Condition, refusal, store_unavailable
from busd.storage.api import StoreUnavailable
from busd.storage.messages import MessageState, NewMessage, Outcome, ReceiveMode, Settlement
from busd.storage.specs import QueueSpec, TopicSpec
from busd.storage.staged import StagedSessionState, StagedSettlement

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


# What a topic's node serves: messages live in its subscriptions, whose nodes serve the rest.
TOPIC_OPERATIONS = frozenset(("schedule-message", "cancel-scheduled-message"))
# What a dead-letter sub-queue's node serves: its own messages only. The others act on the
# entity above it (schedule into it, cancel its scheduled messages, its sessions and their
# state, its rules), which a token for the sub-queue does not cover; Service Bus refuses them
# on a dead-letter queue too (docs/wire.md §8.4).
DEAD_LETTER_OPERATIONS = frozenset(
    (
        "renew-lock",
        "peek-message",
        "update-disposition",
        "receive-by-sequence-number",
        "batch-delete-messages",
    )
)
# The most messages one batch delete deletes: Service Bus's own bound; a larger count is
# answered with at most this many, as the service does (the SDKs' purge asks again until 0).
BATCH_DELETE_MAX = 4000


class ManagementEndpoint(RequestEndpoint):
    def __init__(
        self, conn: ConnectionScope, link, queue: QueueSpec | TopicSpec, *, dlq: bool
    ) -> None:
        super().__init__(conn, link, conn.broker.limits.link_ceiling(queue.max_message_size))
        # where sent messages go: the queue, or the topic (fanned out)
        self.target = queue
        if isinstance(queue, TopicSpec):  # only TOPIC_OPERATIONS reach self.queue
            queue = QueueSpec(queue.name, max_message_size=queue.max_message_size)
        self.queue = queue
        self.dlq = dlq
        self.entity = queue.dead_letter_queue if dlq else queue

    def on_delivery(self, delivery) -> None:
        # A request made in a transaction carries it as its transfer state (docs/wire.md
        # §10.4); the handler task created for it inherits the value.
        txn = staging.REQUEST_TXN.set(staging.txn_id_of(delivery._impl))
        try:
            super().on_delivery(delivery)
        finally:
            staging.REQUEST_TXN.reset(txn)

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
        name = operation.removeprefix("com.microsoft:")
        handler = OPERATIONS.get(name)
        try:
            if handler is None:
                raise BusdError(
                    Condition.NOT_IMPLEMENTED, f"The operation {operation!r} is not supported."
                )
            # Each request: the right depends on the operation, and the token may have lapsed
            # since the attach. `needs` holds the entity path routing authorized.
            self.conn.authorize(self.needs[0] if self.needs else "", OPERATION_RIGHTS[name])
            if isinstance(self.target, TopicSpec) and name not in TOPIC_OPERATIONS:
                raise BusdError(
                    Condition.NOT_ALLOWED,
                    f"'{self.target.name}' is a topic: {operation!r} is served by the "
                    "$management node of its subscriptions.",
                )
            if self.dlq and name not in DEAD_LETTER_OPERATIONS:
                raise BusdError(
                    Condition.NOT_ALLOWED,
                    f"{operation!r} is not supported on the dead-letter queue "
                    f"'{self.entity.path}': it is served by the $management node of "
                    f"'{self.queue.path}'.",
                )
            status, result = await handler(self, body, app)
        except BusdError as error:
            log.debug("$management %s failed: %s", operation, error)
            return _response(
                message_id,
                error.status_code,
                error.description,
                None,
                condition=error.condition.value,
            ), reply_to
        except StoreUnavailable as exc:  # the SDKs try again
            log.warning("$management %s failed: %s", operation, exc)
            busy = store_unavailable()
            return _response(
                message_id, busy.status_code, busy.description, None, condition=busy.condition.value
            ), reply_to
        except Exception:
            log.exception("$management %s failed", operation)
            return _response(
                message_id, 500, "Internal error.", None, condition=Condition.INTERNAL.value
            ), reply_to
        return _response(message_id, status, "OK" if status < 300 else "", result), reply_to

    # --- helpers ------------------------------------------------------------------------------
    def receiver_for(self, app: dict) -> Receiver | None:
        """The receiver link named by `associated-link-name`, if it lives on this connection."""
        name = app.get("associated-link-name")
        receiver = self.conn.links.named(name) if name else None
        return receiver if isinstance(receiver, Receiver) else None

    def session_named(self, body: dict, app: dict) -> str | None:
        """The request's `session-id`; without one, the session the receiver named by
        `associated-link-name` holds (the Go SDK names a session receiver's session only
        through that link, as Service Bus allows), if any."""
        session_id = _session_id(body)
        if session_id is None:
            receiver = self.receiver_for(app)
            if isinstance(receiver, SessionHolder) and receiver.lease is not None:
                session_id = receiver.lease.session_id
        return session_id

    def session_lease(self, app: dict, session_id: str) -> SessionLease:
        """The lease of the receiver of this connection holding `session_id`: only it may act
        on the session (docs/wire.md §8.4)."""
        receiver = self.receiver_for(app)
        lease = None
        if isinstance(receiver, SessionHolder) and receiver.session_id == session_id:
            lease = receiver.lease
        elif (held := self.broker.receivers.holding(self.queue.name, session_id)) is not None:
            lease = held.lease if held.conn is self.conn else None
        if lease is None:
            raise BusdError(
                Condition.SESSION_LOCK_LOST,
                f"The session lock for '{session_id}' is not held by this client.",
            )
        if lease.queue.name != self.queue.name:  # a lock on another entity's session
            raise refusal(Condition.SESSION_LOCK_LOST)
        lease.check_held()  # (its end here comes before the store's: lease.py)
        return lease


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
    stamps = [codec.Timestamp(e) for e in expirations]
    return 200, {"expirations": codec.Array(codec.Timestamp, stamps)}


async def renew_session_lock(ep: ManagementEndpoint, body: dict, app: dict):
    session_id = _session_id(body) or ""
    locked_until = await ep.session_lease(app, session_id).renew()
    return 200, {"expiration": codec.Timestamp(locked_until)}


async def get_session_state(ep: ManagementEndpoint, body: dict, app: dict):
    session_id = _session_id(body) or ""
    holder = ep.session_lease(app, session_id).holder
    state, etag = await ep.broker.store.read_session_state(ep.queue, session_id, holder)
    # `etag` is busd's own (docs/wire.md §8.4.3), when there is a state: the SDKs read only
    # `session-state`
    return 200, {"session-state": state} if etag is None else {"session-state": state, "etag": etag}


async def set_session_state(ep: ManagementEndpoint, body: dict, app: dict):
    session_id = _session_id(body) or ""
    state = body.get("session-state")
    if isinstance(state, str):
        state = state.encode("utf-8")
    if not state:  # an empty state is none, as on Service Bus: the Go SDK clears with b""
        state = None
    session_tools.check_state_size(ep.queue, state)
    if_match = body.get("if-match")  # busd's own (docs/wire.md §8.4.4)
    if if_match is not None and not isinstance(if_match, str):
        raise BusdError(Condition.ARGUMENT_ERROR, "if-match must be a string: an etag or *.")
    holder = ep.session_lease(app, session_id).holder
    if if_match is None and await staging.stage_request(
        ep.conn, StagedSessionState(ep.queue, session_id, holder, state)
    ):
        return 200, None
    if if_match is not None and staging.REQUEST_TXN.get() is not None:
        raise BusdError(
            Condition.NOT_IMPLEMENTED,
            "A conditional set-session-state cannot be part of a transaction.",
        )
    etag = await ep.broker.store.set_session_state(
        ep.queue, session_id, holder, state, if_match=if_match
    )
    return 200, None if if_match is None else {"etag": etag}


async def dead_letter_session(ep: ManagementEndpoint, body: dict, app: dict):
    """busd's own (docs/wire.md §8.4.12): every message of a session and its state to the
    dead-letter sub-queue, whoever holds the session."""
    moved = await session_tools.dead_letter(
        ep.broker.store,
        ep.entity,
        _session_id(body) or "",
        body.get("deadletter-reason"),
        body.get("deadletter-description"),
    )
    return 200, {"message-count": codec.Int(moved)}


async def resubmit_session(ep: ManagementEndpoint, body: dict, app: dict):
    """busd's own (docs/wire.md §8.4.12): a dead-lettered session's messages back, in order."""
    moved, left = await session_tools.resubmit(ep.broker.store, ep.entity, _session_id(body) or "")
    return 200, {"message-count": codec.Int(moved), "left-count": codec.Int(left)}


async def peek_message(ep: ManagementEndpoint, body: dict, app: dict):
    from_seq = int(body.get("from-sequence-number") or 1)
    count = int(body.get("message-count") or 1)
    messages = await ep.broker.store.peek(ep.entity, from_seq, count, ep.session_named(body, app))
    if not messages:
        return 204, None
    return 200, {"messages": [{"message": delivery_payload(m, state=True)} for m in messages]}


async def batch_delete_messages(ep: ManagementEndpoint, body: dict, app: dict):
    """Service Bus's batch delete (docs/wire.md §8.4.13): up to `message-count` messages
    enqueued before `enqueued-time-utc` (default now), oldest first, one session's when
    `session-id` is given; 204 when none was deleted."""
    count = body.get("message-count")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise BusdError(Condition.ARGUMENT_ERROR, "message-count must be an integer of 1 or more.")
    before = body.get("enqueued-time-utc")  # none: the store's now
    if before is not None and (isinstance(before, bool) or not isinstance(before, int)):
        raise BusdError(Condition.ARGUMENT_ERROR, "enqueued-time-utc must be a timestamp.")
    session_id = body.get("session-id")
    if session_id is not None and not isinstance(session_id, str):
        raise BusdError(Condition.ARGUMENT_ERROR, "session-id must be a string.")
    if ep.entity.partitions:
        raise BusdError(
            Condition.NOT_IMPLEMENTED,
            "Batch delete is not supported with partitioned entities, as in Service Bus.",
        )
    deleted = await ep.broker.store.delete_messages(
        ep.entity, min(count, BATCH_DELETE_MAX), None if before is None else int(before), session_id
    )
    if not deleted:
        return 204, None
    return 200, {"message-count": codec.Int(deleted)}


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
        holder = receiver.holder if receiver is not None else None
        if isinstance(receiver, SessionHolder) and receiver.lease is not None:
            if receiver.lease.session_id == session_id:
                receiver.lease.check_held()  # (its end here comes before the store's)
    if staging.REQUEST_TXN.get() is not None:
        for settlement in settlements:
            await staging.stage_request(ep.conn, StagedSettlement(ep.entity, settlement, holder))
        return 200, None
    for refused in await ep.broker.store.settle(ep.entity, settlements, holder):
        if refused is not None:
            raise refusal(refused)
    return 200, None


async def receive_by_sequence_number(ep: ManagementEndpoint, body: dict, app: dict):
    seqs = _ints(body.get("sequence-numbers"))
    mode = ReceiveMode(1 if int(body.get("receiver-settle-mode", 1)) else 0)
    session_id = ep.session_named(body, app)
    holder = None
    if session_id is not None:
        holder = ep.session_lease(app, session_id).holder
    tokens = new_tokens(len(seqs)) if mode == ReceiveMode.PEEK_LOCK else []
    messages = await ep.broker.store.receive_deferred(
        ep.entity, seqs, mode, tokens, session_id, holder
    )
    out = []
    for message in messages:
        # Only deferred messages are reached this way, and they say so (the SDK shows `state`).
        deferred = dataclasses.replace(message, state=MessageState.DEFERRED)
        item: dict[str, Any] = {"message": delivery_payload(deferred, state=True)}
        if message.lock_token is not None:
            item["lock-token"] = uuid.UUID(bytes=message.lock_token)
        out.append(item)
    return 200, {"messages": out}


async def schedule_message(ep: ManagementEndpoint, body: dict, app: dict):
    new: list[NewMessage] = []
    for item in body.get("messages") or []:
        payload = bytes(item.get("message") or b"")
        messages.check_size(ep.target, len(payload))
        session_id = item.get("session-id")
        new.append(
            messages.admit(
                ep.target,
                messages.parse_one(payload),
                str(session_id) if session_id is not None else None,
            )
        )
    if staging.REQUEST_TXN.get() is not None:  # numbered now, scheduled at the commit
        seqs = await staging.stage_scheduled(ep.conn, ep.target, new)
    else:
        seqs = await ep.broker.send(ep.target, new)
    return 200, {"sequence-numbers": codec.Array(codec.Long, [codec.Long(s) for s in seqs])}


async def cancel_scheduled_message(ep: ManagementEndpoint, body: dict, app: dict):
    seqs = _ints(body.get("sequence-numbers"))
    if staging.REQUEST_TXN.get() is not None:
        await staging.stage_cancels(ep.conn, ep.target, seqs)
        return 200, None
    await ep.broker.cancel_scheduled(ep.target, seqs)
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


# The right each operation needs (busd.auth.rights; Manage implies both others), as in
# Service Bus: what a receiver does needs Listen, what a sender does needs Send.
OPERATION_RIGHTS = {
    "renew-lock": LISTEN,
    "renew-session-lock": LISTEN,
    "get-session-state": LISTEN,
    "set-session-state": LISTEN,
    "peek-message": LISTEN,
    "update-disposition": LISTEN,
    "receive-by-sequence-number": LISTEN,
    "schedule-message": SEND,
    "cancel-scheduled-message": SEND,
    "get-message-sessions": LISTEN,
    "batch-delete-messages": LISTEN,  # what a receiver may do: its SDK method is a receiver's
    # busd's own: an operator's acts on a session, whoever holds it
    "com.busd:dead-letter-session": MANAGE,
    "com.busd:resubmit-session": MANAGE,
    **rule_management.OPERATION_RIGHTS,
}

# An operation: (the link it came on, the request body, its application properties) ->
# (status code, response body).
Operation = Callable[["ManagementEndpoint", dict, dict], Awaitable[Any]]

OPERATIONS: dict[str, Operation] = {
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
    "batch-delete-messages": batch_delete_messages,
    "com.busd:dead-letter-session": dead_letter_session,
    "com.busd:resubmit-session": resubmit_session,
    **rule_management.OPERATIONS,
}
