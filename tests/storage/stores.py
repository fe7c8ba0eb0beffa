"""Why a storage test marked `every_store` (tests/storage/conftest.py) cannot run on one of
the stores: the reasons `pytest.mark.not_on(store, reason=...)` gives, reported with each
test it skips."""

from __future__ import annotations

# A partitioned entity numbers each partition's messages from its own first number (the
# partition in the top 16 bits) and keeps order within a partition only, as Service Bus does.
NUMBERS = (
    "a partitioned entity numbers and orders messages per partition, not across partitions "
    "(docs/design.md §3.18): this test asserts one sequence over the whole entity"
)
# Each partition's renewal is its own script: a batch over several partitions is not one step.
SPLIT_RENEWAL = (
    "a lock renewal naming tokens of several partitions runs one script per partition, so an "
    "unknown token in one does not stop the renewal of another (not all-or-none)"
)
# A Cluster script reaches one slot, and a transaction over two entities spans two.
CROSS_SLOT = (
    "a transaction over several entities is one script over several hash tags: a Cluster "
    "refuses it, and the broker refuses such work (Store.cross_slot_transactions, "
    "docs/design.md §3.15)"
)
# The partitioned store forwards transaction calls as given: busd/broker/transactions.py
# hands it the handles of the partition the transaction lives in.
PARTITION_HANDLES = (
    "the broker stages and commits a transaction on the handles of one partition "
    "(busd/broker/transactions.py); the partitioned store passes the transaction calls on "
    "as given, so these tests, which name the whole entity, do not apply"
)
# A test that writes a former layout of a queue's keys itself, on the suite's one server.
OWN_KEYS = (
    "it writes a queue's keys as an earlier busd stored them, straight into the suite's one "
    "server (redis_url): what it checks is the scripts', the same on every store"
)
