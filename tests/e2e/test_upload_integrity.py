"""Through `cdi up`'s upload proxy (issue #14): a 64 MiB image sent every way a request body can arrive
lands on the volume byte for byte (sha256 read back by a pod), and a body that ends early fails its
request and never makes the DataVolume succeed. A piped upload (`curl -T -`, chunked) once answered 200
within 0.1 s with only its first few hundred KB on a volume that went `Succeeded`."""

from __future__ import annotations

import hashlib
import os
import ssl
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.e2e.importing import phase, read_back, wait_phase
from tests.e2e.uploading import curl, proxy_ca, proxy_url, token, upload_dv, wait_ready
from tests.support import rawhttp
from tests.support.cluster import CdiUp, Kubectl, wait_for
from tests.support.rawhttp import CUTS, WAYS, Framing, way_id

IMAGE = os.urandom((64 << 20) + 777)
SHA256 = hashlib.sha256(IMAGE).hexdigest()
SIZE = "100Mi"


def _ready(k: Kubectl, name: str, size: str = SIZE, annotations: dict[str, str] | None = None) -> str:
    dv = upload_dv(name, size)
    if annotations:
        dv["metadata"]["annotations"] = annotations
    k.apply(dv)
    wait_ready(k, name)
    return token(k, name)


def _send(cluster: CdiUp, k: Kubectl, bearer: str, path: str, framing: Framing, image: bytes = IMAGE,
          cut_at: int | None = None) -> rawhttp.Answer:
    url = urlsplit(proxy_url(k))
    context = ssl.create_default_context(cafile=str(proxy_ca(cluster)))
    return rawhttp.post((url.hostname or "", url.port or 443), context, url.hostname or "", path, image, framing,
                        headers={"Authorization": f"Bearer {bearer}"}, cut_at=cut_at)


def _idle(cluster: CdiUp, k: Kubectl, bearer: str) -> bool:
    status, _, headers = curl(cluster, k, "/v1beta1/upload-async", "-I", bearer=bearer)
    return status == 200 and headers.get("upload-state") == "idle"


@pytest.mark.parametrize("way", WAYS, ids=way_id)
def test_every_way_a_body_arrives_lands_byte_for_byte(cluster: CdiUp, k: Kubectl, way: tuple[str, Framing]) -> None:
    path, framing = way
    name = f"way-{WAYS.index(way)}"
    answer = _send(cluster, k, _ready(k, name), path, framing)
    assert answer.status == 200, answer
    wait_phase(k, name, "Succeeded", 120)
    assert read_back(k, name, len(IMAGE)) == SHA256


@pytest.mark.parametrize("way", CUTS, ids=way_id)
def test_a_body_that_ends_early_fails_and_the_datavolume_does_not_succeed(cluster: CdiUp, k: Kubectl,
                                                                          way: tuple[str, Framing]) -> None:
    path, framing = way
    name = f"cut-{CUTS.index(way)}"
    bearer = _ready(k, name)
    answer = _send(cluster, k, bearer, path, framing, cut_at=rawhttp.framed_size(IMAGE, framing) // 2 + 3)
    assert answer.status != 200, answer
    # the upload server takes a new upload again (a server that took the cut body as whole would be done)
    wait_for(lambda: _idle(cluster, k, bearer), 60, message="the upload server ready for another upload")
    assert phase(k, name) == "UploadReady"
    answer = _send(cluster, k, bearer, path, framing)  # the whole body now: nothing of the cut one is left
    assert answer.status == 200, answer
    wait_phase(k, name, "Succeeded", 120)
    assert read_back(k, name, len(IMAGE)) == SHA256


def test_a_piped_upload_with_curl(cluster: CdiUp, k: Kubectl, tmp_path: Path) -> None:
    """What a user types: `... | curl -T -` sends the image chunked, of a size nobody announced."""
    bearer = _ready(k, "piped")
    image = tmp_path / "disk.img"
    image.write_bytes(IMAGE)
    with image.open("rb") as stdin:
        result = subprocess.run(["curl", "-sS", "--fail-with-body", "--cacert", str(proxy_ca(cluster)), "-X", "POST",
                                 "-T", "-", "-H", f"Authorization: Bearer {bearer}",
                                 proxy_url(k) + "/v1beta1/upload"], stdin=stdin, capture_output=True, timeout=120,
                                check=False)
    assert result.returncode == 0, result.stderr
    wait_phase(k, "piped", "Succeeded", 120)
    assert read_back(k, "piped", len(IMAGE)) == SHA256


def test_a_chunked_body_larger_than_the_volume_is_refused(cluster: CdiUp, k: Kubectl) -> None:
    bearer = _ready(k, "too-large", "64Mi")
    answer = _send(cluster, k, bearer, "/v1beta1/upload", Framing(chunk=65536), image=IMAGE * 2)
    assert answer.status == 400 and "larger than the usable space" in answer.text, answer
    wait_for(lambda: _idle(cluster, k, bearer), 60, message="the upload server ready for another upload")
    assert phase(k, "too-large") == "UploadReady"


def test_both_content_length_and_chunked_is_refused(cluster: CdiUp, k: Kubectl) -> None:
    """Which header frames the body is what request smuggling plays on: the proxy refuses to guess."""
    bearer = _ready(k, "ambiguous")
    framing = Framing(chunk=65536, extra_headers=(("Content-Length", "1000"),))
    answer = _send(cluster, k, bearer, "/v1beta1/upload", framing, image=IMAGE[:1 << 20])
    assert answer.status == 400 and "ambiguous" in answer.text, answer
    assert phase(k, "ambiguous") == "UploadReady"


def test_long_names_that_share_a_prefix_get_their_own_upload_servers(cluster: CdiUp, k: Kubectl) -> None:
    """DataVolume names may be 253 characters long; a Service name only 63. Cut at 63, two names that share
    their first 52 characters shared one upload Service, and one's upload could land on the other's volume."""
    prefix = "golden-image-for-the-team-that-runs-the-windows-builds-"
    names = [prefix + "a", prefix + "b"]
    images = {name: os.urandom(4 << 20) for name in names}
    # the legacy path, where the upload server is named after the claim (a populator's after its prime)
    legacy = {"cdi.kubevirt.io/storage.usePopulator": "false"}
    bearers = {name: _ready(k, name, "16Mi", legacy) for name in names}  # both upload servers up at once
    services = k.json("get", "svc", "-l", "app=containerized-data-importer", "-o", "json")["items"]
    service_names = {item["metadata"]["name"] for item in services}
    assert len([s for s in service_names if s.startswith("cdi-upload-golden")]) == 2
    assert all(len(s) <= 63 for s in service_names), service_names
    for name in names:
        answer = _send(cluster, k, bearers[name], "/v1beta1/upload", Framing(), image=images[name])
        assert answer.status == 200, answer
    for name in names:
        wait_phase(k, name, "Succeeded", 120)
        assert read_back(k, name, 4 << 20) == hashlib.sha256(images[name]).hexdigest()
