"""Run by `test_tlsfront_close.py` in a process of its own (so that a crash is a failed test, not a dead
run): ROUNDS times, a native TLS connection is closed from one thread while another is blocked reading it.

Usage: python closeprobe.py ROUNDS [PATH OF THE _tlsfront BUILD TO LOAD]. Prints one line per failure
and "ok" at the end."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import socket
import ssl
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from cdi.common import pki


def load(path: str | None) -> ModuleType:
    if path is None:
        from cdi.common import _tlsfront
        return _tlsfront
    loader = importlib.machinery.ExtensionFileLoader("cdi.common._tlsfront", path)
    spec = importlib.util.spec_from_file_location("cdi.common._tlsfront", path, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def in_poll(tid: int) -> bool:
    """Whether thread `tid` of this process is waiting in poll(2) (x86-64: 7; ppoll: 271) right now."""
    try:
        number = Path(f"/proc/self/task/{tid}/syscall").read_text().split()[0]
    except (OSError, IndexError):
        return False
    return number in ("7", "271")


def wait_for(predicate: Callable[[], object], timeout: float, what: str) -> None:
    """Polls with a deadline (this process has no test helpers: it runs alone)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.001)


def one_round(context: object, client_context: ssl.SSLContext) -> str | None:
    """One close under a blocked read; what went wrong, or None."""
    server_raw, client_raw = socket.socketpair()
    client_box: list[ssl.SSLSocket] = []

    def client() -> None:
        client_box.append(client_context.wrap_socket(client_raw, server_hostname="127.0.0.1"))

    handshake = threading.Thread(target=client)
    handshake.start()
    conn = context.accept(server_raw.fileno(), 10_000)  # type: ignore[attr-defined]
    handshake.join()
    tid: list[int] = []

    def reader() -> None:
        tid.append(threading.get_native_id())
        try:
            conn.fill(bytearray(1 << 20), 10_000, 0)  # waits up to 10 s for a byte
        except ValueError:  # closed before it got in: as good, nothing was freed under it
            pass

    thread = threading.Thread(target=reader)
    thread.start()
    wait_for(lambda: tid and in_poll(tid[0]), 10, "the reader to block in poll")
    started = time.monotonic()
    conn.close()  # from this thread, while the reader is inside
    closed_in = time.monotonic() - started
    thread.join(5)
    problem = None
    if thread.is_alive():
        problem = "the blocked read did not end when the connection was closed"
        client_box[0].sendall(b"x" * 100)  # wakes it (before the fix: into freed memory) so the process ends
        thread.join(15)
    elif closed_in > 5:
        problem = f"close took {closed_in:.1f}s"
    server_raw.close()
    client_box[0].close()
    return problem


def main() -> int:
    rounds = int(sys.argv[1])
    native = load(sys.argv[2] if len(sys.argv) > 2 else None)
    directory = Path(tempfile.mkdtemp())
    ca = pki.make_ca("close-ca")
    pki.issue(ca, "server", ["127.0.0.1"]).write(directory / "tls.crt", directory / "tls.key")
    context = native.Context(str(directory / "tls.crt"), str(directory / "tls.key"))
    client_context = ssl.create_default_context(cadata=ca.cert_pem.decode())
    for round_ in range(rounds):
        problem = one_round(context, client_context)
        if problem is not None:
            print(f"round {round_}: {problem}", flush=True)
            return 1
    print("ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
