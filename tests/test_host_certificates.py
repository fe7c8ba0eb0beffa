"""busd.net.host_certificates: a certificate for each namespace host a TLS client names, issued off
the event loop, kept in a bounded cache, at a bounded rate; every other name gets busd's own.
Real TLS handshakes over TCP against busd's port listener (busd.net.ports) in this process."""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from busd.net import host_certificates, ports, tls
from busd.net.host_certificates import HostIssuer, server_name
from tests.test_tls import verifies

pytestmark = pytest.mark.timeout(120)


class Pong(asyncio.Protocol):
    """Another client's request: answered at once, by the event loop."""

    def __init__(self, *_peer: object) -> None:  # an HTTP connection's factory gets its peer
        super().__init__()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(b"pong")  # type: ignore[attr-defined]
        self.transport.close()


@asynccontextmanager
async def listening(material: tls.Tls) -> AsyncIterator[int]:
    port = ports.listen(
        "127.0.0.1",
        0,
        ports.Services(lambda _pending: Pong(), lambda _address: Pong(), material.context),
        "test",
    )
    try:
        yield port.port
    finally:
        await port.close()


def handshake(port: int, ca: Path, host: str, *, check: bool = True) -> x509.Certificate:
    """A TLS handshake naming `host`, trusting `ca` alone; the certificate presented."""
    context = ssl.create_default_context(cafile=str(ca))
    if not check:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname=host) as s:
            der = s.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def dns_names(certificate: x509.Certificate) -> list[str]:
    san = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return san.get_values_for_type(x509.DNSName)


def ping(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET / HTTP/1.1\r\n\r\n")
        return s.recv(4)


def issuer_of(material: tls.Tls) -> HostIssuer:
    issuer = material.context.sni_callback
    assert isinstance(issuer, HostIssuer)
    return issuer


def test_a_burst_of_new_host_names_is_issued_off_the_event_loop(tmp_path, monkeypatch):
    """The first host's key generation is held until another client has been answered: the
    SNI callback, which runs on the event loop inside each handshake, must not be where issuing
    happens, or that client would wait behind it (and the hold would run out). No clock is
    read: the order of events proves it, however busy the machine."""
    count, hold_s = 12, 30.0
    issuing_threads: list[int] = []
    issued_inside_callback: list[bool] = []
    released: list[bool] = []  # per issue: the other client was answered before the hold ran out
    issuing, answered = threading.Event(), threading.Event()
    inside = threading.local()
    real_issue, real_callback = HostIssuer._context_for, HostIssuer.__call__

    def held_issue(self, host):
        issuing_threads.append(threading.get_ident())
        issued_inside_callback.append(getattr(inside, "callback", False))
        issuing.set()
        released.append(answered.wait(hold_s))
        return real_issue(self, host)

    def marked_callback(self, *args):
        inside.callback = True
        try:
            return real_callback(self, *args)
        finally:
            inside.callback = False

    # each handshake waits for its certificate as long as the hold may last, not 2 s: the
    # twelve are issued one after another, however slowly the machine goes
    monkeypatch.setattr(host_certificates, "ISSUE_WAIT_S", 2 * hold_s)
    monkeypatch.setattr(HostIssuer, "_context_for", held_issue)
    monkeypatch.setattr(HostIssuer, "__call__", marked_callback)
    material = tls.load(None, None, tmp_path)
    names = [f"burst-{i}.localhost" for i in range(count)]

    async def main() -> None:
        loop, loop_thread = asyncio.get_running_loop(), threading.get_ident()
        # a thread for each client: the loop's default pool has fewer, and a held handshake
        # would keep the other client waiting for one
        with ThreadPoolExecutor(count + 2) as clients:
            async with listening(material) as port:
                burst = [
                    loop.run_in_executor(clients, handshake, port, material.cert_path, name)
                    for name in names
                ]
                burst_done = asyncio.gather(*burst)
                # the burst is being issued; then another client, meanwhile
                assert await loop.run_in_executor(clients, issuing.wait, hold_s)
                answer = await loop.run_in_executor(clients, ping, port)
                answered.set()
                presented = await burst_done
        assert answer == b"pong"
        assert released == [True] * count  # answered while the first host was still held
        assert [dns_names(c) for c in presented] == [[n] for n in names]  # each its own
        assert len(issuing_threads) == count and loop_thread not in issuing_threads
        assert not any(issued_inside_callback)  # the callback only looked them up

    asyncio.run(main())
    assert len(issuer_of(material)) == count


def test_a_namespace_hosts_certificate_verifies_against_busds_authority(tmp_path):
    material = tls.load(None, None, tmp_path)

    async def main() -> list[x509.Certificate]:
        async with listening(material) as port:
            return [
                await asyncio.to_thread(handshake, port, material.cert_path, host)
                for host in ("team-a.localhost", "TEAM-A.localhost", "localhost")
            ]

    team_a, again, own = asyncio.run(main())
    assert dns_names(team_a) == ["team-a.localhost"] and again == team_a  # issued once
    assert dns_names(own) == ["localhost"]
    for certificate, name in ((team_a, "team-a.localhost"), (own, "localhost")):
        pem = certificate.public_bytes(serialization.Encoding.PEM)
        assert verifies(material.cert_path, pem, name)
    assert issuer_of(material).issued == 1


@pytest.mark.parametrize(
    "name",
    [
        "login.microsoftonline.com",
        "a.b.localhost",  # two labels: not a namespace host
        "localhost.example.com",
        "-x.localhost",
        "team-a.localhost.example.com",
    ],
)
def test_other_names_get_busds_own_certificate_and_nothing_is_issued(tmp_path, name):
    material = tls.load(None, None, tmp_path)

    async def main() -> x509.Certificate:
        async with listening(material) as port:
            with pytest.raises(ssl.SSLCertVerificationError):
                await asyncio.to_thread(handshake, port, material.cert_path, name)
            return await asyncio.to_thread(handshake, port, material.cert_path, name, check=False)

    assert dns_names(asyncio.run(main())) == ["localhost"]
    assert len(issuer_of(material)) == 0 and issuer_of(material).issued == 0


def test_the_cache_keeps_the_most_recently_used_hosts(tmp_path, monkeypatch):
    monkeypatch.setattr(host_certificates, "MAX_HOSTS", 4)
    material = tls.load(None, None, tmp_path)
    issuer = issuer_of(material)

    async def main() -> None:
        async with listening(material) as port:
            for name in ("a", "b", "c", "d", "a", "e", "f"):  # `a` used again before e and f
                host = f"{name}.localhost"
                presented = await asyncio.to_thread(handshake, port, material.cert_path, host)
                assert dns_names(presented) == [host]

    asyncio.run(main())
    assert len(issuer) == 4
    assert {h for h in "abcdef" if issuer.cached(f"{h}.localhost")} == {"a", "d", "e", "f"}
    assert issuer.issued == 6


def test_new_hosts_past_the_rate_get_busds_own_certificate(tmp_path, monkeypatch):
    monkeypatch.setattr(host_certificates, "ISSUE_BURST", 3)
    monkeypatch.setattr(host_certificates, "ISSUE_RATE_PER_S", 0.001)
    material = tls.load(None, None, tmp_path)
    issuer = issuer_of(material)

    async def main() -> list[list[str]]:
        async with listening(material) as port:
            presented = [
                await asyncio.to_thread(
                    handshake, port, material.cert_path, f"r{i}.localhost", check=False
                )
                for i in range(6)
            ]
            # a host issued before the rate ran out is still served its own
            again = await asyncio.to_thread(handshake, port, material.cert_path, "r0.localhost")
            return [dns_names(c) for c in [*presented, again]]

    names = asyncio.run(main())
    assert names == [["r0.localhost"], ["r1.localhost"], ["r2.localhost"]] + [["localhost"]] * 3 + [
        ["r0.localhost"]
    ]
    assert issuer.issued == 3 and len(issuer) == 3 and issuer.refused >= 3


async def _namespaces_named_ns(name: str) -> bool:
    """What the server's namespaces answer (busd.broker.namespaces.Namespaces.known): here,
    the namespaces whose names begin with `ns`."""
    return name.startswith("ns")


def test_unknown_names_do_not_evict_known_namespaces_hosts(tmp_path, monkeypatch):
    monkeypatch.setattr(host_certificates, "MAX_HOSTS", 4)
    material = tls.load(None, None, tmp_path)
    issuer = issuer_of(material)
    issuer.known = _namespaces_named_ns
    known = [f"ns{i}.localhost" for i in range(3)]

    async def main() -> list[list[str]]:
        async with listening(material) as port:
            for host in known:
                await asyncio.to_thread(handshake, port, material.cert_path, host)
            for i in range(12):  # a client naming one made-up host after another
                await asyncio.to_thread(handshake, port, material.cert_path, f"x{i}.localhost")
            return [
                dns_names(await asyncio.to_thread(handshake, port, material.cert_path, host))
                for host in known
            ]

    assert asyncio.run(main()) == [[host] for host in known]
    assert all(issuer.kept_known(host) for host in known)
    assert {h for h in (f"x{i}.localhost" for i in range(12)) if issuer.cached(h)} == {
        f"x{i}.localhost" for i in range(8, 12)
    }
    assert issuer.issued == 15  # each once: the known ones were never issued again


def test_unknown_names_do_not_spend_the_issuing_known_hosts_need(tmp_path, monkeypatch):
    monkeypatch.setattr(host_certificates, "ISSUE_BURST", 3)
    monkeypatch.setattr(host_certificates, "ISSUE_RATE_PER_S", 0.001)
    material = tls.load(None, None, tmp_path)
    issuer = issuer_of(material)
    issuer.known = _namespaces_named_ns

    async def main() -> list[list[str]]:
        async with listening(material) as port:
            for i in range(6):  # the rate of other names spent
                await asyncio.to_thread(
                    handshake, port, material.cert_path, f"x{i}.localhost", check=False
                )
            return [
                dns_names(await asyncio.to_thread(handshake, port, material.cert_path, host))
                for host in ("ns-a.localhost", "ns-b.localhost")
            ]

    assert asyncio.run(main()) == [["ns-a.localhost"], ["ns-b.localhost"]]
    assert issuer.refused >= 3


def test_a_host_kept_before_its_namespace_was_known_is_kept_apart_once_it_is(tmp_path, monkeypatch):
    monkeypatch.setattr(host_certificates, "MAX_HOSTS", 2)
    material = tls.load(None, None, tmp_path)
    issuer = issuer_of(material)
    made: set[str] = set()

    async def known(name: str) -> bool:
        return name in made

    issuer.known = known

    async def main() -> None:
        async with listening(material) as port:
            await asyncio.to_thread(handshake, port, material.cert_path, "team.localhost")
            assert issuer.cached("team.localhost") and not issuer.kept_known("team.localhost")
            made.add("team")  # a Manage key made it
            await asyncio.to_thread(handshake, port, material.cert_path, "team.localhost")
            for i in range(4):
                await asyncio.to_thread(handshake, port, material.cert_path, f"x{i}.localhost")

    asyncio.run(main())
    assert issuer.kept_known("team.localhost") and issuer.issued == 5


def client_hello(host: str | None) -> bytes:
    """The first flight of a real TLS client naming `host` (SNI)."""
    context = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls_object = context.wrap_bio(incoming, outgoing, server_hostname=host)
    with pytest.raises(ssl.SSLWantReadError):
        tls_object.do_handshake()
    return outgoing.read()


def test_the_host_name_read_from_a_client_hello():
    hello = client_hello("team-a.localhost")
    assert server_name(hello) == "team-a.localhost"
    assert server_name(client_hello(None)) is None
    # whatever arrives cut short or corrupted is no name, never an exception
    for end in range(len(hello)):
        assert server_name(hello[:end]) in (None, "team-a.localhost")
    for at in range(0, len(hello), 7):
        damaged = bytearray(hello)
        damaged[at] ^= 0xFF
        server_name(bytes(damaged))
    assert server_name(b"") is None and server_name(b"\x16\x03\x01") is None


def test_a_client_hello_that_arrives_in_pieces(tmp_path):
    """The ClientHello is peeked until it is whole, so the new host's certificate is ready
    for the handshake that names it."""
    material = tls.load(None, None, tmp_path)

    def split_handshake(port: int) -> list[str]:
        context = ssl.create_default_context(cafile=str(material.cert_path))
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls_object = context.wrap_bio(incoming, outgoing, server_hostname="pieces.localhost")
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while True:
                try:
                    tls_object.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    flight = outgoing.read()
                    if flight.startswith(b"\x16") and flight[5] == 1:  # the ClientHello
                        raw.sendall(flight[:60])
                        time.sleep(0.3)
                        raw.sendall(flight[60:])
                    elif flight:
                        raw.sendall(flight)
                    incoming.write(raw.recv(65536))
            certificate = tls_object.getpeercert()
        return [v for k, v in certificate["subjectAltName"] if k == "DNS"]

    async def main() -> list[str]:
        async with listening(material) as port:
            return await asyncio.to_thread(split_handshake, port)

    assert asyncio.run(main()) == ["pieces.localhost"]
