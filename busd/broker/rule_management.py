"""Rule management on a subscription's `$management` node: add-rule, remove-rule and
enumerate-rules (docs/wire.md §8.4.11, docs/rules.md §5.2).

Rules live in the store's catalog, so every busd process sees a change at once; the fan-out
reads them from there. A rule name compares case-insensitively within its subscription.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Protocol

from busd import rules
from busd.auth.rights import LISTEN
from busd.entities.records import RuleEntity, rule_path
from busd.errors import BusdError, Condition

if TYPE_CHECKING:
    from busd.broker.links.base import BrokerScope
    from busd.storage.specs import QueueSpec


class RuleNode(Protocol):
    """What the rule operations use of the `$management` link they came on
    (busd.broker.links.management.ManagementEndpoint, which imports this module)."""

    queue: QueueSpec

    @property
    def broker(self) -> BrokerScope: ...


__all__ = ["OPERATIONS", "OPERATION_RIGHTS"]

# JS asks for 2^31-1 rules when it wants them all; an answer is one AMQP message, so busd
# caps a page (JS and .NET keep asking with skip until a page comes back empty or short).
MAX_PAGE = 1000


def _subscription(ep: RuleNode) -> tuple[str, str]:
    spec = ep.queue
    if spec.topic is None or spec.subscription is None:
        raise BusdError(Condition.NOT_ALLOWED, "Rules exist on subscriptions only.")
    return spec.topic, spec.subscription


def _rule_name(body: dict) -> str:
    name = body.get("rule-name")
    if not isinstance(name, str) or not name:
        raise BusdError(Condition.ARGUMENT_ERROR, "The request needs a rule-name (a string).")
    return str(name)


def _count(body: dict, key: str, default: int) -> int:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BusdError(Condition.ARGUMENT_ERROR, f"{key} must be a non-negative integer.")
    return int(value)


async def add_rule(ep: RuleNode, body: dict, app: dict):
    topic, subscription = _subscription(ep)
    name = _rule_name(body)
    try:
        rule = rules.rule_from_amqp(
            name, body.get("rule-description"), created_ms=int(time.time() * 1000)
        )
    except rules.RuleError as exc:
        raise BusdError(Condition.ARGUMENT_ERROR, str(exc)) from None
    entity = RuleEntity(
        topic, subscription, rule.name, rule=rules.rule_record(rule), created_ms=rule.created_ms
    )
    await ep.broker.catalog.create(entity)  # ENTITY_ALREADY_EXISTS (409) on a taken name
    return 200, None


async def remove_rule(ep: RuleNode, body: dict, app: dict):
    topic, subscription = _subscription(ep)
    name = _rule_name(body)
    if not await ep.broker.catalog.delete("rule", rule_path(topic, subscription, name)):
        # Service Bus's wording: the JavaScript SDK reads MessagingEntityNotFound from it
        raise BusdError(
            Condition.NOT_FOUND,
            f"The messaging entity '{topic}/Subscriptions/{subscription}/Rules/"
            f"{name}' could not be found.",
        )
    return 200, None


async def enumerate_rules(ep: RuleNode, body: dict, app: dict):
    topic, subscription = _subscription(ep)
    top = min(_count(body, "top", MAX_PAGE), MAX_PAGE)
    skip = _count(body, "skip", 0)
    page = ep.broker.catalog.rules(topic, subscription)[skip : skip + top]
    if not page:
        return 204, None
    described: list[Any] = []
    for entity in page:
        rule = rules.rule_from_record(entity.name, entity.rule, entity.created_ms or 0)
        described.append({"rule-description": rules.rule_to_amqp(rule)})
    return 200, {"rules": described}


# "The rule manager requires only Listen claims" (the SDKs' ServiceBusRuleManager docs).
OPERATION_RIGHTS = {"add-rule": LISTEN, "remove-rule": LISTEN, "enumerate-rules": LISTEN}
OPERATIONS = {
    "add-rule": add_rule,
    "remove-rule": remove_rule,
    "enumerate-rules": enumerate_rules,
}
