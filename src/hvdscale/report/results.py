"""The report's results: the table per configuration group (speedup per GPU, largest
speedup with the test loss it reached), the table of every configuration, and the
figures of the registry's "results" section."""

from __future__ import annotations

from xml.sax.saxutils import escape

import numpy as np
import pandas as pd

from hvdscale.analysis.columns import framework_label, names_framework, with_framework
from hvdscale.analysis.like import DEFAULT_SETTING, setting_label
from hvdscale.figures.registry import in_section
from hvdscale.matrix.runid import GROUP_KEYS
from hvdscale.report import fmt
from hvdscale.report.accuracy_section import with_ci
from hvdscale.report.context import ReportData, report_target
from hvdscale.report.doc import Doc
from hvdscale.report.equal_accuracy import framework_backend
from hvdscale.target import target_words

GROUP_NOTE = (
    "Speedup per GPU (slope of S(n) over n) per configuration group, with the largest "
    "measured speedup (its worker count), the sync share there and the final test loss "
    "reached with 1 worker and at that worker count. Baseline: ok, missing (no record), "
    "failed (failed or nan_loss) or not_in_sweep."
)
GROUP_HEADER = [
    "Partition",
    "Backend",
    "Batch",
    "LR",
    "Workers done",
    "Baseline",
    "S/GPU",
    "S/GPU (TTT)",
    "Max S (n)",
    "Sync at max",
    "Loss 1 w.",
    "Loss max n",
]
CONFIG_NOTE = (
    "Every configuration: median (min-max) over completed repeats of the epoch time; "
    "throughput; speedup S and efficiency E of the epoch time and speedup of the time to "
    "target (S TTT) against the 1-worker baseline of the group, each with its 95 % bootstrap "
    "interval over repeats [lo-hi] that resamples the baseline's repeats too (none with fewer "
    "than 3 completed repeats: summary.csv's ci_note says why); sync and data shares of the "
    "epoch time; final test loss (evaluated once, at the end of each run) and time to "
    "{target} (median over repeats, a run that did not reach it counted as "
    "+infinity, with reached/total over every run that ended for a reason of training, "
    "completed or diverged, and how many diverged (non-finite loss); '> budget': half or "
    "more hit the budget, no median; 'not reached': half or more did not reach it, some "
    "diverged; 'too loose': the target was met in the warm-up epoch). Runs: "
    "completed/expected repeats."
)
CONFIG_HEADER = [
    "Workers",
    "Nodes",
    "Runs",
    "Epoch time (s)",
    "Samples/s",
    "Speedup S [95 % CI]",
    "Eff. E [95 % CI]",
    "S (TTT) [95 % CI]",
    "Sync",
    "Data",
    "Test loss",
    "TTT (s) (reached)",
]


def group_table_rows(summary: pd.DataFrame) -> pd.DataFrame:
    """One row per group: speedup per GPU, baseline, max speedup with its test loss."""
    rows = []
    for key, g in summary.groupby(GROUP_KEYS, sort=True):
        g = g.sort_values("workers")
        done = g[g["speedup"].notna()]
        top = done.iloc[-1] if not done.empty else None
        one = g.loc[g["workers"] == 1, "final_test_loss"]
        rows.append(
            {
                **dict(zip(GROUP_KEYS, key)),
                "workers": ", ".join(str(int(w)) for w in g.loc[g["n_completed"] > 0, "workers"])
                or "-",
                "baseline_status": g["baseline_status"].iloc[0],
                "speedup_per_gpu": g["speedup_per_gpu"].iloc[0],
                "speedup_per_gpu_ttt": g["speedup_per_gpu_ttt"].iloc[0],
                "max_speedup": top["speedup"] if top is not None else np.nan,
                "max_workers": str(int(top["workers"])) if top is not None else "",
                "loss_at_max": top["final_test_loss"] if top is not None else np.nan,
                "loss_at_1": one.iloc[0] if len(one) else np.nan,
                "sync_at_max": top["sync_share"] if top is not None else np.nan,
            }
        )
    return pd.DataFrame(rows)


def _group_table(d: Doc, summary: pd.DataFrame) -> None:
    multi = names_framework(summary["framework"])
    rows = [
        [
            x.partition,
            d.cell(framework_backend([x.framework], [x.backend])[0]) if multi else x.backend,
            str(int(x.batch_per_worker)),
            x.lr_rule,
            d.cell(x.workers),
            x.baseline_status,
            fmt.slope(x.speedup_per_gpu),
            fmt.slope(x.speedup_per_gpu_ttt),
            fmt.speedup(x.max_speedup)
            + (f" ({x.max_workers})" if fmt.isnum(x.max_speedup) else ""),
            fmt.percent(x.sync_at_max),
            fmt.loss(x.loss_at_1),
            fmt.loss(x.loss_at_max),
        ]
        for x in group_table_rows(summary).itertuples()
    ]
    widths = [14, 14, 10, 11, 24, 18, 11, 14, 17, 15, 16, 16]
    if multi:  # the backend cell names the framework too
        widths[1], widths[4] = 19, 19
    d.table(GROUP_NOTE, GROUP_HEADER, rows, widths, align_right_from=6)


def _config_row(x) -> list[str]:
    def spread(f, mid, lo, hi):
        return fmt.spread(f(mid), f(lo), f(hi))

    ttt = (
        "too loose"
        if x.target_too_loose
        else with_ci(x.speedup_ttt, x.speedup_ttt_lo, x.speedup_ttt_hi)
    )

    return [
        str(int(x.workers)),
        str(int(x.nodes)),
        f"{int(x.n_completed)}/{int(x.n_expected)}",
        spread(fmt.seconds, x.epoch_time_s, x.epoch_time_min_s, x.epoch_time_max_s),
        fmt.rate(x.throughput),
        with_ci(x.speedup, x.speedup_lo, x.speedup_hi),
        with_ci(x.efficiency, x.efficiency_lo, x.efficiency_hi),
        ttt,
        fmt.percent(x.sync_share),
        fmt.percent(x.data_share),
        fmt.loss(x.final_test_loss),
        ttt_with_counts(
            x.time_to_target_s,
            x.n_reached_target,
            getattr(x, "n_ttt_total", x.n_completed),
            getattr(x, "n_nan_loss", 0),
        ),
    ]


def ttt_with_counts(median, reached, total, diverged=0) -> str:
    """A median time to target with reached/total over every run that ended for a
    reason of training (completed or diverged): '12.3 (4/5)', '12.3 (3/5; 1 diverged)';
    '> budget (2/5)' where half or more of the runs are censored (no median) and none
    diverged, 'not reached (2/5; 2 diverged)' where some did."""
    if not fmt.isnum(total) or int(total) == 0:
        return fmt.MISSING
    div = int(diverged) if fmt.isnum(diverged) else 0
    counts = f"({int(reached) if fmt.isnum(reached) else 0}/{int(total)}"
    counts += f"; {div} diverged)" if div else ")"
    if fmt.isnum(median):
        return f"{fmt.seconds(median)} {counts}"
    return f"{'not reached' if div else '> budget'} {counts}"


def _config_table(d: Doc, summary: pd.DataFrame, target: dict | None = None) -> None:
    rows, spans = [], []
    multi = names_framework(summary["framework"])
    for key, g in summary.groupby(GROUP_KEYS, sort=True):
        k = dict(zip(GROUP_KEYS, key))
        g = g.sort_values("workers")
        spans.append(len(rows))
        where = [k["partition"], k["backend"]]
        if multi:
            where.insert(1, framework_label(k["framework"]))
        if (k["precision"], k["compile"]) != DEFAULT_SETTING:  # each setting its own group
            where.append(setting_label(k["precision"], k["compile"]))
        head = (
            f"{' / '.join(where)} / batch {int(k['batch_per_worker'])} per worker / "
            f"LR {k['lr_rule']}  |  "
            f"speedup per GPU {fmt.slope(g['speedup_per_gpu'].iloc[0])}  |  "
            f"baseline {g['baseline_status'].iloc[0]}"
        )
        rows.append([d.cell(head)] + [""] * 11)
        rows += [_config_row(x) for x in g.itertuples()]
    widths = [12, 10, 8, 28, 14, 20, 19, 20, 9, 9, 13, 18]
    note = CONFIG_NOTE.format(target=escape(target_words(target)))
    d.table(note, CONFIG_HEADER, rows, widths, spans=spans, align_right_from=0)


def results_section(d: Doc, r: ReportData) -> None:
    d.page_break()
    d.section("Results")
    summary = with_framework(r.summary)
    if summary.empty or summary["n_completed"].sum() == 0:
        d.p("No run has completed yet: no results to show.")
        return
    _group_table(d, summary)
    _config_table(d, summary, report_target(r))


def figures_section(d: Doc, r: ReportData) -> None:
    d.section("Figures")
    for fig in in_section("results", r.cfg):
        r.figure(d, fig.name)
