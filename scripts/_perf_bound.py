"""The efficiency a bare allreduce allows (issue 17, item 3), a block of
scripts/gen_perf_docs.py: from three benchmarks' valid rows, the 2-worker efficiency at
batch 75 that hvdscale could reach if its step were the 1-rank step plus one bare
allreduce of the gradient, against what bench_scaling measured.

  t_step     1-rank step time alone: batch / samples per second of hvdscale's `plain`
             variant (bench_train_overhead: pinned, uninstrumented)
  t_shared   the same step while a second process shares the machine: t_step / the
             independent ceiling (bench_scaling: two 1-worker runs at once)
  t_sync     one hvd.allreduce of the gradient at 2 ranks, MPI defaults
             (bench_allreduce_bare)
  bound      t_shared / (t_shared + t_sync): the efficiency against the ceiling when the
             allreduce runs after the backward pass, not beside it (Horovod's TF2 step)
  needed     the sync time per step a 0.90 efficiency would need: t_shared (1/0.90 - 1)
"""

from __future__ import annotations

from pathlib import Path

from _perf_common import missing, num, provenance, read, table
from _quiet import row_validity

GOAL = 0.90
BATCH = "75"


def _valid(rows, **match):
    for r in rows or []:
        if all(r.get(k) == v for k, v in match.items()) and row_validity(r)[0]:
            return r
    return None


def bound_figures(train, allreduce, scaling) -> dict | None:
    """The bound's figures from the three CSVs' rows (None when a valid row is missing)."""
    plain = _valid(train, variant="plain", batch=BATCH)
    sync = _valid(allreduce, row="summary", arm="mpi", settings="defaults")
    ceil = _valid(scaling, batch=BATCH, metric="ceiling")
    meas = _valid(scaling, batch=BATCH, metric="efficiency_vs_ceiling", arm="hvdscale")
    vals = [
        num(plain and plain["samples_per_s"]),
        num(sync and sync["median_us"]),
        num(ceil and ceil["median"]),
        num(meas and meas["median"]),
    ]
    if any(v is None or v <= 0 for v in vals):
        return None
    thr, sync_us, ceiling, measured = vals
    t_step = 1e6 * int(BATCH) / thr
    t_shared = t_step / ceiling
    bound = t_shared / (t_shared + sync_us)
    return {
        "t_step_us": t_step,
        "ceiling": ceiling,
        "t_shared_us": t_shared,
        "t_sync_us": sync_us,
        "bound": bound,
        "measured": measured,
        "needed_us": t_shared * (1 / GOAL - 1),
        "explained": (1 - bound) / (1 - measured) if measured < 1 else None,
    }


def block_efficiency_bound(res: Path) -> str:
    names = ("bench_train_overhead", "bench_allreduce_bare", "bench_scaling")
    rows = [read(res, n) for n in names]
    x = bound_figures(*rows)
    if x is None:
        return missing("bench_train_overhead, bench_allreduce_bare, bench_scaling", "make bench")
    body = [
        ["1-rank step alone (hvdscale `plain`, batch 75)", f"{x['t_step_us']:.0f} us"],
        ["independent ceiling (two 1-worker runs at once)", f"{x['ceiling']:.2f}"],
        ["the step beside a second process (step / ceiling)", f"{x['t_shared_us']:.0f} us"],
        ["bare MPI allreduce of the gradient, 2 ranks", f"{x['t_sync_us']:.0f} us"],
        ["**bound**: efficiency vs ceiling, step + allreduce", f"**{x['bound']:.2f}**"],
        ["measured: hvdscale 2 workers vs ceiling (bench_scaling)", f"{x['measured']:.2f}"],
        [f"sync per step that {GOAL:.2f} would need", f"{x['needed_us']:.0f} us"],
    ]
    out = table(["figure", "value"], body)
    if x["explained"] is not None:
        out += (
            f"\nThe bare allreduce accounts for {100 * x['explained']:.0f} % of the gap between "
            f"the measured efficiency and 1.0; {GOAL:.2f} would need the allreduce "
            f"{x['t_sync_us'] / x['needed_us']:.1f}x faster than MPI does it here, or run "
            "beside the backward pass.\n"
        )
    prov = "".join(provenance(r, n) for r, n in zip(rows, names))
    return out + "\n" + prov
