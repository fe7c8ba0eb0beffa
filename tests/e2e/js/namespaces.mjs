// Two namespaces of one busd from the JavaScript SDK, chosen by the SAS key name
// (`<namespace>/RootManageSharedAccessKey`): each creates a queue of the same name, sends to
// it and receives only its own messages. Prints one JSON line per step.
// Usage: node namespaces.mjs <connection string of one> <connection string of the other>
import { ServiceBusAdministrationClient, ServiceBusClient } from "@azure/service-bus";

const conns = process.argv.slice(2);
const out = (step, value) => console.log(JSON.stringify({ step, value }));

for (const [i, conn] of conns.entries()) {
  const admin = new ServiceBusAdministrationClient(conn);
  await admin.createQueue("orders");
  const client = new ServiceBusClient(conn);
  const sender = client.createSender("orders");
  await sender.sendMessages({ body: `namespace ${i}` });
  await sender.close();
  await client.close();
}
for (const [i, conn] of conns.entries()) {
  const admin = new ServiceBusAdministrationClient(conn);
  const names = [];
  for await (const q of admin.listQueues()) names.push(q.name);
  out(`queues${i}`, names);
  const client = new ServiceBusClient(conn);
  const receiver = client.createReceiver("orders", { receiveMode: "receiveAndDelete" });
  const got = await receiver.receiveMessages(10, { maxWaitTimeInMs: 3000 });
  out(`received${i}`, got.map((m) => m.body));
  await receiver.close();
  await client.close();
}
out("done", true);
