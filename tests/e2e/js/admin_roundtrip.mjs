// The JavaScript SDK's administration client against busd over HTTPS (NODE_EXTRA_CA_CERTS
// trusts busd's certificate), then a message through the AMQP client: every step prints one
// JSON line the Python test checks. Usage: node admin_roundtrip.mjs <admin conn> <amqp conn> <prefix>
import { ServiceBusAdministrationClient, ServiceBusClient } from "@azure/service-bus";

const [adminConn, amqpConn, prefix] = process.argv.slice(2);
const admin = new ServiceBusAdministrationClient(adminConn);
const out = (step, value) => console.log(JSON.stringify({ step, value }));
const errorOf = async (promise) => {
  try { await promise; return null; } catch (e) { return { name: e.name, code: e.code }; }
};

const q = `${prefix}-q`;
const t = `${prefix}-t`;
const s = "sub1";

const ns = await admin.getNamespaceProperties();
out("namespace", { name: ns.name, sku: ns.messagingSku });

const created = await admin.createQueue(q, {
  lockDuration: "PT30S", maxDeliveryCount: 5, userMetadata: "from js", requiresSession: false,
});
out("createQueue", { name: created.name, lockDuration: created.lockDuration,
  maxDeliveryCount: created.maxDeliveryCount, userMetadata: created.userMetadata });
out("createQueueAgain", await errorOf(admin.createQueue(q)));
out("queueExists", await admin.queueExists(q));
out("queueExistsMissing", await admin.queueExists(`${prefix}-nosuch`));
out("getQueueMissing", await errorOf(admin.getQueue(`${prefix}-nosuch`)));

const queue = await admin.getQueue(q);
queue.maxDeliveryCount = 7;
const updated = await admin.updateQueue(queue);
out("updateQueue", { maxDeliveryCount: updated.maxDeliveryCount,
  lockDuration: updated.lockDuration });

const names = [];
for await (const item of admin.listQueues()) names.push(item.name);
out("listQueues", names);

const client = new ServiceBusClient(amqpConn);
const sender = client.createSender(q);
await sender.sendMessages([{ body: "one" }, { body: "two" }]);
await sender.close();
await client.close();
const rt = await admin.getQueueRuntimeProperties(q);
out("runtime", { active: rt.activeMessageCount, total: rt.totalMessageCount,
  deadLetter: rt.deadLetterMessageCount, scheduled: rt.scheduledMessageCount });

const topic = await admin.createTopic(t, { defaultMessageTimeToLive: "PT1H" });
out("createTopic", { name: topic.name, ttl: topic.defaultMessageTimeToLive });
const sub = await admin.createSubscription(t, s, { requiresSession: true, maxDeliveryCount: 4 });
out("createSubscription", { topic: sub.topicName, name: sub.subscriptionName,
  requiresSession: sub.requiresSession, maxDeliveryCount: sub.maxDeliveryCount });
const gotSub = await admin.getSubscription(t, s);
out("getSubscription", { topic: gotSub.topicName, name: gotSub.subscriptionName });
const subRt = await admin.getSubscriptionRuntimeProperties(t, s);
out("subscriptionRuntime", { active: subRt.activeMessageCount, total: subRt.totalMessageCount });
const subs = [];
for await (const item of admin.listSubscriptions(t)) subs.push(item.subscriptionName);
out("listSubscriptions", subs);

const rule = await admin.createRule(t, s, "jr1", { sqlExpression: "color = @c",
  sqlParameters: { "@c": "red" } }, { sqlExpression: "SET seen = 1" });
out("createRule", { name: rule.name, filter: rule.filter.sqlExpression,
  parameters: rule.filter.sqlParameters, action: rule.action.sqlExpression });
const corr = await admin.createRule(t, s, "jr2", { sessionId: "s-1",
  applicationProperties: { kind: "blue", n: 3 } });
out("createCorrelationRule", { name: corr.name, sessionId: corr.filter.sessionId,
  properties: corr.filter.applicationProperties });
const gotRule = await admin.getRule(t, s, "jr1");
out("getRule", { name: gotRule.name, filter: gotRule.filter.sqlExpression });
const rules = [];
for await (const item of admin.listRules(t, s)) rules.push(item.name);
out("listRules", rules.sort());
await admin.deleteRule(t, s, "jr1");
out("getRuleDeleted", await errorOf(admin.getRule(t, s, "jr1")));

await admin.deleteSubscription(t, s);
out("subscriptionExistsAfterDelete", await admin.subscriptionExists(t, s));
await admin.deleteTopic(t);
out("topicExistsAfterDelete", await admin.topicExists(t));
await admin.deleteQueue(q);
out("queueExistsAfterDelete", await admin.queueExists(q));
out("deleteMissing", await errorOf(admin.deleteQueue(q)));
out("done", true);
