"""``torchrun --standalone --nproc-per-node N -m hvdscale.trainer.torch_ddp ARGS``: one rank of a
torch-ddp run (``hvdscale.trainer.torch_ddp.main``)."""

from hvdscale.cli import finish
from hvdscale.trainer.torch_ddp.main import main

if __name__ == "__main__":
    finish(main())
