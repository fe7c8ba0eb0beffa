"""What a long-lived connection keeps of its past links and AMQP sessions (docs/design.md
§3.12): a session processor takes one session after another over the same connection, and
busd must not keep the links and sessions it detached or ended. Read from busd's own census on
`/metrics` (`busd_link_objects`, `busd_session_objects`) while the client is still connected,
with a plain proton client and with the JavaScript SDK (a session per link)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.request

import pytest
from proton import Message

from tests.e2e.amqp_client import ProtonCbsClient
from tests.e2e.conftest import queue

pytestmark = pytest.mark.timeout(240)

TAKES = 40  # links attached and detached over one connection


@pytest.fixture(scope="module")
def busd(busd_factory):
    return busd_factory([queue("churned"), queue("churned-sessions", RequiresSession=True)])


def census(busd) -> tuple[float, float, float]:
    """(busd_session_objects, busd_link_objects, busd_links) from busd's /metrics."""
    with urllib.request.urlopen(f"{busd.http_url}/metrics", timeout=10) as response:
        text = response.read().decode()

    def sample(name: str) -> float:
        match = re.search(rf"^{name} (\S+)$", text, re.M)
        assert match, f"{name} not in /metrics"
        return float(match.group(1))

    return sample("busd_session_objects"), sample("busd_link_objects"), sample("busd_links")


def settled(busd, most: float, patience: float = 10) -> tuple[float, float, float]:
    """The census once the link count is at most `most` (answers finish in the background)."""
    deadline = time.monotonic() + patience
    figures = census(busd)
    while figures[1] > most and time.monotonic() < deadline:
        time.sleep(0.1)
        figures = census(busd)
    return figures


def test_a_proton_connection_keeps_only_its_attached_links(busd):
    with ProtonCbsClient(busd.port) as client:
        client.authorize("churned")
        client.authorize("churned-sessions")
        sender = client.sender("churned-sessions")
        for i in range(TAKES):
            sender.send(Message(body=f"m{i}", group_id=f"s{i}"))
        _, links_before, _ = census(busd)
        for i in range(TAKES):
            client.receiver("churned", credit=1).close()
            receiver = client.receiver("churned-sessions", credit=1, session=f"s{i}")
            delivery = receiver.receive(timeout=10)
            receiver.accept()
            assert delivery.body == f"m{i}"
            receiver.close()
        sessions, links, attached = settled(busd, links_before)
        # the $cbs node's two links and the sender: what is attached, not what was
        assert links == links_before == attached, (links, links_before, attached)
        assert sessions <= 1


def test_the_javascript_sdk_session_per_link_is_not_kept(busd, node_modules):
    """The SDK begins an AMQP session for every receiver (and its `$management` link) on one
    connection: TAKES session receivers later, busd keeps no more than one receiver's worth."""
    env = dict(
        os.environ,
        BUSD_CONN=busd.connection_string,
        BUSD_QUEUE="churned-sessions",
        BUSD_SESSIONS=str(TAKES),
    )
    proc = subprocess.Popen(
        [shutil.which("node"), "session_churn.mjs"],
        cwd=node_modules.parent,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        steps = {}
        for line in proc.stdout:
            if line.startswith("{"):
                item = json.loads(line)
                steps[item["step"]] = item["value"]
                if item["step"] == "held":
                    break
        assert steps.get("held") == TAKES, proc.stderr.read() if proc.poll() is not None else steps
        sessions, links, attached = settled(busd, 8)
        # the SDK's $cbs pair and sender are closed or kept by the SDK: a handful, not TAKES
        assert links <= 8 and sessions <= 8, (sessions, links, attached)
        proc.stdin.write("done\n")
        proc.stdin.flush()
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0 and '"done"' in out, out + err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
