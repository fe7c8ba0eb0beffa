"""The command line: options and BUSD_* variables, one-line errors with named exit codes."""

import subprocess
import sys
import time
from importlib.metadata import version

from click.testing import CliRunner

from busd import __version__
from busd.auth.sas import verify_sas_token
from busd.cli.exits import EXIT_CONFIG
from busd.cli.main import cli


def run(*args, env=None):
    return CliRunner().invoke(cli, list(args), env=env, prog_name="busd")


def test_python_dash_m_busd_runs_the_cli():
    result = subprocess.run(
        [sys.executable, "-m", "busd", "--version"], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0
    assert __version__ in result.stdout


def test_version_is_the_installed_package_s():
    """The version the build took from git (pyproject.toml's setuptools-scm), not a constant
    in the source: what /health/detail and busd_build_info show too."""
    result = subprocess.run(
        [sys.executable, "-m", "busd", "--version"], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0
    assert result.stdout == f"busd, version {version('busd')}\n"
    assert __version__ == version("busd")


def test_serve_lists_every_option():
    result = run("serve", "--help")
    assert result.exit_code == 0
    for option in (
        "--host",
        "--port",
        "--config",
        "--redis-url",
        "--data-dir",
        "--http-port",
        "--tls-port",
        "--ws-port",
        "--tls-cert",
        "--tls-key",
        "--log-level",
        "--log-format",
        "--workers",
        "--store-shards",
        "--durability",
    ):
        assert option in result.output


def test_store_shards_are_those_of_the_embedded_store():
    result = run("serve", "--store-shards", "many")
    assert result.exit_code == 2 and "neither a number nor 'auto'" in result.output
    result = run("serve", "--store-shards", "17")
    assert result.exit_code == EXIT_CONFIG and "store shards must be 1..16" in result.output
    result = run("serve", "--store-shards", "3", "--redis-url", "redis://127.0.0.1:1")
    assert result.exit_code == EXIT_CONFIG and "--store-shards" in result.output
    result = run("serve", "--store-shards", "auto", "--durability", "replicated")
    assert result.exit_code == EXIT_CONFIG and "--store-shards" in result.output


def test_auto_store_shards_take_half_the_cores_and_one_partition_each():
    from busd.storage.redis.embedded import default_partitions, shard_count

    assert [shard_count(None, cores) for cores in (1, 2, 3, 8, 16, 64)] == [1, 1, 1, 4, 8, 16]
    assert shard_count(3, 64) == 3
    assert [default_partitions(n) for n in (2, 3, 5, 8, 16)] == [2, 3, 5, 8, 16]


def test_bad_port_from_environment_is_a_one_line_config_error():
    result = run("serve", env={"BUSD_PORT": "70000"})
    assert result.exit_code == EXIT_CONFIG
    assert result.output.strip().splitlines() == [
        "busd: error: port must be a TCP port (0..65535), got 70000"
    ]


def test_tls_port_takes_a_port_or_off():
    result = run("serve", "--tls-port", "sometimes")
    assert result.exit_code == 2 and "neither a port number nor 'off'" in result.output
    result = run("serve", "--tls-cert", "/nonexistent/cert.pem")
    assert result.exit_code == EXIT_CONFIG and "--tls-key" in result.output


def test_workers_takes_a_count_or_auto():
    result = run("serve", "--workers", "many")
    assert result.exit_code == 2 and "neither a number nor 'auto'" in result.output
    result = run("serve", env={"BUSD_WORKERS": "0"})
    assert result.exit_code == EXIT_CONFIG
    assert result.output.strip() == "busd: error: workers must be 1..1024, got 0"


def test_auto_workers_leave_a_core_to_each_local_shard(monkeypatch):
    """`--workers auto` beside a local Cluster of the embedded store: the cores less one per
    shard (busd.cli.serve_options.auto_workers), said in the banner; with one Valkey, or a store
    of its own (--redis-url), every core."""
    import busd.cli.serve_options
    import busd.server.cpu_quota
    import busd.server.lifecycle
    import busd.server.workers
    from busd.cli.serve_options import auto_workers

    assert [auto_workers(s, 16) for s in (1, 2, 8, 16)] == [16, 14, 8, 1]
    assert auto_workers(3, 2) == 1 and auto_workers(1, 1) == 1

    ran = []
    monkeypatch.setattr(busd.cli.serve_options, "_cores", lambda: 16)
    monkeypatch.setattr(busd.server.lifecycle, "run", lambda settings: ran.append(settings) or 0)
    monkeypatch.setattr(busd.server.workers, "run", lambda settings: ran.append(settings) or 0)
    assert run("serve", "--workers", "auto", "--store-shards", "4").exit_code == 0
    assert run("serve", "--workers", "auto").exit_code == 0
    assert run("serve", "--workers", "auto", "--redis-url", "redis://127.0.0.1:1").exit_code == 0
    assert run("serve", "--workers", "3", "--store-shards", "4").exit_code == 0
    assert [(s.workers, s.workers_auto) for s in ran] == [
        (12, True),
        (16, True),
        (16, True),
        (3, False),
    ]

    supervisor = busd.server.workers._Supervisor(ran[0], 12, {}, {}, "", embedded=True)
    monkeypatch.setattr(busd.server.cpu_quota, "usable_cores", lambda: 16)
    assert supervisor._auto_note() == " (auto: 16 cores less 4 for the store's shards)"
    assert busd.server.workers._Supervisor(ran[3], 3, {}, {}, "", embedded=True)._auto_note() == ""


def test_durability_is_refused_where_it_cannot_be_had():
    result = run("serve", "--durability", "always")
    assert result.exit_code == 2
    result = run("serve", "--redis-url", "redis+sentinel://h:26379")
    assert result.exit_code == EXIT_CONFIG and "names its service" in result.output


def test_missing_entities_file_is_a_config_error(tmp_path):
    result = run("serve", "--config", str(tmp_path / "nope.json"))
    assert result.exit_code == EXIT_CONFIG
    assert "nope.json" in result.output and "Traceback" not in result.output


def test_bad_sas_key_option_is_a_config_error():
    result = run("serve", "--sas-key", "no-equals-sign")
    assert result.exit_code == EXIT_CONFIG
    assert "NAME=KEY" in result.output
    result = run("serve", env={"BUSD_SAS_KEY": "ok=k:Send reader=k:Read"})
    assert result.exit_code == EXIT_CONFIG
    assert result.output.strip() == (
        "busd: error: --sas-key: unknown right 'Read': rights are Send, Listen and Manage"
    )


def test_unknown_log_level_is_a_usage_error():
    result = run("serve", "--log-level", "loud")
    assert result.exit_code == 2


def test_sas_token_command_makes_a_verifiable_token():
    result = run("sas-token", "--audience", "sb://localhost:5672/q", "--ttl", "60")
    assert result.exit_code == 0
    token = result.output.strip()
    parsed = verify_sas_token(token, {"RootManageSharedAccessKey": "SAS_KEY_VALUE"})
    assert parsed.audience == "sb://localhost:5672/q"
    assert parsed.expiry <= time.time() + 61


def test_a_misspelt_entity_property_stops_serve_with_one_line(tmp_path):
    path = tmp_path / "Config.json"
    path.write_text(
        '{"UserConfig": {"Namespaces": [{"Name": "ns", "Queues": ['
        '{"Name": "orders", "Properties": {"RequiresSesion": true}}]}]}}'
    )
    # a store nobody listens on: were the file accepted, serve would stop at once, not serve
    result = run(
        "serve",
        "--config",
        str(path),
        "--redis-url",
        "redis://127.0.0.1:9",
        "--port",
        "0",
        "--http-port",
        "0",
        "--tls-port",
        "off",
        "--ws-port",
        "off",
    )
    assert result.exit_code == EXIT_CONFIG
    assert result.output.strip().splitlines() == [
        f"busd: error: entities file {path}: queue 'orders': unknown property "
        "'RequiresSesion': not a queue property of Service Bus (did you mean "
        "'RequiresSession'?)"
    ]


def _commands(group, prefix=()):
    for name, command in group.commands.items():
        if hasattr(command, "commands"):
            yield from _commands(command, (*prefix, name))
        else:
            yield (*prefix, name), command


def test_every_tool_s_help_names_the_key_variable_it_signs_with():
    tools = [
        path
        for path, command in _commands(cli)
        if any("--url" in param.opts for param in command.params)
    ]
    assert {("queues",), ("dlq", "resubmit"), ("queue", "create"), ("config", "export")} <= set(
        tools
    )
    for path in tools:
        result = CliRunner().invoke(cli, [*path, "--help"], prog_name="busd")
        assert result.exit_code == 0, (path, result.output)
        assert "BUSD_SAS_KEY" in result.output, path
