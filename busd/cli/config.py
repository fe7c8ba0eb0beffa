"""`busd config`: the entities file (Config.json) as code, exported from a running busd or
imported from an ARM template (docs/topology.md)."""

from __future__ import annotations

import click

from busd.cli.exits import _fail
from busd.cli.output import URL_HELP
from busd.client.admin import DEFAULT_URL


@click.group("config")
def config_group() -> None:
    """The entities file (the emulator's Config.json) as code: export a running busd's
    namespace, or import an ARM template's Service Bus resources (docs/topology.md)."""


def _write_document(document: dict, output: str) -> None:
    import json

    text = json.dumps(document, indent=2) + "\n"
    if output == "-":
        click.echo(text, nl=False)
    else:
        with open(output, "w", encoding="utf-8") as out:
            out.write(text)


def _notes(notes: list[str]) -> None:
    for note in notes:
        click.echo(f"busd: note: {note}", err=True)


@config_group.command("export")
@click.option(
    "--output", "-o", default="-", metavar="PATH", help="Where to write it (default: stdout)."
)
@click.option(
    "--url",
    envvar="BUSD_URL",
    default=DEFAULT_URL,
    show_default=True,
    help=URL_HELP,
)
@click.option(
    "--cacert", envvar="BUSD_CACERT", default=None, metavar="PATH", help="CA for https://."
)
def config_export(output: str, url: str, cacert: str | None) -> None:
    """Write the namespace busd serves at --url (the one BUSD_SAS_KEY's key name picks) as a
    Config.json that `busd serve --config` serves back: queues, topics, subscriptions,
    rules and their properties."""
    from busd.cli.config_export import export_namespace
    from busd.client.atom import AtomClient

    exported = export_namespace(AtomClient(url, cacert))
    _write_document(exported.document, output)
    _notes(exported.notes)


@config_group.command("import")
@click.argument("template", type=click.File("r", encoding="utf-8-sig"))
@click.option(
    "--parameter",
    "-p",
    "parameters",
    multiple=True,
    metavar="NAME=VALUE",
    help="A template parameter's value, over its defaultValue (repeatable).",
)
@click.option(
    "--parameters",
    "parameters_file",
    type=click.File("r", encoding="utf-8-sig"),
    default=None,
    metavar="PATH",
    help="An ARM parameters file (azuredeploy.parameters.json); --parameter wins over it.",
)
@click.option(
    "--key",
    "keys",
    multiple=True,
    metavar="NAME=KEY",
    help="The key of a namespace authorization rule (Azure makes them; default: a new one).",
)
@click.option(
    "--output", "-o", default="-", metavar="PATH", help="Where to write it (default: stdout)."
)
def config_import(
    template, parameters: tuple[str, ...], parameters_file, keys: tuple[str, ...], output: str
) -> None:
    """Convert an ARM template (JSON) with Service Bus resources into a Config.json for
    `busd serve --config`; refuse, naming the resource and property, what busd cannot honour."""
    import json

    from busd.config.arm import convert
    from busd.config.arm_expressions import TemplateError
    from busd.errors import EXIT_INVALID

    def pairs(values: tuple[str, ...], option: str) -> dict[str, str]:
        out = {}
        for value in values:
            name, sep, text = value.partition("=")
            if not sep or not name:
                raise click.BadParameter(f"takes NAME=VALUE, got {value!r}", param_hint=option)
            out[name] = text
        return out

    given: dict = {}
    try:
        document = json.load(template)
        if parameters_file is not None:
            given = {
                name: spec.get("value") if isinstance(spec, dict) else spec
                for name, spec in (json.load(parameters_file).get("parameters") or {}).items()
            }
    except (ValueError, AttributeError) as exc:
        _fail(f"not a JSON template or parameters file: {exc}", EXIT_INVALID)
    except RecursionError:
        _fail("the template or parameters file nests too deeply to be read", EXIT_INVALID)
    given.update(pairs(parameters, "--parameter"))
    try:
        converted = convert(document, given, pairs(keys, "--key"))
    except TemplateError as exc:
        _fail(f"{template.name}: {exc}", EXIT_INVALID)
    except (TypeError, AttributeError, KeyError, IndexError, ValueError) as exc:
        # a shape no check above foresaw: still one line and the data error's exit code
        _fail(f"{template.name}: a malformed template ({type(exc).__name__}: {exc})", EXIT_INVALID)
    _write_document(converted.document, output)
    _notes(converted.notes)
