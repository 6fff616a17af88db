"""Helpers of the page generator (perfdocs.generate): reading the result CSVs, formatting
figures, tables, provenance lines and the validity cells every row gets (issue 17)."""

from __future__ import annotations

import csv
from pathlib import Path

from _quiet import NO_FOREIGN, row_validity

ROOT = Path(__file__).resolve().parents[2]

INVALID = "invalid"  # what a figure of an invalid row shows instead


def read(results: Path, name: str) -> list[dict] | None:
    p = results / f"{name}.csv"
    if not p.is_file():
        return None
    with open(p, newline="") as fh:
        return list(csv.DictReader(fh))


def num(v) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def f2(v, nd=2) -> str:
    x = num(v)
    return "" if x is None else f"{x:.{nd}f}"


def thousands(v) -> str:
    x = num(v)
    return "" if x is None else f"{x:,.0f}"


def ci(row: dict, lo="ci_low", hi="ci_high", nd=2) -> str:
    a, b = num(row.get(lo)), num(row.get(hi))
    if a is None or b is None:
        return "no interval (n < 3)"
    return f"{a:.{nd}f}-{b:.{nd}f}"


def table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out) + "\n"


def short_reason(why: str) -> str:
    if why == NO_FOREIGN:
        return "no foreign_cpu (old row)"
    if why.startswith("foreign_cpu"):
        return why.split(":")[0].replace("foreign_cpu", "foreign CPU")
    return why


def quality(r: dict) -> tuple[bool, list[str]]:
    """(valid, [load before, foreign CPU, valid]) cells of a row: the page states the
    load and the foreign CPU of every row, and shows no figure of an invalid one."""
    ok, why = row_validity(r)
    fc = f2(r.get("foreign_cpu")) or "not recorded"
    return ok, [f2(r.get("load_before")), fc, "yes" if ok else f"**no**: {short_reason(why)}"]


QCOLS = ["load before", "foreign CPU", "valid"]


def shown(ok: bool, text: str) -> str:
    return text if ok else INVALID


def provenance(rows: list[dict], name: str) -> str:
    commits = sorted({r.get("commit", "") for r in rows})
    machines = sorted({r.get("machine", "") for r in rows})
    dates = sorted({r.get("date", "") for r in rows})
    # the load after an arm is no criterion (a 2-worker arm raises it to about 2 itself)
    loads = [x for r in rows if (x := num(r.get("load_before"))) is not None]
    lr = f"{min(loads):.2f}-{max(loads):.2f}" if loads else "not recorded"
    warn = " (above 1.0: not measured alone)" if loads and max(loads) > 1.0 else ""
    valid = sum(row_validity(r)[0] for r in rows)
    return (
        f"Source: `benchmarks/results/{name}.csv`; commit {', '.join(commits)}; "
        f"{'; '.join(machines)}; {dates[0] if dates else ''}"
        f"{' to ' + dates[-1] if len(dates) > 1 else ''}; 1-minute load before {lr}{warn}; "
        f"valid rows {valid} of {len(rows)}.\n"
    )


def missing(name: str, how: str) -> str:
    return f"Not measured in this revision (no `benchmarks/results/{name}.csv`); run `{how}`.\n"


def missing_removed(name: str, script: str) -> str:
    """The text for a missing CSV of a benchmark that has left the tree (its reading is
    written down; the script is in the git history)."""
    return (
        f"No `benchmarks/results/{name}.csv` in this revision, and its benchmark "
        f"(`benchmarks/{script}`) has been removed: `git log -- benchmarks/{script}`.\n"
    )


def best_mpi(rows) -> dict | None:
    """The fastest valid summary row of bench_allreduce_bare with the MPI controller (the
    least a bare MPI allreduce of the gradient costs here, whatever the setting)."""
    mpi = [
        r
        for r in rows or []
        if r.get("row") == "summary"
        and r.get("controller") == "mpi"
        and row_validity(r)[0]
        and num(r.get("median_us"))
    ]
    return min(mpi, key=lambda r: num(r["median_us"])) if mpi else None
