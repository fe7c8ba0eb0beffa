"""Link addresses in every form the SDKs send (docs/wire.md §2.1, §2.2, §8.1, §3.1)."""

import pytest

from busd.amqp.addresses import Address, AddressError, parse_address
from busd.errors import BusdError, Condition


@pytest.mark.parametrize(
    "address, expected",
    [
        # senders and receivers of the Python SDK: scheme, host and port
        ("amqps://localhost:5672/myqueue", Address("myqueue")),
        ("amqps://localhost:5672/MyQueue", Address("myqueue")),
        ("amqp://127.0.0.1/myqueue", Address("myqueue")),
        ("sb://ns.servicebus.windows.net/myqueue/", Address("myqueue")),
        # other SDKs: bare names, with or without a leading '/'
        ("myqueue", Address("myqueue")),
        ("/myqueue", Address("myqueue")),
        ("orders.eu/incoming_1", Address("orders.eu/incoming_1")),
        # '~', as MassTransit names topics
        ("amqps://h:1/Contracts~OrderSubmitted", Address("contracts~ordersubmitted")),
        # dead-letter sub-queue, any case
        ("amqps://localhost:5672/q/$DeadLetterQueue", Address("q", sub="deadletter", dlq=True)),
        ("q/$deadletterqueue", Address("q", sub="deadletter", dlq=True)),
        ("Q/$DEADLETTERQUEUE", Address("q", sub="deadletter", dlq=True)),
        # transfer dead-letter
        (
            "amqps://localhost:5672/q/$Transfer/$DeadLetterQueue",
            Address("q", sub="deadletter", dlq=True, transfer=True),
        ),
        # management nodes (no scheme, no host), of the queue and of its dead-letter queue
        ("myqueue/$management", Address("myqueue", sub="management")),
        ("MyQueue/$Management", Address("myqueue", sub="management")),
        ("q/$DeadLetterQueue/$management", Address("q", sub="management", dlq=True)),
        ("amqps://h:1/q/$management", Address("q", sub="management")),
        # CBS
        ("$cbs", Address("", sub="cbs")),
        ("$CBS", Address("", sub="cbs")),
        # subscriptions (parsed, not served yet)
        ("amqps://localhost:5672/t/Subscriptions/s", Address("t", subscription="s")),
        ("T/subscriptions/S", Address("t", subscription="s")),
        (
            "t/Subscriptions/s/$DeadLetterQueue",
            Address("t", sub="deadletter", dlq=True, subscription="s"),
        ),
        ("t/Subscriptions/s/$management", Address("t", sub="management", subscription="s")),
        ("a/b/Subscriptions/s", Address("a/b", subscription="s")),
    ],
)
def test_address_forms(address, expected):
    assert parse_address(address) == expected


def test_entity_paths_are_what_a_token_audience_must_cover():
    assert parse_address("amqps://h:1/Q").entity_path == "q"
    assert parse_address("q/$DeadLetterQueue").entity_path == "q/$deadletterqueue"
    assert parse_address("q/$DeadLetterQueue/$management").entity_path == "q/$deadletterqueue"
    assert parse_address("q/$management").entity_path == "q"
    parsed = parse_address("q/$Transfer/$DeadLetterQueue")
    assert parsed.entity_path == "q/$transfer/$deadletterqueue"
    assert parse_address("t/Subscriptions/S").entity_path == "t/subscriptions/s"
    assert parse_address("t/Subscriptions/s").is_subscription
    assert not parse_address("q").is_subscription


@pytest.mark.parametrize(
    "address",
    [
        "",
        None,
        "amqps://localhost:5672",
        "amqps://localhost:5672/",
        "my queue",
        "q/$Unknown",
        "q/$Transfer",
        "$DeadLetterQueue",
        "q//x",
        "q$",
        "x" * 261,
    ],
)
def test_bad_addresses_are_not_found_errors(address):
    with pytest.raises(AddressError) as info:
        parse_address(address)
    assert isinstance(info.value, BusdError)
    assert info.value.condition is Condition.NOT_FOUND
    assert "Invalid entity address" in info.value.description
