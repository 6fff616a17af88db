"""Train one run with PyTorch DDP: this is ONE rank of a torch.distributed job (train env).

``torchrun --standalone --nproc-per-node N -m hvdscale.trainer.torch_ddp ARGS`` (started
directly it is a one-rank job): the arguments, the run and the outputs are those of
``hvdscale train`` (``hvdscale.trainer.rank.run_train``), with the torch-ddp trainer
(``hvdscale.trainer.torch_ddp.framework``) and one more option, ``--backend``. Rank 0
writes OUT_DIR/metrics.json (the run record, valid against workflow/schemas/run.schema.json)
and history.csv, and a checkpoint per epoch in OUT_DIR/checkpoint/ (re-running the
command resumes).

Exit status: 0 completed; 3 non-finite loss (a record with status nan_loss); 4 stopped
for the SLURM time limit (checkpoint written); 2 bad input; 1 other errors.
"""

from __future__ import annotations

import argparse
import sys

from hvdscale.cli import finish
from hvdscale.errors import UserError
from hvdscale.trainer.rank import add_train_arguments, run
from hvdscale.trainer.torch_ddp.framework import FRAMEWORK


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m hvdscale.trainer.torch_ddp",
        description=__doc__.split("\n\n")[0],
        epilog="Example: torchrun --standalone --nproc-per-node 2 -m hvdscale.trainer.torch_ddp "
        "--config results/config/full.json --run-id local_torch-ddp_gloo_n1_w2_b75_lrnone_r0 "
        "--data-dir results/data --out-dir results/runs/local_torch-ddp_gloo_n1_w2_b75_lrnone_r0"
        " (hvdscale launch starts it so, or with srun on SLURM)",
    )
    add_train_arguments(p)
    p.add_argument("--backend", default=None, choices=["gloo", "nccl"],
                   help="torch.distributed backend (default: the run id's: gloo on CPUs, "
                   "nccl on GPUs); the run id's backend must name the same")  # fmt: skip
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return run(args, FRAMEWORK)  # leaves the process group however the rank ends
    except UserError as exc:
        print(f"hvdscale torchddp: error: {exc}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    finish(main())
