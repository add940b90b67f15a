"""CDIConfig `tlsSecurityProfile` is what `cdi up`'s servers offer, exactly, and a change of it reaches the
running cdi-apiserver, upload proxy and embedded API server without a restart (a new upload server gets
it in its environment), as `openssl s_client` sees them. Once with the C TLS path of the upload proxy and
upload servers and once with `CDI_NO_EXTENSIONS=1`, which `cdi up` hands to its pods.

The profile is set as an administrator (or HyperConverged) sets it: in the CDI resource's
`spec.config`, which the controller copies to CDIConfig."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
import yaml

from cdi.common.tlsfront import NO_EXTENSIONS_ENV
from tests.e2e.uploading import proxy_url, upload_dv, wait_ready
from tests.support import tlsprobe
from tests.support.cluster import CdiUp, Kubectl, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=["native", "python"])
def tls_cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[tuple[CdiUp, Kubectl]]:
    with pytest.MonkeyPatch.context() as patch:
        if request.param == "python":
            patch.setenv(NO_EXTENSIONS_ENV, "1")
        else:
            patch.delenv(NO_EXTENSIONS_ENV, raising=False)
        up = CdiUp(tmp_path_factory.mktemp(f"tls-{request.param}") / "cdi")
        up.start()
    try:
        yield up, Kubectl(up.kubeconfig, tmp_path_factory.mktemp("kubectl-cache"))
    finally:
        up.stop()


def _servers(up: CdiUp, kubectl: Kubectl) -> dict[str, tuple[str, int]]:
    """host and port of each TLS server `cdi up` runs: its API server, cdi-apiserver, the upload proxy."""
    server = yaml.safe_load(up.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    api = urlsplit(server)
    endpoints = kubectl.get("endpoints", "cdi-api", "cdi")
    cdi_api = (endpoints["subsets"][0]["addresses"][0]["ip"], endpoints["subsets"][0]["ports"][0]["port"])
    proxy = urlsplit(proxy_url(kubectl))
    return {"kube-apiserver": (str(api.hostname), int(api.port or 443)), "cdi-apiserver": cdi_api,
            "uploadproxy": (str(proxy.hostname), int(proxy.port or 443))}


def _set_profile(kubectl: Kubectl, name: str) -> None:
    """The whole profile replaced (a merge patch would keep the `custom` of a Custom one, which wins)."""
    patch = [{"op": "add", "path": "/spec/config/tlsSecurityProfile", "value": tlsprobe.profile(name)}]
    kubectl("patch", "cdi", "cdi", "--type", "json", "-p", json.dumps(patch))


def _offers(servers: dict[str, tuple[str, int]]) -> dict[str, dict[str, set[str]]]:
    return {name: tlsprobe.offer(host, port).suites for name, (host, port) in servers.items()}


def _until_offered(servers: dict[str, tuple[str, int]], profile: str, timeout: float = 60.0) -> None:
    """Polls until every server offers exactly `profile`; at the deadline, the difference."""
    expected = {server: tlsprobe.EXPECTED[profile] for server in servers}
    deadline = time.monotonic() + timeout
    while (offered := _offers(servers)) != expected and time.monotonic() < deadline:
        time.sleep(0.2)
    assert offered == expected, f"not every server offers {profile}"


def test_each_server_offers_exactly_the_profile_and_follows_its_changes(tls_cluster: tuple[CdiUp, Kubectl]) -> None:
    up, kubectl = tls_cluster
    servers = _servers(up, kubectl)
    pid = up.proc.pid if up.proc else None
    # no profile set: Intermediate (TLS 1.1 and CBC suites refused)
    assert _offers(servers) == {name: tlsprobe.EXPECTED["Intermediate"] for name in servers}
    for name in ("Modern", "Old", "Custom", "Intermediate"):
        _set_profile(kubectl, name)
        _until_offered(servers, name)
    assert up.proc is not None and up.proc.pid == pid and up.proc.poll() is None  # the same process all along


def test_an_upload_server_is_made_with_the_profile_of_the_moment(tls_cluster: tuple[CdiUp, Kubectl]) -> None:
    _, kubectl = tls_cluster
    _set_profile(kubectl, "Custom")
    wait_for(lambda: kubectl("get", "cdiconfig", "config", "-o", "jsonpath={.spec.tlsSecurityProfile.type}",
                             check=False).stdout == "Custom", 30, message="CDIConfig to carry the Custom profile")
    kubectl.apply(upload_dv("tls-upload"))
    try:
        wait_ready(kubectl, "tls-upload")
        pods = kubectl.json("get", "pods", "-n", "default", "-l", "cdi.kubevirt.io=cdi-upload-server")["items"]
        assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
        pod = pods[0]
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        assert env["TLS_MIN_VERSION"] == "VersionTLS12"
        assert env["TLS_CIPHERS"].split(",") == tlsprobe.CUSTOM["custom"]["ciphers"]  # type: ignore[index]
        assert tlsprobe.offer(pod["status"]["podIP"], 8443).suites == tlsprobe.EXPECTED["Custom"]
    finally:
        kubectl("delete", "dv", "tls-upload", "--wait=false", check=False)
        _set_profile(kubectl, "Intermediate")
