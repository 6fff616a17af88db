# Helpers shared by all rules: the validated config, the run table, wildcard
# constraints, and the resource callables the SLURM profile maps to sbatch flags.
import json
import os
import shlex
import sys

from snakemake.exceptions import WorkflowError

from hvdscale.common import ALLREDUCE_ID_WILDCARD
from hvdscale.config import (
    ConfigError,
    RUN_ID_WILDCARD,
    allreduce_jobs,
    count_parameters,
    data_section,
    find_run,
    run_config,
    run_table,
    validate_config,
)

try:
    CFG = validate_config(config)
except ConfigError as exc:
    raise WorkflowError(str(exc)) from None

RESULTS = CFG["results_dir"]
RUNS = run_table(CFG)
RUN_BY_ID = {r.run_id: r for r in RUNS}
RUN_IDS = list(RUN_BY_ID)
ALLREDUCE = {job["id"]: job for job in allreduce_jobs(CFG)}
N_SHARDS = CFG["data"]["n_shards"]
SHARDS = [f"{k:04d}" for k in range(N_SHARDS)]
TRAIN_SHARDS = [f"{k:04d}" for k in range(CFG["data"]["split_shards"]["train"])]
TEST_SHARDS = [f"{k:04d}" for k in range(CFG["data"]["split_shards"]["test"])]

# The workflow env's own interpreter runs the package CLI, inside and outside SLURM
# jobs (shared file system), so no PATH setup is needed.
HVD = f"{sys.executable} -m hvdscale.cli"
DEPLOYMENT = CFG["environment"]["deployment"]
TRAIN_MODULES = CFG["environment"]["modules"]
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


def full_config_json(wildcards):
    return json.dumps(CFG, sort_keys=True)


def train_python(wildcards):
    """The train env's interpreter: the venv, or `python` of the loaded modules/conda env."""
    if DEPLOYMENT == "venv":
        return f"{workflow.basedir}/{CFG['environment']['venv']}/bin/python"
    return "python"


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


# --------------------------------------------------------------------------- report inputs

# the figure registry: names, draw functions, captions (workflow/report/{name}.rst)
from hvdscale.analysis.figures import FIGURES, caption_values

PLOTS = [fig.name for fig in FIGURES]


def run_records(wildcards):
    """Every run's record; with report.allow_partial only those that exist now."""
    paths = [f"{RESULTS}/runs/{run_id}/metrics.json" for run_id in RUN_IDS]
    if CFG["report"]["allow_partial"]:
        return [p for p in paths if os.path.exists(p)]
    return paths


def allreduce_tables(wildcards):
    paths = [f"{RESULTS}/allreduce/{job_id}.csv" for job_id in ALLREDUCE]
    if CFG["report"]["allow_partial"]:
        return [p for p in paths if os.path.exists(p)]
    return paths


def config_files(wildcards):
    """The config files of this invocation, in merge order (for the report's provenance)."""
    return " ".join(
        shlex.quote(os.path.relpath(str(p), workflow.basedir)) for p in workflow.configfiles
    )


def model_bytes(wildcards):
    return 4 * count_parameters(CFG)


# --------------------------------------------------------------------------- resources
# Sequential distribution as in the reference study: fill every GPU (or CPU slot) of a
# node before using the next one; one task per worker; whole nodes (exclusive) with
# all their memory; CPUs per task = cores per node / GPUs per node.


def _job(wildcards):
    if hasattr(wildcards, "run_id"):
        return RUN_BY_ID[wildcards.run_id].as_dict()
    return ALLREDUCE[wildcards.allreduce_id]


def _partition(wildcards):
    return CFG["scaling"]["partitions"][_job(wildcards)["partition"]]


# A callable returning None leaves the resource unset (no sbatch flag).


def res_partition(wildcards):
    return _job(wildcards)["partition"]


def res_account(wildcards):
    return _partition(wildcards)["account"] or None


def res_constraint(wildcards):
    return _partition(wildcards)["constraint"] or None


def res_nodes(wildcards):
    return _job(wildcards)["nodes"]


def res_tasks(wildcards):
    return _job(wildcards)["workers"]


def res_cpus_per_task(wildcards):
    part = _partition(wildcards)
    slots = part["gpus_per_node"] or part["workers_per_node"]
    return max(1, part["cores_per_node"] // slots)


def res_mem_mb(wildcards):
    return _partition(wildcards)["mem_mb_per_node"]


def res_runtime(wildcards, attempt):
    # issue 12: per-attempt runtime (partition runtime_min_retry for retries)
    from hvdscale.timelimit import runtime_for

    return runtime_for(_partition(wildcards), attempt)


def res_slurm_cluster(wildcards):
    # issue 12: partition `cluster` -> the plugin's slurm_cluster (sbatch --clusters)
    from hvdscale.site_settings import slurm_cluster

    return slurm_cluster(_partition(wildcards))


def res_gres(wildcards):
    job = _job(wildcards)
    gpus = min(job["gpus_per_node"], job["workers_per_node"]) if job["gpus_per_node"] else 0
    return f"gpu:{gpus}" if gpus else None


def res_tasks_per_gpu(wildcards):
    # plugin 2.8 turns `tasks` into --ntasks-per-gpu on GPU jobs unless this is 0
    return 0 if _job(wildcards)["gpus_per_node"] else None


def res_mpi(wildcards):
    # the plugin refuses mpi jobs with one task; a 1-worker run is a plain job whose
    # launcher starts its single rank with `srun --overlap`
    return "srun" if _job(wildcards)["workers"] > 1 else None


def res_slurm_extra(wildcards):
    # --ntasks-per-node here: the plugin's tasks_per_node cannot be combined with tasks
    extra = f"--ntasks-per-node={_job(wildcards)['workers_per_node']} --exclusive"
    # issue 12: SIGUSR1 training.time_limit_margin_s before the time limit
    from hvdscale.timelimit import signal_option

    sig = signal_option(CFG["training"], _job(wildcards)["workers"])
    return f"{extra} {sig}" if sig else extra


def local_threads(wildcards):
    """Cores the run occupies on a single machine (the local profile's --cores)."""
    return _job(wildcards)["workers"] * CFG["training"]["threads_per_worker"]
