"""The SSL contexts of `cdi.common.pki`, over a loopback connection: a verifying client trusts exactly
the CA it is given, presents its client certificate to a server that asks for one, and the insecure
client connects to anything."""

from __future__ import annotations

import socket
import ssl
import threading
from pathlib import Path

import pytest

from cdi.common import pki


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext, name: str = "localhost") -> str | None:
    """Connect `client` to `server`; the subject the server saw from the client (None: no certificate).
    Raises the client's SSLError when its handshake fails."""
    listener = socket.create_server(("127.0.0.1", 0))
    seen: list[str | None] = []

    def serve() -> None:
        conn, _ = listener.accept()
        try:
            with server.wrap_socket(conn, server_side=True) as tls:
                peer = tls.getpeercert()
                seen.append(dict(x[0] for x in peer["subject"])["commonName"] if peer else None)
                tls.sendall(b"x")
        except (ssl.SSLError, OSError):
            seen.append(None)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        with socket.create_connection(listener.getsockname(), timeout=5) as raw, \
                client.wrap_socket(raw, server_hostname=name) as tls:
            tls.recv(1)
    finally:
        thread.join(5)
        listener.close()
    return seen[0]


@pytest.fixture(scope="module")
def ca() -> pki.KeyPair:
    return pki.make_ca("test-ca")


@pytest.fixture
def serving(ca: pki.KeyPair, tmp_path: Path) -> ssl.SSLContext:
    return pki.server_context(pki.issue(ca, "server", ["localhost"]), tmp_path / "server")


def test_client_trusts_the_ca_it_is_given(ca: pki.KeyPair, serving: ssl.SSLContext) -> None:
    _handshake(serving, pki.client_context(ca.cert_pem.decode()))
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(serving, pki.client_context(pki.make_ca("another-ca").cert_pem.decode()))


def test_client_checks_the_server_name(ca: pki.KeyPair, serving: ssl.SSLContext) -> None:
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(serving, pki.client_context(ca.cert_pem.decode()), name="elsewhere.example")


def test_client_without_a_ca_trusts_the_system_store_only(serving: ssl.SSLContext) -> None:
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(serving, pki.client_context())


def test_insecure_client_connects_to_anything(serving: ssl.SSLContext) -> None:
    _handshake(serving, pki.insecure_client_context(), name="elsewhere.example")


@pytest.mark.parametrize("as_files", [False, True])
def test_client_presents_its_identity(ca: pki.KeyPair, tmp_path: Path, as_files: bool) -> None:
    clients_ca = pki.make_ca("clients-ca")
    server = pki.server_context(pki.issue(ca, "server", ["localhost"]), tmp_path / "server",
                                client_ca=clients_ca.cert_pem)
    pair = pki.issue(clients_ca, "uploadproxy", None, server=False, client=True)
    identity: pki.Identity = pair
    if as_files:
        pair.write(tmp_path / "client.crt", tmp_path / "client.key")
        identity = (tmp_path / "client.crt", tmp_path / "client.key")
    assert _handshake(server, pki.client_context(ca.cert_pem.decode(), identity=identity)) == "uploadproxy"


def test_a_server_requiring_client_certificates_refuses_a_client_without_one(ca: pki.KeyPair,
                                                                            tmp_path: Path) -> None:
    server = pki.server_context(pki.issue(ca, "server", ["localhost"]), tmp_path / "server",
                                client_ca=pki.make_ca("clients-ca").cert_pem)
    with pytest.raises((ssl.SSLError, OSError)):
        _handshake(server, pki.client_context(ca.cert_pem.decode()))


def test_an_optional_client_certificate_may_be_left_out(ca: pki.KeyPair, tmp_path: Path) -> None:
    pair = pki.issue(ca, "server", ["localhost"])
    pair.write(tmp_path / "tls.crt", tmp_path / "tls.key")
    (tmp_path / "clients.crt").write_bytes(pki.make_ca("clients-ca").cert_pem)
    server = pki.server_context_from_files(tmp_path / "tls.crt", tmp_path / "tls.key",
                                           client_ca=tmp_path / "clients.crt", client_required=False)
    assert _handshake(server, pki.client_context(ca.cert_pem.decode())) is None


def test_clients_never_go_below_tls_1_2() -> None:
    assert pki.client_context().minimum_version == ssl.TLSVersion.TLSv1_2
    assert pki.insecure_client_context().minimum_version == ssl.TLSVersion.TLSv1_2
