"""`python -m tools ...` is the `mleng` command line."""

import sys

from tools.cli import main

sys.exit(main())
