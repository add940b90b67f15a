"""Registry `pullMethod: node`, the importer's side (CDI's pod shape).

The importer pod's init container runs `cdi-importer --install-containerimage-server /shared/server`,
which copies `cdi-containerimage-server` (a static executable, built from `containerimage_server.c`)
into the shared emptyDir. The user's containerDisk image runs it as the pod's `server` container: it
serves the one file under the image's `/disk` over HTTP on port 8100 and writes that file's name to
the ready file (`IMPORTER_READY_FILE`). The importer, an HTTP import of `IMPORTER_ENDPOINT`, waits
for the ready file (60 seconds, as CDI), reads the image's file name from it and imports that name;
when it has finished it creates the done file (`IMPORTER_DONE_FILE`), and the server exits.

Unlike CDI, the done file is created whatever the outcome: the pod is `restartPolicy: Never` here, so
the server must stop for the pod to end and the controller to decide about a retry. The labels CDI
derives from the image's environment come from the server's `/info` (its environment)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from cdi.api import env as envnames

from .errors import ImporterError, Reason

log = logging.getLogger(__name__)

SERVER = Path(__file__).with_name("cdi-containerimage-server")
INSTALL_FLAG = "--install-containerimage-server"
READY_TIMEOUT = 60.0


def install(destination: str) -> int:
    """The init container's work: the server, executable, at `destination`."""
    if not SERVER.is_file():
        print(f"{SERVER} is missing: this importer was built without a C compiler", flush=True)
        return 1
    target = Path(destination)
    shutil.copyfile(SERVER, target)
    os.chmod(target, 0o755)
    print(f"installed {target}", flush=True)
    return 0


def node_pull(env: Mapping[str, str]) -> bool:
    return bool(env.get(envnames.READY_FILE))


def wait_ready(env: Mapping[str, str], stop: threading.Event, timeout: float = READY_TIMEOUT) -> str:
    """Wait for the server's ready file; the endpoint with the image's file name in it."""
    ready = Path(env[envnames.READY_FILE])
    endpoint = env.get(envnames.ENDPOINT, "")
    deadline = time.monotonic() + timeout
    while not ready.exists():
        if time.monotonic() > deadline:
            raise ImporterError(Reason.CONNECTION_FAILED, f"Timeout waiting for file {ready}", retryable=True)
        if stop.wait(0.2):
            raise ImporterError(Reason.TERMINATED, "the importer was stopped by a signal", retryable=True)
    name = ready.read_text().strip()
    if name and endpoint.endswith("/" + envnames.DISK_IMAGE_NAME):
        endpoint = endpoint[: -len(envnames.DISK_IMAGE_NAME)] + name
    log.info("the image serves %s", endpoint)
    return endpoint


def info_labels(endpoint: str) -> dict[str, str]:
    """The labels CDI derives from the containerDisk image's environment (its server's `/info`)."""
    from urllib.parse import urlsplit
    from urllib.request import urlopen

    from .source_registry import env_labels

    parts = urlsplit(endpoint)
    try:
        with urlopen(f"{parts.scheme}://{parts.netloc}/info", timeout=10) as resp:
            info = json.loads(resp.read(1 << 20))
    except (OSError, ValueError) as exc:
        log.warning("no /info from the image's server: %s", exc)
        return {}
    return env_labels([str(e) for e in info.get("Env") or []])


def finished(env: Mapping[str, str]) -> None:
    """Tell the server to stop."""
    done = env.get(envnames.DONE_FILE)
    if done:
        with contextlib.suppress(OSError):
            Path(done).touch()
