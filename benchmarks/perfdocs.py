"""``python -m perfdocs`` (from benchmarks/, ``make perf-docs``): rewrite the generated
blocks of docs/performance.md from benchmarks/results/*.csv; ``--check`` exits 1 with the
difference when the page and the CSVs disagree (tests/test_perf_docs.py runs it).

A block is the text between ``<!-- perf:begin NAME -->`` and ``<!-- perf:end NAME -->``:
a plain table of a CSV's rows (the figures of an invalid row replaced by "invalid"), its
source line, or "not measured" with the make target when the CSV is missing. Validity is
``_quiet.row_validity`` (per core).
"""

from __future__ import annotations

import argparse
import csv
import difflib
import re
import statistics
import sys
from pathlib import Path

from _quiet import FOREIGN_CPU_PER_CORE, LOAD_BEFORE_PER_CORE, MAX_LOAD_PER_CORE, row_validity

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "performance.md"
RESULTS = ROOT / "benchmarks" / "results"
BLOCK = re.compile(r"(<!-- perf:begin ([a-z0-9-]+) -->\n)(.*?)(<!-- perf:end \2 -->)", re.S)

#: CSV -> the make target that writes it
TARGETS = {
    "bench_scaling": "bench-scaling",
    "bench_scaling_runs": "bench-scaling",
    "bench_allreduce_bare": "bench-scaling",
    "frameworks": "bench-frameworks",
    "frameworks_runs": "bench-frameworks",
    "bench_train_overhead": "bench-train",
    "bench_data": "bench-data",
    "costmodel_emulated": "bench-costmodel",
    "costmodel_emulated_errors": "bench-costmodel",
    "gpu_batch_sweep": "benchmarks/gpu_batch_sweep.py on a GPU machine",
}


def read(res: Path, name: str) -> list[dict]:
    p = res / f"{name}.csv"
    return list(csv.DictReader(p.open(newline=""))) if p.exists() else []


def cell(v: str, nd: int | str | None) -> str:
    """A CSV value as shown: ``nd`` decimals, 0 with thousands separators, "g" four
    significant digits, None as is; infinity (a censored time to target) "> budget"."""
    if nd is None or v in ("", None):
        return v or ""
    try:
        x = float(v)
    except ValueError:
        return v
    if x == float("inf"):
        return "> budget"
    if nd == "g":
        return f"{x:.4g}"
    return f"{x:,.0f}" if nd == 0 else f"{x:.{nd}f}"


def ci(r: dict, lo: str = "ci_low", hi: str = "ci_high", nd: int | str = 2) -> str:
    if not r.get(lo) or not r.get(hi):
        return "no interval"
    return f"{cell(r[lo], nd)}-{cell(r[hi], nd)}"


def pct(v: str, nd: int = 2) -> str:
    return f"{float(v) * 100:+.{nd}f} %" if v else ""


def bold(col: str, nd: int | str):
    return lambda r: f"**{cell(r[col], nd)}**"


def ms(col: str):
    return lambda r: cell(str(float(r[col]) * 1e3), 2)


def step_ms(r: dict) -> str:
    if not r.get("epoch_s") or not r.get("steps_per_epoch"):
        return ""
    return f"{float(r['epoch_s']) / float(r['steps_per_epoch']) * 1e3:.2f}"


def source(name: str, rows: list[dict]) -> str:
    before = [float(r["load_before"]) for r in rows if r.get("load_before")]
    busy = [float(r["busy_before"]) for r in rows if r.get("busy_before")]
    dates = sorted({r["date"] for r in rows if r["date"]})
    span = f"{dates[0]} to {dates[-1]}" if len(dates) > 1 else dates[0] if dates else "?"
    return (
        f"Source: `benchmarks/results/{name}.csv`; commit "
        f"{', '.join(sorted({r['commit'] for r in rows}))}; "
        f"{'; '.join(sorted({r['machine'] for r in rows}))}; {span}; 1-minute load before "
        f"{f'{min(before):.2f}-{max(before):.2f}' if before else '?'}"
        + (
            f" (where it was above the guard's threshold, {len(busy)} rows, the machine's CPU "
            f"before them {min(busy):.2f}-{max(busy):.2f} cores)"
            if busy
            else ""
        )
        + "; valid rows "
        f"{sum(row_validity(r)[0] for r in rows)} of {len(rows)}.\n"
    )


def table(name: str, spec: str, keep=lambda r: True, **fns):
    """The block of one CSV: every row ``keep`` admits. ``spec``: the columns, separated by
    ";", each ``HEADER[=COLUMN][:DECIMALS][!]``: COLUMN (default HEADER) is a CSV column or
    a function of the row in ``fns``; "!" marks a figure, "invalid" on an invalid row.
    Load before, the guard's CPU reading, foreign CPU and validity close every row."""
    cols = []
    for item in map(str.strip, spec.split(";")):
        head, _, col = item.rstrip("!").partition("=")
        col, _, nd = (col or head).partition(":")
        nd = None if nd == "" else nd if nd == "g" else int(nd)
        fn = fns.get(col) or (lambda r, c=col, n=nd: cell(r.get(c, ""), n))
        cols.append((head.partition(":")[0], fn, item.endswith("!")))
    cols += [("load before", lambda r: cell(r.get("load_before", ""), 2), False),
             ("CPU before", lambda r: cell(r.get("busy_before", ""), 2), False),
             ("foreign CPU", lambda r: cell(r.get("foreign_cpu", ""), 2), False)]  # fmt: skip

    def block(res: Path) -> str:
        rows = read(res, name)
        if not rows:
            how = TARGETS[name]
            how = f"run `make {how}`" if how.startswith("bench-") else f"run {how}"
            return f"Not measured in this revision (no `benchmarks/results/{name}.csv`); {how}.\n"
        head = [c[0] for c in cols] + ["valid"]
        out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in filter(keep, rows):
            ok, why = row_validity(r)
            cells = [fn(r) if ok or not fig else "invalid" for _, fn, fig in cols]
            out.append("| " + " | ".join(cells + ["yes" if ok else f"**no**: {why}"]) + " |")
        return "\n".join(out) + "\n\n" + source(name, rows)

    return block


SUMMARY = "batch; figure=metric; arm; workers"
FIGURES = "median!; 95 % CI=ci!; repeats=n; note"
SUMMARY_FNS = {"median": bold("median", "g"), "ci": lambda r: ci(r, nd="g")}
BLOCKS = {
    "scaling-summary": table("bench_scaling", f"{SUMMARY}; {FIGURES}",
                             lambda r: r["metric"] != "throughput", **SUMMARY_FNS),
    "scaling-throughput": table("bench_scaling", f"{SUMMARY}; samples/s=median:0!; "
                                "95 % CI=ci!; repeats=n", lambda r: r["metric"] == "throughput",
                                ci=lambda r: ci(r, nd=0)),
    "scaling-runs": table("bench_scaling_runs", "phase; repeat; batch; arm; workers; pinned; "
                          "samples/s=throughput:0!; data share=data_share:2!; status"),
    "frameworks": table("frameworks", "setting; batch; figure=metric; framework=arm; workers; "
                        + FIGURES, **SUMMARY_FNS),
    "frameworks-runs": table("frameworks_runs", "setting; repeat; batch; arm; workers; "
                             "epoch s=epoch_s:3!; samples/s=throughput:0!; "
                             "time to target s=ttt_s:2!; status"),
    "train-overhead": table("bench_train_overhead", "variant; steps_per_execution=spe; jit; "
                            "instrument_every; samples/s=samples_per_s:0!; / Keras best=ratio!; "
                            "95 % CI=ci!; rounds=repeats", lambda r: r["kind"] != "overhead",
                            ratio=bold("ratio_vs_keras_best", 3),
                            ci=lambda r: ci(r, "ratio_ci_low", "ratio_ci_high", 3)),
    "instrumentation": table("bench_train_overhead", "instrument_every; overhead on epoch "
                             "time=overhead!; 95 % CI=ci!; rounds=repeats",
                             lambda r: bool(r.get("overhead")),
                             overhead=lambda r: f"**{pct(r['overhead'])}**",
                             ci=lambda r: f"{pct(r['overhead_ci_low'])} to "
                             f"{pct(r['overhead_ci_high'])}"),
    "allreduce-bare": table("bench_allreduce_bare", "arm; settings; us per call=median_us:0!; "
                            "95 % CI=ci!; / MPI default=ratio_vs_mpi:2!; repeats",
                            lambda r: r.get("row") == "summary",
                            ci=lambda r: ci(r, "ci_low_us", "ci_high_us", 0)),
    "data": table("bench_data", "curves=n_samples:0; shards=n_shards; workers; "
                  "generate s=generate_s:1!; validate s=validate_s:1!; split s=split_s:1!; "
                  "total s=total_s:1!; curves/s=curves_per_s:0!; peak RSS MB=peak_rss_mb:0!; "
                  "/ dd=ratio_to_dd:2!; note"),
    "costmodel": table("costmodel_emulated_errors", "ranks=workers; nodes; slowest link=link; "
                       "role; measured ms=meas!; predicted ms=pred!; error=err!; "
                       "median abs. error over sizes=sizes!",
                       meas=ms("sync_s_meas"), pred=ms("sync_s_pred"),
                       err=lambda r: pct(r["sync_rel_error"], 0),
                       sizes=lambda r: pct(r["median_abs_rel_error_sizes"], 0)),
    "gpu-batch-sweep": table("gpu_batch_sweep", "variant; batch; repeat; "
                             "steps/epoch=steps_per_epoch; warm-up s=warm_up_s:1!; "
                             "epoch s=epoch_s:4!; ms/step=step_ms!; samples/s=throughput:0!; "
                             "GPU util %=gpu_util_mean:1!; val loss=final_val_loss:4!; status",
                             step_ms=step_ms),
}  # fmt: skip

# ------------------------------------------------------------------ targets, validity

#: (target, CSV, row filter, (median, lower end, upper end) columns, goal, higher is better)
CI3 = ("median", "ci_low", "ci_high")
GOALS = [
    ("2 workers: efficiency vs the independent ceiling >= 0.90, batch 75", "bench_scaling",
     {"batch": "75", "metric": "efficiency_vs_ceiling"}, CI3, 0.90, True),
    ("2 workers: efficiency vs the independent ceiling >= 0.90, batch 1000", "bench_scaling",
     {"batch": "1000", "metric": "efficiency_vs_ceiling"}, CI3, 0.90, True),
    ("hvdscale >= 1.0x best Keras model.fit, 1 worker, batch 75", "bench_train_overhead",
     {"variant": "default"}, ("ratio_vs_keras_best", "ratio_ci_low", "ratio_ci_high"), 1.0,
     True),
    ("instrumentation overhead <= 0.02 of epoch time", "bench_train_overhead",
     {"kind": "overhead"}, ("overhead", "overhead_ci_low", "overhead_ci_high"), 0.02, False),
]  # fmt: skip


def goal_row(res: Path, text, name, where, cols, goal, up) -> list[str]:
    """met: median and the whole interval on the goal's side; met (median only): the
    interval reaches across."""
    rows = [r for r in read(res, name) if all(r.get(k) == v for k, v in where.items())]
    rows = [r for r in rows if row_validity(r)[0]]
    if not rows:
        return [text, "", f"no valid row (`make {TARGETS[name]}`)"]
    med, lo, hi = (float(rows[0][c]) if rows[0].get(c) else None for c in cols)
    if (med < goal) if up else (med > goal):
        verdict = "not met"
    elif lo is None or hi is None:
        verdict = "met (median; no interval)"
    else:
        verdict = "met" if ((lo >= goal) if up else (hi <= goal)) else "met (median only)"
    return [text, f"{med:.2f}", verdict]


def torch_goal_rows(res: Path) -> list[list[str]]:
    """torch-ddp's 1-worker epoch within 1.2x Horovod-TF's, each framework at its fastest
    setting of a precision (medians of frameworks.csv's valid epoch-time rows)."""
    best: dict = {}
    for r in read(res, "frameworks"):
        if r["metric"] != "epoch_s" or r["workers"] != "1" or not row_validity(r)[0]:
            continue
        r["setting"] = r.get("setting") or "off/fp32"
        key = (int(r["batch"]), r["setting"].split("/")[1], r["arm"])
        if key not in best or float(r["median"]) < float(best[key]["median"]):
            best[key] = r
    out = []
    for b, prec, arm in sorted(best):
        other = best.get((b, prec, "horovod-tf"))
        if arm != "torch-ddp" or other is None:
            continue
        t = best[(b, prec, arm)]
        ratio = float(t["median"]) / float(other["median"])
        text = (f"torch-ddp epoch <= 1.2x Horovod-TF's, 1 worker, batch {b}, best {prec} "
                f"settings ({t['setting']} vs {other['setting']})")  # fmt: skip
        out.append([text, f"{ratio:.2f}", "met" if ratio <= 1.2 else "not met"])
    return out


def costmodel_goal_row(res: Path) -> list[list[str]]:
    rows = [r for r in read(res, "costmodel_emulated_errors") if r["role"] == "validate"]
    rows = [r for r in rows if row_validity(r)[0]]
    if not rows:
        return []
    med = statistics.median(abs(float(r["sync_rel_error"])) for r in rows)
    text = (f"cost model, held out (fitted from <= 4 ranks): median abs. error of the "
            f"sync time per step over {len(rows)} rank/node counts <= 25 %")  # fmt: skip
    return [[text, f"{med * 100:.0f} %", "met" if med <= 0.25 else "not met"]]


def block_targets(res: Path) -> str:
    body = [goal_row(res, *g) for g in GOALS] + torch_goal_rows(res) + costmodel_goal_row(res)
    out = ["| target | median | verdict |", "|---|---|---|"]
    return "\n".join(out + ["| " + " | ".join(r) + " |" for r in body]) + "\n"


def block_validity(res: Path) -> str:
    m, f, lb = MAX_LOAD_PER_CORE, FOREIGN_CPU_PER_CORE, LOAD_BEFORE_PER_CORE

    def on(x: float) -> str:
        return f"({x * 2:g} on 2 cores, {x * 16:g} on 16)"

    out = [
        f"`make bench` starts once the 1-minute load is below {m:g} per core {on(m)}. "
        "Before each arm the guard waits until that load is below the same threshold "
        "again. A row is valid when the CPU used outside its own "
        f"processes while it ran (`foreign_cpu`) is at most {f:g} of a core per core "
        f"{on(f)} of its "
        f"machine, the 1-minute load before it at most {lb:g} per core {on(lb)}, and "
        "`busy_before` within the foreign-CPU limit where the guard read it; rows without "
        "`foreign_cpu` are invalid.\n",
        "| results | valid rows | invalid because |",
        "|---|---|---|",
    ]
    for name in TARGETS:
        rows = read(res, name)
        if not rows:
            out.append(f"| `{name}.csv` |  | not measured in this revision |")
            continue
        why = [row_validity(r)[1] for r in rows]
        reasons = "; ".join(f"{why.count(w)} x {w}" for w in sorted(set(why) - {""}))
        out.append(f"| `{name}.csv` | {why.count('')} of {len(rows)} | {reasons or 'none'} |")
    return "\n".join(out) + "\n"


BLOCKS["targets"] = block_targets
BLOCKS["validity"] = block_validity


def render(text: str, res: Path = RESULTS) -> str:
    """``text`` with every block regenerated; an unknown or a missing block stops it."""
    seen = set()

    def sub(m):
        if m.group(2) not in BLOCKS:
            raise SystemExit(f"performance.md: unknown generated block {m.group(2)!r}")
        seen.add(m.group(2))
        return m.group(1) + BLOCKS[m.group(2)](res) + m.group(4)

    out = BLOCK.sub(sub, text)
    if absent := sorted(set(BLOCKS) - seen):
        raise SystemExit(f"performance.md: generated blocks missing: {', '.join(absent)}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when the page is stale")
    ap.add_argument("--page", default=str(PAGE))
    ap.add_argument("--results", default=str(RESULTS))
    a = ap.parse_args(argv)
    page = Path(a.page)
    old = page.read_text()
    new = render(old, Path(a.results))
    if new == old:
        return 0
    if not a.check:
        page.write_text(new)
        print(f"wrote {page}")
        return 0
    diff = difflib.unified_diff(old.splitlines(True), new.splitlines(True), str(page), "new")
    sys.stdout.writelines(diff)
    print(f"\n{page} disagrees with {a.results}/*.csv: run `make perf-docs`", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
