"""How an entity property's value is read and written: its types (durations, decimals, flags,
entity names, shared access rules, ...), checked against its bounds, and durations as .NET
writes them (docs/design.md §3.14).

`Property` is one row of the table of busd.entities.properties; this module knows nothing of
which properties there are. Values are in the property's own unit, as Service Bus spells it
(see busd.entities.properties).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from busd.entities import access_rules
from busd.entities.values import normalize_forward_target, parse_duration_ms
from busd.errors import ConfigError

# Types: how a value is read and written.
BOOL = "bool"
INT = "int"
NUMBER = "number"  # a decimal number (float), as `1.5`
DURATION = "duration"  # ISO 8601 / TimeSpan text; milliseconds, None for unbounded
TEXT = "text"
STATUS = "status"  # one of STATUSES
ENTITY = "entity"  # a queue or topic of the namespace, by name or URL: a bare path
ACCESS_RULES = "access rules"  # a list of shared access rules (busd.entities.access_rules)
STATUSES = ("Active", "Disabled", "SendDisabled", "ReceiveDisabled")
_RULE_TIMES = ("CreatedTime", "ModifiedTime")  # a shared access rule's, made at its creation
_RULE_DEFAULTS = {"ClaimType": access_rules.CLAIM_TYPE, "ClaimValue": "None"}


@dataclass(frozen=True)
class Property:
    name: str  # Service Bus's: the entities file's key and the management API's element
    type: str
    kinds: tuple[str, ...]
    default: Any = None  # what an entity that does not set it has (in the property's unit)
    attr: str | None = None  # the record field; None: kept in `extra` and answered back
    minimum: int | None = None  # inclusive bounds, in the property's unit
    maximum: int | None = None
    bounds: str = ""  # the bounds as people read them, for error messages
    # the management API's floor where Service Bus's tier (Premium, docs/management.md §3.2)
    # asks more than the entities file; a change may send a value below it back unchanged
    api_minimum: int | None = None
    unbounded: bool = True  # a duration may be TimeSpan.MaxValue (None)
    scale: int = 1  # record field = value * scale
    enabled_by: str | None = None  # the flag without which the field is off (None)
    store: bool = False  # the store's calls carry it (QueueSpec, the Lua scripts' arguments)
    immutable: bool = False  # a change may not alter it (the service refuses it too)
    flag: str | None = None  # command-line option, without `--`
    help: str = ""
    # busd's own, not Service Bus's: the management API writes it only when it is not the
    # default, so that a description stays the service's for entities that do not use it
    own: bool = False
    # the kinds (q, t, s) whose entries in the emulator's own Config.json set it: `busd config
    # export` writes it for them always, so the file reads as the emulator's does
    emulator: str = ""

    @property
    def field_default(self) -> Any:
        """The record field's default."""
        return self.to_field(self.default)

    def to_field(self, value: Any) -> Any:
        """The record field's value of the property's."""
        return value * self.scale if self.scale != 1 and value is not None else value

    # --- reading ------------------------------------------------------------------------------
    def from_text(self, text: str) -> Any:
        """The value of the XML element's text; ConfigError when it is not one."""
        text = text.strip()
        if self.type == BOOL:
            if text.lower() not in ("true", "false"):
                raise ConfigError(f"{self.name} must be true or false, got {text!r}")
            return text.lower() == "true"
        if self.type == INT:
            try:
                value = int(text)
            except ValueError:
                raise ConfigError(f"{self.name} must be a whole number, got {text!r}") from None
            if not -(2**63) <= value < 2**63:
                raise ConfigError(f"{self.name} is out of range: {text}")
            return value
        if self.type == NUMBER:
            return self._number(text)
        return self._from_string(text)

    def _number(self, value: Any) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{self.name} must be a number, got {value!r}") from None
        if not math.isfinite(number):
            raise ConfigError(f"{self.name} must be a finite number, got {value!r}")
        return number

    def from_json(self, value: Any) -> Any:
        """The value of the entities file's JSON value; ConfigError when it is not one."""
        if self.type == BOOL:
            if isinstance(value, str) and value.lower() in ("true", "false"):
                return value.lower() == "true"
            if not isinstance(value, bool):
                raise ConfigError(f"{self.name} must be true or false, got {value!r}")
            return value
        if self.type == INT:
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{self.name} must be a whole number, got {value!r}")
            return value
        if self.type == ACCESS_RULES:
            return access_rules.normalize(value)
        if self.type == NUMBER:
            if isinstance(value, bool) or not isinstance(value, (int, float, str)):
                raise ConfigError(f"{self.name} must be a number, got {value!r}")
            return self._number(value)
        if not isinstance(value, str):
            what = {DURATION: "an ISO 8601 duration string", ENTITY: "an entity name"}.get(
                self.type, "a string"
            )
            raise ConfigError(f"{self.name} must be {what}, got {value!r}")
        return self._from_string(value)

    def _from_string(self, text: str) -> Any:
        if self.type == DURATION:
            try:
                return parse_duration_ms(text)
            except ValueError as exc:
                raise ConfigError(f"{self.name}: {exc}") from None
        if self.type == STATUS:
            for status in STATUSES:
                if status.lower() == text.strip().lower():
                    return status
            raise ConfigError(f"{self.name} must be one of {', '.join(STATUSES)}, got {text!r}")
        if self.type == ENTITY:
            return normalize_forward_target(text, self.name)
        return text

    def check(self, value: Any, api: bool = False) -> None:
        """ConfigError when the value is out of the property's bounds (`api`: the management
        API's)."""
        if value is None:
            if self.type == DURATION and not self.unbounded:
                raise ConfigError(f"{self.name} must be {self.bounds}, got an unbounded duration")
            return
        if self.type == TEXT:  # bounded in characters (UserMetadata: Service Bus's 1024)
            if self.maximum is not None and len(value) > self.maximum:
                raise ConfigError(f"{self.name} must be {self.bounds}, got {len(value)}")
            return
        minimum, bounds = self.minimum, self.bounds
        if api and self.api_minimum is not None:
            minimum, bounds = self.api_minimum, f"{self.api_minimum}..{self.maximum}"
        if (minimum is not None and value < minimum) or (
            self.maximum is not None and value > self.maximum
        ):
            shown = format_duration(value) if self.type == DURATION else value
            raise ConfigError(f"{self.name} must be {bounds}, got {shown}")

    # --- writing ------------------------------------------------------------------------------
    def to_json(self, value: Any) -> Any:
        """The entities file's JSON value, which from_json reads back (`busd config export`):
        an unset duration or entity name as "", as the emulator writes it; a shared access
        rule without its times, which busd keeps from start to start."""
        if value is None:
            return "" if self.type in (DURATION, ENTITY) else None
        if self.type == DURATION:
            return format_duration(value)
        if self.type == ACCESS_RULES:
            return [
                {
                    k: v
                    for k, v in rule.items()
                    if v is not None and k not in _RULE_TIMES and _RULE_DEFAULTS.get(k) != v
                }
                for rule in value
            ]
        return value

    def to_text(self, value: Any) -> str:
        if self.type == DURATION:
            return format_duration(value)
        if self.type == BOOL:
            return "true" if value else "false"
        if self.type == NUMBER:
            return f"{value:g}"
        return str(value)


# --- durations as .NET writes them ------------------------------------------------------------

# .NET's TimeSpan.MaxValue: how the service spells an unbounded duration.
UNBOUNDED = "P10675199DT2H48M5.4775807S"


def format_duration(ms: int | None) -> str:
    """xs:duration as .NET writes it: PT1M, PT30S, P14D, PT0.5S; None is TimeSpan.MaxValue."""
    if ms is None:
        return UNBOUNDED
    days, rest = divmod(ms, 86_400_000)
    hours, rest = divmod(rest, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    seconds, millis = divmod(rest, 1000)
    text = "P" + (f"{days}D" if days else "")
    clock = (f"{hours}H" if hours else "") + (f"{minutes}M" if minutes else "")
    if millis:
        clock += f"{seconds}.{millis:03d}".rstrip("0") + "S"
    elif seconds:
        clock += f"{seconds}S"
    if clock:
        text += "T" + clock
    return text if text != "P" else "PT0S"
