"""What pyproject.toml cannot say: the C part, `cdi.common._tlsfront`, the server side of the threaded
fronts' TLS over OpenSSL's public API (`cdi.common.tlsfront`). Optional: without a C compiler or
OpenSSL's headers the package still installs, and the fronts serve TLS through the `ssl` module (same
behaviour, more CPU); so does `CDI_NO_EXTENSIONS=1` at run time.

(Registry `pullMethod: node` once had a C server built here; it is now Debian's busybox httpd behind
`cdi/importer/containerimage_server.sh`, see `cdi.importer.containerimage`.)"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("cdi.common._tlsfront", ["cdi/common/_tlsfront.c"], libraries=["ssl", "crypto"],
                             optional=True)])
