"""`WebhookCallers.check`: an admission webhook call is answered only when the connection's client
certificate carries an expected common name and was issued by the cluster's client CA (the signature
counts, not the issuer's name); without expected names anyone is answered, as CDI answers anyone."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest
from aiohttp import web
from cryptography.hazmat.primitives import serialization

from cdi.apiserver.frontproxy import Unauthenticated, WebhookCallers
from cdi.common import pki

NAME = "kube-apiserver-kubelet-client"


@pytest.fixture(scope="module")
def client_ca() -> pki.KeyPair:
    return pki.make_ca("kubernetes")


def request_with(certificate: pki.KeyPair | None, *, tls: bool = True) -> web.Request:
    """A request as aiohttp hands it over: its transport's SSL object holds the peer's certificate (DER),
    which TLS has already checked against the server's trusted CAs."""
    der = (certificate.certificate().public_bytes(serialization.Encoding.DER) if certificate is not None else None)
    ssl_object = SimpleNamespace(getpeercert=lambda binary_form=False: der)
    extra: dict[str, Any] = {"ssl_object": ssl_object if tls else None}
    return cast(web.Request, SimpleNamespace(transport=SimpleNamespace(get_extra_info=extra.get)))


def callers(*cas: pki.KeyPair, names: tuple[str, ...] = (NAME,)) -> WebhookCallers:
    return WebhookCallers("".join(ca.cert_pem.decode() for ca in cas), names)


def test_the_api_servers_certificate_is_answered(client_ca: pki.KeyPair) -> None:
    callers(client_ca).check(request_with(pki.issue(client_ca, NAME, server=False, client=True)))


def test_a_call_without_a_client_certificate_is_refused(client_ca: pki.KeyPair) -> None:
    for request in (request_with(None), request_with(None, tls=False)):
        with pytest.raises(Unauthenticated, match="answer only the API server: no client certificate"):
            callers(client_ca).check(request)


def test_a_certificate_of_the_client_ca_with_another_name_is_refused(client_ca: pki.KeyPair) -> None:
    # any workload with a certificate of the cluster's CA (a kubelet's, a user's) is not the API server
    user = pki.issue(client_ca, "system:node:worker", server=False, client=True)
    with pytest.raises(Unauthenticated, match=f"certificate CN system:node:worker is not one of {NAME}"):
        callers(client_ca).check(request_with(user))


def test_the_right_name_from_another_ca_is_refused(client_ca: pki.KeyPair) -> None:
    # a CA of the same name (anyone can make one): the signature decides, not the issuer's name
    impostor = pki.make_ca("kubernetes")
    forged = pki.issue(impostor, NAME, server=False, client=True)
    assert forged.certificate().issuer == client_ca.certificate().subject
    with pytest.raises(Unauthenticated, match="was not issued by the cluster's client CA"):
        callers(client_ca).check(request_with(forged))
    # a self-signed one with that name, too
    with pytest.raises(Unauthenticated, match="was not issued by the cluster's client CA"):
        callers(client_ca).check(request_with(pki.issue(None, NAME, server=False, client=True)))


def test_any_ca_of_the_bundle_and_any_expected_name_will_do(client_ca: pki.KeyPair) -> None:
    other = pki.make_ca("kubernetes-next")  # a rotated CA published beside the current one
    bundle = callers(client_ca, other, names=("front", NAME))
    bundle.check(request_with(pki.issue(other, NAME, server=False, client=True)))
    bundle.check(request_with(pki.issue(client_ca, "front", server=False, client=True)))


def test_no_published_client_ca_refuses_everyone(client_ca: pki.KeyPair) -> None:
    """Names given but the ConfigMap unreadable: every call is refused rather than any answered."""
    with pytest.raises(Unauthenticated, match="was not issued by the cluster's client CA"):
        WebhookCallers("", (NAME,)).check(request_with(pki.issue(client_ca, NAME, server=False, client=True)))


def test_without_expected_names_anyone_is_answered(client_ca: pki.KeyPair) -> None:
    """CDI's behaviour, the default: what the README says this leaves open is why the tier sets names."""
    open_door = callers(client_ca, names=())
    assert not open_door.required
    open_door.check(request_with(None))
    open_door.check(request_with(pki.issue(pki.make_ca("elsewhere"), "anybody", server=False, client=True)))
