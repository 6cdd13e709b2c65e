"""`python -m randkv ...`: the `randkv` command without its console script."""

import sys

from randkv.cli import main

sys.exit(main())
