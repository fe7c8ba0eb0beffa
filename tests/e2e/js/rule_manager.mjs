// Rule management through @azure/service-bus's ServiceBusRuleManager (add-rule,
// enumerate-rules with paging, remove-rule on a subscription's $management), against busd.
// Prints one JSON object of what it saw; tests/e2e/test_rule_management.py makes the assertions.
// env: BUSD_CONN (connection string), BUSD_TOPIC, BUSD_SUBSCRIPTION, BUSD_EXTRA_RULES (count)
import { ServiceBusClient } from "@azure/service-bus";

const client = new ServiceBusClient(process.env.BUSD_CONN, {
  retryOptions: { maxRetries: 0, timeoutInMs: 20000 },
});
const manager = client.createRuleManager(process.env.BUSD_TOPIC, process.env.BUSD_SUBSCRIPTION);
const extra = Number(process.env.BUSD_EXTRA_RULES || "0");
const out = {};

async function failure(promise) {
  try {
    await promise;
    return null;
  } catch (err) {
    return { code: err.code ?? null, name: err.name ?? null, message: String(err.message) };
  }
}

async function listAll(pageSize) {
  const pages = [];
  for await (const page of manager.listRules().byPage({ maxPageSize: pageSize })) {
    pages.push(page.map((r) => r.name));
  }
  return pages;
}

try {
  out.initial = await manager.getRules();
  await manager.createRule("sql-red", { sqlExpression: "color = 'red'" });
  await manager.createRule(
    "corr-action",
    { correlationId: "c-1", subject: "s", applicationProperties: { kind: "order", n: 3 } },
    { sqlExpression: "SET routed = TRUE; REMOVE secret" },
  );
  await manager.createRule("always", { sqlExpression: "1=1" });
  await manager.createRule("never", { sqlExpression: "1=0" });
  for (let i = 0; i < extra; i++) {
    await manager.createRule(`bulk-${String(i).padStart(3, "0")}`, { sqlExpression: `n = ${i}` });
  }
  out.afterCreate = await manager.getRules();
  out.pages = await listAll(10);
  out.defaultPages = await listAll(undefined);
  out.duplicate = await failure(manager.createRule("SQL-RED", { sqlExpression: "1=1" }));
  out.badSql = await failure(manager.createRule("bad", { sqlExpression: "color = 'red' AND" }));
  out.badAction = await failure(
    manager.createRule("bad2", { sqlExpression: "1=1" }, { sqlExpression: "SET sys.Size = 1" }),
  );
  out.afterErrors = (await manager.getRules()).map((r) => r.name);
  await manager.deleteRule("never");
  await manager.deleteRule("Always"); // names compare case-insensitively
  out.deleteMissing = await failure(manager.deleteRule("no-such-rule"));
  for (let i = 0; i < extra; i++) {
    await manager.deleteRule(`bulk-${String(i).padStart(3, "0")}`);
  }
  out.final = await manager.getRules();
} catch (err) {
  out.unexpected = { code: err.code ?? null, message: String(err.message), stack: err.stack };
} finally {
  await manager.close?.();
  await client.close();
}
process.stdout.write(JSON.stringify(out));
