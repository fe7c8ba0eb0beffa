"""Which endpoint takes an attached link: by address and role (docs/wire.md §2.3).

The one place that knows every endpoint kind: the connection asks here, and the endpoints know
nothing of each other. A new entity kind adds its endpoints here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proton import Link

from busd.amqp.addresses import Address, parse_address
from busd.auth.rights import LISTEN, SEND
from busd.broker.links import cbs, coordinator, management, nodes, receiving, sending, sessions
from busd.broker.links.base import ConnectionScope, LinkEndpoint
from busd.broker.links.unknown_entities import UNKNOWN_ENTITIES
from busd.errors import BusdError, Condition
from busd.storage.specs import QueueSpec, TopicSpec


@dataclass(frozen=True, slots=True)
class Attach:
    """What the client's attach says, each field decoded once (proton decodes on every read)."""

    source_address: str | None
    target_address: str | None
    properties: dict[Any, Any]
    source_filter: dict[Any, Any] | None  # the source's filter map (docs/wire.md §6.5)


def make_endpoint(conn: ConnectionScope, link: Link, attach: Attach) -> LinkEndpoint:
    """The endpoint for `link`, or the BusdError to refuse it with (docs/wire.md §4.3)."""
    if coordinator.is_coordinator(link):  # needs no token of its own (docs/wire.md §10.2)
        return coordinator.CoordinatorEndpoint(conn, link)
    parsed = parse_address(attach.source_address if link.is_sender else attach.target_address)
    if parsed.sub == "cbs":
        return nodes.ReplyEndpoint(conn, link) if link.is_sender else cbs.CbsEndpoint(conn, link)
    # The token first: without one, an entity that exists and one that does not get the same
    # answer (no enumeration of names). `$management` checks each operation's right itself.
    right = None if parsed.sub == "management" else LISTEN if link.is_sender else SEND
    # A token for the entity covers its `$management` node; so does one for the node alone,
    # which is what the JavaScript SDK puts (audience `<endpoint>/<entity>/$management`).
    path = parsed.entity_path + ("/$management" if parsed.sub == "management" else "")
    conn.authorize(path, right)
    endpoint = _endpoint(conn, link, parsed, attach)
    endpoint.needs = (path, right)
    return endpoint


def _endpoint(conn: ConnectionScope, link: Link, parsed: Address, attach: Attach) -> LinkEndpoint:
    broker = conn.broker
    if parsed.is_subscription:
        path = f"{parsed.entity}/subscriptions/{parsed.subscription}"
        entity = broker.spec(path)
        track = path
    else:
        entity = broker.queue(parsed.entity) if parsed.entity else None
        topic = broker.topic(parsed.entity) if parsed.entity and entity is None else None
        track = parsed.entity
        if topic is not None:
            conn.transactions.check_entity_link(link, parsed.entity)
            for_topic = _topic_endpoint(conn, link, parsed, topic)
            broker.track(track, for_topic)
            return for_topic
    if entity is None:
        UNKNOWN_ENTITIES.note(
            parsed.entity_path,
            conn.proto.peer,
            conn.remote_container,
            "a link's attach",
        )
        raise BusdError(
            Condition.NOT_FOUND,
            f"The messaging entity '{parsed.entity_path}' could not be found.",
        )
    # a topic and its subscriptions are one top-level entity (docs/wire.md §10.6)
    conn.transactions.check_entity_link(link, parsed.entity)
    endpoint: LinkEndpoint
    if parsed.sub == "management":
        if link.is_sender:
            return nodes.ReplyEndpoint(conn, link)
        endpoint = management.ManagementEndpoint(conn, link, entity, dlq=parsed.dlq)
    elif link.is_sender:  # we send: the client receives
        endpoint = _receiver(conn, link, entity, attach, dlq=parsed.dlq)
    elif parsed.dlq:
        raise BusdError(Condition.NOT_ALLOWED, "Messages cannot be sent to a dead-letter queue.")
    elif parsed.is_subscription:
        raise BusdError(
            Condition.NOT_ALLOWED,
            f"Messages cannot be sent to the subscription '{entity.name}': send them to its topic.",
        )
    else:
        endpoint = sending.QueueSenderEndpoint(conn, link, entity)
    broker.track(track, endpoint)
    return endpoint


def _topic_endpoint(
    conn: ConnectionScope, link: Link, parsed: Address, topic: TopicSpec
) -> LinkEndpoint:
    """A topic takes senders and its `$management` node (schedule-message and its cancel);
    messages are received from its subscriptions (`<topic>/Subscriptions/<name>`)."""
    if parsed.sub == "management" and not parsed.dlq:
        if link.is_sender:
            return nodes.ReplyEndpoint(conn, link)
        return management.ManagementEndpoint(conn, link, topic, dlq=False)
    if link.is_sender or parsed.dlq:
        raise BusdError(
            Condition.NOT_ALLOWED,
            f"'{topic.name}' is a topic: receive from one of its subscriptions, "
            f"'{topic.name}/Subscriptions/<name>'.",
        )
    return sending.QueueSenderEndpoint(conn, link, topic)


def _receiver(
    conn: ConnectionScope, link: Link, queue: QueueSpec, attach: Attach, *, dlq: bool
) -> LinkEndpoint:
    if dlq:
        return receiving.QueueReceiverEndpoint(conn, link, queue.dead_letter_queue)
    has_filter, session_id, descriptor = _session_filter(attach.source_filter)
    if queue.requires_session and not has_filter:
        raise BusdError(
            Condition.NOT_ALLOWED,
            f"'{queue.name}' requires sessions: a non-session receiver cannot be created on it.",
        )
    if not queue.requires_session and has_filter:
        raise BusdError(
            Condition.NOT_ALLOWED,
            f"'{queue.name}' does not require sessions: a session receiver cannot be created.",
        )
    if has_filter:
        timeout_ms = attach.properties.get(sessions.TIMEOUT_PROPERTY)
        return sessions.SessionReceiverEndpoint(
            conn, link, queue, session_id, timeout_ms, filter_descriptor=descriptor
        )
    return receiving.QueueReceiverEndpoint(conn, link, queue)


def _session_filter(filters: dict[Any, Any] | None) -> tuple[bool, str | None, Any]:
    """Whether the source's filter map asks for a session (docs/wire.md §6.5), which (None:
    the next available), and the descriptor of a described filter (None: a plain value), which
    the answer's filter carries back; BusdError when the id is not a string."""
    if not isinstance(filters, dict) or sessions.SESSION_FILTER not in filters:
        return False, None, None
    value = filters[sessions.SESSION_FILTER]
    descriptor = None
    if hasattr(value, "value"):  # a described filter wrapping the id
        descriptor, value = getattr(value, "descriptor", None), value.value
    if value is None or isinstance(value, str):
        return True, (str(value) if value is not None else None), descriptor
    if isinstance(value, (bytes, memoryview)):
        try:
            return True, bytes(value).decode("utf-8"), descriptor
        except UnicodeDecodeError:
            pass
    # A session id is a string: an int (the Python SDK sends session_id=1 as int32) is not
    # taken for one, as Service Bus refuses it too (docs/wire.md §6.5).
    raise BusdError(
        Condition.INVALID_FIELD, "The session filter must be a string (the session id) or null."
    )
