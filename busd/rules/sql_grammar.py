"""The grammar of Service Bus's SQL filter and rule-action language and its parse (docs/rules.md
§2 and §3): the names a filter may read and an action may change, the `lark` LALR grammar,
and the errors a text that is no expression gets, with their 1-based position. What a parse
tree means is busd.rules.sql's; how its values behave, busd.rules.sql_values'.
"""

from __future__ import annotations

from lark import Lark, Token, Tree, UnexpectedCharacters, UnexpectedEOF, UnexpectedInput

from busd.rules.errors import RuleError

# Service Bus caps filter and action text at 1024 characters, and an action at 32 statements.
MAX_EXPRESSION_LENGTH = 1024
MAX_ACTION_STATEMENTS = 32

# What an action may SET or REMOVE. Changes to ScheduledEnqueueTimeUtc and PartitionKey are
# accepted and have no effect (Service Bus ignores the first; a message's partition is
# chosen when it is published, before any action runs).
_SETTABLE = (
    "MessageId",
    "CorrelationId",
    "To",
    "ReplyTo",
    "Label",
    "SessionId",
    "ReplyToSessionId",
    "ContentType",
    "TimeToLive",
    "ScheduledEnqueueTimeUtc",
    "PartitionKey",
)
SETTABLE_SYSTEM_PROPERTIES = frozenset(_SETTABLE)
# `sys.` names (case-insensitive) -> the canonical name a scope answers to. These are the
# BrokeredMessage properties Service Bus exposes to filters (the settable ones and the
# broker's own); `Subject` is the newer SDKs' name for `Label`.
SYSTEM_PROPERTIES = {
    name.lower(): name
    for name in (
        *_SETTABLE,
        "ViaPartitionKey",
        "SequenceNumber",
        "EnqueuedSequenceNumber",
        "EnqueuedTimeUtc",
        "ExpiresAtUtc",
        "DeliveryCount",
        "Size",
        "LockToken",
        "LockedUntilUtc",
        "DeadLetterSource",
        "State",
        "ForcePersistence",
    )
}
SYSTEM_PROPERTIES["subject"] = "Label"

_RULES = r"""
filter: expr
action: (statement ";"*)+

statement: SET property EQ expr         -> set_stmt
         | REMOVE property              -> remove_stmt

?expr: and_expr
     | expr OR and_expr                 -> or_
?and_expr: not_expr
         | and_expr AND not_expr        -> and_
?not_expr: predicate
         | NOT not_expr                 -> not_
?predicate: sum
          | sum (EQ | COMPOP) sum        -> compare
          | sum IS NULL                 -> is_null
          | sum IS NOT NULL             -> is_not_null
          | sum IN "(" expr_list ")"    -> in_
          | sum NOT IN "(" expr_list ")" -> not_in
          | sum LIKE sum [ESCAPE sum]   -> like
          | sum NOT LIKE sum [ESCAPE sum] -> not_like
          | EXISTS "(" property ")"     -> exists
expr_list: expr ("," expr)*
?sum: product
    | sum ADDOP product                 -> arith
?product: unary
        | product MULOP unary           -> arith
?unary: atom
      | ADDOP unary                     -> sign
?atom: STRING                           -> string
     | INT                              -> integer
     | FLOAT                            -> double
     | TRUE                             -> true
     | FALSE                            -> false
     | NULL                             -> null
     | PARAM                            -> param
     | property
     | NAME "(" [expr ("," expr)*] ")"  -> function
     | "(" expr ")"
property: name ("." name)?
?name: NAME | BRACKETED | QUOTED

"""
_TOKENS = r"""NAME: /[A-Za-z_][A-Za-z0-9_]*/
BRACKETED: /\[(?:[^\]]|\]\])*\]/
QUOTED: /"(?:[^"]|"")*"/
STRING: /'(?:[^']|'')*'/
PARAM: /@[A-Za-z_][A-Za-z0-9_]*/
FLOAT.3: /(?:\d+\.\d*|\.\d+)(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+/
INT: /\d+/
EQ: "="
COMPOP: "<>" | "!=" | "<=" | ">=" | "<" | ">"
ADDOP: "+" | "-"
MULOP: "*" | "/" | "%"

%import common.WS
%ignore WS
"""

# the grammar's keywords (case-insensitive), which a name may not be unless bracketed or quoted
_KEYWORDS = "and or not is null in like escape exists true false set remove".split()
_RESERVED = frozenset(_KEYWORDS)
_GRAMMAR = _RULES + "".join(f"{k.upper()}.2: /{k}\\b/i\n" for k in _KEYWORDS) + _TOKENS

_PARSER = Lark(_GRAMMAR, start=["filter", "action"], parser="lalr", propagate_positions=True)


def _parse(text: str, start: str, what: str) -> Tree:
    if not isinstance(text, str):
        raise RuleError(f"{what} must be a string")
    if not text.strip():
        raise RuleError(f"{what} is empty")
    if len(text) > MAX_EXPRESSION_LENGTH:
        raise RuleError(f"{what} is longer than {MAX_EXPRESSION_LENGTH} characters")
    try:
        return _PARSER.parse(text, start=start)
    except UnexpectedInput as exc:
        raise RuleError(_syntax_message(text, exc, what)) from None


def _syntax_message(text: str, exc: UnexpectedInput, what: str) -> str:
    if isinstance(exc, UnexpectedEOF):
        return f"{what}: syntax error at position {len(text) + 1}: unexpected end of expression"
    pos = exc.pos_in_stream if exc.pos_in_stream is not None else 0
    if isinstance(exc, UnexpectedCharacters):
        found = repr(text[pos])
    else:
        token = getattr(exc, "token", None)
        found = repr(str(token)) if token is not None and token.type != "$END" else "end"
        if token is not None and token.type == "$END":
            return f"{what}: syntax error at position {len(text) + 1}: unexpected end of expression"
    return f"{what}: syntax error at position {pos + 1}: unexpected {found}"


def _error_at(node: Tree | Token, message: str, what: str) -> RuleError:
    pos = node.start_pos if isinstance(node, Token) else node.meta.start_pos
    return RuleError(f"{what}: {message} at position {(pos or 0) + 1}")


def _unquote(token: Token) -> str:
    text = str(token)
    if token.type == "BRACKETED":
        return text[1:-1].replace("]]", "]")
    if token.type == "QUOTED":
        return text[1:-1].replace('""', '"')
    return text
