"""Fit the ring-allreduce cost model and predict synchronisation time and speedup.

Model (one allreduce of n bytes over p ranks on m nodes, ring over the slowest link;
``hvdscale.analysis.costmodel_links``):

    T(p, m, n) = 2(p-1) * alpha_c + 2(p-1)/p * n / beta_c

with c the inside-node link (m = 1) or the between-node link (m > 1). alpha_c (latency,
s) and beta_c (bandwidth, B/s) are fitted per partition, backend and link class by
weighted least squares over every message size and worker count of the allreduce
sweep (results/allreduce/*.csv as written by `hvdscale measure-allreduce`: columns
partition, backend, workers, nodes, bytes, time_s; p10/p90/algbw/busbw, also named
p10_s/p90_s/algbw_Bps/busbw_Bps, are optional; rows with one worker carry no
communication and are left out). The weights are 1/time, so the fit minimises relative
residuals and small (latency-bound) and large (bandwidth-bound) messages count alike.
A sweep with one node count fits the inside-node terms only (the between-node terms are
unknown, and said so). With --fit-max-workers K the error table (costmodel.json
"error_table") compares a fit from the sweeps with <= K ranks with the larger ones.

Prediction per configuration group (partition, backend, batch_per_worker, lr_rule)
with a measured 1-worker baseline (summary.csv): per-step time

    T_step(p) = T_data + T_compute + T_update + T_other + T_sync(p)

with the first four measured on the 1-worker run (T_other = step wall time not in a
phase, usually small) and T_sync(p) = T(p, m(p), model_bytes) with m(p) the measured
node count or the sequential fill of the one-node sweeps' largest rank count; epoch time
T_epoch(p) = steps(1)/p * T_step(p); predicted speedup S(p) = T_epoch(1)/T_epoch(p).
Where runs exist, the prediction is compared with the measured sync time per step and
speedup: relative error (predicted - measured)/measured per point and its median.

Example
  hvdscale fit-costmodel --allreduce results/allreduce/*.csv \
      --summary results/scaling/summary.csv --runs results/scaling/runs.csv \
      --model-bytes 613764 --out results/scaling/costmodel.json
"""

from __future__ import annotations

import sys

from hvdscale.analysis.costmodel import (
    DEFAULT_MODEL_BYTES,
    expand_inputs,
    fit_costmodel,
    read_allreduce,
)
from hvdscale.analysis.tables import read_runs, read_summary
from hvdscale.errors import UserError
from hvdscale.io import write_json_atomic


def add_arguments(p):
    p.add_argument(
        "--allreduce",
        nargs="*",
        default=[],
        metavar="CSV",
        help="allreduce sweep CSV files (globs allowed), e.g. results/allreduce/*.csv",
    )
    p.add_argument("--summary", help="summary.csv from 'hvdscale aggregate'")
    p.add_argument(
        "--runs",
        help="runs.csv from 'hvdscale aggregate' (for the model size if --model-bytes "
        "is not given)",
    )
    p.add_argument(
        "--model-bytes",
        type=int,
        help="bytes allreduced per step (parameters x 4); default: "
        "model_bytes of the run records, else 153441*4",
    )
    p.add_argument(
        "--max-workers",
        type=int,
        default=64,
        help="extrapolate up to this many workers (default: %(default)s)",
    )
    p.add_argument(
        "--fit-max-workers",
        type=int,
        default=0,
        help="validation: fit from the sweeps with at most this many ranks and report the "
        "error on the larger ones (0: no hold-out; default: %(default)s)",
    )
    p.add_argument("--out", default="results/scaling/costmodel.json", help="(default: %(default)s)")


def run(args) -> int:
    if args.max_workers < 1:
        raise UserError(f"--max-workers {args.max_workers}: expected a positive integer")
    if args.model_bytes is not None and args.model_bytes < 1:
        raise UserError(f"--model-bytes {args.model_bytes}: expected a positive integer")
    paths = expand_inputs(args.allreduce)
    allreduce = read_allreduce(paths)
    summary = read_summary(args.summary) if args.summary else None
    model_bytes = args.model_bytes
    if model_bytes is None and args.runs:
        mb = read_runs(args.runs)["model_bytes"].dropna()
        model_bytes = int(mb.mode().iloc[0]) if not mb.empty else None
    model_bytes = model_bytes or DEFAULT_MODEL_BYTES
    if args.fit_max_workers < 0:
        raise UserError(f"--fit-max-workers {args.fit_max_workers}: expected 0 or more")
    result = fit_costmodel(
        allreduce,
        summary,
        model_bytes,
        args.max_workers,
        [str(p) for p in paths],
        fit_max_workers=args.fit_max_workers or None,
    )
    write_json_atomic(args.out, result)
    for f in result["fits"]:
        if f["alpha_s"] is not None and f["beta_Bps"]:
            print(
                f"fit-costmodel: {f['partition']}/{f['backend']}: "
                f"alpha {f['alpha_s'] * 1e6:.2f} us, "
                f"beta {f['beta_Bps'] / 1e9:.3f} GB/s ({f['n_points']} points, median |rel. error| "
                f"{100 * f['median_abs_rel_error']:.1f} %)"
            )
        else:
            print(
                f"fit-costmodel: {f['partition']}/{f['backend']}: no fit ({f['note']})",
                file=sys.stderr,
            )
    v = result["error_table"]["validated"]
    if v["n"]:
        print(
            f"fit-costmodel: fitted from <= {result['error_table']['fit_max_workers']} ranks, "
            f"sync-time error on {v['n']} held-out sweeps ({v['workers']} ranks): median "
            f"|rel. error| {100 * v['median_abs_rel_error_sync']:.1f} %"
            if v["median_abs_rel_error_sync"] is not None
            else f"fit-costmodel: {v['n']} held-out sweeps, no sync-time error"
        )
    e = result["errors"]["speedup"]
    if e["n"]:
        print(
            "fit-costmodel: speedup prediction median |rel. error| "
            f"{100 * e['median_abs_rel_error']:.1f} % "
            f"over {e['n']} measured points"
        )
    for n in result["notes"]:
        print(f"hvdscale fit-costmodel: warning: {n}", file=sys.stderr)
    return 0
