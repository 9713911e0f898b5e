"""`python -m dlrmtrain ...`: the same as the `dlrmtrain` command (see dlrmtrain/cli.py)."""

import sys

from dlrmtrain.cli import main

sys.exit(main())
