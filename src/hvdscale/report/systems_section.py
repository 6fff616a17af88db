"""The report's "System description" section: one table per partition from
results/scaling/systems.csv (hvdscale.analysis.systems), what the runs' rank 0 recorded
about the machines (CPU, GPUs, driver, CUDA, cuDNN, NCCL, MPI, network, nodes), and
each partition's preflight from results/preflight/<partition>.json
(hvdscale.launch.preflight): its checks, the GPUs the ranks saw and each backend's
allreduce."""

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


PREFLIGHT_NOTE = (
    "Before any training job of a partition, one short job on its compute node(s) "
    "checked it with the study's train env and launcher (results/preflight/): the "
    "modules, the data read from the node, the train env's imports, the GPUs the ranks "
    "saw against the partition's gpus_per_node and gpu_model, and a 2-rank allreduce of "
    "the gradient's size with each backend the runs use."
)


def systems_section(d: Doc, r: ReportData) -> None:
    """One table per partition (nothing without systems.csv or preflight records, e.g.
    older callers, or an archived study from before the preflight)."""
    rows = getattr(r, "systems", None)
    preflight = getattr(r, "preflight", None)
    if rows is None and not preflight:
        return
    d.section("System description")
    if rows is not None:
        _system_tables(d, rows)
    if preflight:
        preflight_tables(d, preflight)


def preflight_tables(d: Doc, records: list[dict]) -> None:
    """One table per partition's preflight record: each check, ok or failed, and what it
    found (the GPUs seen, the allreduce time per backend, or what failed and the fix)."""
    d.h2("Preflight per partition")
    d.p(PREFLIGHT_NOTE, "note")
    for rec in sorted(records, key=lambda x: x.get("partition", "")):
        checks = rec.get("checks", [])
        failed = [c["name"] for c in checks if not c.get("ok")]
        nodes = rec.get("nodes", 1)
        caption = (
            f"Preflight of partition <b>{rec.get('partition', '?')}</b>: "
            + ("passed" if rec.get("ok") else "<b>failed</b> at " + ", ".join(failed))
            + f" ({len(checks)} check(s) on {nodes} node(s) from {rec.get('node', '?')}, "
            f"launcher {rec.get('launcher', '?')}, {float(rec.get('seconds', 0)):.1f} s"
            + ("; emulated GPUs (CPU)" if rec.get("emulated_gpus") else "")
            + ")."
        )
        table = [
            [
                d.cell(c["name"]),
                d.cell("ok" if c.get("ok") else "failed"),
                d.cell(c.get("detail", "") + ("" if c.get("ok") else f" Fix: {c.get('fix', '')}")),
            ]
            for c in checks
        ]
        d.table(caption, ["Check", "Result", "What it found"], table, [38, 16, 126], keep=True)


def _system_tables(d: Doc, rows: list[dict]) -> None:
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
