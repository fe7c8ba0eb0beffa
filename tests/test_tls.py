"""busd.net.tls: busd's own certificate authority, constrained to local names, and the server
certificate it signs, kept across restarts; the user's own certificate."""

from __future__ import annotations

import datetime
import ipaddress
import logging
import shutil
import socket
import ssl
import subprocess
import threading
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from cryptography.x509.verification import (
    DNSName,
    IPAddress,
    PolicyBuilder,
    Store,
    VerificationError,
)

from busd.config.settings import ConfigError
from busd.net import tls

LOCAL_NAMES = ["localhost", "team-a.localhost", "127.0.0.1", "::1"]
# what a certificate authority trusted system-wide must not be able to vouch for
FOREIGN_NAMES = ["login.microsoftonline.com", "example.com", "10.1.2.3", "192.168.1.10", "::2"]


def _serve_once(context: ssl.SSLContext) -> tuple[int, threading.Thread]:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def accept() -> None:
        with listener:
            conn, _ = listener.accept()
            try:
                with context.wrap_socket(conn, server_side=True) as s:
                    s.sendall(b"ok")
            except (ssl.SSLError, OSError):
                pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    return port, thread


def _handshake(material: tls.Tls, server_hostname: str) -> bytes:
    port, thread = _serve_once(material.context)
    client = ssl.create_default_context(cafile=str(material.cert_path))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with client.wrap_socket(raw, server_hostname=server_hostname) as s:
            data = s.recv(2)
    thread.join(5)
    return data


def _subject(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _signed_with_busds_key(data_dir: Path, name: str) -> bytes:
    """A well-formed server certificate for `name`, signed with the key of busd's authority:
    what anyone who copies that key (or busd itself) could make."""
    # OpenSSL checks a common name that looks like a host name against the DNS constraints
    # when there is no DNS name in the SAN: an address goes in the SAN alone
    common = name if isinstance(_subject(name), x509.DNSName) else "a server"
    return _leaf(data_dir, common, [_subject(name)], ExtendedKeyUsageOID.SERVER_AUTH)


def _leaf(
    data_dir: Path, common: str, names: list[x509.GeneralName], usage: x509.ObjectIdentifier
) -> bytes:
    """A certificate (PEM) for `names` and one extended key usage, signed with the key of
    busd's authority in `data_dir`."""
    ca = x509.load_pem_x509_certificate((data_dir / tls.CA_FILE).read_bytes())
    ca_key = serialization.load_pem_private_key((data_dir / tls.CA_KEY_FILE).read_bytes(), None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.public_key()),  # type: ignore[arg-type]
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    return certificate.public_bytes(serialization.Encoding.PEM)


def verifies(ca_file: Path, chain_pem: bytes, name: str) -> bool:
    """cryptography's verification (RFC 5280 name constraints included) of a chain for
    `name`, trusting `ca_file` alone."""
    store = Store(x509.load_pem_x509_certificates(ca_file.read_bytes()))
    leaf, *intermediates = x509.load_pem_x509_certificates(chain_pem)
    try:
        subject: DNSName | IPAddress = IPAddress(ipaddress.ip_address(name))
    except ValueError:
        subject = DNSName(name)
    verifier = PolicyBuilder().store(store).build_server_verifier(subject)
    try:
        verifier.verify(leaf, intermediates)
    except VerificationError:
        return False
    return True


def openssl_verifies(
    ca_file: Path, cert_pem: bytes, tmp_path: Path, purpose: str | None = None
) -> tuple[bool, str]:
    """`openssl verify -CAfile` of a certificate (no host name: the chain and its
    constraints; with `purpose`, its use too)."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    cert = tmp_path / "checked.pem"
    cert.write_bytes(cert_pem)
    done = subprocess.run(
        ["openssl", "verify", "-CAfile", str(ca_file)]
        + (["-purpose", purpose] if purpose else [])
        + [str(cert)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return done.returncode == 0, done.stdout + done.stderr


def write_unconstrained(directory: Path) -> bytes:
    """The certificate busd kept before it had an authority of its own: self-signed, CA:TRUE,
    without name constraints, so its key could sign any name. Returns it (PEM)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "busd localhost")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=825))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    pem = certificate.public_bytes(serialization.Encoding.PEM)
    (directory / tls.CERT_FILE).write_bytes(pem)
    (directory / tls.KEY_FILE).write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return pem


def test_an_authority_for_local_names_and_a_server_certificate_it_signed(tmp_path):
    first = tls.load(None, None, tmp_path)
    assert first.generated and first.cert_path == tmp_path / tls.CA_FILE
    ca = x509.load_pem_x509_certificate(first.cert_path.read_bytes())
    basic = ca.extensions.get_extension_for_class(x509.BasicConstraints)
    assert basic.critical and basic.value.ca and basic.value.path_length == 0
    usage = ca.extensions.get_extension_for_class(x509.KeyUsage)
    assert usage.critical and usage.value.key_cert_sign and usage.value.crl_sign
    assert not usage.value.digital_signature
    constraints = ca.extensions.get_extension_for_class(x509.NameConstraints)
    assert constraints.critical and constraints.value.excluded_subtrees is None
    assert set(constraints.value.permitted_subtrees or []) == {
        x509.DNSName("localhost"),  # itself and every name under it (RFC 5280 §4.2.1.10)
        x509.IPAddress(ipaddress.ip_network("127.0.0.1/32")),
        x509.IPAddress(ipaddress.ip_network("::1/128")),
        x509.RFC822Name("invalid"),  # e-mail and URI names: none but a reserved one
        x509.UniformResourceIdentifier("invalid"),
    }
    eku = ca.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    leaf, issuer = x509.load_pem_x509_certificates((tmp_path / tls.CERT_FILE).read_bytes())
    assert issuer == ca  # the chain the server presents: its leaf, then the authority
    assert leaf.issuer == ca.subject and leaf.subject != ca.subject
    leaf.verify_directly_issued_by(ca)
    assert not leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    eku = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert set(san.get_values_for_type(x509.IPAddress)) == {
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
    }
    for key in (tls.KEY_FILE, tls.CA_KEY_FILE):  # the keys: owner only
        assert (tmp_path / key).stat().st_mode & 0o077 == 0
    # a client that trusts the authority alone verifies the server by name and by address
    assert _handshake(first, "localhost") == b"ok"
    assert _handshake(first, "127.0.0.1") == b"ok"
    before = {f: (tmp_path / f).read_bytes() for f in (tls.CA_FILE, tls.CERT_FILE)}
    tls.load(None, None, tmp_path)
    after = {f: (tmp_path / f).read_bytes() for f in (tls.CA_FILE, tls.CERT_FILE)}
    assert after == before  # clients trust it once, across restarts


@pytest.mark.parametrize("name", FOREIGN_NAMES)
def test_a_certificate_for_another_name_signed_with_busds_key_fails(tmp_path, name):
    data = tmp_path / "data"
    material = tls.load(None, None, data)
    forged = _signed_with_busds_key(data, name)
    assert not verifies(material.cert_path, forged, name)
    ok, said = openssl_verifies(material.cert_path, forged, tmp_path)
    assert not ok and "permitted subtree violation" in said, said


@pytest.mark.parametrize("name", LOCAL_NAMES)
def test_a_certificate_for_a_local_name_signed_with_busds_key_verifies(tmp_path, name):
    data = tmp_path / "data"
    material = tls.load(None, None, data)
    made = _signed_with_busds_key(data, name)
    assert verifies(material.cert_path, made, name)
    ok, said = openssl_verifies(material.cert_path, made, tmp_path)
    assert ok, said


def _for_another_use(data_dir: Path, use: str) -> bytes:
    """A certificate for a use other than a TLS server's, signed with the key of busd's
    authority: an e-mail (S/MIME) one, one naming a URI, a TLS client's, a code signer's."""
    names: list[x509.GeneralName] = [x509.DNSName("localhost")]  # a name busd may sign
    usage = {
        "e-mail": ExtendedKeyUsageOID.EMAIL_PROTECTION,
        "uri": ExtendedKeyUsageOID.SERVER_AUTH,
        "client": ExtendedKeyUsageOID.CLIENT_AUTH,
        "code": ExtendedKeyUsageOID.CODE_SIGNING,
    }[use]
    if use == "e-mail":
        names = [x509.RFC822Name("someone@example.com")]
    elif use == "uri":
        names.append(x509.UniformResourceIdentifier("https://login.example.com/callback"))
    return _leaf(data_dir, f"a {use} holder", names, usage)


def _chain_allows(ca_file: Path, cert_pem: bytes, usage: x509.ObjectIdentifier) -> bool:
    """Whether every certificate of the chain that states an extended key usage states
    `usage`: how verifiers without a purpose of their own for it (code signing with
    CryptoAPI, Go's crypto/x509) carry an issuer's extended key usage down the chain."""
    for pem in (cert_pem, ca_file.read_bytes()):
        certificate = x509.load_pem_x509_certificate(pem)
        try:
            stated = certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage)
        except x509.ExtensionNotFound:
            continue
        if usage not in stated.value and ExtendedKeyUsageOID.ANY_EXTENDED_KEY_USAGE not in (
            stated.value
        ):
            return False
    return True


def test_certificates_for_other_uses_signed_with_busds_key_fail(tmp_path):
    data = tmp_path / "data"
    material = tls.load(None, None, data)
    ca = material.cert_path
    # e-mail: no mailbox is permitted, and S/MIME signing is no use the authority has
    mail = _for_another_use(data, "e-mail")
    ok, said = openssl_verifies(ca, mail, tmp_path)
    assert not ok and "permitted subtree violation" in said, said
    ok, said = openssl_verifies(ca, mail, tmp_path, purpose="smimesign")
    assert not ok, said
    # a URI beside a local DNS name: no URI is permitted
    ok, said = openssl_verifies(ca, _for_another_use(data, "uri"), tmp_path)
    assert not ok and "permitted subtree violation" in said, said
    # a TLS client's certificate for localhost: the authority vouches for servers alone
    client = _for_another_use(data, "client")
    ok, said = openssl_verifies(ca, client, tmp_path, purpose="sslclient")
    assert not ok and "unsuitable certificate purpose" in said, said
    store = Store(x509.load_pem_x509_certificates(ca.read_bytes()))
    with pytest.raises(VerificationError):
        PolicyBuilder().store(store).build_client_verifier().verify(
            x509.load_pem_x509_certificate(client), []
        )
    # code signing (OpenSSL before 3.4 has no purpose for it): the chain does not allow it
    code = _for_another_use(data, "code")
    assert not _chain_allows(ca, code, ExtendedKeyUsageOID.CODE_SIGNING)
    # what stays allowed: busd's own server certificate, for a TLS server
    chain = (data / tls.CERT_FILE).read_bytes()
    ok, said = openssl_verifies(ca, chain, tmp_path, purpose="sslserver")
    assert ok, said
    assert _chain_allows(ca, chain, ExtendedKeyUsageOID.SERVER_AUTH)


def test_the_authority_constrained_by_names_alone_is_replaced(tmp_path, caplog, monkeypatch):
    """What busd made before it had an extended key usage and e-mail and URI constraints:
    made anew at start, its key forgotten."""
    data = tmp_path / "data"
    data.mkdir()
    constraints = tls.Names.constraints

    def dns_and_ip_only(self: tls.Names) -> x509.NameConstraints:
        subtrees = [
            n
            for n in constraints(self).permitted_subtrees or []
            if isinstance(n, x509.DNSName | x509.IPAddress)
        ]
        return x509.NameConstraints(permitted_subtrees=subtrees, excluded_subtrees=None)

    with monkeypatch.context() as patched:
        patched.setattr(tls.Names, "constraints", dns_and_ip_only)
        tls._generate_authority(data / tls.CA_FILE, data / tls.CA_KEY_FILE, tls.Names.serving())
    old_ca = (data / tls.CA_FILE).read_bytes()
    # that authority, without its extended key usage, vouched for a client
    _strip_extended_key_usage(data)
    client = _for_another_use(data, "client")
    ok, said = openssl_verifies(data / tls.CA_FILE, client, tmp_path, purpose="sslclient")
    assert ok, said
    with caplog.at_level(logging.INFO, logger="busd.net.tls"):
        material = tls.load(None, None, data)
    (line,) = [r.getMessage() for r in caplog.records if r.name == "busd.net.tls"]
    assert "e-mail and URI names" in line, line
    assert material.cert_path.read_bytes() != old_ca
    ok, said = openssl_verifies(material.cert_path, client, tmp_path, purpose="sslclient")
    assert not ok, said  # its key is gone: nothing it signed is trusted any more
    assert _handshake(material, "localhost") == b"ok"
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="busd.net.tls"):
        tls.load(None, None, data)  # the next start: kept, nothing said
    assert not [r for r in caplog.records if r.name == "busd.net.tls"]


def _strip_extended_key_usage(data: Path) -> None:
    """Sign the authority in `data` anew without its extended key usage (and with DNS and IP
    constraints alone): the authority an earlier busd made."""
    ca = x509.load_pem_x509_certificate((data / tls.CA_FILE).read_bytes())
    key = serialization.load_pem_private_key((data / tls.CA_KEY_FILE).read_bytes(), None)
    builder = (
        x509.CertificateBuilder()
        .subject_name(ca.subject)
        .issuer_name(ca.issuer)
        .public_key(ca.public_key())
        .serial_number(ca.serial_number)
        .not_valid_before(ca.not_valid_before_utc)
        .not_valid_after(ca.not_valid_after_utc)
    )
    for extension in ca.extensions:
        if not isinstance(extension.value, x509.ExtendedKeyUsage):
            builder = builder.add_extension(extension.value, extension.critical)
    signed = builder.sign(key, hashes.SHA256())  # type: ignore[arg-type]
    (data / tls.CA_FILE).write_bytes(signed.public_bytes(serialization.Encoding.PEM))


def test_busds_own_server_certificate_verifies_for_each_local_name(tmp_path):
    material = tls.load(None, None, tmp_path / "data")
    chain = (tmp_path / "data" / tls.CERT_FILE).read_bytes()
    for name in ("localhost", "127.0.0.1", "::1"):
        assert verifies(material.cert_path, chain, name), name
    assert not verifies(material.cert_path, chain, "example.com")
    ok, said = openssl_verifies(material.cert_path, chain, tmp_path)
    assert ok, said


def test_the_unconstrained_certificate_an_earlier_busd_kept_is_replaced(tmp_path, caplog):
    data = tmp_path / "data"
    old = write_unconstrained(data)
    forged = _forged_with_old_key(data)
    ok, said = openssl_verifies(data / tls.CERT_FILE, forged, tmp_path)
    assert ok, said  # what the old certificate allowed: its key vouched for any name
    with caplog.at_level(logging.INFO, logger="busd.net.tls"):
        material = tls.load(None, None, data)
    lines = [r.getMessage() for r in caplog.records if r.name == "busd.net.tls"]
    assert len(lines) == 1 and "no name constraints" in lines[0], lines
    assert str(data / tls.CA_FILE) in lines[0]
    assert (data / tls.CERT_FILE).read_bytes() != old
    ca = x509.load_pem_x509_certificate(material.cert_path.read_bytes())
    assert ca.extensions.get_extension_for_class(x509.NameConstraints).critical
    assert verifies(material.cert_path, (data / tls.CERT_FILE).read_bytes(), "localhost")
    # the old key is gone from the data directory: nothing it signs is trusted any more
    ok, said = openssl_verifies(material.cert_path, forged, tmp_path)
    assert not ok, said
    assert _handshake(material, "localhost") == b"ok"
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="busd.net.tls"):
        tls.load(None, None, data)  # the next start: nothing to migrate, nothing said
    assert not [r for r in caplog.records if r.name == "busd.net.tls"]


def _forged_with_old_key(data: Path) -> bytes:
    """A certificate for login.microsoftonline.com signed with the old certificate's key."""
    old = x509.load_pem_x509_certificate((data / tls.CERT_FILE).read_bytes())
    key = serialization.load_pem_private_key((data / tls.KEY_FILE).read_bytes(), None)
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(
            x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "login.microsoftonline.com")])
        )
        .issuer_name(old.subject)
        .public_key(leaf_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("login.microsoftonline.com")]),
            critical=False,
        )
        .sign(key, hashes.SHA256())  # type: ignore[arg-type]
        .public_bytes(serialization.Encoding.PEM)
    )


def test_rotation_by_deleting_files(tmp_path, caplog):
    tls.load(None, None, tmp_path)
    ca = (tmp_path / tls.CA_FILE).read_bytes()
    leaf = (tmp_path / tls.CERT_FILE).read_bytes()
    # the server certificate alone: a new one from the same authority, clients unaffected
    (tmp_path / tls.CERT_FILE).unlink()
    material = tls.load(None, None, tmp_path)
    assert (tmp_path / tls.CA_FILE).read_bytes() == ca
    assert (tmp_path / tls.CERT_FILE).read_bytes() != leaf
    assert _handshake(material, "localhost") == b"ok"
    # the authority: a new one, and a server certificate it signed
    (tmp_path / tls.CA_FILE).unlink()
    with caplog.at_level(logging.INFO, logger="busd.net.tls"):
        material = tls.load(None, None, tmp_path)
    assert (tmp_path / tls.CA_FILE).read_bytes() != ca
    assert [r.getMessage() for r in caplog.records if r.name == "busd.net.tls"]
    assert verifies(material.cert_path, (tmp_path / tls.CERT_FILE).read_bytes(), "localhost")
    assert _handshake(material, "localhost") == b"ok"


def test_the_host_busd_is_bound_to_is_permitted_too(tmp_path, caplog):
    data = tmp_path / "data"
    hosts = ["10.9.8.7", "BusHost.Example.", "0.0.0.0", "::", "[fe80::1%eth0]"]
    material = tls.load(None, None, data, hosts)
    chain = (data / tls.CERT_FILE).read_bytes()
    for name in ("bushost.example", "10.9.8.7", "fe80::1", "localhost", "127.0.0.1"):
        assert verifies(material.cert_path, chain, name), name
    assert not verifies(material.cert_path, _signed_with_busds_key(data, "10.9.8.6"), "10.9.8.6")
    ca = material.cert_path.read_bytes()
    tls.load(None, None, data)  # without the host: the authority still permits it, kept
    assert material.cert_path.read_bytes() == ca
    with caplog.at_level(logging.INFO, logger="busd.net.tls"):
        tls.load(None, None, data, ["other.example"])  # a name it may not sign: made anew
    assert material.cert_path.read_bytes() != ca
    (line,) = [r.getMessage() for r in caplog.records if r.name == "busd.net.tls"]
    assert "may not sign other.example" in line
    assert verifies(material.cert_path, (data / tls.CERT_FILE).read_bytes(), "other.example")


def test_made_anew_when_about_to_expire_or_unreadable(tmp_path, monkeypatch):
    monkeypatch.setattr(tls, "VALID_DAYS", tls.RENEW_BEFORE_DAYS - 1)
    tls.load(None, None, tmp_path)
    short = (tmp_path / tls.CERT_FILE).read_bytes()
    ca = (tmp_path / tls.CA_FILE).read_bytes()
    monkeypatch.undo()
    tls.load(None, None, tmp_path)
    assert (tmp_path / tls.CERT_FILE).read_bytes() != short
    assert (tmp_path / tls.CA_FILE).read_bytes() == ca  # the authority is kept
    cert = x509.load_pem_x509_certificate((tmp_path / tls.CERT_FILE).read_bytes())
    left = cert.not_valid_after_utc - datetime.datetime.now(datetime.UTC)
    assert left > datetime.timedelta(days=tls.VALID_DAYS - 1)
    (tmp_path / tls.CERT_FILE).write_text("not a certificate")
    tls.load(None, None, tmp_path)
    assert (tmp_path / tls.CERT_FILE).read_bytes().startswith(b"-----BEGIN")
    monkeypatch.setattr(tls, "CA_VALID_DAYS", tls.RENEW_BEFORE_DAYS - 1)
    tls.load(None, None, tmp_path / "short")
    short_ca = (tmp_path / "short" / tls.CA_FILE).read_bytes()
    monkeypatch.undo()
    material = tls.load(None, None, tmp_path / "short")
    assert material.cert_path.read_bytes() != short_ca
    assert verifies(
        material.cert_path, (tmp_path / "short" / tls.CERT_FILE).read_bytes(), "localhost"
    )


def test_the_users_own_certificate(tmp_path):
    tls.load(None, None, tmp_path / "theirs")  # stands for a certificate of their own
    cert, key = tmp_path / "theirs" / tls.CERT_FILE, tmp_path / "theirs" / tls.KEY_FILE
    material = tls.load(str(cert), str(key), tmp_path / "data")
    assert not material.generated and material.cert_path == cert
    assert not (tmp_path / "data").exists()  # nothing made
    assert material.context.sni_callback is None  # presented as it is, for every name
    assert _handshake(material, "localhost") == b"ok"


@pytest.mark.parametrize("which", ["cert", "key", "mismatch", "half"])
def test_unusable_user_files_are_config_errors(tmp_path, which):
    tls.load(None, None, tmp_path / "a")
    tls.load(None, None, tmp_path / "b")
    cert, key = str(tmp_path / "a" / tls.CERT_FILE), str(tmp_path / "a" / tls.KEY_FILE)
    if which == "cert":
        cert = str(tmp_path / "missing.pem")
    elif which == "key":
        key = cert  # a certificate where the key should be
    elif which == "mismatch":
        key = str(tmp_path / "b" / tls.KEY_FILE)
    else:
        key = None
    with pytest.raises(ConfigError):
        tls.load(cert, key, tmp_path / "data")
