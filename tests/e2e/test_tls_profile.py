"""CDIConfig `tlsSecurityProfile` is what cdi's servers offer, exactly, as `openssl s_client` sees them, and
a change of it reaches the running cdi-apiserver and upload proxy without a restart while each new upload
server is made with the profile of the moment.

On any cluster (`anycluster`): cdi-apiserver (its Service) and the upload proxy (the address users upload
to) under Old, Intermediate, Modern and Custom, each observed live, and an upload server made under each;
the profile the cluster had is put back at the end, and the servers observed to follow that too. Only on
`cdi up`: its embedded API server follows the profile as well, and the same holds with
`CDI_NO_EXTENSIONS=1` (which `cdi up` hands to its pods: the Python TLS path of the upload proxy and upload
servers).

The profile is set as an administrator (or HyperConverged) sets it: in the CDI resource's `spec.config`,
which the controller copies to CDIConfig."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from cdi.api import tlsprofile
from cdi.common.tlsfront import NO_EXTENSIONS_ENV
from tests.e2e.target import TARGET, External
from tests.e2e.uploading import proxy_url, upload_dv, wait_ready
from tests.e2e.workloads import new_namespace
from tests.support import tlsprobe
from tests.support.cluster import CdiUp, Kubectl, wait_for

pytestmark = pytest.mark.slow

Servers = dict[str, tuple[str, int]]
# what an upload server finds in its environment under each profile (CDI's names)
MIN_VERSIONS = {"Old": "VersionTLS10", "Intermediate": "VersionTLS12", "Modern": "VersionTLS13",
                "Custom": "VersionTLS12"}


def _cdi_servers(kubectl: Kubectl, cluster: CdiUp | External) -> Servers:
    """cdi-apiserver at its Service's address (what the API server calls), the upload proxy where users
    upload to."""
    service = kubectl.get("service", "cdi-api", TARGET.cdi_namespace)["spec"]
    proxy = urlsplit(proxy_url(kubectl, cluster))
    return {"cdi-apiserver": (service["clusterIP"], int(service["ports"][0]["port"])),
            "uploadproxy": (str(proxy.hostname), int(proxy.port or 443))}


def _current_profile(kubectl: Kubectl) -> dict[str, Any] | None:
    profile: dict[str, Any] | None = ((kubectl.get("cdi", "cdi").get("spec") or {}).get("config") or {}).get(
        "tlsSecurityProfile")
    return profile


def _set_profile(kubectl: Kubectl, profile: dict[str, Any] | None) -> None:
    """The whole profile replaced (a merge patch would keep the `custom` of a Custom one, which wins), or
    removed (None)."""
    spec = kubectl.get("cdi", "cdi").get("spec") or {}
    patch: list[dict[str, Any]]
    if profile is None:
        if "tlsSecurityProfile" not in (spec.get("config") or {}):
            return
        patch = [{"op": "remove", "path": "/spec/config/tlsSecurityProfile"}]
    elif "config" not in spec:
        patch = [{"op": "add", "path": "/spec/config", "value": {"tlsSecurityProfile": profile}}]
    else:
        patch = [{"op": "add", "path": "/spec/config/tlsSecurityProfile", "value": profile}]
    kubectl("patch", "cdi", "cdi", "--type", "json", "-p", json.dumps(patch))


def _offers(servers: Servers) -> dict[str, dict[str, set[str]]]:
    return {name: tlsprobe.offer(host, port).suites for name, (host, port) in servers.items()}


def _until_offered(servers: Servers, expected_suites: dict[str, set[str]], what: str, timeout: float = 60.0) -> None:
    """Polls until every server offers exactly `expected_suites`; at the deadline, the difference."""
    expected = {server: expected_suites for server in servers}
    deadline = time.monotonic() + timeout
    while (offered := _offers(servers)) != expected and time.monotonic() < deadline:
        time.sleep(0.2)
    assert offered == expected, f"not every server offers {what}"


def _upload_server(kubectl: Kubectl, namespace: str, dv: str) -> dict[str, Any]:
    """The one upload-server pod of the upload DataVolume `dv`, once it is ready."""
    kubectl.apply(upload_dv(dv, storage_class=TARGET.storage_class), "-n", namespace)
    wait_ready(kubectl, dv, namespace)
    pods = kubectl.json("get", "pods", "-n", namespace, "-l", "cdi.kubevirt.io=cdi-upload-server")["items"]
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    pod: dict[str, Any] = pods[0]
    return pod


@pytest.mark.anycluster
def test_cdi_servers_and_new_upload_servers_offer_exactly_each_profile(
        shared_cdi_up: CdiUp | External, shared_kubectl: Kubectl) -> None:
    kubectl = shared_kubectl
    servers = _cdi_servers(kubectl, shared_cdi_up)
    before = _current_profile(kubectl)
    try:
        for name in ("Modern", "Old", "Custom", "Intermediate"):
            profile = tlsprobe.profile(name)
            _set_profile(kubectl, profile)
            _until_offered(servers, tlsprobe.EXPECTED[name], name)
            # an upload server made now gets this profile, in its environment and on its port
            namespace = new_namespace(kubectl, f"tls-{name.lower()}")
            pod = _upload_server(kubectl, namespace, "upload")
            env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
            assert env["TLS_MIN_VERSION"] == MIN_VERSIONS[name], name
            assert env["TLS_CIPHERS"].split(",") == list(tlsprofile.select(profile).ciphers), name
            assert tlsprobe.offer(pod["status"]["podIP"], 8443).suites == tlsprobe.EXPECTED[name], name
            kubectl("delete", "dv", "upload", "-n", namespace, "--wait=false")
    finally:
        # as the cluster was; with no profile, Intermediate (CDI's default)
        _set_profile(kubectl, before)
        restored = tlsprobe.EXPECTED["Intermediate"] if before is None else None
        if restored is not None:
            _until_offered(servers, restored, "Intermediate again (no profile set)")


# -- `cdi up` only: its own API server, and the Python TLS path ------------------------------------------

@pytest.fixture(scope="module")
def python_tls_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[CdiUp, Kubectl]]:
    """`cdi up` whose upload proxy and upload servers serve through the ssl module (`CDI_NO_EXTENSIONS=1`)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(NO_EXTENSIONS_ENV, "1")
        up = CdiUp(tmp_path_factory.mktemp("tls-python") / "cdi")
        up.start()
    try:
        yield up, Kubectl(up.kubeconfig, tmp_path_factory.mktemp("kubectl-cache"))
    finally:
        up.stop()


def _embedded_servers(up: CdiUp, kubectl: Kubectl) -> Servers:
    """host and port of each TLS server `cdi up` runs: its API server, cdi-apiserver, the upload proxy."""
    server = yaml.safe_load(up.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    api = urlsplit(server)
    return {"kube-apiserver": (str(api.hostname), int(api.port or 443)), **_cdi_servers(kubectl, up)}


def test_each_server_offers_exactly_the_profile_and_follows_its_changes(
        python_tls_cluster: tuple[CdiUp, Kubectl]) -> None:
    up, kubectl = python_tls_cluster
    servers = _embedded_servers(up, kubectl)
    pid = up.proc.pid if up.proc else None
    # no profile set: Intermediate (TLS 1.1 and CBC suites refused)
    assert _offers(servers) == {name: tlsprobe.EXPECTED["Intermediate"] for name in servers}
    for name in ("Modern", "Old", "Custom", "Intermediate"):
        _set_profile(kubectl, tlsprobe.profile(name))
        _until_offered(servers, tlsprobe.EXPECTED[name], name)
    assert up.proc is not None and up.proc.pid == pid and up.proc.poll() is None  # the same process all along


def test_an_upload_server_is_made_with_the_profile_of_the_moment(python_tls_cluster: tuple[CdiUp, Kubectl]) -> None:
    _, kubectl = python_tls_cluster
    _set_profile(kubectl, tlsprobe.CUSTOM)
    wait_for(lambda: kubectl("get", "cdiconfig", "config", "-o", "jsonpath={.spec.tlsSecurityProfile.type}",
                             check=False).stdout == "Custom", 30, message="CDIConfig to carry the Custom profile")
    try:
        pod = _upload_server(kubectl, "default", "tls-upload")
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        assert env["TLS_MIN_VERSION"] == "VersionTLS12"
        assert env["TLS_CIPHERS"].split(",") == tlsprobe.CUSTOM["custom"]["ciphers"]  # type: ignore[index]
        assert tlsprobe.offer(pod["status"]["podIP"], 8443).suites == tlsprobe.EXPECTED["Custom"]
    finally:
        kubectl("delete", "dv", "tls-upload", "--wait=false", check=False)
        _set_profile(kubectl, tlsprobe.profile("Intermediate"))
