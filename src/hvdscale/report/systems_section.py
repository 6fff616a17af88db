"""The report's "System description" section: one table per partition from
results/scaling/systems.csv (hvdscale.analysis.systems), what the runs' rank 0 recorded
about the machines (CPU, GPUs, driver, CUDA, cuDNN, NCCL, MPI, network, nodes)."""

from __future__ import annotations

from hvdscale.analysis.systems import LABELS
from hvdscale.report.context import ReportData
from hvdscale.report.doc import Doc
from hvdscale.report.provenance import compress_hosts

NOTE = (
    "What rank 0 of each run recorded about the system it ran on (the run record's "
    "<i>system</i>; results/scaling/systems.csv). Several values: the runs of the "
    "partition differed. '-': not present on the machine or not recorded."
)


def _value(key: str, text: str) -> str:
    if not text:
        return "-"
    if key == "nodes":
        return compress_hosts(text.split(", "))
    return text


def systems_section(d: Doc, r: ReportData) -> None:
    """One table per partition (nothing without systems.csv, e.g. older callers)."""
    rows = getattr(r, "systems", None)
    if rows is None:
        return
    d.section("System description")
    if not rows:
        d.p("No run records: no system description.")
        return
    d.p(NOTE, "note")
    for row in rows:
        runs, described = int(row["runs"]), int(row["described"])
        caption = f"System of partition <b>{row['partition']}</b> ({runs} run(s)"
        caption += (
            ")."
            if described == runs
            else f"; {described} with a system description, the others give nodes, CPU "
            "model and MPI only)."
        )
        d.table(
            caption,
            ["Item", "Value"],
            [[d.cell(label), d.cell(_value(k, row.get(k, "")))] for k, label in LABELS.items()],
            [42, 138],
            align_right_from=99,
            keep=True,
        )
