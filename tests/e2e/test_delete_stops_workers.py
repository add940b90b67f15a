"""Deleting a DataVolume stops its work at once (issue #14, point 5): the controller deletes the
worker pod as soon as the claim is being deleted, as CDI does, instead of letting an importer
download to the end (or wait on a stalled server), or an upload server wait for an upload nobody
will send, while the claim sits `Terminating` behind pvc-protection."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.importing import datavolume, wait_phase
from tests.e2e.uploading import upload_dv, wait_ready
from tests.support.cluster import CdiUp, Kubectl, wait_for
from tests.support.images import Image
from tests.support.servers import FileServer


@pytest.fixture
def stalled_server(served_dir: Path) -> Iterator[FileServer]:
    server = FileServer(served_dir)
    server.close_gate(4 << 20)  # every byte past 4 MiB waits for a gate the test never opens
    yield server
    server.open_gate()
    server.close()


# the legacy path: the workers are named after the DataVolume's claim (a populator's after the prime's)
LEGACY = {"cdi.kubevirt.io/storage.usePopulator": "false"}


def delete_and_expect_gone(k: Kubectl, name: str, pod: str) -> None:
    k("delete", "dv", name, "--wait=false")

    def gone() -> bool:
        return not k.exists("pod", pod) and not k.exists("pvc", name)
    wait_for(gone, 20, interval=0.2, message=f"pod {pod} and claim {name} gone after the DataVolume was deleted")
    assert not k.exists("dv", name)


def test_deleting_a_datavolume_stops_its_import(
        shared_cdi_up: CdiUp, shared_kubectl: Kubectl, stalled_server: FileServer, images: dict[str, Image]) -> None:
    k = shared_kubectl
    image = images["raw.img"]
    k.apply(datavolume("doomed", {"http": {"url": f"{stalled_server.url}/{image.name}"}}, "64Mi", annotations=LEGACY))
    wait_phase(k, "doomed", "ImportInProgress")
    wait_for(lambda: stalled_server.served(image.name) >= 4 << 20, 60, message="import stalled at the gate")
    pods = k.json("get", "pods", "-l", "cdi.kubevirt.io=importer")["items"]
    assert [p["metadata"]["name"] for p in pods] == ["importer-doomed"]
    # the importer would otherwise sit on the stalled response for its read timeout (a minute), then
    # retry, with the claim Terminating all along
    delete_and_expect_gone(k, "doomed", "importer-doomed")


def test_deleting_an_upload_datavolume_stops_its_upload_server(shared_cdi_up: CdiUp, shared_kubectl: Kubectl) -> None:
    k = shared_kubectl
    unwanted = upload_dv("unwanted")
    unwanted["metadata"]["annotations"] = LEGACY
    k.apply(unwanted)
    wait_ready(k, "unwanted")
    assert k.exists("pod", "cdi-upload-unwanted")
    delete_and_expect_gone(k, "unwanted", "cdi-upload-unwanted")
