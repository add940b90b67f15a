"""Issue 20.2: the upload server and the upload proxy serve every request through one HTTP stack, the
threaded h11 front (`cdi.common.threadfront`); no aiohttp server is behind it any more. (aiohttp stays
the proxy's Kubernetes client; its server half, `aiohttp.web`, is not loaded.)"""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["cdi.uploadserver.main", "cdi.uploadproxy.server", "cdi.cli.uploadproxy"])
def test_the_upload_components_load_no_aiohttp_server(module: str) -> None:
    loaded = subprocess.run([sys.executable, "-c", f"import sys, {module}; print('aiohttp.web' in sys.modules)"],
                            capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "False", f"{module} loads aiohttp's server (aiohttp.web)"
