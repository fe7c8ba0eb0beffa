"""Subscription rules: filters, actions, and the copies of a message they make
(docs/rules.md). No store or network code here: the broker and the store call in.

Model (busd.rules.model), all frozen dataclasses:

    Rule(name, filter, action=None, created_ms=None)
    TrueFilter(), FalseFilter(), SqlFilter(expression, parameters={}),
    CorrelationFilter(correlation_id, message_id, to, reply_to, subject, session_id,
                      reply_to_session_id, content_type, properties={})
    SqlRuleAction(expression)
    default_rule(created_ms=None)              the `$Default` TrueFilter rule

Forms (each `*_from_*` validates, i.e. parses the SQL, and raises RuleError naming the rule
and, for bad SQL, the 1-based position):

    rule_to_dict(rule) / rule_from_dict(d)     JSON-able dict, for the store
    rule_record(rule) / rule_from_record(name, record, created_ms=None)
                                               the same without name and creation time (a
                                               catalog record keeps those itself); a record
                                               may also be {"config": <Config.json Properties>}
    rule_from_config(obj)                      a Config.json `Rules[]` entry
    rule_from_amqp(name, description)          an add-rule request's `rule-name` and
                                               `rule-description` map (or a described list)
    rule_to_amqp(rule) -> Described            an enumerate-rules `rule-description`
    validate(rule) -> rule

Evaluation:

    rules = RuleSet.compile(rules)             parse once (cached per expression text)
    rules.is_match_all                         every message gets exactly one plain copy:
                                               the caller need not look at the message
    rules.is_match_none                        no message gets a copy
    view = MessageView(blob, sequence_number=None, enqueued_ms=None, size=None)
    rules.copies(view) -> list[Copy]           [] (no match), PLAIN_COPY first when a rule
                                               without action matched, then one Copy per
                                               matching rule with an action
    copy.apply(blob) -> bytes                  the copy's stored form (same object if plain)
    copy.overrides                             message_id / session_id / reply_to_session_id /
                                               ttl_ms changed by the action
    FilterEvaluationError(rule_name, description)   raised by copies()/apply() when a rule fails
                                               on a message (dead-letter it when the
                                               subscription says so)
"""

from __future__ import annotations

from busd.rules.amqp import rule_from_amqp, rule_to_amqp
from busd.rules.errors import FilterEvaluationError, RuleError
from busd.rules.model import (
    DEFAULT_RULE_NAME,
    CorrelationFilter,
    FalseFilter,
    Rule,
    SqlFilter,
    SqlRuleAction,
    TrueFilter,
    default_rule,
    rule_from_config,
    rule_from_dict,
    rule_from_record,
    rule_record,
    rule_to_dict,
    validate,
)
from busd.rules.ruleset import PLAIN_COPY, Copy, RuleSet
from busd.rules.view import MessageView

__all__ = [
    "Rule",
    "TrueFilter",
    "FalseFilter",
    "SqlFilter",
    "CorrelationFilter",
    "SqlRuleAction",
    "DEFAULT_RULE_NAME",
    "default_rule",
    "validate",
    "rule_to_dict",
    "rule_from_dict",
    "rule_record",
    "rule_from_record",
    "rule_from_config",
    "rule_from_amqp",
    "rule_to_amqp",
    "RuleSet",
    "Copy",
    "PLAIN_COPY",
    "MessageView",
    "RuleError",
    "FilterEvaluationError",
]
