"""CDI's components as separate processes against a cluster, as on a real one: `cdi controller` and
`cdi apiserver` with only a kubeconfig, next to a control plane running without CDI (`--no-cdi`)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.importing import datavolume, wait_phase
from tests.support.cluster import ROOT, CdiUp, Kubectl, wait_for


@pytest.fixture
def bare(tmp_path: Path) -> Iterator[tuple[CdiUp, Kubectl]]:
    up = CdiUp(tmp_path / "cdi", "--no-cdi")
    up.start()
    kubectl = Kubectl(up.kubeconfig, tmp_path / "kc")
    kubectl("create", "namespace", "cdi")
    yield up, kubectl
    up.stop()


def component(tmp_path: Path, name: str, *args: str) -> subprocess.Popen[str]:
    log = (tmp_path / f"{name}.log").open("w")
    return subprocess.Popen([sys.executable, "-m", "cdi.cli.main", name, *args], stdout=log, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_apiserver_and_controller_as_their_own_processes(bare: tuple[CdiUp, Kubectl], tmp_path: Path) -> None:
    up, k = bare
    apiserver = component(tmp_path, "apiserver", "--kubeconfig", str(up.kubeconfig), "--listen", "127.0.0.1:0",
                          "--endpoint-ip", "127.0.0.1", "--state-dir", str(tmp_path / "api"))
    controller = component(tmp_path, "controller", "--kubeconfig", str(up.kubeconfig), "--metrics-listen",
                           "127.0.0.1:0")
    try:
        wait_for(lambda: k.exists("validatingwebhookconfiguration", "cdi-api-datavolume-validate", ""), 30,
                 message="webhook registered")
        bad = datavolume("no-size", {"blank": {}})
        del bad["spec"]["storage"]["resources"]
        result = k.apply(bad, check=False)
        assert result.returncode != 0 and "Storage size is missing" in result.stderr
        k.apply(datavolume("blank", {"blank": {}}, "16Mi"))
        wait_phase(k, "blank", "Succeeded")
        lease = k.json("get", "lease", "cdi-controller-leader-election-helper", "-n", "cdi")
        assert lease["spec"]["holderIdentity"]
    finally:
        for process in (apiserver, controller):
            process.terminate()
            assert process.wait(30) == 0
