"""Integrity for every source, recorded (issue 30, item 1), end to end on `cdi up`: an upload checked against the
checksum its DataVolume declares (`extensions.cdi.dev/upload.checksum`, written by `cdi image-upload
--checksum`), a mismatch that fails the DataVolume `ChecksumMismatch` as an import's does and never succeeds,
and the sha256 and format of what every import and upload received, recorded on the DataVolume."""

from __future__ import annotations

import pytest

from tests.e2e.importing import EXT, condition, datavolume, phase, read_back, recorded, wait_phase, with_record
from tests.e2e.target import External
from tests.e2e.uploading import image_upload
from tests.support.cluster import CdiUp, Kubectl, wait_for
from tests.support.images import Image, file_name
from tests.support.servers import FileServer


def events_of(k: Kubectl, name: str) -> list[tuple[str, str]]:
    items = k.json("get", "events", "--field-selector", f"involvedObject.name={name}")["items"]
    return [(e["reason"], e["message"]) for e in items]


@pytest.mark.anycluster
def test_an_upload_with_the_right_checksum_succeeds_and_records_what_it_received(
        cluster: CdiUp | External, k: Kubectl, images: dict[str, Image]) -> None:
    image = images[file_name("qcow2")]
    checksum = f"sha256:{image.file_sha256}"
    result = image_upload(cluster, "dv", "verified-up", "--size", "64Mi", "--image-path", str(image.path),
                          "--checksum", checksum.upper())
    assert result.returncode == 0, result.stdout + result.stderr
    assert "result     DataVolume default/verified-up Succeeded" in result.stdout
    dv = with_record(k, "verified-up")
    assert recorded(dv) == {"upload.checksum": checksum, "source.sha256": image.file_sha256, "source.format": "qcow2"}
    pvc = k.get("pvc", "verified-up")["metadata"]["annotations"]
    assert pvc["cdi.kubevirt.io/storage.import.verifiedChecksum"] == checksum
    assert read_back(k, "verified-up", image.virtual_size) == image.sha256


@pytest.mark.anycluster
def test_an_upload_with_a_wrong_checksum_fails_with_checksum_mismatch_and_never_succeeds(
        cluster: CdiUp | External, k: Kubectl, images: dict[str, Image]) -> None:
    image = images[file_name("raw")]
    wrong = "sha256:" + "0" * 64
    result = image_upload(cluster, "dv", "mismatch-up", "--size", "64Mi", "--image-path", str(image.path),
                          "--checksum", wrong)
    assert result.returncode != 0, result.stdout
    assert "ChecksumMismatch" in result.stderr and image.file_sha256 in result.stderr, result.stderr
    assert "Succeeded" not in result.stdout
    dv = wait_phase(k, "mismatch-up", "Failed", 60)
    running = condition(dv, "Running")
    assert running["status"] == "False" and running["reason"] == "ChecksumMismatch", running
    assert image.file_sha256 in running["message"]
    assert "source.sha256" not in recorded(dv)
    wait_for(lambda: any(reason == "ChecksumMismatch" or "ChecksumMismatch" in message
                         for reason, message in events_of(k, "mismatch-up")), 30, message="a ChecksumMismatch event")
    wait_for(lambda: not k.exists("pod", "cdi-upload-mismatch-up"), 30, message="the failed upload pod removed")
    assert phase(k, "mismatch-up") == "Failed"  # and it stays so: nothing restarts the upload


def test_an_existing_volume_must_declare_the_checksum_the_client_is_given(
        cluster: CdiUp, k: Kubectl, images: dict[str, Image]) -> None:
    """A checksum only on the command line would be checked by nobody: the upload server trusts only the
    DataVolume or claim the user wrote."""
    image = images[file_name("raw")]
    k.apply({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "metadata": {"name": "undeclared"},
             "spec": {"source": {"upload": {}}, "storage": {"resources": {"requests": {"storage": "64Mi"}}}}})
    result = image_upload(cluster, "dv", "undeclared", "--no-create", "--image-path", str(image.path),
                          "--checksum", f"sha256:{image.file_sha256}")
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"{EXT}upload.checksum" in result.stderr and "expects no checksum" in result.stderr
    refused = k("annotate", "dv", "undeclared", f"{EXT}upload.checksum=crc32:00", check=False)
    assert refused.returncode != 0 and "Invalid checksum format" in refused.stderr


@pytest.mark.anycluster
@pytest.mark.parametrize(("name", "fmt"), [("qcow2.qcow2", "qcow2"), ("raw.img.xz", "raw.xz")])
def test_an_http_import_records_the_digest_and_format_it_received(
        k: Kubectl, range_server: FileServer, images: dict[str, Image], name: str, fmt: str) -> None:
    image = images[name]
    dv_name = "rec-" + name.replace(".", "-")
    k.apply(datavolume(dv_name, {"http": {"url": f"{range_server.url}/{image.name}"}}, "64Mi"))
    wait_phase(k, dv_name, "Succeeded")
    dv = with_record(k, dv_name)
    assert recorded(dv) == {"source.sha256": image.file_sha256, "source.format": fmt}
    assert read_back(k, dv_name, image.virtual_size) == image.sha256
