package busd.sdk;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;

import com.azure.core.amqp.AmqpRetryOptions;
import com.azure.messaging.servicebus.ServiceBusClientBuilder;
import com.azure.messaging.servicebus.ServiceBusMessage;
import com.azure.messaging.servicebus.ServiceBusReceiverClient;
import com.azure.messaging.servicebus.ServiceBusSenderClient;
import com.azure.messaging.servicebus.ServiceBusSessionReceiverClient;
import java.io.ByteArrayOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Arrays;
import java.util.List;
import org.junit.jupiter.api.Test;

/** The Java example of docs/quickstart.md, run as it stands there (test_sdk_java.py checks the two agree). */
class QuickstartTest {
    @Test
    void quickstartSendsTakesTheSessionAndCompletes() {
        PrintStream stdout = System.out;
        ByteArrayOutputStream printed = new ByteArrayOutputStream();
        System.setOut(new PrintStream(printed, true, StandardCharsets.UTF_8));
        try {
            String conn = Busd.CONNECTION_STRING; // the document's, with busd's port
            // quickstart:begin
            // setMaxRetries(0) while developing
            ServiceBusClientBuilder builder = new ServiceBusClientBuilder()
                    .connectionString(conn)
                    .retryOptions(new AmqpRetryOptions().setMaxRetries(0));

            ServiceBusSenderClient sender = builder.sender().queueName("session-queue").buildClient();
            for (int i = 0; i < 3; i++) {
                sender.sendMessage(new ServiceBusMessage("step " + i).setSessionId("order-42"));
            }
            sender.close();

            ServiceBusSessionReceiverClient sessions =
                    builder.sessionReceiver().queueName("session-queue").buildClient();
            ServiceBusReceiverClient receiver = sessions.acceptNextSession();
            receiver.receiveMessages(10, Duration.ofSeconds(5)).forEach(message -> {
                System.out.println(receiver.getSessionId() + " " + message.getBody());
                receiver.complete(message);
            });
            receiver.close();
            sessions.close();
            // quickstart:end
        } finally {
            System.setOut(stdout);
        }
        List<String> lines = Arrays.asList(printed.toString(StandardCharsets.UTF_8).strip().split("\\R"));
        assertEquals(List.of("order-42 step 0", "order-42 step 1", "order-42 step 2"), lines);

        // completed: nothing is left in the session
        ServiceBusSessionReceiverClient again = Busd.client().sessionReceiver().queueName("session-queue")
            .buildClient();
        ServiceBusReceiverClient session = again.acceptSession("order-42");
        assertNull(session.peekMessage());
        session.close();
        again.close();
    }
}
