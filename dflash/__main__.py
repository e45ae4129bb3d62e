"""`python -m dflash`: the `dflash` command, so `torchrun ... -m dflash train` works too."""

import sys

from dflash.cli import main

if __name__ == "__main__":
    sys.exit(main())
