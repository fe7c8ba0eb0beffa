"""The web dashboard in a real headless Chromium (Debian's `chromium` and `chromium-driver`,
driven by Selenium): it signs in with a key, shows a queue's counts after SDK sends, pages
through a session's messages, resubmits a dead letter, and dead-letters a session and resubmits
it. A screenshot of each run is kept
under test-artifacts/ (the path is printed)."""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import SessionLockLostError
from azure.servicebus.management import (
    ServiceBusAdministrationClient,
    SqlRuleAction,
    SqlRuleFilter,
)

from busd.auth.sas import generate_sas_token, parse_sas_token
from tests.e2e.conftest import queue, receive

pytestmark = pytest.mark.timeout(120)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"

if not (CHROMIUM and CHROMEDRIVER):
    pytest.skip(
        "needs Debian's chromium and chromium-driver (.ci/run installs them)",
        allow_module_level=True,
    )

from selenium import webdriver  # noqa: E402
from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions as ec  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


@pytest.fixture(scope="module")
def busd(busd_factory):
    return busd_factory(
        [
            queue("dash-plain"),
            queue("dash-sessions", RequiresSession=True),
            queue("dash-subject"),
            queue("dash-dead", RequiresSession=True),
            queue("dash-held", RequiresSession=True),
            queue("dash-layout", RequiresSession=True),
            queue("dash-counted"),
            queue("dash-empty-q"),
            queue("dash-rates"),
        ],
        extra_env={"BUSD_FAULTS": "1"},  # faults on demand on: the dashboard shows them
    )


def _chromium(profile: Path, width: int, height: int = 1000):
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        f"--window-size={width},{height}",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    return driver


@pytest.fixture
def browser(tmp_path):
    driver = _chromium(tmp_path / "profile", 1400)
    try:
        yield driver
    finally:
        driver.quit()


def _retrying(action):
    """The tables are redrawn when data arrives: look an element up again if it was."""
    for _ in range(20):
        try:
            return action()
        except StaleElementReferenceException:
            time.sleep(0.1)
    return action()


def _cell(driver, row_selector: str, column: str) -> str:
    return _retrying(
        lambda: driver.find_element(By.CSS_SELECTOR, f"{row_selector} td.{column}").text
    )


def _visible(driver, selector: str) -> bool:
    return _retrying(lambda: driver.find_element(By.CSS_SELECTOR, selector).is_displayed())


def _click(driver, selector: str) -> None:
    _retrying(lambda: driver.find_element(By.CSS_SELECTOR, selector).click())


def _wait_text(driver, selector: str, text: str, timeout: float = 15) -> None:
    WebDriverWait(driver, timeout).until(
        ec.text_to_be_present_in_element((By.CSS_SELECTOR, selector), text)
    )


DETAIL = "#session-detail"


def _field(driver, name: str) -> str:
    """A field of the selected session's detail pane."""
    return _retrying(lambda: driver.find_element(By.CSS_SELECTOR, f"{DETAIL} dd.{name}").text)


def _seqs(driver) -> list[int]:
    return [int(e.text) for e in driver.find_elements(By.CSS_SELECTOR, "#messages td.seq")]


def test_dashboard_counts_pages_and_resubmits(busd, browser):
    with ServiceBusClient.from_connection_string(busd.connection_string) as client:
        with client.get_queue_sender("dash-plain") as sender:
            sender.send_messages([ServiceBusMessage(f"plain {i}") for i in range(3)])
        with client.get_queue_receiver("dash-plain") as receiver:
            (first,) = receive(receiver, 1)
            receiver.dead_letter_message(first, reason="looked-at", error_description="test")
        with client.get_queue_sender("dash-sessions") as sender:
            sender.send_messages(
                [ServiceBusMessage(f"step {i}", session_id="order-7") for i in range(23)]
            )

    with ServiceBusAdministrationClient.from_connection_string(
        busd.admin_connection_string, connection_verify=busd.cert_path
    ) as admin:
        admin.create_topic("dash-topic")
        admin.create_subscription("dash-topic", "audit", requires_session=True)

    browser.get(busd.http_url + "/")
    WebDriverWait(browser, 15).until(ec.visibility_of_element_located((By.ID, "login-form")))
    browser.find_element(By.ID, "key").send_keys("not-the-key")
    browser.find_element(By.ID, "login-button").click()
    _wait_text(browser, "#status", "wrong key")
    browser.find_element(By.ID, "key").clear()
    browser.find_element(By.ID, "key").send_keys("SAS_KEY_VALUE")
    browser.find_element(By.ID, "login-button").click()

    plain = 'tr[data-queue="dash-plain"]'
    WebDriverWait(browser, 15).until(ec.presence_of_element_located((By.CSS_SELECTOR, plain)))
    browser.find_element(By.ID, "auto").click()  # no refresh under the test's feet
    assert _cell(browser, plain, "active") == "2"
    assert _cell(browser, plain, "dead-letter") == "1"
    assert _cell(browser, plain, "scheduled") == "0"
    assert _cell(browser, plain, "deferred") == "0"
    sessions = 'tr[data-queue="dash-sessions"]'
    assert _cell(browser, sessions, "active") == "23"
    assert _cell(browser, sessions, "sessions") == "1"
    subscription = 'tr[data-queue="dash-topic/subscriptions/audit"]'
    assert _cell(browser, subscription, "active") == "0"
    assert _cell(browser, subscription, "sessions") == "0"

    # a session's messages, ten at a time
    _click(browser, sessions)
    row = 'tr[data-session="order-7"]'
    WebDriverWait(browser, 15).until(ec.presence_of_element_located((By.CSS_SELECTOR, row)))
    assert _cell(browser, row, "message-count") == "23"
    assert _cell(browser, row, "locked") == "no"
    _click(browser, row)
    assert [_field(browser, c) for c in ("active", "in-flight", "deferred", "holder")] == [
        "23",
        "0",
        "0",
        "-",
    ]
    _click(browser, f"{DETAIL} button.peek-session")
    _wait_text(browser, "#page-info", "page 1, 10 message(s)")
    page1 = _seqs(browser)
    assert len(page1) == 10 and page1 == sorted(page1)
    bodies = _retrying(
        lambda: [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#messages td.body")]
    )
    assert bodies == [f"step {i}" for i in range(10)]
    browser.find_element(By.ID, "next-page").click()
    _wait_text(browser, "#page-info", "page 2, 10 message(s)")
    page2 = _seqs(browser)
    assert page2[0] > page1[-1] and len(page2) == 10
    browser.find_element(By.ID, "next-page").click()
    _wait_text(browser, "#page-info", "page 3, 3 message(s)")
    assert [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#messages td.body")] == [
        "step 20",
        "step 21",
        "step 22",
    ]
    assert not browser.find_element(By.ID, "next-page").is_enabled()

    # the dead letter, then back to the queue
    _click(browser, plain)
    browser.find_element(By.ID, "peek-dlq").click()
    _wait_text(browser, "#messages-title", "Dead letters of dash-plain")
    assert _cell(browser, "#messages tbody tr", "reason") == "looked-at"
    browser.find_element(By.ID, "resubmit").click()
    _wait_text(browser, "#status", "Resubmitted 1 dead letter(s)")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _cell(browser, plain, "active") != "3":
        time.sleep(0.2)
    assert _cell(browser, plain, "active") == "3"
    assert _cell(browser, plain, "dead-letter") == "0"

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "dashboard.png"
    assert browser.save_screenshot(str(shot))
    print(f"dashboard screenshot: {shot}")
    assert os.path.getsize(shot) > 10_000


def _sign_in(browser, busd) -> None:
    browser.get(busd.http_url + "/")
    WebDriverWait(browser, 15).until(ec.visibility_of_element_located((By.ID, "login-form")))
    browser.find_element(By.ID, "key").send_keys("SAS_KEY_VALUE")
    browser.find_element(By.ID, "login-button").click()
    WebDriverWait(browser, 15).until(
        ec.presence_of_element_located((By.CSS_SELECTOR, 'tr[data-queue="dash-plain"]'))
    )
    browser.find_element(By.ID, "auto").click()  # no refresh under the test's feet


def test_dashboard_shows_topics_their_rules_and_subjects(busd, browser):
    with ServiceBusAdministrationClient.from_connection_string(
        busd.admin_connection_string, connection_verify=busd.cert_path
    ) as admin:
        admin.create_topic("dash-empty")
        admin.create_topic("dash-routed")
        admin.create_subscription("dash-routed", "reds")
        admin.create_rule(
            "dash-routed",
            "reds",
            "red",
            filter=SqlRuleFilter("color = 'red'"),
            action=SqlRuleAction("SET seen = 1"),
        )
        admin.delete_rule("dash-routed", "reds", "$Default")
    with ServiceBusClient.from_connection_string(busd.connection_string) as client:
        with client.get_queue_sender("dash-subject") as sender:
            sender.send_messages(ServiceBusMessage("paid", subject="invoice"))

    _sign_in(browser, busd)
    empty = 'tr[data-topic="dash-empty"]'
    WebDriverWait(browser, 15).until(ec.presence_of_element_located((By.CSS_SELECTOR, empty)))
    assert [_cell(browser, empty, c) for c in ("subscription", "rule", "filter")] == ["-"] * 3
    red = 'tr[data-topic="dash-routed"][data-subscription="reds"][data-rule="red"]'
    assert [_cell(browser, red, c) for c in ("sessions", "filter", "action")] == [
        "no",
        "color = 'red'",
        "SET seen = 1",
    ]
    assert not browser.find_elements(
        By.CSS_SELECTOR, 'tr[data-rule="$Default"][data-topic="dash-routed"]'
    )

    _click(browser, 'tr[data-queue="dash-subject"]')
    browser.find_element(By.ID, "peek-queue").click()
    _wait_text(browser, "#page-info", "page 1, 1 message(s)")
    assert _cell(browser, "#messages tbody tr", "subject") == "invoice"


def test_dashboard_shows_the_faults_set_now(busd, browser):
    _sign_in(browser, busd)
    assert not _visible(browser, "#faults-box")  # none set: no table
    document = {"kind": "server-busy", "entity": "dash-empty-q", "operations": ["send"]}
    document["count"] = 2
    request = urllib.request.Request(
        busd.http_url + "/admin/faults",
        data=json.dumps(document).encode(),
        method="POST",
        headers={"Authorization": _token(busd), "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        made = json.loads(response.read())
    try:
        _click(browser, "#refresh")
        row = f'#faults tr[data-fault="{made["id"]}"]'
        WebDriverWait(browser, 15).until(ec.presence_of_element_located((By.CSS_SELECTOR, row)))
        assert _visible(browser, "#faults-box")
        cells = [_cell(browser, row, c) for c in ("kind", "entity", "operations", "count")]
        assert cells == ["server-busy", "dash-empty-q", "send", "2"]
        assert _cell(browser, row, "ends").endswith("Z")
    finally:
        removal = urllib.request.Request(
            busd.http_url + f"/admin/faults/{made['id']}",
            method="DELETE",
            headers={"Authorization": _token(busd)},
        )
        urllib.request.urlopen(removal, timeout=10).close()
    _click(browser, "#refresh")
    WebDriverWait(browser, 15).until(
        ec.invisibility_of_element_located((By.CSS_SELECTOR, "#faults-box"))
    )


def _token(busd) -> str:
    return generate_sas_token(
        busd.http_url.replace("http", "sb", 1) + "/",
        "RootManageSharedAccessKey",
        "SAS_KEY_VALUE",
        int(time.time()) + 600,
    )


def test_dashboard_dead_letters_a_session_and_resubmits_it_in_order(busd, browser):
    with ServiceBusClient.from_connection_string(busd.connection_string) as client:
        with client.get_queue_sender("dash-dead") as sender:
            sender.send_messages([ServiceBusMessage(f"d{i}", session_id="s-9") for i in range(3)])

    _sign_in(browser, busd)
    dead = 'tr[data-queue="dash-dead"]'
    _click(browser, dead)
    row = 'tr[data-session="s-9"]'
    WebDriverWait(browser, 15).until(ec.presence_of_element_located((By.CSS_SELECTOR, row)))
    _click(browser, row)
    _click(browser, f"{DETAIL} button.dead-letter-session")
    prompt = WebDriverWait(browser, 10).until(ec.alert_is_present())
    prompt.send_keys("Stuck")
    prompt.accept()
    _wait_text(browser, "#status", "Dead-lettered 3 message(s) of session s-9")
    assert _cell(browser, dead, "dead-letter") == "3"
    assert not browser.find_elements(By.CSS_SELECTOR, row)  # the session has nothing left
    assert not browser.find_element(By.ID, "session-detail").is_displayed()

    browser.find_element(By.ID, "peek-dlq").click()
    _wait_text(browser, "#page-info", "page 1, 3 message(s)")
    reasons = _retrying(
        lambda: [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#messages td.reason")]
    )
    assert reasons == ["Stuck"] * 3
    _click(browser, "#messages tbody tr button.resubmit-session")
    _wait_text(browser, "#status", "Resubmitted 3 message(s) of session s-9")
    with ServiceBusClient.from_connection_string(busd.connection_string) as client:
        with client.get_queue_receiver("dash-dead", session_id="s-9", max_wait_time=5) as receiver:
            assert [str(m) for m in receive(receiver, 3)] == ["d0", "d1", "d2"]


def test_dashboard_shows_who_holds_a_session_and_releases_its_lock(busd, browser):
    with ServiceBusClient.from_connection_string(busd.connection_string, retry_total=0) as client:
        with client.get_queue_sender("dash-held") as sender:
            sender.send_messages(
                [ServiceBusMessage(f"h{i}", session_id="held-1") for i in range(2)]
            )
        with client.get_queue_receiver(
            "dash-held", session_id="held-1", max_wait_time=5
        ) as receiver:
            (message,) = receive(receiver, 1)[:1]
            receiver.session.set_state(b"cursor=1")
            _sign_in(browser, busd)
            _click(browser, 'tr[data-queue="dash-held"]')
            row = 'tr[data-session="held-1"]'
            WebDriverWait(browser, 15).until(ec.presence_of_element_located((By.CSS_SELECTOR, row)))
            _click(browser, row)
            assert _field(browser, "holder").startswith("127.0.0.1:")
            # active as the queue table counts it: the one in flight included
            assert [_field(browser, c) for c in ("active", "in-flight", "state-preview")] == [
                "2",
                "1",
                "cursor=1",
            ]
            _click(browser, f"{DETAIL} button.release-session")
            _wait_text(browser, "#status", "Released the lock of session held-1.")
            _wait_text(browser, f"{row} td.locked", "no")
            # released: its release button goes, the others stay
            assert not _visible(browser, f"{DETAIL} button.release-session")
            with pytest.raises(SessionLockLostError):
                receiver.complete_message(message)
    _click(browser, f"{DETAIL} button.clear-state")
    WebDriverWait(browser, 10).until(ec.alert_is_present()).accept()
    _wait_text(browser, "#status", "Cleared the state of session held-1.")
    _wait_text(browser, 'tr[data-session="held-1"] td.state-size', "0")
    assert not _visible(browser, f"{DETAIL} button.clear-state")


# --- the sessions view at the widths of a laptop and of a small desktop ----------------------

# Where each part of the page lies, as the user sees it: the page's and the sessions table's
# widths against what shows, and every visible button of the session's detail.
_GEOMETRY = """
const table = document.querySelector('#sessions');
const box = table.closest('.list');
const buttons = [...document.querySelectorAll('#session-detail button')]
  .filter((b) => b.offsetParent !== null)
  .map((b) => { const r = b.getBoundingClientRect();
                return {name: b.className, left: r.left, right: r.right, top: r.top,
                        bottom: r.bottom}; });
return {page: document.documentElement.scrollWidth, viewport: window.innerWidth,
        viewportHeight: window.innerHeight,
        table: table.scrollWidth, box: box.clientWidth, buttons: buttons};
"""


@pytest.mark.parametrize("width", [1024, 1400])
def test_sessions_view_fits_the_window_with_its_actions_in_view(busd, tmp_path, width):
    long_id = "customer-" + "7" * 60  # a long session id wraps, it does not widen the table
    with ServiceBusClient.from_connection_string(busd.connection_string) as client:
        with client.get_queue_sender("dash-layout") as sender:
            for sid in ("a-1", "b-2", "c-3", long_id):
                sender.send_messages(
                    [ServiceBusMessage(f"{sid}/{i}", session_id=sid) for i in range(3)]
                )
        with client.get_queue_receiver("dash-layout", session_id="b-2", max_wait_time=5) as held:
            receive(held, 1)
            held.session.set_state(b"step=2 of a long and winding checkout flow " * 3)
            browser = _chromium(tmp_path / "profile", width)
            try:
                _sign_in(browser, busd)
                _click(browser, 'tr[data-queue="dash-layout"]')
                row = 'tr[data-session="b-2"]'
                WebDriverWait(browser, 15).until(
                    ec.presence_of_element_located((By.CSS_SELECTOR, row))
                )
                _click(browser, row)
                WebDriverWait(browser, 10).until(
                    ec.visibility_of_element_located((By.ID, "session-detail"))
                )
                browser.execute_script("window.scrollTo(0, 0)")
                assert browser.save_screenshot(f"/tmp/busd-dashboard-{width}-top.png")
                browser.execute_script(
                    "document.querySelector('#session-detail').scrollIntoView({block: 'nearest'})"
                )
                geometry = browser.execute_script(_GEOMETRY)
                shot = Path(f"/tmp/busd-dashboard-{width}.png")
                assert browser.save_screenshot(str(shot))
                print(f"screenshot at {width} px: {shot}", geometry)
                # the session's messages below: the page still does not scroll sideways
                _click(browser, f"{DETAIL} button.peek-session")
                _wait_text(browser, "#page-info", "page 1, ")
                browser.execute_script("document.querySelector('#messages-box').scrollIntoView()")
                assert browser.save_screenshot(f"/tmp/busd-dashboard-{width}-messages.png")
                peeked = browser.execute_script(
                    "return [document.documentElement.scrollWidth, window.innerWidth,"
                    " document.querySelector('#messages').scrollWidth,"
                    " document.querySelector('#messages').parentElement.clientWidth]"
                )
            finally:
                browser.quit()
    assert geometry["page"] <= geometry["viewport"], geometry  # no horizontal scrolling
    assert peeked[0] <= peeked[1] and peeked[2] <= peeked[3], peeked
    assert geometry["table"] <= geometry["box"], geometry  # the table fits its box
    names = sorted(b["name"] for b in geometry["buttons"])
    # held, with messages and a state: every action applies
    assert names == sorted(
        ["peek-session", "release-session", "clear-state danger", "dead-letter-session danger"]
    )
    for b in geometry["buttons"]:
        assert 0 <= b["left"] and b["right"] <= geometry["viewport"], b
        assert 0 <= b["top"] and b["bottom"] <= geometry["viewportHeight"], b


def test_actions_show_only_where_they_apply(busd, browser):
    with ServiceBusClient.from_connection_string(busd.connection_string) as client:
        with client.get_queue_sender("dash-layout") as sender:
            sender.send_messages(ServiceBusMessage("only", session_id="free-1"))
        with client.get_queue_receiver(
            "dash-layout", session_id="state-only", max_wait_time=1
        ) as r:
            r.session.set_state(b"kept")  # a session with a state and no message
    _sign_in(browser, busd)

    # an empty queue: nothing to peek, purge or resubmit
    _click(browser, 'tr[data-queue="dash-empty-q"]')
    _wait_text(browser, "#queue-name", "dash-empty-q")
    shown = [
        b.get_attribute("id")
        for b in browser.find_elements(By.CSS_SELECTOR, "#queue .toolbar button")
        if b.is_displayed()
    ]
    assert shown == []
    assert _visible(browser, "#queue-empty")

    _click(browser, 'tr[data-queue="dash-layout"]')
    _wait_text(browser, "#queue-name", "dash-layout")
    assert _visible(browser, "#peek-queue") and _visible(browser, "#purge")
    assert not _visible(browser, "#peek-dlq") and not _visible(browser, "#resubmit")

    def actions(session: str) -> list[str]:
        row = f'tr[data-session="{session}"]'
        WebDriverWait(browser, 15).until(ec.presence_of_element_located((By.CSS_SELECTOR, row)))
        _click(browser, row)
        WebDriverWait(browser, 10).until(
            lambda d: (
                d.find_element(By.ID, "session-detail").get_attribute("data-session") == session
            )
        )
        return [
            b.get_attribute("class").split()[0]
            for b in browser.find_elements(By.CSS_SELECTOR, f"{DETAIL} button")
            if b.is_displayed()
        ]

    # free, with a message: no lock to release, no state to clear
    assert actions("free-1") == ["peek-session", "dead-letter-session"]
    # a state and nothing else: only the state can go
    assert actions("state-only") == ["clear-state"]


def test_dashboard_counts_equal_the_management_apis(busd, browser):
    """ "Active" is ActiveMessageCount (available plus locked), and the size is SizeInBytes,
    whichever client reads them."""
    body = "x" * 1000
    with ServiceBusClient.from_connection_string(busd.connection_string) as client:
        with client.get_queue_sender("dash-counted") as sender:
            sender.send_messages([ServiceBusMessage(body) for _ in range(5)])
        with client.get_queue_receiver("dash-counted", max_wait_time=5) as receiver:
            locked = receive(receiver, 2)  # held, unsettled: still active to Service Bus
            assert len(locked) == 2
            with ServiceBusAdministrationClient.from_connection_string(
                busd.admin_connection_string, connection_verify=busd.cert_path
            ) as admin:
                runtime = admin.get_queue_runtime_properties("dash-counted")
            _sign_in(browser, busd)
            row = 'tr[data-queue="dash-counted"]'
            active = _cell(browser, row, "active")
            locked_cell = _cell(browser, row, "locked")
            size_title = _retrying(
                lambda: browser.find_element(By.CSS_SELECTOR, f"{row} td.size").get_attribute(
                    "title"
                )
            )
    assert runtime.active_message_count == 5
    assert (active, locked_cell) == ("5", "2")
    # every stored message's bytes: the body and its AMQP sections (a few hundred bytes)
    assert 5 * 1000 < runtime.size_in_bytes < 5 * 1400, runtime.size_in_bytes
    assert size_title == f"{runtime.size_in_bytes} bytes"


def _points(driver, selector: str, series: str) -> list[tuple[float, float]]:
    """The (x, y) points of one series of an SVG chart."""
    points = _retrying(
        lambda: driver.find_element(
            By.CSS_SELECTOR, f'{selector} polyline[data-series="{series}"]'
        ).get_attribute("points")
    )
    return [tuple(map(float, p.split(","))) for p in (points or "").split()]


def _refresh_until(driver, row: str, column: str, text: str) -> None:
    """Refresh by hand (one more sample) and wait for the table to show it."""
    _click(driver, "#refresh")
    _wait_text(driver, f"{row} td.{column}", text)
    WebDriverWait(driver, 15).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, f"{row} td.rates svg polyline")
    )


def test_rates_and_depths_are_charted_per_entity(busd, browser):
    """Each refresh samples what GET /admin/queues answers (the store's totals sent and
    received, the counts): after sends, receives and dead-letters between refreshes, the
    entity's sparklines and the selected entity's charts go up and down."""
    row = 'tr[data-queue="dash-rates"]'
    _sign_in(browser, busd)  # the first sample: nothing yet
    with ServiceBusClient.from_connection_string(busd.connection_string) as client:
        with client.get_queue_sender("dash-rates") as sender:
            sender.send_messages([ServiceBusMessage(f"rate {i}") for i in range(30)])
        _refresh_until(browser, row, "active", "30")
        with client.get_queue_receiver("dash-rates", max_wait_time=5) as receiver:
            taken = receive(receiver, 15)
            assert len(taken) == 15
            for message in taken[:10]:
                receiver.complete_message(message)
            for message in taken[10:]:
                receiver.dead_letter_message(message, reason="charted")
        _refresh_until(browser, row, "active", "15")
        _refresh_until(browser, row, "dead-letter", "5")
    _click(browser, row + " td.name")
    WebDriverWait(browser, 15).until(
        lambda d: len(d.find_elements(By.CSS_SELECTOR, "#entity-charts svg")) == 2
    )

    for cell, series in (("td.rates", ("in", "out")), ("td.depth", ("active", "dead"))):
        for name in series:
            ys = {y for _, y in _points(browser, f"{row} {cell}", name)}
            assert len(ys) > 1, (cell, name, ys)  # not flat: it moved with the traffic
    charts = browser.find_elements(By.CSS_SELECTOR, "#entity-charts svg")
    for chart, series in zip(charts, (("in", "out"), ("active", "dead"))):
        for name in series:
            ys = {float(p.split(",")[1]) for p in _polyline(chart, name).split()}
            assert len(ys) > 1, (name, ys)
    legend = browser.find_element(By.CSS_SELECTOR, "#entity-charts").text
    assert "active 15" in legend and "dead-letter 5" in legend, legend
    # an entity without traffic draws flat lines at 0
    idle = {y for _, y in _points(browser, 'tr[data-queue="dash-empty-q"] td.rates', "in")}
    assert len(idle) <= 1
    shot = Path("/tmp/busd-dashboard-rates.png")
    assert browser.save_screenshot(str(shot))
    print(f"rates screenshot: {shot}")


def _polyline(chart, series: str) -> str:
    return chart.find_element(By.CSS_SELECTOR, f'polyline[data-series="{series}"]').get_attribute(
        "points"
    )


def _http(busd, method: str, path: str, headers: dict | None = None, body: bytes | None = None):
    request = urllib.request.Request(busd.http_url + path, body, headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_sign_in_hints_at_the_default_key_and_the_page_renews_its_token(busd, browser):
    assert _http(busd, "GET", "/dashboard/sign-in") == (
        200,
        {"key_name": "RootManageSharedAccessKey", "default_key": True},
    )
    browser.get(busd.http_url + "/")
    WebDriverWait(browser, 15).until(ec.visibility_of_element_located((By.ID, "key-hint")))
    assert "SAS_KEY_VALUE" in browser.find_element(By.ID, "key-hint").text
    _sign_in(browser, busd)

    # a token an hour old: the page trades it for a fresh one, as its timer would
    audience = f"sb://127.0.0.1:{busd.http_port}/"
    ending = int(time.time()) + 60
    short = generate_sas_token(audience, "RootManageSharedAccessKey", "SAS_KEY_VALUE", ending)
    browser.execute_script("sessionStorage.setItem('busd-token', arguments[0])", short)
    renewed = browser.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "window.busdRenewIfDue().then(done, (e) => done('failed: ' + e));"
    )
    assert renewed is True
    fresh = browser.execute_script("return sessionStorage.getItem('busd-token')")
    parsed = parse_sas_token(fresh)
    assert parsed.expiry >= int(time.time()) + 3500
    assert (parsed.audience, parsed.key_name) == (audience, "RootManageSharedAccessKey")
    assert _http(busd, "GET", "/admin/queues", {"Authorization": fresh})[0] == 200


def test_renewal_refuses_what_it_cannot_vouch_for(busd):
    audience = f"sb://127.0.0.1:{busd.http_port}/"
    key = ("RootManageSharedAccessKey", "SAS_KEY_VALUE")
    past = generate_sas_token(audience, *key, int(time.time()) - 5)
    forged = generate_sas_token(audience, key[0], "not-the-key", int(time.time()) + 60)
    for token in (past, forged, "", "Bearer x"):
        status, answer = _http(busd, "POST", "/dashboard/renew", {"Authorization": token})
        assert status == 401 and answer["error"].startswith("cannot renew this token"), answer
    # a token for one queue stays one for that queue
    narrow = generate_sas_token(audience + "dash-plain", *key, int(time.time()) + 60)
    status, answer = _http(busd, "POST", "/dashboard/renew", {"Authorization": narrow})
    assert status == 200
    assert parse_sas_token(answer["token"]).audience == audience + "dash-plain"
    assert _http(busd, "GET", "/admin/queues", {"Authorization": answer["token"]})[0] == 401
    assert _http(busd, "GET", "/dashboard/renew")[0] == 405


def test_no_hint_when_the_broker_has_its_own_key(busd_factory):
    own = busd_factory(
        [queue("dash-own")],
        extra_env={"BUSD_SAS_KEY": "RootManageSharedAccessKey=a-key-of-our-own"},
    )
    assert _http(own, "GET", "/dashboard/sign-in") == (
        200,
        {"key_name": "RootManageSharedAccessKey", "default_key": False},
    )
