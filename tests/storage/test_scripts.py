"""The script files keep their conventions: headers match KEYS, includes are single functions,
every key is declared (so the scripts run on Redis/Valkey Cluster)."""

from __future__ import annotations

import re

import pytest

from busd.storage import keys as keyspace
from busd.storage.redis.scripts import (
    CONTEXTS,
    INCLUDE_DIR,
    LUA_DIR,
    header_of,
    load_sources,
    read_source,
    resolve_includes,
)

SOURCES = load_sources()


def test_every_script_is_loaded():
    assert len(SOURCES) == len(list(LUA_DIR.glob("*.lua")))
    assert {"sendMessages", "receiveMessages", "settleMessages", "acceptSession"} <= set(SOURCES)


@pytest.mark.parametrize("name", sorted(n for n, s in SOURCES.items() if s.context is None))
def test_own_keys_match_file_name_and_highest_keys_index(name):
    src = SOURCES[name]
    assert src.path.name == f"{name}-{src.num_keys}.lua"
    assert len(src.key_names) == src.num_keys
    used = [int(i) for i in re.findall(r"KEYS\[(\d+)\]", src.text.split("]]", 1)[1])]
    assert max(used) == src.num_keys, f"{src.path.name}: highest KEYS[i] used is {max(used)}"


@pytest.mark.parametrize("name", sorted(n for n, s in SOURCES.items() if s.context == "queue"))
def test_a_script_with_the_queue_context_declares_it_once(name):
    src = SOURCES[name]
    raw = src.path.read_text()
    assert src.path.name == f"{name}.lua"  # no key count: the context says what it takes
    assert src.key_names == CONTEXTS[src.context] == (keyspace.QUEUE_CONTEXT,)
    assert not re.search(r"^\s*KEYS\[\d+\]", header_of(raw), re.M)  # not listed again
    assert "queueContext(0, 0)" in raw
    # the script's own body reaches keys only through the context
    assert "KEYS[" not in raw.split("]]", 1)[1]


@pytest.mark.parametrize("name", sorted(n for n, s in SOURCES.items() if s.context == "topic"))
def test_a_script_with_the_topic_context_declares_it_once(name):
    src = SOURCES[name]
    raw = src.path.read_text()
    assert src.path.name == f"{name}.lua"
    assert src.key_names == keyspace.TOPIC_KEYS
    assert src.per_subscription == (keyspace.QUEUE_CONTEXT,)
    assert not re.search(r"^\s*KEYS\[\d+\]", header_of(raw), re.M)
    assert "topicContext()" in raw
    # subscription contexts follow the topic's keys (TOPIC_KEYC of them), each one key
    for offset in re.findall(r"queueContext\((.*?),", raw):
        assert offset.startswith("TOPIC_KEYC + "), offset


def test_topic_context_maps_keys_in_the_topic_key_order():
    text = (INCLUDE_DIR / "topicContext.lua").read_text()
    pairs = re.findall(r"(\w+) = KEYS\[kb \+ (\d+)\]", text)
    assert [name for name, _ in sorted(pairs, key=lambda p: int(p[1]))] == list(keyspace.TOPIC_KEYS)


def test_subscription_keys_share_the_topic_tag_and_its_counter():
    topic = keyspace.keys("busd", "orders/eu", keyspace.TOPIC_KEYS)
    sub = keyspace.keys("busd", "orders/eu", keyspace.QUEUE_KEYS, "s1")
    other = keyspace.keys("busd", "orders/eu", keyspace.QUEUE_KEYS, "s2")
    tags = {re.match(r"^\{([^}]*)\}", k).group(1) for k in topic + sub + other}
    assert tags == {"busd:orders/eu"}
    assert sub[0] == topic[0]  # seq: copies keep the topic's numbers
    own = set(sub) - set(topic)
    assert len(own) == len(keyspace.QUEUE_KEYS) - 2 and not own & set(other)


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_keys_are_indexed_by_literals_outside_the_context(name):
    # a computed index would hide an undeclared key; only the context computes offsets
    code = re.sub(r"--.*", "", SOURCES[name].text.split("]]", 1)[1])  # no comments
    text = re.sub(r"local function queueContext\(.*?\n  return [^\n]*\nend", "", code, flags=re.S)
    text = re.sub(r"local function queueKeys\(.*?\n  return [^\n]*\nend", "", text, flags=re.S)
    text = re.sub(r"local function topicContext\(.*?\n  return T\nend", "", text, flags=re.S)
    # the keys a transaction context adds after the via entity's queue context
    text = re.sub(r"local function transactionKeys\(.*?\nend", "", text, flags=re.S)
    # the catalog hash a script takes after its context (lua/forwardMessages.lua)
    text = re.sub(r"local function catalogKey\(.*?\nend", "", text, flags=re.S)
    assert not re.search(r"KEYS\[[^\d\]]", text)


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_header_documents_input_output_and_events(name):
    header = header_of(SOURCES[name].path.read_text())
    for section in ("Invariant:", "Input:", "Output:", "Events:"):
        assert section in header, f"{name}: header lacks {section}"
    assert header.startswith(f"--[[\n  {name}: ")
    declared_argv = {int(i) for i in re.findall(r"ARGV\[(\d+)\]", header)}
    used_argv = {int(i) for i in re.findall(r"ARGV\[(\d+)\]", SOURCES[name].text.split("]]", 1)[1])}
    assert used_argv <= declared_argv


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_header_key_names_are_known_key_names(name):
    for key_name in SOURCES[name].key_names:
        keyspace.key("p", "q", key_name)  # raises on an unknown name


# What includes/queueKeys.lua names from a context's one key, as a script reads them.
NAMES_OF = (
    resolve_includes('--- @include "queueKeys"')
    + """
local names = queueKeys(KEYS[1]).__index
local out = {}
for _, n in ipairs(ARGV) do
  local entity, name = string.match(n, '^([qd])%.(.+)$')
  if entity then out[#out + 1] = names[entity][name] else out[#out + 1] = names[n] end
end
return out
"""
)


@pytest.mark.parametrize(
    "entity, subscription",
    [("orders/eu", None), ("orders/eu", "s1"), ("orders:3/16", None), ("orders:3/16", "s1")],
)
def test_the_keys_a_script_names_from_the_context_key_are_the_stores_keys(
    redis_url, entity, subscription
):
    """A script is passed one key per queue context and names the queue's keys from it: the
    names are exactly busd.storage.keys' (a subscription's `seq` and `dedup` its topic's;
    a partition's under its even-layout tag)."""
    import redis

    context = keyspace.context_key("busd", entity, subscription)
    with redis.Redis.from_url(redis_url) as client:
        named = client.eval(NAMES_OF, 1, context, *keyspace.QUEUE_KEYS)
    expected = keyspace.keys("busd", entity, keyspace.QUEUE_KEYS, subscription)
    assert [n.decode() for n in named] == expected
    assert keyspace.key("busd", entity, keyspace.QUEUE_CONTEXT, subscription) == context


def test_a_script_naming_an_unknown_context_is_refused(tmp_path):
    from busd.storage.redis.scripts import ScriptError

    bad = tmp_path / "doThing.lua"
    bad.write_text("--[[\n  doThing: x\n  Context: planet\n  Input:\n]]\nreturn 1\n")
    with pytest.raises(ScriptError):
        read_source(bad)


@pytest.mark.parametrize("path", sorted(INCLUDE_DIR.glob("*.lua")), ids=lambda p: p.stem)
def test_each_include_is_one_local_function_named_after_its_file(path):
    text = path.read_text()
    functions = re.findall(r"^local function (\w+)\(", text, re.M)
    assert functions == [path.stem]


def test_include_names_resolve_and_are_included_once():
    src = SOURCES["receiveMessages"]
    assert src.text.count("local function unindexMessage(") == 1
    assert "@include" not in src.text


def test_a_header_that_disagrees_with_the_file_name_is_refused(tmp_path):
    from busd.storage.redis.scripts import ScriptError

    bad = tmp_path / "doThing-2.lua"
    bad.write_text("--[[\n  doThing: x\n  Input:\n    KEYS[1]  seq\n]]\nreturn 1\n")
    with pytest.raises(ScriptError):
        read_source(bad)


def test_all_keys_of_a_queue_share_one_hash_tag():
    names = keyspace.QUEUE_KEYS
    ks = keyspace.keys("busd", "orders/eu", names)
    tags = {re.match(r"^\{([^}]*)\}", k).group(1) for k in ks}
    assert tags == {"busd:orders/eu"}
    assert len(set(ks)) == len(ks)


def test_the_queue_context_width_is_declared_once():
    from busd.storage.redis.connection import queue_context_args
    from busd.storage.redis.scripts import QUEUE_ARGC, read_queue_argc
    from busd.storage.specs import QueueSpec

    assert QUEUE_ARGC == read_queue_argc()
    assert len(queue_context_args(QueueSpec("q"), "ch", 1)) == QUEUE_ARGC
    for name, src in SOURCES.items():
        if src.context == "queue":
            # its own arguments are counted from the context's end, never by number
            body = re.sub(r"--.*", "", src.path.read_text().split("]]", 1)[1])
            assert not re.search(r"ARGV\[\d", body), name


def test_a_queue_context_whose_width_disagrees_with_what_it_reads_is_refused(tmp_path):
    from busd.storage.redis.scripts import ScriptError, read_queue_argc

    text = (INCLUDE_DIR / "queueContext.lua").read_text()
    bad = tmp_path / "queueContext.lua"
    bad.write_text(re.sub(r"local QUEUE_ARGC = \d+", "local QUEUE_ARGC = 5", text))
    with pytest.raises(ScriptError):
        read_queue_argc(bad)
    bad.write_text(re.sub(r"local QUEUE_ARGC = \d+\n", "", text))
    with pytest.raises(ScriptError):
        read_queue_argc(bad)


def test_the_queue_context_key_count_is_declared_once_and_matches_the_key_set(tmp_path):
    from busd.storage.redis.scripts import QUEUE_KEYC, ScriptError, read_queue_keyc

    assert QUEUE_KEYC == 1  # the context key; includes/queueKeys.lua names the rest
    for name, src in SOURCES.items():
        # a key after a queue context is found from QUEUE_KEYC, never by number
        body = re.sub(r"--.*", "", src.path.read_text().split("]]", 1)[1])
        assert not re.search(
            r"\b(catalogKey|queueContext|topicContext)\(0*[1-9]\d*\s*[,)]", body
        ), name
    text = (INCLUDE_DIR / "queueContext.lua").read_text()
    bad = tmp_path / "queueContext.lua"
    # one key more than the context reads, or none declared
    bad.write_text(re.sub(r"local QUEUE_KEYC = \d+", f"local QUEUE_KEYC = {QUEUE_KEYC + 1}", text))
    with pytest.raises(ScriptError):
        read_queue_keyc(bad)
    bad.write_text(re.sub(r"local QUEUE_KEYC = \d+\n", "", text))
    with pytest.raises(ScriptError):
        read_queue_keyc(bad)
    # the names built from it: one missing, or one of the queue's own taken as the topic's
    names = (INCLUDE_DIR / "queueKeys.lua").read_text()
    good = tmp_path / "queueContextGood.lua"
    good.write_text(text)
    bad_names = tmp_path / "queueKeys.lua"
    bad_names.write_text(names.replace(" sactive = k('sactive'),", ""))
    with pytest.raises(ScriptError, match="QUEUE_KEYS"):
        read_queue_keyc(good, bad_names)
    bad_names.write_text(names.replace("k('sfree')", "t('sfree')"))
    with pytest.raises(ScriptError, match="topic"):
        read_queue_keyc(good, bad_names)
    assert read_queue_keyc(good, INCLUDE_DIR / "queueKeys.lua") == 1


def test_the_topic_context_width_is_declared_once_and_matches_the_key_set(tmp_path):
    from busd.storage.redis.scripts import TOPIC_KEYC, ScriptError, read_topic_keyc

    assert TOPIC_KEYC == len(keyspace.TOPIC_KEYS)
    for name, src in SOURCES.items():
        # the subscription contexts and the arguments after them are found from TOPIC_KEYC,
        # TOPIC_ARGC and T.rest, never by number
        body = re.sub(r"--.*", "", src.path.read_text().split("]]", 1)[1])
        assert not re.search(r"\b\d+ \+ \(\w+ - 1\) \* QUEUE_(KEYC|ARGC)", body), name
        assert not re.search(r"\b\d+ \+ QUEUE_ARGC \* \w+(\.n)?\b", body), name
    text = (INCLUDE_DIR / "topicContext.lua").read_text()
    bad = tmp_path / "topicContext.lua"
    bad.write_text(re.sub(r"local TOPIC_KEYC = \d+", f"local TOPIC_KEYC = {TOPIC_KEYC + 1}", text))
    with pytest.raises(ScriptError):
        read_topic_keyc(bad)
    bad.write_text(re.sub(r"local TOPIC_ARGC = \d+", "local TOPIC_ARGC = 3", text))
    with pytest.raises(ScriptError):
        read_topic_keyc(bad)
