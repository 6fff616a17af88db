"""Generated blocks of docs/performance.md for benchmarks/bench_frameworks.py (issue 19):
Horovod-TF against torch DDP, the summary figures and every run (scripts/gen_perf_docs.py)."""

from __future__ import annotations

from pathlib import Path

from _perf_common import QCOLS, ci, f2, missing, num, provenance, quality, read, shown, table

HOW = "make bench-frameworks"

#: (metric, label, digits) in the order the summary shows them, per framework
FIGURES = [
    ("epoch_s", "epoch time, s", 3),
    ("ttt_s", "time to target, s", 2),
    ("speedup_epoch", "epoch-time speedup 1 -> 2 workers", 2),
    ("speedup_ttt", "time-to-target speedup 1 -> 2 workers", 2),
    ("efficiency", "efficiency vs 1 worker", 2),
    ("efficiency_vs_ceiling", "efficiency vs the independent ceiling", 2),
    ("ratio_epoch_torch_vs_horovod", "epoch time torch-ddp / horovod-tf", 2),
    ("sync_allreduce_s", "sync: separate allreduce, ms/step", 3),
    ("sync_comm_hook_s", "sync: in DDP's comm hook, ms/step", 3),
    ("sync_exposed_s", "sync: exposed, ms/step", 3),
    ("ceiling", "independent ceiling (two 1-worker runs at once)", 2),
]
MS = {"sync_allreduce_s", "sync_comm_hook_s", "sync_exposed_s"}


def _cells(r: dict, metric: str, nd: int) -> tuple[str, str]:
    scale = 1e3 if metric in MS else 1.0
    med = num(r.get("median"))
    lo, hi = num(r.get("ci_low")), num(r.get("ci_high"))
    text = "n/a" if med is None else f"**{med * scale:.{nd}f}**"
    if lo is None or hi is None:
        return text, "no interval" if med is not None else ""
    return text, ci({"a": lo * scale, "b": hi * scale}, "a", "b", nd)


def block_frameworks(res: Path) -> str:
    rows = read(res, "frameworks")
    if not rows:
        return missing("frameworks", HOW)
    body = []
    for b in sorted({int(r["batch"]) for r in rows}):
        for metric, label, nd in FIGURES:
            for r in rows:
                if r["batch"] != str(b) or r["metric"] != metric:
                    continue
                ok, qc = quality(r)
                med, interval = _cells(r, metric, nd)
                body.append([b, label, r["arm"], r["workers"], shown(ok, med)])
                body[-1] += [shown(ok, interval), r["n"], r.get("note", ""), *qc]
    head = ["batch", "figure", "framework", "workers", "median", "95 % CI", "repeats", "note"]
    return table(head + QCOLS, body) + "\n" + provenance(rows, "frameworks")


def block_frameworks_runs(res: Path) -> str:
    rows = read(res, "frameworks_runs")
    if not rows:
        return missing("frameworks_runs", HOW)
    body = []
    for r in rows:
        ok, qc = quality(r)
        ttt = num(r.get("ttt_s"))
        ttt_s = "> budget" if ttt == float("inf") else f2(ttt, 2)
        figs = [f2(r.get("epoch_s"), 3), f2(r.get("throughput"), 0), ttt_s]
        if r["status"] != "ok":
            figs = ["failed", "", ""]
        body.append([r["repeat"], r["batch"], r["arm"], r["workers"]])
        body[-1] += [shown(ok, x) for x in figs] + [f2(r.get("load_after")), *qc]
    head = ["repeat", "batch", "arm", "workers", "epoch s", "samples/s", "time to target s"]
    out = table(head + ["load after", *QCOLS], body)
    return out + "\n" + provenance(rows, "frameworks_runs")
