"""``python -m hvdscale.trainer.horovod_tf ARGS`` = ``hvdscale train ARGS``."""

import sys

from hvdscale.cli import finish, main

if __name__ == "__main__":
    finish(main(["train", *sys.argv[1:]]))
