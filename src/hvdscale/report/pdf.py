"""Typeset the scaling report (results/report.pdf) with reportlab.

Sections: provenance (git commit, config file and hash, package versions of both
environments, hosts and hardware, dates); how every time was measured; tables of
speedup, efficiency, speedup per GPU, sync share and the test loss reached (speed is
never shown without the test loss it reached); the figures with numbered captions; a
side-by-side comparison with the reference study; the cost-model fit and its
prediction error; the list of missing and failed runs. Written atomically.

Example
  hvdscale report --config-file config/thesis.yaml --config results/config/full.json \\
      --runs results/scaling/runs.csv --summary results/scaling/summary.csv \\
      --status results/scaling/status.csv --costmodel results/scaling/costmodel.json \\
      --plots-dir results/plots --out results/report.pdf [--provenance results/provenance.json]
"""

from __future__ import annotations

import sys
from pathlib import Path
from xml.sax.saxutils import escape

import numpy as np
import pandas as pd

from hvdscale.report import fmt

GROUP_KEYS = ["partition", "backend", "batch_per_worker", "lr_rule"]
FIGURE_CAPTIONS = {
    "speedup_efficiency": "Speedup S(n) = T(1)/T(n) (top) and efficiency E(n) = S(n)/n (bottom) of the epoch time "
                          "against the number of workers, one panel per partition, one line per backend and "
                          "learning-rate rule; bars span the min-max over repeats; dashed: ideal scaling. The test "
                          "loss each configuration reached is listed in the configuration table.",
    "sync_time": "Gradient synchronisation (allreduce) time per training step against the number of workers, one "
                 "line per backend (median over repeats and learning-rate rules).",
    "epoch_time_batch": "Epoch time against the per-worker batch size (log-log; median and min-max over repeats). "
                        "The legend gives the epoch speedup from batch 75 to 1000 where both were measured.",
    "loss_vs_time": "Test loss (MSE on normalised labels) against training wall-clock time, one line per worker "
                    "count; dotted: target test loss that defines the time to target.",
    "time_breakdown": "Time per training step split into data loading, compute (forward and backward), gradient "
                      "synchronisation, optimizer update and the rest (median over repeats).",
    "utilisation": "Mean device utilisation of rank 0's device during the timed epochs (GPU via NVML, CPU "
                   "otherwise) against the number of workers.",
    "costmodel": "Ring-allreduce cost model. (a) Allreduce time against message size at the largest measured "
                 "worker count (markers) and the fitted model (lines); dotted: the model's gradient size. (b) "
                 "Gradient synchronisation time per step: measured (markers) and predicted (lines) up to the "
                 "extrapolation limit. (c) Epoch-time speedup: measured (markers) and predicted (lines).",
}
FIGURE_ORDER = ["speedup_efficiency", "sync_time", "epoch_time_batch", "loss_vs_time", "time_breakdown",
                "utilisation"]


# ----------------------------------------------------------------------------- styles and helpers


def _styles():
    from reportlab.lib import colors
    from reportlab.lib.enums import TA_CENTER, TA_RIGHT
    from reportlab.lib.styles import ParagraphStyle, getSampleStyleSheet

    ss = getSampleStyleSheet()
    st = {
        "title": ParagraphStyle("title", parent=ss["Title"], fontSize=18, leading=22, spaceAfter=4),
        "subtitle": ParagraphStyle("subtitle", parent=ss["Normal"], fontSize=9.5, leading=12, alignment=TA_CENTER,
                                   textColor=colors.HexColor("#444444"), spaceAfter=10),
        "h1": ParagraphStyle("h1", parent=ss["Heading1"], fontSize=13, leading=16, spaceBefore=10, spaceAfter=5),
        "h2": ParagraphStyle("h2", parent=ss["Heading2"], fontSize=10.5, leading=13, spaceBefore=7, spaceAfter=3),
        "body": ParagraphStyle("body", parent=ss["BodyText"], fontSize=9, leading=11.6, spaceAfter=4),
        "bullet": ParagraphStyle("bullet", parent=ss["BodyText"], fontSize=9, leading=11.6, leftIndent=10,
                                 bulletIndent=2, spaceAfter=1.5),
        "cell": ParagraphStyle("cell", parent=ss["BodyText"], fontSize=7, leading=8.4, spaceAfter=0,
                               spaceBefore=0),
        "cellhead": ParagraphStyle("cellhead", parent=ss["BodyText"], fontName="Helvetica-Bold", fontSize=7,
                                   leading=8.4),
        "cellhead_r": ParagraphStyle("cellhead_r", parent=ss["BodyText"], fontName="Helvetica-Bold", fontSize=7,
                                     leading=8.4, alignment=TA_RIGHT),
        "caption": ParagraphStyle("caption", parent=ss["BodyText"], fontSize=8, leading=10, spaceBefore=2,
                                  spaceAfter=10, textColor=colors.HexColor("#222222")),
        "note": ParagraphStyle("note", parent=ss["BodyText"], fontSize=8, leading=10,
                               textColor=colors.HexColor("#555555")),
    }
    return st


class _Doc:
    """Story builder with table and figure numbering."""

    def __init__(self):
        self.st = _styles()
        self.story: list = []
        self.n_table = 0
        self.n_figure = 0

    def p(self, text, style="body"):
        from reportlab.platypus import Paragraph

        self.story.append(Paragraph(text, self.st[style]))

    def bullets(self, items):
        from reportlab.platypus import Paragraph

        for it in items:
            self.story.append(Paragraph(it, self.st["bullet"], bulletText="\u2022"))

    def h1(self, text):
        self.p(escape(text), "h1")

    def h2(self, text):
        self.p(escape(text), "h2")

    def cell(self, text, head=False, right=False):
        from reportlab.platypus import Paragraph

        style = ("cellhead_r" if right else "cellhead") if head else "cell"
        return Paragraph(escape(str(text)), self.st[style])

    def table(self, caption: str, header: list[str], rows: list[list], widths_mm: list[float], *,
              spans: list[int] = (), align_right_from: int = 1, zebra: bool = True, keep: bool = False):
        """A numbered table: caption above, header repeated on every page.

        ``spans``: row indices (0-based, data rows) that are group headers spanning all columns.
        """
        from reportlab.lib import colors
        from reportlab.lib.units import mm
        from reportlab.platypus import KeepTogether, Paragraph, Table, TableStyle

        self.n_table += 1
        cap = Paragraph(f"<b>Table {self.n_table}.</b> {caption}", self.st["caption"])
        data = [[self.cell(h, head=True, right=i >= align_right_from) for i, h in enumerate(header)]] + rows
        t = Table(data, colWidths=[w * mm for w in widths_mm], repeatRows=1, hAlign="LEFT")
        cmds = [
            ("FONT", (0, 0), (-1, -1), "Helvetica", 7),
            ("LEADING", (0, 0), (-1, -1), 8.4),
            ("VALIGN", (0, 0), (-1, -1), "TOP"),
            ("ALIGN", (align_right_from, 1), (-1, -1), "RIGHT"),
            ("LINEABOVE", (0, 0), (-1, 0), 0.8, colors.black),
            ("LINEBELOW", (0, 0), (-1, 0), 0.5, colors.black),
            ("LINEBELOW", (0, -1), (-1, -1), 0.8, colors.black),
            ("TOPPADDING", (0, 0), (-1, -1), 1.6),
            ("BOTTOMPADDING", (0, 0), (-1, -1), 1.6),
            ("LEFTPADDING", (0, 0), (-1, -1), 2.5),
            ("RIGHTPADDING", (0, 0), (-1, -1), 2.5),
        ]
        span_set = {r + 1 for r in spans}
        if zebra:
            shade = False
            for r in range(1, len(data)):
                if r in span_set:
                    shade = False
                    continue
                if shade:
                    cmds.append(("BACKGROUND", (0, r), (-1, r), colors.HexColor("#f3f3f3")))
                shade = not shade
        for r in span_set:
            cmds += [("SPAN", (0, r), (-1, r)), ("BACKGROUND", (0, r), (-1, r), colors.HexColor("#dde6f0")),
                     ("ALIGN", (0, r), (-1, r), "LEFT")]
        t.setStyle(TableStyle(cmds))
        if keep or len(data) <= 25:
            self.story.append(KeepTogether([cap, t]))
        else:
            self.story.append(cap)
            self.story.append(t)
        from reportlab.platypus import Spacer

        self.story.append(Spacer(1, 8))

    def figure(self, path: Path, caption: str, width_mm: float = 172, max_height_mm: float = 200):
        from reportlab.lib.units import mm
        from reportlab.lib.utils import ImageReader
        from reportlab.platypus import Image, KeepTogether, Paragraph

        self.n_figure += 1
        cap = Paragraph(f"<b>Figure {self.n_figure}.</b> {caption}", self.st["caption"])
        if not path.exists() or path.stat().st_size == 0:
            self.story.append(KeepTogether([Paragraph(f"[figure file {escape(str(path))} is missing]",
                                                      self.st["note"]), cap]))
            return
        iw, ih = ImageReader(str(path)).getSize()
        # keep the figures' font sizes alike: a full-width figure (plots.WIDTH inches at
        # plots' PNG dpi) gets width_mm, narrower ones proportionally less
        from hvdscale.analysis.plots import STYLE, WIDTH

        w = min(width_mm, width_mm * iw / (STYLE["savefig.dpi"] * WIDTH)) * mm
        h = w * ih / iw
        if h > max_height_mm * mm:
            h = max_height_mm * mm
            w = h * iw / ih
        self.story.append(KeepTogether([Image(str(path), width=w, height=h), cap]))


def _canvas_maker(header_left: str, header_right: str):
    from reportlab.lib import colors
    from reportlab.lib.units import mm
    from reportlab.pdfgen import canvas

    class NumberedCanvas(canvas.Canvas):
        """Header on every page and 'page N of M' in the footer (two passes)."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._pages = []

        def showPage(self):
            self._pages.append(dict(self.__dict__))
            self._startPage()

        def save(self):
            total = len(self._pages)
            for state in self._pages:
                self.__dict__.update(state)
                self._decorate(total)
                super().showPage()
            super().save()

        def _decorate(self, total):
            w, h = self._pagesize
            self.saveState()
            self.setFont("Helvetica", 7.5)
            self.setFillColor(colors.HexColor("#555555"))
            self.drawString(18 * mm, h - 11 * mm, header_left)
            self.drawRightString(w - 18 * mm, h - 11 * mm, header_right)
            self.setStrokeColor(colors.HexColor("#999999"))
            self.setLineWidth(0.4)
            self.line(18 * mm, h - 12.5 * mm, w - 18 * mm, h - 12.5 * mm)
            self.drawCentredString(w / 2, 9 * mm, f"page {self._pageNumber} of {total}")
            self.restoreState()

    return NumberedCanvas


# ----------------------------------------------------------------------------- content


def main_batch(summary: pd.DataFrame):
    from hvdscale.analysis.plots import main_batch as mb

    s = summary[summary["epoch_time_s"].notna()]
    return mb(s if not s.empty else summary) if not summary.empty else None


def _pick_group(g: pd.DataFrame, batch=None) -> pd.Series | None:
    """Preferred group of a partition: nccl, batch 75 (or the main batch), LR none."""
    if g.empty:
        return None
    order_be = {"nccl": 0, "mpi": 1, "gloo": 2}
    order_lr = {"none": 0, "linear": 1, "sqrt": 2}
    batch = batch or 75
    g = g.assign(_k=[(order_be.get(b, 9), 0 if bs == batch else 1, abs(bs - batch), order_lr.get(lr, 9))
                     for b, bs, lr in zip(g["backend"], g["batch_per_worker"], g["lr_rule"])])
    return g.sort_values("_k", kind="stable").iloc[0]


def group_table_rows(summary: pd.DataFrame) -> pd.DataFrame:
    """One row per group: speedup per GPU, baseline, max speedup with its test loss."""
    rows = []
    for key, g in summary.groupby(GROUP_KEYS, sort=True):
        g = g.sort_values("workers")
        done = g[g["speedup"].notna()]
        top = done.iloc[-1] if not done.empty else None
        rows.append({
            **dict(zip(GROUP_KEYS, key)),
            "workers": ", ".join(str(int(w)) for w in g.loc[g["n_completed"] > 0, "workers"]) or "-",
            "baseline_status": g["baseline_status"].iloc[0],
            "speedup_per_gpu": g["speedup_per_gpu"].iloc[0],
            "speedup_per_gpu_ttt": g["speedup_per_gpu_ttt"].iloc[0],
            "max_speedup": top["speedup"] if top is not None else np.nan,
            "max_workers": str(int(top["workers"])) if top is not None else "",
            "loss_at_max": top["final_test_loss"] if top is not None else np.nan,
            "loss_at_1": g.loc[g["workers"] == 1, "final_test_loss"].iloc[0] if (g["workers"] == 1).any() else np.nan,
            "sync_at_max": top["sync_share"] if top is not None else np.nan,
        })
    return pd.DataFrame(rows)


def reference_rows(summary: pd.DataFrame) -> list[dict]:
    """The reference study's numbers next to ours (or 'not measured')."""
    ref = fmt.REFERENCE
    out = []
    b_main = main_batch(summary) if summary is not None and not summary.empty else None
    s = summary if summary is not None else pd.DataFrame(columns=GROUP_KEYS + ["workers"])
    for part, value in ref["speedup_per_gpu"].items():
        g = s[(s["partition"].astype(str).str.lower() == part) & s["speedup_per_gpu"].notna()] if len(s) else s
        row = {"quantity": f"Speedup per GPU, {ref['partition_label'][part]}", "reference": fmt.slope(value),
               "ours": "not measured", "config": "-", "loss": "-"}
        pick = _pick_group(g, b_main) if len(g) else None
        if pick is not None:
            grp = g[(g[GROUP_KEYS] == pick[GROUP_KEYS]).all(axis=1)].sort_values("workers")
            top = grp[grp["speedup"].notna()].iloc[-1]
            row.update(ours=fmt.slope(pick["speedup_per_gpu"]),
                       config=f"{pick['partition']}, {pick['backend']}, batch {int(pick['batch_per_worker'])}, "
                              f"LR {pick['lr_rule']}, n = {', '.join(str(int(w)) for w in grp['workers'])}",
                       loss=f"{fmt.loss(top['final_test_loss'])} at {int(top['workers'])} workers")
        out.append(row)
    multi = s[(s["workers"] > 1) & s["sync_share"].notna()] if len(s) else s
    row = {"quantity": "Share of epoch time in gradient synchronisation",
           "reference": fmt.percent(ref["sync_share"], 0), "ours": "not measured", "config": "-", "loss": "-"}
    if len(multi):
        row.update(ours=fmt.spread(fmt.percent(multi["sync_share"].median()), fmt.percent(multi["sync_share"].min()),
                                   fmt.percent(multi["sync_share"].max())),
                   config=f"median (min{fmt.EN_DASH}max) over {len(multi)} multi-worker configurations; "
                          "share of the training-step time")
    out.append(row)
    dat = s[s["data_share"].notna()] if len(s) else s
    row = {"quantity": "Share of epoch time in data loading", "reference": fmt.percent(ref["data_share"], 0),
           "ours": "not measured", "config": "-", "loss": "-"}
    if len(dat):
        row.update(ours=fmt.spread(fmt.percent(dat["data_share"].median()), fmt.percent(dat["data_share"].min()),
                                   fmt.percent(dat["data_share"].max())),
                   config=f"median (min{fmt.EN_DASH}max) over {len(dat)} configurations")
    out.append(row)
    b0, b1 = ref["batch_from"], ref["batch_to"]
    row = {"quantity": f"Epoch speedup from batch {b0} to {b1}", "reference": f"{ref['batch_epoch_speedup']:.0f}x",
           "ours": "not measured", "config": "-", "loss": "-"}
    if len(s):
        e = s[s["epoch_time_s"].notna() & s["batch_per_worker"].isin([b0, b1])]
        cands = []
        for key, g in e.groupby(["partition", "backend", "lr_rule", "workers"]):
            bt = g.set_index("batch_per_worker")
            if b0 in bt.index and b1 in bt.index:
                cands.append((key[3], {"nccl": 0, "mpi": 1, "gloo": 2}.get(key[1], 9),
                              {"none": 0, "linear": 1, "sqrt": 2}.get(key[2], 9), key, bt))
        if cands:
            cands.sort(key=lambda c: c[:3])
            (part, be, lr, w), bt = cands[0][3], cands[0][4]
            row.update(ours=f"{bt.at[b0, 'epoch_time_s'] / bt.at[b1, 'epoch_time_s']:.1f}x",
                       config=f"{part}, {be}, LR {lr}, {w} worker{'s' if w > 1 else ''}",
                       loss=f"{fmt.loss(bt.at[b0, 'final_test_loss'])} (batch {b0}) / "
                            f"{fmt.loss(bt.at[b1, 'final_test_loss'])} (batch {b1})")
    out.append(row)
    return out


def _status_counts(status: pd.DataFrame) -> tuple[list[str], list[list]]:
    cols = ["completed", "nan_loss", "failed", "missing", "malformed"]
    st = status.copy()
    st["partition"] = st["partition"].fillna("(unparsable)")
    rows = []
    for part, g in st.groupby("partition", sort=True):
        vc = g["status"].value_counts()
        rows.append([part] + [str(int(vc.get(c, 0))) for c in cols] + [str(len(g))])
    vc = st["status"].value_counts()
    rows.append(["all"] + [str(int(vc.get(c, 0))) for c in cols] + [str(len(st))])
    return ["Partition"] + cols + ["total"], rows


def build_story(d: _Doc, *, info: dict, cfg, runs, summary, status, cm, plots_dir: Path):
    from reportlab.platypus import PageBreak

    n_total = len(status)
    vc = status["status"].value_counts()
    d.p("Horovod scaling study", "title")
    d.p(escape(f"configuration {info['config_file']}; {n_total} runs in the run table, "
               f"{int(vc.get('completed', 0))} completed; report generated {info['report_date']}"), "subtitle")
    pending = n_total - int(vc.get("completed", 0))
    state = "All runs completed." if pending == 0 else \
        f"{pending} of {n_total} runs did not complete (see the last section); results are partial."
    d.p(f"This report is generated from the run records by <i>hvdscale report</i>. {state} "
        "Every speedup is shown next to the test loss that run reached.")
    head, rows = _status_counts(status)
    d.table("Runs by partition and status (completed; nan_loss: stopped by a non-finite loss; failed: the job "
            "or the training raised an error; missing: no record; malformed: the record failed validation).",
            head, rows, [40, 22, 20, 18, 20, 22, 18], keep=True)

    # ------------------------------------------------------------------ provenance
    d.h1("1  Provenance")
    rec_commits = ", ".join(c[:12] for c in info["run_git_commits"]) or "-"
    match = "-"
    if info["config_hash"] and info["run_config_hashes"]:
        n_other = len([h for h in info["run_config_hashes"] if h != info["config_hash"]])
        match = "all runs used this config" if n_other == 0 else f"{n_other} other config hash(es) in the run records"
    wf = ", ".join(f"{k} {v}" for k, v in info["workflow_env"].items())
    tr = "; ".join(f"{k} {v}" for k, v in info["train_env"].items()) or "no run records"
    prov_rows = [
        ("Git commit (report)", info["git_commit"]),
        ("Git commit(s) (runs)", rec_commits),
        ("Config file", info["config_file"]),
        ("Config file sha256", info["config_file_sha256"] or "file not found"),
        ("Config hash (validated)", (info["config_hash"] or "-") + f" ({match})"),
        ("Workflow env", wf),
        ("Train env (run records)", tr),
    ]
    prov_rows += [(f"Provenance: {k}", v) for k, v in info["provenance_json"].items()]
    prov_rows += [
        ("Hosts", f"{info['hosts']}"),
        ("Devices", info["devices"]),
        ("CPU model(s)", info["cpu_models"]),
        ("Partitions (config)", "; ".join(info["hardware"]) or "-"),
        ("Runs started (UTC)", info["runs_started"]),
        ("Report date", info["report_date"]),
    ]
    d.table("Provenance of this report and of the runs it summarises.", ["Item", "Value"],
            [[d.cell(k), d.cell(v)] for k, v in prov_rows], [42, 138], align_right_from=99)

    # ------------------------------------------------------------------ method
    d.h1("2  How the times were measured")
    warm = cfg["training"]["warmup_epochs"] if cfg else "the configured"
    target = cfg["training"]["target_test_loss"] if cfg else "the configured"
    d.bullets([
        "<b>Epoch time</b>: rank 0's wall-clock time (time.perf_counter) of one epoch: the training step loop, "
        "the test-set evaluation and the reduction of the epoch's metrics, as recorded in each run's "
        f"metrics.json. The first {warm} epoch(s) of every run are warm-up (graph tracing, caches, "
        "learning-rate warm-up) and are excluded from every timing statistic.",
        "<b>Throughput</b>: samples of all ranks per second of the step loop (evaluation excluded).",
        "<b>Phase split</b>: data loading, compute (forward and backward pass), gradient synchronisation "
        "(Horovod allreduce) and optimizer update, timed inside the compiled training step on instrumented "
        "steps, scaled to all steps and averaged over ranks. The <b>shares</b> (sync, data) are each phase's "
        "sum over the timed epochs divided by the sum of the four phases, i.e. shares of the training-step "
        "time; the rest of the epoch wall time (evaluation, launch overhead) is 'other'.",
        "<b>Per run</b>: the median over the run's timed epochs of the epoch time, the throughput and the "
        "per-step phase times.",
        "<b>Repeats</b>: every configuration is run several times; tables show the median over completed "
        "repeats and the min-max range in brackets.",
        "<b>Baseline</b>: speedup S(n) = T(1)/T(n) divides the median epoch time of the 1-worker run of the "
        "same partition, backend, per-worker batch size and learning-rate rule by that of n workers; "
        "efficiency E(n) = S(n)/n. A group without a completed 1-worker run has no speedup (flagged, not "
        "dropped). <b>Speedup per GPU</b> is the slope of a least-squares line through (n, S(n)), n = 1 "
        "included, as in the reference study.",
        f"<b>Time to target</b>: training wall time (warm-up included) until the end of the first epoch whose "
        f"test loss is at or below {target}; its speedup S_ttt(n) uses the same baseline. Only nan_loss-free, "
        "completed runs enter the statistics.",
    ])

    # ------------------------------------------------------------------ results
    methods = sorted(set(runs["timing_method"].dropna())) if runs is not None and len(runs) else []
    for m in methods[:3]:
        d.p(f"<i>Timing method recorded by the runs:</i> {escape(m)}", "note")
    d.story.append(PageBreak())
    d.h1("3  Results")
    if summary.empty or summary["n_completed"].sum() == 0:
        d.p("No run has completed yet: no results to show.")
    else:
        gt = group_table_rows(summary)
        rows = [[r.partition, r.backend, str(int(r.batch_per_worker)), r.lr_rule, d.cell(r.workers),
                 r.baseline_status, fmt.slope(r.speedup_per_gpu), fmt.slope(r.speedup_per_gpu_ttt),
                 fmt.speedup(r.max_speedup) + (f" ({r.max_workers})" if fmt.isnum(r.max_speedup) else ""),
                 fmt.percent(r.sync_at_max), fmt.loss(r.loss_at_1), fmt.loss(r.loss_at_max)]
                for r in gt.itertuples()]
        d.table("Speedup per GPU (slope of S(n) over n) per configuration group, with the largest measured "
                "speedup (its worker count), the sync share there and the final test loss reached with 1 worker "
                "and at that worker count. Baseline: ok, missing (no record), failed (failed or nan_loss) or "
                "not_in_sweep.",
                ["Partition", "Backend", "Batch", "LR", "Workers done", "Baseline", "S/GPU", "S/GPU (TTT)",
                 "Max S (n)", "Sync at max", "Loss 1 w.", "Loss max n"],
                rows, [14, 14, 10, 11, 24, 18, 11, 14, 17, 15, 16, 16], align_right_from=6)

        rows, spans = [], []
        for key, g in summary.groupby(GROUP_KEYS, sort=True):
            g = g.sort_values("workers")
            base = g["baseline_status"].iloc[0]
            spans.append(len(rows))
            rows.append([d.cell(f"{key[0]} / {key[1]} / batch {int(key[2])} per worker / LR {key[3]}  |  "
                                f"speedup per GPU {fmt.slope(g['speedup_per_gpu'].iloc[0])}  |  baseline {base}")]
                        + [""] * 11)
            for r in g.itertuples():
                rows.append([
                    str(int(r.workers)), str(int(r.nodes)), f"{int(r.n_completed)}/{int(r.n_expected)}",
                    fmt.spread(fmt.seconds(r.epoch_time_s), fmt.seconds(r.epoch_time_min_s),
                               fmt.seconds(r.epoch_time_max_s)),
                    fmt.rate(r.throughput),
                    fmt.spread(fmt.speedup(r.speedup), fmt.speedup(r.speedup_min), fmt.speedup(r.speedup_max)),
                    fmt.efficiency(r.efficiency), fmt.speedup(r.speedup_ttt), fmt.percent(r.sync_share),
                    fmt.percent(r.data_share), fmt.loss(r.final_test_loss), fmt.seconds(r.time_to_target_s),
                ])
        d.table("Every configuration: median (min-max) over completed repeats of the epoch time; throughput; "
                "speedup S and efficiency E of the epoch time and speedup of the time to target (S TTT) against "
                "the 1-worker baseline of the group; sync and data shares of the epoch time; final test loss "
                "and time to target (median over repeats that reached it). Runs: completed/expected.",
                ["Workers", "Nodes", "Runs", "Epoch time (s)", "Samples/s", "Speedup S", "Eff. E", "S (TTT)",
                 "Sync", "Data", "Test loss", "TTT (s)"],
                rows, [12, 10, 9, 27, 16, 26, 10, 13, 13, 12, 17, 15], spans=spans, align_right_from=0)

    # ------------------------------------------------------------------ figures
    d.h1("4  Figures")
    for name in FIGURE_ORDER:
        d.figure(plots_dir / f"{name}.png", FIGURE_CAPTIONS[name])

    # ------------------------------------------------------------------ reference
    d.h1("5  Comparison with the reference study")
    ref = reference_rows(summary)
    d.table("The reference study's results next to ours where measured. Our speedup per GPU is that of the "
            "preferred group of each partition (NCCL, batch 75, no LR scaling where measured).",
            ["Quantity", "Reference", "This study", "Our configuration", "Test loss reached (ours)"],
            [[d.cell(r["quantity"]), r["reference"], d.cell(r["ours"]), d.cell(r["config"]), d.cell(r["loss"])]
             for r in ref], [44, 17, 27, 56, 36], align_right_from=1, keep=True)

    # ------------------------------------------------------------------ cost model
    d.h1("6  Allreduce cost model")
    _costmodel_section(d, cm, summary, plots_dir)

    # ------------------------------------------------------------------ missing
    d.h1("7  Missing and failed runs")
    bad = status[status["status"] != "completed"].copy()
    if bad.empty:
        d.p(f"All {n_total} runs of the run table completed.")
    else:
        order = {"failed": 0, "nan_loss": 1, "malformed": 2, "missing": 3}
        bad = bad.assign(_o=bad["status"].map(order).fillna(9)).sort_values(["_o", "run_id"])
        rows = [[d.cell(r.run_id), r.status, "" if pd.isna(r.exit_status) else str(int(r.exit_status)),
                 d.cell(("" if r.in_config else "[not in this config's run table] ") + str(r.detail or ""))]
                for r in bad.itertuples()]
        d.table(f"The {len(bad)} runs that did not complete, by status, with exit status and error or reason.",
                ["Run ID", "Status", "Exit", "Detail"], rows, [62, 16, 10, 92], align_right_from=99)


def _costmodel_section(d: _Doc, cm: dict | None, summary: pd.DataFrame, plots_dir: Path):
    d.p("Gradient synchronisation is modelled as one ring allreduce of the model's gradients per step, "
        "T_sync(p) = 2(p-1) alpha + 2(p-1)/p n/beta, with latency alpha and bandwidth beta fitted per partition "
        "and backend from an allreduce size sweep (weighted least squares, relative residuals). With the "
        "1-worker run's data, compute, update and other time per step, T_step(p) = T_local + T_sync(p), the "
        "epoch time steps(1)/p T_step(p) and the speedup follow up to the extrapolation limit.")
    fits = [f for f in (cm or {}).get("fits", [])]
    if not fits:
        d.p("<i>No allreduce measurements: the cost model was not fitted.</i>")
    else:
        rows = []
        for f in fits:
            ok = f.get("alpha_s") is not None and f.get("beta_Bps")
            rows.append([f["partition"], f["backend"],
                         fmt.micros(f.get("alpha_s")) + (f" \u00b1 {fmt.micros(f.get('alpha_se_s'))}" if ok else ""),
                         fmt.gbps(f.get("beta_Bps")) + (f" \u00b1 {fmt.gbps(f.get('beta_se_Bps'))}" if ok else ""),
                         str(f.get("n_points", 0)), d.cell(", ".join(str(w) for w in f.get("workers", []))),
                         f"{f['bytes_min']:.0f}{fmt.EN_DASH}{f['bytes_max']:.3g}" if f.get("bytes_min") else "-",
                         fmt.percent(f.get("median_abs_rel_error")),
                         d.cell(f.get("note") or "")])
        d.table(f"Fitted latency alpha (microseconds) and bandwidth beta (GB/s) with standard errors; points "
                f"(allreduce measurements with more than one rank), worker counts, message sizes (bytes) and the "
                f"median |relative error| of the fit. Gradient size n = {cm['model_bytes']:,} bytes.",
                ["Partition", "Backend", "alpha (us)", "beta (GB/s)", "Points", "Workers", "Sizes (B)",
                 "Fit error", "Note"], rows, [17, 14, 22, 24, 11, 25, 24, 14, 29], align_right_from=2)
        preds = [p for p in cm.get("predictions", []) if p.get("points")]
        errs = cm.get("errors", {})
        if preds:
            b = main_batch(summary) if summary is not None and not summary.empty else None
            lrs = {p["lr_rule"] for p in preds if p["batch_per_worker"] == b} or {p["lr_rule"] for p in preds}
            lr = "none" if "none" in lrs else sorted(lrs)[0]
            sel = [p for p in preds if p["lr_rule"] == lr and (b is None or p["batch_per_worker"] == b)] or preds
            loss = {}
            if summary is not None and not summary.empty:
                loss = {(r.partition, r.backend, int(r.batch_per_worker), r.lr_rule, int(r.workers)):
                        r.final_test_loss for r in summary.itertuples()}
            rows, spans = [], []
            for p in sel:
                spans.append(len(rows))
                med = p.get("median_abs_rel_error") or {}
                rows.append([d.cell(f"{p['partition']} / {p['backend']} / batch {p['batch_per_worker']} / "
                                    f"LR {p['lr_rule']}  |  median |error|: sync "
                                    f"{fmt.percent(med.get('sync_rel_error'))}, speedup "
                                    f"{fmt.percent(med.get('speedup_rel_error'))}")] + [""] * 9)
                for pt in p["points"]:
                    key = (p["partition"], p["backend"], p["batch_per_worker"], p["lr_rule"], pt["workers"])
                    rows.append([str(pt["workers"]), fmt.millis(pt["sync_step_s_pred"]),
                                 fmt.millis(pt["sync_step_s_meas"]), fmt.rel_error(pt["sync_rel_error"]),
                                 fmt.seconds(pt["epoch_time_s_pred"]), fmt.seconds(pt["epoch_time_s_meas"]),
                                 fmt.speedup(pt["speedup_pred"]), fmt.speedup(pt["speedup_meas"]),
                                 fmt.rel_error(pt["speedup_rel_error"]),
                                 fmt.loss(loss.get(key)) if pt["speedup_meas"] is not None else fmt.MISSING])
            d.table("Predicted against measured sync time per step (ms), epoch time (s) and speedup, with the "
                    "relative error (predicted - measured)/measured and the test loss the measured runs reached; "
                    f"'-': not measured (extrapolation). Shown for LR rule {lr}"
                    f"{'' if b is None else f' and batch {b} per worker'}; the errors below cover every group.",
                    ["Workers", "Sync pred.", "Sync meas.", "Sync err.", "Epoch pred.", "Epoch meas.",
                     "S pred.", "S meas.", "S err.", "Test loss"],
                    rows, [13, 17, 17, 17, 18, 18, 16, 16, 16, 18], spans=spans, align_right_from=0)
        else:
            d.p("<i>No prediction: no configuration group has both an allreduce fit and a completed 1-worker "
                "baseline.</i>")
        parts = []
        for k, label in (("sync_time", "sync time per step"), ("epoch_time", "epoch time"),
                         ("speedup", "speedup")):
            e = errs.get(k) or {}
            if e.get("n"):
                parts.append(f"{label} {fmt.percent(e['median_abs_rel_error'])} (median signed "
                             f"{fmt.rel_error(e['median_rel_error'])}, max {fmt.percent(e['max_abs_rel_error'])}, "
                             f"{e['n']} points)")
        if parts:
            d.p("<b>Prediction error</b> (median |relative error| over every measured multi-worker point): "
                + "; ".join(parts) + ".")
        else:
            d.p("<b>Prediction error</b>: no measured multi-worker point to compare with.")
    d.figure(plots_dir / "costmodel.png", FIGURE_CAPTIONS["costmodel"])


# ----------------------------------------------------------------------------- build


def build_report(out, *, config_file, cfg, runs, summary, status, cm, plots_dir, provenance=None) -> dict:
    """Typeset the report to ``out`` (atomically); returns the provenance info used."""
    from reportlab.lib.pagesizes import A4
    from reportlab.lib.units import mm
    from reportlab.platypus import SimpleDocTemplate

    from hvdscale.io import atomic_path
    from hvdscale.report.provenance import collect

    info = collect(config_file=config_file, cfg=cfg, runs=runs, provenance=provenance)
    d = _Doc()
    build_story(d, info=info, cfg=cfg, runs=runs, summary=summary, status=status, cm=cm, plots_dir=Path(plots_dir))
    commit = info["git_commit"]
    header_right = f"{info['config_file']}  |  commit {commit[:12]}{'+dirty' if commit.endswith('+dirty') else ''}"
    with atomic_path(out, ".pdf") as tmp:
        doc = SimpleDocTemplate(str(tmp), pagesize=A4, leftMargin=15 * mm, rightMargin=15 * mm,
                                topMargin=18 * mm, bottomMargin=16 * mm, title="Horovod scaling study",
                                author="hvdscale", subject=f"scaling report for {info['config_file']}",
                                creator="hvdscale report")
        doc.build(d.story, canvasmaker=_canvas_maker("hvdscale scaling report", header_right))
    return info


def add_arguments(p):
    p.add_argument("--config-file", required=True, nargs="+",
                   help="the YAML config file(s) the study was run with, in the order Snakemake merged "
                   "them (paths and sha256 go into the provenance)")
    p.add_argument("--config", required=True, help="the validated config JSON (results/config/full.json)")
    p.add_argument("--runs", default="results/scaling/runs.csv", help="(default: %(default)s)")
    p.add_argument("--summary", default="results/scaling/summary.csv", help="(default: %(default)s)")
    p.add_argument("--status", default="results/scaling/status.csv", help="(default: %(default)s)")
    p.add_argument("--costmodel", help="costmodel.json (optional: without it the cost-model section says so)")
    p.add_argument("--plots-dir", default="results/plots", help="(default: %(default)s)")
    p.add_argument("--provenance", help="optional provenance JSON (e.g. train env versions, hardware)")
    p.add_argument("--out", default="results/report.pdf", help="(default: %(default)s)")


def run(args) -> int:
    from hvdscale.analysis.aggregate import load_config_json, read_runs, read_status, read_summary
    from hvdscale.analysis.plots import load_costmodel
    from hvdscale.report.provenance import load_provenance

    cfg = load_config_json(args.config)
    runs = read_runs(args.runs)
    summary = read_summary(args.summary)
    status = read_status(args.status)
    cm = load_costmodel(args.costmodel)
    if args.costmodel and cm is None:
        print(f"hvdscale report: warning: cost model {args.costmodel} not found; section left empty",
              file=sys.stderr)
    for path in args.config_file:
        if not Path(path).exists():
            print(f"hvdscale report: warning: config file {path} not found; no hash in the provenance",
                  file=sys.stderr)
    plots_dir = Path(args.plots_dir)
    prov = load_provenance(args.provenance)
    build_report(args.out, config_file=args.config_file, cfg=cfg, runs=runs, summary=summary, status=status,
                 cm=cm, plots_dir=plots_dir, provenance=prov)
    print(f"report: wrote {args.out}")
    return 0
