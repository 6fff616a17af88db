"""The budget of a study before anything is submitted (``hvdscale plan CONFIG``)."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

from hvdscale.config.load import check_results_dir, read_config_file, validate_config
from hvdscale.errors import ConfigError
from hvdscale.io import atomic_path
from hvdscale.matrix.allreduce_sweeps import allreduce_jobs
from hvdscale.matrix.runkinds import rerun_runs
from hvdscale.matrix.runtable import run_table, tune_runs
from hvdscale.matrix.subset import describe
from hvdscale.project import find_project_root
from hvdscale.slurm.gpu_support import gpu_support_notes
from hvdscale.slurm.jobspec import JobSpec
from hvdscale.slurm.preflight import preflights
from hvdscale.study.changes import Retrain, retrained_runs
from hvdscale.study.changes import describe as describe_retrain


@dataclass
class PartitionPlan:
    partition: str
    jobs: int = 0
    nodes: set = field(default_factory=set)
    node_hours: float = 0.0
    gpu_hours: float = 0.0
    done: int = 0
    retrain: int = 0  # runs with a record that the current config trains again
    expected_node_hours: float = 0.0
    estimated: int = 0  # jobs with an expected time (measured or predicted)
    preflight_node_hours: float = 0.0  # its preflight job, worst case
    allreduce_node_hours: float = 0.0  # its allreduce sweeps, worst case

    def row(self) -> dict:
        return {
            "partition": self.partition,
            "jobs": self.jobs,
            "nodes_per_job": nodes_text(self.nodes),
            "node_hours_worst": round(self.node_hours, 3),
            "gpu_hours_worst": round(self.gpu_hours, 3),
            "jobs_done": self.done,
            "jobs_retrain": self.retrain,
            "jobs_estimated": self.estimated,
            "node_hours_expected": round(self.expected_node_hours, 3) if self.estimated else None,
            "preflight_node_hours_worst": round(self.preflight_node_hours, 3),
            "allreduce_node_hours_worst": round(self.allreduce_node_hours, 3),
            # everything the partition's jobs may cost: training, preflight, allreduce
            "node_hours_worst_all": round(
                self.node_hours + self.preflight_node_hours + self.allreduce_node_hours, 3
            ),
        }


def nodes_text(nodes) -> str:
    return ",".join(str(n) for n in sorted(nodes)) or "-"


def _load_expected(results: Path) -> tuple[dict, dict]:
    """Measured training seconds per run_id, predicted epoch seconds per configuration."""
    measured: dict[str, float] = {}
    runs_csv = results / "scaling" / "runs.csv"
    if runs_csv.exists():
        import csv

        with open(runs_csv) as fh:
            for row in csv.DictReader(fh):
                try:
                    t = float(row.get("train_time_s") or "nan")
                except ValueError:
                    continue
                if math.isfinite(t):
                    measured[row["run_id"]] = t
    predicted: dict[tuple, float] = {}
    cm = results / "scaling" / "costmodel.json"
    if cm.exists():
        try:
            model = json.loads(cm.read_text())
        except ValueError:
            model = {}
        for e in model.get("predictions") or []:
            for pt in e.get("points") or []:
                t = pt.get("epoch_time_s_pred")
                if t is not None:
                    key = (e["partition"], e["backend"], e["batch_per_worker"], e["lr_rule"])
                    predicted[(*key, pt["workers"])] = float(t)
    return measured, predicted


def budget_epochs(cfg: dict, run) -> int:
    """The epoch budget of a run: training.max_epochs, a calibration run's own."""
    if run.kind == "cal":
        return cfg["training"]["target"]["calibration"]["max_epochs"]
    return cfg["training"]["max_epochs"]


def worst_case_reruns(cfg: dict) -> list:
    """Re-runs of one candidate per tuning group (the selection picks which): the jobs
    the tuning adds once select_tuned ran (not in the run table before)."""
    first: dict[tuple, object] = {}
    for r in tune_runs(cfg):
        first.setdefault((r.partition, r.backend, r.workers, r.batch, r.lr_rule), r)
    return rerun_runs(cfg, list(first.values()))


def plan(cfg: dict, results: str | Path | None = None) -> dict:
    """The budget of the config's (selected) run table; ``results`` defaults to results_dir.

    A run counts as done when it has a record and the current config does not train it
    again (hvdscale.study.changes: its config slice is the one it was trained with)."""
    results = Path(results if results is not None else cfg["results_dir"])
    measured, predicted = _load_expected(results)
    parts = cfg["scaling"]["partitions"]
    by_part: dict[str, PartitionPlan] = {}
    runs = run_table(cfg) + worst_case_reruns(cfg)
    retrain = retrained_runs(cfg, runs, results)
    for r in runs:
        epochs = budget_epochs(cfg, r)
        p = by_part.setdefault(r.partition, PartitionPlan(r.partition))
        hours = parts[r.partition]["runtime_min"] / 60
        p.jobs += 1
        p.nodes.add(r.nodes)
        p.node_hours += r.nodes * hours
        p.gpu_hours += JobSpec.for_run(cfg, r).total_gpus * hours  # the rules' gres
        if r.run_id in retrain.runs:
            p.retrain += 1
        elif (results / "runs" / r.run_id / "metrics.json").exists():
            p.done += 1
        t = measured.get(r.run_id)
        if t is None:
            epoch = predicted.get((r.partition, r.backend, r.batch, r.lr_rule, r.workers))
            t = epoch * epochs if epoch is not None else None
        if t is not None:
            p.estimated += 1
            p.expected_node_hours += r.nodes * min(t / 3600, hours)
    ar = allreduce_jobs(cfg)
    ar_node_hours = 0.0
    for j in ar:
        hours = j["nodes"] * parts[j["partition"]]["runtime_min"] / 60
        ar_node_hours += hours
        by_part.setdefault(j["partition"], PartitionPlan(j["partition"]))
        by_part[j["partition"]].allreduce_node_hours += hours
    for name, pf in preflights(cfg).items():
        by_part.setdefault(name, PartitionPlan(name)).preflight_node_hours = pf.node_hours
    rows = [by_part[k].row() for k in sorted(by_part)]
    total = {
        "jobs": sum(r["jobs"] for r in rows),
        "node_hours_worst": round(sum(r["node_hours_worst"] for r in rows), 3),
        "gpu_hours_worst": round(sum(r["gpu_hours_worst"] for r in rows), 3),
        "jobs_done": sum(r["jobs_done"] for r in rows),
        "jobs_retrain": len(retrain),
    }
    shapes = job_shapes(cfg)
    return {
        "select": cfg.get("select"),
        "smoke": bool(cfg.get("smoke")),
        "results_dir": str(cfg["results_dir"]),
        "partitions": rows,
        "total": total,
        "allreduce": {"jobs": len(ar), "node_hours_worst": round(ar_node_hours, 3)},
        "preflight": preflight_budget(cfg),
        "notes": gpu_support_notes(cfg),
        "retrain": retrain.runs,
        "job_shapes": len(shapes),
        "array_jobs": sum(len(s["runs"]) for s in shapes),
    }


def preflight_budget(cfg: dict) -> dict:
    """The preflight jobs (hvdscale.slurm.preflight): one per partition, worst case."""
    pfs = preflights(cfg).values()
    return {
        "jobs": len(pfs),
        "node_hours_worst": round(sum(pf.node_hours for pf in pfs), 3),
        "gpu_hours_worst": round(sum(pf.gpu_hours for pf in pfs), 3),
    }


def job_shapes(cfg: dict) -> list[dict]:
    """The selected scaling runs grouped by SLURM job shape (the resources of their
    first attempt: partition, nodes, tasks, CPUs, gres, memory, time limit, extras).
    Calibration runs (kind cal) are not in a shape: every submission needs the target,
    so the first one to start runs them, as single jobs."""
    shapes: dict[tuple, dict] = {}
    for r in run_table(cfg):
        if r.kind:
            continue
        res = JobSpec.for_run(cfg, r).slurm_resources(1)
        key = tuple(sorted((k, str(v)) for k, v in res.items()))
        shape = shapes.setdefault(
            key,
            {"partition": r.partition, "workers": r.workers, "nodes": r.nodes, "runs": []},
        )
        shape["runs"].append(r.run_id)
    return sorted(shapes.values(), key=lambda s: (s["partition"], s["workers"]))


OTHER_SELECT_KEYS = ("sweep", "backend", "lr", "batch", "repeat")


def array_commands(cfg: dict, configs: list[str], profile: str = "slurm") -> list[str]:
    """One Snakemake submission per job shape, train_run as one SLURM array each."""
    import re

    base = cfg.get("select") if isinstance(cfg.get("select"), str) else ""
    # the user's selection stays, but for partition and workers, which name the shape
    items = [i for i in re.split(r"[ ;]+", base) if i.partition("=")[0] in OTHER_SELECT_KEYS]
    extra = "".join(f"{i} " for i in items)
    files = " ".join(configs)
    return [
        f"snakemake --profile {profile} --configfile {files} --slurm-array-jobs=train_run "
        f'--jobs {len(s["runs"])} --config select="{extra}partition={s["partition"]} '
        f'workers={s["workers"]}"  # {len(s["runs"])} runs, {s["nodes"]} node(s) each'
        for s in job_shapes(cfg)
    ]


def _h(x) -> str:
    if x is None:
        return "-"
    return f"{x:,.0f}" if x >= 100 else f"{x:,.1f}"


def _with_extras(row: dict) -> str:
    """'; with its preflight and allreduce sweeps X node-h' where the partition has them."""
    pre, ar = row.get("preflight_node_hours_worst"), row.get("allreduce_node_hours_worst")
    if not pre and not ar:
        return ""
    what = " and ".join(w for w, h in (("preflight", pre), ("allreduce sweeps", ar)) if h)
    return f"; with its {what} {_h(row['node_hours_worst_all'])} node-h"


def format_plan(p: dict, short: bool = False) -> str:
    """The plan as text: one line per partition (short: the header says 'hvdscale plan')."""
    sel = describe(p["select"]) if p["select"] else ""
    t = p["total"]
    head = (
        f"hvdscale plan: {t['jobs']} training jobs, worst case {_h(t['node_hours_worst'])} "
        f"node-h, {_h(t['gpu_hours_worst'])} GPU-h"
        + (f" (select: {sel})" if sel else "")
        + (f"; {t['jobs_done']} done (record, config unchanged)" if t["jobs_done"] else "")
        + (f"; {t['jobs_retrain']} finished run(s) retrain" if t.get("jobs_retrain") else "")
    )
    lines = [head]
    if p.get("smoke"):
        lines.append(
            f"  smoke study (config key smoke) in {p['results_dir']}: 1 and 2 workers, one "
            "repeat, a small dataset, a few epochs, short time limits"
        )
    for r in p["partitions"]:
        exp = ""
        if r["jobs_estimated"]:
            exp = (
                f", expected {_h(r['node_hours_expected'])} node-h"
                f" ({r['jobs_estimated']} of {r['jobs']} jobs estimated)"
            )
        lines.append(
            f"  {r['partition']}: {r['jobs']} jobs x {r['nodes_per_job']} nodes, "
            f"worst {_h(r['node_hours_worst'])} node-h / {_h(r['gpu_hours_worst'])} GPU-h{exp}"
            + _with_extras(r)
        )
    pre = p.get("preflight") or {}
    if pre.get("jobs"):
        lines.append(
            f"  + {pre['jobs']} preflight jobs (preflight_partition, one per partition, "
            f"before its runs), worst {_h(pre['node_hours_worst'])} node-h"
        )
    a = p["allreduce"]
    if a["jobs"]:
        lines.append(
            f"  + {a['jobs']} allreduce sweeps (measure_allreduce), worst "
            f"{_h(a['node_hours_worst'])} node-h"
        )
    n_arr = p.get("array_jobs", t["jobs"])
    if n_arr:
        single = t["jobs"] - n_arr
        lines.append(
            f"  arrays: {n_arr} train_run jobs in {p['job_shapes']} job shape(s): one "
            f"SLURM array per shape is {p['job_shapes']} sbatch call(s) instead of "
            f"{n_arr} (hvdscale plan --arrays)"
            + (f"; {single} calibration run(s) go as single jobs first" if single else "")
        )
    lines += [f"  ! {note}" for note in p.get("notes", [])]
    retrain = describe_retrain(Retrain(p.get("retrain") or {}), limit=5 if short else None)
    lines += [f"  ! {line}" if i == 0 else f"  {line}" for i, line in enumerate(retrain)]
    if not short:
        lines.append(
            "worst case: every job runs to its partition's runtime_min; expected: measured "
            "training time of runs with a record, else cost-model epoch time x epochs"
        )
    return "\n".join(lines)


def write_csv(p: dict, path: str | Path) -> None:
    import csv

    cols = list(p["partitions"][0]) if p["partitions"] else ["partition"]
    with atomic_path(path, ".csv") as tmp, open(tmp, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols, lineterminator="\n")
        w.writeheader()
        for r in p["partitions"]:
            w.writerow(r)


def study_config_files(paths) -> list:
    """The config files of the study Snakemake runs for ``paths``: the Snakefile's own
    ``configfile`` (config/config.yaml of the project) first, the given files merged over
    it, as ``snakemake --configfile PATHS`` does ("Config file config/config.yaml is
    extended by additional config specified via the command line")."""
    base = find_project_root() / "config" / "config.yaml"
    given = [Path(p) for p in paths]
    if not base.exists() or any(p.resolve() == base.resolve() for p in given):
        return list(paths)
    return [base, *paths]


def merged_config(paths, select=None, overrides=None) -> dict:
    """Config files merged like Snakemake (mappings merge, lists replace), then the
    ``--config KEY=VALUE`` overrides parsed and applied as Snakemake does, validated."""
    merged: dict = {}
    for path in paths:
        _merge(merged, read_config_file(path))
    if overrides:
        _merge(merged, parse_overrides(overrides))
    if select is not None:
        merged["select"] = select
    try:
        return validate_config(merged)
    except ConfigError as exc:
        where = " + ".join(map(str, paths))
        where += f" --config {' '.join(overrides)}" if overrides else ""
        raise ConfigError(f"config file(s) {where}: {exc}") from None


def parse_overrides(entries) -> dict:
    """``KEY=VALUE`` entries as Snakemake's ``--config`` reads them (its own parser)."""
    from snakemake.cli import parse_config

    try:
        return parse_config(list(entries))
    except (ValueError, SystemExit) as exc:
        raise ConfigError(
            f"--config {' '.join(entries)}: {exc}; give top-level keys as KEY=VALUE, e.g. "
            "results_dir=results-b"
        ) from None


def _merge(a: dict, b: dict) -> None:
    for k, v in b.items():
        if isinstance(v, dict) and isinstance(a.get(k), dict):
            _merge(a[k], v)
        else:
            a[k] = v


def snakemake_banner(cfg: dict, stream=None) -> None:
    """The short plan Snakemake prints to stderr when it starts (common.smk)."""
    try:
        text = format_plan(plan(cfg), short=True)
    except Exception as exc:  # never stop a workflow over the preview
        text = f"hvdscale plan: not available ({exc})"
    print(text, file=stream or sys.stderr)


# -------------------------------------------------- the command: hvdscale plan


def add_study_arguments(ap, select_help: str, overrides_help: str) -> None:
    """The arguments that name a study, shared by hvdscale plan and hvdscale status: its
    config files, the selection, snakemake-style --config overrides and results_dir."""
    ap.add_argument("config", nargs="+", help="config file(s), merged in order like --configfile")
    ap.add_argument("--select", help=select_help)
    ap.add_argument(
        "--config",
        dest="overrides",
        nargs="+",
        action="extend",
        metavar="KEY=VALUE",
        help=overrides_help,
    )
    ap.add_argument("--results", help="results directory (default: the config's results_dir)")


def add_arguments(ap):
    add_study_arguments(
        ap,
        "a selection, e.g. 'partition=alpha workers=1-8 repeat=0'",
        "overrides as given to snakemake --config (they count for what retrains)",
    )
    ap.add_argument("--csv", help="also write the per-partition table as CSV")
    ap.add_argument("--json", action="store_true", help="print the plan as JSON")
    ap.add_argument(
        "--arrays",
        action="store_true",
        help="print one submission per job shape with train_run as a SLURM job array",
    )


def run(args) -> int:
    """The budget of a study before anything is submitted (``hvdscale plan CONFIG``).

    Per partition: training jobs (runs of the selected scaling matrix, the calibration runs
    and, as a worst case, the re-runs of one selected candidate per tuning group), nodes per job,
    worst-case node-hours and GPU-hours (every job runs to its partition's time limit,
    scaling.partitions.*.runtime_min), and the expected hours where something is known:
    the measured training time of runs that already have a record (results/scaling/runs.csv)
    and the cost model's predicted epoch time x the epoch budget for the others
    (results/scaling/costmodel.json). The allreduce size sweeps (rule measure_allreduce)
    are listed on their own line with the same worst case.

    Done and retrained: a run is done when it has a record (metrics.json) and the
    current config gives it the config slice it was trained with (its config.json).
    Snakemake trains a finished run again when its slice changed (the slice is a param
    of write_run_config), and every run but the calibration runs when the target's
    slice changed; the plan counts those runs, names them and the config keys that
    changed. Overrides you give Snakemake with --config count: give them here too.

    Node-hours count whole nodes (jobs are exclusive); GPU-hours count the GPUs a job
    requests (gres per node x nodes), 0 on CPU partitions.

    GPUs the train env cannot use are said before anything runs (hvdscale.slurm.gpu_support):
    TensorFlow 2.15 is built against CUDA 12, which needs compute capability
    >= 5.0, so a K80 partition (3.7, the thesis's gpu2) fails at run time with it. The plan,
    Snakemake's start banner and the report's overview say so and what to do instead.

    Job arrays: snakemake-executor-plugin-slurm 2.8 submits the ready jobs of
    a rule named in ``--slurm-array-jobs`` as one SLURM array, with the FIRST job's
    resources for every task (its ``run_array_jobs``: "all jobs have the same resource
    requirement. Thus, we can simply take the first job"). Training runs of different worker
    counts or partitions need different allocations, so arrays are only right for runs of one
    job shape: ``job_shapes`` groups the selected runs, and ``hvdscale plan --arrays`` prints
    one submission per shape (one sbatch each instead of one per run).

    Example
      hvdscale plan config/thesis.yaml [--select "partition=alpha workers=1-8"] [--csv plan.csv]
      hvdscale plan config/thesis.yaml --arrays    # one array submission per job shape
    """
    cfg = merged_config(study_config_files(args.config), args.select, args.overrides)
    check_results_dir(cfg["results_dir"])  # where the study will write, before it runs
    p = plan(cfg, args.results)
    if args.csv:
        write_csv(p, args.csv)
    if args.arrays:
        print("\n".join(array_commands(cfg, args.config)))
    elif args.json:
        print(json.dumps(p, indent=2, sort_keys=True))
    else:
        print(format_plan(p))
    return 0
