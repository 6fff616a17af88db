"""The report's opening (title, run counts) and provenance sections, and the closing list
of missing and failed runs."""

from __future__ import annotations

from xml.sax.saxutils import escape

import pandas as pd

from hvdscale.analysis.columns import STATUSES
from hvdscale.report.context import ReportData
from hvdscale.report.doc import Doc
from hvdscale.report.headline_text import headline_section
from hvdscale.slurm.gpu_support import gpu_support_notes

STATUS_NOTE = (
    "Runs by partition and status (completed; nan_loss: stopped by a non-finite loss; "
    "failed: the job or the training raised an error; missing: no record; malformed: the "
    "record failed validation; mislabelled: the label proof failed, excluded from every "
    "statistic)."
)
ORDER = {"mislabelled": 0, "failed": 1, "nan_loss": 2, "malformed": 3, "missing": 4}


def statuses(status: pd.DataFrame) -> list[str]:
    """The known statuses, then any other one the table has (in order of appearance)."""
    known = STATUSES + [s for s in ("mislabelled",) if s not in STATUSES]
    return known + [s for s in dict.fromkeys(status["status"].astype(str)) if s not in known]


def status_counts(status: pd.DataFrame) -> tuple[list[str], list[list]]:
    st = status.copy()
    st["partition"] = st["partition"].fillna("(unparsable)")
    cols = statuses(st)
    rows = []
    for part, g in st.groupby("partition", sort=True):
        vc = g["status"].value_counts()
        rows.append([part] + [str(int(vc.get(c, 0))) for c in cols] + [str(len(g))])
    vc = st["status"].value_counts()
    rows.append(["all"] + [str(int(vc.get(c, 0))) for c in cols] + [str(len(st))])
    return ["Partition"] + cols + ["total"], rows


def title_section(d: Doc, r: ReportData) -> None:
    info, status = r.info, r.status
    n_total = len(status)
    n_done = int(status["status"].value_counts().get("completed", 0))
    d.p("Horovod scaling study", "title")
    d.p(
        escape(
            f"configuration {info['config_file']}; {n_total} runs in the run table, "
            f"{n_done} completed; report date {info['report_date']}"
        ),
        "subtitle",
    )
    n_bad = int(status["status"].eq("mislabelled").sum())
    pending = n_total - n_done - n_bad
    state = (
        ""
        if pending == 0
        else f"{pending} of {n_total} runs did not complete (see the last section); "
        "results are partial. "
    )
    if n_bad:
        state += (
            f"{n_bad} run{'s are' if n_bad > 1 else ' is'} mislabelled (label proof failed): "
            "excluded from every statistic and listed in the last section."
        )
    state = state.strip() or "All runs completed."
    d.p(f"This report is generated from the run records by <i>hvdscale report</i>. {state}")
    for note in gpu_support_notes(r.cfg or {}):  # issue 20: GPUs TF 2.15 cannot use (gpu2)
        d.p(escape(note))
    headline_section(d, r)
    head, rows = status_counts(status)
    first = 40 if len(head) <= 7 else 30
    widths = [first] + [(180 - first) / (len(head) - 1)] * (len(head) - 1)
    d.table(STATUS_NOTE, head, rows, widths, keep=True)


def _provenance_rows(info: dict) -> list[tuple[str, str]]:
    rec_commits = ", ".join(c[:12] for c in info["run_git_commits"]) or "-"
    match = "runs not checked"
    if info.get("run_config_match"):
        ok, n, bad = info["run_config_match"]
        match = f"{ok}/{n} runs recorded the hash of their slice of this config"
        if bad:
            shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
            match += f"; trained under another config: {shown}"
    wf = ", ".join(f"{k} {v}" for k, v in info["workflow_env"].items())
    tr = "; ".join(f"{k} {v}" for k, v in info["train_env"].items()) or "no run records"
    rows = [
        ("Git commit (report)", info["git_commit"]),
        ("Git commit(s) (runs)", rec_commits),
        ("Config file", info["config_file"]),
        ("Config file sha256", info["config_file_sha256"] or "file not found"),
        ("Config hash (validated)", (info["config_hash"] or "-") + f" ({match})"),
        ("Workflow env", wf),
        ("Train env (run records)", tr),
    ]
    rows += [(f"Provenance: {k}", v) for k, v in info["provenance_json"].items()]
    rows += [
        ("Hosts", f"{info['hosts']}"),
        ("Devices", info["devices"]),
        ("CPU model(s)", info["cpu_models"]),
        ("Partitions (config)", "; ".join(info["hardware"]) or "-"),
        ("Runs started (UTC)", info["runs_started"]),
        ("Report date", info["report_date"]),
    ]
    return rows


def provenance_section(d: Doc, r: ReportData) -> None:
    d.section("Provenance")
    d.table(
        "Provenance of this report and of the runs it summarises.",
        ["Item", "Value"],
        [[d.cell(k), d.cell(v)] for k, v in _provenance_rows(r.info)],
        [42, 138],
        align_right_from=99,
    )


def missing_section(d: Doc, r: ReportData) -> None:
    d.section("Missing, failed and mislabelled runs")
    status = r.status
    bad = status[status["status"] != "completed"].copy()
    if bad.empty:
        d.p(f"All {len(status)} runs of the run table completed.")
        return
    n_bad = int(bad["status"].eq("mislabelled").sum())
    if n_bad:
        d.p(
            escape(
                f"{n_bad} run{'s' if n_bad > 1 else ''} completed but "
                f"{'are' if n_bad > 1 else 'is'} mislabelled: the label proof (world size and "
                "collective recorded by the run) contradicts the run id. They are excluded "
                "from every statistic of this report; the detail gives the proof's reasons."
            )
        )
    bad = bad.assign(_o=bad["status"].map(ORDER).fillna(9)).sort_values(["_o", "run_id"])
    rows = [
        [
            d.cell(x.run_id),
            x.status,
            "" if pd.isna(x.exit_status) else str(int(x.exit_status)),
            d.cell(
                ("" if x.in_config else "[not in this config's run table] ") + str(x.detail or "")
            ),
        ]
        for x in bad.itertuples()
    ]
    d.table(
        f"The {len(bad)} runs that did not complete or are mislabelled, by status, with exit "
        "status and error or reason.",
        ["Run ID", "Status", "Exit", "Detail"],
        rows,
        [62, 16, 10, 92],
        align_right_from=99,
    )
