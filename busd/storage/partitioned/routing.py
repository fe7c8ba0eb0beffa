"""Which partition of a partitioned entity a message, a sequence number or a lock token
belongs to, the partitions' answers back in their items' order, and the stamping of a
partition into the lock tokens it hands out (docs/design.md §3.18). The same in every
process: nothing here is stored."""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeVar

from busd.storage.messages import LockTokens, NewMessage

T = TypeVar("T")
PARTITION_SHIFT = 48  # a sequence number's partition: its top 16 bits (of 64)


def partition_of_key(key: str, partitions: int) -> int:
    """The partition of a session id or partition key: the same in every process."""
    return zlib.crc32(key.encode("utf-8", "surrogatepass")) % partitions


def partition_of_seq(seq: int, partitions: int) -> int:
    return (seq >> PARTITION_SHIFT) % partitions


def partition_of_token(token: bytes, partitions: int) -> int:
    return token[15] % partitions if len(token) == 16 else 0


def first_seq(partition: int) -> int:
    """What a partition's counter starts at: its numbers are `partition << 48` + 1, + 2, ..."""
    return partition << PARTITION_SHIFT


def message_key(message: NewMessage) -> str | None:
    """What places a message: its session id, else partition key, else message id."""
    if message.session_id is not None:
        return message.session_id
    return message.partition_key if message.partition_key is not None else message.message_id


def by_message(
    messages: list[NewMessage], partitions: int | None, turn: Iterator[int]
) -> dict[int, list[int]]:
    """The indexes of the messages in each partition they go to (one without a key: the
    next of `turn`)."""
    groups: dict[int, list[int]] = {}
    count = partitions or 1
    for i, m in enumerate(messages):
        key = message_key(m)
        p = next(turn) if key is None else partition_of_key(key, count)
        groups.setdefault(p % count, []).append(i)
    return groups


def in_order(groups: dict[int, list[int]], answers: Iterable[Sequence[T]], size: int) -> list[T]:
    """The answers of the calls of each partition's items (`groups`: their indexes), one per
    item, in the items' order."""
    out: list[Any] = [None] * size
    for idx, answer in zip(groups.values(), answers):
        for i, value in zip(idx, answer, strict=True):
            out[i] = value
    return out


def stamped(tokens: Sequence[bytes], partition: int, start: int, count: int) -> LockTokens:
    """`count` of the tokens from `start`, each with the partition in its last byte."""
    if type(tokens) is LockTokens:
        raw = bytearray(tokens.packed[16 * start : 16 * (start + count)])
    else:
        raw = bytearray(b"".join(tokens[start : start + count]))
    raw[15::16] = bytes((partition,)) * (len(raw) // 16)
    out = LockTokens(0)
    out.packed = bytes(raw)
    return out
