// Both JavaScript clients naming a namespace by host (`sb://<namespace>.localhost:<port>`):
// AMQP with the host as the open frame's hostname, HTTPS with it as SNI and Host. This
// process resolves `*.localhost` to the loopback address, as systemd-resolved does (the test
// machine's resolver does not); NODE_EXTRA_CA_CERTS trusts busd's certificate, which signs
// the host's own. Prints one JSON line per step.
// Usage: node namespace_host.mjs <connection string>
import dns from "node:dns";

const lookup = dns.lookup;
dns.lookup = (host, options, callback) =>
  lookup(host.endsWith(".localhost") ? "127.0.0.1" : host, options, callback);
const { ServiceBusAdministrationClient, ServiceBusClient } = await import("@azure/service-bus");

const conn = process.argv[2];
const out = (step, value) => console.log(JSON.stringify({ step, value }));
const admin = new ServiceBusAdministrationClient(conn);
await admin.createQueue("orders");
const names = [];
for await (const q of admin.listQueues()) names.push(q.name);
out("queues", names);
out("namespace", (await admin.getNamespaceProperties()).name);
const client = new ServiceBusClient(conn);
const sender = client.createSender("orders");
await sender.sendMessages({ body: "by host" });
await sender.close();
const receiver = client.createReceiver("orders", { receiveMode: "receiveAndDelete" });
out("received", (await receiver.receiveMessages(5, { maxWaitTimeInMs: 3000 })).map((m) => m.body));
await receiver.close();
await client.close();
out("done", true);
