"""``python -m hvdscale.train ARGS`` = ``hvdscale train ARGS``."""

import sys

from hvdscale.cli import main

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
