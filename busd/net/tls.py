"""The server certificate busd's TLS listeners present (AMQP over TLS, WebSockets over TLS, HTTPS).

`--tls-cert/--tls-key` name the user's own PEM files. Without them busd keeps, in the data
directory, a certificate authority of its own and a server certificate it signed
(docs/design.md §3.2), made at first start, so a client told to trust the authority once
keeps trusting it across restarts and renewals of the server certificate:

    busd-ca.pem       the authority: what clients trust (`connection_verify=`,
                      NODE_EXTRA_CA_CERTS, a system trust store)
    busd-ca-key.pem   its key; it also signs the certificates of namespace hosts
                      (busd/net/host_certificates.py)
    busd-cert.pem     the server certificate (localhost, 127.0.0.1, ::1), then the authority
    busd-key.pem      the server certificate's key

The authority may sign only local names: its X.509 name constraints (critical) permit the DNS
name `localhost` and every name under it, 127.0.0.1, ::1, the address or name busd is bound
to (`--host`) when that is neither a loopback nor a wildcard, and each `--hostname`; as
e-mail and URI names, only the reserved name `invalid` (RFC 2606), so that no certificate
naming a mailbox or a URI verifies. Its extended key usage is server authentication alone
(verifiers carry an issuer's extended key usage down the chain), its path length 0 and its
key usage certificate and CRL signing. So trusting it system-wide, as .NET needs, trusts
nothing but busd's TLS servers on this machine: a certificate it signed for any other name,
or for a client, e-mail or code signing, fails verification. An authority without all of
that (what busd made before: a self-signed certificate that was its own issuer, then one
constrained by DNS and IP names alone, without extended key usage) is made anew at start,
with one line in the log.
"""

from __future__ import annotations

import datetime
import fcntl
import ipaddress
import logging
import os
import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from busd.errors import ConfigError
from busd.net.host_certificates import HostIssuer

log = logging.getLogger("busd.net.tls")

CA_FILE = "busd-ca.pem"
CA_KEY_FILE = "busd-ca-key.pem"
CERT_FILE = "busd-cert.pem"
KEY_FILE = "busd-key.pem"
CA_VALID_DAYS = 3650  # clients trust it once; the server certificate is renewed under it
VALID_DAYS = 825  # the longest validity Apple platforms accept for a server certificate
RENEW_BEFORE_DAYS = 30  # a kept certificate closer than this to its end is made anew
HOST_NAMES = ("localhost",)  # a DNS constraint permits the name and every name under it
HOST_ADDRESSES = ("127.0.0.1", "::1")
WILDCARD_HOSTS = ("", "0.0.0.0", "::")
# Permitting e-mail and URI names under a reserved name only forbids every other one (RFC
# 5280 §4.2.1.10: a type of name with no permitted subtree would be unconstrained).
NO_NAME = "invalid"

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class Tls:
    context: ssl.SSLContext  # server side, for every TLS listener
    cert_path: Path  # what clients trust (busd's authority, or the user's certificate)
    generated: bool  # True: busd made it (and may make it again)


@dataclass(frozen=True)
class Names:
    """The names busd's certificates are for, and all its authority may sign."""

    dns: tuple[str, ...]
    addresses: tuple[Address, ...]

    @classmethod
    def serving(cls, hosts: Iterable[str] = ()) -> Names:
        """localhost and the loopback addresses, with `hosts` (bound or configured host names
        and addresses; wildcards and loopback names add nothing)."""
        dns = list(HOST_NAMES)
        addresses: list[Address] = [ipaddress.ip_address(a) for a in HOST_ADDRESSES]
        for host in hosts:
            host = host.strip().strip("[]").lower().rstrip(".").partition("%")[0]  # no zone
            if host in WILDCARD_HOSTS:
                continue
            try:
                address = ipaddress.ip_address(host)
            except ValueError:
                if host.isascii() and not _within(host, dns):
                    dns.append(host)
            else:
                if address not in addresses:
                    addresses.append(address)
        return cls(tuple(dns), tuple(addresses))

    def alt_names(self) -> list[x509.GeneralName]:
        names: list[x509.GeneralName] = [x509.DNSName(n) for n in self.dns]
        return names + [x509.IPAddress(a) for a in self.addresses]

    def constraints(self) -> x509.NameConstraints:
        subtrees: list[x509.GeneralName] = [x509.DNSName(n) for n in self.dns]
        subtrees += [x509.IPAddress(ipaddress.ip_network(a)) for a in self.addresses]
        subtrees += [x509.RFC822Name(NO_NAME), x509.UniformResourceIdentifier(NO_NAME)]
        return x509.NameConstraints(permitted_subtrees=subtrees, excluded_subtrees=None)


SERVER_ONLY = x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH])


def load(
    tls_cert: str | None,
    tls_key: str | None,
    data_dir: str | os.PathLike,
    hosts: Iterable[str] = (),
) -> Tls:
    """The user's certificate and key, or busd's own from `data_dir` (made when absent, expired
    or about to expire, or not for every name of `hosts`, see Names.serving). Raises
    ConfigError with the reason when a file cannot be used."""
    if tls_cert or tls_key:
        if not (tls_cert and tls_key):
            raise ConfigError("--tls-cert and --tls-key go together: give both or neither")
        cert, key = Path(tls_cert), Path(tls_key)
        return Tls(_context(cert, key), cert, generated=False)
    names = Names.serving(hosts)
    directory = Path(data_dir)
    ca, ca_key = directory / CA_FILE, directory / CA_KEY_FILE
    cert, key = directory / CERT_FILE, directory / KEY_FILE
    directory.mkdir(parents=True, exist_ok=True)
    # Two processes starting on one data directory at once must not each write half a pair.
    with open(directory / ".busd-tls.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        authority = _usable_authority(ca, ca_key, names)
        if isinstance(authority, str):
            if not ca.exists() and _own_issuer(cert):
                authority = f"{CERT_FILE} was its own issuer, with no name constraints"
            if ca.exists() or cert.exists():
                log.warning(
                    "TLS: made a new certificate authority, %s (%s): clients must trust it "
                    "anew, and may drop the one they trusted before",
                    ca,
                    authority,
                )
            authority = _generate_authority(ca, ca_key, names)
        if not _usable_leaf(cert, key, authority, names):
            _generate_leaf(cert, key, authority, ca_key, names)
    context = _context(cert, key)
    # a namespace's host (`<name>.localhost`) gets a certificate of its own, signed by the
    # authority (busd/net/host_certificates.py)
    context.sni_callback = HostIssuer(ca, ca_key)
    return Tls(context, ca, generated=True)


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


def _within(name: str, domains: Iterable[str]) -> bool:
    """Whether a DNS constraint on one of `domains` permits `name` (RFC 5280 §4.2.1.10: the
    domain itself and every name under it)."""
    return any(name == d or name.endswith("." + d) for d in domains)


def _read(cert: Path, key: Path) -> tuple[x509.Certificate, str | None]:
    """The certificate in `cert`, and why the pair cannot be used (None: it can)."""
    certificate = x509.load_pem_x509_certificate(cert.read_bytes())
    private = serialization.load_pem_private_key(key.read_bytes(), None)
    if private.public_key() != certificate.public_key():
        return certificate, "its key is not the certificate's"
    left = certificate.not_valid_after_utc - datetime.datetime.now(datetime.UTC)
    if left <= datetime.timedelta(days=RENEW_BEFORE_DAYS):
        return certificate, f"it expires within {RENEW_BEFORE_DAYS} days"
    return certificate, None


def _own_issuer(cert: Path) -> bool:
    """Whether `cert` is self-signed: the server certificate an earlier busd made, its own
    authority and free to sign any name."""
    try:
        certificate = x509.load_pem_x509_certificate(cert.read_bytes())
    except (OSError, ValueError):
        return False
    return certificate.issuer == certificate.subject


def _usable_authority(ca: Path, ca_key: Path, names: Names) -> x509.Certificate | str:
    """The stored authority, or why it must be made anew."""
    if not (ca.is_file() and ca_key.is_file()):
        return "there was none"  # the first start, or the authority deleted to rotate it
    try:
        certificate, unusable = _read(ca, ca_key)
    except (ValueError, TypeError):
        return "it was unreadable"
    if unusable:
        return unusable
    try:
        constraints = certificate.extensions.get_extension_for_class(x509.NameConstraints)
    except x509.ExtensionNotFound:
        return "it had no name constraints"
    permitted = constraints.value.permitted_subtrees or []
    domains = [n.value for n in permitted if isinstance(n, x509.DNSName)]
    networks = [
        n.value
        for n in permitted
        if isinstance(n, x509.IPAddress)
        and isinstance(n.value, ipaddress.IPv4Network | ipaddress.IPv6Network)
    ]
    if not constraints.critical or constraints.value.excluded_subtrees:
        return "its name constraints were not busd's"
    others = {
        n for n in permitted if isinstance(n, x509.RFC822Name | x509.UniformResourceIdentifier)
    }
    if others != {x509.RFC822Name(NO_NAME), x509.UniformResourceIdentifier(NO_NAME)}:
        return "its name constraints left e-mail and URI names free"
    try:
        usage = certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return "it had no extended key usage: it could sign certificates for any use"
    if usage != SERVER_ONLY:
        return "its extended key usage was not server authentication alone"
    for name in names.dns:
        if not _within(name, domains):
            return f"it may not sign {name}"
    for address in names.addresses:
        if not any(address in network for network in networks):
            return f"it may not sign {address}"
    return certificate


def _usable_leaf(cert: Path, key: Path, authority: x509.Certificate, names: Names) -> bool:
    """The server certificate there, signed by `authority`, for every name, not near its end."""
    if not (cert.is_file() and key.is_file()):
        return False
    try:
        certificate, unusable = _read(cert, key)
        certificate.verify_directly_issued_by(authority)
        san = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, TypeError, x509.ExtensionNotFound, InvalidSignature):
        return False
    has = set(san.get_values_for_type(x509.DNSName)) | set(san.get_values_for_type(x509.IPAddress))
    return unusable is None and has >= set(names.dns) | set(names.addresses)


def _new_key() -> rsa.RSAPrivateKey:
    # RSA rather than EC: every TLS stack the SDKs run on (SChannel, Secure Transport,
    # OpenSSL, BoringSSL) accepts it.
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _validity(builder: x509.CertificateBuilder, days: int) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        builder.serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))  # tolerate a little clock skew
        .not_valid_after(now + datetime.timedelta(days=days))
    )


def _key_usage(*, sign: bool = False, cert_sign: bool = False) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=sign,
        key_encipherment=sign,
        key_cert_sign=cert_sign,
        content_commitment=False,
        data_encipherment=False,
        key_agreement=False,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _generate_authority(ca: Path, ca_key: Path, names: Names) -> x509.Certificate:
    private_key = _new_key()
    public = private_key.public_key()
    made = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M")
    # the date tells this authority from an earlier one in a trust store
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "busd"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"busd local CA {made}"),
        ]
    )
    certificate = (
        _validity(x509.CertificateBuilder(), CA_VALID_DAYS)
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(names.constraints(), critical=True)
        .add_extension(SERVER_ONLY, critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(private_key, hashes.SHA256())
    )
    _write(ca_key, _pem_key(private_key), 0o600)
    _write(ca, certificate.public_bytes(serialization.Encoding.PEM), 0o644)
    return certificate


def _generate_leaf(
    cert: Path, key: Path, authority: x509.Certificate, ca_key: Path, names: Names
) -> None:
    signer = serialization.load_pem_private_key(ca_key.read_bytes(), None)
    private_key = _new_key()
    public = private_key.public_key()
    certificate = (
        _validity(x509.CertificateBuilder(), VALID_DAYS)
        .subject_name(
            x509.Name(
                [
                    x509.NameAttribute(NameOID.ORGANIZATION_NAME, "busd"),
                    x509.NameAttribute(NameOID.COMMON_NAME, names.dns[0]),
                ]
            )
        )
        .issuer_name(authority.subject)
        .public_key(public)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(sign=True), critical=True)
        .add_extension(SERVER_ONLY, critical=False)
        .add_extension(x509.SubjectAlternativeName(names.alt_names()), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(
                authority.public_key()  # type: ignore[arg-type]
            ),
            critical=False,
        )
        .sign(signer, hashes.SHA256())  # type: ignore[arg-type]
    )
    chain = certificate.public_bytes(serialization.Encoding.PEM)
    chain += authority.public_bytes(serialization.Encoding.PEM)
    _write(key, _pem_key(private_key), 0o600)
    _write(cert, chain, 0o644)


def _pem_key(private_key: rsa.RSAPrivateKey) -> bytes:
    return private_key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes, mode: int) -> None:
    # Written beside and renamed: a crash leaves the old file or the new, never half of one.
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
