package busd.sdk;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.azure.core.exception.ResourceExistsException;
import com.azure.core.exception.ResourceNotFoundException;
import com.azure.messaging.servicebus.ServiceBusMessage;
import com.azure.messaging.servicebus.ServiceBusReceivedMessage;
import com.azure.messaging.servicebus.ServiceBusReceiverClient;
import com.azure.messaging.servicebus.ServiceBusSenderClient;
import com.azure.messaging.servicebus.administration.ServiceBusAdministrationClient;
import com.azure.messaging.servicebus.administration.models.CreateQueueOptions;
import com.azure.messaging.servicebus.administration.models.CreateSubscriptionOptions;
import com.azure.messaging.servicebus.administration.models.CreateTopicOptions;
import com.azure.messaging.servicebus.administration.models.QueueProperties;
import com.azure.messaging.servicebus.administration.models.QueueRuntimeProperties;
import com.azure.messaging.servicebus.administration.models.RuleProperties;
import com.azure.messaging.servicebus.administration.models.SqlRuleFilter;
import com.azure.messaging.servicebus.administration.models.SubscriptionProperties;
import com.azure.messaging.servicebus.administration.models.SubscriptionRuntimeProperties;
import com.azure.messaging.servicebus.administration.models.TopicProperties;
import com.azure.messaging.servicebus.administration.models.TopicRuntimeProperties;
import com.azure.core.util.Context;
import java.time.Duration;
import java.time.OffsetDateTime;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.Test;

/** ServiceBusAdministrationClient over HTTPS: queues, topics, subscriptions and rules, and their counts. */
class AdministrationTest {
    final ServiceBusAdministrationClient admin = Busd.admin();

    @Test
    void queueCrudAndRuntimeCounts() {
        String name = Busd.unique("java-admin-q");
        QueueProperties created = admin.createQueue(name, new CreateQueueOptions()
            .setLockDuration(Duration.ofSeconds(45))
            .setMaxDeliveryCount(5)
            .setUserMetadata("from java"));
        assertEquals(name, created.getName());
        assertEquals(Duration.ofSeconds(45), created.getLockDuration());
        assertEquals(5, created.getMaxDeliveryCount());
        assertEquals("from java", created.getUserMetadata());
        assertThrows(ResourceExistsException.class, () -> admin.createQueue(name));
        assertTrue(admin.getQueueExists(name));
        assertFalse(admin.getQueueExists(name + "-missing"));
        assertThrows(ResourceNotFoundException.class, () -> admin.getQueue(name + "-missing"));

        QueueProperties properties = admin.getQueue(name);
        properties.setMaxDeliveryCount(7);
        QueueProperties updated = admin.updateQueue(properties);
        assertEquals(7, updated.getMaxDeliveryCount());
        assertEquals(7, admin.getQueue(name).getMaxDeliveryCount());
        List<String> names = new ArrayList<>();
        admin.listQueues().forEach(q -> names.add(q.getName()));
        assertTrue(names.contains(name), names.toString());

        try (ServiceBusSenderClient sender = Busd.client().sender().queueName(name).buildClient()) {
            sender.sendMessages(List.of(new ServiceBusMessage("1"), new ServiceBusMessage("2"),
                new ServiceBusMessage("3")));
            sender.scheduleMessage(new ServiceBusMessage("later"), OffsetDateTime.now().plusHours(1));
        }
        ServiceBusReceiverClient receiver = Busd.client().receiver().queueName(name).buildClient();
        try {
            ServiceBusReceivedMessage first = Busd.receive(receiver, 1, Duration.ofSeconds(15)).get(0);
            receiver.deadLetter(first);
        } finally {
            receiver.close();
        }
        QueueRuntimeProperties runtime = admin.getQueueRuntimeProperties(name);
        assertEquals(2, runtime.getActiveMessageCount());
        assertEquals(1, runtime.getDeadLetterMessageCount());
        assertEquals(1, runtime.getScheduledMessageCount());
        assertEquals(4, runtime.getTotalMessageCount());
        assertTrue(runtime.getSizeInBytes() > 0);

        admin.deleteQueue(name);
        assertFalse(admin.getQueueExists(name));
        assertThrows(ResourceNotFoundException.class, () -> admin.deleteQueue(name));
    }

    @Test
    void topicSubscriptionAndRuleCrud() {
        String topic = Busd.unique("java-admin-t");
        TopicProperties created = admin.createTopic(topic, new CreateTopicOptions()
            .setDefaultMessageTimeToLive(Duration.ofHours(1)));
        assertEquals(Duration.ofHours(1), created.getDefaultMessageTimeToLive());
        assertTrue(admin.getTopicExists(topic));

        SubscriptionProperties sub = admin.createSubscription(topic, "sub1", new CreateSubscriptionOptions()
            .setSessionRequired(true).setMaxDeliveryCount(4));
        assertTrue(sub.isSessionRequired());
        assertEquals(4, sub.getMaxDeliveryCount());
        sub.setMaxDeliveryCount(6);
        assertEquals(6, admin.updateSubscription(sub).getMaxDeliveryCount());
        assertTrue(admin.getSubscriptionExists(topic, "sub1"));
        List<String> subs = new ArrayList<>();
        admin.listSubscriptions(topic).forEach(s -> subs.add(s.getSubscriptionName()));
        assertEquals(List.of("sub1"), subs);

        RuleProperties rule = admin.createRuleWithResponse(topic, "sub1", "big", new com.azure.messaging.servicebus
            .administration.models.CreateRuleOptions(new SqlRuleFilter("size > 2")), Context.NONE).getValue();
        assertEquals("big", rule.getName());
        assertEquals("size > 2", ((SqlRuleFilter) admin.getRule(topic, "sub1", "big").getFilter()).getSqlExpression());
        rule.setFilter(new SqlRuleFilter("size > 3"));
        admin.updateRule(topic, "sub1", rule);
        assertEquals("size > 3", ((SqlRuleFilter) admin.getRule(topic, "sub1", "big").getFilter()).getSqlExpression());
        List<String> rules = new ArrayList<>();
        admin.listRules(topic, "sub1").forEach(r -> rules.add(r.getName()));
        assertEquals(List.of("$Default", "big"), rules);
        admin.deleteRule(topic, "sub1", "big");
        assertThrows(ResourceNotFoundException.class, () -> admin.getRule(topic, "sub1", "big"));

        try (ServiceBusSenderClient sender = Busd.client().sender().topicName(topic).buildClient()) {
            sender.sendMessage(new ServiceBusMessage("x").setSessionId("s"));
        }
        SubscriptionRuntimeProperties subRuntime = admin.getSubscriptionRuntimeProperties(topic, "sub1");
        assertEquals(1, subRuntime.getActiveMessageCount());
        assertEquals(1, subRuntime.getTotalMessageCount());
        TopicRuntimeProperties topicRuntime = admin.getTopicRuntimeProperties(topic);
        assertEquals(1, topicRuntime.getSubscriptionCount());

        admin.deleteSubscription(topic, "sub1");
        // not getSubscriptionExists: of a missing subscription Service Bus (and busd) answers
        // 200 with an empty feed, which this SDK version fails to read (docs/features.md)
        List<String> left = new ArrayList<>();
        admin.listSubscriptions(topic).forEach(s -> left.add(s.getSubscriptionName()));
        assertEquals(List.of(), left);
        admin.deleteTopic(topic);
        assertFalse(admin.getTopicExists(topic));
    }

    @Test
    void namespaceProperties() {
        assertEquals("sbemulatorns", admin.getNamespaceProperties().getName());
    }
}
