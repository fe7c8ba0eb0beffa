"""`busd queue|topic|subscription|rule create|update|show|delete`, and `busd rule list`: entities
managed over busd's management (ATOM) API, the one the SDKs' administration clients call
(docs/management.md §3), so the command line and the SDKs cannot disagree.

Like the other tools (busd.cli.tools): `--url`/BUSD_URL, a SAS token from BUSD_SAS_KEY, a table or
`--json`, one line on stderr and an exit code: 65 refused as invalid, 66 not found, 69 busd
unreachable, 73 already exists, 1 anything else.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import click

from busd.auth.sas import generate_sas_token
from busd.cli.tools import (
    EXIT_FAILED,
    EXIT_INVALID,
    EXIT_NOT_FOUND,
    EXIT_UNAVAILABLE,
    TIMEOUT_S,
    ToolError,
    client_options,
    table,
    tls_context,
    tool_key,
    unreachable,
)
from busd.entities import properties as ep
from busd.entities import property_types as pt

EXIT_EXISTS = 73  # sysexits EX_CANTCREAT
ATOM = "http://www.w3.org/2005/Atom"
SB = "http://schemas.microsoft.com/netservices/2010/10/servicebus/connect"
XSI = "http://www.w3.org/2001/XMLSchema-instance"
API = "api-version=2021-05"


class AtomClient:
    """PUT/GET/DELETE of entity entries, signed as the .NET SDK signs (the URL's path)."""

    def __init__(
        self, url: str, cafile: str | None = None, key: tuple[str, str] | None = None
    ) -> None:
        self.url = url.rstrip("/")
        self.key_name, self.key = tool_key() if key is None else key  # None: the command line's
        self.context = tls_context(self.url, cafile)

    def call(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        update: bool = False,
        query: str = "",
    ) -> ET.Element | None:
        url = f"{self.url}/{path}?{API}" + (f"&{query}" if query else "")
        # the audience names the entity as busd reads the path: percent-decoded ($Default)
        audience = f"{urlsplit(self.url).scheme}://{urlsplit(self.url).netloc}/{unquote(path)}"
        request = urllib.request.Request(url, data=body, method=method)
        request.add_header(
            "Authorization",
            generate_sas_token(audience, self.key_name, self.key, int(time.time()) + 600),
        )
        if body is not None:
            request.add_header("Content-Type", "application/atom+xml;type=entry;charset=utf-8")
        if update:
            request.add_header("If-Match", "*")
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S, context=self.context) as r:
                data = r.read()
        except urllib.error.HTTPError as exc:
            raise _error(exc) from None
        except (urllib.error.URLError, OSError) as exc:
            raise unreachable(self.url, exc) from None
        if not data.strip():
            return None
        root = ET.fromstring(data)
        if (
            root.tag == f"{{{ATOM}}}feed"
            and root.find(f"{{{ATOM}}}entry") is None
            and method == "GET"
            and "/Rules" not in path
        ):
            title = root.findtext(f"{{{ATOM}}}title") or ""
            if title == "Publicly Listed Services":
                raise ToolError(f"no entity {path!r}", EXIT_NOT_FOUND)
        return root


def _error(exc: urllib.error.HTTPError) -> ToolError:
    try:
        detail = ET.fromstring(exc.read()).findtext("Detail") or exc.reason
    except ET.ParseError:
        detail = exc.reason
    code = {
        400: EXIT_INVALID,
        401: EXIT_INVALID,
        403: EXIT_INVALID,
        404: EXIT_NOT_FOUND,
        409: EXIT_EXISTS,
        503: EXIT_UNAVAILABLE,
    }.get(exc.code, EXIT_FAILED)
    return ToolError(str(detail), code)


def entry_document(
    description: str, values: list[tuple[str, str]], extra: list[ET.Element] | None = None
) -> bytes:
    entry = ET.Element(f"{{{ATOM}}}entry")
    content = ET.SubElement(entry, f"{{{ATOM}}}content", type="application/xml")
    desc = ET.SubElement(content, f"{{{SB}}}{description}")
    for name, text in values:
        ET.SubElement(desc, f"{{{SB}}}{name}").text = text
    desc.extend(extra or [])
    return ET.tostring(entry, encoding="utf-8", xml_declaration=True)


def _changed_entry(
    description: str, current: ET.Element | None, values: list[tuple[str, str]]
) -> bytes:
    """The entity's description as busd answered it, with `values` set: what an update sends,
    since busd (as Service Bus) resets what an update leaves out. Read-only elements that
    come back with it are ignored by busd."""
    content = None if current is None else current.find(f"{{{ATOM}}}content")
    if content is None or not len(content):
        raise ToolError(f"busd answered no {description}", EXIT_FAILED)
    kept = [
        child
        for child in content[0]
        if child.tag.rpartition("}")[2] not in {name for name, _ in values}
    ]
    return entry_document(description, values, kept)


def _properties(root: ET.Element | None) -> dict[str, Any]:
    """An answered entry's description as {element: text}; CountDetails as a dict."""
    if root is None:
        return {}
    content = root.find(f"{{{ATOM}}}content")
    if content is None or not len(content):
        return {}
    out: dict[str, Any] = {"name": root.findtext(f"{{{ATOM}}}title")}
    for child in content[0]:
        name = child.tag.rpartition("}")[2]
        if len(child):
            out[name] = {c.tag.rpartition("}")[2]: (c.text or "") for c in child}
        else:
            out[name] = child.text or ""
    return out


def entity_path(*names: str) -> str:
    parts = [quote(names[0], safe="/")]
    if len(names) > 1:
        parts += ["Subscriptions", quote(names[1], safe="")]
    if len(names) > 2:
        parts += ["Rules", quote(names[2], safe="")]
    return "/".join(parts)


def _show(as_json: bool, what: str, props: dict[str, Any]) -> None:
    if as_json:
        click.echo(json.dumps(props, indent=2))
        return
    rows = []
    for name, value in props.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k}={v}" for k, v in value.items())
        rows.append([name, value])
    click.echo(f"{what}\n" + table(["PROPERTY", "VALUE"], rows))


def _options(kind: str) -> list[pt.Property]:
    """The properties of `kind` the command line sets (busd.entities.properties' `flag`)."""
    return [p for p in ep.OF_KIND[kind].values() if p.flag]


def _with(options: list[pt.Property]) -> Callable:
    def decorate(command: Callable) -> Callable:
        for prop in reversed(options):
            if prop.type == pt.BOOL:
                command = click.option(
                    f"--{prop.flag}/--no-{prop.flag}", prop.name, default=None, help=prop.help
                )(command)
            else:
                command = click.option(
                    f"--{prop.flag}",
                    prop.name,
                    type=int if prop.type == pt.INT else str,
                    default=None,
                    help=prop.help,
                )(command)
        return command

    return decorate


def _values(options: list[pt.Property], given: dict[str, Any]) -> list[tuple[str, str]]:
    """The options given, as a description's elements: flags and counts written as the API
    spells them, durations and names as typed (busd checks them)."""
    return [
        (p.name, p.to_text(value) if p.type in (pt.BOOL, pt.INT) else value)
        for p in options
        if (value := given.get(p.name)) is not None
    ]


def _entity_group(kind: str, description: str, nested: bool) -> click.Group:
    label = kind.capitalize()
    options = _options(kind)

    @click.group(name=kind, help=f"Create, change, show or delete a {kind}.")
    def group() -> None:
        pass

    def names_args(command: Callable) -> Callable:
        command = click.argument("name")(command)
        if nested:
            command = click.argument("topic")(command)
        return command

    def _names(kwargs: dict[str, Any]) -> tuple[str, ...]:
        return (kwargs.pop("topic"), kwargs.pop("name")) if nested else (kwargs.pop("name"),)

    for verb, update in (("create", False), ("update", True)):

        def run(update: bool = update, **kwargs: Any) -> None:
            url, cacert, as_json = kwargs.pop("url"), kwargs.pop("cacert"), kwargs.pop("as_json")
            names = _names(kwargs)
            client = AtomClient(url, cacert)
            values = _values(options, kwargs)
            if update:  # a PUT replaces the whole description: send it back with the changes
                body = _changed_entry(description, client.call("GET", entity_path(*names)), values)
            else:
                body = entry_document(description, values)
            root = client.call("PUT", entity_path(*names), body, update=update)
            _show(
                as_json,
                f"{label} {'/'.join(names)} {'updated' if update else 'created'}",
                _properties(root),
            )

        run.__doc__ = (
            f"Change a {kind} (only the options given)." if update else f"Create a {kind}."
        )
        group.command(verb)(names_args(_with(options)(client_options(run))))

    def show(**kwargs: Any) -> None:
        url, cacert, as_json = kwargs.pop("url"), kwargs.pop("cacert"), kwargs.pop("as_json")
        names = _names(kwargs)
        root = AtomClient(url, cacert).call("GET", entity_path(*names))
        _show(as_json, f"{label} {'/'.join(names)}", _properties(root))

    show.__doc__ = f"Show a {kind}'s properties and counts."
    group.command("show")(names_args(client_options(show)))

    def delete(**kwargs: Any) -> None:
        url, cacert, as_json = kwargs.pop("url"), kwargs.pop("cacert"), kwargs.pop("as_json")
        names = _names(kwargs)
        AtomClient(url, cacert).call("DELETE", entity_path(*names))
        if as_json:
            click.echo(json.dumps({"deleted": "/".join(names)}))
        else:
            click.echo(f"{label} {'/'.join(names)} deleted")

    delete.__doc__ = f"Delete a {kind} and everything in it."
    group.command("delete")(names_args(client_options(delete)))
    return group


queue = _entity_group("queue", "QueueDescription", nested=False)
topic = _entity_group("topic", "TopicDescription", nested=False)
subscription = _entity_group("subscription", "SubscriptionDescription", nested=True)


@click.group(help="Create, list or delete a subscription's rules.")
def rule() -> None:
    pass


# A correlation filter's system properties, as --correlation names them.
CORRELATION_FIELDS = {
    "correlation-id": "CorrelationId",
    "message-id": "MessageId",
    "to": "To",
    "reply-to": "ReplyTo",
    "label": "Label",
    "subject": "Label",
    "session-id": "SessionId",
    "reply-to-session-id": "ReplyToSessionId",
    "content-type": "ContentType",
}


def rule_document(
    name: str, sql: str | None, correlation: tuple[str, ...], action: str | None
) -> bytes:
    desc = ET.Element(f"{{{SB}}}RuleDescription")
    if sql is not None and correlation:
        raise click.UsageError("give --sql or --correlation, not both")
    if correlation:
        filt = ET.SubElement(desc, f"{{{SB}}}Filter", {f"{{{XSI}}}type": "CorrelationFilter"})
        fields = CORRELATION_FIELDS
        props = []
        for item in correlation:
            key, sep, value = item.partition("=")
            if not sep:
                raise click.BadParameter(
                    f"takes KEY=VALUE, got {item!r}", param_hint="--correlation"
                )
            if key.lower() in fields:
                ET.SubElement(filt, f"{{{SB}}}{fields[key.lower()]}").text = value
            else:
                props.append((key, value))
        if props:
            holder = ET.SubElement(filt, f"{{{SB}}}Properties")
            for key, value in props:
                pair = ET.SubElement(holder, f"{{{SB}}}KeyValueOfstringanyType")
                ET.SubElement(pair, f"{{{SB}}}Key").text = key
                ET.SubElement(
                    pair, f"{{{SB}}}Value", {f"{{{XSI}}}type": "d6p1:string"}
                ).text = value
    else:
        filt = ET.SubElement(desc, f"{{{SB}}}Filter", {f"{{{XSI}}}type": "SqlFilter"})
        ET.SubElement(filt, f"{{{SB}}}SqlExpression").text = sql or "1=1"
    if action:
        act = ET.SubElement(desc, f"{{{SB}}}Action", {f"{{{XSI}}}type": "SqlRuleAction"})
        ET.SubElement(act, f"{{{SB}}}SqlExpression").text = action
    ET.SubElement(desc, f"{{{SB}}}Name").text = name
    entry = ET.Element(f"{{{ATOM}}}entry")
    ET.SubElement(entry, f"{{{ATOM}}}content", type="application/xml").append(desc)
    return ET.tostring(entry, encoding="utf-8", xml_declaration=True)


def _rule_row(entry: ET.Element) -> dict[str, Any]:
    desc = entry.find(f"{{{ATOM}}}content/{{{SB}}}RuleDescription")
    assert desc is not None
    filt = desc.find(f"{{{SB}}}Filter")
    action = desc.find(f"{{{SB}}}Action")
    kind = filt.get(f"{{{XSI}}}type") if filt is not None else None
    text: str | None
    if kind == "CorrelationFilter" and filt is not None:
        text = ", ".join(
            f"{c.tag.rpartition('}')[2]}={c.text}" for c in filt if c.text and len(c) == 0
        )
    else:
        text = filt.findtext(f"{{{SB}}}SqlExpression") if filt is not None else None
    return {
        "name": entry.findtext(f"{{{ATOM}}}title"),
        "filter_type": kind,
        "filter": text,
        "action": action.findtext(f"{{{SB}}}SqlExpression") if action is not None else None,
    }


@rule.command("create")
@click.argument("topic")
@click.argument("subscription")
@click.argument("name")
@click.option("--sql", default=None, help="A SQL filter, e.g. \"color = 'red'\" (default 1=1).")
@click.option(
    "--correlation",
    multiple=True,
    metavar="KEY=VALUE",
    help="A correlation filter field (session-id, label, to, ...) or property (repeatable).",
)
@click.option("--action", default=None, help='A SQL action, e.g. "SET handled = true".')
@client_options
def rule_create(
    topic: str,
    subscription: str,
    name: str,
    sql: str | None,
    correlation: tuple[str, ...],
    action: str | None,
    url: str,
    cacert: str | None,
    as_json: bool,
) -> None:
    """Add a rule to a subscription."""
    root = AtomClient(url, cacert).call(
        "PUT", entity_path(topic, subscription, name), rule_document(name, sql, correlation, action)
    )
    row = _rule_row(root) if root is not None else {"name": name}
    if as_json:
        click.echo(json.dumps(row, indent=2))
    else:
        click.echo(f"Rule {name} created on {topic}/{subscription}: {row.get('filter')}")


@rule.command("list")
@click.argument("topic")
@click.argument("subscription")
@client_options
def rule_list(topic: str, subscription: str, url: str, cacert: str | None, as_json: bool) -> None:
    """List a subscription's rules."""
    root = AtomClient(url, cacert).call("GET", entity_path(topic, subscription) + "/Rules")
    rows = [_rule_row(e) for e in (root.findall(f"{{{ATOM}}}entry") if root is not None else [])]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    else:
        click.echo(
            table(
                ["RULE", "FILTER-TYPE", "FILTER", "ACTION"],
                [[r["name"], r["filter_type"], r["filter"], r["action"]] for r in rows],
            )
        )


@rule.command("delete")
@click.argument("topic")
@click.argument("subscription")
@click.argument("name")
@client_options
def rule_delete(
    topic: str, subscription: str, name: str, url: str, cacert: str | None, as_json: bool
) -> None:
    """Delete a rule."""
    AtomClient(url, cacert).call("DELETE", entity_path(topic, subscription, name))
    click.echo(
        json.dumps({"deleted": name})
        if as_json
        else f"Rule {name} deleted from {topic}/{subscription}"
    )


COMMANDS = (queue, topic, subscription, rule)
