"""Compare two studies (before/after a change): ``hvdscale compare A B --out DIR``."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from hvdscale.analysis.columns import ENV_VERSIONS
from hvdscale.analysis.stats import bootstrap_ci, intervals_overlap, rng_for
from hvdscale.analysis.tables import read_runs
from hvdscale.config.load import config_hash
from hvdscale.errors import UserError
from hvdscale.io import atomic_path
from hvdscale.matrix.runid import CONFIG_KEYS
from hvdscale.report.doc import Doc, a4_document, canvas_maker
from hvdscale.study.export import read_archive

METRICS = {
    "epoch_time_s": "epoch time (s)",
    "throughput": "throughput (samples/s)",
    "time_to_target_s": "time to target (s)",
    "efficiency": "efficiency",
}
COLUMNS = [
    *CONFIG_KEYS,
    "metric",
    "a",
    "a_ci_low",
    "a_ci_high",
    "a_n",
    "b",
    "b_ci_low",
    "b_ci_high",
    "b_n",
    "change",
    "flag",
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


def _done(runs: pd.DataFrame) -> pd.DataFrame:
    return runs[runs["status"] == "completed"]


def _samples(done: pd.DataFrame, key: tuple, column: str) -> list[float]:
    sel = done
    for k, v in zip(CONFIG_KEYS, key):
        sel = sel[sel[k] == v]
    return [float(x) for x in sel[column].dropna()]


def _metric(done: pd.DataFrame, key: tuple, metric: str) -> tuple[float | None, tuple | None, int]:
    """(median, 95 % interval or None, repeats) of a metric for one configuration."""
    if metric != "efficiency":
        xs = _samples(done, key, metric)
        if not xs:
            return None, None, 0
        ci = bootstrap_ci([xs], lambda g: np.median(g[0], axis=-1), rng=rng_for("study"))
        return float(np.median(xs)), ci, len(xs)
    workers = int(key[CONFIG_KEYS.index("workers")])
    base_key = tuple(1 if k == "workers" else v for k, v in zip(CONFIG_KEYS, key))
    t1, tn = _samples(done, base_key, "epoch_time_s"), _samples(done, key, "epoch_time_s")
    if not t1 or not tn:
        return None, None, 0

    def eff(g):
        return np.median(g[0], axis=-1) / (workers * np.median(g[1], axis=-1))

    value = float(eff([np.array(t1), np.array(tn)]))
    ci = bootstrap_ci([t1, tn], eff, rng=rng_for("study"))
    return value, ci, min(len(t1), len(tn))


def compare_runs(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """The per-configuration table (COLUMNS) of two runs tables."""
    da, db = _done(a), _done(b)
    keys_a = set(map(tuple, da[CONFIG_KEYS].drop_duplicates().itertuples(index=False)))
    keys_b = set(map(tuple, db[CONFIG_KEYS].drop_duplicates().itertuples(index=False)))
    rows = []
    for key in sorted(keys_a & keys_b, key=lambda k: tuple(str(x) for x in k)):
        for metric in METRICS:
            va, ca, na = _metric(da, key, metric)
            vb, cb, nb = _metric(db, key, metric)
            if va is None and vb is None:
                continue
            overlap = intervals_overlap(ca, cb)
            rows.append(
                {
                    **dict(zip(CONFIG_KEYS, key)),
                    "metric": metric,
                    "a": va,
                    "a_ci_low": ca[0] if ca else None,
                    "a_ci_high": ca[1] if ca else None,
                    "a_n": na,
                    "b": vb,
                    "b_ci_low": cb[0] if cb else None,
                    "b_ci_high": cb[1] if cb else None,
                    "b_n": nb,
                    "change": (vb / va - 1) if va and vb is not None else None,
                    "flag": "no interval"
                    if overlap is None
                    else ("overlap" if overlap else "differs"),
                }
            )
    df = pd.DataFrame(rows, columns=COLUMNS)
    for k in ("batch_per_worker", "workers", "a_n", "b_n"):
        df[k] = df[k].astype("int64")
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


def write_pdf(path, a: Study, b: Study, table: pd.DataFrame, prov: list[dict]) -> None:
    """The short comparison PDF (deterministic like the report: invariant mode)."""
    d = Doc()
    d.p(f"Comparison of two studies: A = {a.name}, B = {b.name}", "title")
    n_diff = int((table["flag"] == "differs").sum())
    d.p(
        f"{table[CONFIG_KEYS].drop_duplicates().shape[0]} configurations measured in both; "
        f"{n_diff} metric(s) whose 95 % intervals do not overlap (marked 'differs'). "
        "Intervals: percentile bootstrap over the completed repeats (3 or more), the "
        "1-worker baseline resampled too for efficiency. Change = B/A - 1.",
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
        rows.append(
            [
                d.cell(f"{r.partition}, {r.backend}, b{r.batch_per_worker}, LR {r.lr_rule}"),
                str(r.workers),
                d.cell(METRICS[m]),
                d.cell(_with_ci(r.a, r.a_ci_low, r.a_ci_high, m)),
                d.cell(_with_ci(r.b, r.b_ci_low, r.b_ci_high, m)),
                "-" if pd.isna(r.change) else f"{100 * r.change:+.1f} %",
                d.cell(r.flag.upper() if r.flag == "differs" else r.flag),
            ]
        )
    d.table(
        "Medians of A and B with 95 % intervals; flag 'DIFFERS' where the intervals do not "
        "overlap.",
        ["Configuration", "n", "Metric", "A", "B", "Change", "Flag"],
        rows,
        [40, 8, 28, 34, 34, 16, 20],
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

    - per configuration (partition, backend, batch per worker, LR rule, workers) measured
      in both: epoch time, throughput, time to target and efficiency of A and of B
      (medians over completed repeats) with 95 % bootstrap intervals where both have 3 or
      more repeats (efficiency resamples the 1-worker baseline too), the relative change
      B/A - 1, and a flag: ``differs`` when the two intervals do not overlap, ``overlap``
      when they do, ``no interval`` when one is missing;
    - what differs in provenance: git commits, config hashes, package versions of the
      train env (run records) and, for archives, of the workflow env, hardware (CPU model,
      devices, hosts; system.json of an archive).

    Example
      hvdscale compare results-before/ results/study.tar.gz --out comparison
    """
    table = compare(args.study_a, args.study_b, args.out)
    diff = table[table["flag"] == "differs"]
    print(
        f"compare: {table[CONFIG_KEYS].drop_duplicates().shape[0]} configurations in both, "
        f"{len(diff)} metric(s) differ (intervals do not overlap); wrote {args.out}/"
        "comparison.csv, provenance.csv, comparison.pdf"
    )
    for r in diff.itertuples():
        print(
            f"  {r.partition} {r.backend} b{r.batch_per_worker} {r.lr_rule} w{r.workers} "
            f"{r.metric}: {format_value(r.a, r.metric)} -> {format_value(r.b, r.metric)}"
        )
    return 0
