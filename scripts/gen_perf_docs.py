#!/usr/bin/env python3
"""Regenerate the tables of docs/performance.md from the benchmark results under
benchmarks/results/*.csv (written by the benchmarks through benchmarks/_results.py).

The page holds generated blocks between ``<!-- perf:begin NAME -->`` and
``<!-- perf:end NAME -->``; everything between the markers is replaced, the prose
around them is kept. Every figure on the page comes from a CSV, with its provenance
(commit, machine, date, load). ``--check`` exits 1 (and prints a diff) when the page and
the CSVs disagree; tests/test_perf_docs.py runs it. ``make perf-docs`` rewrites the page.
"""

from __future__ import annotations

import argparse
import csv
import difflib
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "performance.md"
RESULTS = ROOT / "benchmarks" / "results"
BLOCK = re.compile(
    r"(<!-- perf:begin (?P<name>[a-z0-9_-]+) -->\n)(?P<body>.*?)(<!-- perf:end (?P=name) -->)",
    re.S,
)

# the targets of issue 11 (what the page checks the measurements against)
TARGET_EFF_VS_CEILING = 0.90
TARGET_RATIO = 1.0


# --------------------------------------------------------------------------- helpers


def read(results: Path, name: str) -> list[dict] | None:
    p = results / f"{name}.csv"
    if not p.is_file():
        return None
    with open(p, newline="") as fh:
        return list(csv.DictReader(fh))


def num(v) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def f2(v, nd=2) -> str:
    x = num(v)
    return "" if x is None else f"{x:.{nd}f}"


def thousands(v) -> str:
    x = num(v)
    return "" if x is None else f"{x:,.0f}"


def ci(row: dict, lo="ci_low", hi="ci_high", nd=2) -> str:
    a, b = num(row.get(lo)), num(row.get(hi))
    if a is None or b is None:
        return "no interval (n < 3)"
    return f"{a:.{nd}f}-{b:.{nd}f}"


def table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out) + "\n"


def provenance(rows: list[dict], name: str) -> str:
    commits = sorted({r.get("commit", "") for r in rows})
    machines = sorted({r.get("machine", "") for r in rows})
    dates = sorted({r.get("date", "") for r in rows})
    loads = [x for r in rows for x in (num(r.get("load_before")), num(r.get("load_after"))) if x]
    lr = f"{min(loads):.2f}-{max(loads):.2f}" if loads else "not recorded"
    warn = " (above 1.0: noisy)" if loads and max(loads) > 1.0 else ""
    return (
        f"Source: `benchmarks/results/{name}.csv`; commit {', '.join(commits)}; "
        f"{'; '.join(machines)}; {dates[0] if dates else ''}"
        f"{' to ' + dates[-1] if len(dates) > 1 else ''}; 1-minute load {lr}{warn}.\n"
    )


def missing(name: str, how: str) -> str:
    return f"Not measured in this revision (no `benchmarks/results/{name}.csv`); run `{how}`.\n"


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
            note = r.get("note", "")
            body.append([b, text, f"**{f2(r['median'])}**", ci(r), r["n"], note])
    out = table(["batch", "figure", "median", "95 % CI", "repeats", "against"], body)
    return out + "\n" + provenance(rows, "bench_scaling")


def block_scaling_throughput(res: Path) -> str:
    rows = read(res, "bench_scaling")
    if not rows:
        return missing("bench_scaling", "make bench-scaling")
    body = []
    for r in rows:
        if r["metric"] != "throughput":
            continue
        body.append(
            [
                r["batch"],
                r["arm"],
                r["workers"],
                thousands(r["median"]),
                ci(r, nd=0).replace(".", ""),
                r["n"],
            ]
        )
    out = table(["batch", "arm (best settings)", "workers", "samples/s", "95 % CI", "n"], body)
    return out + "\n" + provenance(rows, "bench_scaling")


def block_scaling_runs(res: Path) -> str:
    rows = read(res, "bench_scaling_runs")
    if not rows:
        return missing("bench_scaling_runs", "make bench-scaling")
    body = []
    for r in rows:
        if r["phase"] != "tune":
            continue
        body.append(
            [
                r["batch"],
                r["arm"],
                r["workers"],
                thousands(r["throughput"]) if r["status"] == "ok" else "failed",
                f"{f2(r['load_before'])} / {f2(r['load_after'])}",
            ]
        )
    out = table(["batch", "candidate", "workers", "samples/s", "load before / after"], body)
    return out + "\n" + provenance(rows, "bench_scaling_runs")


def block_paired_runs(res: Path) -> str:
    rows = read(res, "bench_scaling_runs")
    if not rows:
        return missing("bench_scaling_runs", "make bench-scaling")
    body = []
    for r in rows:
        if r["phase"] != "paired":
            continue
        share = num(r.get("data_share"))
        body.append(
            [
                r["repeat"],
                r["batch"],
                r["arm"],
                r["workers"],
                thousands(r["throughput"]) if r["status"] == "ok" else "failed",
                f"{100 * share:.1f} %" if share is not None else "",
                f"{f2(r['load_before'])} / {f2(r['load_after'])}",
            ]
        )
    out = table(
        ["repeat", "batch", "arm", "workers", "samples/s", "data share", "load before / after"],
        body,
    )
    return out + "\n" + provenance(rows, "bench_scaling_runs")


def block_train_overhead(res: Path) -> str:
    rows = read(res, "bench_train_overhead")
    if not rows:
        return missing("bench_train_overhead", "make bench-train")
    body = []
    for r in rows:
        if r["kind"] == "keras":
            settings = (
                f"steps_per_execution {r['spe']}, jit_compile {'on' if r['jit'] == '1' else 'off'}"
            )
        else:
            settings = (
                f"steps_per_execution {r['spe']}, instrument_every {r['instrument_every']}, "
                f"data in device memory {r['in_device_memory']}"
            )
        body.append(
            [
                r["variant"],
                settings,
                thousands(r["samples_per_s"]),
                f"**{f2(r['ratio_vs_keras_best'], 3)}**"
                if r["kind"] != "keras"
                else f2(r["ratio_vs_keras_best"], 3),
                ci(r, "ratio_ci_low", "ratio_ci_high", 3),
            ]
        )
    r0 = rows[0]
    out = table(["variant", "settings", "samples/s", "/ Keras best", "95 % CI"], body)
    out += (
        f"\nKeras best: `{r0['keras_best']}`; {r0['samples']} samples, batch {r0['batch']}, "
        f"{r0['repeats']} rounds, core {r0['core']}.\n"
    )
    return out + "\n" + provenance(rows, "bench_train_overhead")


def block_data(res: Path) -> str:
    rows = read(res, "bench_data")
    if not rows:
        return missing("bench_data", "make bench-data")
    body = []
    for r in rows:
        body.append(
            [
                f"{int(r['n_samples']):,}" + (" (reduced)" if r.get("reduced_size") == "1" else ""),
                r["workers"],
                f2(r["generate_s"]),
                f2(r["validate_s"]),
                f2(r["split_s"]),
                f2(r["total_s"]),
                thousands(r["curves_per_s"]),
                r["peak_rss_mb"],
                f2(r["ratio_to_dd"]),
            ]
        )
    out = table(
        [
            "curves",
            "workers",
            "generate s",
            "validate s",
            "split s",
            "total s",
            "curves/s",
            "peak RSS MiB",
            "total / dd",
        ],
        body,
    )
    notes = sorted({r["note"] for r in rows if r.get("note")})
    if notes:
        out += "\n" + "; ".join(notes) + ".\n"
    return out + "\n" + provenance(rows, "bench_data")


def block_dag(res: Path) -> str:
    rows = read(res, "bench_dag")
    if not rows:
        return missing("bench_dag", "make bench-dag")
    body = [
        [
            r["configfile"],
            r["profile"] or "none",
            r["jobs"],
            f"**{f2(r['seconds_median'])}**",
            ci(r, "seconds_ci_low", "seconds_ci_high"),
            r["repeats"],
            f"< {f2(r['target_s'], 0)} s: {'met' if r['met'] == '1' else 'not met'}",
        ]
        for r in rows
    ]
    out = table(["config", "profile", "plan", "median s", "95 % CI", "runs", "target"], body)
    return out + "\n" + provenance(rows, "bench_dag")


def block_report(res: Path) -> str:
    rows = read(res, "bench_report")
    if not rows:
        return missing("bench_report", "make bench-report")
    body = [[r["step"], f2(r["seconds"]), r["runs"], r["mode"]] for r in rows]
    out = table(["step", "seconds", "run records", "mode"], body)
    return out + "\n" + provenance(rows, "bench_report")


def block_slurm(res: Path) -> str:
    rows = read(res, "bench_slurm_overhead")
    if not rows:
        return missing("bench_slurm_overhead", "make bench-slurm")
    body = [
        [
            r["path"],
            f2(r["seconds_median"], 1),
            ci(r, "seconds_ci_low", "seconds_ci_high", 1),
            f2(r["overhead_s"], 1),
            r["repeats"],
        ]
        for r in rows
    ]
    out = table(["path", "median s", "95 % CI", "overhead s", "rounds"], body)
    return out + "\n" + provenance(rows, "bench_slurm_overhead")


def block_data_phase(res: Path) -> str:
    rows = read(res, "bench_data_phase")
    if not rows:
        return missing("bench_data_phase", ".venv-train/bin/python benchmarks/bench_data_phase.py")
    body = []
    for r in rows:
        share = num(r.get("data_share"))
        body.append(
            [
                r["batch"],
                r["variant"],
                f2(r["data_ms_per_step"], 4),
                ci(r, "data_ms_ci_low", "data_ms_ci_high", 4),
                f2(r["step_ms"], 3),
                f"{100 * share:.1f} %" if share is not None else "",
            ]
        )
    out = table(["batch", "variant", "data ms/step", "95 % CI", "step ms", "data share"], body)
    return out + "\n" + provenance(rows, "bench_data_phase")


def block_targets(res: Path) -> str:
    rows = read(res, "bench_scaling") or []
    tr = read(res, "bench_train_overhead") or []
    body = []

    def verdict(r, target):
        if r is None:
            return "not measured", ""
        lo = num(r.get("ci_low") or r.get("ratio_ci_low"))
        med = num(r.get("median") or r.get("ratio_vs_keras_best"))
        ok = med is not None and med >= target
        sure = lo is not None and lo >= target
        if not ok:
            word = "not met"
        elif sure:
            word = "met"
        elif lo is None:
            word = "met (median only; no interval, n < 3)"
        else:
            word = "met (median only; the CI reaches below)"
        return word, f2(med)

    for b in sorted({int(r["batch"]) for r in rows}):
        r = pick(rows, b, "efficiency_vs_ceiling", "hvdscale")
        w, v = verdict(r, TARGET_EFF_VS_CEILING)
        body.append(
            [
                f"2 workers >= {TARGET_EFF_VS_CEILING:.2f} of the independent ceiling, batch {b}",
                v,
                w,
            ]
        )
        r = pick(rows, b, "ratio_hvdscale_vs_mwms", "hvdscale", 2)
        w, v = verdict(r, TARGET_RATIO)
        body.append([f"hvdscale >= {TARGET_RATIO:.1f}x best MWMS, 2 workers, batch {b}", v, w])
    for b in sorted({int(r["batch"]) for r in rows}):
        r = pick(rows, b, "ratio_hvdscale_vs_keras", "hvdscale", 1)
        if r is not None:
            w, v = verdict(r, TARGET_RATIO)
            body.append(
                [f"hvdscale >= {TARGET_RATIO:.1f}x best Keras, 1 worker, batch {b} (scaling)", v, w]
            )
    d = next((r for r in tr if r["variant"] == "default"), None)
    if d is not None:
        w, v = verdict(d, TARGET_RATIO)
        body.append(
            [
                f"hvdscale >= {TARGET_RATIO:.1f}x best Keras, 1 rank, batch {d['batch']} "
                "(bench_train_overhead)",
                v,
                w,
            ]
        )
    if not body:
        return "No results yet.\n"
    return table(["target", "median", "verdict"], body)


BLOCKS: dict[str, Callable[[Path], str]] = {
    "targets": block_targets,
    "scaling-summary": block_scaling_summary,
    "scaling-throughput": block_scaling_throughput,
    "scaling-paired-runs": block_paired_runs,
    "scaling-tuning": block_scaling_runs,
    "train-overhead": block_train_overhead,
    "data-phase": block_data_phase,
    "data": block_data,
    "dag": block_dag,
    "report": block_report,
    "slurm": block_slurm,
}


def render(text: str, results: Path = RESULTS) -> str:
    seen = set()

    def sub(m):
        name = m.group("name")
        if name not in BLOCKS:
            raise SystemExit(f"{PAGE}: unknown generated block {name!r}")
        seen.add(name)
        return m.group(1) + BLOCKS[name](results) + m.group(4)

    out = BLOCK.sub(sub, text)
    absent = sorted(set(BLOCKS) - seen)
    if absent:
        raise SystemExit(f"{PAGE}: generated blocks missing: {', '.join(absent)}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--check", action="store_true", help="exit 1 when the page is out of date")
    ap.add_argument("--page", default=str(PAGE))
    ap.add_argument("--results", default=str(RESULTS))
    a = ap.parse_args(argv)
    page = Path(a.page)
    old = page.read_text()
    new = render(old, Path(a.results))
    if a.check:
        if new != old:
            sys.stdout.writelines(
                difflib.unified_diff(
                    old.splitlines(True), new.splitlines(True), str(page), "regenerated"
                )
            )
            print(
                f"\n{page} disagrees with {a.results}/*.csv: run `make perf-docs`",
                file=sys.stderr,
            )
            return 1
        return 0
    if new != old:
        page.write_text(new)
        print(f"wrote {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
