"""The study-wide target validation loss (rule calibrate_target -> results/scaling/target.json).

Fixed before any scaling run or tuning candidate trains; every such run reads it
(``hvdscale train --target FILE``) and stops when its validation loss reaches it.

absolute   the loss training.target.value; no runs needed.
calibrated target = (1 + x/100) * median over the calibration runs (run ids ending
           ``_cal_r{k}``: training.target.calibration, 1 worker, a long budget, no stop
           at a target) of each run's best validation loss; x = training.target.value.
           A run's best validation loss is its record's ``target.best_val_loss``, else
           the smallest finite ``val_loss`` of its epochs. A calibration run without a
           record, failed, or without any validation loss is an error naming the run.

Output (the contract of issue 16):
  {"mode": "absolute"|"calibrated", "value": float, "percent": x|null,
   "calibration_runs": [run_id...], "best_val_losses": [...],
   "median_best_val_loss": float|null}

Example
  hvdscale calibrate-target --config results/config/target.json \
      --records results/runs/local_mpi_n1_w1_b75_lrlinear_cal_r*/metrics.json \
      --out results/scaling/target.json
"""

from __future__ import annotations

import sys

from hvdscale.io import write_json_atomic
from hvdscale.matrix.config import load_config
from hvdscale.target import calibrate_target, read_records


def add_arguments(p):
    p.add_argument(
        "--config",
        required=True,
        help="config (results/config/target.json: the target settings of the study)",
    )
    p.add_argument(
        "--records",
        nargs="*",
        default=[],
        help="metrics.json of every calibration run (none in absolute mode)",
    )
    p.add_argument("--out", required=True, help="output, e.g. results/scaling/target.json")


def run(args) -> int:
    cfg = load_config(args.config)
    tgt = calibrate_target(cfg, read_records(args.records))
    write_json_atomic(args.out, tgt)
    if tgt["mode"] == "absolute":
        msg = f"absolute target validation loss {tgt['value']:.6g}"
    else:
        msg = (
            f"target validation loss {tgt['value']:.6g} = (1 + {tgt['percent']:g} %) x median "
            f"{tgt['median_best_val_loss']:.6g} of {len(tgt['best_val_losses'])} calibration runs"
        )
    print(f"calibrate-target: {msg}; wrote {args.out}", file=sys.stderr)
    return 0
