// A session processor on one ServiceBusClient (one AMQP connection): accept the next session,
// complete its message, close the receiver, again and again. The SDK begins an AMQP session
// for every link on that connection. Prints {"step": "held", ...} and keeps the connection
// open until a line comes on stdin, so tests/e2e/test_link_memory.py can read busd's
// /metrics meanwhile; then {"step": "done"}.
// env: BUSD_CONN (connection string), BUSD_QUEUE, BUSD_SESSIONS (count)
import { ServiceBusClient } from "@azure/service-bus";
import { createInterface } from "node:readline";

const client = new ServiceBusClient(process.env.BUSD_CONN, {
  retryOptions: { maxRetries: 0, timeoutInMs: 20000 },
});
const queue = process.env.BUSD_QUEUE;
const count = Number(process.env.BUSD_SESSIONS);

try {
  const sender = client.createSender(queue);
  const messages = [];
  for (let i = 0; i < count; i++) messages.push({ body: `m${i}`, sessionId: `s${i}` });
  await sender.sendMessages(messages);
  await sender.close();
  const completed = [];
  for (let i = 0; i < count; i++) {
    const receiver = await client.acceptNextSession(queue, { maxAutoLockRenewalDurationInMs: 0 });
    const [message] = await receiver.receiveMessages(1, { maxWaitTimeInMs: 10000 });
    await receiver.completeMessage(message);
    completed.push(receiver.sessionId);
    await receiver.close();
  }
  console.log(JSON.stringify({ step: "held", value: completed.length }));
  const lines = createInterface({ input: process.stdin });
  for await (const _ of lines) break;
  console.log(JSON.stringify({ step: "done", value: true }));
} finally {
  await client.close();
}
