"""A renewed certificate written over a threaded front's files reaches the connections accepted after
`reload`, on both TLS paths (what `cdi up` does when it renews the upload proxy's certificate per the CDI
resource's certConfig), under the policy set before."""

from __future__ import annotations

import socket
import ssl
import threading
from pathlib import Path

import pytest
from cryptography import x509

from cdi.common import pki, tlsfront
from cdi.kube.tlswatch import DEFAULT_POLICY


def _presented(acceptor: tlsfront.Acceptor, maximum: ssl.TLSVersion | None = None) -> x509.Certificate | None:
    """The certificate a client (offering TLS up to `maximum`) sees on a new connection; None: refused."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        seen: dict[str, bytes | None] = {}

        def client() -> None:
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
            if maximum is not None:
                context.maximum_version = maximum
            try:
                with socket.create_connection(listener.getsockname(), timeout=10) as raw, \
                        context.wrap_socket(raw) as tls:
                    seen["der"] = tls.getpeercert(binary_form=True)
                    tls.recv(1)  # until the server closes
            except OSError:
                seen.setdefault("der", None)

        thread = threading.Thread(target=client)
        thread.start()
        raw, _ = listener.accept()
        try:
            acceptor.accept(raw, 10).close()
        except (OSError, ValueError):
            raw.close()
        thread.join(10)
    der = seen["der"]
    return None if der is None else x509.load_der_x509_certificate(der)


@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
def test_reload_serves_the_renewed_certificate_to_new_connections(native: bool, tmp_path: Path) -> None:
    if native and not tlsfront.native_available():
        pytest.skip("the C extension is not built")
    ca = pki.make_ca("test-ca")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    first = pki.issue(ca, "first", ["127.0.0.1"])
    first.write(cert, key)
    acceptor = tlsfront.Acceptor(tlsfront.ServerTLS(cert, key, DEFAULT_POLICY), native)
    acceptor.set_policy(pki.TLSPolicy.of([], "VersionTLS13"))  # as CDIConfig's Modern profile
    assert _presented(acceptor) == first.certificate()

    renewed = pki.issue(ca, "renewed", ["127.0.0.1"])
    renewed.write(cert, key)
    assert _presented(acceptor) == first.certificate()  # files alone change nothing
    acceptor.reload()
    assert _presented(acceptor) == renewed.certificate()
    assert _presented(acceptor, ssl.TLSVersion.TLSv1_2) is None  # the policy set before is kept
