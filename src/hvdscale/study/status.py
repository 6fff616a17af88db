"""Progress of a study while it runs (``hvdscale status CONFIG``).

Read-only, from what the study leaves on disk and, where there is one, from ``squeue``:

- done: the run has a record (``RUNS/<run_id>/metrics.json``) that the current config
  does not retrain (hvdscale.study.changes). A record whose job Snakemake marked as
  started and never saw end (``.snakemake/incomplete``), with no Snakemake holding the
  working directory's lock (a head job that was lost), is not done: the next Snakemake
  trains it again (--rerun-incomplete), so it counts as running while its job is in the
  queue, else as not started;
- running / queued: a SLURM job of this user whose comment names the run. The SLURM
  executor plugin (snakemake-executor-plugin-slurm 2.8) submits every job with
  ``--comment rule_<rule>_wildcards_<wildcards>``, so train_run's comment is
  ``rule_train_run_wildcards_<run_id>`` (the job name is the plugin's run UUID, one for
  the whole Snakemake invocation). Without squeue: a run Snakemake marked as started
  (``.snakemake/incomplete``) while a Snakemake holds the working directory's lock is
  running;
- failed: a run without a record that is not in the queue and left a failure.json or a
  rule log (``logs/train_run/<run_id>.log``); the reason is failure.json's message, else
  the log's last error line;
- not started: the rest (and the finished runs an edited config retrains).

Node-hours spent: the finished runs' wall time (Snakemake's benchmark file of the job,
else the record's start and finish times) x nodes, plus the elapsed time of running jobs
x nodes. The budget is ``hvdscale plan``'s worst case (every job to its time limit).

ETA per partition: the work left (each queued and not started run at the median wall
time of the finished runs of its job shape, nodes and workers, or of the partition, or
at its time limit when none finished yet; a running run at that median less its elapsed
time) divided by the jobs that run at once (the most seen so far: running now, or
overlapping among the finished runs). Partitions run side by side, so the study's ETA is
the largest. Failed runs are not in it: they train again when Snakemake is restarted.
"""

from __future__ import annotations

import csv
import getpass
import json
import os
import re
import shutil
import subprocess
import time
from base64 import urlsafe_b64decode
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from statistics import median

from hvdscale.matrix.runkinds import rerun_runs
from hvdscale.matrix.runtable import run_table
from hvdscale.study.changes import Retrain, retrained_runs
from hvdscale.study.plan import (
    add_study_arguments,
    merged_config,
    plan,
    study_config_files,
    worst_case_reruns,
)

#: the plugin's --comment of a train_run job, before the run id
TRAIN_COMMENT = "rule_train_run_wildcards_"
RUNNING_STATES = {"RUNNING", "COMPLETING", "CONFIGURING", "STAGE_OUT", "SIGNALING"}
STATES = ("done", "running", "queued", "failed", "not started")


@dataclass
class QueueJob:
    job_id: str
    state: str
    elapsed_s: float
    nodes: int
    comment: str

    @property
    def run_id(self) -> str | None:
        return run_of_comment(self.comment)


def run_of_comment(comment: str) -> str | None:
    """The run id in the plugin's comment of a train_run job, else None."""
    comment = (comment or "").strip()
    if comment.startswith(TRAIN_COMMENT) and len(comment) > len(TRAIN_COMMENT):
        return comment[len(TRAIN_COMMENT) :]
    return None


def parse_elapsed(text: str) -> float:
    """Seconds of squeue's TIME (``[D-][HH:]MM:SS``); 0 for anything else."""
    m = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", (text or "").strip())
    if not m:
        return 0.0
    d, h, mi, s = (int(x) if x else 0 for x in m.groups())
    return float(((d * 24 + h) * 60 + mi) * 60 + s)


SQUEUE_FORMAT = "%i|%T|%M|%D|%k"


def parse_squeue(text: str) -> list[QueueJob]:
    """Lines of ``squeue -h -o '%i|%T|%M|%D|%k'`` (the comment last: it may hold '|')."""
    jobs = []
    for line in text.splitlines():
        parts = line.strip().split("|", 4)
        if len(parts) != 5:
            continue
        job_id, state, elapsed, nodes, comment = parts
        jobs.append(
            QueueJob(
                job_id,
                state.upper(),
                parse_elapsed(elapsed),
                int(nodes) if nodes.isdigit() else 1,
                comment,
            )
        )
    return jobs


def squeue_jobs(user: str | None = None) -> list[QueueJob] | None:
    """This user's SLURM jobs; None without a working squeue (no SLURM here)."""
    if shutil.which("squeue") is None:
        return None
    try:
        proc = subprocess.run(
            ["squeue", "-h", "-u", user or getpass.getuser(), "-o", SQUEUE_FORMAT],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    return parse_squeue(proc.stdout)


def started_outputs(workdir: str | Path = ".") -> dict[str, float]:
    """Outputs Snakemake marked as started and not finished (``.snakemake/incomplete``,
    one file per output, named by the output path in URL-safe base64, split into
    '@'-prefixed parts when long): {path: time marked}."""
    root = Path(workdir) / ".snakemake" / "incomplete"
    out: dict[str, float] = {}
    if not root.is_dir():
        return out
    for f in root.rglob("*"):
        if not f.is_file() or f.name.startswith("@") or f.name == "migration_underway":
            continue
        parts = f.relative_to(root).parts
        try:
            path = urlsafe_b64decode("".join(p.lstrip("@") for p in parts)).decode()
        except (ValueError, UnicodeDecodeError):
            continue
        out[os.path.normpath(path)] = f.stat().st_mtime
    return out


def snakemake_holds_lock(workdir: str | Path = ".") -> bool:
    locks = Path(workdir) / ".snakemake" / "locks"
    return locks.is_dir() and any(locks.iterdir())


def _utc(text) -> float | None:
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def wall_of(results: Path, run_id: str) -> tuple[float | None, float | None]:
    """(wall seconds, end time) of a finished run: the job's benchmark file (seconds of
    the rule's shell command), else the record's started/finished times."""
    end = start = None
    try:
        rec = json.loads((results / "runs" / run_id / "metrics.json").read_text())
        end = _utc(rec.get("finished_utc"))
        start = _utc((rec.get("environment") or {}).get("started_utc"))
    except (OSError, ValueError, AttributeError):
        rec = None
    bench = results / "benchmarks" / "train_run" / f"{run_id}.tsv"
    try:
        with open(bench, newline="") as fh:
            row = next(csv.DictReader(fh, delimiter="\t"))
        wall = float(row["s"])
        return wall, end if end is not None else bench.stat().st_mtime
    except (OSError, StopIteration, KeyError, ValueError):
        pass
    if start is not None and end is not None and end >= start:
        return end - start, end
    return None, end


def failure_reason(results: Path, run_id: str) -> tuple[str, str]:
    """(first line of why the run failed, where it says so)."""
    from hvdscale.analysis.records import failure_detail

    failure = results / "runs" / run_id / "failure.json"
    if failure.exists():
        reason = failure_detail(failure)[1]
        return (reason.strip().splitlines() or ["failed"])[0], str(failure)
    log = results / "logs" / "train_run" / f"{run_id}.log"
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "failed (no failure.json, no log)", ""
    errors = [ln for ln in lines if re.search(r"error|exception|failed|killed|cancel", ln, re.I)]
    return ((errors or lines or ["failed (empty log)"])[-1])[:300], str(log)


@dataclass
class RunState:
    run_id: str
    partition: str
    nodes: int
    shape: tuple
    state: str
    elapsed_s: float = 0.0  # running: time so far
    wall_s: float | None = None  # done: the job's wall time
    end: float | None = None  # done: when it finished
    job_id: str | None = None
    reason: str = ""  # failed: first line of the reason
    where: str = ""  # failed: the file that says so


@dataclass
class PartitionStatus:
    partition: str
    counts: dict = field(default_factory=lambda: dict.fromkeys(STATES, 0))
    retrain: int = 0
    spent_node_h: float = 0.0
    budget_node_h: float | None = None
    eta_s: float | None = None
    slots: int = 1
    basis: str = ""  # how the run time was estimated

    def row(self) -> dict:
        left = None if self.budget_node_h is None else self.budget_node_h - self.spent_node_h
        return {
            "partition": self.partition,
            **{k.replace(" ", "_"): v for k, v in self.counts.items()},
            "retrain": self.retrain,
            "node_hours_spent": round(self.spent_node_h, 3),
            "node_hours_budget": self.budget_node_h,
            "node_hours_left": None if left is None else round(left, 3),
            "eta_s": None if self.eta_s is None else round(self.eta_s),
            "parallel_jobs": self.slots,
            "eta_basis": self.basis,
        }


def study_runs(cfg: dict, results: Path) -> list:
    """The runs of the study: the run table and the tuning re-runs (those of
    selection.csv once select_tuned wrote it, else the plan's worst case)."""
    runs = run_table(cfg)
    selection = results / "scaling" / "selection.csv"
    if cfg["scaling"].get("tune") and selection.exists():
        with open(selection, newline="") as fh:
            rows = [
                r
                for r in csv.DictReader(fh)
                if r.get("candidate") and r.get("status") != "all_failed"
            ]
        return runs + rerun_runs(cfg, rows)
    return runs + worst_case_reruns(cfg)


def run_states(
    cfg: dict,
    runs: list,
    results: Path,
    queue: list[QueueJob] | None,
    retrain: Retrain,
    workdir: Path,
    now: float,
) -> list[RunState]:
    by_run = {j.run_id: j for j in queue or [] if j.run_id}
    started = started_outputs(workdir)
    held = snakemake_holds_lock(workdir)
    locked = queue is None and held
    out = []
    for run in runs:
        rid = run.run_id
        st = RunState(rid, run.partition, run.nodes, (run.nodes, run.workers), "not started")
        rdir = results / "runs" / rid
        marker = os.path.normpath(str(rdir / "metrics.json"))
        record = (rdir / "metrics.json").exists()
        if rid in retrain.runs:
            pass  # trains again: not started
        elif record and (held or marker not in started):
            st.state = "done"
            st.wall_s, st.end = wall_of(results, rid)
        elif rid in by_run:
            job = by_run[rid]
            st.job_id = job.job_id
            st.state = "running" if job.state in RUNNING_STATES else "queued"
            st.elapsed_s = job.elapsed_s if st.state == "running" else 0.0
            st.nodes = job.nodes if st.state == "running" else st.nodes
        elif locked and marker in started:
            st.state = "running"
            st.elapsed_s = max(0.0, now - started[marker])
        elif record:
            pass  # its job never ended for Snakemake, none runs now: trains again
        elif (rdir / "failure.json").exists() or (
            results / "logs" / "train_run" / f"{rid}.log"
        ).exists():
            st.state = "failed"
            st.reason, st.where = failure_reason(results, rid)
        out.append(st)
    return out


def peak_overlap(intervals: list[tuple[float, float]]) -> int:
    """The most intervals that overlap at one time."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    best = cur = 0
    for _, d in events:
        cur += d
        best = max(best, cur)
    return best


def eta(states: list[RunState], runtime_s: float) -> tuple[float, int, str]:
    """(seconds left, parallel jobs, basis) of one partition's runs."""
    done = [s for s in states if s.state == "done" and s.wall_s is not None]
    by_shape: dict[tuple, list[float]] = {}
    for s in done:
        by_shape.setdefault(s.shape, []).append(s.wall_s)
    overall = median(s.wall_s for s in done) if done else None

    def expected(s: RunState) -> float:
        if s.shape in by_shape:
            return median(by_shape[s.shape])
        return overall if overall is not None else runtime_s

    running = [s for s in states if s.state == "running"]
    waiting = [s for s in states if s.state in ("queued", "not started")]
    work = sum(max(expected(s) - s.elapsed_s, 0.0) for s in running)
    work += sum(expected(s) for s in waiting)
    finished = [(s.end - s.wall_s, s.end) for s in done if s.end is not None]
    slots = max(len(running), peak_overlap(finished), 1)
    if not done:
        basis = "no run finished yet: each at its time limit"
    elif all(s.shape in by_shape for s in running + waiting):
        basis = f"median wall time per job shape of {len(done)} finished run(s)"
    else:
        basis = f"median wall time of {len(done)} finished run(s) (per job shape where known)"
    return work / slots, slots, basis


def status(
    cfg: dict,
    results: str | Path | None = None,
    queue: list[QueueJob] | None = None,
    workdir: str | Path = ".",
    now: float | None = None,
) -> dict:
    """The study's progress per partition (see the module docstring)."""
    results = Path(results if results is not None else cfg["results_dir"])
    now = time.time() if now is None else now
    runs = study_runs(cfg, results)
    retrain = retrained_runs(cfg, runs, results)
    states = run_states(cfg, runs, results, queue, retrain, Path(workdir), now)
    budget = {r["partition"]: r["node_hours_worst"] for r in plan(cfg, results)["partitions"]}
    parts: dict[str, PartitionStatus] = {}
    for s in states:
        p = parts.setdefault(s.partition, PartitionStatus(s.partition, budget_node_h=None))
        p.counts[s.state] += 1
        p.retrain += s.run_id in retrain.runs
        if s.state == "done" and s.wall_s is not None:
            p.spent_node_h += s.wall_s * s.nodes / 3600
        if s.state == "running":
            p.spent_node_h += s.elapsed_s * s.nodes / 3600
    for name, p in parts.items():
        p.budget_node_h = budget.get(name)
        runtime_s = cfg["scaling"]["partitions"][name]["runtime_min"] * 60
        mine = [s for s in states if s.partition == name]
        p.eta_s, p.slots, p.basis = eta(mine, runtime_s)
    rows = [parts[k].row() for k in sorted(parts)]
    total = {k.replace(" ", "_"): sum(r[k.replace(" ", "_")] for r in rows) for k in STATES}
    eta_s = max((r["eta_s"] for r in rows), default=0)
    return {
        "results": str(results),
        "source": "records, logs and squeue" if queue is not None else "records and logs",
        "partitions": rows,
        "total": {
            **total,
            "runs": len(states),
            "retrain": len(retrain),
            "node_hours_spent": round(sum(r["node_hours_spent"] for r in rows), 3),
            "node_hours_budget": round(sum(r["node_hours_budget"] or 0 for r in rows), 3),
            "eta_s": eta_s,
            "eta_utc": datetime.fromtimestamp(now + eta_s, timezone.utc).strftime(
                "%Y-%m-%d %H:%M UTC"
            ),
        },
        "failed": [
            {"run_id": s.run_id, "reason": s.reason, "where": s.where}
            for s in states
            if s.state == "failed"
        ],
        "retrain": retrain.runs,
    }


def _dur(seconds: float) -> str:
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def _counts(r: dict) -> str:
    return ", ".join(f"{r[k.replace(' ', '_')]} {k}" for k in STATES)


def format_status(s: dict) -> str:
    t = s["total"]
    left = t["runs"] - t["done"]
    lines = [
        f"hvdscale status ({s['results']}, from {s['source']}): {t['runs']} runs: {_counts(t)}",
    ]
    for r in s["partitions"]:
        budget = r["node_hours_budget"]
        spent = f"{r['node_hours_spent']:,.2f} node-h spent"
        if budget is not None:
            spent += f" of {budget:,.1f} planned (worst case), {r['node_hours_left']:,.1f} left"
        lines.append(f"  {r['partition']}: {_counts(r)}; {spent}")
        if r["running"] + r["queued"] + r["not_started"]:
            lines.append(
                f"    ETA {_dur(r['eta_s'])} at {r['parallel_jobs']} job(s) at once "
                f"({r['eta_basis']})"
            )
    if left - t["failed"] > 0:
        lines.append(
            f"ETA: {_dur(t['eta_s'])} (about {t['eta_utc']}): per partition, the runs left "
            "x their expected wall time / the jobs seen running at once; the largest partition"
        )
    elif t["failed"]:
        lines.append("ETA: nothing left to run but the failed runs (rerun: restart Snakemake)")
    else:
        lines.append("ETA: done")
    if t["retrain"]:
        from hvdscale.study.changes import describe

        lines += [f"  ! {ln}" for ln in describe(Retrain(s["retrain"]), limit=5)[:1]]
    if s["failed"]:
        lines.append(f"failed ({len(s['failed'])}):")
        for f in s["failed"]:
            where = f"  [{f['where']}]" if f["where"] else ""
            lines.append(f"  {f['run_id']}: {f['reason']}{where}")
    return "\n".join(lines)


# -------------------------------------------------- the command: hvdscale status


def add_arguments(ap):
    add_study_arguments(
        ap,
        "the selection the study runs with, as for hvdscale plan",
        "overrides as given to snakemake --config",
    )
    ap.add_argument(
        "--no-squeue", action="store_true", help="do not ask squeue (records and logs only)"
    )
    ap.add_argument("--json", action="store_true", help="print the status as JSON")


def run(args) -> int:
    """Progress of a study, also while Snakemake runs it (``hvdscale status CONFIG``).

    Per partition: runs done, running, queued, failed and not started; node-hours spent
    (finished runs' wall time x nodes, plus running jobs' elapsed time x nodes) against
    hvdscale plan's worst-case budget; an ETA; and each failed run with the first line of
    why (its failure.json, else its rule log).

    Sources: the run records and logs under the results directory and, where SLURM is
    there, squeue: a training job's comment is rule_train_run_wildcards_<run_id>.
    Without squeue a run Snakemake marked as started counts as running while a
    Snakemake holds the working directory's lock. Finished runs that an edited config
    trains again count as not started (hvdscale plan names them and the keys).

    ETA: per partition, each run left at the median wall time of the finished runs of
    its job shape (nodes, workers), else of the partition, else at its time limit
    (running runs: less their elapsed time), divided by the most jobs seen at once
    (running now or overlapping among finished runs); the study's ETA is the largest
    partition's. Failed runs are not in it.

    Example
      hvdscale status config/thesis.yaml            # or: make status CONFIG=config/thesis.yaml
    """
    cfg = merged_config(study_config_files(args.config), args.select, args.overrides)
    queue = None if args.no_squeue else squeue_jobs()
    s = status(cfg, args.results, queue)
    print(json.dumps(s, indent=2, sort_keys=True) if args.json else format_status(s))
    return 0
