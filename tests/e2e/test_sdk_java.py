"""The official Java SDK (`azure-messaging-servicebus`, its version pinned by `azure-sdk-bom` in
tests/sdk_java/pom.xml) against busd: one `mvn test` (one JVM, JUnit 5) runs every scenario of
tests/sdk_java against the broker this module starts, given its connection strings and ports as
system properties, and trusting busd's authority through a trust store made with keytool. Each
test here checks one JUnit class's outcome from Surefire's reports.

Maven keeps what it downloads in ~/.m2: the first run fetches the SDK, later runs are offline."""

from __future__ import annotations

import re
import shutil
import subprocess
import textwrap
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from tests.e2e.conftest import queue

pytestmark = pytest.mark.timeout(900)

PROJECT = Path(__file__).parents[1] / "sdk_java"
SOURCES = PROJECT / "src" / "test" / "java" / "busd" / "sdk"
QUICKSTART = Path(__file__).parents[2] / "docs" / "quickstart.md"
MAVEN_REPO = Path.home() / ".m2" / "repository"
# present once a full run has downloaded everything (the SDK, JUnit, Surefire's JUnit provider)
DOWNLOADED = [
    "com/azure/azure-messaging-servicebus",
    "org/apache/maven/surefire/surefire-junit-platform",
]
MVN_TIMEOUT_S = 600

if not (shutil.which("java") and shutil.which("mvn") and shutil.which("keytool")):
    pytest.skip("needs java 17, mvn and keytool (.ci/run installs them)", allow_module_level=True)

JAVA_CLASSES = sorted(p.stem for p in SOURCES.glob("*Test.java"))

SESSION = {"RequiresSession": True, "LockDuration": "PT30S"}
QUEUES = [
    queue("session-queue", **SESSION),  # the quick start's
    queue("java-sessions", **SESSION),
    queue("java-next", **SESSION),
    queue("java-requests", **SESSION),
    queue("java-replies", **SESSION),
    queue("java-processor", **SESSION, MaxDeliveryCount=100),
    queue("java-txn-in", **SESSION),
    queue("java-txn-out"),
    queue("java-ws"),
]


@pytest.fixture(scope="module")
def java_run(busd_factory, tmp_path_factory):
    # faults on demand on (docs/faults.md): the lost session lock is one
    busd = busd_factory(QUEUES, extra_env={"BUSD_FAULTS": "1"})
    work = tmp_path_factory.mktemp("sdk-java")
    truststore = work / "busd-truststore.p12"
    subprocess.run(
        [
            "keytool",
            "-importcert",
            "-noprompt",
            "-alias",
            "busd",
            "-file",
            busd.cert_path,
            "-keystore",
            str(truststore),
            "-storetype",
            "PKCS12",
            "-storepass",
            "changeit",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    tls = busd.connection_string.replace(f":{busd.port};", f":{busd.tls_port};").replace(
        "UseDevelopmentEmulator=true;", ""
    )
    offline = all((MAVEN_REPO / path).is_dir() for path in DOWNLOADED)
    reports = PROJECT / "target" / "surefire-reports"
    shutil.rmtree(reports, ignore_errors=True)
    command = [
        "mvn",
        "-B",
        "-q",
        "-Dstyle.color=never",
        *(["-o"] if offline else []),
        "test",
        f"-Dbusd.connectionString={busd.connection_string}",
        f"-Dbusd.tlsConnectionString={tls}",
        f"-Dbusd.httpPort={busd.http_port}",
        f"-Dbusd.wsPort={busd.ws_port}",
        # the test JVM's alone: Maven's own must still trust its repository's certificate
        f"-DargLine=-Djavax.net.ssl.trustStore={truststore}"
        " -Djavax.net.ssl.trustStorePassword=changeit",
        "-Dmaven.test.failure.ignore=true",
    ]
    started = time.monotonic()
    done = subprocess.run(
        command, cwd=PROJECT, capture_output=True, text=True, timeout=MVN_TIMEOUT_S
    )
    out = done.stdout + done.stderr
    if done.returncode != 0 and ("offline mode" in out or "Could not transfer" in out):
        # something the cache lacks (a dependency changed), or a download that failed: once
        # more, downloading
        if offline:
            command.remove("-o")
            offline = False
        done = subprocess.run(
            command, cwd=PROJECT, capture_output=True, text=True, timeout=MVN_TIMEOUT_S
        )
    print(f"mvn test: {time.monotonic() - started:.1f} s ({'offline' if offline else 'online'})")
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-20000:]
    return reports, output, busd


def outcomes(reports: Path, java_class: str) -> dict[str, str]:
    """Each test method of one JUnit class: "passed", or why it failed or was skipped."""
    report = reports / f"TEST-busd.sdk.{java_class}.xml"
    assert report.is_file(), f"no Surefire report for {java_class}"
    results = {}
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        verdict = "passed"
        for kind in ("failure", "error", "skipped"):
            found = case.find(kind)
            if found is not None:
                verdict = f"{kind}: {found.get('message')}\n{(found.text or '')[:3000]}"
        results[case.get("name")] = verdict
    return results


@pytest.mark.parametrize("java_class", JAVA_CLASSES)
def test_java_sdk(java_run, java_class):
    reports, output, busd = java_run
    results = outcomes(reports, java_class)
    assert results, f"{java_class} ran no test"
    # a scenario disabled in the JUnit class says why there, and is reported as skipped
    failed = {n: v for n, v in results.items() if not v.startswith(("passed", "skipped"))}
    assert not failed, "\n\n".join(f"{name}: {verdict}" for name, verdict in failed.items())


def test_quickstart_java_is_the_one_tested():
    """docs/quickstart.md's Java example, from its retry comment to its end, is what
    QuickstartTest runs between its markers."""
    doc = QUICKSTART.read_text()
    blocks = re.findall(r"```java\n(.*?)```", doc, re.S)
    example = next(b for b in blocks if "acceptNextSession" in b)
    wanted = example[example.index("// setMaxRetries(0)") :].strip()
    source = (SOURCES / "QuickstartTest.java").read_text()
    tested = source[source.index("// quickstart:begin\n") + 20 : source.index("// quickstart:end")]
    assert textwrap.dedent(tested).strip() == wanted
