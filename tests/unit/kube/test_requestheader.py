"""The request-header (front-proxy) authentication both aggregated servers share: whom the headers name,
and when they are not believed; the ConfigMap read as kube-apiserver writes it (following it as it changes:
tests/integration/upload/test_requestheader_rotation.py)."""

from __future__ import annotations

import pytest

from cdi.kube.requestheader import (
    RequestHeaderConfig,
    Unauthenticated,
    common_name,
)

KUBEADM = {"client-ca-file": "CLIENT CA", "requestheader-client-ca-file": "FRONT PROXY CA",
           "requestheader-allowed-names": '["front-proxy-client"]',
           "requestheader-username-headers": '["X-Remote-User"]',
           "requestheader-group-headers": '["X-Remote-Group"]',
           "requestheader-extra-headers-prefix": '["X-Remote-Extra-"]'}
HEADERS = [("X-Remote-User", "system:serviceaccount:ns:alice"), ("X-Remote-Group", "system:serviceaccounts"),
           ("x-remote-group", "system:authenticated"), ("X-Remote-Extra-Authentication.kubernetes.io%2fpod-name", "p"),
           ("Content-Type", "application/octet-stream")]


def test_the_user_groups_and_extras_of_an_allowed_front_proxy() -> None:
    config = RequestHeaderConfig.from_configmap(KUBEADM)
    caller = config.caller("front-proxy-client", HEADERS)
    assert caller.user == "system:serviceaccount:ns:alice"
    assert caller.groups == ("system:serviceaccounts", "system:authenticated")
    assert caller.extra == {"authentication.kubernetes.io/pod-name": ["p"]}
    assert config.client_ca == "FRONT PROXY CA"


@pytest.mark.parametrize(("name", "headers", "why"), [
    (None, HEADERS, "no verified front-proxy client certificate"),
    ("kube-apiserver-kubelet-client", HEADERS, "not an allowed requestheader name"),
    ("front-proxy-client", [("X-Remote-Group", "system:masters")], "X-Remote-User"),
    ("front-proxy-client", [("X-Remote-User", "")], "X-Remote-User"),
])
def test_the_headers_are_not_believed_without_the_front_proxy(name: str | None, headers: list[tuple[str, str]],
                                                               why: str) -> None:
    with pytest.raises(Unauthenticated, match=why):
        RequestHeaderConfig.from_configmap(KUBEADM).caller(name, headers)


def test_no_allowed_names_means_any_certificate_of_the_ca_and_other_header_names_are_honoured() -> None:
    config = RequestHeaderConfig.from_configmap({"requestheader-username-headers": '["X-Forwarded-User"]'})
    assert config.caller("anyone", [("X-Forwarded-User", "bob"), ("X-Remote-User", "admin")]).user == "bob"
    with pytest.raises(Unauthenticated):
        config.caller("anyone", [("X-Remote-User", "admin")])
    assert RequestHeaderConfig.from_configmap({"requestheader-allowed-names": "not json"}).allowed_names == ()


def test_common_name_of_a_peer_subject() -> None:
    assert common_name(((("countryName", "DE"),), (("commonName", "front-proxy-client"),))) == "front-proxy-client"
    assert common_name(((("organizationName", "x"),),)) == ""
    assert common_name(None) is None
    assert common_name(()) is None

