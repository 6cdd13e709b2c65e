"""`python -m studies`: the studies' command line (studies/cli.py)."""

import sys

from studies.cli import main

sys.exit(main())
