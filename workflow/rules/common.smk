# Helpers shared by all rules: the validated config, the run table, wildcard
# constraints, and the resource callables the SLURM profile maps to sbatch flags.
import csv
import json
import os
import shlex
import sys

from snakemake.exceptions import WorkflowError
from snakemake.settings.types import DeploymentMethod

# The package finds the project (schemas, report captions, the train venv) through
# HVDSCALE_ROOT, also from a regular (non-editable) install; every job inherits it.
# (Set, not read: nothing for an `envvars:` directive to assert.)
os.environ.update(HVDSCALE_ROOT=workflow.basedir)

from hvdscale.matrix.runid import ALLREDUCE_ID_WILDCARD
from hvdscale.config.load import (
    check_results_dir,
    count_parameters,
    data_section,
    validate_config,
)
from hvdscale.slurm.deployment import deployment_problem
from hvdscale.errors import ConfigError
from hvdscale.matrix.runkinds import rerun_runs, target_config
from hvdscale.matrix.runtable import find_run, run_config, run_table
from hvdscale.matrix.allreduce_sweeps import allreduce_config, allreduce_jobs
from hvdscale.matrix.runid import RUN_ID_WILDCARD, parse_run_id
from hvdscale.slurm.partitions import slurm_partition_problem
from hvdscale.slurm.jobspec import RESOURCE_KEYS, JobSpec
from hvdscale.launch.launchspec import default_train_python
from hvdscale.slurm.preflight import preflights
from hvdscale.workload.base import check_workload

# scaling.tune: null (an overlay removing the tuning sweep of the config it extends)
# means no tuning sweep; Snakemake's validate() fills defaults only into mappings
if isinstance(config.get("scaling"), dict) and config["scaling"].get("tune", {}) is None:
    del config["scaling"]["tune"]

try:
    CFG = validate_config(config)
    # the workload imports, gives every part, and its samples match its declared shapes
    check_workload(CFG)
except ConfigError as exc:
    raise WorkflowError(str(exc)) from None

# environment.deployment against --sdm: refused here, so `snakemake -n` stops before any
# job (without --sdm env-modules Snakemake ignores `envmodules:` and the ranks would run
# the login shell's python)
_problem = deployment_problem(
    CFG["environment"]["deployment"],
    CFG["environment"]["modules"],
    [m.item_to_choice() for m in workflow.deployment_settings.deployment_method],
)
if _problem:
    raise WorkflowError(_problem)

RESULTS = CFG["results_dir"]  # relative to the working directory, or absolute (scratch)
try:  # writable before any job: not a failed job after hours in the queue
    check_results_dir(RESULTS)
except ConfigError as exc:
    raise WorkflowError(str(exc)) from None
RUNS = run_table(CFG)  # the selected runs (config key select)
RUN_BY_ID = {r.run_id: r for r in RUNS}
RUN_IDS = list(RUN_BY_ID)
# the target calibration runs (calibrated target mode) and the tuning candidates
CAL_IDS = [r.run_id for r in RUNS if r.kind == "cal"]
CANDIDATE_IDS = [r.run_id for r in RUNS if r.candidate and not r.kind]
TUNING = bool(CFG["scaling"].get("tune"))
# the study-wide target validation loss (rule calibrate_target), read by every run but
# the calibration runs
TARGET = f"{RESULTS}/scaling/target.json"
STRICT_TARGETS = [f"{RESULTS}/scaling/references.ok"] if CFG["strict"] else []
ALLREDUCE = {job["id"]: job for job in allreduce_jobs(CFG)}
N_SHARDS = CFG["data"]["n_shards"]
SHARDS = [f"{k:04d}" for k in range(N_SHARDS)]
TRAIN_SHARDS = [f"{k:04d}" for k in range(CFG["data"]["split_shards"]["train"])]
VAL_SHARDS = [f"{k:04d}" for k in range(CFG["data"]["split_shards"]["val"])]
TEST_SHARDS = [f"{k:04d}" for k in range(CFG["data"]["split_shards"]["test"])]

# the budget preview (hvdscale plan) on stderr, once per invocation (not in SLURM jobs)
if workflow.is_main_process:
    from hvdscale.study.plan import snakemake_banner

    snakemake_banner(CFG)

# The package CLI of the workflow-env rules. By default the workflow env's own
# interpreter (Snakemake's), inside and outside SLURM jobs (shared file system), so no
# PATH setup is needed. With --sdm conda, the `python` of the rule's conda env
# (envs/workflow.conda.yaml; the `conda:` directive is what runs the rule) with this
# checkout's src on PYTHONPATH: the env does not install hvdscale (a relative `-e ../`
# in the env file would point nowhere: Snakemake builds the env from a copy of it).
USE_CONDA = DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method
SRC_PATH = os.path.join(workflow.basedir, "src")
HVD = (
    f"PYTHONPATH={shlex.quote(SRC_PATH)}${{PYTHONPATH:+:$PYTHONPATH}} python -m hvdscale.cli"
    if USE_CONDA
    else f"{sys.executable} -m hvdscale.cli"
)
# `hvdscale launch` always runs in Snakemake's own env; the ranks it starts run in the
# train env (venv, env-modules or the conda env of train_run/measure_allreduce)
LAUNCH = f"{sys.executable} -m hvdscale.cli"
# environment.modules: the Lmod/environment modules the train rules load (envmodules:)
ENV_MODULES = CFG["environment"]["modules"]
TRAIN_CONDA_ENV = CFG["environment"]["conda_env"]


wildcard_constraints:
    shard=r"[0-9]{4}",
    run_id=RUN_ID_WILDCARD,
    allreduce_id=ALLREDUCE_ID_WILDCARD,


# --------------------------------------------------------------------------- params


def data_config_json(wildcards):
    return json.dumps(data_section(CFG), sort_keys=True)


def run_config_json(wildcards):
    return json.dumps(run_config(CFG, wildcards.run_id, RUN_BY_ID), sort_keys=True)


def target_config_json(wildcards):
    return json.dumps(target_config(CFG), sort_keys=True)


def allreduce_config_json(wildcards):
    return json.dumps(allreduce_config(CFG, wildcards.allreduce_id), sort_keys=True)


def allreduce_sweep_args(wildcards):
    """Message sizes and iterations of config key allreduce (empty: the program's defaults)."""
    ar = CFG["allreduce"]
    args = [f"--sizes {ar['sizes']}"] if ar["sizes"] else []
    args += [f"--iterations {ar['iterations']}"] if ar["iterations"] else []
    return " ".join(args)


def full_config_json(wildcards):
    return json.dumps(CFG, sort_keys=True)


def train_python(wildcards):
    """The train env's interpreter: the venv, or `python` of the loaded modules/conda env."""
    return default_train_python(CFG, workflow.basedir)


def launcher(wildcards):
    return CFG["training"]["launcher"]


# directories derived from a rule's own files (no hard-coded prefixes)


def dir_of_output_manifest(wildcards, output):
    return os.path.dirname(output.manifest)


def dir_of_input_manifest(wildcards, input):
    return os.path.dirname(input.manifest)


def dir_of_output_metrics(wildcards, output):
    return os.path.dirname(output.metrics)


def runs_dir_of_input_config(wildcards, input):
    return os.path.join(os.path.dirname(os.path.dirname(input.config)), "runs")


def dir_of_output_pdf(wildcards, output):
    return os.path.dirname(output.pdf[0])


def dir_of_input_plots(wildcards, input):
    return os.path.dirname(input.plots[0])


def dir_of_output_archive(wildcards, output):
    return os.path.dirname(output[0])


# --------------------------------------------------------------------------- report inputs

# the figure registry: names, draw functions, captions (workflow/report/{name}.rst)
from hvdscale.figures.registry import FIGURES, caption_values

PLOTS = [fig.name for fig in FIGURES]


def _records(run_ids):
    """The records of ``run_ids``; with report.allow_partial only those that exist now."""
    paths = [f"{RESULTS}/runs/{run_id}/metrics.json" for run_id in run_ids]
    if CFG["report"]["allow_partial"]:
        return [p for p in paths if os.path.exists(p)]
    return paths


def rerun_ids(wildcards):
    """The re-runs of the selected tuning candidates: known once checkpoint select_tuned
    wrote selection.csv (a group whose candidates all failed has none to re-run)."""
    if not TUNING:
        return []
    with open(checkpoints.select_tuned.get().output[0], newline="") as fh:
        rows = [
            row
            for row in csv.DictReader(fh)
            if row.get("candidate") and row.get("status") != "all_failed"
        ]
    return [r.run_id for r in rerun_runs(CFG, rows)]


def run_records(wildcards):
    """Every record of the run table (scaling runs, candidates, calibration runs)."""
    return _records(RUN_IDS)


def rerun_records(wildcards):
    """The re-runs' records: a separate input (after checkpoint select_tuned) so that a
    dry run still plans every run of the table."""
    return _records(rerun_ids(wildcards))


def calibration_records(wildcards):
    """The calibration runs' records (none in absolute target mode)."""
    return [f"{RESULTS}/runs/{run_id}/metrics.json" for run_id in CAL_IDS]


def candidate_records(wildcards):
    """The tuning candidates' records (checkpoint select_tuned)."""
    return _records(CANDIDATE_IDS)


def target_of_run(wildcards):
    """target.json for every run but a calibration run (which sets it)."""
    return [] if parse_run_id(wildcards.run_id)["kind"] == "cal" else [TARGET]


def target_argument(wildcards, input):
    """`--target FILE` of `hvdscale launch` (none for a calibration run)."""
    return f"--target {shlex.quote(input.target[0])}" if input.target else ""


def allreduce_tables(wildcards):
    paths = [f"{RESULTS}/allreduce/{job_id}.csv" for job_id in ALLREDUCE]
    if CFG["report"]["allow_partial"]:
        return [p for p in paths if os.path.exists(p)]
    return paths


def config_files(wildcards):
    """The config files of this invocation, in merge order (for the report's provenance
    and a rebuild's --configfiles), relative to the working directory (the project root;
    a rebuild's --directory). Snakemake lists the Snakefile's `configfile:` after the
    command line's files but merges it first; a file given twice counts where it was
    merged last, so a rebuild that replays the list merges the same config."""
    cli = [os.path.abspath(str(p)) for p in workflow.overwrite_configfiles]
    rest = [os.path.abspath(str(p)) for p in workflow.configfiles]
    rest = [p for p in rest if p not in cli]
    order = [p for i, p in enumerate(rest + cli) if p not in (rest + cli)[i + 1 :]]
    return " ".join(shlex.quote(os.path.relpath(p, os.getcwd())) for p in order)


def model_bytes(wildcards):
    return 4 * count_parameters(CFG)


# --------------------------------------------------------------------------- resources
# The layout of every job that starts ranks comes from one JobSpec (hvdscale.slurm.jobspec):
# nodes, tasks, tasks per node, CPUs per task, gres, memory, runtime per attempt,
# mpi. train_run and measure_allreduce share JOB_RESOURCES, one callable per SLURM
# resource (snakemake-executor-plugin-slurm maps them to sbatch flags); a callable
# returning None leaves the resource unset (no sbatch flag).

# one preflight job per partition (hvdscale.slurm.preflight), 2 ranks laid out like the runs
PREFLIGHTS = preflights(CFG)
JOBS = {run.run_id: JobSpec.for_run(CFG, run) for run in RUNS}
JOBS.update({job_id: JobSpec.for_allreduce_id(CFG, job_id) for job_id in ALLREDUCE})


def check_slurm_partitions():
    """Refuse partitions of the study that `sinfo` does not list (issue 29); without a
    working sinfo (a laptop) a one-line note says the partitions were not checked."""
    problem = slurm_partition_problem(
        [(job.partition, job.cluster) for job in JOBS.values()], config_files(None)
    )
    if problem:
        raise WorkflowError(problem)


def job_spec(wildcards):
    """The JobSpec of a train_run (run_id) or measure_allreduce (allreduce_id) job; a
    re-run of a tuning candidate (not in the run table) is laid out on first use."""
    if hasattr(wildcards, "partition"):  # preflight_partition
        return PREFLIGHTS[wildcards.partition].job
    if hasattr(wildcards, "run_id"):
        if wildcards.run_id not in JOBS:
            JOBS[wildcards.run_id] = JobSpec.for_run(
                CFG, find_run(CFG, wildcards.run_id, RUN_BY_ID)
            )
        return JOBS[wildcards.run_id]
    return JOBS[wildcards.allreduce_id]


def _job_resource(key):
    def resource(wildcards, attempt):
        return job_spec(wildcards).slurm_resources(attempt)[key]

    resource.__name__ = f"job_resource_{key}"
    return resource


JOB_RESOURCES = {key: _job_resource(key) for key in RESOURCE_KEYS}


def job_threads(wildcards):
    """Cores the job occupies on a single machine (the local profile's --cores)."""
    return job_spec(wildcards).local_threads


# --------------------------------------------------------------------------- preflight


def _after_preflight(partition, output):
    """Wait for the partition's preflight (checkpoint preflight_partition) while
    ``output`` is still to be made; no input file either way. The preflight is never in
    the set of input files Snakemake records for a run, so a finished run never trains
    again because of it: not in a study from before the preflight, not when a preflight
    is repeated (its params changed, --forcerun) or its JSON is gone. A failed preflight
    leaves the partition's jobs waiting: none of them is submitted."""
    if partition in PREFLIGHTS and not os.path.exists(output):
        checkpoints.preflight_partition.get(partition=partition)
    return []


def preflight_of_run(wildcards):
    """A train_run without its metrics.json starts after its partition's preflight."""
    run = wildcards.run_id
    partition = parse_run_id(run)["partition"]
    return _after_preflight(partition, f"{RESULTS}/runs/{run}/metrics.json")


def preflight_of_allreduce(wildcards):
    """A measure_allreduce sweep not yet measured starts after its partition's preflight."""
    job = wildcards.allreduce_id
    return _after_preflight(JOBS[job].partition, f"{RESULTS}/allreduce/{job}.csv")


def preflight_records(wildcards):
    """The report's preflight JSONs: those present, and those of partitions whose runs or
    sweeps are still to be made (their preflight runs first); a finished study from
    before the preflight has none and needs none."""
    pending = {
        run.partition
        for run in RUNS
        if not os.path.exists(f"{RESULTS}/runs/{run.run_id}/metrics.json")
    }
    pending |= {
        JOBS[job].partition
        for job in ALLREDUCE
        if not os.path.exists(f"{RESULTS}/allreduce/{job}.csv")
    }
    return [
        f"{RESULTS}/preflight/{p}.json"
        for p in PREFLIGHTS
        if p in pending or os.path.exists(f"{RESULTS}/preflight/{p}.json")
    ]


def preflight_config_json(wildcards):
    """The config a partition's preflight reads: all of it but the report's keys."""
    return json.dumps(
        {k: v for k, v in CFG.items() if k not in ("report", "references")}, sort_keys=True
    )


def preflight_json(wildcards):
    """What a partition's preflight depends on (nodes, checks, resources)."""
    return json.dumps(PREFLIGHTS[wildcards.partition].slice(), sort_keys=True)
