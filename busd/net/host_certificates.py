"""Certificates for namespace hosts, issued off the event loop (docs/design.md §2.16, §3.2).

A client names a namespace by connecting to `<name>.localhost`; the administration clients
then speak HTTPS and check that the certificate names that host. A wildcard `*.localhost`
would not do (TLS stacks refuse a wildcard over a single label), and namespaces are made on
first use, so no certificate made in advance can name them all. busd's certificate authority
(busd/net/tls.py), which clients trust already and which may sign names under `localhost` only,
signs one for exactly the host a client asks for (TLS SNI), once per host and process, and the
handshake presents it instead of busd's own. A user's own certificate (`--tls-cert`) is
presented as it is.

Issuing costs a key pair and a signature (milliseconds of CPU), and any client may name any
host before it authenticates, so:

- before the handshake, `prepare` reads the host from the ClientHello still waiting in the
  socket and has a new host's certificate issued in the issuer's own thread, the event loop
  serving everyone else meanwhile; the SNI callback, which runs on the loop inside the
  handshake, only looks the host up;
- at most MAX_HOSTS are kept (the least recently used dropped), and new hosts are issued at
  ISSUE_RATE_PER_S per process with bursts of ISSUE_BURST. A host refused by the rate, and any
  name that is not `<label>.localhost`, gets busd's own certificate (localhost and the
  loopback addresses), which a client that asked for another name refuses;
- the hosts of namespaces that exist (`known`: made by a Manage key, busd.broker.namespaces)
  are kept apart: in a cache of their own (MAX_KNOWN_HOSTS, never evicted by other names)
  and issued at a rate of their own, so that a client naming one made-up host after another
  before it authenticates neither drops their certificates nor spends the issuing they need.
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import logging
import os
import re
import socket
import ssl
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

log = logging.getLogger("busd.net.tls")

# One DNS label under localhost: what names a namespace's host.
HOST = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.localhost")
VALID_DAYS = 30  # issued anew by each process that serves the host
MAX_HOSTS = 256  # contexts kept per process (about 26 KB each); past that the least recent goes
ISSUE_RATE_PER_S = 20.0  # new hosts issued per second and process, once the burst is spent
ISSUE_BURST = 64
# Known namespaces' hosts: as many as a busd serves namespaces several times over, each kept
# until MAX_KNOWN_HOSTS others are (namespaces are made by Manage keys only).
MAX_KNOWN_HOSTS = 1024
HELLO_WAIT_S = 2.0  # for the rest of a ClientHello that arrives in pieces
ISSUE_WAIT_S = 2.0  # for a certificate being issued; then the handshake goes on without it
RECORD_HEADER = 5  # a TLS record: type, version (2), length (2)
MAX_RECORD = 1 << 14  # the largest plaintext record (RFC 8446 §5.1)
HANDSHAKE, CLIENT_HELLO, SERVER_NAME, HOST_NAME = 0x16, 1, 0, 0


def host_of(server_name: str | None) -> str | None:
    """The namespace host a TLS server name asks for, or None (busd's own certificate)."""
    if not server_name:
        return None
    host = server_name.lower().rstrip(".")
    return host if HOST.fullmatch(host) else None


class _Cache:
    """Issued contexts, the least recently used dropped past `size()`, and the issuing rate
    of new ones (a token bucket)."""

    def __init__(self, size: Callable[[], int]) -> None:
        self.size = size  # read when one is added: the module's constants, as tests set them
        self.contexts: OrderedDict[str, ssl.SSLContext] = OrderedDict()
        self.tokens = float(ISSUE_BURST)
        self.refilled = time.monotonic()

    def get(self, host: str) -> ssl.SSLContext | None:
        context = self.contexts.get(host)
        if context is not None:
            self.contexts.move_to_end(host)
        return context

    def put(self, host: str, context: ssl.SSLContext) -> None:
        self.contexts[host] = context
        self.contexts.move_to_end(host)
        while len(self.contexts) > self.size():
            self.contexts.popitem(last=False)

    def take_token(self) -> bool:
        now = time.monotonic()
        self.tokens = min(ISSUE_BURST, self.tokens + (now - self.refilled) * ISSUE_RATE_PER_S)
        self.refilled = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


class HostIssuer:
    """The SNI callback of busd's TLS context: a context for each namespace host asked for,
    issued ahead of the handshake (`prepare`) and kept in bounded caches: one for the hosts
    of known namespaces, one for every other."""

    def __init__(self, ca_cert: Path, ca_key: Path) -> None:
        self._issuer_pem = ca_cert.read_bytes()
        self._issuer = x509.load_pem_x509_certificate(self._issuer_pem)
        self._key = serialization.load_pem_private_key(ca_key.read_bytes(), None)
        # the SNI callback runs in whichever thread does the handshake; issuing, in its own
        self._lock = threading.Lock()
        self._known = _Cache(lambda: MAX_KNOWN_HOSTS)
        self._others = _Cache(lambda: MAX_HOSTS)
        self._issuing: dict[str, Future[ssl.SSLContext]] = {}
        self._executor: ThreadPoolExecutor | None = None  # made at the first host, after a fork
        # Whether a namespace exists (busd.broker.namespaces.Namespaces.known), set once the
        # server has its namespaces; None: every host is another.
        self.known: Callable[[str], Awaitable[bool]] | None = None
        self.issued = 0
        self.refused = 0  # new hosts the rate turned away

    def __call__(self, connection: Any, server_name: str | None, _: ssl.SSLContext) -> None:
        host = host_of(server_name)
        if host is None:
            return  # busd's own certificate (localhost and the loopback addresses)
        context = self.cached(host)
        if context is None:
            # Not prepared (its ClientHello came in pieces too slowly, or the rate refused
            # it): this handshake goes on with busd's own certificate, the next may find it.
            self.issue(host)
            return
        connection.context = context

    def cached(self, host: str) -> ssl.SSLContext | None:
        with self._lock:
            return self._known.get(host) or self._others.get(host)

    def kept_known(self, host: str) -> bool:
        """Whether `host` is kept as a known namespace's."""
        with self._lock:
            return self._known.get(host) is not None

    async def is_known(self, host: str) -> bool:
        """Whether `host` is a namespace's that exists (False when that cannot be told now)."""
        if self.known is None:
            return False
        try:
            return await self.known(host.partition(".")[0])
        except Exception as exc:  # the store, most likely: the host is served as another
            log.debug("whether %s is a namespace's is unknown: %s", host, exc)
            return False

    def __len__(self) -> int:
        with self._lock:
            return len(self._known.contexts) + len(self._others.contexts)

    def issue(self, host: str, known: bool = False) -> Future[ssl.SSLContext] | None:
        """The context of `host`, being issued in the issuer's thread (already done when kept,
        shared when under way); None when the rate refuses a new host now. `known`: the host
        of a namespace that exists, kept and rated apart from every other."""
        cache = self._known if known else self._others
        with self._lock:
            context = self._known.get(host) or self._others.get(host)
            if context is not None:
                if known and host not in self._known.contexts:
                    self._others.contexts.pop(host, None)  # its namespace is known now
                    self._known.put(host, context)
                done: Future[ssl.SSLContext] = Future()
                done.set_result(context)
                return done
            pending = self._issuing.get(host)
            if pending is not None:
                return pending
            if not cache.take_token():
                self.refused += 1
                return None
            if self._executor is None:
                self._executor = ThreadPoolExecutor(1, thread_name_prefix="busd-host-certificates")
            future = self._executor.submit(self._context_for, host)
            self._issuing[host] = future
        future.add_done_callback(functools.partial(self._issued, host, cache))
        return future

    def _issued(self, host: str, cache: _Cache, future: Future[ssl.SSLContext]) -> None:
        with self._lock:
            self._issuing.pop(host, None)
            if future.cancelled():
                return
            error = future.exception()
            if error is None:
                cache.put(host, future.result())
                self.issued += 1
        if error is not None:
            log.warning("no certificate for %s: %s", host, error)

    def _context_for(self, host: str) -> ssl.SSLContext:
        # An EC key: made in a fraction of the time an RSA one takes.
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        certificate = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
            .issuer_name(self._issuer.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(
                    self._issuer.public_key()  # type: ignore[arg-type]
                ),
                critical=False,
            )
            .sign(self._key, hashes.SHA256())  # type: ignore[arg-type]
        )
        chain = certificate.public_bytes(serialization.Encoding.PEM) + self._issuer_pem
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        # ssl loads a chain only from files: written, loaded, and gone at once
        with tempfile.TemporaryDirectory(prefix="busd-host-") as directory:
            cert_path, key_path = Path(directory, "cert.pem"), Path(directory, "key.pem")
            cert_path.write_bytes(chain)
            fd = os.open(key_path, os.O_WRONLY | os.O_CREAT, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(key_pem)
            context.load_cert_chain(cert_path, key_path)
        return context


async def prepare(conn: socket.socket, context: ssl.SSLContext) -> None:
    """Before busd's TLS handshake on `conn`: the certificate of the namespace host its
    ClientHello names, issued off the event loop when new, so that the SNI callback finds it.
    Reads nothing: the ClientHello stays in the socket for the handshake."""
    issuer = context.sni_callback
    if not isinstance(issuer, HostIssuer):
        return  # the user's own certificate
    try:
        host = host_of(server_name(await _client_hello(conn)))
        if host is None or issuer.kept_known(host):
            return
        known = await issuer.is_known(host)
        if not known and issuer.cached(host) is not None:
            return
        future = issuer.issue(host, known=known)  # (a known one kept among the others moves)
        if future is not None:
            # asyncio.wait, not wait_for: a timeout must not cancel an issue others may await
            await asyncio.wait([asyncio.wrap_future(future)], timeout=ISSUE_WAIT_S)
    except asyncio.CancelledError:
        conn.close()  # the listener is closing: nobody will take this socket on
        raise


async def _client_hello(conn: socket.socket) -> bytes:
    """The first TLS record waiting in `conn` (a ClientHello), peeked; what has come of it
    within HELLO_WAIT_S when it comes in pieces."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + HELLO_WAIT_S
    pause = 0.001
    while True:
        try:
            data = conn.recv(RECORD_HEADER + MAX_RECORD, socket.MSG_PEEK)
        except BlockingIOError:
            data = None  # nothing yet
        except OSError:
            return b""
        if data is not None:
            if not data:
                return b""  # closed
            if len(data) >= RECORD_HEADER + int.from_bytes(data[3:5], "big"):
                return data
        if loop.time() >= deadline:
            return data or b""
        # the bytes stay in the socket, so it stays readable: wait by time, not for it
        await asyncio.sleep(pause)
        pause = min(pause * 2, 0.05)


def server_name(record: bytes) -> str | None:
    """The host name a TLS ClientHello record asks for (RFC 6066 §3), or None: no SNI, or not
    a ClientHello busd can read (the handshake then tells the client so)."""
    try:
        if record[0] != HANDSHAKE or record[RECORD_HEADER] != CLIENT_HELLO:
            return None
        end = min(len(record), RECORD_HEADER + 4 + int.from_bytes(record[6:9], "big"))
        at = RECORD_HEADER + 4 + 2 + 32  # handshake header, legacy_version, random
        at += 1 + record[at]  # legacy_session_id
        at += 2 + int.from_bytes(record[at : at + 2], "big")  # cipher_suites
        at += 1 + record[at]  # legacy_compression_methods
        extensions_end = min(end, at + 2 + int.from_bytes(record[at : at + 2], "big"))
        at += 2
        while at + 4 <= extensions_end:
            kind = int.from_bytes(record[at : at + 2], "big")
            size = int.from_bytes(record[at + 2 : at + 4], "big")
            at += 4
            if kind == SERVER_NAME:
                # server_name_list: its length (2), then name_type (1), length (2), name
                body = record[at : min(at + size, extensions_end)]
                length = int.from_bytes(body[3:5], "big")
                name = body[5 : 5 + length]
                if len(body) < 5 or body[2] != HOST_NAME or len(name) != length:
                    return None
                return name.decode("ascii")
            at += size
    except (IndexError, UnicodeDecodeError):
        return None
    return None
