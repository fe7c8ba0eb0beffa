"""Entity names and durations as Service Bus spells them: the rules every way in (the entities
file, the management API, the command line) applies to what it is given.

Names are compared case-insensitively and kept lower-cased; durations are ISO 8601 (or .NET
TimeSpan text) and become milliseconds, None for unbounded (docs/design.md §2.1).
"""

from __future__ import annotations

import re

from busd.errors import ConfigError

# .NET's TimeSpan.MaxValue (P10675199DT2H48M5.4775807S) is how Service Bus spells "unbounded";
# any duration of at least that many days means no limit.
_TIMESPAN_MAX_DAYS = 10_675_199

ENTITY_NAME_MAX_LENGTH = 260
# A queue's or topic's name: segments of letters, digits, '.', '-', '_' and '~', joined by '/'.
# Service Bus takes '~' in queue and topic names over its own API (MassTransit names topics
# `Namespace~Message`); Azure Resource Manager reads it as an escaped '/' (docs/design.md §2.1).
ENTITY_NAME_SEGMENT_RE = re.compile(r"[A-Za-z0-9._~-]+", re.ASCII)
ENTITY_NAME_CHARACTERS = "letters, digits, '-', '.', '_', '~' and '/'"
_ENTITY_NAME_RE = re.compile(r"[A-Za-z0-9._~/-]{1,260}", re.ASCII)
SUBSCRIPTION_NAME_MAX_LENGTH = 50  # Service Bus's limit, for rule names too
_SUBSCRIPTION_NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,50}", re.ASCII)


# --- entity names ------------------------------------------------------------------------------


def normalize_entity_name(name: object, what: str = "queue") -> str:
    """The lower-cased name (Service Bus names are case-insensitive), or ConfigError."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{what} name must be a non-empty string, got {name!r}")
    if len(name) > ENTITY_NAME_MAX_LENGTH:
        raise ConfigError(
            f"{what} name {name[:40]!r}... is {len(name)} characters long; "
            f"the limit is {ENTITY_NAME_MAX_LENGTH}"
        )
    if not _ENTITY_NAME_RE.fullmatch(name):
        bad = sorted({c for c in name if not _ENTITY_NAME_RE.fullmatch(c)})
        raise ConfigError(
            f"{what} name {name!r} contains {''.join(bad)!r}: only {ENTITY_NAME_CHARACTERS} "
            "are allowed"
        )
    segments = name.split("/")
    if any(not s for s in segments):
        raise ConfigError(f"{what} name {name!r} must not start or end with '/' nor contain '//'")
    if len(segments) > 1 and any(s.lower() == "subscriptions" for s in segments):
        # `t/Subscriptions/s` is how a subscription is addressed; a queue named that way
        # could never be reached.
        raise ConfigError(f"{what} name {name!r} must not contain a 'Subscriptions' segment")
    return name.lower()


def normalize_subscription_name(name: object) -> str:
    """A subscription's lower-cased name (one path segment, at most 50 characters)."""
    if not isinstance(name, str) or not _SUBSCRIPTION_NAME_RE.fullmatch(name):
        raise ConfigError(
            f"subscription name must be 1..{SUBSCRIPTION_NAME_MAX_LENGTH} letters, digits, "
            f"'-', '.' or '_', got {name!r}"
        )
    return name.lower()


def check_rule_name(name: object) -> str:
    """A rule's name as given (rule names compare case-insensitively)."""
    if (
        not isinstance(name, str)
        or not name
        or len(name) > SUBSCRIPTION_NAME_MAX_LENGTH
        or any(c in name for c in "/\\?#")
    ):
        raise ConfigError(
            f"rule name must be 1..{SUBSCRIPTION_NAME_MAX_LENGTH} characters without "
            f"'/', '\\', '?' or '#', got {name!r}"
        )
    return name


def normalize_forward_target(value: object, what: str) -> str | None:
    """A ForwardTo-style value as a bare entity path: None for empty, scheme and authority of
    an absolute URL (`sb://host:port/q`, as the management API sends it) dropped."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ConfigError(f"{what} must be an entity name, got {value!r}")
    text = value.strip()
    scheme = text.find("://")
    if scheme >= 0:
        slash = text.find("/", scheme + 3)
        text = "" if slash < 0 else text[slash:]
    text = text.strip("/")
    if not text:
        return None
    return normalize_entity_name(text, what)


# --- ISO 8601 durations --------------------------------------------------------------------------

_DURATION_RE = re.compile(
    r"P(?!$)(?:(?P<years>\d+)Y)?(?:(?P<months>\d+)M)?(?:(?P<weeks>\d+)W)?(?:(?P<days>\d+)D)?"
    r"(?:T(?=\d)(?:(?P<hours>\d+)H)?(?:(?P<minutes>\d+)M)?(?:(?P<seconds>\d+(?:\.\d+)?)S)?)?",
    re.ASCII | re.IGNORECASE,
)
# .NET TimeSpan text ([d.]hh:mm:ss[.fffffff]), which some tools write into the same fields.
_TIMESPAN_RE = re.compile(
    r"(?:(?P<days>\d+)\.)?(?P<hours>\d{1,2}):(?P<minutes>\d{1,2}):(?P<seconds>\d{1,2}(?:\.\d+)?)",
    re.ASCII,
)


def parse_duration_ms(text: str) -> int | None:
    """Milliseconds of an ISO 8601 duration (PT1M, P14D, PT0.5S...), None for TimeSpan.MaxValue
    and anything as long (unbounded). Years count 365 days and months 30, as .NET's XmlConvert.
    Raises ValueError for text that is not a duration."""
    text = text.strip()
    m = _DURATION_RE.fullmatch(text) or _TIMESPAN_RE.fullmatch(text)
    if m is None:
        raise ValueError(f"{text!r} is not an ISO 8601 duration such as PT1M, PT30S or P14D")
    parts = {k: v for k, v in m.groupdict().items() if v is not None}
    days = (
        int(parts.get("years", 0)) * 365
        + int(parts.get("months", 0)) * 30
        + int(parts.get("weeks", 0)) * 7
        + int(parts.get("days", 0))
    )
    if days >= _TIMESPAN_MAX_DAYS:
        return None
    seconds = float(parts.get("seconds", "0"))
    total_ms = (
        days * 86_400_000
        + int(parts.get("hours", 0)) * 3_600_000
        + int(parts.get("minutes", 0)) * 60_000
        + round(seconds * 1000)
    )
    if total_ms >= _TIMESPAN_MAX_DAYS * 86_400_000:
        return None
    return total_ms
