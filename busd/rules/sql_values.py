"""What the SQL filter language's values do when a compiled expression runs (docs/rules.md
§2): three-valued logic, comparisons between values of one kind, IN, LIKE, arithmetic with
C#'s semantics, and property(). A type error raises `EvaluationError`. Values are those of
busd.rules.sql's docstring.
"""

from __future__ import annotations

import functools
import math
import re
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from busd.rules.errors import EvaluationError
from busd.rules.sql_grammar import SYSTEM_PROPERTIES

# A compiled expression's argument: see busd.rules.sql's docstring.

Scope = Any


def _dynamic_property(scope: Scope, name: Any) -> Any:
    if name is None:
        return None
    if not isinstance(name, str):
        raise EvaluationError("property() needs a property name (a string)")
    head, dot, tail = name.partition(".")
    if dot and head.lower() == "sys":
        canonical = SYSTEM_PROPERTIES.get(tail.lower())
        if canonical is None:
            raise EvaluationError(f"unknown system property {tail!r}")
        return scope.sys(canonical)
    if dot and head.lower() == "user":
        name = tail
    return scope.user(name.lower())


def _condition(value: Any, op: str) -> bool | None:
    if value is None or value is True or value is False:
        return value
    raise EvaluationError(f"{op} needs conditions, not {_type_name(value)}")


def _or_values(a: Any, b: Any) -> bool | None:
    x, y = _condition(a, "OR"), _condition(b, "OR")
    if x is True or y is True:
        return True
    return None if x is None or y is None else False


def _and_values(a: Any, b: Any) -> bool | None:
    x, y = _condition(a, "AND"), _condition(b, "AND")
    if x is False or y is False:
        return False
    return None if x is None or y is None else True


def _not_value(v: Any) -> bool | None:
    c = _condition(v, "NOT")
    return None if c is None else not c


def _type_name(v: Any) -> str:
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, (int, float)):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, uuid.UUID):
        return "a guid"
    if isinstance(v, datetime):
        return "a date-time"
    if isinstance(v, timedelta):
        return "a time span"
    return f"a value of type {type(v).__name__}"


def _kind(v: Any) -> int:
    # Values of the same kind compare; int and float are one kind (C# widens to double).
    t = type(v)
    if t is str:
        return 1
    if t is bool:
        return 2
    if t is int or t is float:
        return 3
    if isinstance(v, bool):
        return 2
    if isinstance(v, (int, float)):
        return 3
    if isinstance(v, str):
        return 1
    if isinstance(v, uuid.UUID):
        return 4
    if isinstance(v, datetime):
        return 5
    if isinstance(v, timedelta):
        return 6
    return 7


_ORDERED_KINDS = (1, 3, 5, 6)


def _comparison(op: str, test: Callable[[Any, Any], bool], ordered: bool):
    def compare(a: Any, b: Any) -> bool | None:
        if a is None or b is None:
            return None
        ka = _kind(a)
        if ka != _kind(b):
            raise EvaluationError(f"cannot compare {_type_name(a)} with {_type_name(b)}")
        if ordered and ka not in _ORDERED_KINDS:
            raise EvaluationError(f"{op} cannot order {_type_name(a)} values")
        if ka == 7 and type(a) is not type(b):
            raise EvaluationError(f"cannot compare {_type_name(a)} with {_type_name(b)}")
        return test(a, b)

    return compare


_COMPARISONS = {
    "=": _comparison("=", lambda a, b: a == b, False),
    "<>": _comparison("<>", lambda a, b: a != b, False),
    "!=": _comparison("!=", lambda a, b: a != b, False),
    "<": _comparison("<", lambda a, b: a < b, True),
    "<=": _comparison("<=", lambda a, b: a <= b, True),
    ">": _comparison(">", lambda a, b: a > b, True),
    ">=": _comparison(">=", lambda a, b: a >= b, True),
}
_EQUALS = _COMPARISONS["="]


def _in_values(v: Any, values: tuple, negate: bool) -> bool | None:
    if v is None:
        return None
    unknown = False
    for item in values:
        r = _EQUALS(v, item)
        if r is True:
            return not negate
        if r is None:
            unknown = True
    return None if unknown else negate


@functools.lru_cache(maxsize=1024)
def _like_regex(pattern: Any, escape: Any, has_escape: bool) -> re.Pattern | None:
    if pattern is None or (has_escape and escape is None):
        return None
    if not isinstance(pattern, str):
        raise EvaluationError(f"LIKE needs a string pattern, not {_type_name(pattern)}")
    if has_escape and (not isinstance(escape, str) or len(escape) != 1):
        raise EvaluationError("ESCAPE needs a one-character string")
    out = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if has_escape and c == escape:
            if i + 1 == n:
                raise EvaluationError("a LIKE pattern cannot end with its escape character")
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        out.append(".*" if c == "%" else "." if c == "_" else re.escape(c))
        i += 1
    return re.compile("".join(out), re.DOTALL)


def _like_match(v: Any, regex: re.Pattern | None, negate: bool) -> bool | None:
    if v is None or regex is None:
        return None
    if not isinstance(v, str):
        raise EvaluationError(f"LIKE needs a string, not {_type_name(v)}")
    matched = regex.fullmatch(v) is not None
    return matched != negate


def _int_div(a: int, b: int) -> int:
    if b == 0:
        raise EvaluationError("division by zero")
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def _arith(op: str, ints: Callable[[int, int], Any], floats: Callable[[float, float], Any]):
    def apply(a: Any, b: Any) -> Any:
        if a is None or b is None:
            return None
        ka, kb = _kind(a), _kind(b)
        if ka == 3 and kb == 3:
            if type(a) is int and type(b) is int or (isinstance(a, int) and isinstance(b, int)):
                return ints(int(a), int(b))
            return floats(float(a), float(b))
        if op == "+" and ka == 1 and kb == 1:
            return a + b
        if op in "+-" and ka in (5, 6) and kb == 6:  # date-time or time span +/- time span
            return a + b if op == "+" else a - b
        if op == "-" and ka == 5 and kb == 5:
            return a - b
        raise EvaluationError(f"cannot apply {op} to {_type_name(a)} and {_type_name(b)}")

    return apply


def _float_div(a: float, b: float) -> float:
    if b == 0.0:  # C# double division: infinities and NaN rather than an error
        return float("nan") if a == 0.0 or a != a else float("inf") if a > 0 else float("-inf")
    return a / b


def _float_mod(a: float, b: float) -> float:
    return float("nan") if b == 0.0 else math.fmod(a, b)


_ARITHMETIC = {
    "+": _arith("+", lambda a, b: a + b, lambda a, b: a + b),
    "-": _arith("-", lambda a, b: a - b, lambda a, b: a - b),
    "*": _arith("*", lambda a, b: a * b, lambda a, b: a * b),
    "/": _arith("/", _int_div, _float_div),
    "%": _arith("%", lambda a, b: a - b * _int_div(a, b), _float_mod),
}


def _negate(v: Any) -> Any:
    if v is None:
        return None
    if _kind(v) in (3, 6):
        return -v
    raise EvaluationError(f"cannot negate {_type_name(v)}")


def _plus(v: Any) -> Any:
    if v is None or _kind(v) in (3, 6):
        return v
    raise EvaluationError(f"unary + needs a number, not {_type_name(v)}")
