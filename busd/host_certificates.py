"""Certificates for namespace hosts, issued during the TLS handshake (docs/design.md §2.16).

A client names a namespace by connecting to `<name>.localhost`; the administration clients
then speak HTTPS and check that the certificate names that host. A wildcard `*.localhost`
would not do (TLS stacks refuse a wildcard over a single label), and namespaces are made on
first use, so no certificate made in advance can name them all. busd's own certificate is its
own issuer (CA:TRUE, busd/tls.py), and clients already trust it: when a client asks for a
`<name>.localhost` host (TLS SNI), busd signs a certificate for exactly that host with it,
once per host and process, and presents it instead. A user's own certificate (`--tls-cert`)
is presented as it is.
"""

from __future__ import annotations

import datetime
import os
import re
import ssl
import tempfile
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# One DNS label under localhost: what names a namespace's host.
HOST = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.localhost")
VALID_DAYS = 30  # issued anew by each process that serves the host
MAX_HOSTS = 1024  # contexts kept per process; past that the oldest is dropped


class HostIssuer:
    """The SNI callback of busd's TLS context: a context for each namespace host asked for."""

    def __init__(self, cert: Path, key: Path) -> None:
        self._issuer = x509.load_pem_x509_certificate(cert.read_bytes())
        self._issuer_pem = cert.read_bytes()
        self._key = serialization.load_pem_private_key(key.read_bytes(), None)
        self._contexts: dict[str, ssl.SSLContext] = {}

    def __call__(self, connection: Any, server_name: str | None, _: ssl.SSLContext) -> None:
        if not server_name:
            return
        host = server_name.lower().rstrip(".")
        if not HOST.fullmatch(host):
            return  # busd's own certificate (localhost and the loopback addresses)
        context = self._contexts.get(host)
        if context is None:
            if len(self._contexts) >= MAX_HOSTS:
                del self._contexts[next(iter(self._contexts))]
            context = self._contexts[host] = self._context_for(host)
        connection.context = context

    def _context_for(self, host: str) -> ssl.SSLContext:
        # An EC key: made in a millisecond, inside the handshake that asked for it.
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
