"""The controller's metrics as CDI's users alert on them, read from the `/metrics` URL `cdi up` prints:
an import's progress series (and ours, the rate and time left of its step) lives only while the import
runs, `kubevirt_cdi_datavolume_pending` counts the DataVolumes that wait on the default storage class,
`kubevirt_cdi_cr_ready` says the install is ready."""

from __future__ import annotations

import json
import re
import urllib.request

from tests.e2e.importing import datavolume, wait_phase
from tests.support.cluster import CdiUp, Kubectl, wait_for
from tests.support.images import Image
from tests.support.servers import FileServer

DEFAULT_CLASS = "storageclass.kubernetes.io/is-default-class"


def metrics(up: CdiUp) -> str:
    url = re.search(r"controller metrics (\S+)", up.log_path.read_text())
    assert url, "cdi up prints where the controller's metrics are"
    with urllib.request.urlopen(url.group(1), timeout=5) as resp:
        text: str = resp.read().decode()
        return text


def value(text: str, series: str) -> float | None:
    match = re.search(r"^" + re.escape(series) + r" (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else None


def progress_series(uid: str) -> str:
    return f'kubevirt_cdi_import_progress_total{{ownerUID="{uid}"}}'


def rate_series(name: str) -> str:
    """Ours: the rate of the step the DataVolume's worker is in (0 while it is held: stalled)."""
    return f'cdi_datavolume_step_rate_bytes_per_second{{datavolume="{name}",namespace="default",step="Transfer"}}'



def test_cdi_resource_ready(shared_cdi_up: CdiUp) -> None:
    wait_for(lambda: value(metrics(shared_cdi_up), "kubevirt_cdi_cr_ready") == 1.0, 30,
             message="kubevirt_cdi_cr_ready 1 once the CDI resource is Deployed")
    assert "# HELP kubevirt_cdi_cr_ready CDI install ready" in metrics(shared_cdi_up)


def test_process_series_say_what_the_controller_costs(shared_cdi_up: CdiUp) -> None:
    """The process series every Go controller exports (what a scale benchmark reads from the leader pod)."""
    text = metrics(shared_cdi_up)
    assert (value(text, "process_cpu_seconds_total") or 0) > 0
    assert (value(text, "process_resident_memory_bytes") or 0) > 10 << 20


def _stalled_import(k: Kubectl, up: CdiUp, server: FileServer, image: Image, name: str) -> str:
    """A DataVolume whose import is held a third of the way in, once the controller exports its progress."""
    server.close_gate(4 << 20)
    k.apply(datavolume(name, {"http": {"url": f"{server.url}/{image.name}"}}, "64Mi"))
    wait_phase(k, name, "ImportInProgress")
    uid: str = k.get("dv", name)["metadata"]["uid"]
    wait_for(lambda: (value(metrics(up), progress_series(uid)) or 0) > 0, 60,
             message=f"progress of {name} exported while it runs")
    wait_for(lambda: value(metrics(up), rate_series(name)) is not None, 60,
             message=f"the rate of {name}'s transfer exported while it runs")
    return uid


def test_no_progress_series_outlives_its_import(shared_cdi_up: CdiUp, shared_kubectl: Kubectl,
                                                gated_server: FileServer, images: dict[str, Image]) -> None:
    k, up, image = shared_kubectl, shared_cdi_up, images["raw.img"]
    finished = _stalled_import(k, up, gated_server, image, "finished")
    gated_server.open_gate()
    wait_phase(k, "finished", "Succeeded")
    wait_for(lambda: progress_series(finished) not in metrics(up) and rate_series("finished") not in metrics(up),
             30, message="the finished import's progress and rate series gone")

    deleted = _stalled_import(k, up, gated_server, image, "deleted")
    k("delete", "dv", "deleted")
    wait_for(lambda: progress_series(deleted) not in metrics(up) and rate_series("deleted") not in metrics(up), 30,
             message="the deleted DataVolume's progress and rate series gone")
    assert "kubevirt_cdi_import_progress_total{" not in metrics(up)
    assert "cdi_datavolume_step_rate_bytes_per_second{" not in metrics(up)


def test_pending_counts_datavolumes_waiting_on_the_default_class(cdi_up: CdiUp, kubectl: Kubectl) -> None:
    """CDI's rule (and its CDINoDefaultStorageClass alert): DataVolumes that name no storage class and are
    Pending, whether their claim waits unbound or was not created for want of access modes."""
    k = kubectl

    def pending() -> float | None:
        return value(metrics(cdi_up), "kubevirt_cdi_datavolume_pending")

    wait_for(lambda: pending() == 0.0, 30, message="nothing pending at first")
    k("annotate", "storageclass", "local", f"{DEFAULT_CLASS}-")

    with_modes = datavolume("with-modes", {"blank": {}}, "64Mi", api="pvc")
    k.apply(with_modes)
    wait_for(lambda: k.exists("pvc", "with-modes"), 30, message="a claim of no class, left unbound")
    assert wait_phase(k, "with-modes", "Pending")["status"]["phase"] == "Pending"
    wait_for(lambda: pending() == 1.0, 30, message="the DataVolume with an unbound claim counted")

    k.apply(datavolume("without-modes", {"blank": {}}, "64Mi"))
    k.apply(datavolume("named-class", {"blank": {}}, "64Mi", storage_class="no-such-class"))
    wait_phase(k, "without-modes", "Pending")
    wait_phase(k, "named-class", "Pending")
    wait_for(lambda: pending() == 2.0, 30, message="the DataVolume with no claim counted")
    assert pending() == 2.0, "a DataVolume naming its class does not wait on the default one"

    k("delete", "dv", "with-modes")
    wait_for(lambda: pending() == 1.0, 30, message="a deleted DataVolume no longer counted")
    k("annotate", "storageclass", "local", f"{DEFAULT_CLASS}=true")
    wait_phase(k, "without-modes", "Succeeded")
    wait_for(lambda: pending() == 0.0, 30, message="the DataVolume served by the default class no longer counted")
    assert json.loads(k("get", "dv", "named-class", "-o", "json").stdout)["status"]["phase"] == "Pending"
