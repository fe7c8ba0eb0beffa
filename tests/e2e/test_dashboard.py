"""The web dashboard in a real headless Chromium (Debian's `chromium` and `chromium-driver`,
driven by Selenium): it signs in with a key, shows a queue's counts after SDK sends, pages
through a session's messages, resubmits a dead letter, and dead-letters a session and resubmits
it. A screenshot of each run is kept
under test-artifacts/ (the path is printed)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import SessionLockLostError
from azure.servicebus.management import (
    ServiceBusAdministrationClient,
    SqlRuleAction,
    SqlRuleFilter,
)

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
        ]
    )


@pytest.fixture
def browser(tmp_path):
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
        f"--user-data-dir={tmp_path / 'profile'}",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
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


def _click(driver, selector: str) -> None:
    _retrying(lambda: driver.find_element(By.CSS_SELECTOR, selector).click())


def _wait_text(driver, selector: str, text: str, timeout: float = 15) -> None:
    WebDriverWait(driver, timeout).until(
        ec.text_to_be_present_in_element((By.CSS_SELECTOR, selector), text)
    )


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
    assert [_cell(browser, row, c) for c in ("active", "in-flight", "deferred", "holder")] == [
        "23",
        "0",
        "0",
        "-",
    ]
    _click(browser, f"{row} button.peek-session")
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


def test_dashboard_dead_letters_a_session_and_resubmits_it_in_order(busd, browser):
    with ServiceBusClient.from_connection_string(busd.connection_string) as client:
        with client.get_queue_sender("dash-dead") as sender:
            sender.send_messages([ServiceBusMessage(f"d{i}", session_id="s-9") for i in range(3)])

    _sign_in(browser, busd)
    dead = 'tr[data-queue="dash-dead"]'
    _click(browser, dead)
    row = 'tr[data-session="s-9"]'
    WebDriverWait(browser, 15).until(ec.presence_of_element_located((By.CSS_SELECTOR, row)))
    _click(browser, f"{row} button.dead-letter-session")
    prompt = WebDriverWait(browser, 10).until(ec.alert_is_present())
    prompt.send_keys("Stuck")
    prompt.accept()
    _wait_text(browser, "#status", "Dead-lettered 3 message(s) of session s-9")
    assert _cell(browser, dead, "dead-letter") == "3"
    assert not browser.find_elements(By.CSS_SELECTOR, row)  # the session has nothing left

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
            assert _cell(browser, row, "holder").startswith("127.0.0.1:")
            assert [_cell(browser, row, c) for c in ("active", "in-flight", "state-preview")] == [
                "1",
                "1",
                "cursor=1",
            ]
            _click(browser, f"{row} button.release-session")
            _wait_text(browser, "#status", "Released the lock of session held-1.")
            _wait_text(browser, f"{row} td.locked", "no")
            with pytest.raises(SessionLockLostError):
                receiver.complete_message(message)
    _click(browser, 'tr[data-session="held-1"] button.clear-state')
    WebDriverWait(browser, 10).until(ec.alert_is_present()).accept()
    _wait_text(browser, "#status", "Cleared the state of session held-1.")
    _wait_text(browser, 'tr[data-session="held-1"] td.state-size', "0")
