"""The figure registry: every figure of the study once, with its name (the file names
{name}.pdf / {name}.png), title, draw function and caption.

The captions are the reStructuredText files ``workflow/report/{name}.rst`` that
Snakemake's HTML report shows; they are Jinja templates whose values come from the
config (``caption_values``): Snakemake renders them with the plot rule's
``params.caption``, the PDF report with the same values. The Snakemake rules
(``PLOTS``), ``hvdscale plot`` and ``hvdscale report`` all read this registry.

Importing it is cheap (no matplotlib, pandas or Jinja): the workflow imports it when it
parses the rules; a draw function is imported when a figure is drawn.

Adding a figure: write its draw function (raise ``select.NoData`` with a reason where
the data cannot show it; choose rows with ``hvdscale.analysis.view``), add a
``Figure`` here, and its caption ``workflow/report/{name}.rst`` (values as
``{{ c.NAME }}`` after ``{% set c = snakemake.params.caption %}``, from
``caption_values``). The rules, ``hvdscale plot`` and the report pick it up.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

from hvdscale.config.load import count_parameters
from hvdscale.matrix.runtable import run_table
from hvdscale.project import PROJECT_ROOT
from hvdscale.target import FLAT_GAIN, target_metric, target_spec

CAPTION_DIR = PROJECT_ROOT / "workflow" / "report"


@dataclass(frozen=True)
class Figure:
    name: str
    title: str
    # "module:function"; the function takes (runs, summary, epochs, costmodel, references),
    # references: the config's ``references``
    draw: str
    section: str  # where the PDF report shows it: "results", "accuracy" or "costmodel"
    # (metric key, title) where a target on that metric changes what the figure shows
    metric_titles: tuple = ()

    def title_for(self, metric) -> str:
        """The title for a study whose target is on ``metric`` (a workload.base.Metric)."""
        return dict(self.metric_titles).get(metric.key, self.title)

    @property
    def caption_file(self) -> str:
        """The caption's file name in workflow/report/."""
        return f"{self.name}.rst"

    def function(self):
        module, func = self.draw.split(":")
        return getattr(importlib.import_module(module), func)


_SCALING = "hvdscale.figures.scaling"
_TRAINING = "hvdscale.figures.training"
FIGURES = (
    Figure(
        "speedup_efficiency",
        "Speedup and efficiency",
        f"{_SCALING}:fig_speedup_efficiency",
        "results",
    ),
    Figure(
        "sync_time",
        "Gradient synchronisation time per step",
        f"{_SCALING}:fig_sync_time",
        "results",
    ),
    Figure(
        "epoch_time_batch",
        "Epoch time vs per-worker batch size",
        f"{_SCALING}:fig_epoch_time_batch",
        "results",
    ),
    Figure(
        "loss_vs_time",
        "Validation loss vs training time",
        f"{_TRAINING}:fig_loss_vs_time",
        "results",
        (("val_accuracy", "Validation accuracy vs training time"),),
    ),
    Figure(
        "time_breakdown", "Time per step by phase", f"{_TRAINING}:fig_time_breakdown", "results"
    ),
    Figure("utilisation", "Device utilisation", f"{_SCALING}:fig_utilisation", "results"),
    Figure(
        "calibration",
        "Calibration runs' validation loss",
        "hvdscale.figures.time_to_target:fig_calibration",
        "accuracy",
        (("val_accuracy", "Calibration runs' validation loss and accuracy"),),
    ),
    Figure(
        "speedup_ttt",
        "Speedup at equal accuracy",
        "hvdscale.figures.time_to_target:fig_speedup_ttt",
        "accuracy",
    ),
    Figure(
        "tune_heatmap",
        "Learning-rate re-tuning: best validation loss",
        "hvdscale.figures.time_to_target:fig_tune_heatmap",
        "accuracy",
        (("val_accuracy", "Learning-rate re-tuning: best validation accuracy"),),
    ),
    Figure(
        "costmodel",
        "Ring-allreduce cost model: measured vs predicted",
        "hvdscale.figures.costmodel_figure:fig_costmodel",
        "costmodel",
    ),
)
FIGURE_NAMES = [f.name for f in FIGURES]
BY_NAME = {f.name: f for f in FIGURES}


def configured(name: str, cfg: dict | None) -> bool:
    """Whether the study's config asks for what figure ``name`` shows: the calibration
    runs (a calibrated target), the re-tuning sweep (scaling.tune), more than one
    per-worker batch size. Without a config, every figure."""
    if cfg is None:
        return True
    if name == "calibration":
        return cfg["training"]["target"]["mode"] == "calibrated"
    if name == "tune_heatmap":
        return bool(cfg["scaling"].get("tune"))
    if name == "epoch_time_batch":
        return len({r.batch for r in run_table(cfg)}) > 1
    return True


def in_section(section: str, cfg: dict | None = None) -> list[Figure]:
    """The figures the PDF report shows in ``section``: those the config asks for (a
    study without a re-tuning sweep gets no empty re-tuning figure)."""
    return [f for f in FIGURES if f.section == section and configured(f.name, cfg)]


# ----------------------------------------------------------------------------- captions


def caption_values(cfg: dict | None) -> dict:
    """The values the caption templates use (``{{ snakemake.params.caption.NAME }}``),
    from the validated config; empty without one (the templates then leave them out)."""
    if cfg is None:
        return {}
    runs = run_table(cfg)
    batches = sorted({r.batch for r in runs}) or [0]
    tgt = cfg["training"]["target"]
    ref = cfg["references"]["batch_epoch_speedup"] or {}
    metric = target_metric(target_spec(cfg))  # the workload's: validation loss or accuracy
    side = "above" if metric.goal == "min" else "below"
    values = {
        "target": (
            f"{metric.name} {tgt['value']:g}"
            if tgt["mode"] == "absolute"
            else f"{metric.name} {tgt['value']:g} % {side} the calibration runs' median best"
        ),
        "metric": metric.name,  # the target's metric, e.g. validation accuracy
        "reach": f"at or {'below' if metric.goal == 'min' else 'above'}",
        "epochs": cfg["training"]["max_epochs"],
        "n_parameters": f"{count_parameters(cfg):,}",
        "max_workers": max((r.workers for r in runs), default=0),
        "max_extrapolation_workers": cfg["report"]["max_extrapolation_workers"],
        "batch_min": batches[0],
        "batch_max": batches[-1],
        "flat_percent": f"{100 * FLAT_GAIN:g}",  # hvdscale.target: a flattened run
    }
    if tgt["mode"] == "calibrated":  # the calibration runs (figure calibration)
        cal = tgt["calibration"]
        values["target_percent"] = f"{tgt['value']:g}"
        values["calibration_seeds"] = cal["seeds"]
        values["calibration_max_epochs"] = cal["max_epochs"]
        # they stop once flat, after at least min_epochs (where that is below the budget)
        if cal.get("until_flat") and (cal.get("min_epochs") or 0) < cal["max_epochs"]:
            values["calibration_min_epochs"] = cal.get("min_epochs") or 4
    if ref:  # the reference study's batch question (config references.batch_epoch_speedup)
        values["ref_batch_from"] = ref["batch_from"]
        values["ref_batch_to"] = ref["batch_to"]
        values["ref_batch_speedup"] = f"{ref['value']:.0f}"
    return values


def caption_rst(name: str, values: dict, caption_dir: Path = CAPTION_DIR) -> str:
    """The caption of figure ``name`` as reStructuredText, rendered as Snakemake does."""
    import jinja2

    text = (caption_dir / BY_NAME[name].caption_file).read_text()
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(text).render(snakemake={"params": {"caption": values}}).strip()


_RST_INLINE = [
    (re.compile(r"\*\*(.+?)\*\*", re.S), r"<b>\1</b>"),
    (re.compile(r"``(.+?)``", re.S), r'<font face="Courier">\1</font>'),
    (re.compile(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?![\w*])", re.S), r"<i>\1</i>"),
]


def rst_to_markup(text: str) -> str:
    """One paragraph of reStructuredText (bold, italics, literals) -> reportlab markup."""
    out = escape(" ".join(text.split()))
    for pattern, repl in _RST_INLINE:
        out = pattern.sub(repl, out)
    return out


def caption_markup(name: str, values: dict, caption_dir: Path = CAPTION_DIR) -> str:
    """The caption for the PDF report; the title alone where the .rst file is missing."""
    try:
        return rst_to_markup(caption_rst(name, values, caption_dir))
    except FileNotFoundError:
        return escape(BY_NAME[name].title + ".")
