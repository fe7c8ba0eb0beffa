"""A queue's or topic's own shared access authorization rules (`AuthorizationRules`), as Service
Bus describes them: a key name, its rights, two keys and two times per rule.

busd keeps them, answers them back (docs/management.md §3.2) and accepts tokens signed with
their keys for their entity (busd.auth.rights, docs/design.md §2.10). A rule is kept as a
JSON-able dict by the element names of its description (`KeyName`, `Rights`, ...), times in
milliseconds since the epoch.

The entities file is read at every start: keys and times it leaves out are taken from the rule
of the same KeyName already stored (`kept`), so a key made once survives restarts.
"""

from __future__ import annotations

import base64
import datetime as dt
import secrets
import time
from typing import Any

from busd.errors import ConfigError

RIGHTS = ("Manage", "Send", "Listen")
RULE_TYPE = "SharedAccessAuthorizationRule"
CLAIM_TYPE = "SharedAccessKey"
KEY_NAME_MAX_LENGTH = 256  # Service Bus's
FIELDS = (
    "ClaimType",
    "ClaimValue",
    "Rights",
    "CreatedTime",
    "ModifiedTime",
    "KeyName",
    "PrimaryKey",
    "SecondaryKey",
)  # in the order the service writes them


def normalize(value: Any, fill: bool = True) -> list[dict[str, Any]]:
    """The rules of a list of rule descriptions (from the entities file or the management API);
    ConfigError naming what is wrong. A key not given is made, as the service makes one; a
    time not given is now. Without `fill` both are left None (the entities file's: `kept`
    fills them)."""
    if not isinstance(value, list):
        raise ConfigError("AuthorizationRules must be a list of rules")
    rules: list[dict[str, Any]] = []
    seen: set[str] = set()
    for raw in value:
        rule = _rule(raw, fill)
        if rule["KeyName"].lower() in seen:
            raise ConfigError(f"AuthorizationRules: KeyName {rule['KeyName']!r} is given twice")
        seen.add(rule["KeyName"].lower())
        rules.append(rule)
    return rules


def _rule(raw: Any, fill: bool) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ConfigError(f"AuthorizationRules: each rule must be an object, got {raw!r}")
    unknown = sorted(set(raw) - set(FIELDS) - {"Type"})
    if unknown:
        raise ConfigError(
            f"AuthorizationRules: unknown field {unknown[0]!r}: a rule has {', '.join(FIELDS)}"
        )
    name = raw.get("KeyName")
    if not isinstance(name, str) or not 1 <= len(name) <= KEY_NAME_MAX_LENGTH:
        raise ConfigError(
            f"AuthorizationRules: each rule needs a KeyName of 1.."
            f"{KEY_NAME_MAX_LENGTH} characters, got {name!r}"
        )
    label = f"AuthorizationRules: rule {name!r}"
    if raw.get("Type", RULE_TYPE) != RULE_TYPE:
        raise ConfigError(f"{label}: only {RULE_TYPE} rules are supported")
    rights = raw.get("Rights")
    if not isinstance(rights, list) or not rights:
        raise ConfigError(f"{label}: Rights must list one or more of {', '.join(RIGHTS)}")
    named: list[str] = []
    for right in rights:
        match = next(
            (r for r in RIGHTS if isinstance(right, str) and r.lower() == right.lower()), None
        )
        if match is None:
            raise ConfigError(f"{label}: unknown right {right!r}: rights are {', '.join(RIGHTS)}")
        if match not in named:
            named.append(match)
    rule: dict[str, Any] = {
        "KeyName": name,
        "ClaimType": _text(raw, "ClaimType", label, CLAIM_TYPE),
        "ClaimValue": _text(raw, "ClaimValue", label, "None"),
        "Rights": named,
        "CreatedTime": _time(raw.get("CreatedTime"), label, "CreatedTime", None),
        "ModifiedTime": _time(raw.get("ModifiedTime"), label, "ModifiedTime", None),
        "PrimaryKey": _text(raw, "PrimaryKey", label, None),
        "SecondaryKey": _text(raw, "SecondaryKey", label, None),
    }
    return _filled(rule) if fill else rule


def _filled(rule: dict[str, Any], before: dict[str, Any] | None = None) -> dict[str, Any]:
    """`rule` with what it leaves out taken from `before` (the stored rule of its KeyName),
    else made: keys as the service makes them, times now."""
    before = before or {}
    filled = dict(rule)
    for name in ("PrimaryKey", "SecondaryKey"):
        filled[name] = rule[name] or before.get(name) or new_key()
    created = rule["CreatedTime"] or before.get("CreatedTime") or int(time.time() * 1000)
    filled["CreatedTime"] = created
    filled["ModifiedTime"] = rule["ModifiedTime"] or before.get("ModifiedTime") or created
    return filled


def kept(rules: list[dict[str, Any]], stored: Any) -> list[dict[str, Any]]:
    """The entities file's `rules` (read without `fill`) with the keys and times they leave out
    taken from the `stored` rules of the same KeyName (any case), else made: a key made for a
    rule the file declares without one is kept from start to start."""
    by_name = {
        rule.get("KeyName", "").lower(): rule for rule in stored or () if isinstance(rule, dict)
    }
    return [_filled(rule, by_name.get(rule["KeyName"].lower())) for rule in rules]


def new_key() -> str:
    """A key as Service Bus makes them: 32 random bytes in base64."""
    return base64.b64encode(secrets.token_bytes(32)).decode()


def _text(raw: dict, key: str, label: str, default: str | None) -> str | None:
    value = raw.get(key)
    if value is None or value == "":
        return default
    if not isinstance(value, str):
        raise ConfigError(f"{label}: {key} must be a string, got {value!r}")
    return value


def _time(value: Any, label: str, key: str, default: int | None) -> int | None:
    """Milliseconds of an ISO 8601 time (as the API writes them) or of a number of them; the
    SDKs' `0001-01-01` (no time) is `default`."""
    if value is None or value == "" or (isinstance(value, str) and value.startswith("0001-")):
        return default
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            parsed = dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            pass
        else:
            if parsed.tzinfo is None:
                parsed = parsed.replace(tzinfo=dt.UTC)
            return int(parsed.timestamp() * 1000)
    raise ConfigError(f"{label}: {key} must be an ISO 8601 time, got {value!r}")
