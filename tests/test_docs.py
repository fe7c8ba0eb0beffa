"""The user and operator documents name only what exists: every `busd` command and option
they show is one the command line has, every metric name one busd serves, every link a file
(and heading) of the repository, every path of the repository they name (`busd/...`,
`tests/...`, `scripts/...`) a file or folder that exists, every Python example valid Python."""

from __future__ import annotations

import ast
import re
import unicodedata
from pathlib import Path

import click
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from busd.cli.main import cli
from busd.observability.metrics import Metrics
from busd.storage.counts import EntityCounts

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
# The documents for users and operators (docs/README.md lists them).
USER_DOCS = [
    DOCS / name
    for name in (
        "quickstart.md",
        "containers.md",
        "operating.md",
        "troubleshooting.md",
        "emulator.md",
        "amqp-clients.md",
    )
]
ALL_DOCS = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]

# Options of other tools these documents show, by tool: anything else spelt `--x` must be an
# option of a `busd` command.
FOREIGN_OPTIONS = {
    "docker compose": {"--rm", "--no-deps", "--entrypoint"},
    "docker build": {"--build-arg"},
    "podman build": {"--format"},
    "git log": {"--oneline"},
    "scripts/bench": {"--scenario"},
}
FOREIGN = set().union(*FOREIGN_OPTIONS.values())


def _commands(group: click.Group, prefix: str = "busd") -> dict[str, click.Command]:
    found: dict[str, click.Command] = {prefix: group}
    for name, command in group.commands.items():
        path = f"{prefix} {name}"
        found[path] = command
        if isinstance(command, click.Group):
            found.update(_commands(command, path))
    return found


COMMANDS = _commands(cli)
OPTIONS = {
    opt for command in COMMANDS.values() for param in command.params for opt in param.opts
} | {"--help", "--version"}


def _served_metric_names() -> set[str]:
    """Every sample and family name of /metrics, the store's per-entity figures included."""
    metrics = Metrics()
    metrics.sweep_seconds.observe(0.01)
    metrics.unauthenticated_evicted("address")
    metrics.http_evicted("address")
    metrics.handshake_timed_out("token")
    metrics.settlement_refused("q", "lock-lost")
    metrics.messages_sent("q", 1)
    metrics.messages_received("q", 1)
    counts = EntityCounts(oldest_enqueued_ms=1, totals={"sent": 1})
    metrics.store_figures.snapshot = {"q": (counts, EntityCounts())}
    text = (
        metrics.process_text()
        + generate_latest(metrics.store_registry).decode()
        + generate_latest(metrics.build_registry).decode()
    )
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
    return names


def _blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of each fenced code block."""
    blocks, language, body = [], None, []
    for line in text.splitlines():
        fence = re.match(r"^\s*```(\w*)\s*$", line)
        if fence and language is None:
            language, body = fence.group(1), []
        elif fence:
            blocks.append((language, "\n".join(body)))
            language = None
        elif language is not None:
            body.append(line)
    return blocks


def _prose(text: str) -> str:
    """The text outside fenced code blocks."""
    return re.sub(r"^\s*```\w*\s*$.*?^\s*```\s*$", "", text, flags=re.M | re.S)


def _invocations(text: str) -> list[list[str]]:
    """The words of each `busd ...` command line: shell lines of code blocks that run busd,
    and inline code that starts with it."""
    lines = [
        line.strip()
        for language, body in _blocks(text)
        if language in ("", "sh", "bash")
        for line in body.splitlines()
    ]
    lines += re.findall(r"`(busd [^`]+)`", _prose(text))
    found = []
    for line in lines:
        match = re.match(r"(?:\S*/)?busd (.*)", line)
        if match:
            found.append(match.group(1).split())
    return found


@pytest.mark.parametrize("doc", USER_DOCS, ids=lambda p: p.name)
def test_every_busd_command_and_option_exists(doc: Path) -> None:
    text = doc.read_text()
    unknown_options = sorted(
        set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text)) - OPTIONS - FOREIGN
    )
    assert not unknown_options, f"{doc.name}: options no busd command has: {unknown_options}"
    for words in _invocations(text):
        path = "busd"
        for word in words:
            command = COMMANDS[path]
            if not isinstance(command, click.Group) or word.startswith("-"):
                break
            assert f"{path} {word}" in COMMANDS, f"{doc.name}: no command `{path} {word}`"
            path = f"{path} {word}"
        options = {w.split("=")[0] for w in words if w.startswith("--")}
        own = {o for param in COMMANDS[path].params for o in param.opts} | {"--help"}
        assert options <= own, f"{doc.name}: `{path}` has no {sorted(options - own)}"


def test_every_metric_name_is_served() -> None:
    served = _served_metric_names()
    plugin = (ROOT / "busd" / "testing" / "pytest_plugin.py").read_text()
    fixtures = set(re.findall(r"^def (busd_\w+)", plugin, re.M))  # busd_broker, ...
    for doc in USER_DOCS:
        for name, wildcard in re.findall(r"\b(busd_[a-z_]*[a-z])(_?\*)?", doc.read_text()):
            if name in fixtures:
                continue
            if wildcard:  # busd_entity_*: a prefix of served names
                assert any(s.startswith(name) for s in served), f"{doc.name}: {name}*"
            else:
                assert name in served, f"{doc.name}: busd serves no metric {name}"


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation and symbols dropped,
    spaces to hyphens."""
    kept = "".join(
        c for c in heading.strip().lower() if c in "-_ " or unicodedata.category(c)[0] in "LN"
    )
    return kept.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = _prose(path.read_text())
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}


@pytest.mark.parametrize("doc", ALL_DOCS, ids=lambda p: p.name)
def test_links_reach_files_and_headings(doc: Path) -> None:
    text = _prose(doc.read_text())
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        path = (doc.parent / file_part).resolve() if file_part else doc
        assert path.exists(), f"{doc.name}: link to {target}: no such file"
        if anchor and path.suffix == ".md":
            assert anchor in _anchors(path), f"{doc.name}: link to {target}: no such heading"


# A path of the repository as the documents name it: not inside an absolute path (a user's
# /home/me/busd/...), possibly a glob (`busd/config/arm*.py`).
REPO_PATH = re.compile(r"(?<![\w/.-])((?:busd|tests|scripts)/[\w*./-]*[\w*])")


@pytest.mark.parametrize("doc", ALL_DOCS, ids=lambda p: p.name)
def test_paths_named_exist(doc: Path) -> None:
    missing = [
        name
        for name in sorted(set(REPO_PATH.findall(doc.read_text())))
        if not list(ROOT.glob(name))
    ]
    assert not missing, f"{doc.name} names paths that do not exist: {missing}"


@pytest.mark.parametrize("doc", USER_DOCS, ids=lambda p: p.name)
def test_python_examples_are_python(doc: Path) -> None:
    for language, block in _blocks(doc.read_text()):
        if language == "python":
            ast.parse(block)
