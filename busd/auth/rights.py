"""Rights of shared access keys, and the one check of a token against what a request needs
(docs/design.md §2.10).

As in Service Bus, a shared access key carries claims: `Send`, `Listen`, `Manage`. `Manage`
implies the other two. A key given without claims, and the emulator's root key, carry all three.
A request needs a verified token whose audience covers the entity it acts on, signed with a key
holding the right it needs; `authorize` is that check, for AMQP links, `$management` operations
and the HTTP APIs alike.

A key is kept as a `SasKey`: the key text itself (a `str`, so everything that signs or verifies
with it is unchanged) that also carries its claims.

Besides the namespace's keys, a queue or topic may have its own shared access rules
(`AuthorizationRules`, docs/design.md §2.10): a token signed with one of a rule's two keys, under
the rule's KeyName, is accepted for an audience on that entity (or what Service Bus scopes under
it: its dead-letter sub-queue, its `$management` node, a topic's subscriptions) only, with the
rule's rights. The entity is the one the audience names exactly (`sas.entity_of`): names may
hold '/', so `orders/secret` is another queue than `orders`, and neither's keys open the other.
`EntityKeys` looks an entity's rules up (the catalog's in-process view: no store call), so a
rule removed or a key regenerated refuses the next token signed with it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from busd.auth.sas import (
    SasError,
    audience_covers,
    entity_of,
    entity_path_of,
    parse_sas_token,
    verify_sas_token,
)

SEND = "Send"
LISTEN = "Listen"
MANAGE = "Manage"
ALL_RIGHTS: frozenset[str] = frozenset((SEND, LISTEN, MANAGE))
_BY_LOWER = {right.lower(): right for right in ALL_RIGHTS}


class Unauthorized(Exception):
    """A request was refused; `reason` is fit for the client's error description."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class SasKey(str):
    """A shared access key (its text) with the claims of its rule."""

    claims: frozenset[str]

    def __new__(cls, key: str, claims: Iterable[str] = ALL_RIGHTS) -> SasKey:
        self = super().__new__(cls, key)
        self.claims = frozenset(claims)
        return self


def parse_rights(text: str) -> frozenset[str]:
    """`Send,Listen` (any case, `,` or `|` between) as a set of rights; ValueError otherwise."""
    names = [part.strip() for part in text.replace("|", ",").split(",")]
    rights = set()
    for name in names:
        right = _BY_LOWER.get(name.lower())
        if right is None:
            raise ValueError(f"unknown right {name!r}: rights are Send, Listen and Manage")
        rights.add(right)
    return frozenset(rights)


def parse_key(spec: str) -> tuple[str, SasKey]:
    """`NAME=KEY` or `NAME=KEY:Send,Listen` as (name, key with its claims); ValueError otherwise.

    Service Bus keys are Base64 (no `:`), so the last `:` starts the claims."""
    name, sep, rest = spec.partition("=")
    if not sep or not name or not rest:
        raise ValueError(f"a key is NAME=KEY or NAME=KEY:Send,Listen,Manage, got {spec!r}")
    key, colon, claims = rest.rpartition(":")
    if not colon:
        return name, SasKey(rest)
    if not key:
        raise ValueError(f"the key {name!r} is empty")
    return name, SasKey(key, parse_rights(claims))


def claims_of(keys: Mapping[str, str], key_name: str) -> frozenset[str]:
    """The claims of the key named `key_name` (as `verify_sas_token` found it): all three for a
    key given without claims."""
    return getattr(keys.get(key_name), "claims", ALL_RIGHTS)


def allows(claims: frozenset[str], right: str | None) -> bool:
    """Whether `claims` grant `right` (None: any claim at all). Manage implies the others."""
    if right is None:
        return bool(claims)
    return right in claims or MANAGE in claims


@dataclass(frozen=True, slots=True)
class Grant:
    """What a verified token lets its bearer do: act on `audience` with `claims` until `expiry`
    (seconds since the Unix epoch). `entity`: for a token signed with an entity's own key, that
    queue or topic (lower-cased), the only one the grant reaches whatever its audience covers;
    None for a namespace key's."""

    audience: str
    expiry: float
    claims: frozenset[str]
    entity: str | None = None
    # the audience's entity path, parsed once: every attach of the connection asks `covers`
    path: str = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", _path(self.audience))

    @property
    def namespace_wide(self) -> bool:
        return not self.path

    def covers(self, entity_path: str) -> bool:
        if self.entity is not None and entity_of(entity_path) != self.entity:
            return False  # another entity, even one whose name starts with this one's
        return audience_covers(self.path, entity_path)


def _path(audience: str) -> str:
    # Some SDKs sign an HTTP audience with its query string (`...?api-version=...`).
    return entity_path_of(audience.partition("?")[0])


# An entity's own keys (queue or topic name, any case) -> its rules' keys: the primary keys by
# KeyName, then the secondary keys by KeyName; () when it has no rules (or does not exist).
EntityKeys = Callable[[str], tuple[Mapping[str, str], ...]]


def rule_keys(rules: Iterable[Mapping[str, Any]]) -> tuple[dict[str, SasKey], dict[str, SasKey]]:
    """The keys of an entity's `AuthorizationRules` (entities.access_rules' dicts), as `EntityKeys`
    answers them: (primary keys by KeyName, secondary keys by KeyName), each with its rights."""
    primary: dict[str, SasKey] = {}
    secondary: dict[str, SasKey] = {}
    for rule in rules:
        claims = frozenset(rule.get("Rights") or ())
        for keys, field_name in ((primary, "PrimaryKey"), (secondary, "SecondaryKey")):
            if rule.get(field_name):
                keys[rule["KeyName"]] = SasKey(rule[field_name], claims)
    return primary, secondary


def grant_of(
    token: str,
    keys: Mapping[str, str],
    now: float | None = None,
    entity_keys: EntityKeys | None = None,
) -> Grant:
    """Verify `token` (busd.auth.sas) with the namespace's `keys`, else with the own keys of the
    entity its audience names (`entity_keys`), and return what it grants; SasError when it is
    refused."""
    try:
        parsed = verify_sas_token(token, keys, now)
    except SasError:
        grant = None if entity_keys is None else _entity_grant(token, entity_keys, now)
        if grant is None:
            raise
        return grant
    return Grant(parsed.audience, parsed.expiry, claims_of(keys, parsed.key_name))


def audience_entity(token: str) -> str:
    """The queue or topic a token's audience names, the only one whose own keys may sign it
    (lower-cased; "" for a namespace-wide audience). SasError when it is not a token."""
    # The entity the audience names exactly, not its first segment: `orders/secret` is a queue
    # of its own, which `orders`' keys must not open (docs/design.md §2.10).
    return entity_of(_path(parse_sas_token(token).audience))


def _entity_grant(token: str, entity_keys: EntityKeys, now: float | None) -> Grant | None:
    """The grant of a token signed with a key of the entity its audience names; None when that
    entity has no rule of the token's key name (the namespace's refusal then stands), SasError
    when it has one and neither of its keys signed the token."""
    entity = audience_entity(token)
    if not entity:  # a namespace-wide audience: only the namespace's keys sign those
        return None
    refusal: SasError | None = None
    for keys in entity_keys(entity):
        try:
            verified = verify_sas_token(token, keys, now)
        except SasError as exc:
            refusal = refusal if exc.reason.startswith("unknown") else exc
            continue
        claims = claims_of(keys, verified.key_name)
        return Grant(verified.audience, verified.expiry, claims, entity=entity)
    if refusal is not None:
        raise refusal
    return None


def authorize(grant: Grant, entity_path: str, right: str | None, now: float | None = None) -> None:
    """Raise Unauthorized unless `grant` is live, covers `entity_path` (the empty path: the whole
    namespace) and carries `right` (None: any)."""
    current = time.time() if now is None else now
    if grant.expiry <= current:
        raise Unauthorized(f"the token expired at {int(grant.expiry)}")
    wanted = entity_path.strip("/")
    if not (grant.covers(wanted) if wanted else grant.namespace_wide):
        if grant.entity is not None:
            raise Unauthorized(
                f"the token is signed with a key of {grant.entity!r}, which does not cover "
                f"{repr(wanted) if wanted else 'the namespace'}"
            )
        raise Unauthorized(
            f"the token's audience {grant.audience!r} does not cover "
            f"{repr(wanted) if wanted else 'the namespace'}"
        )
    if not allows(grant.claims, right):
        raise Unauthorized(missing_claim(right))


def missing_claim(right: str | None) -> str:
    return f"'{right or 'Send, Listen or Manage'}' claim(s) are required to perform this operation"


def authorize_header(
    authorization: str,
    keys: Mapping[str, str],
    entity_path: str,
    right: str | None,
    entity_keys: EntityKeys | None = None,
) -> Grant:
    """The check of an HTTP request: the `Authorization` header's SAS token verified (with the
    namespace's keys or those of the entity it names), covering `entity_path` with `right`.
    Raises Unauthorized (answer 401, as Service Bus does)."""
    try:
        grant = grant_of(authorization, keys, entity_keys=entity_keys)
    except SasError as exc:
        raise Unauthorized(exc.reason) from None
    authorize(grant, entity_path, right)
    return grant
