"""`busd queue|topic|subscription|rule create|update|show|delete`, and `busd rule list`: entities
managed over busd's management (ATOM) API (busd.client.atom), the one the SDKs' administration
clients call (docs/management.md §3), so the command line and the SDKs cannot disagree.

Like the other tools (busd.cli.output): `--url`/BUSD_URL, a SAS token from BUSD_SAS_KEY, a
table or `--json`, one line on stderr and an exit code (busd.errors).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import click

from busd.cli.output import client_options, table
from busd.client.atom import (
    ATOM,
    AtomClient,
    changed_entry,
    entity_path,
    entry_document,
    entry_properties,
    rule_document,
    rule_row,
)
from busd.entities import properties as ep
from busd.entities import property_types as pt


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
                body = changed_entry(description, client.call("GET", entity_path(*names)), values)
            else:
                body = entry_document(description, values)
            root = client.call("PUT", entity_path(*names), body, update=update)
            _show(
                as_json,
                f"{label} {'/'.join(names)} {'updated' if update else 'created'}",
                entry_properties(root),
            )

        run.__doc__ = (
            f"Change a {kind} (only the options given)." if update else f"Create a {kind}."
        )
        group.command(verb)(names_args(_with(options)(client_options(run))))

    def show(**kwargs: Any) -> None:
        url, cacert, as_json = kwargs.pop("url"), kwargs.pop("cacert"), kwargs.pop("as_json")
        names = _names(kwargs)
        root = AtomClient(url, cacert).call("GET", entity_path(*names))
        _show(as_json, f"{label} {'/'.join(names)}", entry_properties(root))

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
    row = rule_row(root) if root is not None else {"name": name}
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
    rows = [rule_row(e) for e in (root.findall(f"{{{ATOM}}}entry") if root is not None else [])]
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
