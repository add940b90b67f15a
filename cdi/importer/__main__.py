"""`python -m cdi.importer`: the same program as the `cdi-importer` console script."""

import sys

from .main import main

sys.exit(main())
