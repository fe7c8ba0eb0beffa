package busd.sdk;

import static org.junit.jupiter.api.Assertions.assertEquals;

import com.azure.core.amqp.AmqpTransportType;
import com.azure.messaging.servicebus.ServiceBusClientBuilder;
import com.azure.messaging.servicebus.ServiceBusMessage;
import com.azure.messaging.servicebus.ServiceBusReceivedMessage;
import com.azure.messaging.servicebus.ServiceBusReceiverClient;
import com.azure.messaging.servicebus.ServiceBusSenderClient;
import java.time.Duration;
import java.util.List;
import org.junit.jupiter.api.Test;

/**
 * AMQP over WebSockets (always wss from this SDK: with the emulator string, trusting any
 * certificate; with the TLS string, trusting busd's authority) and AMQP over TLS: a message
 * there and back on each.
 */
class TransportsTest {
    static void roundTrip(ServiceBusClientBuilder builder, String body) {
        try (ServiceBusSenderClient sender = builder.sender().queueName("java-ws").buildClient()) {
            sender.sendMessage(new ServiceBusMessage(body));
        }
        ServiceBusReceiverClient receiver = builder.receiver().queueName("java-ws").buildClient();
        try {
            List<ServiceBusReceivedMessage> got = Busd.receive(receiver, 1, Duration.ofSeconds(15));
            assertEquals(body, got.get(0).getBody().toString());
            receiver.complete(got.get(0));
        } finally {
            receiver.close();
        }
    }

    @Test
    void amqpOverWebSocketsWithTheEmulatorString() {
        roundTrip(new ServiceBusClientBuilder().connectionString(Busd.CONNECTION_STRING)
            .retryOptions(Busd.retries())
            .transportType(AmqpTransportType.AMQP_WEB_SOCKETS)
            // the SDK speaks TLS over WebSockets whatever the string (wss; with the emulator
            // flag it trusts any certificate)
            .customEndpointAddress("https://localhost:" + Busd.WS_PORT), "over wss, emulator string");
    }

    @Test
    void amqpOverSecureWebSockets() {
        roundTrip(new ServiceBusClientBuilder().connectionString(Busd.TLS_CONNECTION_STRING)
            .retryOptions(Busd.retries())
            .transportType(AmqpTransportType.AMQP_WEB_SOCKETS)
            .customEndpointAddress("https://localhost:" + Busd.WS_PORT), "over wss");
    }

    @Test
    void amqpOverTls() {
        roundTrip(new ServiceBusClientBuilder().connectionString(Busd.TLS_CONNECTION_STRING)
            .retryOptions(Busd.retries()), "over tls");
    }
}
