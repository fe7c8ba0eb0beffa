"""Partitioned entities: one entity to the broker, several queues to the scripts
(docs/design.md §3.18).

A partitioned entity is P ordinary queues, each under a hash tag of its own (busd.storage.keys
`partition_scope`), so a Redis Cluster spreads them over its shards. `PartitionedStore` wraps
a Store and is one itself: it implements every method of the protocol (`wrap` is typed so that
mypy checks it), forwarding nothing unseen; a call on an entity without partitions goes
straight to the inner store. Each method is declared here once, in a line, by the route its
calls take (busd/storage/partitioned/routes.py). The calls no route fits are written by hand:
sending and publishing, receiving and accepting with this process's waiters (messages.py,
sessions.py), and the catalog record of a partitioned entity (below).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from typing import Any

from busd.storage.api import Store
from busd.storage.keys import FIRST_LAYOUT
from busd.storage.partitioned.messages import PartitionedMessageCalls
from busd.storage.partitioned.routes import (
    by_lock_token,
    by_sequence,
    by_session,
    in_turn,
    over_all,
    whole,
)
from busd.storage.partitioned.routing import first_seq
from busd.storage.partitioned.sessions import PartitionedSessionCalls
from busd.storage.specs import QueueSpec, TopicSpec


def _together(answers: list[Any]) -> Any:
    """The partitions' counts, sweep results or totals as one: numbers and totals added,
    lists joined, the oldest message the oldest of theirs."""
    if isinstance(answers[0], dict):
        total: Counter[str] = Counter()
        for totals in answers:
            total.update(totals)  # added, zeros kept
        return dict(total)
    out = type(answers[0])()
    for field in dataclasses.fields(out):
        values = [getattr(a, field.name) for a in answers]
        if field.name == "totals":
            merged = _together(values)
        elif field.name == "oldest_enqueued_ms":
            merged = min((v for v in values if v is not None), default=None)
        else:
            merged = sum(values[1:], values[0])
        setattr(out, field.name, merged)
    return out


class PartitionedStore(PartitionedMessageCalls, PartitionedSessionCalls):
    """A Store whose partitioned entities are spread over partitions (module docstring)."""

    # --- not the partitions' concern: the inner store's -------------------------------------
    connect = whole(Store.connect)
    close = whole(Store.close)
    ping = whole(Store.ping)
    shards = whole(Store.shards)  # the inner store places each partition of an entity itself
    catalog_all = whole(Store.catalog_all)
    catalog_get = whole(Store.catalog_get)
    catalog_delete = whole(Store.catalog_delete)
    catalog_subscribe = whole(Store.catalog_subscribe)
    namespace_add = whole(Store.namespace_add)
    namespace_known = whole(Store.namespace_known)
    namespace_record = whole(Store.namespace_record)
    fault_hit = whole(Store.fault_hit)
    fault_forget = whole(Store.fault_forget)
    # a transaction works in one partition, whose handles its operations hold already
    # (busd.storage.staged.placed)
    reserve_sequence_numbers = whole(Store.reserve_sequence_numbers)
    stage_transaction = whole(Store.stage_transaction)
    commit_transaction = whole(Store.commit_transaction)
    discard_transaction = whole(Store.discard_transaction)

    # --- a session lives in one partition ----------------------------------------------------
    renew_session_lock = by_session(Store.renew_session_lock)
    release_session = by_session(Store.release_session)
    get_session_state = by_session(Store.get_session_state)
    read_session_state = by_session(Store.read_session_state)
    set_session_state = by_session(Store.set_session_state)
    dead_letter_session = by_session(Store.dead_letter_session)
    resubmit_session = by_session(Store.resubmit_session)
    drop_session_lock = by_session(Store.drop_session_lock)
    lose_session_lock = by_session(Store.lose_session_lock)

    # --- a lock token or a sequence number carries its partition -----------------------------
    renew_message_locks = by_lock_token(Store.renew_message_locks)
    forward = by_lock_token(Store.forward, "messages", at_once=False)
    cancel_scheduled = by_sequence(Store.cancel_scheduled, at_once=True)
    cancel_topic_scheduled = by_sequence(Store.cancel_topic_scheduled, fan_out=True)
    receive_deferred = by_sequence(Store.receive_deferred, joined=True)

    # --- the whole entity: every partition, answers together --------------------------------
    sweep = over_all(Store.sweep, _together)
    counts = over_all(Store.counts, _together)
    topic_totals = over_all(Store.topic_totals, _together)
    purge = over_all(Store.purge)
    size_in_bytes = over_all(Store.size_in_bytes)
    drop_queue = over_all(Store.drop_queue)
    release_process_locks = over_all(Store.release_process_locks)
    release_process_message_locks = over_all(Store.release_process_message_locks)
    sweep_transactions = over_all(Store.sweep_transactions)
    open_subscriptions = over_all(Store.open_subscriptions, lambda _: None)
    drop_subscriptions = over_all(Store.drop_subscriptions, fan_out=True)

    # --- partition after partition, until the count is met -----------------------------------
    resubmit_dead_letters = in_turn(Store.resubmit_dead_letters, "limit", counted=True)
    # the broker refuses a batch delete on a partitioned entity, as Service Bus does
    # (docs/wire.md §8.4.13): the operator's, oldest first within each partition
    delete_messages = in_turn(Store.delete_messages, "count", counted=True)
    # each partition under its own forwarding lease, from a rotating one so that a busy one
    # does not keep the others waiting; not to a partitioned entity (busd.broker.catalog)
    take_forwarding = in_turn(Store.take_forwarding, "count", rotate=True)

    schedule = PartitionedMessageCalls.send  # a send whose messages carry their time

    # --- the catalog -------------------------------------------------------------------------
    async def catalog_put(
        self, kind: str, path: str, record: dict, *, only_new: bool = False
    ) -> bool:
        partitions = record.get("partitions")
        if partitions and kind in ("queue", "topic"):
            # before the record: no message may be numbered from a counter not yet started
            layout = record.get("partition_layout", FIRST_LAYOUT)  # as entities.records reads
            make = QueueSpec if kind == "queue" else TopicSpec
            spec = make(name=path, partitions=partitions, partition_layout=layout)
            await asyncio.gather(
                *(
                    self.inner.start_sequence(part, first_seq(part.partition or 0))
                    for part in spec.partition_specs[1:]
                )
            )
        return bool(await self.inner.catalog_put(kind, path, record, only_new=only_new))


def wrap(store: Any) -> Store:
    """The store the broker uses: `store` with partitioned entities routed. A Store itself:
    mypy checks that it implements the whole protocol."""
    return PartitionedStore(store)
