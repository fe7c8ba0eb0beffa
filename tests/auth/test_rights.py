"""Rights of shared access keys (docs/design.md §2.10): claims parsed from `--sas-key`, and the
one check of a token against an entity and a right (busd.auth.rights)."""

import time

import pytest

from busd.auth.rights import (
    ALL_RIGHTS,
    LISTEN,
    MANAGE,
    SEND,
    Unauthorized,
    authorize,
    authorize_header,
    grant_of,
    parse_key,
    rule_keys,
)
from busd.auth.sas import SasError, generate_sas_token

FUTURE = int(time.time()) + 3600


@pytest.mark.parametrize(
    "spec, name, key, claims",
    [
        (
            "RootManageSharedAccessKey=SAS_KEY_VALUE",
            "RootManageSharedAccessKey",
            "SAS_KEY_VALUE",
            ALL_RIGHTS,
        ),
        ("reader=abc+/=:Listen", "reader", "abc+/=", {LISTEN}),
        ("app=k==:send, LISTEN", "app", "k==", {SEND, LISTEN}),
        ("ops=k:Manage", "ops", "k", {MANAGE}),
        ("a=b=c:Send|Listen", "a", "b=c", {SEND, LISTEN}),
    ],
)
def test_keys_parse_with_their_claims(spec, name, key, claims):
    parsed_name, parsed_key = parse_key(spec)
    assert (parsed_name, str(parsed_key), parsed_key.claims) == (name, key, frozenset(claims))


@pytest.mark.parametrize("spec", ["noequals", "=k", "n=", "n=k:Read", "n=:Send", "n=k:"])
def test_bad_key_specs_are_refused(spec):
    with pytest.raises(ValueError):
        parse_key(spec)


def keys():
    return dict(
        [
            parse_key("RootManageSharedAccessKey=root"),
            parse_key("reader=r:Listen"),
            parse_key("writer=w:Send"),
            parse_key("ops=m:Manage"),
        ]
    )


def token(audience, name, key, expiry=FUTURE):
    return generate_sas_token(audience, name, key, expiry)


def test_grant_carries_the_claims_of_the_key_whatever_the_case_of_its_name():
    grant = grant_of(token("sb://h/q", "READER", "r"), keys())
    assert grant.claims == {LISTEN}
    assert (
        grant_of(token("sb://h/q", "RootManageSharedAccessKey", "root"), keys()).claims
        == ALL_RIGHTS
    )
    # Keys given as plain strings (no claims) keep every right.
    assert grant_of(token("sb://h/q", "k", "v"), {"k": "v"}).claims == ALL_RIGHTS


def test_authorize_checks_audience_right_and_expiry():
    ring = keys()
    reader = grant_of(token("sb://h/orders", "reader", "r"), ring)
    authorize(reader, "orders", LISTEN)
    authorize(reader, "orders/$DeadLetterQueue", LISTEN)
    with pytest.raises(Unauthorized, match="'Send' claim"):
        authorize(reader, "orders", SEND)
    with pytest.raises(Unauthorized, match="does not cover 'other'"):
        authorize(reader, "other", LISTEN)
    with pytest.raises(Unauthorized, match="does not cover the namespace"):
        authorize(reader, "", LISTEN)
    with pytest.raises(Unauthorized, match="expired"):
        authorize(reader, "orders", LISTEN, now=FUTURE + 1)
    ops = grant_of(token("sb://h/", "ops", "m"), ring)  # Manage implies Send and Listen
    for right in (SEND, LISTEN, MANAGE):
        authorize(ops, "anything", right)
        authorize(ops, "", right)
    writer = grant_of(token("https://h/orders?api-version=2021-05", "writer", "w"), ring)
    authorize(writer, "orders", SEND)
    with pytest.raises(Unauthorized, match="'Manage' claim"):
        authorize(writer, "orders", MANAGE)


def test_authorize_header_refuses_bad_tokens_with_the_reason():
    with pytest.raises(Unauthorized, match="signature"):
        authorize_header(token("sb://h/", "ops", "wrong"), keys(), "q", MANAGE)
    with pytest.raises(Unauthorized, match="not a SharedAccessSignature"):
        authorize_header("", keys(), "q", MANAGE)
    grant = authorize_header(token("sb://h/q", "ops", "m"), keys(), "q", MANAGE)
    assert grant.claims == {MANAGE}


def test_an_entity_key_opens_its_entity_only_not_one_sharing_its_name_prefix():
    """`orders` and `orders/secret` are two queues, each with a rule named `owner`: each key
    opens its own queue and what is scoped under it, whatever audience it signs."""
    rules = {
        "orders": rule_keys([{"KeyName": "owner", "PrimaryKey": "o", "Rights": [MANAGE]}]),
        "orders/secret": rule_keys([{"KeyName": "owner", "PrimaryKey": "s", "Rights": [MANAGE]}]),
    }

    def entity_keys(name):
        return rules.get(name, ())

    def grant(audience, key):
        return grant_of(token(audience, "owner", key), {}, entity_keys=entity_keys)

    orders = grant("sb://h/orders", "o")
    for path in ("orders", "orders/$DeadLetterQueue", "orders/$management"):
        authorize(orders, path, MANAGE)
    for path in ("orders/secret", "orders/secret/$DeadLetterQueue", "orders/evil"):
        with pytest.raises(Unauthorized, match="signed with a key of 'orders'"):
            authorize(orders, path, LISTEN)
    # signed for the other entity: that entity's keys verify it, and refuse orders' key
    with pytest.raises(SasError, match="signature does not match"):
        grant("sb://h/orders/secret", "o")
    with pytest.raises(SasError, match="unknown shared access key"):
        grant("sb://h/orders/evil", "o")
    secret = grant("sb://h/orders/secret", "s")
    authorize(secret, "orders/secret/$DeadLetterQueue", LISTEN)
    with pytest.raises(Unauthorized):
        authorize(secret, "orders", LISTEN)
