"""The semantic store interface the broker talks to.

The broker never sees Redis: it calls these methods, each of which is one atomic Lua script
(sometimes a few batched in one pipeline). The store is stateless on the Python side; every
call carries the `QueueSpec` it needs, so any number of broker processes can share one store.

Times are integer milliseconds since the Unix epoch, taken from the store server's clock
(`TIME` inside the scripts) so that every broker process agrees on them.

Lock tokens are 16 random bytes chosen by the caller (RFC 4122 byte order, i.e. what
`uuid.UUID(bytes=token)` reads); the delivery tag on the wire is the .NET layout of the same
GUID, a concern of the AMQP front only.

Failures are raised as `busd.errors.BusdError` with the condition a client should hear, except
where a method documents a per-item result (settlement answers each delivery). The scripts'
status codes stay inside the adapter.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from busd.errors import Condition
from busd.storage.counts import EntityCounts, SweepResult
from busd.storage.forwarding import ForwardDestination, ForwardedMessage, ForwardResult
from busd.storage.messages import (
    HandOver,
    NewMessage,
    Placement,
    Received,
    ReceiveMode,
    Sent,
    Settlement,
    StoredMessage,
)
from busd.storage.sessions import SessionLock, SessionPage
from busd.storage.specs import QueueSpec, TopicSpec
from busd.storage.staged import StagedOperation


class StoreUnavailable(Exception):
    """The store could not be had (down, failing over, the connection lost or silent), or
    could not confirm a write as durable as --durability asks: the call may or may not have
    run. Clients are answered com.microsoft:server-busy, which the SDKs retry
    (docs/design.md §2.11)."""


class WakeCallback(Protocol):
    """Called with the id of a waiter or lock holder of this process that may have work now
    (or with WAKE_ALL: wake-ups may have been missed, everyone should look again), and with
    the messages a send of another process handed over to it, locked for it under its
    standing offer (docs/design.md §3.5), when the wake-up carried them."""

    def __call__(self, waiter: str, booked: Sequence[StoredMessage] = (), /) -> None: ...


WAKE_ALL = "*"
# Called with the `<kind>:<path>` of a catalog record that changed (created, updated or
# deleted, by any process), or with None: changes may have been missed (the subscription was
# made or made again), reload everything.
CatalogCallback = Callable[[str | None], None]


class Store(Protocol):
    # --- lifecycle -----------------------------------------------------------------------
    async def connect(self) -> None:
        """Open connections, load scripts, check the server (version, maxmemory-policy)."""

    async def close(self) -> None: ...

    async def ping(self) -> bool: ...

    process_id: str
    """Names this process. The ids of its waiters and lock holders start `<process_id>:`, so
    that a wake-up for one of them reaches this process only."""

    async def subscribe(self, on_wake: WakeCallback) -> None:
        """Start listening for this process's wake-ups: `on_wake(id)` is called with the id of
        a waiter or holder that may have work (from a send, abandon, release, lock expiry,
        scheduled message due, session released, on any process). A message that becomes
        available wakes only who can take it: the holder of its session; else, for a session
        that became free, the oldest waiting next-available receiver; else the oldest waiting
        receiver of its entity. Each wake-up reaches one waiter, once."""

    # --- the entity catalog ---------------------------------------------------------------
    # Records of entities (queues, topics, subscriptions, rules) as JSON-able dicts, each under
    # (kind, path); the broker gives them meaning (busd.broker.catalog). Paths are lower-case:
    # `q`, `t`, `t/subscriptions/s`, `t/subscriptions/s/rules/r`. Every change is announced to
    # every process (catalog_subscribe).
    async def catalog_all(self) -> dict[str, dict]:
        """Every record, by `<kind>:<path>`."""

    async def catalog_get(self, kind: str, path: str) -> dict | None: ...

    async def catalog_put(
        self, kind: str, path: str, record: dict, *, only_new: bool = False
    ) -> bool:
        """Write a record; with `only_new`, only when there is none (returns False then)."""

    async def catalog_delete(self, items: list[tuple[str, str]]) -> int:
        """Delete records (kind, path) in one step; returns how many existed."""

    async def catalog_subscribe(self, on_change: CatalogCallback) -> None:
        """Start listening for catalog changes (see CatalogCallback)."""

    async def namespace_add(self, name: str) -> None:
        """Record that the namespace `name` (other than the default) was made: in the default
        namespace's store, so that every process knows it exists (docs/design.md §3.17)."""

    async def namespace_known(self, name: str) -> bool:
        """Whether the namespace `name` was ever made (`namespace_add`)."""

    async def namespace_record(self, name: str, kind: str, path: str) -> dict | None:
        """A record of the catalog of the namespace `name` (other than the default), read
        over the default namespace's store: a token for one of its entities is checked with
        the entity's own keys before the namespace is made (busd.broker.namespaces)."""

    async def open_subscriptions(self, topic: TopicSpec | str, subscriptions: list[str]) -> None:
        """Mark subscriptions of a topic live: fan-out stores copies only in live ones (in
        each partition of a partitioned topic). Done before a subscription's record is
        written. A topic's name stands for an unpartitioned topic."""

    async def drop_queue(self, queue: QueueSpec) -> int:
        """Delete everything of a queue: messages (and dead letters), sessions, state, ids,
        totals. Done after its record is deleted. Returns how many messages went."""

    async def drop_subscriptions(
        self, topic: TopicSpec | str, subscriptions: list[QueueSpec], *, with_topic: bool = False
    ) -> int:
        """The same for subscriptions of a topic (no longer live), and with `with_topic` the
        topic's own keys too. Returns how many messages went."""

    async def shards(self, entities: Sequence[QueueSpec | TopicSpec]) -> list[list[str]]:
        """Where each entity's keys are: the address (`host:port`) of the server (on a
        Cluster, the shard's primary) holding each of its partitions, in order (one item for
        an entity without partitions). Asks the server for its slot map once per call."""

    # --- send ------------------------------------------------------------------------------
    async def send(self, queue: QueueSpec, messages: list[NewMessage]) -> list[int]:
        """Enqueue atomically (all or none). Returns the sequence number of each message, 0 for a
        duplicate dropped by duplicate detection. Scheduled messages get their number now."""

    async def send_handing_over(
        self, queue: QueueSpec, messages: list[NewMessage], offers: Sequence[HandOver]
    ) -> Sent:
        """`send`, with offers: a message an offer takes is locked for its holder in the same
        step and returned in `Sent.handed` instead of being filed available (a store may take
        none)."""

    async def publish(
        self,
        topic: TopicSpec,
        subscriptions: list[QueueSpec],
        messages: list[NewMessage],
        placements: list[list[Placement]] | None = None,
    ) -> list[int]:
        """Send to a topic: store each message, atomically (all or none), in its
        subscriptions. Without `placements` every live subscription gets every message
        unchanged; with them, message i goes where placements[i] says (none: dropped). The
        topic numbers each message once (0 for a duplicate dropped by the topic's duplicate
        detection) and every copy keeps that number; scheduled messages are scheduled in each
        subscription under it."""

    async def cancel_topic_scheduled(
        self, topic: TopicSpec, subscriptions: list[QueueSpec], seqs: list[int]
    ) -> None:
        """Cancel messages scheduled on a topic (every subscription's copy). Raises
        MESSAGE_NOT_FOUND if a number has no scheduled copy; then nothing changes."""

    async def topic_totals(self, topic: TopicSpec) -> dict[str, int]:
        """The topic's monotonic totals: sent, duplicates, dropped (no subscription took it)."""

    # --- non-session receive ----------------------------------------------------------------
    async def receive(
        self,
        entity: QueueSpec,
        count: int,
        mode: ReceiveMode,
        tokens: Sequence[bytes],
        waiter: str | None = None,
    ) -> list[StoredMessage]:
        """Take up to `count` available messages in sequence order. Peek-lock: lock each for
        LockDuration under tokens[i]. Receive-and-delete: delete them. Expired messages met on
        the way are expired (dropped or dead-lettered), not returned. With `waiter`, a call
        that gets fewer than `count` registers it, atomically, to be woken by the next message
        that becomes available (see `subscribe`)."""

    # --- sessions --------------------------------------------------------------------------
    async def accept_session(
        self,
        queue: QueueSpec,
        session_id: str | None,
        holder: str,
        *,
        wait: bool = False,
        count: int = 0,
        mode: ReceiveMode = ReceiveMode.PEEK_LOCK,
        tokens: Sequence[bytes] = (),
        client: str = "",
        waiting: bool = True,
        release: tuple[str, str] | None = None,
        waiter: str | None = None,
    ) -> SessionLock | None:
        """Lock a specific session (it may have no messages) or, with session_id None, the next
        session that has available messages and no holder. Returns None when no session is
        available (next-available only); with `wait`, the holder is then registered, in the
        same step, to be woken when a session becomes free. Raises SESSION_CANNOT_BE_LOCKED
        when held by someone else. Session-wide TTL expiry is applied first. Once locked, up
        to `count` of its messages are taken in the same step, as `receive_session` would
        (peek-lock: one token each), and returned in the lock's `messages`. `client`, the
        holder's connection ('<container id>\0<address>'), is kept for the inspector.
        `waiting` False tells that no earlier call registered the holder as a waiter, which
        spares taking it off the waiters once it locks a session. `release` (session id, its
        holder): release that lock first, as `release_session` does, in the same step
        (release-and-accept-next: one store call where a receiver lets its session go as
        another link of its connection asks for the next). `waiter`, with `wait`: the id
        registered instead of the holder's (`<process id>:...`, woken on its channel)."""

    async def receive_session(
        self,
        queue: QueueSpec,
        session_id: str,
        holder: str,
        count: int,
        mode: ReceiveMode,
        tokens: Sequence[bytes],
        *,
        stand: bool = False,
        replace: bool = False,
        recover: bool = False,
    ) -> Received:
        """Take up to `count` available messages of a session the holder has locked, in order.
        Raises SESSION_LOCK_LOST when the holder does not hold a live lock. Peek-lock only:
        `replace`, end the holder's standing offer that an earlier receive may have left, and
        tell the session's messages in flight before it (`in_flight`); `stand`, the same, and
        finding fewer than `count` leave a new one, under which sends of any process hand the
        session's next messages over to it, delivered by its wake-ups (docs/design.md §3.5);
        `recover`,
        the holder may have missed such wake-ups: the session's messages in flight under its
        lock come first, delivered or not."""

    async def renew_session_lock(self, queue: QueueSpec, session_id: str, holder: str) -> int:
        """Extend the lock by LockDuration from now; returns the new locked-until."""

    async def release_session(
        self, queue: QueueSpec, session_id: str, holder: str, *, offered: bool = True
    ) -> None:
        """Receiver closed: unlock the session; its unsettled messages become available again
        with no delivery-count increment. No-op when the holder does not hold it. `offered`
        False: the holder never left a standing offer (`receive_session`'s `stand`), so the
        release spares looking for one."""

    async def release_process_locks(self, queue: QueueSpec, id_prefix: str) -> int:
        """A broker process is gone: every session lock whose holder id starts with `id_prefix`
        (`<process id>:` for one process, see `process_id`) ends now on the queue as an
        expired one does (unsettled messages available again, count + 1), and its waiters are
        dropped. The number of locks ended."""

    async def release_process_message_locks(self, queue: QueueSpec, tag: bytes) -> int:
        """A worker is gone: every message lock on the queue and its dead-letter sub-queue
        whose token carries the worker's `tag` (busd.storage.messages.token_tag) ends now as
        an expired one does (available again, count + 1). The number of locks ended."""

    async def get_session_state(
        self, queue: QueueSpec, session_id: str, holder: str
    ) -> bytes | None: ...

    async def read_session_state(
        self, queue: QueueSpec, session_id: str, holder: str
    ) -> tuple[bytes | None, str | None]:
        """(state, its etag); (None, None) when the session has none. `holder` "" is an
        operator's read (no lock needed); else SESSION_LOCK_LOST without a live lock."""

    async def set_session_state(
        self,
        queue: QueueSpec,
        session_id: str,
        holder: str,
        state: bytes | None,
        *,
        if_match: str | None = None,
        if_absent: bool = False,
    ) -> str | None:
        """None clears the state. Returns the etag of the state written (None when cleared).
        `holder` "" is an operator's write (no lock needed). `if_match` (an etag, or "*" for
        any) writes only when the session has a state with that etag, `if_absent` only when
        it has none: else PRECONDITION_FAILED, nothing changed (docs/design.md §2.7)."""

    async def dead_letter_session(
        self, queue: QueueSpec, session_id: str, reason: str, description: str | None
    ) -> int:
        """Move every message of the session (available, locked, deferred, scheduled) and its
        state to the dead-letter sub-queue at once, in sequence order (docs/design.md §2.9).
        Returns how many messages moved (0: it had none)."""

    async def resubmit_session(self, queue: QueueSpec, session_id: str) -> tuple[int, int]:
        """Move the session's dead letters (not those a dead-letter receiver holds locked)
        back into it under their own sequence numbers, and its dead-lettered state unless it
        has one by now. Returns (moved, left locked in the sub-queue)."""

    async def list_sessions(
        self, queue: QueueSpec, skip: int, top: int, updated_after_ms: int | None
    ) -> list[str]:
        """Session ids in a stable order. updated_after_ms None: sessions with messages or state;
        else only sessions whose state was set after that time."""

    async def session_page(
        self,
        queue: QueueSpec,
        sort: str,
        after: str | None,
        top: int,
        preview: int = 32,
    ) -> SessionPage:
        """One page of the session inspector: the sessions of the `sort` index
        (SESSION_SORTS) after the cursor `after` (None: the first page); the store's work
        does not grow with the number of sessions."""

    async def drop_session_lock(self, queue: QueueSpec, session_id: str) -> bool:
        """An operator drops a session's lock, whoever holds it, as if its receiver had
        closed: the holder's next settle gets SESSION_LOCK_LOST. False when not held."""

    async def lose_session_lock(self, queue: QueueSpec, session_id: str) -> bool:
        """A fault on demand ends a session's lock, whoever holds it, as its expiry does: the
        holder's next settle or renewal gets SESSION_LOCK_LOST, its delivered messages come back
        with a counted failed attempt, the next acceptor takes the session. False when not
        held."""

    async def fault_hit(self, fault_id: str) -> int:
        """Count one hit of a fault on demand with a count, for every process together: the
        hits so far, this one included (busd.broker.faults)."""

    async def fault_forget(self, fault_id: str) -> None:
        """Drop a fault's count of hits (the fault's record is gone)."""

    # --- settlement and locks ------------------------------------------------------------
    async def settle(
        self, entity: QueueSpec, settlements: list[Settlement], holder: str | None = None
    ) -> list[Condition | None]:
        """Apply each settlement; per item None when applied, else the condition of its
        refusal (MESSAGE_LOCK_LOST, SESSION_LOCK_LOST). A refused item changes nothing."""

    async def renew_message_locks(
        self, entity: QueueSpec, tokens: list[bytes], until_ms: int | None = None
    ) -> list[int]:
        """New locked-until per token (LockDuration from now; with `until_ms`, that time
        unless the lock already runs longer: a transaction holds what it settled); raises
        MESSAGE_LOCK_LOST if any token is not locked."""

    # --- lifecycle operations (defer, schedule, peek) -------------------------------------
    async def peek(
        self, entity: QueueSpec, from_seq: int, count: int, session_id: str | None = None
    ) -> list[StoredMessage]:
        """Messages with seq >= from_seq in any state, without locking."""

    async def receive_deferred(
        self,
        entity: QueueSpec,
        seqs: list[int],
        mode: ReceiveMode,
        tokens: Sequence[bytes],
        session_id: str | None = None,
        holder: str | None = None,
    ) -> list[StoredMessage]:
        """Fetch deferred messages by sequence number. Raises MESSAGE_NOT_FOUND if any is not a
        deferred message (of that session)."""

    async def schedule(self, queue: QueueSpec, messages: list[NewMessage]) -> list[int]:
        """Like send; each message has scheduled_ms set."""

    async def cancel_scheduled(self, queue: QueueSpec, seqs: list[int]) -> None:
        """Raises MESSAGE_NOT_FOUND if any is not (or no longer) scheduled; then nothing changes."""

    async def stop_waiting(self, queue: QueueSpec, waiters: str, waiter: str) -> bool:
        """A waiter goes away: take it off the waiters ('s' next-available session receivers,
        'q' the queue's receivers, 'd' the dead-letter queue's). Returns whether it was waiting;
        when it was not, a wake-up may have been spent on it and is passed to another waiter
        if there is work."""

    # --- auto-forwarding (docs/design.md §3.16) ---------------------------------------------
    async def take_forwarding(
        self, entity: QueueSpec, forwarder: str, count: int, tokens: Sequence[bytes]
    ) -> list[StoredMessage] | None:
        """A forwarder takes up to `count` available messages of `entity` (peek-lock, each
        for the entity's LockDuration under tokens[i]: pass the forwarder's lock duration),
        holding the entity's forwarding lease until a call takes nothing. None when another
        forwarder holds the lease. Taking nothing, or None, registers `forwarder` as a waiter
        of the entity in the same step."""

    async def forward(
        self,
        entity: QueueSpec,
        destination: ForwardDestination,
        messages: list[ForwardedMessage],
        *,
        hop_limit: int,
    ) -> list[ForwardResult]:
        """Move taken messages to the destination, each as a new message there, never lost
        nor duplicated: in one script on a single server; on a Redis Cluster, where one script
        reaches one entity's slot, by an enqueue at the destination that a repeat makes a
        no-op, then the removal at the source. A message with `hop_limit`
        hops already, or whose destination does not exist, stays at the source
        (dead-lettered; in a dead-letter sub-queue, deferred)."""

    # --- housekeeping ---------------------------------------------------------------------
    async def sweep(self, queue: QueueSpec) -> SweepResult:
        """Idempotent, safe on every process at once: expired message locks (delivery count
        + 1, DLQ at MaxDeliveryCount), expired session locks (their in-flight messages + 1),
        TTL expiry (session-wide), scheduled messages that came due. It also keeps wake-ups
        whole: marks this process live, drops the waiters of processes that stopped sweeping,
        and wakes waiters where work and waiters meet (a wake-up that was lost)."""

    async def purge(self, entity: QueueSpec) -> int:
        """Delete every message of the entity; returns how many."""

    async def delete_messages(
        self, entity: QueueSpec, count: int, before_ms: int | None, session_id: str | None = None
    ) -> int:
        """Delete up to `count` available or deferred messages enqueued before `before_ms`
        (None: the store's now),
        oldest first (not locked or scheduled ones, nor those of a session another receiver
        holds unless `session_id` names it); only `session_id`'s when given. Returns how many
        (Service Bus's batch delete; lua/deleteMessages.lua)."""

    async def resubmit_dead_letters(self, queue: QueueSpec, limit: int) -> int:
        """Move up to `limit` dead-lettered messages (oldest first; not those a dead-letter
        receiver holds locked) back into the queue as new messages: new sequence number,
        delivery count 0, no dead-letter reason, the queue's default time to live from now.
        On a session queue whole sessions move, oldest first, each as `resubmit_session`
        moves it, until `limit` messages have: the last may take the count past `limit`.
        Returns how many moved; fewer than `limit` when none is left."""

    async def counts(self, entity: QueueSpec) -> EntityCounts: ...

    async def size_in_bytes(self, entity: QueueSpec) -> int:
        """The bytes of the messages a queue or subscription holds, dead letters included
        (the management API's SizeInBytes): exact for a few dozen messages, past that an
        estimate from a bounded sample (lua/sizeEntity.lua), so its cost does not grow with
        the entity."""
        ...

    # --- transactions (docs/design.md §3.15) ----------------------------------------------
    cross_slot_transactions: bool
    """Whether one transaction may touch several queues (not on a Redis Cluster, where one
    script reaches one queue's slot only)."""

    async def stage_transaction(
        self,
        via: QueueSpec | TopicSpec,
        txn_id: bytes,
        operations: list[StagedOperation],
        *,
        first: bool,
        timeout_ms: int,
        limit: int,
    ) -> tuple[int, int]:
        """Keep operations of a transaction in the store, under its via entity, until it is
        discharged. `first`: the caller staged nothing for it before; the transaction then
        times out `timeout_ms` from now. Returns how many operations it holds and the time
        (ms, the store's clock) it times out. Raises
        TRANSACTION_TIMEOUT past its time (or once the sweep dropped it), RESOURCE_LIMIT when
        it would hold more than `limit`; either way nothing is staged."""

    async def commit_transaction(
        self,
        via: QueueSpec | TopicSpec,
        others: list[QueueSpec],
        txn_id: bytes,
        topics: Sequence[tuple[TopicSpec, list[QueueSpec]]] = (),
    ) -> None:
        """Apply every staged operation of the transaction atomically (`others`: the
        queue-like entities other than `via` it touches; `topics`: each topic it sends to or
        cancels on, with its subscriptions now), or none: raises MESSAGE_LOCK_LOST,
        SESSION_LOCK_LOST, MESSAGE_NOT_FOUND when an operation cannot apply,
        TRANSACTION_TIMEOUT past its time.
        Its staged state is gone afterwards either way."""

    async def reserve_sequence_numbers(self, queue: QueueSpec | TopicSpec, count: int) -> list[int]:
        """`count` sequence numbers of the queue (or topic) no message has, for
        StagedSend.seq (StagedPublish.seq)."""

    async def discard_transaction(self, via: QueueSpec | TopicSpec, txn_id: bytes) -> None:
        """Drop the transaction's staged state (rollback)."""

    async def sweep_transactions(self, queue: QueueSpec | TopicSpec) -> int:
        """Drop the staged state of transactions with `queue` as via entity that are past
        their time; returns how many."""
