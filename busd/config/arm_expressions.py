"""ARM template expressions (`"[concat(parameters('ns'), '/orders')]"`), evaluated offline for
`busd config import` (docs/topology.md §2).

Only what templates commonly use for names and values is known: parameters(), variables(),
concat(), format(), toLower(), toUpper(), string(), int(), bool(), if(), equals(), not(),
and(), or(), empty(), length(), replace(), trim(), createArray(), resourceId() (dependsOn
names resources with it), resourceGroup() (a placeholder: its location is never needed),
copyIndex() (in a resource's `copy` loop), and property access and indexing. Anything else
is refused by name: a value busd cannot compute (uniqueString(), reference(), a user-defined
function) would otherwise end up wrong in the entities file.

Parameters and variables are evaluated only when an expression uses them, so a `location`
parameter defaulting to `[resourceGroup().location]` costs nothing.
"""

from __future__ import annotations

import json
import re
import reprlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


class TemplateError(ValueError):
    """What cannot be read or evaluated, as one line naming where."""


# The longest text and array an expression may make: far above any name or property busd
# keeps (UserMetadata, the longest, is 1,024 characters), and low enough that a hostile
# template (nested replace() or format() calls) cannot make one that fills the memory.
MAX_TEXT = 64 * 1024
MAX_ITEMS = 10_000


def _bounded(value: Any, what: str) -> Any:
    if isinstance(value, str) and len(value) > MAX_TEXT:
        raise TemplateError(f"{what} makes a text of more than {MAX_TEXT} characters")
    if isinstance(value, list) and len(value) > MAX_ITEMS:
        raise TemplateError(f"{what} makes an array of more than {MAX_ITEMS} items")
    return value


def _size(value: Any, budget: int) -> int:
    """The characters of the strings in `value`, counted up to a little over `budget`."""
    if isinstance(value, str):
        return len(value)
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    total = 0
    for item in items:
        total += _size(item, budget - total) + 1
        if total > budget:
            break
    return total


# --- tokens and syntax -------------------------------------------------------------------------

_TOKEN = re.compile(
    r"\s*(?:(?P<string>'(?:[^']|'')*')|(?P<number>-?\d+(?:\.\d+)?)"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_.]*)|(?P<punct>[(),.\[\]]))"
)


def _tokens(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    at = 0
    while at < len(text):
        if text[at:].strip() == "":
            break
        match = _TOKEN.match(text, at)
        if match is None:
            raise TemplateError(f"cannot read the expression at {text[at:][:20]!r}")
        kind = match.lastgroup or ""
        out.append((kind, match.group(kind)))
        at = match.end()
    return out


@dataclass
class _Call:
    name: str
    args: list[Any]


@dataclass
class _Member:
    target: Any
    key: Any  # a name (str) after `.`, or an expression inside `[...]`


@dataclass
class _Literal:
    value: Any


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = _tokens(text)
        self.at = 0

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def take(self, value: str | None = None) -> tuple[str, str]:
        token = self.peek()
        if token is None or (value is not None and token[1] != value):
            found = "the end" if token is None else repr(token[1])
            raise TemplateError(f"expected {value or 'more'} in the expression, found {found}")
        self.at += 1
        return token

    def expression(self) -> Any:
        kind, text = self.take()
        node: Any
        if kind == "string":
            node = _Literal(text[1:-1].replace("''", "'"))
        elif kind == "number":
            node = _Literal(float(text) if "." in text else int(text))
        elif kind == "name":
            if self.peek() == ("punct", "("):
                self.take("(")
                args: list[Any] = []
                if self.peek() != ("punct", ")"):
                    args.append(self.expression())
                    while self.peek() == ("punct", ","):
                        self.take(",")
                        args.append(self.expression())
                self.take(")")
                node = _Call(text, args)
            elif text.lower() in ("true", "false", "null"):
                node = _Literal({"true": True, "false": False, "null": None}[text.lower()])
            else:
                raise TemplateError(f"{text!r} is neither a function call nor a value")
        else:
            raise TemplateError(f"unexpected {text!r} in the expression")
        while self.peek() in (("punct", "."), ("punct", "[")):
            _, punct = self.take()
            if punct == ".":
                node = _Member(node, self.take()[1])
            else:
                node = _Member(node, self.expression())
                self.take("]")
        return node


def parse(text: str) -> Any:
    """The syntax tree of an expression (the text inside `[...]`)."""
    parser = _Parser(text)
    node = parser.expression()
    if parser.peek() is not None:
        raise TemplateError(f"unexpected {parser.peek()[1]!r} after the expression")  # type: ignore[index]
    return node


def is_expression(value: Any) -> bool:
    return (
        isinstance(value, str)
        and value.startswith("[")
        and value.endswith("]")
        and not value.startswith("[[")
    )


# --- evaluation ----------------------------------------------------------------------------------


@dataclass
class Scope:
    """A template's parameters (declarations and the values given) and variables."""

    declared: Mapping[str, Any]  # the template's `parameters`
    given: Mapping[str, Any]  # name -> value (--parameter, a parameters file)
    variables: Mapping[str, Any]
    copy_index: dict[str, int] = field(default_factory=dict)  # loop name -> index ('' last)
    _params: dict[str, Any] = field(default_factory=dict)
    _vars: dict[str, Any] = field(default_factory=dict)
    _busy: set[str] = field(default_factory=set)

    def parameter(self, name: str) -> Any:
        key = _find(self.declared, name)
        if key is None:
            raise TemplateError(f"parameters({name!r}): the template declares no such parameter")
        if key not in self._params:
            self._params[key] = self._parameter_value(key)
        return self._params[key]

    def _parameter_value(self, key: str) -> Any:
        spec = self.declared[key]
        if not isinstance(spec, dict):
            raise TemplateError(f"parameter {key!r}: its declaration must be an object")
        given_key = _find(self.given, key)
        if given_key is not None:
            value = coerce(key, spec.get("type", "string"), self.given[given_key])
        elif "defaultValue" in spec:
            guard = f"parameter {key}"
            if guard in self._busy:
                raise TemplateError(f"parameter {key!r}: its defaultValue refers to itself")
            self._busy.add(guard)
            try:
                value = self.evaluate(spec["defaultValue"], f"parameter {key!r}")
            finally:
                self._busy.discard(guard)
        else:
            raise TemplateError(f"parameter {key!r} has no defaultValue: give --parameter {key}=…")
        allowed = spec.get("allowedValues")
        if isinstance(allowed, list) and value not in allowed:
            raise TemplateError(
                f"parameter {key!r}: {value!r} is not one of its allowedValues {allowed}"
            )
        return value

    def variable(self, name: str) -> Any:
        key = _find(self.variables, name)
        if key is None:
            raise TemplateError(f"variables({name!r}): the template declares no such variable")
        if key not in self._vars:
            guard = f"variable {key}"
            if guard in self._busy:
                raise TemplateError(f"variable {key!r} refers to itself")
            self._busy.add(guard)
            try:
                self._vars[key] = self.evaluate(self.variables[key], f"variable {key!r}")
            finally:
                self._busy.discard(guard)
        return self._vars[key]

    def evaluate(self, value: Any, where: str) -> Any:
        """`value` with every expression string in it evaluated (objects and arrays too);
        TemplateError naming `where`."""
        if isinstance(value, dict):
            if "copy" in value and where.startswith("variable"):
                raise TemplateError(f"{where}: variable copy loops are not supported")
            return {k: self.evaluate(v, where) for k, v in value.items()}
        if isinstance(value, list):
            return [self.evaluate(v, where) for v in value]
        if isinstance(value, str):
            if value.startswith("[["):
                return value[1:]  # `[[` escapes a literal `[`
            if is_expression(value):
                try:
                    return self._eval(parse(value[1:-1]))
                except TemplateError as exc:
                    text = str(exc)
                    if text.startswith(("parameter ", "variable ")):
                        raise  # already names where it is
                    raise TemplateError(f"{where}: {text}") from None
        return value

    def _eval(self, node: Any) -> Any:
        if isinstance(node, _Literal):
            return node.value
        if isinstance(node, _Member):
            target = self._eval(node.target)
            key = node.key if isinstance(node.key, str) else self._eval(node.key)
            return _member(target, key)
        name = node.name.lower()
        function = _FUNCTIONS.get(name)
        if function is None:
            raise TemplateError(f"{_unknown_function(node.name)}")
        if name == "if":  # only the branch taken is evaluated
            if len(node.args) != 3:
                raise TemplateError("if() takes a condition and two values")
            condition = self._eval(node.args[0])
            if not isinstance(condition, bool):
                raise TemplateError(f"if(): the condition is {condition!r}, not true or false")
            return self._eval(node.args[1] if condition else node.args[2])
        args = [self._eval(arg) for arg in node.args]
        try:
            result = function(self, *args)
        except TypeError:
            shown = reprlib.repr(args)  # shortened: an argument may be long
            raise TemplateError(f"{node.name}() cannot take the arguments {shown}") from None
        return _bounded(result, f"{node.name}()")


def _find(mapping: Mapping[str, Any], name: Any) -> str | None:
    """The key of `mapping` that is `name`, case-insensitively (as ARM compares them)."""
    if not isinstance(name, str):
        return None
    return next((k for k in mapping if k.lower() == name.lower()), None)


def _member(target: Any, key: Any) -> Any:
    if isinstance(target, dict):
        found = _find(target, key)
        if found is None:
            raise TemplateError(f"the object has no property {key!r}")
        return target[found]
    if isinstance(target, list) and isinstance(key, int) and not isinstance(key, bool):
        if not -len(target) <= key < len(target):
            raise TemplateError(f"index {key} is outside the array of {len(target)}")
        return target[key]
    raise TemplateError(f"cannot take {key!r} of {target!r}")


_OFFLINE = {
    "uniquestring": "its value is a hash Azure computes from the deployment",
    "reference": "it reads a deployed resource",
    "listkeys": "it reads a deployed resource's keys",
    "subscription": "it names the Azure subscription deployed to",
    "deployment": "it describes the Azure deployment",
    "newguid": "its value changes at every deployment",
    "utcnow": "its value changes at every deployment",
    "environment": "it describes the Azure cloud deployed to",
}


def _unknown_function(name: str) -> str:
    reason = _OFFLINE.get(name.lower())
    if reason is not None:
        return (
            f"function {name}() cannot be evaluated offline ({reason}): give the value "
            "as a parameter instead"
        )
    if "." in name:
        return f"function {name}(): user-defined template functions are not supported"
    return f"unknown template function {name}()"


# --- functions -----------------------------------------------------------------------------------


def coerce(name: str, kind: Any, value: Any) -> Any:
    """A parameter's given value as its declared type: text from --parameter becomes an int,
    a bool, an array or an object as the template declares."""
    kind = str(kind).lower()
    if not isinstance(value, str) or kind in ("string", "securestring"):
        return value
    try:
        if kind == "int":
            return int(value)
        if kind == "bool":
            if value.lower() not in ("true", "false"):
                raise ValueError(value)
            return value.lower() == "true"
        if kind in ("array", "object", "secureobject"):
            return json.loads(value)
    except ValueError:
        raise TemplateError(f"parameter {name!r}: {value!r} is not a valid {kind}") from None
    return value


def _text(value: Any) -> str:
    """string(): as ARM writes values (True/False for flags, JSON for objects and arrays)."""
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, (dict, list)):
        if _size(value, MAX_TEXT) > MAX_TEXT:
            raise TemplateError(f"string(): the value is longer than {MAX_TEXT} characters")
        return json.dumps(value, separators=(",", ":"))
    if value is None:
        return ""
    return str(value)


def _concat(_: Scope, *args: Any) -> Any:
    if args and all(isinstance(a, list) for a in args):
        if sum(len(a) for a in args) > MAX_ITEMS:
            raise TemplateError(f"concat() makes an array of more than {MAX_ITEMS} items")
        return [item for a in args for item in a]
    parts, total = [], 0
    for a in args:
        parts.append(_text(a))
        total += len(parts[-1])
        if total > MAX_TEXT:
            raise TemplateError(f"concat() makes a text of more than {MAX_TEXT} characters")
    return "".join(parts)


_FORMAT_ITEM = re.compile(r"\{\{|\}\}|\{(\d+)(?::[^}]*)?\}")


def _format(_: Scope, template: Any, *args: Any) -> str:
    if not isinstance(template, str):
        raise TemplateError("format() takes a format string first")

    made = [0]  # characters so far: many `{0}` of a long argument would fill the memory

    def item(match: re.Match[str]) -> str:
        made[0] += len(match.group(0))
        if made[0] > MAX_TEXT:
            raise TemplateError(f"format() makes a text of more than {MAX_TEXT} characters")
        if match.group(0) in ("{{", "}}"):
            return match.group(0)[0]
        if ":" in match.group(0):
            raise TemplateError(
                f"format(): format specifiers such as {match.group(0)} are not supported"
            )
        index = int(match.group(1))
        if index >= len(args):
            raise TemplateError(f"format(): {{{index}}} has no argument")
        text = _text(args[index])
        made[0] += len(text)
        return text

    return _FORMAT_ITEM.sub(item, template)


def _to_int(_: Scope, value: Any) -> int:
    if isinstance(value, bool):
        raise TemplateError(f"int() cannot take {value!r}")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise TemplateError(f"int(): {value!r} is not a whole number") from None


def _to_bool(_: Scope, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value != 0
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise TemplateError(f"bool(): {value!r} is not true or false")


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TemplateError(f"{name}(): {value!r} is not true or false")
    return value


def _length(_: Scope, value: Any) -> int:
    if not isinstance(value, (str, list, dict)):
        raise TemplateError(f"length(): {value!r} has no length")
    return len(value)


def _resource_id(_: Scope, *args: Any) -> str:
    """A resource's id, as dependsOn uses it: its value is never written anywhere."""
    texts = [_text(a) for a in args]
    at = next((i for i, t in enumerate(texts) if "/" in t and "." in t.split("/")[0]), None)
    if at is None:
        raise TemplateError(
            "resourceId() needs a resource type such as Microsoft.ServiceBus/namespaces"
        )
    return f"/providers/{texts[at]}/" + "/".join(texts[at + 1 :])


def _copy_index(scope: Scope, *args: Any) -> int:
    loop, offset = "", 0
    for arg in args:
        if isinstance(arg, str):
            loop = arg.lower()
        elif isinstance(arg, int):
            offset = arg
    if loop not in scope.copy_index:
        raise TemplateError("copyIndex() is used outside a resource's copy loop")
    return scope.copy_index[loop] + offset


def _replace(text: str, old: Any, new: Any) -> str:
    if not isinstance(old, str) or not isinstance(new, str) or not old:
        raise TemplateError("replace() takes a text, a non-empty text to find and its replacement")
    if len(text) + text.count(old) * (len(new) - len(old)) > MAX_TEXT:
        raise TemplateError(f"replace() makes a text of more than {MAX_TEXT} characters")
    return text.replace(old, new)


def _string_function(name: str, op: Callable[..., Any]) -> Callable[..., Any]:
    def call(_: Scope, value: Any, *more: Any) -> Any:
        if not isinstance(value, str):
            raise TemplateError(f"{name}(): {value!r} is not a string")
        return op(value, *more)

    return call


_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "parameters": lambda scope, name: scope.parameter(name),
    "variables": lambda scope, name: scope.variable(name),
    "concat": _concat,
    "format": _format,
    "tolower": _string_function("toLower", str.lower),
    "toupper": _string_function("toUpper", str.upper),
    "trim": _string_function("trim", str.strip),
    "replace": _string_function("replace", lambda s, old, new: _replace(s, old, new)),
    "string": lambda _, value: _text(value),
    "int": _to_int,
    "bool": _to_bool,
    "if": lambda *_: None,  # evaluated lazily in Scope._eval
    "equals": lambda _, a, b: a == b,
    "not": lambda _, a: not _flag("not", a),
    "and": lambda _, *args: all(_flag("and", a) for a in args),
    "or": lambda _, *args: any(_flag("or", a) for a in args),
    "empty": lambda _, value: value is None or len(value) == 0,
    "length": _length,
    "createarray": lambda _, *args: list(args),
    "true": lambda _: True,
    "false": lambda _: False,
    "null": lambda _: None,
    "resourceid": _resource_id,
    "resourcegroup": lambda _: {
        "name": "local",
        "location": "local",
        "id": "/resourceGroups/local",
    },
    "copyindex": _copy_index,
}
