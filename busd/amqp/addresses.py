"""Link addresses as Service Bus clients write them, parsed into what they name (docs/wire.md §2.1,
§2.2).

The Python SDK sends `amqps://<host>:<port>/<entity path>` for senders and receivers and a bare
`<entity path>/$management` for the management node; other SDKs send bare names. Entity names
and the `$DeadLetterQueue` / `$management` suffixes are case-insensitive, as in Service Bus.

    myqueue                                   -> entity "myqueue"
    amqps://localhost:5672/MyQueue            -> entity "myqueue"
    myqueue/$DeadLetterQueue                  -> the queue's dead-letter sub-queue
    myqueue/$management                       -> the queue's management node
    myqueue/$DeadLetterQueue/$management      -> the dead-letter sub-queue's management node
    myqueue/$Transfer/$DeadLetterQueue        -> the transfer dead-letter sub-queue
    mytopic/Subscriptions/mysub[/...]         -> a subscription (parsed; not served yet)
    $cbs                                      -> the claims-based-security node
"""

from __future__ import annotations

from dataclasses import dataclass

from busd.entities.values import (
    ENTITY_NAME_CHARACTERS,
    ENTITY_NAME_MAX_LENGTH,
    ENTITY_NAME_SEGMENT_RE,
)
from busd.errors import BusdError, Condition

SUB_DEADLETTER = "deadletter"
SUB_MANAGEMENT = "management"
SUB_CBS = "cbs"

_MAX_ENTITY_PATH = ENTITY_NAME_MAX_LENGTH


class AddressError(BusdError):
    """The address does not name anything busd could serve."""

    def __init__(self, address: str, why: str) -> None:
        super().__init__(Condition.NOT_FOUND, f"Invalid entity address {address!r}: {why}.")
        self.address = address


@dataclass(frozen=True, slots=True)
class Address:
    entity: str  # lower-case queue (or topic) name; "" for $cbs
    sub: str | None = None  # None | "deadletter" | "management" | "cbs"
    dlq: bool = False  # the dead-letter sub-queue is meant (also for its management node)
    transfer: bool = False  # `$Transfer/$DeadLetterQueue` (dlq is True too)
    subscription: str | None = None  # lower-case subscription name of `t/Subscriptions/s`

    @property
    def is_subscription(self) -> bool:
        return self.subscription is not None

    @property
    def entity_path(self) -> str:
        """The lower-cased path of the receivable entity, without the management suffix; this is
        what a token's audience must cover."""
        if self.sub == SUB_CBS:
            return "$cbs"
        path = self.entity
        if self.subscription is not None:
            path = f"{path}/subscriptions/{self.subscription}"
        if self.transfer:
            path = f"{path}/$transfer"
        if self.dlq:
            path = f"{path}/$deadletterqueue"
        return path


def parse_address(address: str | None) -> Address:
    """What an attach's source or target address names; AddressError when it names nothing."""
    if not address or not isinstance(address, str):
        raise AddressError(str(address), "an entity address is required")
    path = _strip_authority(address.strip())
    if not path:
        raise AddressError(address, "no entity path")
    segments = path.split("/")
    if any(not s for s in segments):
        raise AddressError(address, "empty path segment")

    lowered = [s.lower() for s in segments]
    if lowered == ["$cbs"]:
        return Address(entity="", sub=SUB_CBS)

    sub: str | None = None
    dlq = transfer = False
    if lowered[-1] == "$management":
        sub = SUB_MANAGEMENT
        segments.pop(), lowered.pop()
    if lowered and lowered[-1] == "$deadletterqueue":
        dlq = True
        sub = sub or SUB_DEADLETTER
        segments.pop(), lowered.pop()
        if lowered and lowered[-1] == "$transfer":
            transfer = True
            segments.pop(), lowered.pop()
    if not segments:
        if sub == SUB_MANAGEMENT and not dlq:
            return Address(entity="", sub=SUB_MANAGEMENT)  # the namespace's management node
        raise AddressError(address, "no entity name before the '$' node")

    subscription: str | None = None
    if len(lowered) >= 3 and lowered[-2] == "subscriptions":
        subscription = lowered[-1]
        lowered = lowered[:-2]

    for segment in lowered + ([subscription] if subscription else []):
        if not ENTITY_NAME_SEGMENT_RE.fullmatch(segment):
            if segment.startswith("$"):
                raise AddressError(address, f"unknown node {segment!r}")
            raise AddressError(address, f"names may hold only {ENTITY_NAME_CHARACTERS}")
    entity = "/".join(lowered)
    if len(entity) > _MAX_ENTITY_PATH:
        raise AddressError(address, f"entity names are at most {_MAX_ENTITY_PATH} characters")
    return Address(entity=entity, sub=sub, dlq=dlq, transfer=transfer, subscription=subscription)


def _strip_authority(address: str) -> str:
    """Drop `scheme://authority` and surrounding '/': `amqps://h:5672/q/` -> `q`."""
    scheme_end = address.find("://")
    if scheme_end >= 0:
        slash = address.find("/", scheme_end + 3)
        address = "" if slash < 0 else address[slash:]
    return address.strip("/")
