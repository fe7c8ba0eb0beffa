"""The one place Redis key names are built.

Every key of a queue carries the same hash tag, `{<prefix>:<queue>}`, so that the queue, its
dead-letter sub-queue and its sessions live in one Redis Cluster slot and a script can move a
message between them atomically. A key name is `{<prefix>:<queue>}:<name>` where `<name>` is
the logical name a script's header gives it (`q.ready`, `d.body`, `sfree`, ...): `q.` keys
belong to the queue itself, `d.` keys to its dead-letter sub-queue, the rest to the whole queue.

A topic's keys carry the topic's tag, `{<prefix>:<topic>}`, and so do the keys of each of its
subscriptions: `{<prefix>:<topic>}:s:<subscription>:<name>`. One script can therefore store a
message in every subscription of a topic (fan-out) on Redis Cluster too. A subscription is
queue-like (the same logical key set as a queue) except for `seq` and `dedup`, which are its
topic's: every copy keeps the number the topic gave it, and numbers given later in the
subscription (a resubmitted dead letter) come from the same counter, so they never collide.
Queue and topic names share one namespace (as in Service Bus), so their tags never meet.

A partitioned entity (docs/design.md §3.18) is one such key set per partition, each under a
tag of its own (`partition_scope`; a name has no `:`), so a cluster spreads its partitions over
its shards. Each partition is an ordinary queue to the scripts; partitioned.router routes
calls to them. Two layouts of these tags (the entity's record says which, `partition_layout`):
- `FIRST_LAYOUT`, entities created before the even layout: `{<prefix>:<queue>:<p>}`, whose slot
  is wherever CRC16 puts it, so 16 partitions fall unevenly on the shards (as 3/5/8 on three);
- `EVEN_LAYOUT`: `{<prefix>:<queue>:<p>#<salt>}`, the salt chosen (`even_tag`) so that the
  tag's slot is near the middle of the p-th of P equal slot ranges. A cluster whose slots are
  split evenly in order (as `valkey-cli --cluster create` and `busd serve --store-shards` do)
  then holds P/S partitions on each of its S shards when S divides P, and one more or less
  elsewhere.

The entity catalog (busd.storage.api.Store.catalog_*) is one hash outside every entity's tag,
with a pub/sub channel beside it.

Assumptions: the prefix and entity names contain no `{` or `}` (names are letters, digits,
`-._~/`; subscription names contain no `/` or `:`), and session ids contain no NUL byte
(session members of the lexicographic indexes are `<session id>\\0<16-digit sequence number>`).
"""

from __future__ import annotations

import functools
from binascii import crc_hqx

# Logical key names and what each holds. Scripts refer to keys only through these names (in
# their headers); the loader turns a header's list into KEYS.
KEY_DOC: dict[str, str] = {
    # not keys: what a script is passed for a queue context (`context_key`), and on a
    # Cluster a name beside it that is never written (`context_guard`)
    "guard": "never written: passed beside a context key on a Cluster (`context_guard`)",
    "ctx": "the prefix a queue's (or subscription's) keys share, `{<tag>}:` or "
    "`{<tag>}:s:<subscription>:`: a `Context: queue` script is passed it alone and names "
    "the keys of QUEUE_KEYS from it (includes/queueKeys.lua); nothing is stored under it",
    # queue-wide
    "seq": "string: last sequence number given out (queue and dead-letter queue share it)",
    "dedup": "zset: message-id -> ms first seen (duplicate detection); on a Redis Cluster also "
    "'\\0fwd:<source>:<seq>:<enqueued ms>' -> ms a day ahead, a message being forwarded into "
    "the entity (lua/forwardEnqueue.lua)",
    "sfree": "zset: session id -> seq of its oldest available message; sessions with "
    "available messages and no holder (next-available acceptance picks the lowest)",
    "sholder": "hash: session id -> holder of its lock",
    "slocks": "zset: session id -> ms its lock ends",
    "sstate": "hash: session id -> session state",
    "supdated": "zset: session id -> ms its state was last set, moved forward by every write "
    "(a millisecond past the last when the clock has not): the state's etag "
    "(includes/writeSessionState.lua)",
    "sessions": "zset (all scores 0, lexicographic): sessions with messages or state",
    "swaiters": "zset: waiter id -> ms it began waiting; next-available session receivers "
    "waiting for a free session (a session that becomes free wakes the oldest one)",
    "procs": "zset: broker process id -> ms its liveness ends (refreshed by each process's "
    "sweep); the waiters of a process past its end are dropped",
    "txns": "zset: transaction id -> ms it times out; transactions with staged operations "
    "whose via entity is this queue (lua/stageTransaction-2.lua; the sweep drops those past "
    "their time)",
    "txops": "hash: '<txn id>:n' -> number of staged operations, '<txn id>:<i>' -> the i-th, "
    "cmsgpack-encoded; applied all at once by lua/commitTransaction.lua",
    # per entity: `q.` the queue, `d.` its dead-letter sub-queue
    "body": "hash: seq -> message blob, exactly the bytes sent; 'm<seq>' -> cmsgpack map of "
    "its metadata (includes/readMeta.lua)",
    "meta": "hash: seq -> metadata of messages stored before it moved beside the body",
    "all": "zset: seq -> seq; every message but a session's in flight (in sinflight)",
    "ready": "zset: seq -> seq; available messages not filed under a session",
    "locked": "zset: seq -> ms lock ends; locked messages not filed under a session",
    "tokens": "hash: lock token -> seq, of locks taken before tokens named their message",
    "deferred": "zset: seq -> seq; deferred messages",
    "sall": "zset (lexicographic): <sid>\\0<seq16>; messages with a session id but those "
    "in sready or sinflight: on a session queue the deferred and scheduled ones (a session "
    "message is in one of the three by its state, lua/includes/fileMessage.lua)",
    "sched": "zset: seq -> ms due; scheduled messages",
    "ttl": "zset: seq -> ms expires; available messages that have a time to live",
    "sready": "zset (lexicographic): <sid>\\0<seq16>; available messages filed under a session",
    "sinflight": "zset (lexicographic): <sid>\\0<seq16>; delivered, unsettled session messages",
    "waiters": "zset: waiter id -> ms it began waiting; receivers (not of sessions) with "
    "credit and nothing to take (each message that becomes available wakes the oldest one)",
    "backoff": "zset: seq -> ms due; available messages waiting out their redelivery backoff "
    "(docs/design.md §2.17), outside `ready` (in `sready` too when filed under a session); "
    "the queue's only (q.backoff)",
    # queue-wide, last: what has happened, for the metrics
    "stats": "hash: <entity>.<event> -> count; monotonic totals of what happened to the "
    "queue ('q.') and its dead-letter sub-queue ('d.'): sent, received, completed, "
    "expired, ... (includes/countEvent.lua); 'q.handed' counts messages a send handed "
    "over, sent and received at once (lua/countEntity.lua adds them to both)",
    # topic-wide (a topic's own keys besides `seq` and `dedup`)
    "subs": "set: names of the topic's live subscriptions; fan-out stores copies only in "
    "these, so a subscription deleted while a process still routes to it gets nothing",
    "tstats": "hash: <event> -> count; monotonic totals of the topic: sent, duplicates, "
    "dropped (matched no subscription)",
    # queue-wide, after `stats`: auto-forwarding (docs/design.md §3.16)
    "sidle": "zset: session id -> ms it was last found idle (no messages, no holder: it "
    "lives on for its state); the sweep removes those idle longer than SessionIdleTimeToLive "
    "(includes/expireIdleSessions.lua). Kept loosely: a session that has messages or a "
    "holder again keeps its entry until the sweep meets it and drops it",
    "sactive": "hash: session id -> ms of its last activity: accepted, a message settled by "
    "its holder, its lock ended (the session inspector, lua/sessionPage.lua); and "
    "'<session id>\\0c' -> '<client container id>\\0<client address>' of the holder's "
    "connection that last accepted it ('' unknown), written in the accept's one HSET and read "
    "only while the session is held (includes/noteActivity.lua)",
    "sclient": "hash: session id -> the holder's connection, as a busd before the connection "
    "moved into `sactive` kept it; read by the inspector only where `sactive` has none",
    "quiet": "string, set for QUIET_MS (includes/housekeeping.lua): lazy housekeeping found "
    "nothing of the queue due a moment ago; scripts until it expires skip the look",
    "sbook": "hash: session id -> the standing offer of its holder, '<8 token bytes><holder>': "
    "left by a receive of the holder that found fewer messages than it asked for "
    "(lua/receiveSessionMessages.lua); a send of any process locks the session's next "
    "messages for that holder and publishes their delivery rows on the holder's channel "
    "(lua/sendMessages.lua, docs/design.md §3.5). Kept only while the session has no "
    "available message (includes/unbook.lua); the holder's next receive replaces it, the end "
    "of its lock removes it",
    "fwd": "hash: '<entity>' -> the forwarder holding the entity's forwarding lease ('q' the "
    "queue, 'd' its dead-letter sub-queue), '<entity>.u' -> ms the lease ends",
}

QUEUE_WIDE = (
    "seq",
    "dedup",
    "sfree",
    "sholder",
    "slocks",
    "sstate",
    "supdated",
    "sessions",
    "swaiters",
    "procs",
)
QUEUE_ENTITY = (
    "body",
    "meta",
    "all",
    "ready",
    "locked",
    "tokens",
    "deferred",
    "sall",
    "sched",
    "ttl",
    "sready",
    "sinflight",
    "waiters",
)
DLQ_ENTITY = ("body", "meta", "all", "ready", "locked", "tokens", "deferred", "sall", "waiters")

# The full key set, in the order of includes/queueContext.lua: scripts that move messages
# between states (and so may dead-letter, expire or wake sessions) take all of it. Keys added
# later come last (`stats`, `fwd`, `sidle`, ...) so that the other keys keep their places.
QUEUE_KEYS: tuple[str, ...] = (
    QUEUE_WIDE
    + tuple(f"q.{n}" for n in QUEUE_ENTITY)
    + tuple(f"d.{n}" for n in DLQ_ENTITY)
    + ("stats", "fwd", "sidle", "sactive", "sclient", "quiet", "q.backoff", "sbook")
)


# The one key a queue context is passed (`context_key`), whatever QUEUE_KEYS holds.
QUEUE_CONTEXT = "ctx"

# A topic's own keys, in the order of includes/topicContext.lua.
TOPIC_KEYS: tuple[str, ...] = ("seq", "dedup", "subs", "tstats")
# Keys a subscription shares with its topic (see the module docstring).
SHARED_WITH_TOPIC = frozenset(("seq", "dedup"))
# A transaction's staged state, kept under its via entity's hash tag (docs/design.md §3.15).
TRANSACTION_KEYS: tuple[str, ...] = ("txns", "txops")


FIRST_LAYOUT = 0
EVEN_LAYOUT = 1
SLOTS = 16384  # a Redis Cluster's hash slots


def partition_scope(
    entity: str, partition: int, partitions: int | None = None, layout: int = EVEN_LAYOUT
) -> str:
    """What stands for a queue or topic in the keys of one of its partitions: `<entity>:<p>`
    in the first layout; in the even layout `<entity>:<p>/<P>`, which `hash_tag` turns into
    the tag of the p-th of P slot ranges (the module docstring)."""
    if layout == FIRST_LAYOUT or partitions is None:
        return f"{entity}:{partition}"
    return f"{entity}:{partition}/{partitions}"


def slot(tag: str) -> int:
    """The cluster slot of a hash tag's content (CRC16/XMODEM modulo 16384, as Redis hashes)."""
    return crc_hqx(tag.encode(), 0) % SLOTS


@functools.lru_cache(maxsize=4096)
def even_tag(prefix: str, entity: str, partition: int, partitions: int) -> str:
    """The content of the even layout's tag of partition `partition` of `partitions`: the
    first salt (0, 1, 2, ... in base 36) whose slot lies within an eighth of a range of the
    middle of that partition's slot range. About 4·P tries, each a CRC16 of a short string
    (a few ms for an entity of 32 partitions, once per process: cached)."""
    width = SLOTS / partitions
    middle = (partition + 0.5) * width
    reach = max(1.0, width / 8)
    best, best_distance = "", float("inf")
    for n in range(1 << 20):
        content = f"{prefix}:{entity}:{partition}#{_base36(n)}"
        distance = abs(slot(content) - middle)
        if distance <= reach:
            return content
        if distance < best_distance:
            best, best_distance = content, distance
    return best  # not met in a million tries (never seen): the nearest one


def _base36(n: int) -> str:
    digits = ""
    while True:
        n, d = divmod(n, 36)
        digits = "0123456789abcdefghijklmnopqrstuvwxyz"[d] + digits
        if not n:
            return digits


def hash_tag(prefix: str, entity: str) -> str:
    """The hash tag of a queue or topic (and so of the topic's subscriptions); of one
    partition's, for a `partition_scope`."""
    name, sep, place = entity.rpartition(":")
    if sep and "/" in place:  # an even-layout partition: `<p>/<P>` (names hold no `:`)
        partition, _, partitions = place.partition("/")
        return "{" + even_tag(prefix, name, int(partition), int(partitions)) + "}"
    return "{" + f"{prefix}:{entity}" + "}"


def key(prefix: str, entity: str, name: str, subscription: str | None = None) -> str:
    """The Redis key of one logical key name of a queue or topic (`entity`), or of the topic's
    `subscription`; for QUEUE_CONTEXT, the `context_key`."""
    base = name.split(".", 1)[-1]
    if base not in KEY_DOC:
        raise KeyError(f"unknown key name {name!r}")
    if name == QUEUE_CONTEXT:
        return context_key(prefix, entity, subscription)
    if subscription is None or name in SHARED_WITH_TOPIC:
        return f"{hash_tag(prefix, entity)}:{name}"
    return f"{hash_tag(prefix, entity)}:s:{subscription}:{name}"


def context_key(prefix: str, entity: str, subscription: str | None = None) -> str:
    """What a script is passed for the queue context of a queue (or of a topic's
    `subscription`): the prefix every key of QUEUE_KEYS starts with, but `seq` and `dedup`
    of a subscription, which are its topic's (`{<tag>}:`, the part up to the tag's `}:`).
    Its hash tag routes the call on a Cluster."""
    if subscription is None:
        return f"{hash_tag(prefix, entity)}:"
    return f"{hash_tag(prefix, entity)}:s:{subscription}:"


def context_guard(context: bytes) -> bytes:
    """A key never written, beside a `context_key`: a Cluster is passed it too, after the
    call's own keys, so that the call names two keys of the slot and one is always missing.
    A slot being migrated then refuses the call up front (TRYAGAIN, on either node: the
    server checks a call's keys before it runs), where a script that names keys it was not
    passed would find some of them gone midway (docs/design.md §3.4)."""
    return context + b"guard"


def keys(
    prefix: str, entity: str, names: tuple[str, ...] | list[str], subscription: str | None = None
) -> list[str]:
    return [key(prefix, entity, n, subscription) for n in names]


def catalog_key(prefix: str) -> str:
    """The hash of every entity record: `<kind>:<path>` -> JSON (busd.storage.api)."""
    return f"{prefix}:catalog"


def fault_hits_key(prefix: str, fault_id: str) -> str:
    """The hits of one fault on demand with a count (busd.broker.faults; the faults' records
    are in the catalog, kind `fault`)."""
    return f"{prefix}:faults:hits:{fault_id}"


def catalog_channel(prefix: str) -> str:
    """Where a change of the catalog is announced: the `<kind>:<path>` that changed."""
    return f"{prefix}:catalog:changes"


def namespace_prefix(prefix: str, name: str) -> str:
    """The key prefix of the namespace `name` (other than the default) over the default
    namespace's `prefix` (docs/design.md §3.17)."""
    return f"{prefix}:ns:{name}"


def namespaces_key(prefix: str) -> str:
    """The set of the namespaces other than the default ever made (by a Manage key) over the
    default namespace's prefix: a namespace here exists for every process (docs/design.md
    §3.17). Beside the catalog, outside every hash tag and every namespace's `<prefix>:ns:`."""
    return f"{prefix}:namespaces"


def wake_channel(prefix: str, process_id: str = "") -> str:
    """The pub/sub channel of one broker process: scripts publish on it the id of a waiter or
    lock holder of that process that has work (includes/wakeWaiters.lua). Without a process id:
    the common prefix of every process's channel. On a Cluster `prefix` is a context's hash
    tag (`{...}`), so the channel is in the context's slot (busd/storage/redis/shard_wakeups.py)."""
    return f"{prefix}:wake:{process_id}"
