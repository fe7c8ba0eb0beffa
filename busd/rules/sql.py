"""Service Bus's SQL filter and rule-action language: parsed once into Python closures,
evaluated many times (docs/rules.md §2 and §3).

Values while evaluating: None is SQL NULL (unknown), bool, int (Int64 constants), float,
str, uuid.UUID, datetime (UTC) and timedelta; anything else a property may hold is compared
only for equality with itself. Conditions use three-valued logic: a filter matches only when it
is TRUE. A type error (`'a' > 1`, `1 / 0`, `NOT 'x'`) raises `EvaluationError`; the rule set
reports it as a filter evaluation exception (docs/rules.md §4).

A compiled expression is a function of a *scope*: an object with

    user(lower_name) -> value or None         a user (application) property, missing = None
    user_exists(lower_name) -> bool
    sys(canonical_name) -> value or None      a system property (SYSTEM_PROPERTIES)

(busd.rules.view.MessageView, and the overlay an action writes through).

Here: the compiler from parse tree to closures, with constants folded. The grammar and its
parse are busd.rules.sql_grammar's; what values do at run time, busd.rules.sql_values'.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from lark import Token, Tree

from busd.rules.errors import EvaluationError, RuleError
from busd.rules.sql_grammar import (
    _RESERVED,
    MAX_ACTION_STATEMENTS,
    SETTABLE_SYSTEM_PROPERTIES,
    SYSTEM_PROPERTIES,
    _error_at,
    _parse,
    _unquote,
)
from busd.rules.sql_values import (
    _ARITHMETIC,
    _COMPARISONS,
    Scope,
    _and_values,
    _condition,
    _dynamic_property,
    _in_values,
    _like_match,
    _like_regex,
    _negate,
    _not_value,
    _or_values,
    _plus,
)

__all__ = [
    "Expression",
    "Statement",
    "compile_filter",
    "compile_action",
]

Expression = Callable[[Scope], Any]


class _Const:
    """Marks a compiled node whose value does not depend on the message (folded at compile)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


Node = Expression | _Const


def _fn(node: Node) -> Expression:
    if isinstance(node, _Const):
        value = node.value
        return lambda scope: value
    return node


# ---------------------------------------------------------------------------------------------
# Compiling


class Statement:
    """One compiled action statement: SET (value is an Expression) or REMOVE (value None)."""

    __slots__ = ("scope", "name", "value")

    def __init__(self, scope: str, name: str, value: Expression | None) -> None:
        self.scope = scope  # "user" or "sys"
        self.name = name  # user: as written; sys: canonical
        self.value = value

    def __repr__(self) -> str:
        verb = "REMOVE" if self.value is None else "SET"
        return f"Statement({verb} {self.scope}.{self.name})"


def compile_filter(text: str, parameters: Mapping[str, Any] | None = None) -> Expression | bool:
    """A SQL filter compiled to a function of a scope returning True/False/None, or a plain
    bool when the filter does not depend on the message (`1=1`). RuleError when invalid."""
    node = _compile_filter_cached(text, _frozen(parameters))
    return node.value if isinstance(node, _Const) else node


def compile_action(text: str, parameters: Mapping[str, Any] | None = None) -> tuple[Statement, ...]:
    """A SQL rule action compiled to its statements, in order. RuleError when invalid."""
    return _compile_action_cached(text, _frozen(parameters))


def _frozen(parameters: Mapping[str, Any] | None) -> tuple:
    if not parameters:
        return ()
    if not isinstance(parameters, Mapping):
        raise RuleError("filter parameters must be a map of names to values")
    out = []
    for key, value in parameters.items():
        if not isinstance(key, str) or not key.lstrip("@"):
            raise RuleError(f"filter parameter name {key!r} is not a name")
        if not _is_value(value):
            raise RuleError(f"filter parameter {key!r} has an unsupported type")
        out.append((key.lstrip("@").lower(), type(value).__name__, as_utc(value)))
    return tuple(sorted(out, key=lambda kv: kv[0]))


def as_utc(value: Any) -> Any:
    """A naive date-time as UTC, the zone of every date-time a message carries (a rule's
    parameters may come without one: the Python SDK sends them so); any other value as is."""
    if isinstance(value, datetime) and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


def _is_value(value: Any) -> bool:
    return value is None or isinstance(
        value, (str, bool, int, float, uuid.UUID, datetime, timedelta)
    )


@functools.lru_cache(maxsize=4096)
def _compile_filter_cached(text: str, params: tuple) -> Node:
    what = "SQL filter"
    tree = _parse(text, "filter", what)
    compiler = _Compiler({k: v for k, _, v in params}, what)
    top = tree.children[0]
    node = compiler.compile(top)
    if isinstance(node, _Const):
        if node.value is not None and not isinstance(node.value, bool):
            raise _error_at(top, "the filter is not a condition", what)
        return _Const(node.value is True)
    if top.data in ("property", "function", "arith", "sign"):  # a value: must be a condition
        value = node
        return lambda s: _condition(value(s), "a filter")
    return node


@functools.lru_cache(maxsize=4096)
def _compile_action_cached(text: str, params: tuple) -> tuple[Statement, ...]:
    what = "SQL action"
    tree = _parse(text, "action", what)
    compiler = _Compiler({k: v for k, _, v in params}, what)
    statements = []
    for stmt in tree.children:
        prop = stmt.children[1]
        scope, name = compiler.property_name(prop)
        if scope == "sys":
            if name not in SETTABLE_SYSTEM_PROPERTIES:
                raise _error_at(prop, f"system property {name} cannot be changed", what)
        if stmt.data == "set_stmt":
            statements.append(Statement(scope, name, _fn(compiler.compile(stmt.children[3]))))
        else:
            statements.append(Statement(scope, name, None))
    if len(statements) > MAX_ACTION_STATEMENTS:
        raise RuleError(f"{what} has more than {MAX_ACTION_STATEMENTS} statements")
    return tuple(statements)


class _Compiler:
    def __init__(self, parameters: dict[str, Any], what: str) -> None:
        self.parameters = parameters
        self.what = what

    def error(self, node: Tree | Token, message: str) -> RuleError:
        return _error_at(node, message, self.what)

    def property_name(self, tree: Tree) -> tuple[str, str]:
        """(scope, name): ("user", name as written) or ("sys", canonical name)."""
        parts = [p for p in tree.children if isinstance(p, Token)]
        for part in parts:
            if part.type == "NAME" and part.lower() in _RESERVED:
                raise self.error(part, f"{str(part)!r} is a reserved word: write [{part}]")
        if len(parts) == 1:
            return "user", _unquote(parts[0])
        scope_token, name_token = parts
        scope = str(scope_token).lower()
        name = _unquote(name_token)
        if scope_token.type != "NAME" or scope not in ("sys", "user"):
            raise self.error(scope_token, f"unknown property scope {str(scope_token)!r}")
        if scope == "user":
            return "user", name
        canonical = SYSTEM_PROPERTIES.get(name.lower())
        if canonical is None:
            raise self.error(name_token, f"unknown system property {name!r}")
        return "sys", canonical

    def compile(self, tree: Tree | Token) -> Node:
        if isinstance(tree, Token):  # only the NAME of a bare property reaches here via inlining
            raise self.error(tree, f"unexpected {str(tree)!r}")
        method = getattr(self, "c_" + tree.data.rstrip("_"))
        return method(tree)

    # constants

    def c_string(self, tree: Tree) -> Node:
        return _Const(str(tree.children[0])[1:-1].replace("''", "'"))

    def c_integer(self, tree: Tree) -> Node:
        value = int(str(tree.children[0]))
        if value > 2**63 - 1:
            raise self.error(tree, "integer constant out of the Int64 range")
        return _Const(value)

    def c_double(self, tree: Tree) -> Node:
        return _Const(float(str(tree.children[0])))

    def c_true(self, tree: Tree) -> Node:
        return _Const(True)

    def c_false(self, tree: Tree) -> Node:
        return _Const(False)

    def c_null(self, tree: Tree) -> Node:
        return _Const(None)

    def c_param(self, tree: Tree) -> Node:
        name = str(tree.children[0])[1:]
        try:
            return _Const(self.parameters[name.lower()])
        except KeyError:
            raise self.error(tree, f"parameter @{name} has no value") from None

    # properties and functions

    def c_property(self, tree: Tree) -> Node:
        scope, name = self.property_name(tree)
        if scope == "sys":
            return lambda s: s.sys(name)
        key = name.lower()
        return lambda s: s.user(key)

    def c_function(self, tree: Tree) -> Node:
        name_token, *args = tree.children
        args = [a for a in args if a is not None]
        name = str(name_token).lower()
        if name == "newid":
            if args:
                raise self.error(tree, "newid() takes no argument")
            return lambda s: uuid.uuid4()
        if name in ("p", "property"):
            if len(args) != 1:
                raise self.error(tree, f"{name}() takes one argument")
            arg = _fn(self.compile(args[0]))
            return lambda s: _dynamic_property(s, arg(s))
        raise self.error(name_token, f"unknown function {str(name_token)}()")

    def c_exists(self, tree: Tree) -> Node:
        scope, name = self.property_name(tree.children[1])
        if scope == "sys":
            return lambda s: s.sys(name) is not None
        key = name.lower()
        return lambda s: s.user_exists(key)

    # operators

    def _fold(self, tree: Tree, fn: Callable[..., Any], *nodes: Node) -> Node:
        """fn applied to the nodes' values; computed now when every node is a constant."""
        if all(isinstance(n, _Const) for n in nodes):
            try:
                return _Const(fn(*[n.value for n in nodes]))  # type: ignore[union-attr]
            except EvaluationError as exc:
                raise self.error(tree, str(exc)) from None
        fns = [_fn(n) for n in nodes]
        if len(fns) == 1:
            (a,) = fns
            return lambda s: fn(a(s))
        if len(fns) == 2:
            a, b = fns
            return lambda s: fn(a(s), b(s))
        return lambda s: fn(*[f(s) for f in fns])

    def _logic(self, tree: Tree, decisive: bool, fold: Callable[..., Any], op: str) -> Node:
        """OR (decisive TRUE) or AND (decisive FALSE) in three-valued logic; the right side
        is not evaluated when the left one decides."""
        a, b = self.compile(tree.children[0]), self.compile(tree.children[2])
        if isinstance(a, _Const) and isinstance(b, _Const):
            return self._fold(tree, fold, a, b)
        fa, fb = _fn(a), _fn(b)

        def logic(s: Scope) -> Any:
            x = _condition(fa(s), op)
            if x is decisive:
                return decisive
            y = _condition(fb(s), op)
            if y is decisive:
                return decisive
            return None if x is None or y is None else not decisive

        return logic

    def c_or(self, tree: Tree) -> Node:
        return self._logic(tree, True, _or_values, "OR")

    def c_and(self, tree: Tree) -> Node:
        return self._logic(tree, False, _and_values, "AND")

    def c_not(self, tree: Tree) -> Node:
        return self._fold(tree, _not_value, self.compile(tree.children[1]))

    def c_compare(self, tree: Tree) -> Node:
        left, op, right = tree.children
        compare = _COMPARISONS[str(op)]
        return self._fold(tree, compare, self.compile(left), self.compile(right))

    def c_is_null(self, tree: Tree) -> Node:
        return self._fold(tree, lambda v: v is None, self.compile(tree.children[0]))

    def c_is_not_null(self, tree: Tree) -> Node:
        return self._fold(tree, lambda v: v is not None, self.compile(tree.children[0]))

    def _in(self, tree: Tree, negate: bool) -> Node:
        left = self.compile(tree.children[0])
        items = [self.compile(c) for c in tree.children[-1].children]
        if all(isinstance(i, _Const) for i in items):
            values = tuple(i.value for i in items)  # type: ignore[union-attr]
            return self._fold(tree, lambda v: _in_values(v, values, negate), left)
        return self._fold(tree, lambda v, *vs: _in_values(v, vs, negate), left, *items)

    def c_in(self, tree: Tree) -> Node:
        return self._in(tree, False)

    def c_not_in(self, tree: Tree) -> Node:
        return self._in(tree, True)

    def _like(self, tree: Tree, negate: bool) -> Node:
        children = [c for c in tree.children if c is not None and not isinstance(c, Token)]
        left = self.compile(children[0])
        pattern = self.compile(children[1])
        escape = self.compile(children[2]) if len(children) > 2 else _Const(None)
        if isinstance(pattern, _Const) and isinstance(escape, _Const):
            try:
                regex = _like_regex(pattern.value, escape.value, len(children) > 2)
            except EvaluationError as exc:
                raise self.error(children[1], str(exc)) from None
            return self._fold(tree, lambda v: _like_match(v, regex, negate), left)
        has_escape = len(children) > 2

        def like(v: Any, p: Any, e: Any) -> Any:
            return _like_match(v, _like_regex(p, e, has_escape), negate)

        return self._fold(tree, like, left, pattern, escape)

    def c_like(self, tree: Tree) -> Node:
        return self._like(tree, False)

    def c_not_like(self, tree: Tree) -> Node:
        return self._like(tree, True)

    def c_arith(self, tree: Tree) -> Node:
        left, op, right = tree.children
        return self._fold(tree, _ARITHMETIC[str(op)], self.compile(left), self.compile(right))

    def c_sign(self, tree: Tree) -> Node:
        op, operand = tree.children
        return self._fold(tree, _negate if str(op) == "-" else _plus, self.compile(operand))
