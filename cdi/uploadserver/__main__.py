"""`python -m cdi.uploadserver`: the same program as the `cdi-uploadserver` console script."""

from .main import entry

entry()
