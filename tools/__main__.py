"""`python -m tools ...` is the `mleng` command line."""

import sys

from .engine.cli import main

sys.exit(main())
