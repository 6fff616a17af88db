"""Compare two studies (before/after a change): ``hvdscale compare A B --out DIR``."""

from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from hvdscale.analysis.columns import ENV_VERSIONS, ttt_runs
from hvdscale.analysis.like import plain, seed_ids
from hvdscale.analysis.stats import (
    bootstrap_ci,
    censored_median,
    censored_median_interval,
    median_interval,
    rng_for,
    speedup_interval,
)
from hvdscale.analysis.tables import read_runs
from hvdscale.analysis.tuning import candidate_runs
from hvdscale.config.load import config_hash
from hvdscale.errors import UserError
from hvdscale.io import atomic_path
from hvdscale.matrix.runid import CONFIG_KEYS
from hvdscale.report import fmt
from hvdscale.report.doc import Doc, a4_document, canvas_maker
from hvdscale.study.export import read_archive

METRICS = {
    "epoch_time_s": "epoch time (s)",
    "throughput": "throughput (samples/s)",
    "time_to_target_s": "time to target (s)",
    "efficiency": "efficiency",
}
#: a configuration of the comparison: the report's (analysis/like.py) and its tuning
#: state: untuned scaling runs, or the selected tuning candidate's re-runs (tuned)
KEYS = [*CONFIG_KEYS, "tuned"]
COLUMNS = [
    *KEYS,
    "metric",
    "a",
    "a_ci_low",
    "a_ci_high",
    "a_n",
    "a_reached",
    "b",
    "b_ci_low",
    "b_ci_high",
    "b_n",
    "b_reached",
    "ratio",
    "ratio_lo",
    "ratio_hi",
    "change",
    "flag",
    "note",
]


@dataclass
class Study:
    name: str
    runs: pd.DataFrame
    config: dict | None = None
    manifest: dict = field(default_factory=dict)
    system: dict = field(default_factory=dict)


def load_study(path) -> Study:
    """A results directory or an archive of ``hvdscale export``."""
    path = Path(path)
    if path.is_file():
        members = read_archive(path)
        manifest = json.loads(members["MANIFEST.json"])
        r = manifest["results_dir"]
        runs_bytes = members.get(f"{r}/scaling/runs.csv")
        if runs_bytes is None:
            raise UserError(f"archive {path}: no {r}/scaling/runs.csv")
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            p = Path(tmp) / "runs.csv"
            p.write_bytes(runs_bytes)
            runs = read_runs(p)
        cfg = json.loads(members[f"{r}/config/full.json"])
        system = json.loads(members.get("system.json", b"{}"))
        return Study(path.name, runs, cfg, manifest, system)
    runs_csv = path / "scaling" / "runs.csv"
    if not runs_csv.exists():
        raise UserError(f"{path}: no scaling/runs.csv (a results directory or an archive)")
    full = path / "config" / "full.json"
    cfg = json.loads(full.read_text()) if full.exists() else None
    return Study(path.name or str(path), read_runs(runs_csv), cfg)


def _sides(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs the report's statistics use, with a ``tuned`` column: untuned scaling runs
    and tuned re-runs (never calibration or tuning-selection runs), each that ended for a
    reason of training (analysis.columns.ttt_runs: a diverged run stays, not reached)."""
    untuned = plain(runs).assign(tuned=False)
    tuned = candidate_runs(runs, "rerun").assign(tuned=True)
    both = pd.concat([untuned, tuned], ignore_index=True)
    return ttt_runs(both) if not both.empty else both


def _select(df: pd.DataFrame, key: dict) -> pd.DataFrame:
    for k, v in key.items():
        df = df[df[k] == v]
    return df


def _metric(g: pd.DataFrame, base: pd.DataFrame, metric: str, name: str) -> dict:
    """One study's side of a metric: median with its interval, repeats, reached."""
    done = g[g["status"] == "completed"]
    if metric == "time_to_target_s":
        m, lo, hi = censored_median_interval(g[metric], name=name)
        reached = int(g["reached_target"].astype(bool).sum())
        return dict(value=m, lo=lo, hi=hi, n=len(g), reached=reached, runs=g)
    if metric != "efficiency":
        m, lo, hi = median_interval(done[metric], name=name)
        return dict(value=m, lo=lo, hi=hi, n=len(done), reached=None, runs=done)
    one = base[base["status"] == "completed"]
    t1, tn = one["epoch_time_s"].dropna().tolist(), done["epoch_time_s"].dropna().tolist()
    if not t1 or not tn:
        return dict(value=None, lo=None, hi=None, n=0, reached=None, runs=done)
    w = int(g["workers"].iloc[0])

    def eff(x):
        return np.median(x[0], axis=-1) / (w * np.median(x[1], axis=-1))

    ci = bootstrap_ci([t1, tn], eff, rng=rng_for(name))
    value = float(eff([np.array(t1), np.array(tn)]))
    return dict(value=value, lo=ci and ci[0], hi=ci and ci[1], n=min(len(t1), len(tn)),
                reached=None, runs=done, t1=t1, tn=tn)  # fmt: skip


def _ratio(sa: dict, sb: dict, metric: str, name: str) -> tuple[float, float, float, str]:
    """(B/A, lo, hi, note): the report's ratio of medians (analysis/stats.speedup_interval:
    censored runs +inf, paired by seed where both studies ran the same seeds); for
    efficiency the ratio of the two efficiencies, all four samples resampled."""
    if metric == "efficiency":
        if sa["value"] is None or sb["value"] is None:
            return math.nan, math.nan, math.nan, "no efficiency on a side"

        def stat(x):
            eff_a = np.median(x[0], axis=-1) / np.median(x[1], axis=-1)
            return np.median(x[2], axis=-1) / np.median(x[3], axis=-1) / eff_a

        ci = bootstrap_ci([sa["t1"], sa["tn"], sb["t1"], sb["tn"]], stat, rng=rng_for(name))
        lo, hi = ci if ci else (math.nan, math.nan)
        return sb["value"] / sa["value"], lo, hi, "" if ci else "no interval: fewer than 3 repeats"
    ra, rb = sa["runs"], sb["runs"]
    ma = censored_median(ra[metric].tolist())[0]
    mb = censored_median(rb[metric].tolist())[0]
    ratio = mb / ma if math.isfinite(ma) and math.isfinite(mb) and ma else math.nan
    lo, hi, note = speedup_interval(
        rb[metric], ra[metric], name, base_repeats=seed_ids(rb), repeats=seed_ids(ra),
        what="repeats",
    )  # fmt: skip
    return ratio, lo, hi, note.replace("this configuration", "A").replace("1-worker baseline", "B")


def _flag(lo: float, hi: float) -> str:
    """'differs' where the ratio's interval excludes 1, 'holds 1' where it holds it."""
    if not (isinstance(lo, float) and isinstance(hi, float)) or math.isnan(lo) or math.isnan(hi):
        return "no interval"
    return "differs" if lo > 1 or hi < 1 else "holds 1"


def compare_runs(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """The per-configuration table (COLUMNS) of two runs tables, with the report's
    grouping, censoring and intervals: per configuration and tuning state measured in
    both, each metric's median in A and in B with its interval, and the ratio B/A with
    its 95 % bootstrap interval; flag 'differs' only where that interval excludes 1."""
    da, db = _sides(a), _sides(b)
    keys_a = set(map(tuple, da[KEYS].drop_duplicates().itertuples(index=False)))
    keys_b = set(map(tuple, db[KEYS].drop_duplicates().itertuples(index=False)))
    rows = []
    for key in sorted(keys_a & keys_b, key=lambda k: tuple(str(x) for x in k)):
        k = dict(zip(KEYS, key))
        ga, gb = _select(da, k), _select(db, k)
        one = {**k, "workers": 1}
        ba, bb = _select(da, one), _select(db, one)
        name = "compare/" + "/".join(map(str, key))
        for metric in METRICS:
            if metric == "efficiency" and k["workers"] == 1:
                continue
            sa = _metric(ga, ba, metric, f"{name}/{metric}/a")
            sb = _metric(gb, bb, metric, f"{name}/{metric}/b")
            if all(x["value"] is None or pd.isna(x["value"]) for x in (sa, sb)):
                continue
            ratio, lo, hi, note = _ratio(sa, sb, metric, f"{name}/{metric}")
            rows.append(
                {
                    **k, "metric": metric,
                    "a": sa["value"], "a_ci_low": sa["lo"], "a_ci_high": sa["hi"],
                    "a_n": sa["n"], "a_reached": sa["reached"],
                    "b": sb["value"], "b_ci_low": sb["lo"], "b_ci_high": sb["hi"],
                    "b_n": sb["n"], "b_reached": sb["reached"],
                    "ratio": ratio, "ratio_lo": lo, "ratio_hi": hi,
                    "change": ratio - 1, "flag": _flag(lo, hi), "note": note,
                }
            )  # fmt: skip
    df = pd.DataFrame(rows, columns=COLUMNS)
    for c in ("batch_per_worker", "workers", "a_n", "b_n"):
        df[c] = df[c].astype("int64")
    for c in ("a_reached", "b_reached"):
        df[c] = df[c].astype("Int64")
    return df


def _values(runs: pd.DataFrame, column: str) -> str:
    if column not in runs:
        return "-"
    vals = sorted({str(v) for v in runs[column].dropna()})
    return ", ".join(vals) if vals else "-"


def provenance_rows(a: Study, b: Study) -> list[dict]:
    """What the two studies ran with: item, A, B, same."""

    def items(s: Study) -> dict[str, str]:
        out = {
            "git commit": _values(s.runs, "git_commit"),
            "config hash (runs)": _values(s.runs, "config_hash"),
            "config hash (study)": config_hash(s.config)[:16] if s.config else "-",
            "CPU model": _values(s.runs, "cpu_model"),
            "devices": _values(s.runs, "devices"),
            "hosts": _values(s.runs, "hosts"),
            "launcher": _values(s.runs, "launcher"),
        }
        for c in ENV_VERSIONS:
            out[f"train env: {c}"] = _values(s.runs, c)
        for k, v in sorted((s.manifest.get("workflow_env") or {}).items()):
            out[f"workflow env: {k}"] = str(v)
        for k in ("cpu_model", "cores", "memory_mb", "gpus", "mpi", "interfaces", "kernel"):
            if k in s.system:
                v = s.system[k]
                out[f"export machine: {k}"] = json.dumps(v) if isinstance(v, list) else str(v)
        return out

    ia, ib = items(a), items(b)
    rows = []
    for k in list(dict.fromkeys([*ia, *ib])):
        va, vb = ia.get(k, "-"), ib.get(k, "-")
        same = None if "-" in (va, vb) else va == vb  # None: known for one study only
        rows.append({"item": k, "a": va, "b": vb, "same": same})
    return rows


def format_value(x, metric: str) -> str:
    if x is None or (isinstance(x, float) and not np.isfinite(x)):
        return "-"
    if metric == "efficiency":
        return f"{x:.2f}"
    if metric == "throughput":
        return f"{x:,.0f}"
    return f"{x:.3g}"


def _with_ci(v, lo, hi, metric) -> str:
    s = format_value(v, metric)
    if lo is not None and not pd.isna(lo):
        s += f" [{format_value(lo, metric)}, {format_value(hi, metric)}]"
    return s


def _reached(reached, n) -> str:
    return "" if reached is None or pd.isna(reached) else f" ({int(reached)}/{int(n)})"


def _ratio_text(ratio, lo, hi) -> str:
    if pd.isna(ratio):
        return "-"
    ci = fmt.interval(lo, hi)
    return f"{fmt.speedup(ratio)}" + (f" {ci}" if ci else "")


def write_pdf(path, a: Study, b: Study, table: pd.DataFrame, prov: list[dict]) -> None:
    """The short comparison PDF (deterministic like the report: invariant mode)."""
    d = Doc()
    d.p(f"Comparison of two studies: A = {a.name}, B = {b.name}", "title")
    n_diff = int((table["flag"] == "differs").sum())
    d.p(
        f"{table[KEYS].drop_duplicates().shape[0]} configurations measured in both "
        "(untuned scaling runs and tuned re-runs apart, each step setting apart); "
        f"{n_diff} metric(s) whose ratio B/A has a 95 % interval that excludes 1 (marked "
        "'differs'). The statistics are the report's: medians over the runs that ended for "
        "a reason of training, a run that did not reach the target (budget or diverged) "
        "counted as +infinity in the time to target, with reached/total; intervals: "
        "percentile bootstrap (3 or more repeats), paired by seed where both studies ran "
        "the same seeds; an interval with an open end is printed as one.",
    )
    d.section("Provenance")
    rows = [
        [
            d.cell(r["item"]),
            d.cell(r["a"]),
            d.cell(r["b"]),
            {True: "same", False: "DIFFERS", None: "-"}[r["same"]],
        ]
        for r in prov
    ]
    d.table("What each study ran with.", ["Item", "A", "B", ""], rows, [42, 62, 62, 14])
    d.section("Per configuration")
    rows = []
    for r in table.itertuples():
        m = r.metric
        setting = (
            "" if (r.precision, r.compile) == ("fp32", "off") else f", {r.precision}/{r.compile}"
        )
        where = f"{r.partition}, {r.backend}{setting}, b{r.batch_per_worker}, LR {r.lr_rule}"
        rows.append(
            [
                d.cell(where + (", tuned" if r.tuned else ", untuned")),
                str(r.workers),
                d.cell(METRICS[m]),
                d.cell(_with_ci(r.a, r.a_ci_low, r.a_ci_high, m) + _reached(r.a_reached, r.a_n)),
                d.cell(_with_ci(r.b, r.b_ci_low, r.b_ci_high, m) + _reached(r.b_reached, r.b_n)),
                d.cell(_ratio_text(r.ratio, r.ratio_lo, r.ratio_hi)),
                d.cell(r.flag.upper() if r.flag == "differs" else r.flag),
            ]
        )
    d.table(
        "Medians of A and B with 95 % intervals (time to target: reached/total); B/A with "
        "its 95 % interval; flag 'DIFFERS' where that interval excludes 1.",
        ["Configuration", "n", "Metric", "A", "B", "B/A [95 % CI]", "Flag"],
        rows,
        [44, 8, 26, 34, 34, 26, 16],
        align_right_from=1,
    )
    buf = io.BytesIO()
    doc = a4_document(
        buf, title="hvdscale study comparison", author="hvdscale", creator="hvdscale compare"
    )
    doc.build(
        d.story, canvasmaker=canvas_maker("hvdscale study comparison", f"A {a.name}  |  B {b.name}")
    )
    with atomic_path(path, ".pdf") as tmp:
        Path(tmp).write_bytes(buf.getvalue())


def compare(a_path, b_path, outdir) -> pd.DataFrame:
    a, b = load_study(a_path), load_study(b_path)
    table = compare_runs(a.runs, b.runs)
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)

    with atomic_path(outdir / "comparison.csv", ".csv") as tmp:
        table.to_csv(tmp, index=False, float_format="%.6g", lineterminator="\n")
    prov = provenance_rows(a, b)
    with atomic_path(outdir / "provenance.csv", ".csv") as tmp:
        pd.DataFrame(prov).to_csv(tmp, index=False, lineterminator="\n")
    write_pdf(outdir / "comparison.pdf", a, b, table, prov)
    return table


# -------------------------------------------------- the command: hvdscale compare


def add_arguments(p):
    p.add_argument("study_a", help="results directory or archive (A, e.g. before)")
    p.add_argument("study_b", help="results directory or archive (B, e.g. after)")
    p.add_argument("--out", default="comparison", help="output directory (default: %(default)s)")


def run(args) -> int:
    """Compare two studies (before/after a change): ``hvdscale compare A B --out DIR``.

    A and B are results directories (with scaling/runs.csv and config/full.json) or
    archives written by ``hvdscale export``. Writes DIR/comparison.csv and a short
    DIR/comparison.pdf:

    - per configuration measured in both (partition, framework, backend, precision,
      compile, batch per worker, LR rule, workers; untuned scaling runs and tuned re-runs
      apart, calibration and tuning-selection runs left out): epoch time, throughput, time
      to target and efficiency of A and of B with the report's statistics (medians over
      the runs that ended for a reason of training; a run that did not reach the target,
      budget or diverged, counted as +inf in the time to target, with reached/total) and
      95 % bootstrap intervals where there are 3 or more repeats; the ratio B/A with its
      95 % interval (paired by seed where both ran the same seeds), and a flag:
      ``differs`` where that interval excludes 1, ``holds 1`` where it holds it, ``no
      interval`` where there is none;
    - what differs in provenance: git commits, config hashes, package versions of the
      train env (run records) and, for archives, of the workflow env, hardware (CPU model,
      devices, hosts; system.json of an archive).

    Example
      hvdscale compare results-before/ results/study.tar.gz --out comparison
    """
    table = compare(args.study_a, args.study_b, args.out)
    diff = table[table["flag"] == "differs"]
    print(
        f"compare: {table[KEYS].drop_duplicates().shape[0]} configurations in both, "
        f"{len(diff)} metric(s) differ (the interval of B/A excludes 1); wrote {args.out}/"
        "comparison.csv, provenance.csv, comparison.pdf"
    )
    for r in diff.itertuples():
        state = "tuned" if r.tuned else "untuned"
        print(
            f"  {r.partition} {r.backend} {r.precision}/{r.compile} b{r.batch_per_worker} "
            f"{r.lr_rule} w{r.workers} {state} {r.metric}: {format_value(r.a, r.metric)} -> "
            f"{format_value(r.b, r.metric)} (B/A {_ratio_text(r.ratio, r.ratio_lo, r.ratio_hi)})"
        )
    return 0
