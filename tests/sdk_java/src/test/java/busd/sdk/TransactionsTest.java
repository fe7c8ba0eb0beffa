package busd.sdk;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;

import com.azure.messaging.servicebus.ServiceBusClientBuilder;
import com.azure.messaging.servicebus.ServiceBusMessage;
import com.azure.messaging.servicebus.ServiceBusReceivedMessage;
import com.azure.messaging.servicebus.ServiceBusReceiverClient;
import com.azure.messaging.servicebus.ServiceBusSenderClient;
import com.azure.messaging.servicebus.ServiceBusSessionReceiverClient;
import com.azure.messaging.servicebus.ServiceBusTransactionContext;
import com.azure.messaging.servicebus.models.CompleteOptions;
import java.time.Duration;
import java.util.List;
import org.junit.jupiter.api.Test;

/**
 * ServiceBusTransactionContext: a session message completed and a message sent in one
 * transaction; committed, both happen; rolled back, neither.
 */
class TransactionsTest {
    @Test
    void completeAndSendCommitTogetherAndRollBackTogether() {
        String id = Busd.unique("txn");
        // one builder: the receiver and the sender share its connection, as a transaction needs
        ServiceBusClientBuilder builder = Busd.client().enableCrossEntityTransactions();
        ServiceBusSenderClient input = builder.sender().queueName("java-txn-in").buildClient();
        ServiceBusSenderClient output = builder.sender().queueName("java-txn-out").buildClient();
        ServiceBusSessionReceiverClient sessions = builder.sessionReceiver().queueName("java-txn-in").buildClient();
        ServiceBusReceiverClient results = Busd.client().receiver().queueName("java-txn-out").buildClient();
        try {
            input.sendMessages(List.of(new ServiceBusMessage("a").setSessionId(id),
                new ServiceBusMessage("b").setSessionId(id)));
            ServiceBusReceiverClient receiver = sessions.acceptSession(id);
            List<ServiceBusReceivedMessage> got = Busd.receive(receiver, 2, Duration.ofSeconds(15));
            assertEquals(2, got.size());

            // rolled back: the completion and the send both undone
            ServiceBusTransactionContext rolledBack = receiver.createTransaction();
            receiver.complete(got.get(0), new CompleteOptions().setTransactionContext(rolledBack));
            output.sendMessage(new ServiceBusMessage("from a, rolled back"), rolledBack);
            receiver.rollbackTransaction(rolledBack);
            assertEquals(List.of(), Busd.receive(results, 1, Duration.ofSeconds(3)));
            receiver.close();

            // the session again (the queue has no other): both messages are back
            ServiceBusReceiverClient again = sessions.acceptNextSession();
            assertEquals(id, again.getSessionId());
            List<ServiceBusReceivedMessage> back = Busd.receive(again, 2, Duration.ofSeconds(15));
            assertEquals(List.of("a", "b"), List.of(back.get(0).getBody().toString(), back.get(1).getBody().toString()));

            // committed: both completions and the send at once
            ServiceBusTransactionContext committed = again.createTransaction();
            again.complete(back.get(0), new CompleteOptions().setTransactionContext(committed));
            again.complete(back.get(1), new CompleteOptions().setTransactionContext(committed));
            output.sendMessage(new ServiceBusMessage("from a and b"), committed);
            assertEquals(List.of(), Busd.receive(results, 1, Duration.ofSeconds(2))); // not before the commit
            again.commitTransaction(committed);
            List<ServiceBusReceivedMessage> out = Busd.receive(results, 1, Duration.ofSeconds(15));
            assertEquals("from a and b", out.get(0).getBody().toString());
            results.complete(out.get(0));
            assertNull(again.peekMessage());
            again.close();
        } finally {
            input.close();
            output.close();
            sessions.close();
            results.close();
        }
    }
}
