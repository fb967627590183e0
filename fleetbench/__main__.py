"""``python -m fleetbench``: the same as the ``fleetbench`` command."""

import sys

from fleetbench.cli import main

sys.exit(main())
