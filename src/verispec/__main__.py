"""``python -m verispec``: the same command line as the ``verispec`` script."""

import sys

from verispec.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
