"""The report's cost-model section: the fitted latency and bandwidth per partition and
backend, predicted against measured sync time, epoch time and speedup, the prediction
errors, and the cost-model figure."""

from __future__ import annotations

import pandas as pd

from hvdscale.analysis.view import prediction_choice
from hvdscale.figures.registry import in_section
from hvdscale.report import fmt
from hvdscale.report.context import ReportData
from hvdscale.report.doc import Doc

INTRO = (
    "Gradient synchronisation is modelled as one ring allreduce of the model's gradients per "
    "step over the slowest link of the ring: T_sync(p, m) = 2(p-1) alpha_c + 2(p-1)/p n/beta_c "
    "for p ranks on m nodes, with the inside-node link (c = inside, m = 1) or, as soon as "
    "the ring crosses a node boundary, the between-node link (c = between, m > 1). "
    "Horovod's Gloo allreduce and Open MPI's large-message allreduce are flat rings whose "
    "2(p-1) steps each wait for the slowest link, hence this choice over a hierarchical "
    "model. Latency alpha_c and bandwidth beta_c are fitted per partition, backend and link "
    "class from allreduce size sweeps (weighted least squares, relative residuals); a sweep "
    "on one node count fits the inside-node terms only, and predictions for more nodes then "
    "use them (said in the note). With the 1-worker run's data, compute, update and other "
    "time per step, T_step(p) = T_local + T_sync(p, m(p)), the epoch time steps(1)/p "
    "T_step(p) and the speedup follow up to the extrapolation limit."
)
LINK_LABEL = {"inside_node": "inside node", "between_node": "between nodes"}
FIT_HEADER = [
    "Partition",
    "Backend",
    "Link",
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


def _link_rows(f: dict) -> list[tuple[str, dict, str]]:
    """(link label, fit, note) per link class of a fit (one row for an old one-link fit)."""
    links = f.get("links")
    if not links:
        return [("-", f, f.get("note") or "")]
    out = []
    for name, label in LINK_LABEL.items():
        lf = links.get(name)
        if lf is None:
            if name == "between_node":
                out.append((label, {}, "unknown: sweeps on one node only"))
            continue
        out.append((label, lf, lf.get("note") or ""))
    return out


def _fit_table(d: Doc, cm: dict, fits: list[dict]) -> None:
    rows = []
    for f in fits:
        for label, lf, note in _link_rows(f):
            ok = lf.get("alpha_s") is not None and lf.get("beta_Bps")
            lo, hi = lf.get("bytes_min"), lf.get("bytes_max")
            rows.append(
                [
                    f["partition"],
                    f["backend"],
                    d.cell(label),
                    _with_se(fmt.micros(lf.get("alpha_s")), fmt.micros(lf.get("alpha_se_s")), ok),
                    _with_se(fmt.gbps(lf.get("beta_Bps")), fmt.gbps(lf.get("beta_se_Bps")), ok),
                    str(lf.get("n_points", 0)),
                    d.cell(", ".join(str(w) for w in lf.get("workers", []))),
                    f"{lo:.0f}{fmt.EN_DASH}{hi:.3g}" if lo else "-",
                    fmt.percent(lf.get("median_abs_rel_error")),
                    d.cell(note),
                ]
            )
    d.table(
        "Fitted latency alpha (microseconds) and bandwidth beta (GB/s) per link class with "
        "standard errors; points (allreduce measurements with more than one rank), worker "
        "counts, message sizes (bytes) and the median |relative error| of the fit. "
        f"Gradient size n = {cm['model_bytes']:,} bytes.",
        FIT_HEADER,
        rows,
        [16, 13, 17, 21, 22, 11, 21, 22, 13, 24],
        align_right_from=3,
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


def _node_table(d: Doc, et: dict) -> None:
    """Predicted against measured allreduce time of the gradients per rank and node count."""
    rows = [
        [
            r["partition"],
            r["backend"],
            str(r["workers"]),
            str(r["nodes"]),
            d.cell(LINK_LABEL.get(r["link"], r["link"])),
            "fit" if r["role"] == "fit" else "held out",
            fmt.millis(r["sync_s_meas"]),
            fmt.millis(r["sync_s_pred"]),
            fmt.rel_error(r["sync_rel_error"]),
            fmt.percent(r["median_abs_rel_error_sizes"]),
        ]
        for r in et["rows"]
    ]
    k = et.get("fit_max_workers")
    how = (
        f"fitted from the sweeps with at most {k} ranks ('fit'), predicting the others ('held out')"
        if k
        else "fitted from every sweep (in-sample; config key allreduce.fit_max_workers "
        "holds the larger ones out)"
    )
    d.table(
        "Allreduce time of the gradients (ms; measured: log-log interpolation between the two "
        f"nearest measured sizes) per rank and node count, predicted by the model {how}; "
        "relative error (predicted - measured)/measured, and the median |relative error| "
        "over every measured message size.",
        ["Partition", "Backend", "Ranks", "Nodes", "Link", "Role", "Meas.", "Pred.", "Error"]
        + ["Sizes |err|"],
        rows,
        [18, 15, 12, 12, 22, 17, 19, 19, 19, 20],
        align_right_from=2,
    )
    v = et["validated"]
    if v["n"]:
        d.p(
            f"<b>Held-out prediction error</b> ({v['n']} sweeps of "
            f"{', '.join(map(str, v['workers']))} ranks, model fitted from at most {k}): "
            f"median |error| of the gradients' allreduce time "
            f"{fmt.percent(v['median_abs_rel_error_sync'])} (max "
            f"{fmt.percent(v['max_abs_rel_error_sync'])}), over every message size "
            f"{fmt.percent(v['median_abs_rel_error_sizes'])}."
        )


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
        if (cm.get("error_table") or {}).get("rows"):
            _node_table(d, cm["error_table"])
    for fig in in_section("costmodel", r.cfg):
        r.figure(d, fig.name)
