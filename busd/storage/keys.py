"""The one place Redis key names are built.

Every key of a queue carries the same hash tag, `{<prefix>:<queue>}`, so that the queue, its
dead-letter sub-queue and its sessions live in one Redis Cluster slot and a script can move a
message between them atomically. A key name is `{<prefix>:<queue>}:<name>` where `<name>` is
the logical name a script's header gives it (`q.ready`, `d.body`, `sfree`, ...): `q.` keys
belong to the queue itself, `d.` keys to its dead-letter sub-queue, the rest to the whole queue.

Assumptions: the prefix and queue names contain no `{` or `}` (queue names are letters, digits,
`-._/`), and session ids contain no NUL byte (session members of the lexicographic indexes are
`<session id>\\0<16-digit sequence number>`).
"""

from __future__ import annotations

# Logical key names and what each holds. Scripts refer to keys only through these names (in
# their headers); the loader turns a header's list into KEYS.
KEY_DOC: dict[str, str] = {
    # queue-wide
    "seq": "string: last sequence number given out (queue and dead-letter queue share it)",
    "dedup": "zset: message-id -> ms first seen (duplicate detection)",
    "sfree": "zset: session id -> seq of its oldest available message; sessions with "
    "available messages and no holder (next-available acceptance picks the lowest)",
    "sholder": "hash: session id -> holder of its lock",
    "slocks": "zset: session id -> ms its lock ends",
    "sstate": "hash: session id -> session state",
    "supdated": "zset: session id -> ms its state was last set",
    "sessions": "zset (all scores 0, lexicographic): sessions with messages or state",
    "swaiters": "zset: waiter id -> ms it began waiting; next-available session receivers "
    "waiting for a free session (a session that becomes free wakes the oldest one)",
    "procs": "zset: broker process id -> ms its liveness ends (refreshed by each process's "
    "sweep); the waiters of a process past its end are dropped",
    # per entity: `q.` the queue, `d.` its dead-letter sub-queue
    "body": "hash: seq -> message blob, exactly the bytes sent",
    "meta": "hash: seq -> cmsgpack map of the message's metadata (includes/readMeta.lua)",
    "all": "zset: seq -> seq; every message in any state (peek)",
    "ready": "zset: seq -> seq; available messages not filed under a session",
    "locked": "zset: seq -> ms lock ends; locked messages not filed under a session",
    "tokens": "hash: lock token -> seq, for every locked message",
    "deferred": "zset: seq -> seq; deferred messages",
    "sall": "zset (lexicographic): <sid>\\0<seq16> for every message with a session id",
    "sched": "zset: seq -> ms due; scheduled messages",
    "ttl": "zset: seq -> ms expires; available messages that have a time to live",
    "sready": "zset (lexicographic): <sid>\\0<seq16>; available messages filed under a session",
    "sinflight": "zset (lexicographic): <sid>\\0<seq16>; delivered, unsettled session messages",
    "waiters": "zset: waiter id -> ms it began waiting; receivers (not of sessions) with "
    "credit and nothing to take (each message that becomes available wakes the oldest one)",
    # queue-wide, last: what has happened, for the metrics
    "stats": "hash: <entity>.<event> -> count; monotonic totals of what happened to the "
    "queue ('q.') and its dead-letter sub-queue ('d.'): sent, received, completed, "
    "expired, ... (includes/countEvent.lua)",
}

QUEUE_WIDE = (
    "seq", "dedup", "sfree", "sholder", "slocks", "sstate", "supdated", "sessions",
    "swaiters", "procs",
)  # fmt: skip
QUEUE_ENTITY = (
    "body", "meta", "all", "ready", "locked", "tokens", "deferred", "sall",
    "sched", "ttl", "sready", "sinflight", "waiters",
)  # fmt: skip
DLQ_ENTITY = ("body", "meta", "all", "ready", "locked", "tokens", "deferred", "sall", "waiters")

# The full key set, in the order of includes/queueContext.lua: scripts that move messages
# between states (and so may dead-letter, expire or wake sessions) take all of it. `stats`
# comes last so that the other keys keep their places.
QUEUE_KEYS: tuple[str, ...] = (
    QUEUE_WIDE
    + tuple(f"q.{n}" for n in QUEUE_ENTITY)
    + tuple(f"d.{n}" for n in DLQ_ENTITY)
    + ("stats",)
)


def hash_tag(prefix: str, queue: str) -> str:
    return "{" + f"{prefix}:{queue}" + "}"


def key(prefix: str, queue: str, name: str) -> str:
    """The Redis key of one logical key name of a queue."""
    base = name.split(".", 1)[-1]
    if base not in KEY_DOC:
        raise KeyError(f"unknown key name {name!r}")
    return f"{hash_tag(prefix, queue)}:{name}"


def keys(prefix: str, queue: str, names: tuple[str, ...] | list[str]) -> list[str]:
    return [key(prefix, queue, n) for n in names]


def queue_pattern(prefix: str, queue: str) -> str:
    """A SCAN pattern for every key of a queue (tools and tests)."""
    tag = hash_tag(prefix, queue).replace("[", "\\[").replace("?", "\\?").replace("*", "\\*")
    return f"{tag}:*"


def wake_channel(prefix: str, process_id: str = "") -> str:
    """The pub/sub channel of one broker process: scripts publish on it the id of a waiter or
    lock holder of that process that has work (includes/wakeWaiters.lua). Without a process id:
    the common prefix of every process's channel."""
    return f"{prefix}:wake:{process_id}"
