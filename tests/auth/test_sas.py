"""SAS tokens: verified exactly as Service Bus does (docs/wire.md §3.3), against tokens the SDK
makes."""

import time
from urllib.parse import quote_plus

import pytest
from azure.servicebus._base_handler import ServiceBusSharedKeyCredential
from azure.servicebus._pyamqp.utils import generate_sas_token as sdk_generate_sas_token

from busd.auth.sas import (
    SasError,
    audience_covers,
    entity_of,
    generate_sas_token,
    parse_sas_token,
    sign,
    verify_sas_token,
)

KEYS = {"RootManageSharedAccessKey": "SAS_KEY_VALUE"}
CHECK_AUDIENCE = "sb://localhost:5790/myqueue"
CHECK_EXPIRY = 1795309517
CHECK_SIGNATURE = "dv8dUhuWF6tWu+VOdczRx2RAXOW207a96y6ZpuPZEDQ="
FUTURE = int(time.time()) + 3600


def test_spec_check_vector():
    assert sign(quote_plus(CHECK_AUDIENCE), CHECK_EXPIRY, "SAS_KEY_VALUE") == CHECK_SIGNATURE
    token = generate_sas_token(
        CHECK_AUDIENCE, "RootManageSharedAccessKey", "SAS_KEY_VALUE", CHECK_EXPIRY
    )
    parsed = verify_sas_token(token, KEYS, now=CHECK_EXPIRY - 10)
    assert parsed.signature == CHECK_SIGNATURE
    assert parsed.audience == CHECK_AUDIENCE
    assert parsed.signed_resource == "sb%3A%2F%2Flocalhost%3A5790%2Fmyqueue"
    assert parsed.expiry == CHECK_EXPIRY
    assert parsed.key_name == "RootManageSharedAccessKey"


def test_our_tokens_are_the_sdks_tokens():
    ours = generate_sas_token(
        CHECK_AUDIENCE, "RootManageSharedAccessKey", "SAS_KEY_VALUE", CHECK_EXPIRY
    )
    theirs = sdk_generate_sas_token(
        CHECK_AUDIENCE, "RootManageSharedAccessKey", "SAS_KEY_VALUE", CHECK_EXPIRY
    )
    assert ours == theirs


def test_token_from_the_sdk_connection_string_credential_verifies():
    credential = ServiceBusSharedKeyCredential("RootManageSharedAccessKey", "SAS_KEY_VALUE")
    access = credential.get_token("sb://localhost:5672/orders")
    parsed = verify_sas_token(access.token, KEYS)
    assert parsed.audience == "sb://localhost:5672/orders"
    assert parsed.expiry == access.expires_on


def test_sdk_token_with_special_characters_in_key_name_and_key():
    keys = {"my policy+1": "k3y/with=odd+chars"}
    token = sdk_generate_sas_token("sb://h:1/q", "my policy+1", "k3y/with=odd+chars", FUTURE)
    assert verify_sas_token(token, keys).audience == "sb://h:1/q"


def test_fields_in_any_order():
    token = generate_sas_token("sb://h:1/q", "RootManageSharedAccessKey", "SAS_KEY_VALUE", FUTURE)
    fields = token.removeprefix("SharedAccessSignature ").split("&")
    reordered = "SharedAccessSignature " + "&".join(reversed(fields))
    assert verify_sas_token(reordered, KEYS).audience == "sb://h:1/q"


def test_wrong_key_is_refused():
    token = generate_sas_token("sb://h:1/q", "RootManageSharedAccessKey", "not-the-key", FUTURE)
    with pytest.raises(SasError, match="signature does not match"):
        verify_sas_token(token, KEYS)


def test_unknown_key_name_is_refused():
    token = generate_sas_token("sb://h:1/q", "SomeoneElse", "SAS_KEY_VALUE", FUTURE)
    with pytest.raises(SasError, match="unknown shared access key name 'SomeoneElse'"):
        verify_sas_token(token, KEYS)


def test_key_name_is_case_insensitive():
    token = generate_sas_token("sb://h:1/q", "rootmanagesharedaccesskey", "SAS_KEY_VALUE", FUTURE)
    verify_sas_token(token, KEYS)


def test_expired_token_is_refused():
    token = generate_sas_token("sb://h:1/q", "RootManageSharedAccessKey", "SAS_KEY_VALUE", 1000)
    with pytest.raises(SasError, match="expired"):
        verify_sas_token(token, KEYS, now=1000)
    verify_sas_token(token, KEYS, now=999)


def test_tampered_audience_is_refused():
    token = generate_sas_token("sb://h:1/q", "RootManageSharedAccessKey", "SAS_KEY_VALUE", FUTURE)
    tampered = token.replace("%2Fq&", "%2Fother&")
    with pytest.raises(SasError, match="signature"):
        verify_sas_token(tampered, KEYS)


def test_signature_is_checked_on_sr_as_written_not_re_encoded():
    # Another client may encode with lower-case hex; the signature covers its spelling.
    sr = "sb%3a%2f%2fh%3a1%2fq"
    sig = quote_plus(sign(sr, FUTURE, "SAS_KEY_VALUE"))
    token = f"SharedAccessSignature sr={sr}&sig={sig}&se={FUTURE}&skn=RootManageSharedAccessKey"
    assert verify_sas_token(token, KEYS).audience == "sb://h:1/q"


@pytest.mark.parametrize(
    "token, reason",
    [
        ("Bearer abc", "not a SharedAccessSignature"),
        ("SharedAccessSignature sig=a&se=1&skn=k", "'sr'"),
        ("SharedAccessSignature sr=a&se=1&skn=k", "'sig'"),
        ("SharedAccessSignature sr=a&sig=b&skn=k", "'se'"),
        ("SharedAccessSignature sr=a&sig=b&se=1", "'skn'"),
        ("SharedAccessSignature sr=a&sig=b&se=soon&skn=k", "whole seconds"),
        ("SharedAccessSignature sr=a&sr=b&sig=b&se=1&skn=k", "twice"),
        ("SharedAccessSignature sr", "malformed"),
    ],
)
def test_malformed_tokens_say_why(token, reason):
    with pytest.raises(SasError, match=reason) as info:
        parse_sas_token(token)
    assert info.value.reason


@pytest.mark.parametrize(
    "audience, entity, covered",
    [
        ("sb://localhost:5672/myqueue", "myqueue", True),
        ("sb://localhost:5672/MyQueue", "myqueue", True),
        ("sb://localhost:5672/myqueue", "MYQUEUE/$DeadLetterQueue", True),
        ("sb://localhost:5672/myqueue", "myqueue/$management", True),
        ("sb://localhost:5672/myqueue/$DeadLetterQueue", "myqueue/$deadletterqueue", True),
        ("sb://localhost:5672/myqueue/$DeadLetterQueue", "myqueue", False),
        ("sb://localhost:5672/myqueue", "otherqueue", False),
        ("sb://localhost:5672/myqueue", "myqueue-archive", False),
        ("sb://localhost:5672/", "anything/at/all", True),
        ("sb://localhost:5672", "anything", True),
        ("sb://localhost:5672/t", "t/Subscriptions/s", True),
        ("sb://localhost:5672/myqueue", "amqps://localhost:5672/myqueue", True),
    ],
)
def test_audience_covers(audience, entity, covered):
    assert audience_covers(audience, entity) is covered


@pytest.mark.parametrize(
    "path, entity",
    [
        ("orders", "orders"),
        ("Orders/Secret", "orders/secret"),  # a queue of its own, not a part of `orders`
        ("orders/secret/$DeadLetterQueue", "orders/secret"),
        ("orders/$Transfer/$DeadLetterQueue", "orders"),
        ("orders/secret/$management", "orders/secret"),
        ("t/Subscriptions/s", "t"),
        ("t/x/subscriptions/s/$DeadLetterQueue/$management", "t/x"),
        ("t/Subscriptions/s/Rules/r", "t"),  # a rule's management (ATOM) path
        ("subscriptions", "subscriptions"),  # a queue may be named that, alone
        ("sb://localhost:5672/orders/secret", "orders/secret"),
        ("", ""),
        ("$cbs", ""),
        ("$Resources/queues", ""),
    ],
)
def test_entity_of(path, entity):
    assert entity_of(path) == entity
