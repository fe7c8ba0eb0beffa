"""The server certificate busd's TLS listeners present (AMQP over TLS, WebSockets over TLS, HTTPS).

`--tls-cert/--tls-key` name the user's own PEM files. Without them busd makes a self-signed
certificate for localhost, 127.0.0.1 and ::1 at first start and keeps it in the data directory,
so a client told to trust it once keeps trusting it across restarts. It is its own issuer
(CA:TRUE, as `openssl req -x509` makes them), so the one file serves both as the CA bundle
clients are given (`connection_verify=`, NODE_EXTRA_CA_CERTS, a .NET trust store) and as the
server's certificate.
"""

from __future__ import annotations

import datetime
import fcntl
import ipaddress
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

from busd.config import ConfigError

CERT_FILE = "busd-cert.pem"
KEY_FILE = "busd-key.pem"
VALID_DAYS = 825  # the longest validity Apple platforms accept for a server certificate
RENEW_BEFORE_DAYS = 30  # a kept certificate closer than this to its end is made anew
HOST_NAMES = ("localhost",)
HOST_ADDRESSES = ("127.0.0.1", "::1")


@dataclass(frozen=True)
class Tls:
    context: ssl.SSLContext  # server side, for every TLS listener
    cert_path: Path  # what clients trust (the self-signed certificate, or the user's)
    generated: bool  # True: busd made it (and may make it again)


def load(tls_cert: str | None, tls_key: str | None, data_dir: str | os.PathLike) -> Tls:
    """The user's certificate and key, or busd's own from `data_dir` (made when absent, expired
    or about to expire). Raises ConfigError with the reason when a file cannot be used."""
    if tls_cert or tls_key:
        if not (tls_cert and tls_key):
            raise ConfigError("--tls-cert and --tls-key go together: give both or neither")
        cert, key = Path(tls_cert), Path(tls_key)
        return Tls(_context(cert, key), cert, generated=False)
    directory = Path(data_dir)
    cert, key = directory / CERT_FILE, directory / KEY_FILE
    directory.mkdir(parents=True, exist_ok=True)
    # Two processes starting on one data directory at once must not each write half a pair.
    with open(directory / ".busd-tls.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _usable(cert, key):
            _generate(cert, key)
    from busd.host_certificates import HostIssuer

    context = _context(cert, key)
    # a namespace's host (`<name>.localhost`) gets a certificate of its own, signed by this one
    context.sni_callback = HostIssuer(cert, key)
    return Tls(context, cert, generated=True)


def _context(cert: Path, key: Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2  # what Service Bus itself requires
    try:
        context.load_cert_chain(cert, key)
    except FileNotFoundError as e:
        raise ConfigError(f"TLS certificate or key {e.filename} does not exist") from e
    except (ssl.SSLError, OSError) as e:
        raise ConfigError(
            f"cannot use TLS certificate {cert} with key {key}: {getattr(e, 'reason', None) or e}"
        ) from e
    return context


def _usable(cert: Path, key: Path) -> bool:
    """Both files there, the certificate readable and valid for RENEW_BEFORE_DAYS more."""
    from cryptography import x509

    if not (cert.is_file() and key.is_file()):
        return False
    try:
        certificate = x509.load_pem_x509_certificate(cert.read_bytes())
    except ValueError:
        return False
    left = certificate.not_valid_after_utc - datetime.datetime.now(datetime.UTC)
    return left > datetime.timedelta(days=RENEW_BEFORE_DAYS)


def _generate(cert: Path, key: Path) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    # RSA rather than EC: every TLS stack the SDKs run on (SChannel, Secure Transport,
    # OpenSSL, BoringSSL) accepts it.
    private_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "busd"),
            x509.NameAttribute(NameOID.COMMON_NAME, "busd localhost"),
        ]
    )
    now = datetime.datetime.now(datetime.UTC)
    public = private_key.public_key()
    alt_names: list[x509.GeneralName] = [x509.DNSName(n) for n in HOST_NAMES]
    alt_names += [x509.IPAddress(ipaddress.ip_address(a)) for a in HOST_ADDRESSES]
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))  # tolerate a little clock skew
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_encipherment=True,
                key_cert_sign=True,
                content_commitment=False,
                data_encipherment=False,
                key_agreement=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(public), critical=False)
        .sign(private_key, hashes.SHA256())
    )
    key_pem = private_key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    # Written beside and renamed: a crash leaves the old file or the new, never half of one.
    _write(key, key_pem, 0o600)
    _write(cert, certificate.public_bytes(serialization.Encoding.PEM), 0o644)


def _write(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
