"""`python -m cdi.importer`: the same program as the `cdi-importer` console script."""

from .main import entry

entry()
