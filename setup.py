"""What pyproject.toml cannot say: the C parts.

* `cdi.common._tlsfront`, the server side of the threaded fronts' TLS over OpenSSL's public API
  (`cdi.common.tlsfront`). Optional: without a C compiler or OpenSSL's headers the package still
  installs, and the fronts serve TLS through the `ssl` module (same behaviour, more CPU); so does
  `CDI_NO_EXTENSIONS=1` at run time.
* `cdi/importer/cdi-containerimage-server`, a static executable (registry `pullMethod: node`: it runs
  inside the user's containerDisk image, which has nothing else). Optional too: without it, node-pull
  imports fail with a clear message."""

import os
import subprocess

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

SERVER_SOURCE = "cdi/importer/containerimage_server.c"
SERVER = "cdi/importer/cdi-containerimage-server"


class BuildWithServer(build_ext):
    def run(self) -> None:
        super().run()
        target = SERVER if self.inplace else os.path.join(self.build_lib, SERVER)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        compiler = os.environ.get("CC", "cc")
        try:
            subprocess.run([compiler, "-static", "-O2", "-o", target, SERVER_SOURCE], check=True)
        except (OSError, subprocess.CalledProcessError) as exc:
            print(f"warning: {SERVER} was not built ({exc}); registry pullMethod node will not work")


setup(ext_modules=[Extension("cdi.common._tlsfront", ["cdi/common/_tlsfront.c"], libraries=["ssl", "crypto"],
                             optional=True)],
      cmdclass={"build_ext": BuildWithServer})
