"""``torchrun --standalone --nproc-per-node N -m hvdscale.torchddp ARGS``: one rank of a
torch-ddp run (``hvdscale.torchddp.main``)."""

from hvdscale.cli import finish
from hvdscale.torchddp.main import main

if __name__ == "__main__":
    finish(main())
