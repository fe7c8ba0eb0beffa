"""The namespaces of one process (busd/broker/namespaces.py), each a real Broker over its own
key prefix of the session's real Valkey: made on first use, isolated, and let go when idle
while their data stays (docs/design.md §3.17)."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
import pytest_asyncio

from busd.auth.sas import SasError, generate_sas_token
from busd.broker.broker import Broker
from busd.broker.namespaces import Namespaces
from busd.broker.settings import BrokerSettings
from busd.entities import access_rules
from busd.entities.records import QueueEntity
from busd.storage.redis.store import RedisStore
from busd.storage.specs import QueueSpec
from tests.conftest import delete_prefix
from tests.protocol.harness import SAS_KEYS


@pytest_asyncio.fixture
async def namespaces(redis_url):
    """The namespaces of one process over their own key prefixes, let go after 0.3 s idle."""
    prefix = f"proto-ns-{uuid.uuid4().hex[:10]}"
    default = Broker(RedisStore(redis_url, prefix=prefix), sas_keys=dict(SAS_KEYS))
    await default.start()

    async def make(name: str) -> Broker:
        broker = Broker(
            RedisStore(redis_url, prefix=f"{prefix}:ns:{name}"),
            sas_keys=dict(made.keys(name)),
            settings=BrokerSettings(sweep_interval_s=0.2),
        )
        await broker.start()
        return broker

    made = Namespaces(default, make, idle_s=0.3)
    try:
        yield made
    finally:
        await made.stop()
        await default.stop()
        delete_prefix(redis_url, prefix)


async def test_an_idle_namespace_is_let_go_unless_held_and_its_data_stays(namespaces):
    default = namespaces.default
    first = await namespaces.broker("team-a")
    await first.catalog.create(QueueEntity.from_spec(QueueSpec("orders")))
    held = await namespaces.broker("team-b")
    namespaces.hold(held)
    assert default.catalog.queue("orders") is None  # isolated from the default
    assert held.catalog.queue("orders") is None  # and from each other
    await asyncio.sleep(1.0)
    assert namespaces.served("team-a") is None  # unused: let go
    assert namespaces.served("team-b") is held  # a connection holds it
    again = await namespaces.broker("team-a")
    assert again is not first and again.catalog.queue("orders") is not None
    namespaces.let_go(held)
    await asyncio.sleep(1.0)
    assert namespaces.served("team-b") is None


async def test_refused_tokens_do_not_keep_a_namespace_from_being_let_go(namespaces):
    """A token is checked against the entities' own keys of a served namespace too
    (docs/design.md §2.10); that look-up does not count as a use of the namespace."""
    refused = generate_sas_token(
        "sb://localhost/orders", "team-c/RootManageSharedAccessKey", "WRONG", int(time.time()) + 60
    )
    await namespaces.broker("team-c")
    for _ in range(12):
        with pytest.raises(SasError):
            await namespaces.authenticate(refused, None)
        await asyncio.sleep(0.1)
    assert "team-c" not in namespaces.serving()  # let go


def token(audience: str, key_name: str, key: str) -> str:
    return generate_sas_token(f"sb://localhost/{audience}", key_name, key, int(time.time()) + 60)


async def test_a_namespace_let_go_takes_its_send_and_listen_keys_again(namespaces):
    """Made once by a Manage key, a namespace exists (the store knows it): let go for
    idleness, its other keys make it again; a namespace never made still needs Manage."""
    name, never = (f"{n}-{uuid.uuid4().hex[:6]}" for n in ("made", "never"))
    listen = token("", f"{name}/listener", "listen-key")
    with pytest.raises(SasError, match="holding Manage"):
        await namespaces.authenticate(listen, None)  # not made yet
    first, _ = await namespaces.authenticate(token("", f"{name}/manager", "manage-key"), None)
    await asyncio.sleep(1.0)
    assert name not in namespaces.serving()  # idle: let go, its data stays
    with pytest.raises(SasError):
        await namespaces.authenticate(token("", f"{name}/listener", "WRONG"), None)
    assert name not in namespaces.serving()  # a namespace-wide token: no store call either
    again, grant = await namespaces.authenticate(listen, None)
    assert again is not first and grant.claims == {"Listen"}
    await asyncio.sleep(1.0)
    sent, grant = await namespaces.authenticate(token("orders", f"{name}/sender", "send-key"), None)
    assert grant.claims == {"Send"} and sent is namespaces.served(name)
    await asyncio.sleep(1.0)
    # a token for an entity that the namespace's keys refuse may be the entity's own: the
    # namespace's catalog in the store refuses it, the namespace left unmade
    with pytest.raises(SasError, match="unknown"):
        await namespaces.authenticate(token("orders", f"{name}/owner", "WRONG"), None)
    assert name not in namespaces.serving()
    for refused in (
        token("", f"{never}/listener", "listen-key"),
        token("orders", f"{never}/sender", "send-key"),
        token("orders", f"{never}/owner", "owner-key"),
    ):
        with pytest.raises(SasError, match="holding Manage"):
            await namespaces.authenticate(refused, None)
    assert never not in namespaces.serving()


async def test_a_token_signed_with_an_entitys_key_is_checked_before_its_namespace_is_made(
    namespaces,
):
    """A token the namespace's keys refuse, for an entity with rules of its own, is checked
    with the entity's keys read from the store: a wrong one leaves the namespace unmade (a
    refusal costs no namespace start), a right one makes it."""
    name = f"ents-{uuid.uuid4().hex[:6]}"
    rules = access_rules.normalize([{"KeyName": "app", "Rights": ["Send"]}], fill=True)
    broker, _ = await namespaces.authenticate(token("", f"{name}/manager", "manage-key"), None)
    await broker.catalog.create(QueueEntity("orders", extra={"AuthorizationRules": rules}))
    await namespaces._stop(name)  # let go, as when idle: its data stays
    assert name not in namespaces.serving()
    for refused in (
        token("orders", "app", "WRONG"),  # the entity's key name, signed with another key
        token("orders", f"{name}/app", "WRONG"),
        token("orders", "nobody", "WRONG"),  # no such rule: the namespace's refusal stands
        token("orders/secret", "app", rules[0]["PrimaryKey"]),  # another entity's audience
    ):
        with pytest.raises(SasError):
            await namespaces.authenticate(refused, name)
        assert name not in namespaces.serving()
    for key in ("PrimaryKey", "SecondaryKey"):
        served, grant = await namespaces.authenticate(token("orders", "app", rules[0][key]), name)
        assert grant.claims == {"Send"} and grant.entity == "orders"
        assert served is namespaces.served(name) and name in namespaces.serving()


async def test_a_namespace_is_known_once_a_manage_key_made_it(namespaces):
    """What keeps the certificate of a namespace's host apart (busd.net.host_certificates)."""
    name, never = (f"{n}-{uuid.uuid4().hex[:6]}" for n in ("known", "never"))
    assert not await namespaces.known(name) and not await namespaces.known(never)
    await namespaces.authenticate(token("", f"{name}/manager", "manage-key"), None)
    await namespaces._stop(name)  # let go here: the store still knows it
    assert await namespaces.known(name) and not await namespaces.known(never)
