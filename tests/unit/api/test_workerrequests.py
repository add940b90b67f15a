"""Each worker pod's request through the pod and back: the controller's side writes the container's `env`
(`to_env`), a kubelet resolves it (the embedded node's, with the Secrets and the pod's IP), and the program
in the pod reads it with the configuration reader it really runs (`ImporterConfig`, `UploadServerConfig`,
the clone source's `SourceConfig`). Whatever the controller asked must arrive; what cannot travel (a
Secret's name, which the pod sees as its contents) is said by each test."""

from __future__ import annotations

import base64
import os
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cdi.api import env, tlsprofile
from cdi.api import upload as names
from cdi.api.clonesourcerequest import CloneSourceRequest, source_path
from cdi.api.envvalues import EnvError
from cdi.api.importrequest import ImporterOptions, ImportRequest
from cdi.api.targetvolume import TargetVolume, default_path, preallocation_wanted, requested_preallocation
from cdi.api.uploadrequest import UploadServerRequest
from cdi.cloner.source import CloneError, SourceConfig
from cdi.controller.dataimportcron import POLL_RETRY_BUDGET
from cdi.controller.datavolume.importpod import IMPORTER_CONTAINER, WorkerSettings, importer_pod
from cdi.embedded.node.environment import build_env
from cdi.importer.config import ImporterConfig, default_read_timeout
from cdi.importer.errors import ImporterError, Reason
from cdi.importer.retry import DEFAULT_BUDGET
from cdi.uploadserver.config import ConfigError, UploadServerConfig
from tests.unit.api.test_importrequest import SOURCES

POD_IP = "10.1.2.3"
SECRETS = {"creds": {"accessKeyId": "user", "secretKey": "pw"}, "pull": {"accessKeyId": "u2", "secretKey": "p2"},
           "s3-creds": {"accessKeyId": "AKID", "secretKey": "s3"},
           "clone-pod": {"tls.crt": "-----CERT-----", "tls.key": "-----KEY-----"}}


def kubelet(variables: list[dict[str, Any]], **extra: str) -> dict[str, str]:
    """The environment the program in the pod sees (`extra`: what a pod spec does not set, as a test's paths)."""
    pod = {"metadata": {"name": "p", "namespace": "ns"}, "status": {"podIP": POD_IP}}

    def secret(namespace: str, name: str) -> dict[str, Any] | None:
        data = SECRETS.get(name)
        return None if data is None else {"data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}

    return {**build_env(pod, {"env": variables}, secret, lambda namespace, name: None), **extra}


VOLUMES = {
    "filesystem": TargetVolume(size="1Gi", filesystem_overhead="0.055", preallocation=True, owner_uid="dv-uid"),
    "block": TargetVolume(path=default_path(block=True), size="10G", owner_uid="claim-uid"),
}


# -- the importer ---------------------------------------------------------------------------------------

def claim(request: ImportRequest, volume: TargetVolume) -> dict[str, Any]:
    """A claim the import reconciler would serve, owned by a DataVolume when the volume's owner is one."""
    owners = [{"kind": "DataVolume", "name": "disk", "uid": volume.owner_uid}] if volume.owner_uid == "dv-uid" else []
    return {"metadata": {"name": "disk", "namespace": "ns", "uid": "claim-uid", "ownerReferences": owners,
                         "annotations": request.to_annotations()},
            "spec": {"resources": {"requests": {"storage": volume.size}},
                     "volumeMode": "Block" if volume.block else "Filesystem"}}


@pytest.mark.parametrize("source", SOURCES.values(), ids=SOURCES.keys())
@pytest.mark.parametrize("volume", VOLUMES.values(), ids=VOLUMES.keys())
def test_the_importer_reads_what_its_pod_was_asked(source: dict[str, Any], volume: TargetVolume,
                                                   tmp_path: Path) -> None:
    request = ImportRequest.from_source(source)
    pod = importer_pod(claim(request, volume), request, WorkerSettings(),
                       filesystem_overhead=volume.filesystem_overhead, preallocation=volume.preallocation)
    importer = next(c for c in pod["spec"]["containers"] if c["name"] == IMPORTER_CONTAINER)
    environ = kubelet(importer["env"], **{env.DATA_DIR: str(tmp_path)})
    # the Secret's and ConfigMaps' names stay with the pod spec: the importer sees their contents
    expected = replace(request, secret="", cert_configmap="", secret_extra_headers=())
    if request.node_pull:  # the importer reads the disk the user's image serves in the pod
        expected = replace(expected, source=env.SOURCE_HTTP, endpoint=f"http://{POD_IP}:8100/disk.img")
    assert ImportRequest.from_environ(environ) == expected
    config = ImporterConfig.from_env(environ)
    assert (config.source, config.endpoint, config.content_type, config.insecure_tls, config.registry_arch) == \
        (expected.source, expected.endpoint, expected.content_type, expected.insecure_skip_verify,
         expected.registry_arch)
    assert config.extra_headers == list(request.extra_headers)
    assert (config.checksum.algorithm + ":" + config.checksum.hexdigest if config.checksum else "") == request.checksum
    credentials = SECRETS.get(request.secret, {}) if request.source != env.SOURCE_GCS else {}
    assert (config.access_key, config.secret_key) == (credentials.get("accessKeyId", ""),
                                                      credentials.get("secretKey", ""))
    assert (config.image_size, config.filesystem_overhead, config.preallocation, config.owner_uid) == \
        (volume.size_bytes, volume.filesystem_overhead, volume.preallocation, volume.owner_uid)
    assert config.pod_ip == POD_IP
    assert ImporterOptions.from_environ(environ) == ImporterOptions()  # no proxy, the importer's own budget


# -- the importer's options: proxy, retry budget, poll ----------------------------------------------------

IMPORT_PROXY = {"HTTPProxy": "http://proxy.example:3128", "HTTPSProxy": "http://user:pw@proxy.example:3129",
                "noProxy": ".cluster.local,10.0.0.0/8", "trustedCAProxy": "proxy-ca"}
OPTIONS = {
    "CDI's defaults": (WorkerSettings(), False, ImporterOptions()),
    "through CDIConfig's proxy, trusting its CA, with the controller's retry budget": (
        WorkerSettings(import_proxy=IMPORT_PROXY, retry_budget=42.5), False,
        ImporterOptions(http_proxy="http://proxy.example:3128", https_proxy="http://user:pw@proxy.example:3129",
                        no_proxy=".cluster.local,10.0.0.0/8", proxy_cert_dir="/proxycerts", retry_budget=42.5)),
    "a DataImportCron's poller": (  # as DataImportCronReconciler._start_poller builds it
        WorkerSettings(import_proxy={"HTTPSProxy": "http://proxy.example:3129"}, retry_budget=POLL_RETRY_BUDGET),
        True, ImporterOptions(https_proxy="http://proxy.example:3129", retry_budget=30.0, poll=True)),
}


@pytest.mark.parametrize(("settings", "poll", "expected"), OPTIONS.values(), ids=OPTIONS.keys())
def test_the_importer_reads_the_options_its_pod_was_given(settings: WorkerSettings, poll: bool,
                                                          expected: ImporterOptions, tmp_path: Path) -> None:
    request = ImportRequest.from_source({"http": {"url": "https://images.example/disk.qcow2"}})
    pod = importer_pod(claim(request, VOLUMES["filesystem"]), request, settings, poll=poll)
    importer = next(c for c in pod["spec"]["containers"] if c["name"] == IMPORTER_CONTAINER)
    environ = kubelet(importer["env"], **{env.DATA_DIR: str(tmp_path)})
    assert ImporterOptions.from_environ(environ) == expected
    config = ImporterConfig.from_env(environ)
    budget = expected.retry_budget or DEFAULT_BUDGET
    assert (config.retry.budget, config.read_timeout, config.poll) == \
        (budget, default_read_timeout(budget), expected.poll)
    assert config.proxies == {key: value for key, value in (("http", expected.http_proxy),
                                                            ("https", expected.https_proxy),
                                                            ("no", expected.no_proxy)) if value}
    # the proxy's CA bundle is mounted where the importer looks (it looks in /proxycerts when told nothing)
    assert config.proxy_cert_dir == Path(expected.proxy_cert_dir or env.PROXY_CERT_DIR_DEFAULT)
    mounts = {m["mountPath"] for m in importer.get("volumeMounts") or []}
    assert (env.PROXY_CERT_DIR_DEFAULT in mounts) == bool(expected.proxy_cert_dir)


@pytest.mark.parametrize("environ", [
    {"HTTPS_PROXY": "http://upper:1"},
    {"https_proxy": "http://lower:1", "HTTPS_PROXY": "http://upper:1", "NO_PROXY": "example.org"},
    {"https_proxy": "", "HTTPS_PROXY": "http://upper:1", "http_proxy": "http://lower:2"},
], ids=["upper case", "lower case first", "an empty lower case one unsets"])
def test_the_importer_reads_proxy_variables_as_urllib_does(environ: dict[str, str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The options' reader replaced urllib's reading of the process environment in the importer's clients."""
    for name in list(os.environ):
        if name.lower().endswith("_proxy") or name == "REQUEST_METHOD":
            monkeypatch.delenv(name)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    expected = {k: v for k, v in urllib.request.getproxies_environment().items() if k in ("http", "https", "no")}
    assert ImporterOptions.from_environ(environ).proxies == expected


@pytest.mark.parametrize(("variable", "value"), [(env.RETRY_BUDGET, "soon"), (env.RETRY_BUDGET, "-1"),
                                                 (env.READ_TIMEOUT, "0"), (env.POLL, "maybe")])
def test_options_that_are_no_number_or_boolean_are_the_importers_configuration_error(
        variable: str, value: str, tmp_path: Path) -> None:
    with pytest.raises(ImporterError, match=variable) as caught:
        ImporterConfig.from_env({env.SOURCE: "blank", env.DATA_DIR: str(tmp_path), variable: value})
    assert caught.value.reason == Reason.INVALID_CONFIGURATION


# -- the upload server ----------------------------------------------------------------------------------

UPLOADS = {
    "filesystem": UploadServerRequest(volume=VOLUMES["filesystem"]),
    "block, resume record on an emptyDir": UploadServerRequest(volume=VOLUMES["block"],
                                                               state_dir=env.UPLOAD_STATE_DIR_DEFAULT),
    "a clone's target, archive, modern TLS": UploadServerRequest(
        volume=VOLUMES["filesystem"], content_type=env.CONTENT_ARCHIVE, client_name="ns/src-ns/target",
        tls_profile=tlsprofile.PROFILES[tlsprofile.MODERN]),
    "outside a pod, tuned": UploadServerRequest(
        volume=TargetVolume(path="/tmp/volume/disk.img", size="5Mi"), cert_file="/tmp/tls.crt",
        key_file="/tmp/tls.key", client_ca_file="", listen_address="127.0.0.1", listen_port=18443,
        idle_timeout=2.5, checkpoint_bytes=0),
    "an expected checksum": UploadServerRequest(volume=VOLUMES["filesystem"], checksum="sha512:" + "ab" * 64),
}


@pytest.mark.parametrize("request_", UPLOADS.values(), ids=UPLOADS.keys())
def test_the_upload_server_reads_what_its_pod_was_asked(request_: UploadServerRequest) -> None:
    environ = kubelet(request_.to_env())
    assert UploadServerRequest.from_environ(environ) == replace(request_, pod_ip=POD_IP)
    config = UploadServerConfig.from_env(environ)
    volume = request_.volume
    assert (str(config.destination), config.is_block, config.image_size, config.filesystem_overhead,
            config.preallocation, config.owner_uid) == \
        (volume.path, volume.block, volume.size_bytes, volume.filesystem_overhead, volume.preallocation,
         volume.owner_uid)
    assert (config.content_type, config.client_name, str(config.cert_file), str(config.key_file)) == \
        (request_.content_type, request_.client_name, request_.cert_file, request_.key_file)
    assert config.client_ca_file == (Path(request_.client_ca_file) if request_.client_ca_file else None)
    assert config.tls_profile == request_.tls_profile
    assert (config.listen_host, config.listen_port) == (request_.listen_address or POD_IP, request_.listen_port)
    assert config.idle_timeout == (request_.idle_timeout or 120.0)
    assert config.checkpoint_bytes == (64 << 20 if request_.checkpoint_bytes is None else request_.checkpoint_bytes)
    assert str(config.checksum or "") == request_.checksum


def test_the_upload_servers_checksum_is_normalised_and_a_bad_one_refused() -> None:
    environ = kubelet(UploadServerRequest(volume=VOLUMES["filesystem"]).to_env())
    spelled = UploadServerRequest.from_environ({**environ, env.UPLOAD_CHECKSUM: " SHA256:" + "AB" * 32})
    assert spelled.checksum == "sha256:" + "ab" * 32
    with pytest.raises(EnvError, match="UPLOAD_CHECKSUM: unsupported hash algorithm 'crc32'"):
        UploadServerRequest.from_environ({**environ, env.UPLOAD_CHECKSUM: "crc32:00"})


def test_the_upload_servers_environment_has_cdis_names() -> None:
    variables = UploadServerRequest(volume=VOLUMES["block"], state_dir="/upload-state").to_env()
    assert {v["name"]: v.get("value") for v in variables} == {
        "TLS_KEY_FILE": "/etc/tls/tls.key", "TLS_CERT_FILE": "/etc/tls/tls.crt", "CLIENT_CERT_FILE": "/etc/tls/ca.crt",
        "CLIENT_NAME": names.CLIENT_NAME, "UPLOAD_IMAGE_SIZE": "10G", "FILESYSTEM_OVERHEAD": "0",
        "PREALLOCATION": "false", "DESTINATION": "/dev/cdi-block-volume", "CONTENT_TYPE": "kubevirt",
        "OWNER_UID": "claim-uid", "POD_IP": None, "TLS_CIPHERS": ",".join(tlsprofile.DEFAULT.ciphers),
        "TLS_MIN_VERSION": "VersionTLS12", "UPLOAD_STATE_DIR": "/upload-state"}


# -- the clone source -----------------------------------------------------------------------------------

@pytest.mark.parametrize("block", [False, True], ids=["filesystem", "block"])
def test_the_clone_source_reads_what_its_pod_was_asked(block: bool) -> None:
    request = CloneSourceRequest(upload_url="https://10.96.0.7:8443/v1beta1/upload", server_ca="-----CA-----",
                                 server_name="cdi-upload-tmp.ns.svc", client_secret="clone-pod",
                                 volume=TargetVolume(path=source_path(block), owner_uid="dv-uid"))
    environ = kubelet(request.to_env())
    assert CloneSourceRequest.from_environ(environ) == replace(
        request, client_secret="", client_cert="-----CERT-----", client_key="-----KEY-----", pod_ip=POD_IP)
    config = SourceConfig.from_env(environ)
    assert (config.upload_url, config.server_name, config.server_ca, config.client_cert, config.client_key) == \
        (request.upload_url, request.server_name, request.server_ca, "-----CERT-----", "-----KEY-----")
    assert (config.block, str(config.source_path), config.owner_uid, config.pod_ip) == \
        (block, request.volume.path, "dv-uid", POD_IP)
    assert {v["name"]: v.get("value") for v in request.to_env()} == {
        "CLIENT_KEY": None, "CLIENT_CERT": None, "SERVER_CA_CERT": "-----CA-----", "UPLOAD_URL": request.upload_url,
        "UPLOAD_SERVER_NAME": "cdi-upload-tmp.ns.svc", "OWNER_UID": "dv-uid",
        "VOLUME_MODE": "block" if block else "filesystem",
        "MOUNT_POINT": "/dev/cdi-block-volume" if block else "/run/cdi/clone/source", "POD_IP": None}


def test_a_clone_source_without_its_certificate_fails_for_good() -> None:
    with pytest.raises(CloneError, match="missing CLIENT_CERT, CLIENT_KEY") as caught:
        SourceConfig.from_env({env.UPLOAD_URL: "https://x", env.SERVER_CA_CERT: "ca"})
    assert not caught.value.retryable


# -- preallocation: one rule, one reading ---------------------------------------------------------------

@pytest.mark.parametrize("value", ["maybe", "yes", "on"])
def test_preallocation_that_is_no_boolean_is_refused_by_both_programs(value: str, tmp_path: Path) -> None:
    """It used to be refused by the importer and silently read as "no" by the upload server."""
    importer = {env.SOURCE: "blank", env.PREALLOCATION: value, env.DATA_DIR: str(tmp_path)}
    with pytest.raises(ImporterError, match="PREALLOCATION") as caught:
        ImporterConfig.from_env(importer)
    assert caught.value.reason == Reason.INVALID_CONFIGURATION
    server = {env.TLS_CERT_FILE: "/t.crt", env.TLS_KEY_FILE: "/t.key", env.PREALLOCATION: value}
    with pytest.raises(ConfigError, match="PREALLOCATION") as refused:
        UploadServerConfig.from_env(server)
    assert refused.value.reason == Reason.INVALID_CONFIGURATION
    with pytest.raises(EnvError, match="is not a boolean"):
        TargetVolume.from_environ({env.PREALLOCATION: value}, size_var=env.IMAGE_SIZE, path="/data/disk.img")


@pytest.mark.parametrize(("value", "expected"), [("true", True), ("1", True), ("True", True), ("false", False),
                                                 ("0", False), ("", False)])
def test_preallocation_reads_as_gos_parsebool(value: str, expected: bool) -> None:
    volume = TargetVolume.from_environ({env.PREALLOCATION: value}, size_var=env.IMAGE_SIZE, path="/data/disk.img")
    assert volume.preallocation is expected


def test_preallocation_is_what_the_datavolume_asks_else_cdiconfigs() -> None:
    assert preallocation_wanted(None, {"preallocation": True}) is True
    assert preallocation_wanted(None, {}) is False
    assert preallocation_wanted(False, {"preallocation": True}) is False
    assert preallocation_wanted(True, {}) is True
    claim = "cdi.kubevirt.io/storage.preallocation.requested"
    assert requested_preallocation({}) is None
    assert requested_preallocation({claim: "true"}) is True
    assert requested_preallocation({claim: "false"}) is False
    assert requested_preallocation({claim: "garbage"}) is False  # as CDI: no boolean asks for none
