"""Issue 27: under `cdi up` the CDI resource's `spec.certConfig` governs CDI's certificates as cdi-operator
does on a cluster: cdi-apiserver's and the upload proxy's serving certificates, their CAs, and the
upload-server signer new upload pods get their certificates from. Lifetimes are read from what the
servers present (Python's `ssl`, no verification) and the CAs from the bundles clients are given; a change
of certConfig renews them while `cdi up` runs, and uploads and admission keep working across it.

Without a certConfig the lifetimes are CDI's: 48h for CAs, 24h for leaves. Every certificate is made
valid from five minutes before it was issued (clock skew), so a lifetime here is the duration plus those
five minutes."""

from __future__ import annotations

import base64
import datetime
import hashlib
import json
import os
import socket
import ssl
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from cryptography import x509

from tests.e2e.importing import read_back
from tests.e2e.uploading import image_upload, proxy_url, upload_dv, wait_ready
from tests.support.cluster import CdiUp, Kubectl, wait_for

pytestmark = pytest.mark.slow

HOUR = datetime.timedelta(hours=1)
MINUTE = datetime.timedelta(minutes=1)
SHORT = {"ca": {"duration": "3h", "renewBefore": "1h"}, "server": {"duration": "1h", "renewBefore": "30m"}}


@pytest.fixture
def up(cdi_up: CdiUp) -> CdiUp:
    """A fresh `cdi up` per test (tests/conftest.py's): each renews certificates of its own."""
    return cdi_up


@pytest.fixture
def k(kubectl: Kubectl) -> Kubectl:
    return kubectl


def presented(address: tuple[str, int]) -> x509.Certificate:
    """The certificate the server at `address` presents to a new connection."""
    return x509.load_pem_x509_certificate(ssl.get_server_certificate(address, timeout=10).encode())


def lifetime(cert: x509.Certificate) -> datetime.timedelta:
    return cert.not_valid_after_utc - cert.not_valid_before_utc


def about(cert: x509.Certificate, duration: datetime.timedelta) -> bool:
    """Issued for `duration` (plus the five minutes it is backdated)."""
    return abs(lifetime(cert) - duration - 5 * MINUTE) < MINUTE


def issuer_in(bundle: str, leaf: x509.Certificate) -> x509.Certificate:
    """The CA of `bundle` that signed `leaf`."""
    for ca in x509.load_pem_x509_certificates(bundle.encode()):
        if ca.subject == leaf.issuer:
            leaf.verify_directly_issued_by(ca)
            return ca
    raise AssertionError(f"no CA of the bundle issued {leaf.subject.rfc4514_string()} (issuer "
                         f"{leaf.issuer.rfc4514_string()})")


def verified(address: tuple[str, int], bundle: str, server_name: str) -> bool:
    """A client that trusts `bundle` accepts the server's certificate for `server_name`."""
    context = ssl.create_default_context(cadata=bundle)
    with socket.create_connection(address, timeout=10) as raw, context.wrap_socket(raw, server_hostname=server_name):
        return True


def servers(k: Kubectl) -> dict[str, tuple[str, int]]:
    endpoints = k.get("endpoints", "cdi-api", "cdi")["subsets"][0]
    proxy = urlsplit(proxy_url(k))
    return {"cdi-apiserver": (endpoints["addresses"][0]["ip"], int(endpoints["ports"][0]["port"])),
            "uploadproxy": (str(proxy.hostname), int(proxy.port or 443))}


def bundles(up: CdiUp, k: Kubectl) -> dict[str, str]:
    """What each server's clients trust: the API server calling the webhooks (their caBundle), and
    `cdi image-upload` (`uploadproxy-ca.crt` next to the kubeconfig, and ConfigMap `cdi-uploadproxy-ca`)."""
    webhook = k.json("get", "validatingwebhookconfiguration", "cdi-api-datavolume-validate")
    proxy_file = (up.kubeconfig.parent / "uploadproxy-ca.crt").read_text()
    assert k.get("configmap", "cdi-uploadproxy-ca", "cdi")["data"]["ca.crt"] == proxy_file
    return {"cdi-apiserver": base64.b64decode(webhook["webhooks"][0]["clientConfig"]["caBundle"]).decode(),
            "uploadproxy": proxy_file}


SERVER_NAMES = {"cdi-apiserver": "cdi-api.cdi.svc", "uploadproxy": "127.0.0.1"}


def upload_server(k: Kubectl) -> tuple[str, int]:
    """Where the upload proxy reaches the only upload server: its Service's cluster IP (the Service of the
    claim the upload goes to, the DataVolume's or its populator's)."""
    services = k.json("get", "service", "-n", "default", "-l", "cdi.kubevirt.io=cdi-upload-server")["items"]
    assert len(services) == 1, [s["metadata"]["name"] for s in services]
    spec = services[0]["spec"]
    return spec["clusterIP"], int(spec["ports"][0]["port"])


def test_cert_config_governs_the_servers_certificates_and_uploads_and_admission_keep_working(
        up: CdiUp, k: Kubectl, tmp_path: Path) -> None:
    addresses = servers(k)
    before = {name: presented(address) for name, address in addresses.items()}
    trusted = bundles(up, k)
    for name, leaf in before.items():  # CDI's defaults from the start
        assert about(leaf, 24 * HOUR), f"{name} presents a certificate for {lifetime(leaf)}"
        assert about(issuer_in(trusted[name], leaf), 48 * HOUR), name
        assert verified(addresses[name], trusted[name], SERVER_NAMES[name])
    upload_signers = k.get("configmap", "cdi-uploadserver-signer-bundle", "cdi")["data"]["ca-bundle.crt"]
    assert [about(ca, 48 * HOUR) for ca in x509.load_pem_x509_certificates(upload_signers.encode())] == [True]

    k("patch", "cdi", "cdi", "--type=merge", "-p", json.dumps({"spec": {"certConfig": SHORT}}))

    def renewed() -> dict[str, x509.Certificate] | None:
        now = {name: presented(address) for name, address in addresses.items()}
        return now if all(about(leaf, HOUR) for leaf in now.values()) else None
    after = wait_for(renewed, 60, interval=0.5, message="both servers present certificates of certConfig's 1h")
    trusted = bundles(up, k)
    for name, leaf in after.items():
        assert about(issuer_in(trusted[name], leaf), 3 * HOUR), f"{name}'s new CA lives certConfig's 3h"
        assert verified(addresses[name], trusted[name], SERVER_NAMES[name])
        # the old CA stays trusted until it expires: what was issued before the renewal is still accepted
        assert about(issuer_in(trusted[name], before[name]), 48 * HOUR), name

    # a new upload pod's certificate comes from the renewed upload-server signer
    k.apply(upload_dv("after-renewal"))
    wait_ready(k, "after-renewal")
    leaf = presented(upload_server(k))
    upload_signers = k.get("configmap", "cdi-uploadserver-signer-bundle", "cdi")["data"]["ca-bundle.crt"]
    assert about(leaf, HOUR)
    assert about(issuer_in(upload_signers, leaf), 3 * HOUR)

    # `cdi image-upload` trusts the renewed proxy without flags, and the bytes arrive
    image = tmp_path / "disk.raw"
    image.write_bytes(os.urandom(4 << 20))
    result = image_upload(up, "dv", "after-renewal", "--no-create", "--image-path", str(image))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "result     DataVolume default/after-renewal Succeeded" in result.stdout
    assert read_back(k, "after-renewal", 4 << 20) == hashlib.sha256(image.read_bytes()).hexdigest()

    # the API server still reaches the admission webhooks (failurePolicy Fail: a TLS failure refuses)
    created = k.apply({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "metadata": {"name": "admitted"},
                       "spec": {"source": {"blank": {}}, "storage": {"resources": {"requests": {"storage": "8Mi"}}}}})
    assert "datavolume.cdi.kubevirt.io/admitted created" in created.stdout
    refused = k.apply({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "metadata": {"name": "refused"},
                       "spec": {"source": {"http": {"url": "ftp://nowhere/disk.img"}},
                                "storage": {"resources": {"requests": {"storage": "8Mi"}}}}}, check=False)
    assert refused.returncode != 0 and "Invalid source URL scheme" in refused.stderr, refused.stderr


def test_certificates_are_renewed_before_they_expire_while_cdi_up_runs(up: CdiUp, k: Kubectl) -> None:
    """A leaf of 3 minutes renewed 2m50s before its end: due 10 seconds after it is issued, and renewed
    then with nothing changed, as many times as it comes due."""
    addresses = servers(k)
    k("patch", "cdi", "cdi", "--type=merge", "-p", json.dumps(
        {"spec": {"certConfig": {"server": {"duration": "3m", "renewBefore": "2m50s"}}}}))

    def short() -> dict[str, x509.Certificate] | None:
        now = {name: presented(address) for name, address in addresses.items()}
        return now if all(about(leaf, 3 * MINUTE) for leaf in now.values()) else None
    first = wait_for(short, 60, interval=0.5, message="certificates of 3 minutes")
    trusted = bundles(up, k)
    for _ in range(2):
        def next_one(previous: dict[str, x509.Certificate] = first) -> dict[str, x509.Certificate] | None:
            now = {name: presented(address) for name, address in addresses.items()}
            return now if all(now[n].serial_number != previous[n].serial_number for n in now) else None
        first = wait_for(next_one, 60, interval=0.5, message="renewed when due, with no change of certConfig")
        for name, leaf in first.items():
            assert about(leaf, 3 * MINUTE)
            assert verified(addresses[name], trusted[name], SERVER_NAMES[name]), name
