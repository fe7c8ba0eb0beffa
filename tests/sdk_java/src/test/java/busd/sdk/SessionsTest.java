package busd.sdk;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.azure.core.amqp.exception.AmqpErrorCondition;
import com.azure.core.amqp.exception.AmqpException;
import com.azure.messaging.servicebus.ServiceBusException;
import com.azure.messaging.servicebus.ServiceBusFailureReason;
import com.azure.messaging.servicebus.ServiceBusMessage;
import com.azure.messaging.servicebus.ServiceBusMessageBatch;
import com.azure.messaging.servicebus.ServiceBusReceivedMessage;
import com.azure.messaging.servicebus.ServiceBusReceiverClient;
import com.azure.messaging.servicebus.ServiceBusSenderClient;
import com.azure.messaging.servicebus.ServiceBusSessionReceiverClient;
import com.azure.messaging.servicebus.models.DeadLetterOptions;
import com.azure.messaging.servicebus.models.ServiceBusReceiveMode;
import com.azure.messaging.servicebus.models.SubQueue;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.time.OffsetDateTime;
import java.util.ArrayList;
import java.util.List;
import java.util.stream.Collectors;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * Sessions through ServiceBusSessionReceiverClient: named and next-available accept, state,
 * lock renewal and loss, every settlement, scheduling, peek, receive-and-delete, batches and
 * request-reply. Queue "java-sessions" (sessions) is used by named session only; the
 * next-available test has "java-next" to itself.
 */
class SessionsTest {
    static final String QUEUE = "java-sessions";
    static ServiceBusSenderClient sender;
    static ServiceBusSessionReceiverClient sessions;

    @BeforeAll
    static void open() {
        sender = Busd.client().sender().queueName(QUEUE).buildClient();
        sessions = Busd.client().sessionReceiver().queueName(QUEUE).buildClient();
    }

    @AfterAll
    static void close() {
        sender.close();
        sessions.close();
    }

    static List<ServiceBusMessage> messages(String sessionId, int count) {
        List<ServiceBusMessage> batch = new ArrayList<>();
        for (int i = 0; i < count; i++) {
            batch.add(new ServiceBusMessage(sessionId + "/" + i).setSessionId(sessionId).setMessageId(sessionId + "-" + i));
        }
        return batch;
    }

    static List<String> bodies(List<ServiceBusReceivedMessage> messages) {
        return messages.stream().map(m -> m.getBody().toString()).collect(Collectors.toList());
    }

    @Test
    void namedSessionGetsItsMessagesInOrderWithTheirProperties() {
        String id = Busd.unique("named");
        sender.sendMessages(messages(id, 5));
        sender.sendMessages(messages(Busd.unique("other"), 2));
        ServiceBusReceiverClient receiver = sessions.acceptSession(id);
        try {
            assertEquals(id, receiver.getSessionId());
            List<ServiceBusReceivedMessage> got = Busd.receive(receiver, 5, Duration.ofSeconds(15));
            assertEquals(List.of(id + "/0", id + "/1", id + "/2", id + "/3", id + "/4"), bodies(got));
            for (ServiceBusReceivedMessage m : got) {
                assertEquals(id, m.getSessionId());
                assertEquals(0, m.getDeliveryCount()); // earlier deliveries: none
                assertNotNull(m.getLockedUntil());
                assertNotNull(m.getEnqueuedTime());
                receiver.complete(m);
            }
            assertTrue(got.get(0).getSequenceNumber() < got.get(4).getSequenceNumber());
            assertNull(receiver.peekMessage());
        } finally {
            receiver.close();
        }
    }

    @Test
    void nextAvailableSessionTakesEachSessionOnce() {
        String a = Busd.unique("next-a");
        String b = Busd.unique("next-b");
        try (ServiceBusSenderClient next = Busd.client().sender().queueName("java-next").buildClient()) {
            next.sendMessages(messages(a, 2));
            next.sendMessages(messages(b, 3));
        }
        ServiceBusSessionReceiverClient nextSessions = Busd.client().sessionReceiver().queueName("java-next")
            .buildClient();
        ServiceBusReceiverClient first = nextSessions.acceptNextSession();
        ServiceBusReceiverClient second = nextSessions.acceptNextSession();
        try {
            assertEquals(List.of(a, b).stream().sorted().collect(Collectors.toList()),
                List.of(first.getSessionId(), second.getSessionId()).stream().sorted().collect(Collectors.toList()));
            for (ServiceBusReceiverClient receiver : List.of(first, second)) {
                int expected = receiver.getSessionId().equals(a) ? 2 : 3;
                List<ServiceBusReceivedMessage> got = Busd.receive(receiver, expected, Duration.ofSeconds(15));
                assertEquals(expected, got.size());
                got.forEach(m -> assertEquals(receiver.getSessionId(), m.getSessionId()));
                got.forEach(receiver::complete);
            }
        } finally {
            first.close();
            second.close();
            nextSessions.close();
        }
    }

    @Test
    void sessionStateIsKeptAndTheLockRenews() {
        String id = Busd.unique("state");
        sender.sendMessages(messages(id, 1));
        ServiceBusReceiverClient receiver = sessions.acceptSession(id);
        try {
            assertNull(receiver.getSessionState());
            receiver.setSessionState("step 3".getBytes(StandardCharsets.UTF_8));
            assertArrayEquals("step 3".getBytes(StandardCharsets.UTF_8), receiver.getSessionState());
            OffsetDateTime renewed = receiver.renewSessionLock();
            assertTrue(renewed.isAfter(OffsetDateTime.now().plusSeconds(20)), "renewed until " + renewed);
            // a session's messages are locked by the session lock: the SDK renews no message lock
            ServiceBusReceivedMessage message = Busd.receive(receiver, 1, Duration.ofSeconds(15)).get(0);
            assertEquals(receiver.getSessionId(), message.getSessionId());
            receiver.complete(message);
        } finally {
            receiver.close();
        }
        // another client: the SDK names a session's link after the session, and on the same
        // client may hand back the link just closed
        ServiceBusSessionReceiverClient other = Busd.client().sessionReceiver().queueName(QUEUE).buildClient();
        ServiceBusReceiverClient again = other.acceptSession(id);
        try {
            assertArrayEquals("step 3".getBytes(StandardCharsets.UTF_8), again.getSessionState());
            again.setSessionState(null);
            assertNull(again.getSessionState());
        } finally {
            again.close();
            other.close();
        }
    }

    @Test
    void lostSessionLockFailsTheHolderAndFreesTheSession() throws Exception {
        String id = Busd.unique("lost");
        sender.sendMessages(messages(id, 2));
        ServiceBusReceiverClient receiver = sessions.acceptSession(id);
        try {
            List<ServiceBusReceivedMessage> got = Busd.receive(receiver, 2, Duration.ofSeconds(15));
            assertEquals(2, got.size());
            receiver.complete(got.get(0));
            String answer = Busd.fault("{\"kind\": \"session-lock-lost\", \"entity\": \"" + QUEUE
                + "\", \"session\": \"" + id + "\"}");
            assertTrue(answer.replace(" ", "").contains("\"released\":true"), answer);
            ServiceBusException error = assertThrows(ServiceBusException.class, () -> receiver.complete(got.get(1)));
            assertEquals(ServiceBusFailureReason.SESSION_LOCK_LOST, error.getReason(), error.toString());
        } finally {
            receiver.close();
        }
        // the next holder gets the message back, its delivery count raised (another client:
        // this one may hand back the link just closed, named after the session as it is)
        ServiceBusSessionReceiverClient others = Busd.client().sessionReceiver().queueName(QUEUE).buildClient();
        ServiceBusReceiverClient next = others.acceptSession(id);
        try {
            List<ServiceBusReceivedMessage> again = Busd.receive(next, 1, Duration.ofSeconds(15));
            assertEquals(List.of(id + "/1"), bodies(again));
            assertEquals(1, again.get(0).getDeliveryCount());
            next.complete(again.get(0));
        } finally {
            next.close();
            others.close();
        }
    }

    @Test
    void abandonDeferAndDeadLetter() {
        String id = Busd.unique("settle");
        sender.sendMessages(messages(id, 3));
        ServiceBusReceiverClient receiver = sessions.acceptSession(id);
        try {
            List<ServiceBusReceivedMessage> got = Busd.receive(receiver, 3, Duration.ofSeconds(15));
            assertEquals(3, got.size());
            receiver.abandon(got.get(0));
            receiver.defer(got.get(1));
            receiver.deadLetter(got.get(2), new DeadLetterOptions().setDeadLetterReason("bad-order")
                .setDeadLetterErrorDescription("total is negative"));

            ServiceBusReceivedMessage abandoned = Busd.receive(receiver, 1, Duration.ofSeconds(15)).get(0);
            assertEquals(id + "/0", abandoned.getBody().toString());
            assertEquals(1, abandoned.getDeliveryCount());
            receiver.complete(abandoned);

            ServiceBusReceivedMessage deferred = receiver.receiveDeferredMessage(got.get(1).getSequenceNumber());
            assertEquals(id + "/1", deferred.getBody().toString());
            assertEquals(got.get(1).getSequenceNumber(), deferred.getSequenceNumber());
            receiver.complete(deferred);
            assertNull(receiver.peekMessage());
        } finally {
            receiver.close();
        }
        ServiceBusReceiverClient deadLetters = Busd.client().receiver().queueName(QUEUE)
            .subQueue(SubQueue.DEAD_LETTER_QUEUE).buildClient();
        try {
            List<ServiceBusReceivedMessage> dead = Busd.receive(deadLetters, 1, Duration.ofSeconds(15));
            assertEquals(List.of(id + "/2"), bodies(dead));
            assertEquals("bad-order", dead.get(0).getDeadLetterReason());
            assertEquals("total is negative", dead.get(0).getDeadLetterErrorDescription());
            assertEquals(id, dead.get(0).getSessionId());
            deadLetters.complete(dead.get(0));
        } finally {
            deadLetters.close();
        }
    }

    @Test
    void scheduledMessageArrivesAndCancelledOneNever() {
        String id = Busd.unique("sched");
        OffsetDateTime at = OffsetDateTime.now().plusSeconds(2);
        long kept = sender.scheduleMessage(new ServiceBusMessage("kept").setSessionId(id), at);
        long cancelled = sender.scheduleMessage(new ServiceBusMessage("cancelled").setSessionId(id), at);
        assertTrue(kept > 0 && cancelled > kept);
        sender.cancelScheduledMessage(cancelled);
        ServiceBusReceiverClient receiver = sessions.acceptSession(id);
        try {
            ServiceBusReceivedMessage scheduled = receiver.peekMessage();
            assertNotNull(scheduled);
            assertEquals(kept, scheduled.getSequenceNumber());
            assertEquals(com.azure.messaging.servicebus.models.ServiceBusMessageState.SCHEDULED, scheduled.getState());
            List<ServiceBusReceivedMessage> got = Busd.receive(receiver, 1, Duration.ofSeconds(15));
            assertEquals(List.of("kept"), bodies(got));
            assertTrue(!got.get(0).getEnqueuedTime().isBefore(at.minusSeconds(1)));
            receiver.complete(got.get(0));
            assertNull(receiver.peekMessage()); // the cancelled one is gone, not scheduled
        } finally {
            receiver.close();
        }
    }

    @Test
    void peekLeavesMessagesWhereTheyAre() {
        String id = Busd.unique("peek");
        sender.sendMessages(messages(id, 3));
        ServiceBusReceiverClient receiver = sessions.acceptSession(id);
        try {
            List<ServiceBusReceivedMessage> peeked = new ArrayList<>();
            receiver.peekMessages(10).forEach(peeked::add);
            assertEquals(List.of(id + "/0", id + "/1", id + "/2"), bodies(peeked));
            ServiceBusReceivedMessage last = receiver.peekMessage(peeked.get(2).getSequenceNumber());
            assertEquals(id + "/2", last.getBody().toString());
            assertEquals(0, peeked.get(0).getDeliveryCount());
            List<ServiceBusReceivedMessage> got = Busd.receive(receiver, 3, Duration.ofSeconds(15));
            assertEquals(bodies(peeked), bodies(got));
            got.forEach(receiver::complete);
        } finally {
            receiver.close();
        }
    }

    @Test
    void receiveAndDeleteTakesMessagesAtOnce() {
        String id = Busd.unique("rad");
        sender.sendMessages(messages(id, 3));
        ServiceBusSessionReceiverClient deleting = Busd.client().sessionReceiver().queueName(QUEUE)
            .receiveMode(ServiceBusReceiveMode.RECEIVE_AND_DELETE).buildClient();
        ServiceBusReceiverClient receiver = deleting.acceptSession(id);
        try {
            List<ServiceBusReceivedMessage> got = Busd.receive(receiver, 3, Duration.ofSeconds(15));
            assertEquals(List.of(id + "/0", id + "/1", id + "/2"), bodies(got));
            assertNull(receiver.peekMessage());
        } finally {
            receiver.close();
            deleting.close();
        }
    }

    @Test
    void batchesGoInOneSend() {
        String id = Busd.unique("batch");
        ServiceBusMessageBatch batch = sender.createMessageBatch();
        assertTrue(batch.getMaxSizeInBytes() > 1000, "max size " + batch.getMaxSizeInBytes());
        for (ServiceBusMessage m : messages(id, 50)) {
            assertTrue(batch.tryAddMessage(m));
        }
        sender.sendMessages(batch);
        ServiceBusReceiverClient receiver = sessions.acceptSession(id);
        try {
            List<ServiceBusReceivedMessage> got = Busd.receive(receiver, 50, Duration.ofSeconds(20));
            assertEquals(50, got.size());
            for (int i = 0; i < 50; i++) {
                assertEquals(id + "/" + i, got.get(i).getBody().toString());
                receiver.complete(got.get(i));
            }
        } finally {
            receiver.close();
        }
    }

    @Test
    void requestReplyOverReplyToSessionId() {
        String replySession = Busd.unique("reply-to");
        String requestSession = Busd.unique("request");
        try (ServiceBusSenderClient requests = Busd.client().sender().queueName("java-requests").buildClient()) {
            requests.sendMessage(new ServiceBusMessage("2+2").setSessionId(requestSession)
                .setReplyTo("java-replies").setReplyToSessionId(replySession).setMessageId("question-1"));
        }
        // the responder: takes the request's session, answers into the session it names
        ServiceBusSessionReceiverClient responder = Busd.client().sessionReceiver().queueName("java-requests")
            .buildClient();
        ServiceBusReceiverClient request = responder.acceptNextSession();
        try {
            ServiceBusReceivedMessage question = Busd.receive(request, 1, Duration.ofSeconds(15)).get(0);
            assertEquals("java-replies", question.getReplyTo());
            assertEquals(replySession, question.getReplyToSessionId());
            try (ServiceBusSenderClient replies = Busd.client().sender().queueName(question.getReplyTo())
                .buildClient()) {
                replies.sendMessage(new ServiceBusMessage("4").setSessionId(question.getReplyToSessionId())
                    .setCorrelationId(question.getMessageId()));
            }
            request.complete(question);
        } finally {
            request.close();
            responder.close();
        }
        ServiceBusSessionReceiverClient requester = Busd.client().sessionReceiver().queueName("java-replies")
            .buildClient();
        ServiceBusReceiverClient reply = requester.acceptSession(replySession);
        try {
            ServiceBusReceivedMessage answer = Busd.receive(reply, 1, Duration.ofSeconds(15)).get(0);
            assertEquals("4", answer.getBody().toString());
            assertEquals("question-1", answer.getCorrelationId());
            reply.complete(answer);
        } finally {
            reply.close();
            requester.close();
        }
    }

    @Test
    void aSessionHasOneHolderAtATime() {
        String id = Busd.unique("busy");
        sender.sendMessages(messages(id, 1));
        ServiceBusReceiverClient holder = sessions.acceptSession(id);
        ServiceBusSessionReceiverClient other = Busd.client().sessionReceiver().queueName(QUEUE).buildClient();
        try {
            // the SDK hands the link's error on as it came: com.microsoft:session-cannot-be-locked
            AmqpException error = assertThrows(AmqpException.class, () -> other.acceptSession(id));
            assertEquals(AmqpErrorCondition.SESSION_CANNOT_BE_LOCKED, error.getErrorCondition(), error.toString());
        } finally {
            holder.close();
            other.close();
        }
        // let go, the session is free at once (another client, as above)
        ServiceBusSessionReceiverClient later = Busd.client().sessionReceiver().queueName(QUEUE).buildClient();
        ServiceBusReceiverClient after = later.acceptSession(id);
        try {
            List<ServiceBusReceivedMessage> got = Busd.receive(after, 1, Duration.ofSeconds(15));
            assertEquals(List.of(id + "/0"), bodies(got));
            after.complete(got.get(0));
        } finally {
            after.close();
            later.close();
        }
    }
}
