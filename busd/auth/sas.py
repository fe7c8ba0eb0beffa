"""Shared Access Signature tokens, checked the way Service Bus checks them (docs/wire.md §3.3).

A token reads
`SharedAccessSignature sr=<enc(audience)>&sig=<enc(signature)>&se=<expiry>&skn=<enc(key name)>`,
fields in any order, `enc` being `urllib.parse.quote_plus`. The signature is
Base64(HMAC-SHA256(key, sr + "\\n" + se)) where `sr` is taken exactly as it appears in the token
(already encoded) and the key is the UTF-8 of the shared access key as written, not decoded.

Clients send tokens in a CBS `put-token`; the CBS node verifies them here and then checks each
link's entity against the token's audience with `audience_covers`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from urllib.parse import quote_plus, unquote_plus, urlencode

# The key busd serves when given none: the emulator's, so existing connection strings work
# (`SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=SAS_KEY_VALUE`).
DEFAULT_SAS_KEY_NAME = "RootManageSharedAccessKey"
DEFAULT_SAS_KEY = "SAS_KEY_VALUE"

TOKEN_PREFIX = "SharedAccessSignature "


class SasError(Exception):
    """A token was refused; `reason` says why in words fit for a client's error description."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class SasToken:
    """A parsed token. `signed_resource` is `sr` as written (what was signed); the others are
    decoded."""

    audience: str  # e.g. sb://localhost:5672/myqueue
    signed_resource: str  # e.g. sb%3A%2F%2Flocalhost%3A5672%2Fmyqueue
    signature: str  # Base64 text
    expiry: int  # seconds since the Unix epoch
    key_name: str


def parse_sas_token(token: str) -> SasToken:
    """Split a token into its fields; SasError when it is not a well-formed SAS token."""
    if not isinstance(token, str):
        raise SasError("the token must be a string")
    text = token.strip()
    if not text[: len(TOKEN_PREFIX)].lower() == TOKEN_PREFIX.lower():
        raise SasError("the token is not a SharedAccessSignature token")
    fields: dict[str, str] = {}
    for part in text[len(TOKEN_PREFIX) :].strip().split("&"):
        if not part:
            continue
        name, sep, value = part.partition("=")
        if not sep:
            raise SasError(f"malformed SharedAccessSignature field {name!r}")
        if name in fields:
            raise SasError(f"the SharedAccessSignature field {name!r} appears twice")
        fields[name] = value
    for required in ("sr", "sig", "se", "skn"):
        if not fields.get(required):
            raise SasError(f"the SharedAccessSignature token has no {required!r} field")
    if not fields["se"].isdigit():
        raise SasError(f"the token expiry 'se' must be whole seconds, got {fields['se']!r}")
    return SasToken(
        audience=unquote_plus(fields["sr"]),
        signed_resource=fields["sr"],
        signature=unquote_plus(fields["sig"]),
        expiry=int(fields["se"]),
        key_name=unquote_plus(fields["skn"]),
    )


def sign(signed_resource: str, expiry: int | str, key: str) -> str:
    """Base64 HMAC-SHA256 of `signed_resource + "\\n" + expiry`, keyed with the key as written."""
    message = f"{signed_resource}\n{expiry}".encode()
    digest = hmac.new(key.encode("utf-8"), message, hashlib.sha256).digest()
    return base64.b64encode(digest).decode("ascii")


def verify_sas_token(token: str, keys: Mapping[str, str], now: float | None = None) -> SasToken:
    """Parse and check a token: known key name, matching signature, not expired.

    Returns the parsed token (its audience is what the connection may then use), its `key_name`
    the name as `keys` spells it; raises SasError with the reason otherwise.
    """
    parsed = parse_sas_token(token)
    found = _find_key(parsed.key_name, keys)
    if found is None:
        raise SasError(f"unknown shared access key name {parsed.key_name!r}")
    key_name, key = found
    expected = sign(parsed.signed_resource, parsed.expiry, key)
    if not hmac.compare_digest(expected.encode("ascii"), parsed.signature.encode("utf-8")):
        raise SasError(
            f"the token signature does not match the key {parsed.key_name!r} "
            "(wrong SharedAccessKey?)"
        )
    current = time.time() if now is None else now
    if parsed.expiry <= current:
        raise SasError(f"the token expired at {parsed.expiry} (now {int(current)})")
    return replace(parsed, key_name=key_name)


def _find_key(key_name: str, keys: Mapping[str, str]) -> tuple[str, str] | None:
    """(the name as `keys` spells it, the key)."""
    if key_name in keys:
        return key_name, keys[key_name]
    # The SDK encodes skn twice (quote_plus, then urlencode): decode once more before giving up.
    twice = unquote_plus(key_name)
    if twice in keys:
        return twice, keys[twice]
    # Key names are case-insensitive in Service Bus.
    for name in (key_name, twice):
        for known, key in keys.items():
            if known.lower() == name.lower():
                return known, key
    return None


def entity_path_of(uri_or_path: str) -> str:
    """The entity path of an audience or address: without `scheme://host:port` and outer '/'."""
    text = uri_or_path.strip()
    scheme_end = text.find("://")
    if scheme_end >= 0:
        slash = text.find("/", scheme_end + 3)
        text = "" if slash < 0 else text[slash:]
    return text.strip("/")


def audience_covers(token_audience: str, entity_path: str) -> bool:
    """Whether a token for `token_audience` grants access to `entity_path`.

    Service Bus matches the entity path against the audience's path as a prefix, ignoring case;
    busd requires the prefix to end at a '/' boundary, so `sb://h/orders` covers `orders` and
    `orders/$DeadLetterQueue` but not `orders-archive`. A namespace-wide audience
    (`sb://host:port/`) covers every entity.
    """
    granted = entity_path_of(token_audience).lower()
    wanted = entity_path_of(entity_path).lower()
    if not granted:
        return True
    return wanted == granted or wanted.startswith(granted + "/")


def entity_of(path: str) -> str:
    """The queue or topic an entity path is within, lower-cased: the path without what Service
    Bus scopes under an entity (`/$DeadLetterQueue`, `/$Transfer/$DeadLetterQueue`,
    `/$management`, `/Subscriptions/<s>...`). A name may hold '/' (`orders/secret` is a queue of
    its own, not a part of `orders`), but no segment of it starts with '$' and only a
    single-segment name is `Subscriptions`, so the cut is unambiguous. "" for the namespace and
    its own nodes (`$cbs`, `$management`, `$Resources/...`)."""
    segments = entity_path_of(path).lower().split("/")
    for at, segment in enumerate(segments):
        if segment.startswith("$") or (at and segment == "subscriptions"):
            return "/".join(segments[:at])
    return "/".join(segments)


def generate_sas_token(audience: str, key_name: str, key: str, expiry: int) -> str:
    """A token for `audience` signed with `key`, valid until `expiry` (seconds since the epoch),
    built as the azure-servicebus SDK builds it."""
    signed_resource = quote_plus(audience)
    expiry = int(expiry)
    signature = sign(signed_resource, expiry, key)
    fields = {"sr": audience, "sig": signature, "se": str(expiry), "skn": key_name}
    return TOKEN_PREFIX + urlencode(fields)
