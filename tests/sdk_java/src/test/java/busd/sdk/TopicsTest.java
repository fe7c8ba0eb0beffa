package busd.sdk;

import static org.junit.jupiter.api.Assertions.assertEquals;

import com.azure.messaging.servicebus.ServiceBusMessage;
import com.azure.messaging.servicebus.ServiceBusReceivedMessage;
import com.azure.messaging.servicebus.ServiceBusReceiverClient;
import com.azure.messaging.servicebus.ServiceBusSenderClient;
import com.azure.messaging.servicebus.administration.ServiceBusAdministrationClient;
import com.azure.messaging.servicebus.administration.models.CorrelationRuleFilter;
import com.azure.messaging.servicebus.administration.models.CreateRuleOptions;
import com.azure.messaging.servicebus.administration.models.SqlRuleAction;
import com.azure.messaging.servicebus.administration.models.SqlRuleFilter;
import com.azure.core.util.Context;
import java.time.Duration;
import java.util.List;
import java.util.stream.Collectors;
import org.junit.jupiter.api.Test;

/** A topic whose subscriptions filter with SQL and correlation rules made through the administration client. */
class TopicsTest {
    @Test
    void sqlAndCorrelationFiltersPickTheirMessages() {
        ServiceBusAdministrationClient admin = Busd.admin();
        String topic = Busd.unique("java-topic");
        admin.createTopic(topic);
        for (String sub : List.of("all", "sql", "corr")) {
            admin.createSubscription(topic, sub);
        }
        admin.deleteRule(topic, "sql", "$Default");
        // createRule(topic, rule, subscription, options) in the sync client: the WithResponse form names them in order
        admin.createRuleWithResponse(topic, "sql", "red-and-big", new CreateRuleOptions(new SqlRuleFilter("color = 'red' AND size > 2"))
            .setAction(new SqlRuleAction("SET matched = 'sql'")), Context.NONE);
        admin.deleteRule(topic, "corr", "$Default");
        CorrelationRuleFilter correlation = new CorrelationRuleFilter().setCorrelationId("order-7").setLabel("created");
        correlation.getProperties().put("region", "eu");
        admin.createRuleWithResponse(topic, "corr", "order-7", new CreateRuleOptions(correlation), Context.NONE);

        try (ServiceBusSenderClient sender = Busd.client().sender().topicName(topic).buildClient()) {
            sender.sendMessage(message("red-3", "red", 3, null, null, null));
            sender.sendMessage(message("red-1", "red", 1, null, null, null));
            sender.sendMessage(message("blue-5", "blue", 5, null, null, null));
            sender.sendMessage(message("corr-eu", "green", 0, "order-7", "created", "eu"));
            sender.sendMessage(message("corr-us", "green", 0, "order-7", "created", "us"));
        }
        assertEquals(List.of("red-3", "red-1", "blue-5", "corr-eu", "corr-us"), drain(topic, "all", 5));
        List<ServiceBusReceivedMessage> sql = receive(topic, "sql", 1);
        assertEquals(List.of("red-3"), bodies(sql));
        assertEquals("sql", sql.get(0).getApplicationProperties().get("matched"));
        assertEquals(List.of("corr-eu"), drain(topic, "corr", 1));
        admin.deleteTopic(topic);
    }

    static ServiceBusMessage message(String body, String color, int size, String correlationId, String subject,
        String region) {
        ServiceBusMessage m = new ServiceBusMessage(body).setCorrelationId(correlationId).setSubject(subject);
        m.getApplicationProperties().put("color", color);
        m.getApplicationProperties().put("size", size);
        if (region != null) {
            m.getApplicationProperties().put("region", region);
        }
        return m;
    }

    static List<ServiceBusReceivedMessage> receive(String topic, String sub, int expected) {
        ServiceBusReceiverClient receiver = Busd.client().receiver().topicName(topic).subscriptionName(sub).buildClient();
        try {
            List<ServiceBusReceivedMessage> got = Busd.receive(receiver, expected, Duration.ofSeconds(15));
            receiver.receiveMessages(1, Duration.ofSeconds(1)).forEach(got::add); // one too many?
            got.forEach(receiver::complete);
            return got;
        } finally {
            receiver.close();
        }
    }

    static List<String> drain(String topic, String sub, int expected) {
        return bodies(receive(topic, sub, expected));
    }

    static List<String> bodies(List<ServiceBusReceivedMessage> messages) {
        return messages.stream().map(m -> m.getBody().toString()).collect(Collectors.toList());
    }
}
