"""The upload server is synchronous, as CDI's: its connection threads call the session directly, and the
program loads no event loop at all (so nothing of an upload can come to wait on one)."""

from __future__ import annotations

import subprocess
import sys


def test_the_upload_server_program_loads_no_event_loop() -> None:
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, cdi.uploadserver.main; print([m for m in ('asyncio', 'aiohttp') "
                               "if m in sys.modules])"], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]", f"the upload server program loads {loaded}"
