"""Registry `pullMethod: node`, the importer's side (CDI's pod shape).

The importer pod's init container runs `cdi-importer --install-containerimage-server /shared/server`,
which copies Debian's static busybox (package busybox-static) and `containerimage_server.sh` into the
shared emptyDir, the script as `server`, started by that busybox's shell. The user's containerDisk
image runs it as the pod's `server` container: busybox httpd serves the one file under the image's
`/disk` over HTTP on port 8100, and the script writes that file's name to the ready file
(`IMPORTER_READY_FILE`). The importer, an HTTP import of `IMPORTER_ENDPOINT`, waits
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

SERVER = Path(__file__).with_name("containerimage_server.sh")
# where Debian's busybox-static puts it (`/bin` is `/usr/bin` on a merged-/usr system)
BUSYBOX_PATHS = (Path("/bin/busybox"), Path("/usr/bin/busybox"))
INSTALL_FLAG = "--install-containerimage-server"
READY_TIMEOUT = 60.0


def _static(path: Path) -> bool:
    """Whether an ELF executable needs no dynamic loader (no PT_INTERP program header): the user's
    image has no libc of ours, so a dynamically linked busybox would fail there with a bare
    "no such file or directory"."""
    import struct

    with path.open("rb") as f:
        ident = f.read(64)
        if len(ident) < 64 or ident[:4] != b"\x7fELF" or ident[4] != 2:  # 64-bit ELF only
            return False
        order = "<" if ident[5] == 1 else ">"
        phoff, = struct.unpack_from(order + "Q", ident, 32)
        phentsize, phnum = struct.unpack_from(order + "HH", ident, 54)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    return all(struct.unpack_from(order + "I", table, i * phentsize)[0] != 3 for i in range(phnum))


def install(destination: str) -> int:
    """The init container's work: the server at `destination`, an executable script whose first line
    names the static busybox copied beside it (the user's image may have no shell at all)."""
    busybox = next((p for p in BUSYBOX_PATHS if p.is_file()), None)
    if busybox is None or not _static(busybox):
        print(f"no static busybox at {' or '.join(map(str, BUSYBOX_PATHS))}: this importer's image lacks "
              "Debian's busybox-static, which registry pullMethod node needs", flush=True)
        return 1
    target = Path(destination)
    shell = target.parent / "busybox"
    shutil.copyfile(busybox, shell)
    os.chmod(shell, 0o755)
    target.write_text(f"#!{shell} sh\n" + SERVER.read_text())
    os.chmod(target, 0o755)
    print(f"installed {target} (busybox httpd)", flush=True)
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
    """The labels CDI derives from the containerDisk image's environment (its server's `/info`), read with
    the importer's own HTTP client (no credentials or extra headers: they are the source's, not this
    local server's)."""
    from urllib.parse import urlsplit

    from .http_client import HttpClient, HttpSettings
    from .source_registry import env_labels

    parts = urlsplit(endpoint)
    client = HttpClient(HttpSettings(timeout=10))
    try:
        resp = client.request("GET", f"{parts.scheme}://{parts.netloc}/info")
        body = resp.read_all(1 << 20)
        if not 200 <= resp.status < 300:
            raise ValueError(f"it answered {resp.status}")
        info = json.loads(body)
    except (ImporterError, ValueError) as exc:
        log.warning("no /info from the image's server: %s", exc)
        return {}
    finally:
        client.close()
    return env_labels([str(e) for e in info.get("Env") or []])


def finished(env: Mapping[str, str]) -> None:
    """Tell the server to stop."""
    done = env.get(envnames.DONE_FILE)
    if done:
        with contextlib.suppress(OSError):
            Path(done).touch()
