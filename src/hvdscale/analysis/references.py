"""Reference values with tolerances: measured value (95 % bootstrap interval where
every group has 3 or more completed repeats), reference, verdict.

The command line, with what it reads and writes in full, is ``hvdscale check-references``
(``add_arguments``/``run`` at the end of this module).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from hvdscale.analysis.columns import reference_framework
from hvdscale.analysis.stats import bootstrap_ci, rng_for
from hvdscale.analysis.tables import read_runs, read_summary
from hvdscale.analysis.view import config_order, preferred_group, summary_batch
from hvdscale.cliargs import add_options, defaulted
from hvdscale.config.load import load_config, validate_config
from hvdscale.io import atomic_path
from hvdscale.matrix.runid import CONFIG_KEYS, GROUP_KEYS

COLUMNS = [
    "quantity",
    "partition",
    "measured",
    "ci_low",
    "ci_high",
    "min_repeats",
    "reference",
    "tolerance",
    "better",
    "verdict",
    "configuration",
    "note",
]


def references_of(cfg: dict | None) -> dict:
    """The config's ``references`` (validated, defaults filled); the schema's defaults
    without a config."""
    return (cfg if cfg is not None else validate_config({}))["references"]


def _ci(groups, stat):
    """The study checks' interval: hvdscale.analysis.stats.bootstrap_ci, seeded 'study'."""
    return bootstrap_ci(groups, stat, rng=rng_for("study"))


def verdict(measured, ci, reference: float, tolerance: float, better: str) -> str:
    """within / better / worse / inconclusive / not measured (the definitions:
    hvdscale check-references --help)."""
    if measured is None or not math.isfinite(measured):
        return "not measured"
    lo, hi = ci if ci is not None else (measured, measured)
    band_lo, band_hi = reference - tolerance, reference + tolerance
    if lo > band_hi:
        side = "higher"
    elif hi < band_lo:
        side = "lower"
    elif band_lo <= lo and hi <= band_hi:
        return "within"
    else:  # the interval straddles an edge of the band: the data cannot tell
        return "inconclusive"
    return "better" if side == better else "worse"


def _done(runs: pd.DataFrame | None) -> pd.DataFrame:
    if runs is None or runs.empty:
        return pd.DataFrame(columns=["status"])
    return runs[(runs["status"] == "completed") & runs["epoch_time_s"].notna()]


def _values(done: pd.DataFrame, column: str, **match) -> list[float]:
    sel = done
    for k, v in match.items():
        sel = sel[sel[k] == v]
    return [float(x) for x in sel[column].dropna()]


def _slope(workers: list[int], times: list[np.ndarray]) -> float:
    """Least-squares slope of S(n) = median T(1) / median T(n) over n (as the summary);
    vectorised over resamples."""
    med = np.array([np.median(t, axis=-1) for t in times])  # (workers[, resamples])
    s = med[0] / med
    n = np.asarray(workers, float)
    dn = (n - n.mean()).reshape((-1,) + (1,) * (s.ndim - 1))
    return (dn * (s - s.mean(axis=0))).sum(axis=0) / (dn * dn).sum()


def _speedup(cfg_ref: dict, part: str, summary, done) -> dict:
    row = {"quantity": "speedup_per_gpu", "partition": part, "better": "higher"}
    if summary is None or summary.empty:
        return row
    g = summary[(summary["partition"].astype(str) == part) & summary["speedup_per_gpu"].notna()]
    pick = preferred_group(g, summary_batch(summary)) if len(g) else None
    if pick is None:
        return row
    key = {k: pick[k] for k in GROUP_KEYS}
    grp = g[(g[GROUP_KEYS] == pick[GROUP_KEYS]).all(axis=1)]
    workers = sorted(int(w) for w in grp.loc[grp["epoch_time_s"].notna(), "workers"])
    if workers and workers[0] != 1:
        workers = [1, *workers]
    times = [_values(done, "epoch_time_s", **key, workers=w) for w in workers]
    row.update(
        measured=float(pick["speedup_per_gpu"]),
        ci=_ci(times, lambda t: _slope(workers, t)) if len(workers) >= 2 else None,
        min_repeats=min((len(t) for t in times), default=0),
        configuration=f"{part}, {key['backend']}, batch {int(key['batch_per_worker'])}, "
        f"LR {key['lr_rule']}, n = {','.join(map(str, workers))}",
    )
    return row


def _share(quantity: str, summary, done, multi: bool) -> dict:
    row = {"quantity": quantity, "partition": "", "better": "lower"}
    if summary is None or summary.empty or quantity not in summary:
        return row
    s = summary[summary[quantity].notna()]
    if multi:
        s = s[s["workers"] > 1]
    if s.empty:
        return row
    groups = [_values(done, quantity, **{k: r[k] for k in CONFIG_KEYS}) for _, r in s.iterrows()]
    row.update(
        measured=float(s[quantity].median()),
        ci=_ci(groups, lambda gs: np.median([np.median(g, axis=-1) for g in gs], axis=0)),
        min_repeats=min(len(g) for g in groups),
        configuration=f"median over {len(s)} "
        + ("multi-worker configurations" if multi else "configurations"),
    )
    return row


def batch_pair(summary: pd.DataFrame, b0: int, b1: int):
    """((partition, backend, lr_rule, workers), its summary rows by batch) of the
    configuration measured at both per-worker batches b0 and b1 (fewest workers, then
    the preferred backend and LR rule, then the partition's name); None without one."""
    e = summary[summary["epoch_time_s"].notna() & summary["batch_per_worker"].isin([b0, b1])]
    cands = []
    for key, g in e.groupby(["partition", "backend", "lr_rule", "workers"]):
        if {b0, b1} <= set(g["batch_per_worker"]):
            cands.append(((key[3], *config_order(key[1], key[2]), key[0]), key, g))
    if not cands:
        return None
    _, key, g = min(cands, key=lambda c: c[0])
    return key, g.set_index("batch_per_worker")


def _batch(ref: dict, summary, done) -> dict:
    row = {"quantity": "batch_epoch_speedup", "partition": "", "better": "higher"}
    if summary is None or summary.empty:
        return row
    b0, b1 = ref["batch_from"], ref["batch_to"]
    pair = batch_pair(summary, b0, b1)
    if pair is None:
        return row
    (part, be, lr, w), bt = pair
    t = bt["epoch_time_s"]
    match = dict(partition=part, backend=be, lr_rule=lr, workers=w)
    groups = [
        _values(done, "epoch_time_s", **match, batch_per_worker=b0),
        _values(done, "epoch_time_s", **match, batch_per_worker=b1),
    ]
    row.update(
        partition=part,
        measured=float(t[b0] / t[b1]),
        ci=_ci(groups, lambda gs: np.median(gs[0], axis=-1) / np.median(gs[1], axis=-1)),
        min_repeats=min(len(x) for x in groups),
        configuration=f"{part}, {be}, LR {lr}, {w} worker(s), batch {b0} vs {b1}",
    )
    return row


def check_references(
    refs: dict, summary: pd.DataFrame | None, runs: pd.DataFrame | None
) -> pd.DataFrame:
    """The references table (COLUMNS) for the config's ``references`` section; from the
    Horovod-TF runs only (the reference study's framework)."""
    summary, runs = reference_framework(summary), reference_framework(runs)
    done = _done(runs)
    rows = []
    for part, ref in sorted((refs.get("speedup_per_gpu") or {}).items()):
        rows.append((_speedup(refs, part, summary, done), ref))
    for q in ("sync_share", "data_share"):
        if refs.get(q):
            rows.append((_share(q, summary, done, multi=q == "sync_share"), refs[q]))
    if refs.get("batch_epoch_speedup"):
        rows.append(
            (_batch(refs["batch_epoch_speedup"], summary, done), refs["batch_epoch_speedup"])
        )
    out = []
    for row, ref in rows:
        ci = row.pop("ci", None)
        measured = row.get("measured")
        out.append(
            {
                **row,
                "measured": measured,
                "ci_low": ci[0] if ci else None,
                "ci_high": ci[1] if ci else None,
                "min_repeats": row.get("min_repeats"),
                "reference": float(ref["value"]),
                "tolerance": float(ref["tolerance"]),
                "verdict": verdict(measured, ci, ref["value"], ref["tolerance"], row["better"]),
                "configuration": row.get("configuration", ""),
                "note": ""
                if ci or measured is None
                else "no interval (fewer than 3 repeats in some group)",
            }
        )
    return pd.DataFrame(out, columns=COLUMNS)


def read_references(path) -> pd.DataFrame | None:
    if not path or not Path(path).exists():
        return None
    return pd.read_csv(path, keep_default_na=False, na_values=[""], dtype={"partition": str})


def write_references(df: pd.DataFrame, path) -> None:
    with atomic_path(path, ".csv") as tmp:
        df.to_csv(tmp, index=False, float_format="%.6g", lineterminator="\n")


def format_table(df: pd.DataFrame) -> str:
    lines = []
    for r in df.itertuples():
        m = "-" if pd.isna(r.measured) else f"{r.measured:.3g}"
        if not pd.isna(r.ci_low):
            m += f" [{r.ci_low:.3g}, {r.ci_high:.3g}]"
        where = f" {r.partition}" if isinstance(r.partition, str) and r.partition else ""
        lines.append(
            f"  {r.quantity}{where}: {m} vs {r.reference:g} +- {r.tolerance:g} -> {r.verdict}"
        )
    return "\n".join(lines)


def worse(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["verdict"] == "worse"]


# -------------------------------------------------- the command: hvdscale check-references


def add_arguments(p):
    add_options(
        p,
        "--config",
        "--runs",
        "--summary",
        ("--out", defaulted("results/scaling/references.csv")),
        (
            "--strict",
            {"action": "store_true", "help": "exit 1 when a value is worse than its reference"},
        ),
        (
            "--check",
            {
                "metavar": "CSV",
                "help": "only check an existing references.csv (exit 1 on a 'worse' verdict)",
            },
        ),
        ("--ok", "with --check: write this marker file when nothing is worse"),
    )


def run(args) -> int:
    """Reference values with tolerances: measured value (95 % bootstrap interval where
    every group has 3 or more completed repeats), reference, verdict.

    The references come from the config (key ``references``; the defaults are the reference
    study's figures). Quantities and what counts as better:

      speedup_per_gpu      per partition, the preferred group (analysis.view.preferred_group)
                           slope of S(n) over n                                 higher is better
      sync_share           median over multi-worker configurations of the
                           gradient-synchronisation share of the step time     lower is better
      data_share           the same for data loading, over all configurations  lower is better
      batch_epoch_speedup  epoch time at batch_from / at batch_to               higher is better

    Verdict: the band is reference +- tolerance. With an interval (analysis/stats.CI_METHOD),
    the verdict is better or worse only when the whole interval lies outside the band (the
    deviation is not noise), within only when it lies inside, and inconclusive when it
    straddles an edge of the band; without one, the measured value decides. not measured:
    nothing to compare.

    Outputs results/scaling/references.csv. ``--strict`` exits 1 when a verdict is worse
    (after writing the table); ``--check CSV`` only checks an existing table: rule
    enforce_references does that when the config key strict is true, so the table and the
    report are kept and the workflow still fails.

    Example
      hvdscale check-references --config results/config/full.json \
      --runs results/scaling/runs.csv --summary results/scaling/summary.csv \
      --out results/scaling/references.csv [--strict]
    """
    if args.check:
        df = read_references(args.check)
        if df is None:
            raise FileNotFoundError(args.check)
        bad = worse(df)
        if len(bad):
            print(
                f"check-references: {len(bad)} value(s) worse than the reference beyond the "
                f"tolerance (strict):\n{format_table(bad)}",
                file=sys.stderr,
            )
            return 1
        if args.ok:
            Path(args.ok).write_text("no value worse than its reference\n")
        print(f"check-references: {len(df)} reference(s), none worse")
        return 0
    if not args.config:
        raise SystemExit("hvdscale check-references: --config (or --check) is required")
    cfg = load_config(args.config)
    runs = read_runs(args.runs) if Path(args.runs).exists() else None
    summary = read_summary(args.summary) if Path(args.summary).exists() else None
    df = check_references(cfg["references"], summary, runs)
    write_references(df, args.out)
    print(f"check-references: wrote {args.out}\n{format_table(df)}")
    # the config key strict is the workflow's (rule enforce_references, after the table
    # is kept); by hand, --strict
    if args.strict and len(worse(df)):
        print("check-references: worse than the reference beyond the tolerance", file=sys.stderr)
        return 1
    return 0
