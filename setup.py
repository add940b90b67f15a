"""The one C extension (everything else is in pyproject.toml): `cdi.common._tlsread`, how upload bodies
are read from TLS (`cdi.common.sockfill`). Optional: without a C compiler, or on a Python other than the
ones `requires-python` declares (the version guard in `_tlsread.c` stops the build), the package still
installs, and bodies are read by a Python loop (same behaviour, more CPU)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("cdi.common._tlsread", ["cdi/common/_tlsread.c"], optional=True)])
