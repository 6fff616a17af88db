"""Regenerate the tables of docs/performance.md (the targets and the current figures) and
docs/performance-history.md (concluded investigations) from the benchmark results under
benchmarks/results/*.csv (written by the benchmarks through benchmarks/_results.py).

Each page holds generated blocks between ``<!-- perf:begin NAME -->`` and
``<!-- perf:end NAME -->``; everything between the markers is replaced, the prose
around them is kept. Every block belongs to one page (``PAGES``). Every figure on the
pages comes from a CSV, with its provenance (commit, machine, date, load). ``--check``
exits 1 (and prints a diff) when a page and the CSVs disagree; tests/test_perf_docs.py
runs it. ``make perf-docs`` rewrites the pages.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Callable
from pathlib import Path

from _quiet import FOREIGN_CPU_MAX, row_validity

from .bound import block_efficiency_bound
from .cluster import block_costmodel, block_slurm_arrays
from .common import (
    INVALID,
    QCOLS,
    ROOT,
    best_mpi,
    ci,
    f2,
    missing,
    missing_removed,
    num,
    provenance,
    quality,
    read,
    short_reason,
    shown,
    table,
    thousands,
)
from .frameworks import (
    TARGET_TORCH_VS_HOROVOD,
    best_ratio_rows,
    block_frameworks,
    block_frameworks_runs,
    block_torch_step_overhead,
)
from .gpu import block_gpu_batch_sweep, block_gpu_step_profile, block_gpu_variants
from .sync import block_sync_breakdown

DOCS = ROOT / "docs"
RESULTS = ROOT / "benchmarks" / "results"
BLOCK = re.compile(
    r"(<!-- perf:begin (?P<name>[a-z0-9_-]+) -->\n)(?P<body>.*?)(<!-- perf:end (?P=name) -->)",
    re.S,
)

# the targets of issue 11 (what the page checks the measurements against)
TARGET_EFF_VS_CEILING = 0.90
TARGET_RATIO = 1.0
TARGET_INSTRUMENTATION = 0.02  # issue 17: instrumentation overhead on epoch time
TARGET_GLOO_VS_MPI = 2.0  # issue 17: Gloo's sync per step within 2x of MPI's


# --------------------------------------------------------------------------- blocks


def pick(rows, batch, metric, arm=None, workers=None):
    for r in rows:
        if r["batch"] == str(batch) and r["metric"] == metric:
            if arm is not None and r["arm"] != arm:
                continue
            if workers is not None and r["workers"] != str(workers):
                continue
            return r
    return None


def block_scaling_summary(res: Path) -> str:
    rows = read(res, "bench_scaling")
    if not rows:
        return missing("bench_scaling", "make bench-scaling")
    batches = sorted({int(r["batch"]) for r in rows})
    body = []
    labels = [
        ("efficiency", "hvdscale", "2 workers: efficiency vs best 1 worker"),
        ("efficiency_vs_ceiling", "hvdscale", "2 workers: efficiency vs independent ceiling"),
        ("ceiling", "independent", "independent ceiling (two 1-worker runs at once)"),
        ("ratio_hvdscale_vs_mwms", "hvdscale", "hvdscale / best MWMS, 2 workers"),
        ("ratio_hvdscale_vs_keras", "hvdscale", "hvdscale / best Keras model.fit, 1 worker"),
    ]
    for b in batches:
        for metric, arm, text in labels:
            w = 1 if metric == "ratio_hvdscale_vs_keras" else 2
            r = pick(rows, b, metric, arm, w)
            if r is None:
                continue
            ok, qc = quality(r)
            note = r.get("note", "")
            med, interval = shown(ok, f"**{f2(r['median'])}**"), shown(ok, ci(r))
            body.append([b, text, med, interval, r["n"], note, *qc])
    out = table(["batch", "figure", "median", "95 % CI", "repeats", "against", *QCOLS], body)
    return out + "\n" + provenance(rows, "bench_scaling")


def block_scaling_throughput(res: Path) -> str:
    rows = read(res, "bench_scaling")
    if not rows:
        return missing("bench_scaling", "make bench-scaling")
    body = []
    for r in rows:
        if r["metric"] != "throughput":
            continue
        ok, qc = quality(r)
        thr, interval = thousands(r["median"]), ci(r, nd=0).replace(".", "")
        body.append([r["batch"], r["arm"], r["workers"], shown(ok, thr), shown(ok, interval)])
        body[-1] += [r["n"], *qc]
    head = ["batch", "arm (best settings)", "workers", "samples/s", "95 % CI", "n", *QCOLS]
    return table(head, body) + "\n" + provenance(rows, "bench_scaling")


def run_cells(r: dict) -> list[str]:
    """samples/s, load after and the quality cells of one run of bench_scaling_runs."""
    ok, qc = quality(r)
    thr = thousands(r["throughput"]) if r["status"] == "ok" else "failed"
    return [shown(ok, thr), f2(r["load_after"]), *qc]


def block_scaling_runs(res: Path) -> str:
    rows = read(res, "bench_scaling_runs")
    if not rows:
        return missing("bench_scaling_runs", "make bench-scaling")
    body = []
    for r in rows:
        if r["phase"] == "tune":
            body.append([r["batch"], r["arm"], r["workers"], *run_cells(r)])
    head = ["batch", "candidate", "workers", "samples/s", "load after", *QCOLS]
    return table(head, body) + "\n" + provenance(rows, "bench_scaling_runs")


def block_paired_runs(res: Path) -> str:
    rows = read(res, "bench_scaling_runs")
    if not rows:
        return missing("bench_scaling_runs", "make bench-scaling")
    body = []
    for r in rows:
        if r["phase"] != "paired":
            continue
        share = num(r.get("data_share"))
        share_s = f"{100 * share:.1f} %" if share is not None else ""
        cells = run_cells(r)
        ok = row_validity(r)[0]
        body.append([r["repeat"], r["batch"], r["arm"], r["workers"], cells[0]])
        body[-1] += [shown(ok, share_s) if share_s else "", *cells[1:]]
    head = ["repeat", "batch", "arm", "workers", "samples/s", "data share", "load after"]
    return table(head + QCOLS, body) + "\n" + provenance(rows, "bench_scaling_runs")


def block_train_overhead(res: Path) -> str:
    rows = read(res, "bench_train_overhead")
    if not rows:
        return missing("bench_train_overhead", "make bench-train")
    body = []
    for r in rows:
        if r["kind"] == "overhead":
            continue  # the instrumentation block shows it
        ok, qc = quality(r)
        if r["kind"] == "keras":
            settings = (
                f"steps_per_execution {r['spe']}, jit_compile {'on' if r['jit'] == '1' else 'off'}"
            )
        else:
            settings = (
                f"steps_per_execution {r['spe']}, instrument_every {r['instrument_every']}, "
                f"data in device memory {r['in_device_memory']}"
            )
        ratio = f2(r["ratio_vs_keras_best"], 3)
        ratio = f"**{ratio}**" if r["kind"] != "keras" else ratio
        interval = ci(r, "ratio_ci_low", "ratio_ci_high", 3)
        body.append([r["variant"], settings, shown(ok, thousands(r["samples_per_s"]))])
        body[-1] += [shown(ok, ratio), shown(ok, interval), *qc]
    r0 = rows[0]
    out = table(["variant", "settings", "samples/s", "/ Keras best", "95 % CI", *QCOLS], body)
    out += (
        f"\nKeras best: `{r0['keras_best']}`; {r0['samples']} samples, batch {r0['batch']}, "
        f"{r0['repeats']} rounds, core {r0['core']}.\n"
    )
    return out + "\n" + provenance(rows, "bench_train_overhead")


def block_instrumentation(res: Path) -> str:
    rows = read(res, "bench_train_overhead") or []
    r = next((r for r in rows if r.get("variant") == "instrumentation_overhead"), None)
    if r is None:
        return (
            "Not measured in this revision (no `instrumentation_overhead` row in "
            "`benchmarks/results/bench_train_overhead.csv`); run `make bench-train`.\n"
        )
    ok, qc = quality(r)
    pct = lambda k: f"{100 * num(r[k]):.2f} %" if num(r.get(k)) is not None else ""  # noqa: E731
    interval = (
        f"{pct('overhead_ci_low')}-{pct('overhead_ci_high')}" if pct("overhead_ci_low") else ""
    )
    body = [[r["instrument_every"], shown(ok, f"**{pct('overhead')}**")]]
    body[-1] += [shown(ok, interval or "no interval (n < 3)"), r["repeats"], *qc]
    head = ["instrument_every", "overhead on epoch time", "95 % CI", "rounds", *QCOLS]
    return table(head, body) + "\n" + provenance([r], "bench_train_overhead")


def block_data(res: Path) -> str:
    rows = read(res, "bench_data")
    if not rows:
        return missing("bench_data", "make bench-data")
    body = []
    for r in rows:
        ok, qc = quality(r)
        figs = [f2(r[k]) for k in ("generate_s", "validate_s", "split_s", "total_s")]
        figs += [thousands(r["curves_per_s"]), r["peak_rss_mb"], f2(r["ratio_to_dd"])]
        size = f"{int(r['n_samples']):,}" + (" (reduced)" if r.get("reduced_size") == "1" else "")
        body.append([size, r["workers"], *(shown(ok, x) for x in figs), *qc])
    head = ["curves", "workers", "generate s", "validate s", "split s", "total s", "curves/s"]
    out = table(head + ["peak RSS MiB", "total / dd", *QCOLS], body)
    notes = sorted({r["note"] for r in rows if r.get("note")})
    if notes:
        out += "\n" + "; ".join(notes) + ".\n"
    return out + "\n" + provenance(rows, "bench_data")


def block_dag(res: Path) -> str:
    rows = read(res, "bench_dag")
    if not rows:
        return missing("bench_dag", "make bench-dag")
    body = []
    for r in rows:
        ok, qc = quality(r)
        verdict = f"< {f2(r['target_s'], 0)} s: {'met' if r['met'] == '1' else 'not met'}"
        body.append([r["configfile"], r["profile"] or "none", r["jobs"]])
        body[-1] += [shown(ok, f"**{f2(r['seconds_median'])}**")]
        body[-1] += [shown(ok, ci(r, "seconds_ci_low", "seconds_ci_high")), r["repeats"]]
        body[-1] += [shown(ok, verdict), *qc]
    head = ["config", "profile", "plan", "median s", "95 % CI", "runs", "target", *QCOLS]
    return table(head, body) + "\n" + provenance(rows, "bench_dag")


def block_report(res: Path) -> str:
    rows = read(res, "bench_report")
    if not rows:
        return missing("bench_report", "make bench-report")
    body = []
    for r in rows:
        ok, qc = quality(r)
        body.append([r["step"], shown(ok, f2(r["seconds"])), r["runs"], r["mode"], *qc])
    out = table(["step", "seconds", "run records", "mode", *QCOLS], body)
    return out + "\n" + provenance(rows, "bench_report")


def block_slurm(res: Path) -> str:
    rows = read(res, "bench_slurm_overhead")
    if not rows:
        return missing("bench_slurm_overhead", "make bench-slurm")
    body = []
    for r in rows:
        ok, qc = quality(r)
        figs = [f2(r["seconds_median"], 1), ci(r, "seconds_ci_low", "seconds_ci_high", 1)]
        figs += [f2(r["overhead_s"], 1)]
        body.append([r["path"], *(shown(ok, x) for x in figs), r["repeats"], *qc])
    out = table(["path", "median s", "95 % CI", "overhead s", "rounds", *QCOLS], body)
    return out + "\n" + provenance(rows, "bench_slurm_overhead")


def block_data_phase(res: Path) -> str:
    rows = read(res, "bench_data_phase")
    if not rows:
        return missing_removed("bench_data_phase", "bench_data_phase.py")
    body = []
    for r in rows:
        ok, qc = quality(r)
        share = num(r.get("data_share"))
        figs = [f2(r["data_ms_per_step"], 4), ci(r, "data_ms_ci_low", "data_ms_ci_high", 4)]
        figs += [f2(r["step_ms"], 3), f"{100 * share:.1f} %" if share is not None else ""]
        body.append([r["batch"], r["variant"], *(shown(ok, x) if x else x for x in figs), *qc])
    head = ["batch", "variant", "data ms/step", "95 % CI", "step ms", "data share", *QCOLS]
    return table(head, body) + "\n" + provenance(rows, "bench_data_phase")


def block_allreduce_bare(res: Path) -> str:
    rows = read(res, "bench_allreduce_bare")
    if not rows:
        return missing("bench_allreduce_bare", "make bench-allreduce")
    body = []
    for r in rows:
        if r.get("row") != "summary":
            continue
        ok, qc = quality(r)
        us = [f2(r["median_us"], 0), ci(r, "ci_low_us", "ci_high_us", 0)]
        us += [f2(r["ratio_vs_mpi"])]
        body.append([r["arm"], r["controller"], r["settings"], *(shown(ok, x) for x in us)])
        body[-1] += [r["repeats"], *qc]
    head = ["arm", "controller", "settings", "us per call", "95 % CI", "/ MPI default"]
    out = table(head + ["repeats", *QCOLS], body)
    notes = sorted({r["note"] for r in rows if r.get("note")})
    if notes:
        out += "\n" + "; ".join(notes) + ".\n"
    reading = allreduce_reading(rows)
    if reading:
        out += "\n" + reading + "\n"
    return out + "\n" + provenance(rows, "bench_allreduce_bare")


def block_cycle_time(res: Path) -> str:
    rows = read(res, "bench_cycle_time")
    if not rows:
        return missing("bench_cycle_time", "make bench-cycle")
    # the phase split per step (rows since it was recorded)
    split = any(r.get("compute_us_step") for r in rows if r.get("row") == "summary")
    body = []
    for r in rows:
        if r.get("row") != "summary":
            continue
        ok, qc = quality(r)
        thr, interval = thousands(r["throughput"]), ci(r, nd=0).replace(".", "")
        ratio = f2(r["auto_vs_this"]) if r.get("auto_vs_this") else ""
        cells = [r["batch"], r["workers"], f"{float(r['cycle_ms']):g}", r["auto"]]
        body.append([*cells, shown(ok, thr), shown(ok, interval), shown(ok, ratio)])
        if split:
            body[-1] += [shown(ok, f2(r.get(k), 0)) for k in ("compute_us_step", "sync_us_step")]
        body[-1] += [r["repeats"], *qc]
    head = ["batch", "workers", "cycle ms", "auto picks it", "samples/s", "95 % CI"]
    head += ["auto / this (paired)"]
    if split:
        head += ["compute us/step", "sync us/step"]
    head += ["repeats", *QCOLS]
    return table(head, body) + "\n" + provenance(rows, "bench_cycle_time")


def gloo_vs_best(gloo: dict, best: dict | None) -> float | None:
    """Gloo's median per call / the fastest valid MPI arm's (a ratio of medians)."""
    g, m = num(gloo.get("median_us")), num(best and best.get("median_us"))
    return g / m if g and m else None


def allreduce_reading(rows: list[dict]) -> str:
    """Where the Gloo cost lies, from the valid summary rows of the Gloo arm, the
    torch.distributed Gloo reference and MPI at its fastest setting (best_mpi); '' unless
    all three are there and valid."""
    by_arm = {r["arm"]: r for r in rows if r.get("row") == "summary" and quality(r)[0]}
    best = best_mpi(rows)
    if best is None or not all(a in by_arm for a in ("gloo", "torch gloo")):
        return ""
    hvd, torch = (float(by_arm[a]["median_us"]) for a in ("gloo", "torch gloo"))
    # against MPI at its fastest setting (ratios of medians)
    r_hvd, r_torch = (gloo_vs_best(by_arm[a], best) for a in ("gloo", "torch gloo"))
    head = (
        f"Against MPI at its fastest setting here (`{best['arm']}`, "
        f"{float(best['median_us']):.0f} us): "
        f"torch.distributed's Gloo allreduce of the same tensor takes {torch:.0f} us "
        f"({r_torch:.2f}x MPI), Horovod's Gloo {hvd:.0f} us ({r_hvd:.2f}x MPI, "
        f"{hvd / torch:.1f}x torch's)."
    )
    mpi = by_arm.get("mpi")
    if mpi is not None and mpi is not best:
        head += (
            f" MPI with the defaults takes {float(mpi['median_us']):.0f} us in this bare "
            "loop, which does nothing but allreduce; whether a cycle time pays is "
            'measured in training (section "Horovod\'s cycle time").'
        )
    spin = by_arm.get("gloo spin")
    if spin is not None:
        s_us = float(spin["median_us"])
        head += (
            f" Without hvdscale.native's library (`gloo spin`) Horovod's Gloo takes "
            f"{s_us:.0f} us, {s_us / hvd:.1f}x as long ({gloo_vs_best(spin, best):.2f}x MPI; "
            'section "Gloo\'s spinning loop thread").'
        )
    tspin = by_arm.get("torch gloo spin")
    if tspin is not None:
        t_us = float(tspin["median_us"])
        head += (
            f" torch.distributed's Gloo spins the same way: without the library "
            f"(`torch gloo spin`) it takes {t_us:.0f} us, {t_us / torch:.1f}x as long."
        )
    if r_hvd <= TARGET_GLOO_VS_MPI:
        return head + f" Horovod's Gloo is within {TARGET_GLOO_VS_MPI:.0f}x of MPI."
    if r_torch <= TARGET_GLOO_VS_MPI:
        return head + (
            f" So the Gloo library over TCP comes within {TARGET_GLOO_VS_MPI:.0f}x of MPI here; "
            "the rest is Horovod's Gloo path (none of the Horovod settings above changes "
            "it). The Gloo backend's epoch times are those of Horovod's Gloo."
        )
    if hvd / torch >= TARGET_GLOO_VS_MPI:
        return head + (
            f" The Gloo library over TCP (torch's) is above {TARGET_GLOO_VS_MPI:.0f}x of MPI "
            "here too, but most of Horovod's Gloo time is Horovod's own Gloo path (none of "
            "the Horovod settings above changes it)."
        )
    return head + (
        " Gloo itself (TCP, here the loopback) is most of the cost against Open MPI's "
        "shared-memory transport on one node."
    )


#: the CSVs behind docs/performance.md (the targets and the current figures)
VALIDITY_SOURCES = [
    "bench_scaling",
    "bench_scaling_runs",
    "frameworks",
    "frameworks_runs",
    "torch_step_overhead",
    "bench_train_overhead",
    "bench_allreduce_bare",
    "bench_cycle_time",
    "bench_data",
    "bench_dag",
    "bench_report",
    "bench_slurm_overhead",
    "bench_slurm_arrays",
    "costmodel_emulated",
    "costmodel_emulated_errors",
    "gpu_batch_sweep",
    "gpu_step_profile",
]
#: the CSVs of the concluded investigations that only docs/performance-history.md shows
HISTORY_VALIDITY_SOURCES = [
    "bench_sync_breakdown",
    "bench_data_phase",
]


def block_validity(res: Path, sources: list[str] = VALIDITY_SOURCES) -> str:
    """Per CSV: how many rows are valid, and why the others are not."""
    body = []
    for name in sources:
        rows = read(res, name)
        if not rows:
            body.append([f"`{name}.csv`", "", "", "not measured in this revision"])
            continue
        why: dict[str, int] = {}
        for r in rows:
            ok, reason = row_validity(r)
            if not ok:
                key = short_reason(reason)
                why[key] = why.get(key, 0) + 1
        loads = [num(r.get("load_before")) for r in rows if num(r.get("load_before")) is not None]
        fcs = [num(r.get("foreign_cpu")) for r in rows if num(r.get("foreign_cpu")) is not None]
        span = f"{min(loads):.2f}-{max(loads):.2f}" if loads else "not recorded"
        fspan = f"{min(fcs):.2f}-{max(fcs):.2f}" if fcs else "not recorded"
        reasons = "; ".join(f"{n} x {k}" for k, n in sorted(why.items())) or "none"
        body.append([f"`{name}.csv`", f"{len(rows) - sum(why.values())} of {len(rows)}"])
        body[-1] += [f"{span} / {fspan}", reasons]
    head = ["results", "valid rows", "load before / foreign CPU", "invalid because"]
    return (
        f"A row is valid when the CPU used outside its own processes while it ran "
        f"(`foreign_cpu`) is at most {FOREIGN_CPU_MAX:.2f} of a core; rows written before "
        "the quiet guard have no `foreign_cpu` and are invalid. No figure of an invalid row "
        "appears on this page; verdicts use valid rows only.\n\n" + table(head, body)
    )


def block_history_validity(res: Path) -> str:
    return block_validity(res, HISTORY_VALIDITY_SOURCES)


def verdict(r, target, lower_is_better=False, keys=("median", "ci_low", "ci_high")):
    """(verdict, median) of a row against a target; an invalid row gives no verdict."""
    if r is None:
        return "not measured", ""
    ok_row, why = row_validity(r)
    if not ok_row:
        return f"no valid measurement ({short_reason(why)})", INVALID
    med, lo, hi = (num(r.get(k)) for k in keys)
    bound = hi if lower_is_better else lo
    if med is None:
        return "not measured", ""
    ok = med <= target if lower_is_better else med >= target
    sure = bound is not None and (bound <= target if lower_is_better else bound >= target)
    shown_med = f2(med)
    if not ok and shown_med == f2(target):  # e.g. 0.897 against 0.90: not "0.90, not met"
        shown_med = f2(med, 3)
    if not ok:
        word = "not met"
    elif sure:
        word = "met"
    elif bound is None:
        word = "met (median only; no interval, n < 3)"
    else:
        word = "met (median only; the CI reaches " + ("above)" if lower_is_better else "below)")
    return word, shown_med


def block_targets(res: Path) -> str:
    rows = read(res, "bench_scaling") or []
    tr = read(res, "bench_train_overhead") or []
    body = []
    for b in sorted({int(r["batch"]) for r in rows}):
        r = pick(rows, b, "efficiency_vs_ceiling", "hvdscale")
        w, v = verdict(r, TARGET_EFF_VS_CEILING)
        text = f"2 workers >= {TARGET_EFF_VS_CEILING:.2f} of the independent ceiling, batch {b}"
        body.append([text, v, w])
        r = pick(rows, b, "ratio_hvdscale_vs_mwms", "hvdscale", 2)
        w, v = verdict(r, TARGET_RATIO)
        body.append([f"hvdscale >= {TARGET_RATIO:.1f}x best MWMS, 2 workers, batch {b}", v, w])
    for b in sorted({int(r["batch"]) for r in rows}):
        r = pick(rows, b, "ratio_hvdscale_vs_keras", "hvdscale", 1)
        if r is not None:
            w, v = verdict(r, TARGET_RATIO)
            text = f"hvdscale >= {TARGET_RATIO:.1f}x best Keras, 1 worker, batch {b} (scaling)"
            body.append([text, v, w])
    d = next((r for r in tr if r["variant"] == "default"), None)
    if d is not None:
        keys = ("ratio_vs_keras_best", "ratio_ci_low", "ratio_ci_high")
        w, v = verdict(d, TARGET_RATIO, keys=keys)
        text = f"hvdscale >= {TARGET_RATIO:.1f}x best Keras, 1 rank, batch {d['batch']}"
        body.append([text + " (bench_train_overhead)", v, w])
    ar = read(res, "bench_allreduce_bare") or []
    g = next((r for r in ar if r.get("row") == "summary" and r["arm"] == "gloo"), None)
    if g is not None:
        # against MPI at its fastest setting: a setting that slows MPI's bare loop (a
        # short cycle polls on the cores) must not flatter Gloo
        best = best_mpi(ar)
        g = dict(g, ratio_vs_best=gloo_vs_best(g, best))
        keys = ("ratio_vs_best", "", "")  # a ratio of medians: no interval
        w, v = verdict(g, TARGET_GLOO_VS_MPI, lower_is_better=True, keys=keys)
        text = f"Gloo's allreduce <= {TARGET_GLOO_VS_MPI:.0f}x MPI's, 2 ranks (bare allreduce"
        text += f", against `{best['arm']}`)" if best else ")"
        body.append([text, v, w])
    for text, r in best_ratio_rows(read(res, "frameworks") or []):  # issue 32
        w, v = verdict(r, TARGET_TORCH_VS_HOROVOD, lower_is_better=True, keys=("ratio", "lo", "hi"))
        body.append([text, v, w])
    o = next((r for r in tr if r["variant"] == "instrumentation_overhead"), None)
    keys = ("overhead", "overhead_ci_low", "overhead_ci_high")
    w, v = verdict(o, TARGET_INSTRUMENTATION, lower_is_better=True, keys=keys)
    body.append([f"instrumentation overhead <= {TARGET_INSTRUMENTATION:.2f} of epoch time", v, w])
    return table(["target", "median", "verdict"], body)


BLOCKS: dict[str, Callable[[Path], str]] = {
    "targets": block_targets,
    "scaling-summary": block_scaling_summary,
    "scaling-throughput": block_scaling_throughput,
    "scaling-paired-runs": block_paired_runs,
    "scaling-tuning": block_scaling_runs,
    "frameworks": block_frameworks,
    "frameworks-runs": block_frameworks_runs,
    "torch-step-overhead": block_torch_step_overhead,
    "train-overhead": block_train_overhead,
    "instrumentation": block_instrumentation,
    "allreduce-bare": block_allreduce_bare,
    "cycle-time": block_cycle_time,
    "efficiency-bound": block_efficiency_bound,
    "sync-breakdown": block_sync_breakdown,
    "validity": block_validity,
    "history-validity": block_history_validity,
    "data-phase": block_data_phase,
    "data": block_data,
    "dag": block_dag,
    "report": block_report,
    "slurm": block_slurm,
    "slurm-arrays": block_slurm_arrays,
    "costmodel": block_costmodel,
    "gpu-batch-sweep": block_gpu_batch_sweep,
    "gpu-variants": block_gpu_variants,
    "gpu-step-profile": block_gpu_step_profile,
}


#: the generated pages under docs/ and the blocks each holds (every block on one page)
PAGES: dict[str, tuple[str, ...]] = {
    "performance.md": (
        "targets",
        "validity",
        "scaling-summary",
        "scaling-throughput",
        "scaling-paired-runs",
        "scaling-tuning",
        "frameworks",
        "frameworks-runs",
        "torch-step-overhead",
        "train-overhead",
        "instrumentation",
        "cycle-time",
        "allreduce-bare",
        "data",
        "dag",
        "report",
        "slurm",
        "slurm-arrays",
        "costmodel",
        "gpu-batch-sweep",
        "gpu-variants",
        "gpu-step-profile",
    ),
    "performance-history.md": (
        "history-validity",
        "efficiency-bound",
        "sync-breakdown",
        "data-phase",
    ),
}


def render(text: str, results: Path = RESULTS, page: str = "performance.md") -> str:
    """``text`` (the page ``page`` of PAGES) with its blocks regenerated from ``results``;
    a block of another page, an unknown block or a missing one stops it."""
    mine = PAGES[page]
    seen = set()

    def sub(m):
        name = m.group("name")
        if name not in mine:
            where = next((p for p, names in PAGES.items() if name in names), None)
            why = f"belongs to {where}" if where else "is unknown"
            raise SystemExit(f"{page}: generated block {name!r} {why}")
        seen.add(name)
        return m.group(1) + BLOCKS[name](results) + m.group(4)

    out = BLOCK.sub(sub, text)
    absent = [n for n in mine if n not in seen]
    if absent:
        raise SystemExit(f"{page}: generated blocks missing: {', '.join(absent)}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--check", action="store_true", help="exit 1 when a page is out of date")
    ap.add_argument("--docs", default=str(DOCS), help=f"folder of {', '.join(PAGES)}")
    ap.add_argument("--results", default=str(RESULTS))
    a = ap.parse_args(argv)
    stale = []
    for name in PAGES:
        page = Path(a.docs) / name
        old = page.read_text()
        new = render(old, Path(a.results), name)
        if new == old:
            continue
        if a.check:
            sys.stdout.writelines(
                difflib.unified_diff(
                    old.splitlines(True), new.splitlines(True), str(page), "regenerated"
                )
            )
            stale.append(str(page))
        else:
            page.write_text(new)
            print(f"wrote {page}")
    if stale:
        print(
            f"\n{' and '.join(stale)} {'disagrees' if len(stale) == 1 else 'disagree'} with "
            f"{a.results}/*.csv: run `make perf-docs`",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
