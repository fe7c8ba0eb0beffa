"""The one declaration of each entity property (busd.entities.properties) and what is derived
from it: the records' fields, the store's handle, the entities file and the management API
agree on names, defaults and bounds."""

import dataclasses
import json

import pytest

from busd.config.entities_file import load_entities
from busd.config.settings import ConfigError
from busd.entities import properties as ep
from busd.entities.records import QueueEntity, SubscriptionEntity, TopicEntity
from busd.http import atom_xml as ax
from busd.storage.specs import QueueSpec

CLASSES = {"queue": QueueEntity, "topic": TopicEntity, "subscription": SubscriptionEntity}
# fixed by busd at creation, no property of Service Bus (partition_layout: docs/design.md §3.18)
NOT_PROPERTIES = {"name", "topic", "extra", "created_ms", "partition_layout"}


@pytest.mark.parametrize("kind", ep.KINDS)
def test_every_record_field_is_a_declared_property_and_back(kind):
    fields = {f.name: f for f in dataclasses.fields(CLASSES[kind])}
    declared = {p.attr: p for p in ep.OF_KIND[kind].values() if p.attr}
    assert set(fields) - NOT_PROPERTIES == set(declared)
    for attr, prop in declared.items():
        expected = None if prop.enabled_by else prop.field_default  # off until switched on
        assert fields[attr].default == expected, attr


@pytest.mark.parametrize("kind", ep.KINDS)
def test_the_store_handle_carries_what_the_table_says(kind):
    spec_fields = {f.name for f in dataclasses.fields(QueueSpec)}
    assert {p.attr for p in ep.STORE[kind]} <= spec_fields
    for name in ep.ATOM_ORDER[kind]:  # every element is a property or a read-only one
        assert name in ep.OF_KIND[kind] or name not in ep.BY_NAME, name
    assert set(ep.OF_KIND[kind]) <= set(ep.ATOM_ORDER[kind])


def _config(tmp_path, props):
    doc = {
        "UserConfig": {
            "Namespaces": [{"Name": "ns", "Queues": [{"Name": "q", "Properties": props}]}]
        }
    }
    path = tmp_path / "Config.json"
    path.write_text(json.dumps(doc))
    return load_entities(path)


def _atom(element: str) -> bytes:
    return (
        f'<entry xmlns="http://www.w3.org/2005/Atom"><content type="application/xml">'
        f'<QueueDescription xmlns="{ax.SB}">{element}</QueueDescription></content></entry>'
    ).encode()


@pytest.mark.parametrize(
    "value, ok", [(1, True), (ep.INT32_MAX, True), (0, False), (ep.INT32_MAX + 1, False)]
)
def test_max_delivery_count_has_service_bus_bounds_in_the_file_and_the_api(tmp_path, value, ok):
    """The file and the API once disagreed (the file had no ceiling): both are 1..2^31-1."""
    props = ax.parse_description(_atom(f"<MaxDeliveryCount>{value}</MaxDeliveryCount>"), "queue")
    if ok:
        assert _config(tmp_path, {"MaxDeliveryCount": value}).queues[0].max_delivery_count == value
        ep.check(props)
        return
    with pytest.raises(ConfigError, match=f"queue 'q': MaxDeliveryCount must be 1..{ep.INT32_MAX}"):
        _config(tmp_path, {"MaxDeliveryCount": value})
    with pytest.raises(ConfigError, match=f"MaxDeliveryCount must be 1..{ep.INT32_MAX}"):
        ep.check(props)


@pytest.mark.parametrize(("length", "ok"), [(1024, True), (1025, False)])
def test_user_metadata_has_service_bus_s_1024_characters_in_the_file_and_the_api(
    tmp_path, length, ok
):
    text = "m" * length
    props = ax.parse_description(_atom(f"<UserMetadata>{text}</UserMetadata>"), "queue")
    if ok:
        assert _config(tmp_path, {"UserMetadata": text}).queues[0].extra["UserMetadata"] == text
        ep.check(props)
        return
    message = "UserMetadata must be at most 1024 characters, got 1025"
    with pytest.raises(ConfigError, match=f"queue 'q': {message}"):
        _config(tmp_path, {"UserMetadata": text})
    with pytest.raises(ConfigError, match=message):
        ep.check(props)


def test_a_property_kept_only_is_answered_back_from_the_file(tmp_path):
    found = _config(tmp_path, {"UserMetadata": "owned by billing", "AutoDeleteOnIdle": "PT1H"})
    queue = found.queues[0]
    assert queue.extra == {"UserMetadata": "owned by billing", "AutoDeleteOnIdle": 3_600_000}
    values = ep.property_values("queue", queue, queue.extra)
    xml = ax.serialize(ax.description("queue", values, ax.Runtime())).decode()
    assert "<UserMetadata>owned by billing</UserMetadata>" in xml
    assert "<AutoDeleteOnIdle>PT1H</AutoDeleteOnIdle>" in xml
    assert any("UserMetadata" in w and "does not act" in w for w in found.warnings)


@pytest.mark.parametrize("kind", ep.KINDS)
def test_the_command_line_offers_each_declared_flag_of_the_kind(kind):
    from click.testing import CliRunner

    from busd.cli.main import cli

    result = CliRunner().invoke(cli, [kind, "create", "--help"], prog_name="busd")
    assert result.exit_code == 0, result.output
    for prop in ep.PROPERTIES:
        if prop.flag:
            assert (f"--{prop.flag}" in result.output) == (kind in prop.kinds), prop.name
