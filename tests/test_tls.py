"""busd.tls: the certificate busd makes for itself, kept across restarts, and the user's own."""

from __future__ import annotations

import datetime
import ipaddress
import socket
import ssl
import threading

import pytest
from cryptography import x509

from busd import tls
from busd.config import ConfigError


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


def test_made_once_for_localhost_and_kept(tmp_path):
    first = tls.load(None, None, tmp_path)
    assert first.generated and first.cert_path == tmp_path / tls.CERT_FILE
    cert = x509.load_pem_x509_certificate(first.cert_path.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert set(san.get_values_for_type(x509.IPAddress)) == {
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
    }
    assert (tmp_path / tls.KEY_FILE).stat().st_mode & 0o077 == 0  # the key: owner only
    # a client that trusts the file verifies the server by name and by address
    assert _handshake(first, "localhost") == b"ok"
    assert _handshake(first, "127.0.0.1") == b"ok"
    before = first.cert_path.read_bytes()
    again = tls.load(None, None, tmp_path)
    assert again.cert_path.read_bytes() == before  # clients trust it once, across restarts


def test_made_anew_when_about_to_expire_or_unreadable(tmp_path, monkeypatch):
    monkeypatch.setattr(tls, "VALID_DAYS", tls.RENEW_BEFORE_DAYS - 1)
    short = tls.load(None, None, tmp_path).cert_path.read_bytes()
    monkeypatch.undo()
    renewed = tls.load(None, None, tmp_path)
    assert renewed.cert_path.read_bytes() != short
    cert = x509.load_pem_x509_certificate(renewed.cert_path.read_bytes())
    left = cert.not_valid_after_utc - datetime.datetime.now(datetime.UTC)
    assert left > datetime.timedelta(days=tls.VALID_DAYS - 1)
    renewed.cert_path.write_text("not a certificate")
    assert tls.load(None, None, tmp_path).cert_path.read_bytes().startswith(b"-----BEGIN")


def test_the_users_own_certificate(tmp_path):
    made = tls.load(None, None, tmp_path / "theirs")  # stands for a certificate of their own
    cert, key = made.cert_path, tmp_path / "theirs" / tls.KEY_FILE
    material = tls.load(str(cert), str(key), tmp_path / "data")
    assert not material.generated and material.cert_path == cert
    assert not (tmp_path / "data").exists()  # nothing made
    assert _handshake(material, "localhost") == b"ok"


@pytest.mark.parametrize("which", ["cert", "key", "mismatch", "half"])
def test_unusable_user_files_are_config_errors(tmp_path, which):
    a = tls.load(None, None, tmp_path / "a")
    b = tls.load(None, None, tmp_path / "b")
    cert, key = str(a.cert_path), str(tmp_path / "a" / tls.KEY_FILE)
    if which == "cert":
        cert = str(tmp_path / "missing.pem")
    elif which == "key":
        key = cert  # a certificate where the key should be
    elif which == "mismatch":
        key = str(tmp_path / "b" / tls.KEY_FILE)
    else:
        key = None
    del b
    with pytest.raises(ConfigError):
        tls.load(cert, key, tmp_path / "data")
