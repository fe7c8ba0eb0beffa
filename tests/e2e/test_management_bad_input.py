"""Bad requests to the management API: clear HTTP errors with the service's <Error> body, and
nothing changed (docs/management.md §3.1, §3.2)."""

from __future__ import annotations

import http.client
import ssl
import time
import xml.etree.ElementTree as ET

import pytest

from busd.auth.sas import generate_sas_token
from tests.e2e.conftest import queue

pytestmark = pytest.mark.timeout(60)

ATOM = "http://www.w3.org/2005/Atom"
SB = "http://schemas.microsoft.com/netservices/2010/10/servicebus/connect"


@pytest.fixture(scope="module")
def busd(busd_factory):
    return busd_factory([queue("bad-q", MaxDeliveryCount=4)])


def _token(busd, audience: str | None = None, key: str = "SAS_KEY_VALUE") -> str:
    audience = audience or f"https://localhost:{busd.http_port}"
    return generate_sas_token(audience, "RootManageSharedAccessKey", key, int(time.time()) + 600)


def call(
    busd,
    method: str,
    path: str,
    body: bytes | None = None,
    token: str | None = None,
    headers: dict | None = None,
) -> tuple[int, bytes]:
    context = ssl.create_default_context(cafile=busd.cert_path)
    conn = http.client.HTTPSConnection("localhost", busd.http_port, context=context, timeout=10)
    sep = "&" if "?" in path else "?"
    conn.request(
        method,
        f"{path}{sep}api-version=2021-05",
        body=body,
        headers={"Authorization": token or _token(busd), **(headers or {})},
    )
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, data


def entry(inner: str, description: str = "QueueDescription") -> bytes:
    return (
        f'<entry xmlns="{ATOM}"><content type="application/xml">'
        f'<{description} xmlns="{SB}">{inner}</{description}></content></entry>'
    ).encode()


def detail(data: bytes) -> str:
    root = ET.fromstring(data)
    assert root.tag == "Error" and root.findtext("Code")
    return root.findtext("Detail") or ""


def max_delivery_count(busd, name: str = "bad-q") -> str | None:
    status, data = call(busd, "GET", f"/{name}")
    assert status == 200
    found = ET.fromstring(data).find(f".//{{{SB}}}MaxDeliveryCount")
    return found.text if found is not None else None


def assert_absent(busd, name: str) -> None:
    status, data = call(busd, "GET", f"/{name}")
    assert status == 200 and b"Publicly Listed Services" in data


@pytest.mark.parametrize(
    "body, words",
    [
        (b"<entry><content>", "not well-formed"),
        (b"not xml at all", "not well-formed"),
        (b'<!DOCTYPE e [<!ENTITY x "xxxxxxxx">]><entry>&x;</entry>', "refused"),
        (b"", "no body"),
        (entry("", "WidgetDescription"), "QueueDescription or a TopicDescription"),
        (entry("<LockDuration>P10D</LockDuration>"), "LockDuration"),
        (entry("<MaxDeliveryCount>-1</MaxDeliveryCount>"), "MaxDeliveryCount"),
        (entry("<MaxDeliveryCount>many</MaxDeliveryCount>"), "MaxDeliveryCount"),
        (
            entry("<DefaultMessageTimeToLive>soon</DefaultMessageTimeToLive>"),
            "DefaultMessageTimeTo",
        ),
        (entry("<RequiresSession>perhaps</RequiresSession>"), "RequiresSession"),
        (entry("<MaxMessageSizeInKilobytes>0</MaxMessageSizeInKilobytes>"), "MaxMessageSize"),
    ],
)
def test_bad_bodies_are_400_and_create_nothing(busd, body, words):
    status, data = call(busd, "PUT", "/bad-new", body)
    assert status == 400, data
    assert words in detail(data)
    assert_absent(busd, "bad-new")
    status, data = call(busd, "PUT", "/bad-q", body, headers={"If-Match": "*"})
    assert status == 400 and max_delivery_count(busd) == "4"


def test_bad_names_are_400(busd):
    for name in ("bad%20name", "a%2F%2Fb", "x" * 300):
        status, data = call(busd, "PUT", f"/{name}", entry(""))
        assert status == 400, (name, data)


def test_tokens_that_do_not_fit_are_401_and_change_nothing(busd):
    body = entry("<MaxDeliveryCount>9</MaxDeliveryCount>")
    for token in (
        _token(busd, f"https://localhost:{busd.http_port}/another-queue"),
        _token(busd, key="WRONG"),
        "SharedAccessSignature sr=x&sig=y&se=1&skn=RootManageSharedAccessKey",
        "Bearer nope",
    ):
        status, data = call(busd, "PUT", "/bad-q", body, token=token, headers={"If-Match": "*"})
        assert status == 401, data
        assert "Unauthorized" in detail(data)
        assert call(busd, "DELETE", "/bad-q", token=token)[0] == 401
    assert max_delivery_count(busd) == "4"
    # a token for the entity itself (the .NET SDK's audience) is fine
    own = _token(busd, f"https://localhost:{busd.http_port}/bad-q")
    assert call(busd, "GET", "/bad-q", token=own)[0] == 200


def test_wrong_methods_and_routes(busd):
    assert call(busd, "POST", "/bad-q")[0] == 405
    assert call(busd, "DELETE", "/$namespaceinfo")[0] == 405
    status, data = call(busd, "GET", "/nosuch-topic/Subscriptions")
    assert status == 404 and detail(data)
    status, data = call(busd, "GET", "/nosuch-topic/Subscriptions/s/Rules/r")
    assert status == 404


def test_unknown_elements_are_ignored_as_the_service_does(busd):
    status, data = call(
        busd,
        "PUT",
        "/bad-unknown",
        entry(
            "<FancyNewThing>1</FancyNewThing><MaxDeliveryCount>3"
            "</MaxDeliveryCount><MessageCount>99</MessageCount>"
        ),
    )
    assert status == 201, data
    assert max_delivery_count(busd, "bad-unknown") == "3"
    assert call(busd, "DELETE", "/bad-unknown")[0] == 200
