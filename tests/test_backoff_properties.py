"""The redelivery backoff's entity properties (busd's own, docs/design.md §2.17) in the
entities file: read into the entity's record and the store's handle, written back by the
config export, and refused with a one-line error out of bounds."""

from __future__ import annotations

import json

import pytest

from busd.config.entities_file import load_entities
from busd.config.settings import ConfigError
from busd.entities import properties as ep
from busd.storage.redis.connection import backoff_arg
from busd.storage.specs import BACKOFF_LONGEST_MS


def write(tmp_path, props, kind="queue"):
    if kind == "queue":
        entities = {"Queues": [{"Name": "q", "Properties": props}]}
    else:
        sub = {"Name": "s", "Properties": props}
        entities = {"Topics": [{"Name": "t", "Subscriptions": [sub]}]}
    doc = {"UserConfig": {"Namespaces": [{"Name": "sbemulatorns", **entities}]}}
    path = tmp_path / "Config.json"
    path.write_text(json.dumps(doc))
    return path


def test_read_into_the_record_and_the_stores_handle(tmp_path):
    props = {
        "RedeliveryBackoffMinimum": "PT0.5S",
        "RedeliveryBackoffMaximum": "PT1M",
        "RedeliveryBackoffFactor": 1.5,
    }
    (q,) = load_entities(write(tmp_path, props)).queues
    assert (q.backoff_min_ms, q.backoff_max_ms, q.backoff_factor) == (500, 60_000, 1.5)
    assert backoff_arg(q.spec) == "500,60000,1.5"
    found = load_entities(write(tmp_path, props, kind="subscription"))
    (sub,) = found.subscriptions
    assert backoff_arg(sub.spec(found.topics[0])) == "500,60000,1.5"
    # written back as read (busd config export)
    values = ep.property_values("queue", q, q.extra)
    assert {n: ep.BY_NAME[n].to_json(values[n]) for n in props} == props


def test_off_unless_a_minimum_is_set(tmp_path):
    (q,) = load_entities(write(tmp_path, {})).queues
    assert backoff_arg(q.spec) == ""
    (q,) = load_entities(write(tmp_path, {"RedeliveryBackoffMaximum": "PT1M"})).queues
    assert backoff_arg(q.spec) == ""
    (q,) = load_entities(write(tmp_path, {"RedeliveryBackoffMinimum": "PT1S"})).queues
    assert backoff_arg(q.spec) == f"1000,{BACKOFF_LONGEST_MS},2.0"


@pytest.mark.parametrize(
    "props, fragment",
    [
        ({"RedeliveryBackoffMinimum": "-PT1S"}, "not an ISO 8601 duration"),
        ({"RedeliveryBackoffMinimum": "PT0S"}, "longer than zero"),
        ({"RedeliveryBackoffMaximum": "P8D"}, "at most 7 days"),
        ({"RedeliveryBackoffFactor": 0.5}, "1 to 1000"),
        ({"RedeliveryBackoffFactor": -1}, "1 to 1000"),
        ({"RedeliveryBackoffFactor": "twice"}, "must be a number"),
        ({"RedeliveryBackoffFactor": True}, "must be a number"),
        (
            {"RedeliveryBackoffMinimum": "PT10S", "RedeliveryBackoffMaximum": "PT5S"},
            "RedeliveryBackoffMinimum (PT10S) must not be longer than "
            "RedeliveryBackoffMaximum (PT5S)",
        ),
    ],
)
def test_bad_values_stop_the_file(tmp_path, props, fragment):
    for kind in ("queue", "subscription"):
        with pytest.raises(ConfigError) as info:
            load_entities(write(tmp_path, props, kind))
        assert fragment in str(info.value) and "\n" not in str(info.value)
