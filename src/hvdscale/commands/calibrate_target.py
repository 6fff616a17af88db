"""The study-wide target validation loss (rule calibrate_target -> results/scaling/target.json).

Fixed before any scaling run or tuning candidate trains; every such run reads it
(``hvdscale train --target FILE``) and stops when its validation loss reaches it.

absolute (training.target.value is the loss) or calibrated ((1 + x/100) x the median
best validation loss of the calibration runs, x = training.target.value); the modes,
the keys of target.json and how the calibration runs are read: hvdscale.target.

Example
  hvdscale calibrate-target --config results/config/target.json \
      --records results/runs/local_mpi_n1_w1_b75_lrlinear_cal_r*/metrics.json \
      --out results/scaling/target.json
"""

from __future__ import annotations

import sys

from hvdscale.config.load import load_config
from hvdscale.io import write_json_atomic
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
