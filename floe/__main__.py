"""`python -m floering.floe ...`: the `floe` command."""

import sys

from floering.floe.cli import main

if __name__ == "__main__":
    sys.exit(main())
