#!/usr/bin/env python3
"""Record the allreduce sweeps of the cost model across nodes and its error table as
benchmark CSVs with provenance: benchmarks/results/costmodel_emulated.csv (every
measured row) and costmodel_emulated_errors.csv (fitted from <= 4 ranks, validated on 8
and 16). ``make bench-costmodel`` (bench_costmodel.py) runs the sweeps alone and then
this script; by hand, after the rule measure_allreduce on the emulated partition:

  .venv/bin/python benchmarks/record_costmodel.py --allreduce 'results-costmodel/allreduce/*.csv' \\
      --loads load.txt --load-before 0.4 --load-after 0.5

The load column is the highest 1-minute load sampled during the sweeps (--loads: lines
"HH:MM:SS LOAD"; the sweeps' own ranks raise it); validity is judged from the load
before them and the foreign CPU (benchmarks/_quiet.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _quiet import validity  # noqa: E402
from _results import write_csv  # noqa: E402


def main() -> int:
    from hvdscale.analysis.costmodel import (
        DEFAULT_MODEL_BYTES,
        expand_inputs,
        fit_costmodel,
        read_allreduce,
    )
    from hvdscale.io import write_json_atomic

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--allreduce", nargs="+", required=True, help="sweep CSVs (globs allowed)")
    ap.add_argument("--loads", required=True, help="load samples taken during the sweeps")
    ap.add_argument("--load-before", type=float, required=True)
    ap.add_argument("--load-after", type=float, required=True)
    ap.add_argument(
        "--foreign-cpu",
        type=float,
        help="CPU share of processes outside the sweeps while they ran (bench_costmodel.py)",
    )
    ap.add_argument("--measured", help="when the sweeps ran (e.g. START/END, UTC)")
    ap.add_argument("--fit-max-workers", type=int, default=4)
    ap.add_argument("--model-bytes", type=int, default=DEFAULT_MODEL_BYTES)
    ap.add_argument("--json", help="also write the costmodel.json here")
    args = ap.parse_args()
    paths = expand_inputs(args.allreduce)
    ar = read_allreduce(paths)
    samples = [float(x.split()[1]) for x in Path(args.loads).read_text().splitlines() if x.strip()]
    # the sweeps' own ranks (up to 16 on 2 cores) make the load during them: the peak
    # is recorded, but whether the machine was shared is the load before they started
    peak = max([args.load_before, args.load_after, *samples])
    alone, why = validity(args.foreign_cpu, load_before=args.load_before)
    quality = {
        "foreign_cpu": args.foreign_cpu,
        "valid": "true" if alone else "false",
        "invalid_reason": why,
    }
    note = "" if alone else "busy machine (shared): test figures, not benchmark figures"
    load = {
        "load": peak,
        "load_before": args.load_before,
        "load_after": args.load_after,
        **quality,
    }
    if args.measured:
        load["measured"] = args.measured
    keep = ["partition", "backend", "workers", "nodes", "bytes", "time_s", "p10_s", "p90_s"]
    rows = [
        {**load, **{k: r[k] for k in keep if k in r}, "note": note} for r in ar.to_dict("records")
    ]
    write_csv("costmodel_emulated", rows)
    cm = fit_costmodel(ar, None, args.model_bytes, fit_max_workers=args.fit_max_workers)
    et = cm["error_table"]
    write_csv("costmodel_emulated_errors", [{**load, **r, "note": note} for r in et["rows"]])
    if args.json:
        write_json_atomic(args.json, cm)
    v = et["validated"]
    for f in et["fits"]:
        for link in ("inside_node", "between_node"):
            lf = f.get(link) or {}
            if lf.get("beta_Bps"):
                print(
                    f"{f['partition']}/{f['backend']} {link}: alpha {lf['alpha_s'] * 1e6:.1f} us,"
                    f" beta {lf['beta_Bps'] / 1e6:.1f} MB/s (from {lf['workers']} ranks)"
                )
    for r in et["rows"]:
        err = r["sync_rel_error"]
        print(
            f"  {r['workers']:>3} ranks {r['nodes']} node(s) {r['role']:>8}: measured "
            f"{(r['sync_s_meas'] or 0) * 1e3:8.2f} ms, predicted "
            f"{(r['sync_s_pred'] or 0) * 1e3:8.2f} ms, "
            f"error {'-' if err is None else f'{100 * err:+.1f} %'}"
        )
    if v["n"]:
        print(
            f"held out ({v['workers']} ranks): median |error| sync "
            f"{100 * v['median_abs_rel_error_sync']:.1f} %, over sizes "
            f"{100 * v['median_abs_rel_error_sizes']:.1f} %; peak load {peak:.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
