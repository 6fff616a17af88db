"""``torchrun --standalone --nproc-per-node N -m hvdscale.torchddp ARGS``: one rank of a
torch-ddp run (``hvdscale.torchddp.main``)."""

import sys

from hvdscale.torchddp.main import main

if __name__ == "__main__":
    sys.exit(main())
