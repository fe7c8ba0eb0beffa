"""busd's management (ATOM) API, the one the SDKs' administration clients call
(docs/management.md §3): entity entries read and written as Atom XML, signed as the .NET SDK
signs (the URL's path)."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import click

from busd.auth.sas import generate_sas_token
from busd.client.admin import tool_key
from busd.client.http import TIMEOUT_S, ToolError, http_error, tls_context, unreachable
from busd.errors import EXIT_FAILURE, EXIT_NOT_FOUND

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
        detail = ET.fromstring(exc.read()).findtext("Detail")
    except ET.ParseError:
        detail = None
    return http_error(exc, detail)


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


def changed_entry(
    description: str, current: ET.Element | None, values: list[tuple[str, str]]
) -> bytes:
    """The entity's description as busd answered it, with `values` set: what an update sends,
    since busd (as Service Bus) resets what an update leaves out. Read-only elements that
    come back with it are ignored by busd."""
    content = None if current is None else current.find(f"{{{ATOM}}}content")
    if content is None or not len(content):
        raise ToolError(f"busd answered no {description}", EXIT_FAILURE)
    kept = [
        child
        for child in content[0]
        if child.tag.rpartition("}")[2] not in {name for name, _ in values}
    ]
    return entry_document(description, values, kept)


def entry_properties(root: ET.Element | None) -> dict[str, Any]:
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


def rule_row(entry: ET.Element) -> dict[str, Any]:
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
