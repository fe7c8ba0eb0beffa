package busd.sdk;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.azure.messaging.servicebus.ServiceBusMessage;
import com.azure.messaging.servicebus.ServiceBusProcessorClient;
import com.azure.messaging.servicebus.ServiceBusReceivedMessageContext;
import com.azure.messaging.servicebus.ServiceBusSenderClient;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;

/**
 * ServiceBusProcessorClient over sessions, maxConcurrentSessions 8, 200 sessions x 20 messages:
 * every message handled once, in order within its session, and never two handlers of one
 * session at the same time (checked from what the handlers record).
 */
class ProcessorTest {
    static final String QUEUE = "java-processor";
    static final int SESSIONS = 200;
    static final int PER_SESSION = 20;

    @Test
    void sessionProcessorHandlesEveryMessageOnceInOrderOneHolderAtATime() throws Exception {
        String run = Busd.unique("p");
        try (ServiceBusSenderClient sender = Busd.client().sender().queueName(QUEUE).buildClient()) {
            for (int s = 0; s < SESSIONS; s++) {
                List<ServiceBusMessage> batch = new ArrayList<>();
                for (int i = 0; i < PER_SESSION; i++) {
                    batch.add(new ServiceBusMessage(Integer.toString(i)).setSessionId(run + "-" + s));
                }
                sender.sendMessages(batch);
            }
        }

        Map<String, List<Integer>> seen = new ConcurrentHashMap<>();
        Map<String, AtomicInteger> active = new ConcurrentHashMap<>();
        AtomicInteger overlaps = new AtomicInteger();
        AtomicInteger handled = new AtomicInteger();
        AtomicInteger maxConcurrent = new AtomicInteger();
        AtomicInteger concurrent = new AtomicInteger();
        ConcurrentLinkedQueue<String> errors = new ConcurrentLinkedQueue<>();

        ServiceBusProcessorClient processor = Busd.client().sessionProcessor().queueName(QUEUE)
            .maxConcurrentSessions(8)
            .sessionIdleTimeout(Duration.ofSeconds(1))
            .processMessage((ServiceBusReceivedMessageContext context) -> {
                String session = context.getMessage().getSessionId();
                int now = concurrent.incrementAndGet();
                maxConcurrent.accumulateAndGet(now, Math::max);
                if (active.computeIfAbsent(session, k -> new AtomicInteger()).incrementAndGet() != 1) {
                    overlaps.incrementAndGet();
                }
                seen.computeIfAbsent(session, k -> java.util.Collections.synchronizedList(new ArrayList<>()))
                    .add(Integer.parseInt(context.getMessage().getBody().toString()));
                try {
                    Thread.sleep(2); // long enough for a second holder of the session to overlap
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
                active.get(session).decrementAndGet();
                concurrent.decrementAndGet();
                handled.incrementAndGet();
            })
            .processError(context -> errors.add(context.getException().toString()))
            .buildProcessorClient();
        processor.start();
        try {
            long deadline = System.nanoTime() + Duration.ofSeconds(240).toNanos();
            while (handled.get() < SESSIONS * PER_SESSION && System.nanoTime() < deadline) {
                Thread.sleep(200);
            }
            Thread.sleep(2000); // anything delivered twice shows now
        } finally {
            processor.close();
        }

        int lost = 0;
        int outOfOrder = 0;
        int duplicates = 0;
        for (int s = 0; s < SESSIONS; s++) {
            List<Integer> got = seen.getOrDefault(run + "-" + s, List.of());
            List<Integer> copy;
            synchronized (got) {
                copy = new ArrayList<>(got);
            }
            lost += (int) java.util.stream.IntStream.range(0, PER_SESSION).filter(i -> !copy.contains(i)).count();
            duplicates += copy.size() - (int) copy.stream().distinct().count();
            for (int i = 1; i < copy.size(); i++) {
                if (copy.get(i) <= copy.get(i - 1)) {
                    outOfOrder++;
                }
            }
        }
        System.out.printf("processor: %d handled, %d lost, %d duplicates, %d out of order, %d overlaps, "
            + "at most %d handlers at once, %d errors%n", handled.get(), lost, duplicates, outOfOrder,
            overlaps.get(), maxConcurrent.get(), errors.size());
        assertEquals(0, lost, "lost");
        assertEquals(0, duplicates, "handled twice");
        assertEquals(0, outOfOrder, "out of order");
        assertEquals(0, overlaps.get(), "two handlers of one session at once");
        assertEquals(SESSIONS * PER_SESSION, handled.get());
        assertTrue(maxConcurrent.get() <= 8, "more than 8 sessions at once: " + maxConcurrent.get());
        assertTrue(errors.isEmpty(), "processor errors: " + errors);
    }
}
