import sys

from cdi.cloner.main import main

sys.exit(main())
