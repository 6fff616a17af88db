"""The report's cost-model section: the fitted latency and bandwidth per partition and
backend, predicted against measured sync time, epoch time and speedup, the prediction
errors, and the cost-model figure."""

from __future__ import annotations

import pandas as pd

from hvdscale.analysis.figures import in_section
from hvdscale.analysis.select import prediction_choice
from hvdscale.report import fmt
from hvdscale.report.context import ReportData
from hvdscale.report.doc import Doc

INTRO = (
    "Gradient synchronisation is modelled as one ring allreduce of the model's gradients per "
    "step, T_sync(p) = 2(p-1) alpha + 2(p-1)/p n/beta, with latency alpha and bandwidth beta "
    "fitted per partition and backend from an allreduce size sweep (weighted least squares, "
    "relative residuals). With the 1-worker run's data, compute, update and other time per "
    "step, T_step(p) = T_local + T_sync(p), the epoch time steps(1)/p T_step(p) and the "
    "speedup follow up to the extrapolation limit."
)
FIT_HEADER = [
    "Partition",
    "Backend",
    "alpha (us)",
    "beta (GB/s)",
    "Points",
    "Workers",
    "Sizes (B)",
    "Fit error",
    "Note",
]
PRED_HEADER = [
    "Workers",
    "Sync pred.",
    "Sync meas.",
    "Sync err.",
    "Epoch pred.",
    "Epoch meas.",
    "S pred.",
    "S meas.",
    "S err.",
    "Test loss",
]
ERRORS = (
    ("sync_time", "sync time per step"),
    ("epoch_time", "epoch time"),
    ("speedup", "speedup"),
)


def _with_se(value: str, se: str, ok) -> str:
    return value + (f" \u00b1 {se}" if ok else "")


def _fit_table(d: Doc, cm: dict, fits: list[dict]) -> None:
    rows = []
    for f in fits:
        ok = f.get("alpha_s") is not None and f.get("beta_Bps")
        sizes = (
            f"{f['bytes_min']:.0f}{fmt.EN_DASH}{f['bytes_max']:.3g}" if f.get("bytes_min") else "-"
        )
        rows.append(
            [
                f["partition"],
                f["backend"],
                _with_se(fmt.micros(f.get("alpha_s")), fmt.micros(f.get("alpha_se_s")), ok),
                _with_se(fmt.gbps(f.get("beta_Bps")), fmt.gbps(f.get("beta_se_Bps")), ok),
                str(f.get("n_points", 0)),
                d.cell(", ".join(str(w) for w in f.get("workers", []))),
                sizes,
                fmt.percent(f.get("median_abs_rel_error")),
                d.cell(f.get("note") or ""),
            ]
        )
    d.table(
        "Fitted latency alpha (microseconds) and bandwidth beta (GB/s) with standard errors; "
        "points (allreduce measurements with more than one rank), worker counts, message sizes "
        "(bytes) and the median |relative error| of the fit. "
        f"Gradient size n = {cm['model_bytes']:,} bytes.",
        FIT_HEADER,
        rows,
        [17, 14, 22, 24, 11, 25, 24, 14, 29],
        align_right_from=2,
    )


def _prediction_rows(d: Doc, p: dict, loss: dict) -> list[list]:
    med = p.get("median_abs_rel_error") or {}
    head = (
        f"{p['partition']} / {p['backend']} / batch {p['batch_per_worker']} / "
        f"LR {p['lr_rule']}  |  median |error|: sync "
        f"{fmt.percent(med.get('sync_rel_error'))}, speedup "
        f"{fmt.percent(med.get('speedup_rel_error'))}"
    )
    rows = [[d.cell(head)] + [""] * 9]
    group = (p["partition"], p["backend"], p["batch_per_worker"], p["lr_rule"])
    for pt in p["points"]:
        measured = pt["speedup_meas"] is not None
        rows.append(
            [
                str(pt["workers"]),
                fmt.millis(pt["sync_step_s_pred"]),
                fmt.millis(pt["sync_step_s_meas"]),
                fmt.rel_error(pt["sync_rel_error"]),
                fmt.seconds(pt["epoch_time_s_pred"]),
                fmt.seconds(pt["epoch_time_s_meas"]),
                fmt.speedup(pt["speedup_pred"]),
                fmt.speedup(pt["speedup_meas"]),
                fmt.rel_error(pt["speedup_rel_error"]),
                fmt.loss(loss.get((*group, pt["workers"]))) if measured else fmt.MISSING,
            ]
        )
    return rows


def _prediction_table(d: Doc, preds: list[dict], summary: pd.DataFrame | None) -> None:
    b, lr = prediction_choice(preds, summary)
    loss = {}
    if summary is not None and not summary.empty:
        loss = {
            (x.partition, x.backend, int(x.batch_per_worker), x.lr_rule, int(x.workers)): (
                x.final_test_loss
            )
            for x in summary.itertuples()
        }
    rows, spans = [], []
    for p in preds:
        if p["lr_rule"] == lr and p["batch_per_worker"] == b:
            spans.append(len(rows))
            rows += _prediction_rows(d, p, loss)
    d.table(
        "Predicted against measured sync time per step (ms), epoch time (s) and speedup, with "
        "the relative error (predicted - measured)/measured and the test loss the measured runs "
        f"reached; '-': not measured (extrapolation). Shown for LR rule {lr} and batch {b} per "
        "worker; the errors below cover every group.",
        PRED_HEADER,
        rows,
        [13, 17, 17, 17, 18, 18, 16, 16, 16, 18],
        spans=spans,
        align_right_from=0,
    )


def _error_paragraph(d: Doc, errs: dict) -> None:
    parts = []
    for k, label in ERRORS:
        e = errs.get(k) or {}
        if e.get("n"):
            parts.append(
                f"{label} {fmt.percent(e['median_abs_rel_error'])} (median signed "
                f"{fmt.rel_error(e['median_rel_error'])}, "
                f"max {fmt.percent(e['max_abs_rel_error'])}, {e['n']} points)"
            )
    if parts:
        d.p(
            "<b>Prediction error</b> (median |relative error| over every measured multi-worker "
            "point): " + "; ".join(parts) + "."
        )
    else:
        d.p("<b>Prediction error</b>: no measured multi-worker point to compare with.")


def costmodel_section(d: Doc, r: ReportData) -> None:
    d.section("Allreduce cost model")
    d.p(INTRO)
    cm = r.cm or {}
    fits = list(cm.get("fits", []))
    if not fits:
        d.p("<i>No allreduce measurements: the cost model was not fitted.</i>")
    else:
        _fit_table(d, cm, fits)
        preds = [p for p in cm.get("predictions", []) if p.get("points")]
        if preds:
            _prediction_table(d, preds, r.summary)
        else:
            d.p(
                "<i>No prediction: no configuration group has both an allreduce fit and a "
                "completed 1-worker baseline.</i>"
            )
        _error_paragraph(d, cm.get("errors", {}))
    for fig in in_section("costmodel"):
        r.figure(d, fig.name)
