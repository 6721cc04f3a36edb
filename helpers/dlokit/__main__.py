"""`python -m dlokit VERB ...`: the same as the `dlokit` command (dlokit.cli)."""
import sys

from .cli import main

sys.exit(main())
