"""A topic and its subscriptions made for one test, with a rule."""

from azure.servicebus import ServiceBusClient, ServiceBusMessage
from helpers import receive_all


def test_each_subscription_gets_what_its_rule_takes(
    busd_broker, busd_topic_factory, busd_subscription_factory
):
    topic = busd_topic_factory()
    everything = busd_subscription_factory(topic)
    red = busd_subscription_factory(topic, rules={"red": "color = 'red'"})
    with ServiceBusClient.from_connection_string(busd_broker.connection_string) as client:
        with client.get_topic_sender(topic) as sender:
            sender.send_messages(
                [
                    ServiceBusMessage(color, application_properties={"color": color})
                    for color in ("red", "blue", "red")
                ]
            )
        for subscription, expected in ((everything, ["red", "blue", "red"]), (red, ["red", "red"])):
            with client.get_subscription_receiver(topic, subscription) as receiver:
                got = receive_all(receiver, len(expected))
                for message in got:
                    receiver.complete_message(message)
                assert [str(m) for m in got] == expected
                assert receiver.peek_messages(max_message_count=10) == []
