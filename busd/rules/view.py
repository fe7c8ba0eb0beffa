"""A stored message as rules see it, read from its blob (busd.amqp.incoming) only as far as
the rules ask: the properties list on the first system-property lookup, the
application-properties map on the first user-property lookup, header and annotations only for
the system properties that live there (docs/rules.md §4.1).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from busd.amqp.decoding import RAW_ERRORS, decode_raw
from busd.amqp.incoming import BLOB_HEAD, BLOB_VERSION, HAS_APP_PROPERTIES
from busd.amqp.sections import PROPERTIES, scan_sections
from busd.amqp.types import AmqpDecimal, CodecError, Described, Symbol, Timestamp
from busd.rules.errors import EvaluationError

__all__ = ["MessageView"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# properties list position of each system property read from it
_PROPERTY_POSITION = {
    "MessageId": 0,
    "To": 2,
    "Label": 3,
    "ReplyTo": 4,
    "CorrelationId": 5,
    "ContentType": 6,
    "SessionId": 10,
    "ReplyToSessionId": 12,
}
_ANNOTATION = {
    "ScheduledEnqueueTimeUtc": "x-opt-scheduled-enqueue-time",
    "PartitionKey": "x-opt-partition-key",
    "ViaPartitionKey": "x-opt-via-partition-key",
}
_STATE_NAMES = {0: "Active", 1: "Deferred", 2: "Scheduled"}
_PROPERTIES_OPEN = b"\x00\x53\x73"
_APP_PROPERTIES_OPEN = b"\x00\x53\x74"


class MessageView:
    """What filters and actions read from one stored message.

    `blob` is the stored form (IncomingMessage.blob). What the store assigns later is given by
    the caller when it knows it, else the matching system properties are NULL:
    `sequence_number`, `enqueued_ms`, `size` (the message's size as sent)."""

    __slots__ = (
        "_blob",
        "_seq",
        "_enqueued_ms",
        "_size",
        "_props",
        "_user",
        "_user_keys",
        "_header",
        "_ann",
        "_state",
    )

    def __init__(
        self,
        blob: bytes,
        *,
        sequence_number: int | None = None,
        enqueued_ms: int | None = None,
        size: int | None = None,
        state: int = 0,
    ) -> None:
        self._blob = blob
        self._seq = sequence_number
        self._enqueued_ms = enqueued_ms
        self._size = size
        self._state = state
        self._props: list | None = None
        self._user: dict[str, Any] | None = None  # lower-cased key -> value
        self._user_keys: dict[str, str] | None = None  # lower-cased key -> key as sent
        self._header: list | None = None
        self._ann: dict[str, Any] | None = None

    # -- the scope interface of busd.rules.sql --------------------------------------------------

    def user(self, lower_name: str) -> Any:
        user = self._user if self._user is not None else self._read_user()
        return user.get(lower_name)

    def user_exists(self, lower_name: str) -> bool:
        user = self._user if self._user is not None else self._read_user()
        return lower_name in user

    def user_key(self, lower_name: str) -> str | None:
        """The key as sent of the user property matching lower_name, if any."""
        if self._user_keys is None:
            self._read_user()
        return self._user_keys.get(lower_name)  # type: ignore[union-attr]

    def sys(self, name: str) -> Any:
        pos = _PROPERTY_POSITION.get(name)
        if pos is not None:
            props = self._props if self._props is not None else self._read_properties()
            value = props[pos] if pos < len(props) else None
            if value is None or type(value) is str:
                return value
            return _id_text(value) if pos in (0, 5) else str(value)
        if name == "SequenceNumber":
            return self._seq
        if name == "EnqueuedTimeUtc":
            return None if self._enqueued_ms is None else _datetime(self._enqueued_ms)
        if name == "TimeToLive":
            ttl = self._ttl_ms()
            return None if ttl is None else timedelta(milliseconds=ttl)
        if name == "ExpiresAtUtc":
            ttl = self._ttl_ms()
            if ttl is None or self._enqueued_ms is None:
                return None
            return _datetime(self._enqueued_ms + ttl)
        if name in _ANNOTATION:
            value = self._annotations().get(_ANNOTATION[name])
            if name == "ScheduledEnqueueTimeUtc" and value is not None:
                return _datetime(int(value))
            return value
        if name == "DeliveryCount":
            return 0
        if name == "Size":
            return self._size
        if name == "State":
            return _STATE_NAMES.get(self._state)
        if name == "ForcePersistence":
            return False
        return None  # LockToken, LockedUntilUtc, DeadLetterSource, EnqueuedSequenceNumber

    # -- reading the blob ---------------------------------------------------------------------

    def _parts(self) -> tuple[int, int, int, int, int, int]:
        """(flags, header start, header length, annotation pairs, annotations length,
        bare start) of the blob."""
        try:
            version, flags, header_len, ann_pairs, ann_len, _, _ = BLOB_HEAD.unpack_from(self._blob)
        except Exception:
            raise CodecError("not a stored message") from None
        if version != BLOB_VERSION:
            raise CodecError("not a stored message")
        start = BLOB_HEAD.size
        return flags, start, header_len, ann_pairs, ann_len, start + header_len + ann_len

    def _read_properties(self) -> list:
        bare_start = self._parts()[5]
        blob = self._blob
        props: list = []
        try:
            if blob[bare_start : bare_start + 3] == _PROPERTIES_OPEN:  # the usual place: first
                props = decode_raw(blob, bare_start + 3, 1)[0] or []
            else:
                bare = blob[bare_start:]
                for code, _, vpos, _ in scan_sections(bare):
                    if code == PROPERTIES:
                        props = decode_raw(bare, vpos, 1)[0] or []
                        break
        except CodecError:
            raise
        except RAW_ERRORS as exc:
            raise CodecError(f"malformed stored message: {exc}") from None
        if not isinstance(props, list):
            raise CodecError("malformed stored message: properties are not a list")
        self._props = props
        return props

    def _read_user(self) -> dict[str, Any]:
        flags, *_, bare_start = self._parts()
        user: dict[str, Any] = {}
        keys: dict[str, str] = {}
        if flags & HAS_APP_PROPERTIES:
            blob = self._blob
            start = bare_start + BLOB_HEAD.unpack_from(blob)[5]
            try:
                if blob[start : start + 3] == _APP_PROPERTIES_OPEN:
                    value = decode_raw(blob, start + 3, 1)[0] or {}
                else:  # a descriptor written another way: find the value
                    end = bare_start + BLOB_HEAD.unpack_from(blob)[6]
                    ((_, _, vpos, _),) = scan_sections(blob[start:end])
                    value = decode_raw(blob[start:end], vpos, 1)[0] or {}
                items = value.items()
            except CodecError:
                raise
            except RAW_ERRORS + (TypeError, AttributeError) as exc:
                raise CodecError(f"malformed stored application-properties: {exc}") from None
            for key, v in items:
                lower = str(key).lower()
                if lower not in user:  # two keys differing in case: the first one sent wins
                    user[lower] = _sql_value(v)
                    keys[lower] = str(key)
        self._user = user
        self._user_keys = keys
        return user

    def _ttl_ms(self) -> int | None:
        if self._header is None:
            _, start, length, *_ = self._parts()
            fields, p = [], start
            while p < start + length:
                v, p = decode_raw(self._blob, p, 1)
                fields.append(v)
            self._header = fields
        return self._header[2] if len(self._header) > 2 else None

    def _annotations(self) -> dict[str, Any]:
        if self._ann is None:
            _, start, header_len, pairs, _, _ = self._parts()
            ann: dict[str, Any] = {}
            p = start + header_len
            for _ in range(pairs):
                key, p = decode_raw(self._blob, p, 1)
                value, p = decode_raw(self._blob, p, 1)
                if isinstance(key, str):
                    ann[str(key)] = value
            self._ann = ann
        return self._ann


def _datetime(ms: int) -> datetime:
    return _EPOCH + timedelta(milliseconds=ms)


def _id_text(value: Any) -> str:
    # message-id and correlation-id as text, the way duplicate detection compares them
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


def _sql_value(v: Any) -> Any:
    """An application-property value as the SQL language sees it."""
    t = type(v)
    if t is str or t is int or t is float or t is bool or v is None:
        return v
    if t is Timestamp:
        return _datetime(int(v))
    if isinstance(v, Symbol):
        return str(v)
    if isinstance(v, bool):
        return bool(v)
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return float(v)
    if isinstance(v, (str, uuid.UUID, bytes)):
        return v
    if isinstance(v, (Described, AmqpDecimal, list, dict)):
        return v  # compared only for equality with itself (sql_values._kind 7)
    raise EvaluationError(f"unsupported application-property value {v!r}")
