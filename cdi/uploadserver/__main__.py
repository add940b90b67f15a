"""`python -m cdi.uploadserver`: the same program as the `cdi-uploadserver` console script."""

import sys

from .main import main

sys.exit(main())
