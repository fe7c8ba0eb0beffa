"""A transaction's operation on a partitioned entity is placed in the partition the
partitioned store would send the same call to (busd.storage.staged.placed, docs/design.md
§3.18): by its lock token, session id, sequence number or message key, else in the
partition the transaction already works in."""

from __future__ import annotations

from busd.storage.messages import NewMessage, Outcome, Settlement
from busd.storage.partitioned.routing import first_seq, partition_of_key
from busd.storage.specs import QueueSpec
from busd.storage.staged import (
    StagedCancel,
    StagedSend,
    StagedSessionState,
    StagedSettlement,
    placed,
)

QUEUE = QueueSpec(name="orders", partitions=8)
OTHER = QueueSpec(name="invoices", partitions=8)


def test_an_operation_goes_to_the_partition_its_token_session_or_number_names():
    token = bytes(15) + bytes((5,))
    settle = StagedSettlement(QUEUE, Settlement(token, Outcome.COMPLETE))
    assert placed(settle, QUEUE, None) == QUEUE.partition_spec(5)
    state = StagedSessionState(QUEUE, "s-1", "holder", b"x")
    assert placed(state, QUEUE, None).partition == partition_of_key("s-1", 8)
    assert placed(StagedCancel(QUEUE, first_seq(3) + 7), QUEUE, None).partition == 3
    keyed = StagedSend(QUEUE, NewMessage(b"", session_id="s-2", message_id="m"))
    assert placed(keyed, QUEUE, None).partition == partition_of_key("s-2", 8)


def test_a_send_without_key_stays_in_the_transactions_partition():
    message = NewMessage(b"", message_id="m-1")
    own = partition_of_key("m-1", 8)
    via = QUEUE.partition_spec((own + 1) % 8)
    assert placed(StagedSend(QUEUE, message), QUEUE, via) == via
    # the transaction works in another entity: the message id's partition
    assert placed(StagedSend(QUEUE, message), QUEUE, OTHER.partition_spec(2)).partition == own
    assert placed(StagedSend(QUEUE, message), QUEUE, None).partition == own
