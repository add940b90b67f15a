"""Deleting a DataVolume stops its import at once (issue #14, point 5): the controller deletes the
importer pod as soon as the claim is being deleted, as CDI does, instead of letting it download to
the end (or wait on a stalled server) while the claim sits `Terminating` behind pvc-protection."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.importing import datavolume, wait_phase
from tests.support.cluster import CdiUp, Kubectl, wait_for
from tests.support.images import Image
from tests.support.servers import FileServer


@pytest.fixture
def stalled_server(served_dir: Path) -> Iterator[FileServer]:
    server = FileServer(served_dir)
    server.close_gate(4 << 20)  # every byte past 4 MiB waits for a gate the test never opens
    yield server
    server.close()


def test_deleting_a_datavolume_stops_its_import(
        tmp_path: Path, stalled_server: FileServer, images: dict[str, Image]) -> None:
    up = CdiUp(tmp_path / "cdi")
    up.start()
    k = Kubectl(up.kubeconfig, tmp_path / "kc")
    image = images["raw.img"]
    try:
        k.apply(datavolume("doomed", {"http": {"url": f"{stalled_server.url}/{image.name}"}}, "64Mi"))
        wait_phase(k, "doomed", "ImportInProgress")
        wait_for(lambda: stalled_server.served(image.name) >= 4 << 20, 60, message="import stalled at the gate")
        pods = k.json("get", "pods", "-l", "cdi.kubevirt.io=importer")["items"]
        assert [p["metadata"]["name"] for p in pods] == ["importer-doomed"]

        k("delete", "dv", "doomed", "--wait=false")

        def gone() -> bool:
            return not k.exists("pod", "importer-doomed") and not k.exists("pvc", "doomed")
        # the importer would otherwise sit on the stalled response for its read timeout (a minute),
        # then retry, with the claim Terminating all along
        wait_for(gone, 20, interval=0.2, message="importer pod and claim gone after the DataVolume was deleted")
        assert not k.exists("dv", "doomed")
    except BaseException:
        print(up.recent_logs())
        raise
    finally:
        stalled_server.open_gate()
        up.stop()
