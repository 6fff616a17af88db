"""Typeset the scaling report (results/report.pdf) with reportlab.

The command line, with what it reads and writes in full, is ``hvdscale report``
(hvdscale.commands.report).
"""

from __future__ import annotations

import io
from pathlib import Path

from hvdscale.figures.registry import FIGURE_NAMES, caption_markup, caption_values
from hvdscale.io import atomic_path
from hvdscale.report.accuracy import accuracy_section
from hvdscale.report.context import ReportData
from hvdscale.report.costmodel_section import costmodel_section
from hvdscale.report.doc import Doc, a4_document, canvas_maker
from hvdscale.report.frameworks_section import frameworks_section
from hvdscale.report.overview import (
    method_section,
    missing_section,
    provenance_section,
    title_section,
)
from hvdscale.report.provenance import collect
from hvdscale.report.reference_section import reference_section
from hvdscale.report.results import figures_section, results_section
from hvdscale.report.step_settings_section import step_settings_section
from hvdscale.report.systems_section import systems_section

# The report, in order: each section is a function (Doc, ReportData) in its own module;
# numbered sections number themselves (Doc.section).
SECTIONS = [
    title_section,
    provenance_section,
    systems_section,
    method_section,
    results_section,
    accuracy_section,
    frameworks_section,
    step_settings_section,
    figures_section,
    reference_section,
    costmodel_section,
    missing_section,
]


def build_story(d: Doc, data: ReportData) -> None:
    for section in SECTIONS:
        section(d, data)


def figure_captions(cfg: dict | None) -> dict[str, str]:
    """Every figure's caption (workflow/report/{name}.rst with the config's values)."""
    values = caption_values(cfg)
    return {name: caption_markup(name, values) for name in FIGURE_NAMES}


def typeset(story: list, info: dict) -> bytes:
    """The PDF's bytes: the same story and info give the same bytes (reportlab's
    invariant mode: fixed creation date and document ID, no file name inside)."""
    commit = info["git_commit"]
    dirty = "+dirty" if commit.endswith("+dirty") else ""
    header_right = f"{info['config_file']}  |  commit {commit[:12]}{dirty}"
    buf = io.BytesIO()
    doc = a4_document(
        buf,
        title="Horovod scaling study",
        author="hvdscale",
        subject=f"scaling report for {info['config_file']}",
        creator="hvdscale report",
    )
    doc.build(story, canvasmaker=canvas_maker("hvdscale scaling report", header_right))
    return buf.getvalue()


def build_report(
    out,
    *,
    config_file,
    cfg,
    runs,
    summary,
    status,
    cm,
    plots_dir,
    provenance=None,
    references=None,
    epochs=None,
    tuned=None,
    systems=None,
    headline=None,
    target=None,
) -> dict:
    """Typeset the report to ``out`` (atomically); returns the provenance info used."""
    info = collect(config_file=config_file, cfg=cfg, runs=runs, provenance=provenance)
    data = ReportData(
        info=info,
        cfg=cfg,
        runs=runs,
        summary=summary,
        status=status,
        cm=cm,
        plots_dir=Path(plots_dir),
        captions=figure_captions(cfg),
        references=references,
        epochs=epochs,
        tuned=tuned,
        systems=systems,
        headline=headline,
        target=target,
    )
    d = Doc()
    build_story(d, data)
    pdf = typeset(d.story, info)
    with atomic_path(out, ".pdf") as tmp:
        Path(tmp).write_bytes(pdf)
    return info
