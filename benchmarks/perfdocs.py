"""``python -m perfdocs`` (from benchmarks/, ``make perf-docs``): rewrite the generated
blocks of docs/performance.md from benchmarks/results/*.csv; ``--check`` exits 1 with the
difference when the page and the CSVs disagree (tests/test_perf_docs.py runs it).

A block is the text between ``<!-- perf:begin NAME -->`` and ``<!-- perf:end NAME -->``:
a plain table of a CSV's rows (the figures of an invalid row replaced by "invalid"), its
source line (commits, machines, dates, load before, valid rows), or "not measured" with
the make target when the CSV is missing. Validity is ``_quiet.row_validity`` (per core).
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
QUALITY = [("load before", "load_before", 2), ("foreign CPU", "foreign_cpu", 2)]


def read(res: Path, name: str) -> list[dict]:
    p = res / f"{name}.csv"
    return list(csv.DictReader(p.open(newline=""))) if p.exists() else []


def missing(name: str) -> str:
    how = TARGETS[name]
    how = f"run `make {how}`" if how.startswith("bench-") else f"run {how}"
    return f"Not measured in this revision (no `benchmarks/results/{name}.csv`); {how}.\n"


def cell(v: str, nd: int | str | None) -> str:
    """A CSV value as shown: ``nd`` decimals, 0 with thousands separators, "g" four
    significant digits, None as is; infinity (censored) as "> budget"."""
    if nd is None or v in ("", None):
        return v or ""
    try:
        x = float(v)
    except ValueError:
        return v
    if x == float("inf"):
        return "> budget"  # a censored time to target
    if nd == "g":
        return f"{x:.4g}"
    return f"{x:,.0f}" if nd == 0 else f"{x:.{nd}f}"


def table(name: str, cols: list[tuple], rows: list[dict], res_rows: list[dict]) -> str:
    """``cols``: (header, column or function of the row, decimals, is a figure). The
    figures of an invalid row read "invalid"; load before, foreign CPU and validity
    close every row."""
    head = [c[0] for c in cols] + [q[0] for q in QUALITY] + ["valid"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        ok, why = row_validity(r)
        cells = []
        for _, col, nd, figure in cols:
            v = col(r) if callable(col) else cell(r.get(col, ""), nd)
            cells.append(v if ok or not figure else "invalid")
        cells += [cell(r.get(c, ""), nd) for _, c, nd in QUALITY]
        cells.append("yes" if ok else f"**no**: {why}")
        out.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(out) + "\n\n" + source(name, res_rows)


def span(values: list[str]) -> str:
    vals = sorted({v for v in values if v})
    return vals[0] if len(vals) == 1 else f"{vals[0]} to {vals[-1]}" if vals else "?"


def source(name: str, rows: list[dict]) -> str:
    valid = sum(row_validity(r)[0] for r in rows)
    before = [float(r["load_before"]) for r in rows if r.get("load_before")]
    load = f"{min(before):.2f}-{max(before):.2f}" if before else "?"
    commits = ", ".join(sorted({r["commit"] for r in rows}))
    machines = "; ".join(sorted({r["machine"] for r in rows}))
    return (
        f"Source: `benchmarks/results/{name}.csv`; commit {commits}; {machines}; "
        f"{span([r['date'] for r in rows])}; 1-minute load before {load}; valid rows "
        f"{valid} of {len(rows)}.\n"
    )


def ci(r: dict, lo: str = "ci_low", hi: str = "ci_high", nd: int | str = 2) -> str:
    if not r.get(lo) or not r.get(hi):
        return "no interval"
    return f"{cell(r[lo], nd)}-{cell(r[hi], nd)}"


def simple(name: str, cols: list[tuple], keep=lambda r: True):
    """The block of one CSV: every row ``keep`` admits, the columns ``cols``."""

    def block(res: Path) -> str:
        rows = read(res, name)
        if not rows:
            return missing(name)
        return table(name, cols, [r for r in rows if keep(r)], rows)

    return block


SUMMARY = [("batch", "batch", None, False), ("figure", "metric", None, False),
           ("arm", "arm", None, False), ("workers", "workers", None, False),
           ("median", lambda r: f"**{cell(r['median'], 'g')}**", None, True),
           ("95 % CI", lambda r: ci(r, nd="g"), None, True), ("repeats", "n", None, False),
           ("note", "note", None, False)]  # fmt: skip
BLOCKS = {
    "scaling-summary": simple("bench_scaling", SUMMARY, lambda r: r["metric"] != "throughput"),
    "scaling-throughput": simple(
        "bench_scaling",
        [
            *SUMMARY[:4],
            ("samples/s", "median", 0, True),
            ("95 % CI", lambda r: ci(r, nd=0), None, True),
            ("repeats", "n", None, False),
        ],
        lambda r: r["metric"] == "throughput",
    ),  # fmt: skip
    "scaling-runs": simple(
        "bench_scaling_runs",
        [
            ("phase", "phase", None, False),
            ("repeat", "repeat", None, False),
            ("batch", "batch", None, False),
            ("arm", "arm", None, False),
            ("workers", "workers", None, False),
            ("pinned", "pinned", None, False),
            ("samples/s", "throughput", 0, True),
            ("data share", "data_share", 2, True),
            ("status", "status", None, False),
        ],
    ),  # fmt: skip
    "frameworks": simple(
        "frameworks",
        [
            ("setting", "setting", None, False),
            *SUMMARY[:2],
            ("framework", "arm", None, False),
            *SUMMARY[3:],
        ],
    ),  # fmt: skip
    "frameworks-runs": simple(
        "frameworks_runs",
        [
            ("setting", "setting", None, False),
            ("repeat", "repeat", None, False),
            ("batch", "batch", None, False),
            ("arm", "arm", None, False),
            ("workers", "workers", None, False),
            ("epoch s", "epoch_s", 3, True),
            ("samples/s", "throughput", 0, True),
            ("time to target s", "ttt_s", 2, True),
            ("status", "status", None, False),
        ],
    ),  # fmt: skip
    "train-overhead": simple(
        "bench_train_overhead",
        [
            ("variant", "variant", None, False),
            ("steps_per_execution", "spe", None, False),
            ("jit", "jit", None, False),
            ("instrument_every", "instrument_every", None, False),
            ("samples/s", "samples_per_s", 0, True),
            ("/ Keras best", lambda r: f"**{cell(r['ratio_vs_keras_best'], 3)}**", None, True),
            ("95 % CI", lambda r: ci(r, "ratio_ci_low", "ratio_ci_high", 3), None, True),
            ("rounds", "repeats", None, False),
        ],
        lambda r: r["kind"] != "overhead",
    ),  # fmt: skip
    "instrumentation": simple(
        "bench_train_overhead",
        [
            ("instrument_every", "instrument_every", None, False),
            ("overhead on epoch time", lambda r: f"**{pct(r['overhead'])}**", None, True),
            (
                "95 % CI",
                lambda r: f"{pct(r['overhead_ci_low'])} to {pct(r['overhead_ci_high'])}",
                None,
                True,
            ),
            ("rounds", "repeats", None, False),
        ],
        lambda r: bool(r.get("overhead")),
    ),  # fmt: skip
    "allreduce-bare": simple(
        "bench_allreduce_bare",
        [
            ("arm", "arm", None, False),
            ("settings", "settings", None, False),
            ("us per call", "median_us", 0, True),
            ("95 % CI", lambda r: ci(r, "ci_low_us", "ci_high_us", 0), None, True),
            ("/ MPI default", "ratio_vs_mpi", 2, True),
            ("repeats", "repeats", None, False),
        ],
        lambda r: r.get("row") == "summary",
    ),  # fmt: skip
    "data": simple(
        "bench_data",
        [
            ("curves", "n_samples", 0, False),
            ("shards", "n_shards", None, False),
            ("workers", "workers", None, False),
            ("generate s", "generate_s", 1, True),
            ("validate s", "validate_s", 1, True),
            ("split s", "split_s", 1, True),
            ("total s", "total_s", 1, True),
            ("curves/s", "curves_per_s", 0, True),
            ("peak RSS MB", "peak_rss_mb", 0, True),
            ("/ dd", "ratio_to_dd", 2, True),
            ("note", "note", None, False),
        ],
    ),  # fmt: skip
    "costmodel": simple(
        "costmodel_emulated_errors",
        [
            ("ranks", "workers", None, False),
            ("nodes", "nodes", None, False),
            ("slowest link", "link", None, False),
            ("role", "role", None, False),
            ("measured ms", lambda r: cell(str(float(r["sync_s_meas"]) * 1e3), 2), None, True),
            ("predicted ms", lambda r: cell(str(float(r["sync_s_pred"]) * 1e3), 2), None, True),
            ("error", lambda r: pct(r["sync_rel_error"], 0), None, True),
            (
                "median abs. error over sizes",
                lambda r: pct(r["median_abs_rel_error_sizes"], 0),
                None,
                True,
            ),
        ],
    ),  # fmt: skip
    "gpu-batch-sweep": simple(
        "gpu_batch_sweep",
        [
            ("variant", "variant", None, False),
            ("batch", "batch", None, False),
            ("repeat", "repeat", None, False),
            ("steps/epoch", "steps_per_epoch", None, False),
            ("warm-up s", "warm_up_s", 1, True),
            ("epoch s", "epoch_s", 4, True),
            ("ms/step", lambda r: step_ms(r), None, True),
            ("samples/s", "throughput", 0, True),
            ("GPU util %", "gpu_util_mean", 1, True),
            ("val loss", "final_val_loss", 4, True),
            ("status", "status", None, False),
        ],
    ),  # fmt: skip
}


def pct(v: str, nd: int = 2) -> str:
    return f"{float(v) * 100:+.{nd}f} %" if v else ""


def step_ms(r: dict) -> str:
    if not r.get("epoch_s") or not r.get("steps_per_epoch"):
        return ""
    return f"{float(r['epoch_s']) / float(r['steps_per_epoch']) * 1e3:.2f}"


# ------------------------------------------------------------------ targets, validity

#: (target, CSV, row filter, goal, higher is better); the columns: COLUMNS
GOALS = [
    ("2 workers: efficiency vs the independent ceiling >= 0.90, batch 75", "bench_scaling",
     {"batch": "75", "metric": "efficiency_vs_ceiling"}, 0.90, True),
    ("2 workers: efficiency vs the independent ceiling >= 0.90, batch 1000", "bench_scaling",
     {"batch": "1000", "metric": "efficiency_vs_ceiling"}, 0.90, True),
    ("hvdscale >= 1.0x best Keras model.fit, 1 worker, batch 75", "bench_train_overhead",
     {"variant": "default"}, 1.0, True),
    ("instrumentation overhead <= 0.02 of epoch time", "bench_train_overhead",
     {"kind": "overhead"}, 0.02, False),
]  # fmt: skip
COLUMNS = {  # CSV -> (median, lower end, upper end)
    "bench_scaling": ("median", "ci_low", "ci_high"),
    "bench_train_overhead": ("ratio_vs_keras_best", "ratio_ci_low", "ratio_ci_high"),
}


def verdict(med: float, lo: float | None, hi: float | None, goal: float, up: bool) -> str:
    """met: median and the whole interval on the goal's side; met (median only): the
    interval reaches across."""
    if (med < goal) if up else (med > goal):
        return "not met"
    if lo is None or hi is None:
        return "met (median; no interval)"
    return "met" if ((lo >= goal) if up else (hi <= goal)) else "met (median only)"


def goal_row(res: Path, text, name, where, goal, up) -> list[str]:
    rows = [r for r in read(res, name) if all(r.get(k) == v for k, v in where.items())]
    rows = [r for r in rows if row_validity(r)[0]]
    if not rows:
        return [text, "", f"no valid row (`make {TARGETS[name]}`)"]
    r = rows[0]
    if where.get("kind") == "overhead":
        cols = ("overhead", "overhead_ci_low", "overhead_ci_high")
    else:
        cols = COLUMNS[name]
    med, lo, hi = (float(r[c]) if r.get(c) else None for c in cols)
    return [text, f"{med:.2f}", verdict(med, lo, hi, goal, up)]


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
    out = [
        f"The guard waits before each arm until the 1-minute load is below "
        f"{MAX_LOAD_PER_CORE:g} per core ({MAX_LOAD_PER_CORE * 2:g} on 2 cores, "
        f"{MAX_LOAD_PER_CORE * 16:g} on 16). A row is valid when the CPU used outside its "
        f"own processes while it ran (`foreign_cpu`) is at most {FOREIGN_CPU_PER_CORE:g} of "
        f"a core per core of its machine ({FOREIGN_CPU_PER_CORE * 2:g} on 2 cores, "
        f"{FOREIGN_CPU_PER_CORE * 16:g} on 16) and the 1-minute load before it at most "
        f"{LOAD_BEFORE_PER_CORE:g} per core ({LOAD_BEFORE_PER_CORE * 2:g} on 2 cores, "
        f"{LOAD_BEFORE_PER_CORE * 16:g} on 16); rows without `foreign_cpu` are invalid.\n",
        "| results | valid rows | invalid because |",
        "|---|---|---|",
    ]
    for name in TARGETS:
        rows = read(res, name)
        if not rows:
            out.append(f"| `{name}.csv` |  | not measured in this revision |")
            continue
        why = [row_validity(r)[1] for r in rows]
        bad = sorted({w for w in why if w})
        n = sum(not w for w in why)
        reasons = "; ".join(f"{why.count(w)} x {w}" for w in bad) or "none"
        out.append(f"| `{name}.csv` | {n} of {len(rows)} | {reasons} |")
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
