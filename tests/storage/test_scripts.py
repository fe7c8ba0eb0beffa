"""The script files keep their conventions: headers match KEYS, includes are single functions,
every key is declared (so the scripts run on Redis/Valkey Cluster)."""

from __future__ import annotations

import re

import pytest

from busd.storage import keys as keyspace
from busd.storage.scripts import INCLUDE_DIR, LUA_DIR, header_of, load_sources, read_source

SOURCES = load_sources()


def test_every_script_is_loaded():
    assert len(SOURCES) == len(list(LUA_DIR.glob("*.lua")))
    assert {"sendMessages", "receiveMessages", "settleMessages", "acceptSession"} <= set(SOURCES)


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_header_keys_match_file_name_and_highest_keys_index(name):
    src = SOURCES[name]
    assert len(src.key_names) == src.num_keys
    used = [int(i) for i in re.findall(r"KEYS\[(\d+)\]", src.text.split("]]", 1)[1])]
    assert max(used) == src.num_keys, f"{src.path.name}: highest KEYS[i] used is {max(used)}"
    # keys are only ever indexed by literals: a computed index would hide an undeclared key
    assert not re.search(r"KEYS\[[^\d\]]", src.text)


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


@pytest.mark.parametrize("name", sorted(n for n, s in SOURCES.items() if "queueContext" in s.text))
def test_scripts_with_the_queue_context_take_the_full_queue_key_set(name):
    assert SOURCES[name].key_names == keyspace.QUEUE_KEYS


def test_queue_context_maps_keys_in_the_queue_key_order():
    text = (INCLUDE_DIR / "queueContext.lua").read_text()
    pairs = re.findall(r"(\w+) = KEYS\[(\d+)\]", text)
    in_order = [name for name, _ in sorted(pairs, key=lambda p: int(p[1]))]
    expected = [n.split(".")[-1] for n in keyspace.QUEUE_KEYS]
    assert in_order == expected
    assert [int(i) for _, i in sorted(pairs, key=lambda p: int(p[1]))] == list(range(1, len(keyspace.QUEUE_KEYS) + 1))


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
    from busd.storage.scripts import ScriptError

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
