// Both JavaScript clients from one emulator connection string (the AMQP port): the
// administration client speaks HTTPS to the Endpoint's port (NODE_EXTRA_CA_CERTS trusts busd's
// certificate), ServiceBusClient plain AMQP. Prints one JSON line per step.
// Usage: node one_port.mjs <connection string> <queue>
import { ServiceBusAdministrationClient, ServiceBusClient } from "@azure/service-bus";

const [conn, name] = process.argv.slice(2);
const out = (step, value) => console.log(JSON.stringify({ step, value }));
const admin = new ServiceBusAdministrationClient(conn);
const client = new ServiceBusClient(conn);

out("createQueue", (await admin.createQueue(name, { maxDeliveryCount: 4 })).maxDeliveryCount);
const sender = client.createSender(name);
await sender.sendMessages([{ body: "one" }, { body: "two" }]);
await sender.close();
out("active", (await admin.getQueueRuntimeProperties(name)).activeMessageCount);
const receiver = client.createReceiver(name, { receiveMode: "receiveAndDelete" });
const got = [];
while (got.length < 2) {
  const batch = await receiver.receiveMessages(2 - got.length, { maxWaitTimeInMs: 5000 });
  if (batch.length === 0) break;
  got.push(...batch.map((m) => m.body));
}
await receiver.close();
out("received", got.sort());
out("total", (await admin.getQueueRuntimeProperties(name)).totalMessageCount);
await admin.deleteQueue(name);
out("exists", await admin.queueExists(name));
await client.close();
out("done", true);
