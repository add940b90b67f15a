"""The scale scenario of issue 29 on `cdi up`: a hundred DataVolumes, half blank and half HTTP imports of a
small qcow2, created at once. What a user checks after such a burst: every one Succeeded, none retried, and
each had exactly one worker pod (none made twice by reconciles racing each other). `bench/scale.py` runs it;
`bench/bench_controller.py` runs the same with 500 and measures it, on `cdi up` and on a real cluster."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import scale
from cdi.kube import KubeClient
from tests.support.cluster import CdiUp
from tests.support.servers import FileServer

COUNT = 100

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def image_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FileServer]:
    served = tmp_path_factory.mktemp("scale-served")
    scale.make_image(served)
    server = FileServer(served)
    yield server
    server.close()


async def burst(kubeconfig: Path, image_url: str) -> scale.Outcome:
    async with await KubeClient.connect(kubeconfig) as client:
        return await scale.run(client, scale.Workload(COUNT, "scale", image_url), timeout=240)


def test_a_hundred_datavolumes_at_once_all_succeed_each_with_one_worker_pod(
        shared_cdi_up: CdiUp, image_server: FileServer) -> None:
    outcome = asyncio.run(burst(shared_cdi_up.kubeconfig, f"{image_server.url}/{scale.IMAGE_NAME}"))
    problems = outcome.problems()
    assert not problems, "\n".join(problems) + "\n" + shared_cdi_up.recent_logs()
    assert outcome.succeeded() == COUNT
    assert outcome.pods_per_datavolume() == {1: COUNT}
    assert len(image_server.requests) >= COUNT // 2  # the imports read the image from the server
