"""Where the 2-worker sync phase goes (issue 17, item 3), a block of
docs/performance-history.md (perfdocs.generate) from
benchmarks/results/bench_sync_breakdown.csv: per cycle time the medians over the repeats,
then every timeline run, each split into what Horovod's timeline sees (negotiation, the
allreduce and its MPI op) and the rest of the record's sync phase; a reading of the
shares, computed from the valid rows.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from .common import (
    QCOLS,
    f2,
    missing_removed,
    num,
    provenance,
    quality,
    read,
    shown,
    table,
    thousands,
)

#: per-step columns of the table (CSV column, heading)
STEP = (
    ("sync_us", "sync phase"),
    ("timeline_span_us", "in the timeline"),
    ("negotiate_us", "negotiation"),
    ("allreduce_us", "allreduce"),
    ("mpi_allreduce_us", "of it MPI op"),
    ("memcpy_in_fusion_buffer_us", "copy in"),
    ("memcpy_out_fusion_buffer_us", "copy out"),
    ("allreduce_other_us", "other"),
    ("outside_timeline_us", "outside the timeline"),
)


def sync_reading(rows: list[dict]) -> str:
    """The shares of the sync phase, from the valid timeline runs (medians over them),
    and the range of the MPI op over the runs; '' without valid runs."""
    runs = [
        r
        for r in rows
        if r.get("row") == "run" and str(r.get("timeline")) == "1" and quality(r)[0]
        if num(r.get("sync_us"))
    ]
    if not runs:
        return ""

    def share(k):
        return statistics.median(num(r[k]) / num(r["sync_us"]) for r in runs)

    mpi = sorted(num(r["mpi_allreduce_us"]) for r in runs)
    return (
        f"Over the {len(runs)} valid timeline runs (medians of the shares of each run's sync "
        f"phase): {100 * share('outside_timeline_us'):.0f} % of the sync phase lies outside "
        f"Horovod's timeline, {100 * share('negotiate_us'):.0f} % is negotiation (the wait "
        f"for the other rank) and {100 * share('mpi_allreduce_us'):.0f} % the MPI op itself. "
        f"The MPI op takes {mpi[0]:.0f} to {mpi[-1]:.0f} us per step across the runs "
        "(the rows above say which).\n"
    )


def block_sync_breakdown(res: Path) -> str:
    rows = read(res, "bench_sync_breakdown")
    if not rows:
        return missing_removed("bench_sync_breakdown", "bench_sync_breakdown.py")
    body = []
    summaries = [r for r in rows if r.get("row") == "summary"]
    runs = [r for r in rows if r.get("row") == "run" and str(r.get("timeline")) == "1"]
    for r in summaries + runs:
        ok, qc = quality(r)
        which = f"median of {r['repeats']}" if r["row"] == "summary" else f"run {r['repeat']}"
        cells = [f"{float(r['cycle_ms']):g}", which, shown(ok, thousands(r.get("throughput")))]
        ratio = f2(r.get("control_vs_timeline")) if r["row"] == "summary" else ""
        cells.append(shown(ok, ratio))
        cells += [shown(ok, f2(r.get(k), 0)) for k, _ in STEP]
        body.append(cells + qc)
    head = ["cycle ms", "row", "samples/s (timeline on)", "without / with timeline"]
    head += [f"{h} us/step" for _, h in STEP] + QCOLS
    out = table(head, body) + "\n" + sync_reading(rows)
    return out + "\n" + provenance(rows, "bench_sync_breakdown")
