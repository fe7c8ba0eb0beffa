"""Settings and the entities file (the Service Bus emulator's Config.json, read as is)."""

import json
from pathlib import Path

import pytest

from busd.config.entities_file import load_entities, strip_json_comments
from busd.config.settings import ConfigError, Settings
from busd.entities.records import QueueEntity as QueueSpec
from busd.entities.values import normalize_entity_name, parse_duration_ms

SAMPLE = Path(__file__).resolve().parents[1] / "config" / "Config.json"


def queues_and_warnings(path, **kwargs):
    found = load_entities(path, **kwargs)
    return found.queues, found.warnings


def write_config(tmp_path, queues=None, topics=None, namespaces=None):
    if namespaces is None:
        namespaces = [{"Name": "sbemulatorns", "Queues": queues or [], "Topics": topics or []}]
    doc = {"UserConfig": {"Namespaces": namespaces, "Logging": {"Type": "File"}}}
    path = tmp_path / "Config.json"
    path.write_text(json.dumps(doc))
    return path


def one_queue(tmp_path, **props):
    path = write_config(tmp_path, [{"Name": "q", "Properties": props}])
    queues, warnings = queues_and_warnings(path)
    assert len(queues) == 1
    return queues[0], warnings


# --- durations ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, ms",
    [
        ("PT1M", 60_000),
        ("PT5S", 5_000),
        ("PT0.5S", 500),
        ("P14D", 14 * 86_400_000),
        ("PT1H30M", 5_400_000),
        ("P1DT2H3M4.25S", 86_400_000 + 7_200_000 + 180_000 + 4_250),
        ("P1W", 7 * 86_400_000),
        ("00:01:30", 90_000),  # .NET TimeSpan text
    ],
)
def test_iso8601_durations_parse_to_milliseconds(text, ms):
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize(
    "text", ["P10675199DT2H48M5.4775807S", "P10675199D", "P30000Y", "10675199.02:48:05.4775807"]
)
def test_timespan_max_value_means_unbounded(text):
    assert parse_duration_ms(text) is None


@pytest.mark.parametrize("text", ["", "P", "PT", "1M", "PT1X", "one minute", "PT-1S"])
def test_malformed_durations_are_refused(text):
    with pytest.raises(ValueError):
        parse_duration_ms(text)


# --- the sample file and the emulator format ----------------------------------------------------


def test_sample_config_loads_as_the_emulator_writes_it():
    doc = json.loads(strip_json_comments(SAMPLE.read_text()))
    assert doc["UserConfig"]["Namespaces"][0]["Name"] == "sbemulatorns"
    assert "Logging" in doc["UserConfig"]
    queues, warnings = queues_and_warnings(SAMPLE)
    by_name = {q.name: q for q in queues}
    assert warnings == []
    assert by_name["queue.1"] == QueueSpec(
        name="queue.1",
        lock_duration_ms=60_000,
        max_delivery_count=3,
        default_ttl_ms=3_600_000,
        # detection is off: the window is kept, to be answered back as the file set it
        extra={"DuplicateDetectionHistoryTimeWindow": 20_000},
    )
    assert by_name["session-queue"].requires_session
    dlq_on_expiry = [q for q in queues if q.dead_letter_on_expiration]
    assert dlq_on_expiry and dlq_on_expiry[0].default_ttl_ms is not None


def test_defaults_when_properties_are_absent(tmp_path):
    queues, warnings = queues_and_warnings(write_config(tmp_path, [{"Name": "plain"}]))
    assert queues == [QueueSpec(name="plain")]
    spec = queues[0]
    assert spec.lock_duration_ms == 60_000
    assert spec.max_delivery_count == 10
    assert spec.default_ttl_ms is None
    assert spec.duplicate_detection_window_ms is None
    assert spec.max_message_size == 1024 * 1024
    assert warnings == []


def test_every_queue_property_is_read(tmp_path):
    spec, warnings = one_queue(
        tmp_path,
        RequiresSession=True,
        LockDuration="PT5S",
        MaxDeliveryCount=25,  # above the emulator's cap of 10: busd has no such cap
        DefaultMessageTimeToLive="P14D",
        DeadLetteringOnMessageExpiration=True,
        RequiresDuplicateDetection=True,
        DuplicateDetectionHistoryTimeWindow="PT20S",
        MaxMessageSizeInKilobytes=4096,
    )
    assert spec == QueueSpec(
        name="q",
        requires_session=True,
        lock_duration_ms=5_000,
        max_delivery_count=25,
        default_ttl_ms=14 * 86_400_000,
        dead_letter_on_expiration=True,
        duplicate_detection_window_ms=20_000,
        max_message_size=4 * 1024 * 1024,
    )
    assert warnings == []


def test_ttl_of_timespan_max_value_is_unbounded(tmp_path):
    spec, _ = one_queue(tmp_path, DefaultMessageTimeToLive="P10675199DT2H48M5.4775807S")
    assert spec.default_ttl_ms is None


def test_duplicate_detection_defaults_to_ten_minutes(tmp_path):
    spec, _ = one_queue(tmp_path, RequiresDuplicateDetection=True)
    assert spec.duplicate_detection_window_ms == 600_000


def test_duplicate_window_without_detection_leaves_detection_off(tmp_path):
    spec, _ = one_queue(tmp_path, DuplicateDetectionHistoryTimeWindow="PT20S")
    assert spec.duplicate_detection_window_ms is None


def test_default_max_message_size_can_be_raised(tmp_path):
    path = write_config(tmp_path, [{"Name": "big"}])
    queues, _ = queues_and_warnings(path, default_max_message_size=50 * 1024 * 1024)
    assert queues[0].max_message_size == 50 * 1024 * 1024


def test_names_are_lower_cased_and_duplicates_refused(tmp_path):
    queues, _ = queues_and_warnings(write_config(tmp_path, [{"Name": "Orders.EU/Incoming_1"}]))
    assert queues[0].name == "orders.eu/incoming_1"
    path = write_config(tmp_path, [{"Name": "Orders"}, {"Name": "orders"}])
    with pytest.raises(ConfigError, match="declared twice"):
        load_entities(path)


def test_topics_subscriptions_and_forwarding_are_read(tmp_path):
    path = write_config(
        tmp_path,
        queues=[
            {
                "Name": "q",
                "Properties": {
                    "ForwardTo": "sb://localhost:5300/Other",
                    "ForwardDeadLetteredMessagesTo": "",
                },
            },
            {"Name": "other"},
        ],
        topics=[
            {
                "Name": "Topic.1",
                "Properties": {"RequiresDuplicateDetection": True},
                "Subscriptions": [
                    {
                        "Name": "S1",
                        "Properties": {
                            "RequiresSession": True,
                            "ForwardDeadLetteredMessagesTo": "q",
                        },
                    },
                    {
                        "Name": "s2",
                        "Rules": [
                            {
                                "Name": "r",
                                "Properties": {
                                    "FilterType": "Sql",
                                    "SqlFilter": {"SqlExpression": "a = 1"},
                                },
                            }
                        ],
                    },
                ],
            }
        ],
    )
    found = load_entities(path)
    assert found.warnings == []
    q = found.queues[0]
    assert (q.forward_to, q.forward_dead_lettered_to) == ("other", None)
    (topic,) = found.topics
    assert topic.name == "topic.1" and topic.duplicate_detection_window_ms == 10 * 60_000
    s1, s2 = found.subscriptions
    assert (s1.path, s1.requires_session, s1.forward_dead_lettered_to) == (
        "topic.1/subscriptions/s1",
        True,
        "q",
    )
    assert s2.dead_letter_on_filter_exceptions  # Service Bus's default
    assert [r.name for r in found.rules_of(s1)] == ["$Default"]
    assert [r.name for r in found.rules_of(s2)] == ["r"]


def test_forwarding_that_service_bus_refuses_stops_start_up(tmp_path):
    props = {"ForwardTo": "missing"}
    path = write_config(tmp_path, queues=[{"Name": "q", "Properties": props}, {"Name": "other"}])
    with pytest.raises(ConfigError, match="queue 'q': .*names no queue or topic"):
        load_entities(path)


def test_a_session_source_and_one_naming_itself_may_forward(tmp_path):
    """As in Service Bus (docs/design.md §2.15)."""
    path = write_config(
        tmp_path,
        queues=[
            {
                "Name": "q",
                "Properties": {
                    "RequiresSession": True,
                    "ForwardTo": "other",
                    "ForwardDeadLetteredMessagesTo": "q",
                },
            },
            {"Name": "other"},
        ],
    )
    (q, _) = load_entities(path).queues
    assert (q.forward_to, q.forward_dead_lettered_to) == ("other", "q")


def test_the_sample_topic_loads_as_the_emulator_ships_it():
    """Comments inside objects, empty ForwardTo strings, correlation and SQL rules."""
    found = load_entities(SAMPLE)
    assert [t.name for t in found.topics] == ["topic.1"]
    assert [s.name for s in found.subscriptions] == [
        "subscription.1",
        "subscription.2",
        "subscription.3",
        "subscription.4",
    ]
    rules = {s.name: [r.name for r in found.rules_of(s)] for s in found.subscriptions}
    assert rules == {
        "subscription.1": ["app-prop-filter-1"],
        "subscription.2": ["user-prop-filter-1"],
        "subscription.3": ["$Default"],
        "subscription.4": ["sql-filter-1"],
    }
    assert found.warnings == []


def test_comments_are_stripped_but_not_inside_strings(tmp_path):
    path = tmp_path / "Config.json"
    path.write_text("""{ // a comment
      "UserConfig": { /* block
      comment */ "Namespaces": [{"Name": "ns", "Queues": [
        {"Name": "q", "Properties": {"ForwardTo": "sb://h/x//y"}}  // "quoted" in a comment
      ], "Topics": [{"Name": "x"}]}]}}""")
    with pytest.raises(ConfigError, match="'x//y'|must not start or end"):
        load_entities(path)  # the // inside the string stayed part of the value
    path.write_text('{"UserConfig": {"Namespaces": []}} /* not closed')
    with pytest.raises(ConfigError, match="not closed"):
        load_entities(path)
    path.write_text('{"UserConfig": {"Namespaces": [\n// c\n{"Name": 1,}]}}')
    with pytest.raises(ConfigError, match="line 3"):
        load_entities(path)


@pytest.mark.parametrize(
    "subscription, rule, message",
    [
        ({"Name": "bad/name"}, None, "subscription name"),
        (
            {"Name": "s", "Properties": {"LockDuration": "PT10M"}},
            None,
            "subscription 's' of topic 't': LockDuration",
        ),
        (
            {"Name": "s"},
            {"Name": "r", "Properties": {"FilterType": "Odd"}},
            "subscription 's' of topic 't': rule 'r': FilterType",
        ),
        (
            {"Name": "s"},
            {"Name": "r", "Properties": {"FilterType": "Correlation"}},
            "rule 'r': .*CorrelationFilter",
        ),
        (
            {"Name": "s"},
            {"Name": "r", "Properties": {"FilterType": "Sql", "SqlFilter": {"x": 1}}},
            "rule 'r': .*SqlExpression",
        ),
        (
            {"Name": "s"},
            {
                "Name": "r",
                "Properties": {"FilterType": "Sql", "SqlFilter": {"SqlExpression": "a = = 1"}},
            },
            "rule 'r': .*position",
        ),
        ({"Name": "s", "Properties": {"ForwardTo": "nowhere"}}, None, "'nowhere' names no queue"),
    ],
)
def test_bad_topic_entries_name_the_entity(tmp_path, subscription, rule, message):
    if rule is not None:
        subscription = {**subscription, "Rules": [rule]}
    path = write_config(tmp_path, topics=[{"Name": "t", "Subscriptions": [subscription]}])
    with pytest.raises(ConfigError, match=message):
        load_entities(path)


def test_a_queue_and_a_topic_cannot_share_a_name(tmp_path):
    path = write_config(tmp_path, queues=[{"Name": "X"}], topics=[{"Name": "x"}])
    with pytest.raises(ConfigError, match="declared twice"):
        load_entities(path)


def test_authorization_rules_are_read_as_the_api_keeps_them(tmp_path):
    queue, warnings = one_queue(
        tmp_path,
        AuthorizationRules=[{"KeyName": "app", "PrimaryKey": "k1", "Rights": ["send", "Listen"]}],
    )
    (rule,) = queue.extra["AuthorizationRules"]
    assert (rule["KeyName"], rule["PrimaryKey"], rule["Rights"], rule["ClaimType"]) == (
        "app",
        "k1",
        ["Send", "Listen"],
        "SharedAccessKey",
    )
    # what the file leaves out is the stored rule's, else made, when the catalog is seeded
    assert rule["SecondaryKey"] is None and rule["CreatedTime"] is None
    assert not any("AuthorizationRules" in w for w in warnings)  # busd acts on them
    with pytest.raises(
        ConfigError, match="queue 'q': AuthorizationRules: rule 'x': unknown right 'Read'"
    ):
        one_queue(tmp_path, AuthorizationRules=[{"KeyName": "x", "Rights": ["Read"]}])


def test_properties_busd_only_keeps_are_reported(tmp_path):
    _, warnings = one_queue(tmp_path, EnableExpress=True)
    assert any("EnableExpress" in w for w in warnings)


def test_partitioning_is_acted_on(tmp_path):
    queue, warnings = one_queue(tmp_path, EnablePartitioning=True)
    assert (queue.partitions, queue.spec.partitions, warnings) == (16, 16, [])
    queue, _ = one_queue(tmp_path, EnablePartitioning=True, PartitionCount=4)
    assert queue.partitions == 4
    queue, _ = one_queue(tmp_path, PartitionCount=4)  # without the switch: off
    assert queue.partitions is None
    with pytest.raises(ConfigError, match="PartitionCount must be 1..32"):
        one_queue(tmp_path, EnablePartitioning=True, PartitionCount=33)


@pytest.mark.parametrize(
    "queue, topic, message",
    [
        (
            {"RequiresSesion": True},
            {},
            "queue 'Q': unknown property 'RequiresSesion': .*did you mean 'RequiresSession'",
        ),
        ({"Colour": "red"}, {}, "queue 'Q': unknown property 'Colour': not a queue property"),
        (
            {},
            {"RequiresSession": True},
            "topic 'T': property 'RequiresSession' is not one of a topic",
        ),
    ],
)
def test_a_property_service_bus_does_not_know_refuses_the_file(tmp_path, queue, topic, message):
    """Warned and ignored, a misspelt RequiresSession left the queue without sessions."""
    path = write_config(
        tmp_path, [{"Name": "Q", "Properties": queue}], [{"Name": "T", "Properties": topic}]
    )
    with pytest.raises(ConfigError, match=message):
        load_entities(path)


def test_several_namespaces_are_merged_with_a_warning(tmp_path):
    path = write_config(
        tmp_path,
        namespaces=[
            {"Name": "a", "Queues": [{"Name": "q1"}]},
            {"Name": "b", "Queues": [{"Name": "q2"}]},
        ],
    )
    queues, warnings = queues_and_warnings(path)
    assert [q.name for q in queues] == ["q1", "q2"]
    assert any("namespaces" in w for w in warnings)


def test_shared_access_keys_are_read_with_their_rights(tmp_path):
    path = write_config(
        tmp_path,
        namespaces=[
            {
                "Name": "a",
                "Queues": [],
                "SharedAccessKeys": [
                    {"KeyName": "reader", "Key": "r-key", "Rights": ["Listen"]},
                    {"KeyName": "app", "Key": "a-key", "Rights": ["send", "Listen"]},
                ],
            },
            {"Name": "b", "Queues": [], "SharedAccessKeys": [{"KeyName": "all", "Key": "k"}]},
        ],
    )
    keys = load_entities(path).keys
    assert {name: (str(key), key.claims) for name, key in keys.items()} == {
        "reader": ("r-key", {"Listen"}),
        "app": ("a-key", {"Send", "Listen"}),
        "all": ("k", {"Send", "Listen", "Manage"}),
    }


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"KeyName": "x"}, '"KeyName" and a "Key"'),
        ({"KeyName": "x", "Key": "k", "Rights": ["Read"]}, "'x': unknown right 'Read'"),
        ({"KeyName": "x", "Key": "k", "Rights": []}, "'x': Rights must be a list"),
    ],
)
def test_bad_shared_access_keys_are_config_errors(tmp_path, entry, message):
    path = write_config(tmp_path, namespaces=[{"Name": "a", "SharedAccessKeys": [entry]}])
    with pytest.raises(ConfigError, match=message):
        load_entities(path)
    twice = write_config(
        tmp_path,
        namespaces=[
            {
                "Name": "a",
                "SharedAccessKeys": [{"KeyName": "k", "Key": "1"}, {"KeyName": "K", "Key": "2"}],
            }
        ],
    )
    with pytest.raises(ConfigError, match="declared twice"):
        load_entities(twice)


# --- errors name the file, the entity and the reason ----------------------------------------------


@pytest.mark.parametrize(
    "props, fragment",
    [
        ({"LockDuration": "PT0.5S"}, "LockDuration"),
        ({"LockDuration": "PT6M"}, "LockDuration"),
        ({"LockDuration": "soon"}, "LockDuration"),
        ({"MaxDeliveryCount": 0}, "MaxDeliveryCount"),
        ({"MaxDeliveryCount": "3"}, "MaxDeliveryCount"),
        ({"RequiresSession": "yes"}, "RequiresSession"),
        ({"DefaultMessageTimeToLive": "PT0S"}, "DefaultMessageTimeToLive"),
        (
            {"RequiresDuplicateDetection": True, "DuplicateDetectionHistoryTimeWindow": "P8D"},
            "DuplicateDetection",
        ),
        ({"MaxMessageSizeInKilobytes": 102401}, "MaxMessageSizeInKilobytes"),
    ],
)
def test_out_of_range_properties_are_config_errors(tmp_path, props, fragment):
    path = write_config(tmp_path, [{"Name": "Bad.Queue", "Properties": props}])
    with pytest.raises(ConfigError) as info:
        load_entities(path)
    message = str(info.value)
    assert fragment in message and "'Bad.Queue'" in message and str(path) in message


def test_lock_duration_bounds_are_inclusive(tmp_path):
    assert one_queue(tmp_path, LockDuration="PT1S")[0].lock_duration_ms == 1_000
    assert one_queue(tmp_path, LockDuration="PT5M")[0].lock_duration_ms == 300_000


@pytest.mark.parametrize(
    "name", ["my queue", "q$", "ünïcode", "a//b", "/a", "a/", "", "x" * 261, "t/Subscriptions/s"]
)
def test_invalid_entity_names_are_config_errors(tmp_path, name):
    with pytest.raises(ConfigError, match="queue name"):
        load_entities(write_config(tmp_path, [{"Name": name}]))


def test_entity_name_rules(tmp_path):
    assert normalize_entity_name("A-b.c_d/E") == "a-b.c_d/e"
    # '~' as MassTransit names topics: Service Bus takes it in queue and topic names
    assert normalize_entity_name("Contracts~OrderSubmitted") == "contracts~ordersubmitted"
    found = load_entities(write_config(tmp_path, [{"Name": "a~b"}], [{"Name": "Ns~Msg"}]))
    assert ([q.name for q in found.queues], [t.name for t in found.topics]) == (["a~b"], ["ns~msg"])
    assert normalize_entity_name("x" * 260) == "x" * 260


def test_malformed_json_names_the_file_and_the_reason(tmp_path):
    path = tmp_path / "Config.json"
    path.write_text('{"UserConfig": {"Namespaces": [}')
    with pytest.raises(ConfigError) as info:
        load_entities(path)
    assert str(path) in str(info.value) and "line 1" in str(info.value)


def test_wrong_shape_and_missing_file_are_config_errors(tmp_path):
    path = tmp_path / "Config.json"
    path.write_text('{"Queues": []}')
    with pytest.raises(ConfigError, match="UserConfig"):
        load_entities(path)
    with pytest.raises(ConfigError, match="cannot read"):
        load_entities(tmp_path / "missing.json")


def test_byte_order_mark_is_tolerated(tmp_path):
    path = tmp_path / "Config.json"
    path.write_bytes(b"\xef\xbb\xbf" + SAMPLE.read_bytes())
    assert len(load_entities(path).queues) == 3


# --- Settings -----------------------------------------------------------------------------------


def test_settings_defaults_match_the_emulator_credentials():
    s = Settings()
    s.validate()
    assert (s.host, s.port, s.http_port, s.redis_url) == ("127.0.0.1", 5672, 5300, None)
    assert s.sas_keys == {"RootManageSharedAccessKey": "SAS_KEY_VALUE"}
    assert s.max_message_size == 1024 * 1024
    assert s.connection_string() == (
        "Endpoint=sb://localhost:5672;SharedAccessKeyName=RootManageSharedAccessKey;"
        "SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;"
    )


@pytest.mark.parametrize(
    "changes",
    [
        {"port": 70000},
        {"http_port": -1},
        {"log_level": "loud"},
        {"log_format": "xml"},
        {"max_message_size": 100 * 1024 * 1024 + 1},
        {"sweep_interval_s": 0},
        {"sas_keys": {}},
        {"redis_url": "localhost:6379"},
        {"config_path": "/nonexistent/Config.json"},
        {"tls_port": 65536},
        {"ws_port": -1},
        {"tls_cert": "/nonexistent/cert.pem", "tls_key": "/nonexistent/key.pem"},
        {"tls_key": __file__},  # a key without its certificate
        {"http_connections": -1},
        {"http_request_timeout_s": 0},
        {"hostnames": ["http://busd"]},
        {"hostnames": ["busd:5300"]},
        {"allowed_origins": ["app.example"]},
        {"allowed_origins": ["https://app.example/path"]},
    ],
)
def test_settings_validation_refuses_bad_values(changes):
    with pytest.raises(ConfigError):
        Settings(**changes).validate()


def test_host_names_and_origins_take_their_own_forms():
    Settings(
        hostnames=["busd", "busd.internal.", "10.0.0.5", "::1"],
        allowed_origins=["https://app.example:8443", "http://localhost", "null", "*"],
    ).validate()


@pytest.mark.parametrize(
    "url",
    [
        "redis://h:6379/0",
        "rediss://h:6380",
        "unix:///run/redis.sock",
        "valkey://h",
        "redis+cluster://h:7000",
        "rediss+cluster://h:7000",
        "valkey+cluster://h:7000",
        "redis://h:7000?cluster=true",
    ],
)
def test_settings_accept_every_store_url_the_store_opens(url):
    Settings(redis_url=url).validate()


def test_tls_listener_defaults_to_5671_and_may_be_off():
    assert (Settings().tls_port, Settings().ws_port) == (5671, 5443)
    Settings(tls_port=None, ws_port=None).validate()


def test_settings_accept_100_mib_messages_and_any_case_log_level():
    s = Settings(max_message_size=100 * 1024 * 1024, log_level="DEBUG", log_format="JSON")
    s.validate()
    assert (s.log_level, s.log_format) == ("debug", "json")


@pytest.mark.parametrize(
    "key, message",
    [
        ("queues", "unknown key 'queues' (did you mean 'Queues'?)"),
        ("Topic", "unknown key 'Topic' (did you mean 'Topics'?)"),
        ("Colour", "unknown key 'Colour' (a namespace has 'Name', 'Queues', 'Topics'"),
    ],
)
def test_a_misspelt_namespace_key_names_the_expected_one(tmp_path, key, message):
    """Read as the emulator's keys are spelt: "queues" would otherwise leave busd with none."""
    path = write_config(tmp_path, namespaces=[{"Name": "sbemulatorns", key: [{"Name": "q"}]}])
    with pytest.raises(ConfigError) as info:
        load_entities(path)
    assert str(path) in str(info.value) and "namespace 'sbemulatorns'" in str(info.value)
    assert message in str(info.value)
