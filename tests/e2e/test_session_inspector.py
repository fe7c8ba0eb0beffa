"""The session inspector end to end (docs/management.md §2): sessions the official SDK made,
paged over HTTP and the command line; a stuck session marked, its lock released by an
operator (the holder's next settle then fails with session-lock-lost), its state cleared."""

from __future__ import annotations

import json
import time
import urllib.request
from urllib.parse import quote

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import SessionLockLostError
from click.testing import CliRunner

from busd.cli.main import cli
from tests.e2e.conftest import queue, receive
from tests.e2e.test_admin_cli import admin_token

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def busd(busd_factory):
    return busd_factory([queue("inspect", RequiresSession=True, LockDuration="PT2S")])


def _get(busd, path: str) -> tuple[list, dict]:
    request = urllib.request.Request(busd.http_url + path)
    request.add_header("Authorization", admin_token())
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read()), dict(response.headers)


def _request(busd, method: str, path: str) -> int:
    request = urllib.request.Request(busd.http_url + path, method=method)
    request.add_header("Authorization", admin_token())
    request.add_header("If-Match", "*")
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status


def _tool(busd, *args: str):
    result = CliRunner().invoke(cli, [*args, "--url", busd.http_url], prog_name="busd")
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    return result


def test_paged_listing_stuck_session_release_and_clear_state(busd):
    with ServiceBusClient.from_connection_string(busd.connection_string, retry_total=0) as sb:
        with sb.get_queue_sender("inspect") as sender:
            sender.send_messages([ServiceBusMessage(f"m{i}", session_id="stuck") for i in range(3)])
            sender.send_messages(
                [ServiceBusMessage(f"s{i}", session_id=f"idle-{i}") for i in range(3)]
            )
        with sb.get_queue_receiver("inspect", session_id="idle-0", max_wait_time=5) as rx:
            rx.session.set_state(b"keep me")

        # HTTP pages of 2, by id, each session once
        seen: list[str] = []
        after = ""
        while True:
            page, headers = _get(
                busd, "/admin/queues/inspect/sessions?top=2" + (f"&after={after}" if after else "")
            )
            assert len(page) <= 2 and headers["X-Total-Count"] == "4"
            seen += [s["session_id"] for s in page]
            after = headers.get("X-Next-After", "")
            if not after:
                break
        assert seen == ["idle-0", "idle-1", "idle-2", "stuck"]
        # the command line follows every page as well
        listed = json.loads(
            _tool(busd, "sessions", "inspect", "--page", "3", "--all", "--json").stdout
        )
        assert [s["session_id"] for s in listed["sessions"]] == seen
        assert listed["total"] == 4 and listed["next_after"] is None
        first = json.loads(_tool(busd, "sessions", "inspect", "--page", "3", "--json").stdout)
        assert len(first["sessions"]) == 3 and first["next_after"] == "idle-2"
        rest = json.loads(
            _tool(busd, "sessions", "inspect", "--after", first["next_after"], "--json").stdout
        )
        assert [s["session_id"] for s in rest["sessions"]] == ["stuck"]

        with sb.get_queue_receiver("inspect", session_id="stuck", max_wait_time=5) as rx:
            (message,) = receive(rx, 1)[:1]
            # held, renewed, nothing settled for longer than the 2 s lock: stuck
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                rx.session.renew_lock()
                time.sleep(0.5)
            (held,), _ = _get(busd, "/admin/queues/inspect/sessions?sort=locked")
            # active is ActiveMessageCount: the one in flight counts (docs/management.md §4)
            assert (held["session_id"], held["stuck"], held["in_flight"], held["active"]) == (
                "stuck",
                True,
                1,
                3,
            )
            assert held["holder_address"].startswith("127.0.0.1:")
            assert held["oldest_message_age_s"] >= 3
            text = _tool(busd, "sessions", "inspect", "--sort", "locked").output
            assert "stuck (stuck)" in text

            released = json.loads(
                _tool(busd, "sessions", "release", "inspect", "stuck", "--json").stdout
            )
            assert released == {"released": True}
            with pytest.raises(SessionLockLostError):
                rx.complete_message(message)
        (after_release,), _ = _get(busd, "/admin/queues/inspect/sessions?after=idle-2")
        assert (after_release["locked"], after_release["active"]) == (False, 3)

    state_path = f"/admin/queues/inspect/sessions/{quote('idle-0', safe='')}/state"
    (idle,), _ = _get(busd, "/admin/queues/inspect/sessions?top=1")
    assert (idle["state_size"], idle["state_preview"]) == (7, "keep me")
    assert _request(busd, "DELETE", state_path) in (200, 204)
    (idle,), _ = _get(busd, "/admin/queues/inspect/sessions?top=1")
    assert (idle["session_id"], idle["state_size"]) == ("idle-0", 0)
