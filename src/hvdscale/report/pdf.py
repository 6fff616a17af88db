"""Typeset the scaling report (results/report.pdf) with reportlab.

The command line, with what it reads and writes in full, is ``hvdscale report``
(``add_arguments``/``run`` at the end of this module).
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

from hvdscale.analysis.references import read_references
from hvdscale.analysis.systems import read_systems
from hvdscale.analysis.tables import (
    default_epochs_path,
    read_epochs,
    read_headline,
    read_runs,
    read_status,
    read_summary,
)
from hvdscale.analysis.tuning import read_tuned
from hvdscale.cliargs import SHARED, add_options, defaulted
from hvdscale.config.load import load_config
from hvdscale.figures.draw import load_costmodel
from hvdscale.figures.registry import FIGURE_NAMES, caption_markup, caption_values
from hvdscale.io import atomic_path
from hvdscale.report.accuracy_section import accuracy_section
from hvdscale.report.context import ReportData
from hvdscale.report.costmodel_section import costmodel_section
from hvdscale.report.doc import Doc, a4_document, canvas_maker
from hvdscale.report.frameworks_section import frameworks_section
from hvdscale.report.method_section import method_section
from hvdscale.report.overview import missing_section, provenance_section, title_section
from hvdscale.report.provenance import collect, load_provenance
from hvdscale.report.reference_section import reference_section
from hvdscale.report.results import figures_section, results_section
from hvdscale.report.step_settings_section import step_settings_section
from hvdscale.report.systems_section import systems_section
from hvdscale.target import read_target

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


def build_report(out, *, config_file, cfg, runs, plots_dir, provenance=None, **tables) -> dict:
    """Typeset the report to ``out`` (atomically); ``tables`` are the other fields of
    ``ReportData`` (summary, status, cm, references, epochs, ...). Returns the provenance
    info used."""
    info = collect(config_file=config_file, cfg=cfg, runs=runs, provenance=provenance)
    data = ReportData(
        info=info,
        cfg=cfg,
        runs=runs,
        plots_dir=Path(plots_dir),
        captions=figure_captions(cfg),
        **tables,
    )
    d = Doc()
    build_story(d, data)
    pdf = typeset(d.story, info)
    with atomic_path(out, ".pdf") as tmp:
        Path(tmp).write_bytes(pdf)
    return info


# -------------------------------------------------- the command: hvdscale report


def add_arguments(p):
    add_options(
        p,
        (
            "--config-file",
            {
                "required": True,
                "nargs": "+",
                "help": "the YAML config file(s) the study was run with, in the order Snakemake "
                "merged them (paths and sha256 go into the provenance)",
            },
        ),
        ("--config", {**SHARED["--config"], "required": True}),
        "--runs",
        "--summary",
        "--status",
        ("--costmodel", "costmodel.json (optional: without it the cost-model section says so)"),
        ("--epochs", "epochs.csv (default: next to --runs, when it exists)"),
        (
            "--tuned",
            "tuned.csv of 'hvdscale aggregate --out-tuned' (default: next to --runs, when it "
            "exists; without it the report has no tuned figures)",
        ),
        ("--plots-dir", defaulted("results/plots")),
        ("--provenance", "optional provenance JSON (e.g. train env versions, hardware)"),
        (
            "--references",
            "references.csv (optional: the verdicts in the reference study's section)",
        ),
        ("--systems", "systems.csv (optional: the 'System description' section per partition)"),
        (
            "--headline",
            "headline.csv (the first page's headline and the factors of every speedup; "
            "default: next to --runs, when it exists; without it the first page says so)",
        ),
        ("--target", "target.json of calibrate_target (without it: the config's target)"),
        (
            "--preflight",
            {
                "nargs": "*",
                "default": [],
                "help": "the partitions' preflight JSONs, results/preflight/*.json (optional: "
                "shown in the system description)",
            },
        ),
        ("--out", defaulted("results/report.pdf")),
    )


def run(args) -> int:
    """Typeset the scaling report (results/report.pdf) with reportlab.

    Sections: the headline (one generated sentence per per-worker batch from headline.csv),
    provenance (git commit, config file and hash, package versions of both
    environments, hosts and hardware, dates); the system description per partition
    (systems.csv, when given); how every time was measured; tables of
    speedup, efficiency, speedup per GPU, sync share and the test loss reached (speed is
    never shown without the test loss it reached); the figures with numbered captions; a
    side-by-side comparison with the reference study; Horovod against PyTorch DDP where
    the records hold both (report/frameworks_section.py); the cost-model fit and its
    prediction error; the list of missing and failed runs. Written atomically.

    Example
      hvdscale report --config-file config/thesis.yaml --config results/config/full.json \
      --runs results/scaling/runs.csv --summary results/scaling/summary.csv \
      --status results/scaling/status.csv --costmodel results/scaling/costmodel.json \
      --plots-dir results/plots --headline results/scaling/headline.csv \
      --target results/scaling/target.json --out results/report.pdf \
      [--provenance results/provenance.json]

    A study merged by ``hvdscale merge`` has config/merged_from.json beside the config JSON:
    the source, results directory, config files and hash, git commit and partitions of each
    part go into the provenance table.
    """
    cfg = load_config(args.config)
    runs = read_runs(args.runs)
    summary = read_summary(args.summary)
    status = read_status(args.status)
    cm = load_costmodel(args.costmodel)
    if args.costmodel and cm is None:
        print(
            f"hvdscale report: warning: cost model {args.costmodel} not found; section left empty",
            file=sys.stderr,
        )
    for path in args.config_file:
        if not Path(path).exists():
            print(
                f"hvdscale report: warning: config file {path} not found; "
                "no hash in the provenance",
                file=sys.stderr,
            )

    epochs_path = Path(args.epochs) if args.epochs else default_epochs_path(args.runs)
    epochs = read_epochs(epochs_path) if epochs_path.exists() else None
    tuned_path = Path(args.tuned) if args.tuned else Path(args.runs).with_name("tuned.csv")
    tuned = read_tuned(tuned_path) if args.tuned or tuned_path.exists() else None
    inputs = dict(runs=runs, summary=summary, status=status, cm=cm, epochs=epochs, tuned=tuned)
    prov = load_provenance(args.provenance)
    # a study merged from several clusters' studies (hvdscale merge): each part's origin
    merged = Path(args.config).with_name("merged_from.json")
    if merged.is_file():
        prov = {**(load_provenance(merged) or {}), **(prov or {})}

    head = Path(args.headline) if args.headline else Path(args.runs).with_name("headline.csv")
    inputs["headline"] = read_headline(head) if args.headline or head.exists() else None
    inputs["target"] = read_target(args.target) if args.target else None
    build_report(
        args.out,
        config_file=args.config_file,
        cfg=cfg,
        plots_dir=args.plots_dir,
        provenance=prov,
        references=read_references(args.references),
        systems=read_systems(args.systems),
        preflight=[json.loads(Path(f).read_text()) for f in args.preflight] or None,
        **inputs,
    )
    print(f"report: wrote {args.out}")
    return 0
