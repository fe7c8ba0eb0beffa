"""Errors as clients see them: AMQP conditions, and the store's status codes mapped onto them.

Deep code raises `BusdError`; the nearest protocol boundary (link refusal, rejected outcome,
settlement echo, `$management` response, connection close) turns it into the AMQP error the
SDK maps to the right exception (docs/wire.md §9).
"""

from __future__ import annotations

import enum


class Condition(str, enum.Enum):
    """AMQP error conditions busd sends (docs/wire.md §9.2 lists what the SDK makes of each)."""

    NOT_FOUND = "amqp:not-found"
    UNAUTHORIZED = "amqp:unauthorized-access"
    NOT_ALLOWED = "amqp:not-allowed"
    NOT_IMPLEMENTED = "amqp:not-implemented"
    DECODE_ERROR = "amqp:decode-error"
    INTERNAL = "amqp:internal-error"
    INVALID_FIELD = "amqp:invalid-field"
    RESOURCE_LIMIT = "amqp:resource-limit-exceeded"
    FRAMING_ERROR = "amqp:connection:framing-error"
    MESSAGE_SIZE_EXCEEDED = "amqp:link:message-size-exceeded"
    DETACH_FORCED = "amqp:link:detach-forced"
    CONNECTION_FORCED = "amqp:connection:forced"
    SESSION_LOCK_LOST = "com.microsoft:session-lock-lost"
    MESSAGE_LOCK_LOST = "com.microsoft:message-lock-lost"
    SESSION_CANNOT_BE_LOCKED = "com.microsoft:session-cannot-be-locked"
    MESSAGE_NOT_FOUND = "com.microsoft:message-not-found"
    TIMEOUT = "com.microsoft:timeout"
    ARGUMENT_ERROR = "com.microsoft:argument-error"
    ARGUMENT_OUT_OF_RANGE = "com.microsoft:argument-out-of-range"
    SERVER_BUSY = "com.microsoft:server-busy"
    DEAD_LETTER = "com.microsoft:dead-letter"
    ENTITY_ALREADY_EXISTS = "com.microsoft:entity-already-exists"
    PRECONDITION_FAILED = "com.microsoft:precondition-failed"
    # OASIS AMQP 1.0 Part 4 §4.5.8 transaction-error
    TRANSACTION_UNKNOWN_ID = "amqp:transaction:unknown-id"
    TRANSACTION_ROLLBACK = "amqp:transaction:rollback"
    TRANSACTION_TIMEOUT = "amqp:transaction:timeout"

    @property
    def label(self) -> str:
        """Its last part as a metric label: `com.microsoft:message-lock-lost` is
        `message_lock_lost`."""
        return self.value.rpartition(":")[2].replace("-", "_")


# HTTP-like status codes used in `$management` responses for each condition.
_STATUS = {
    Condition.NOT_FOUND: 404,
    Condition.UNAUTHORIZED: 401,
    Condition.NOT_ALLOWED: 400,
    Condition.NOT_IMPLEMENTED: 501,
    Condition.DECODE_ERROR: 400,
    Condition.INVALID_FIELD: 400,
    Condition.MESSAGE_SIZE_EXCEEDED: 413,
    Condition.SESSION_LOCK_LOST: 410,
    Condition.MESSAGE_LOCK_LOST: 410,
    Condition.SESSION_CANNOT_BE_LOCKED: 409,
    Condition.MESSAGE_NOT_FOUND: 404,
    Condition.TIMEOUT: 408,
    Condition.ARGUMENT_ERROR: 400,
    Condition.ARGUMENT_OUT_OF_RANGE: 400,
    Condition.SERVER_BUSY: 503,
    Condition.ENTITY_ALREADY_EXISTS: 409,
    Condition.PRECONDITION_FAILED: 412,
    Condition.RESOURCE_LIMIT: 403,
    Condition.TRANSACTION_UNKNOWN_ID: 400,
    Condition.TRANSACTION_ROLLBACK: 400,
    Condition.TRANSACTION_TIMEOUT: 408,
}


class BusdError(Exception):
    """A failure that reaches the client as an AMQP error condition."""

    def __init__(self, condition: Condition, description: str) -> None:
        super().__init__(f"{condition.value}: {description}")
        self.condition = condition
        self.description = description

    @property
    def status_code(self) -> int:
        return _STATUS.get(self.condition, 500)


# What a refusal says when the code refusing it has nothing to add: the store's refusals of a
# lock, a session or a sequence number (busd.storage maps its scripts' statuses to these).
_DESCRIPTIONS = {
    Condition.MESSAGE_LOCK_LOST: (
        "The lock supplied is invalid: it expired, or the message was already settled."
    ),
    Condition.SESSION_LOCK_LOST: (
        "The session lock was lost: it expired or is held by another receiver."
    ),
    Condition.SESSION_CANNOT_BE_LOCKED: "The requested session is locked by another receiver.",
    Condition.MESSAGE_NOT_FOUND: "No message with that sequence number is available in this state.",
}


def store_unavailable() -> BusdError:
    """What a client hears when the store could not be had or did not answer: server-busy,
    which the SDKs retry (docs/design.md §2.11)."""
    return BusdError(Condition.SERVER_BUSY, "The store is unavailable; try again.")


def refusal(condition: Condition) -> BusdError:
    """The client-facing error for a refusal the store reported as `condition`."""
    return BusdError(condition, _DESCRIPTIONS.get(condition, "The request was refused."))


class ConfigError(Exception):
    """A setting, the entities file or an entity's property is invalid; the message says which
    and why, in one line."""


# Every exit code busd's processes and commands end with (sysexits.h where one fits), in one
# place: `busd serve` and its workers, and the operator tools (docs/tools.md). 2 is click's, a
# usage error (a missing argument or an unknown option).
EXIT_OK = 0
EXIT_FAILURE = 1  # the server stopped on an error at run time; busd failed a tool's request
EXIT_INVALID = 65  # EX_DATAERR: the request or input was refused as invalid
EXIT_NOT_FOUND = 66  # EX_NOINPUT: no such entity
EXIT_UNAVAILABLE = 69  # EX_UNAVAILABLE: busd, its store or a port could not be had
EXIT_EXISTS = 73  # EX_CANTCREAT: the entity exists already
EXIT_CONFIG = 78  # EX_CONFIG: a setting or the entities file is wrong
