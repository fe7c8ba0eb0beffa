"""The two ways a rule can fail: when it is made (RuleError), and when it runs (EvaluationError)."""

from __future__ import annotations

__all__ = ["RuleError", "EvaluationError", "FilterEvaluationError"]


class RuleError(ValueError):
    """A rule, filter or action that cannot be accepted: bad SQL (the message names the
    position, 1-based), a missing field, a value of an unsupported type, a name too long."""


class EvaluationError(Exception):
    """An expression failed while evaluated against one message (type error, division by zero)."""


class FilterEvaluationError(Exception):
    """A rule of a subscription failed on a message: the copy goes to the subscription's
    dead-letter queue when it has DeadLetteringOnFilterEvaluationExceptions (docs/rules.md §4)."""

    def __init__(self, rule_name: str, description: str) -> None:
        super().__init__(f"rule {rule_name!r}: {description}")
        self.rule_name = rule_name
        self.description = description
