"""JobSpec: the one job layout behind the rules' SLURM resources and the launcher's
arguments (unit tests), and the thesis DAG planned through the SLURM profile gets the
same resources as before JobSpec existed (slow: one dry run)."""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hvdscale.config.load import load_config, validate_config
from hvdscale.errors import ConfigError, UserError
from hvdscale.launch.launchspec import build_launch
from hvdscale.launch.runner import job_for
from hvdscale.matrix.runtable import find_run, run_table
from hvdscale.slurm.jobspec import RESOURCE_KEYS, JobSpec
from hvdscale.slurm.preflight import preflights

ROOT = Path(__file__).resolve().parents[1]
THESIS = ROOT / "config" / "thesis.yaml"
PROG = ["python", "-m", "hvdscale.cli", "train"]


@pytest.fixture(scope="module")
def thesis():
    return load_config(THESIS)


def test_multi_node_gpu_layout(thesis):
    job = JobSpec.for_workers(thesis, "gpu2", "nccl", 32)  # K80 nodes: 4 GPUs, 24 cores
    assert (job.nodes, job.tasks, job.tasks_per_node, job.cpus_per_task) == (8, 32, 4, 6)
    assert job.gres == "gpu:4" and job.mpi == "srun" and not job.in_launcher_step
    assert job.slurm_resources() == {
        "slurm_partition": "gpu2",
        "slurm_cluster": None,
        "slurm_account": None,
        "constraint": None,
        "nodes": 8,
        "tasks": 32,
        "tasks_per_gpu": 0,
        "cpus_per_task": 6,
        "mem_mb": 62000,
        "runtime": 240,
        "gres": "gpu:4",
        "slurm_extra": "--ntasks-per-node=4 --exclusive --signal=USR1@120",
        "mpi": "srun",
    }
    assert tuple(job.slurm_resources()) == RESOURCE_KEYS


def test_partial_node_requests_only_the_gpus_it_uses(thesis):
    job = JobSpec.for_workers(thesis, "alpha", "nccl", 2)  # 8 A100 per node
    assert (job.nodes, job.workers_per_node, job.gres) == (1, 2, "gpu:2")
    assert job.slurm_extra == "--ntasks-per-node=2 --exclusive --signal=USR1@120"


def test_one_worker_is_a_plain_job_whose_rank_runs_in_the_launcher_step(thesis):
    job = JobSpec.for_workers(thesis, "gpu2", "mpi", 1)
    res = job.slurm_resources()
    assert res["mpi"] is None and res["tasks"] == 1 and res["nodes"] == 1
    assert res["gres"] == "gpu:1"  # the plugin's step (the job's one task) gets it
    assert job.in_launcher_step  # no srun: the launcher starts the rank (test_launch.py)
    assert not JobSpec.for_workers(thesis, "gpu2", "mpi", 2).in_launcher_step
    assert "--overlap" not in " ".join(job.srun_args() + res["slurm_extra"].split())


def test_cpu_partition_account_and_constraint():
    cfg = validate_config(
        {
            "scaling": {
                "partitions": {
                    "haswell": {
                        "cores_per_node": 24,
                        "mem_mb_per_node": 60000,
                        "workers_per_node": 4,
                        "runtime_min": 90,
                        "account": "p_scaling",
                        "constraint": "fast&big",
                    }
                },
                "sweeps": [
                    {
                        "partitions": ["haswell"],
                        "workers": [6],
                        "backends": ["mpi"],
                        "batch_sizes": [75],
                        "lr_rules": ["none"],
                    }
                ],
            },
            "training": {"threads_per_worker": 3},
        }
    )
    job = JobSpec.for_workers(cfg, "haswell", "mpi", 6)
    res = job.slurm_resources()
    assert (res["nodes"], res["cpus_per_task"], res["mem_mb"], res["runtime"]) == (2, 6, 60000, 90)
    assert (res["slurm_account"], res["constraint"]) == ("p_scaling", "fast&big")
    assert res["gres"] is None and res["tasks_per_gpu"] is None
    # multi-rank jobs ask for SIGUSR1 before the time limit (training.time_limit_margin_s)
    assert res["slurm_extra"] == "--ntasks-per-node=4 --exclusive --signal=USR1@120"
    assert job.local_threads == 24  # the whole node (6 ranks x 3 threads = 18 < 24 cores)


def _site_config(flags: str) -> dict:
    part = {"cores_per_node": 4, "mem_mb_per_node": 8000, "workers_per_node": 2}
    sweep = {"partitions": ["haswell"], "workers": [1, 2], "backends": ["mpi"],
             "batch_sizes": [75], "lr_rules": ["none"]}  # fmt: skip
    return {"scaling": {"partitions": {"haswell": {**part, "sbatch_flags": flags}},
                        "sweeps": [sweep]}}  # fmt: skip


def test_site_sbatch_flags_reach_every_job_of_the_partition():
    """scaling.partitions.<name>.sbatch_flags: appended to the slurm_extra of training
    runs (1 and 2 workers) and allreduce sweeps; not in a run's or sweep's config slice."""
    from hvdscale.matrix.allreduce_sweeps import allreduce_config, allreduce_jobs
    from hvdscale.matrix.runtable import run_config

    cfg = validate_config(_site_config("  --mail-type=FAIL   --mail-user=me@example.org "))
    two = JobSpec.for_workers(cfg, "haswell", "mpi", 2).slurm_resources()["slurm_extra"]
    assert two == (
        "--ntasks-per-node=2 --exclusive --signal=USR1@120 "
        "--mail-type=FAIL --mail-user=me@example.org"
    )
    one = JobSpec.for_workers(cfg, "haswell", "mpi", 1).slurm_extra
    assert one == "--ntasks-per-node=1 --exclusive --mail-type=FAIL --mail-user=me@example.org"
    (sweep,) = allreduce_jobs(cfg)
    assert JobSpec.for_allreduce_id(cfg, sweep["id"]).slurm_extra.endswith(
        "--signal=USR1@120 --mail-type=FAIL --mail-user=me@example.org"
    )
    # none set: slurm_extra as before
    plain = validate_config(_site_config(""))
    assert JobSpec.for_workers(plain, "haswell", "mpi", 2).slurm_extra == (
        "--ntasks-per-node=2 --exclusive --signal=USR1@120"
    )
    # how a job is queued is not what it computes: the slices (config.json) leave it out
    for run in run_table(cfg):
        sliced = run_config(cfg, run.run_id)["scaling"]["partitions"]["haswell"]
        assert "sbatch_flags" not in sliced
        assert run_config(cfg, run.run_id) == run_config(plain, run.run_id)
    assert allreduce_config(cfg, sweep["id"]) == allreduce_config(plain, sweep["id"])


@pytest.mark.parametrize(
    "flags, match",
    [
        ("--partition=gpu", r"'--partition=gpu' sets --partition, which is set by the partition"),
        ("--part=gpu", r"sets --partition"),
        ("--mail-type=FAIL -p gpu", r"'-p' sets --partition"),
        ("-pgpu", r"'-pgpu' sets --partition"),
        ("--ntasks=4", r"sets --ntasks, which is set by hvdscale"),
        ("--nodes 2", r"sets --nodes"),
        ("-N2", r"sets --nodes"),
        ("--gpus=2", r"scaling.partitions.haswell.gpus_per_node"),
        ("--account=x", r"scaling.partitions.haswell.account"),
        ("--qos=normal", r"sets --qos, which is set by the profile \(plugin setting slurm-qos"),
        ("--comment=x", r"sets --comment, which is set by the executor plugin"),
        ("--exclusive=user", r"sets --exclusive"),
        ("--signal=USR2@60", r"training.time_limit_margin_s"),
        ("mail", r"got 'mail'; expected sbatch flags"),
    ],
)
def test_site_sbatch_flags_that_clash_are_refused(flags, match):
    with pytest.raises(ConfigError) as err:
        validate_config(_site_config(flags))
    assert "config key scaling.partitions.haswell.sbatch_flags: " in str(err.value)
    assert re.search(match, str(err.value)), str(err.value)


@pytest.mark.parametrize("flags", ["--mail-type=FAIL\n--x", "--comment='a b'", "--x;touch y"])
def test_site_sbatch_flags_are_one_line_without_shell_characters(flags):
    with pytest.raises(ConfigError, match=r"scaling\.partitions\.haswell\.sbatch_flags"):
        validate_config(_site_config(flags))


def test_harmless_site_sbatch_flags_pass():
    flags = "--mail-type=FAIL,END --mail-user=me@example.org --reservation=p_x_42 --nice=5"
    flags += " --begin=2026-01-01T10:00 --exclude=node1,node2 --time-min=30 --mem-bind=local"
    cfg = validate_config(_site_config(flags))
    assert JobSpec.for_workers(cfg, "haswell", "mpi", 2).slurm_extra.endswith(flags)


def test_runtime_per_attempt(thesis):
    job = JobSpec.for_workers(thesis, "alpha", "nccl", 8)
    # a retry (e.g. after the time limit) resumes from its checkpoint with runtime_min_retry
    assert [job.slurm_resources(a)["runtime"] for a in (1, 2, 3)] == [120, 240, 240]
    part = {**thesis["scaling"]["partitions"]["alpha"], "runtime_min_retry": None}
    cfg = {**thesis, "scaling": {**thesis["scaling"], "partitions": {"alpha": part}}}
    same = JobSpec.for_workers(cfg, "alpha", "nccl", 8)
    assert [same.runtime(a) for a in (1, 2)] == [120, 120]
    with pytest.raises(ValueError):
        job.runtime(0)


def test_srun_args_are_what_the_launcher_runs(thesis):
    job = JobSpec.for_workers(thesis, "gpu2", "mpi", 8)
    spec = build_launch(
        launcher="srun", job=job, program_argv=PROG, training=thesis["training"], is_root_user=False
    )
    assert spec.argv == job.srun_args() + PROG
    assert spec.argv[:9] == [
        "srun",
        "--mpi=pmix",
        "-n",
        "8",
        "-N",
        "2",
        "--ntasks-per-node=4",
        "--cpus-per-task=6",
        "--kill-on-bad-exit=1",
    ]


def test_launcher_and_rules_see_the_same_job(thesis):
    for run in run_table(thesis)[::37]:
        job, ident = job_for(thesis, "train", run.run_id, None)
        assert ident == run.run_id and job == JobSpec.for_run(thesis, run)
        assert (job.nodes, job.workers_per_node) == (run.nodes, run.workers_per_node)
    job, _ = job_for(thesis, "measure-allreduce", None, "alpha_nccl_n2_w16")
    assert job == JobSpec.for_workers(thesis, "alpha", "nccl", 16)


@pytest.mark.parametrize(
    "allreduce_id,match",
    [("alpha_nccl_w16", "expected"), ("beta_mpi_n1_w2", "not in"), ("alpha_nccl_n1_w16", "node")],
)
def test_bad_allreduce_ids(thesis, allreduce_id, match):
    with pytest.raises(UserError, match=match):
        JobSpec.for_allreduce_id(thesis, allreduce_id)


# --------------------------------------------------------------------------- the DAG


def _before_jobspec(cfg: dict, partition: str, backend: str, nodes: int, workers: int) -> dict:
    """The resources the workflow computed before JobSpec (workflow/rules/common.smk's
    res_* callables of commit 452ac2d, verbatim in substance): the oracle."""
    part = cfg["scaling"]["partitions"][partition]
    slots = part["gpus_per_node"] or part["workers_per_node"]
    wpn = min(workers, slots)  # config.Run.workers_per_node
    gpus = min(part["gpus_per_node"], wpn) if part["gpus_per_node"] else 0
    margin = cfg["training"].get("time_limit_margin_s", 120)
    # issue 12: SIGUSR1 before the time limit for multi-rank jobs, --clusters per partition
    signal = f" --signal=USR1@{margin}" if margin and workers > 1 else ""
    res = {
        "slurm_partition": partition,
        "slurm_cluster": part.get("cluster") or None,
        "slurm_account": part["account"] or None,
        "constraint": part["constraint"] or None,
        "nodes": nodes,
        "tasks": workers,
        "tasks_per_gpu": 0 if part["gpus_per_node"] else None,
        "cpus_per_task": max(1, part["cores_per_node"] // slots),
        "mem_mb": part["mem_mb_per_node"],
        "runtime": part["runtime_min"],
        "gres": f"gpu:{gpus}" if gpus else None,
        "slurm_extra": f"--ntasks-per-node={wpn} --exclusive{signal}",
        "mpi": "srun" if workers > 1 else None,
    }
    return {k: str(v) for k, v in res.items() if v is not None}


# resources Snakemake derives or adds by itself (not the workflow's)
DERIVED = {"tmpdir", "disk_mb", "disk", "disk_mib", "mem", "mem_mib"}
ID = re.compile(r"(?P<partition>[a-z0-9-]+)_(?P<backend>\w+?)_n(?P<nodes>\d+)_w(?P<workers>\d+)")


def _planned_jobs(text: str) -> list[tuple[str, str, dict]]:
    """(rule, wildcards, resources) of every job of a dry run's output."""
    jobs, cur = [], None
    for line in text.splitlines():
        m = re.match(r"^(?:local)?(?:rule|checkpoint) (\w+):$", line)
        if m:
            cur = [m[1], "", {}]
            jobs.append(cur)
        elif cur is not None and line.startswith("    wildcards: "):
            cur[1] = line.split(": ", 1)[1]
        elif cur is not None and line.startswith("    resources: "):
            items = line.split(": ", 1)[1].split(", ")
            cur[2] = {k: v for k, v in (i.split("=", 1) for i in items) if k not in DERIVED}
    return [tuple(j) for j in jobs]


@pytest.mark.slow
def test_thesis_dag_resources_are_unchanged_by_jobspec(thesis):
    out = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--profile", "profiles/slurm"]
        + ["--configfile", str(THESIS)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        # no SLURM cluster for the dry run's partition check (tests/test_slurmsite.py)
        env={**os.environ, "PYTHONUNBUFFERED": "1", "SLURM_CONF": os.devnull},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    jobs = _planned_jobs(out.stdout + out.stderr)
    counts = {}
    for rule, wildcards, res in jobs:
        counts[rule] = counts.get(rule, 0) + 1
        if rule in ("train_run", "measure_allreduce"):
            m = ID.search(wildcards)
            want = _before_jobspec(
                thesis, m["partition"], m["backend"], int(m["nodes"]), int(m["workers"])
            )
            assert res == want, (rule, wildcards)
        elif rule == "preflight_partition":  # the partition's 2-rank JobSpec
            job = preflights(thesis)[wildcards.split("=", 1)[1]].job
            want = {k: str(v) for k, v in job.slurm_resources(1).items() if v is not None}
            assert res == want, (rule, wildcards, res)
        else:  # the profile's default-resources only
            assert res == {"mem_mb": "4000", "runtime": "60"}, (rule, wildcards, res)
    assert counts["train_run"] == len(run_table(thesis)) == 690 + 3  # + target calibration
    assert counts["preflight_partition"] == 2  # alpha, hpdlf
    assert counts["measure_allreduce"] == 30


def test_oracle_agrees_with_jobspec_on_every_thesis_run(thesis):
    """The fast twin of the dry-run test: every run of the thesis matrix, and of a
    variant with account, constraint and cores that do not divide evenly."""
    cfgs = [thesis, copy.deepcopy(thesis)]
    for part in cfgs[1]["scaling"]["partitions"].values():
        part.update(account="p_x", constraint="a100", cores_per_node=7)
    for cfg in cfgs:
        for run in run_table(validate_config(cfg)):
            got = JobSpec.for_run(cfg, run).slurm_resources()
            want = _before_jobspec(cfg, run.partition, run.backend, run.nodes, run.workers)
            assert {k: str(v) for k, v in got.items() if v is not None} == want, run.run_id


def test_a_local_training_job_takes_the_whole_node():
    """Two timed runs never share a machine: a 1-worker run asks for all cores of its
    partition (the local profile runs it alone), as a SLURM job takes whole nodes."""
    cfg = validate_config({})
    one = JobSpec.for_workers(cfg, "local", "mpi", 1)
    assert one.local_threads == cfg["scaling"]["partitions"]["local"]["cores_per_node"] == 2
    assert JobSpec.for_workers(cfg, "local", "mpi", 2).local_threads == 2


# --------------------------------------------------------------------------- GPU binding

GPU_BIND_FLAGS = {  # scaling.partitions.<name>.gpu_bind -> the ranks' srun options
    None: ["--gpus-per-task=1"],  # the default: what SLURM sites such as ZIH recommend
    "per-task": ["--gpus-per-task=1"],
    "single": ["--gpu-bind=single:1"],
    "none": [],
}


def _with_bind(cfg: dict, partition: str, bind: str | None) -> dict:
    cfg = copy.deepcopy(cfg)
    part = cfg["scaling"]["partitions"][partition]
    part.pop("gpu_bind", None)
    if bind is not None:
        part["gpu_bind"] = bind
    return validate_config(cfg)


def _gpu_options(argv: list[str]) -> list[str]:
    return [a for a in argv if a.startswith(("--gpu", "--gres"))]


@pytest.mark.parametrize("bind", list(GPU_BIND_FLAGS))
def test_gpu_bind_goes_into_the_srun_of_every_launch_on_a_gpu_partition(thesis, bind):
    """Issue 29: the partition's gpu_bind is the ranks' srun options (training runs of MPI,
    Gloo and torch-ddp, 1 worker or several, and allreduce sweeps); nothing else of the
    job changes."""
    cfg = _with_bind(thesis, "alpha", bind)
    flags = GPU_BIND_FLAGS[bind]
    tr = cfg["training"]
    job = JobSpec.for_workers(cfg, "alpha", "mpi", 16)
    assert job.gpu_bind == (bind or "per-task") and job.gpu_bind_args == flags
    spec = build_launch(launcher="srun", job=job, program_argv=PROG, training=tr)
    assert spec.argv == [
        *("srun", "--mpi=pmix", "-n", "16", "-N", "2", "--ntasks-per-node=8"),
        *("--cpus-per-task=6", "--kill-on-bad-exit=1", *flags, *PROG),
    ]
    (note,) = [n for n in spec.notes if n.startswith("GPU binding")]
    assert f"(gpu_bind {bind or 'per-task'})" in note
    # a 1-worker run starts no srun (issue 29): its rank has the GPU of the plugin's step
    one = JobSpec.for_workers(cfg, "alpha", "mpi", 1)
    one = build_launch(launcher="srun", job=one, program_argv=PROG, training=tr)
    assert "srun" not in one.argv and not _gpu_options(one.argv)
    assert not [n for n in one.notes if n.startswith("GPU binding")]
    assert "CUDA_VISIBLE_DEVICES" in one.notes[-1]  # the step's GPUs, named in the log
    hosts = ["node1", "node2"]
    gloo = JobSpec.for_workers(cfg, "alpha", "gloo", 16)
    spec = build_launch(launcher="srun", job=gloo, program_argv=PROG, training=tr, hosts=hosts)
    assert spec.argv[0] == "srun" and "--mpi=none" in spec.argv
    assert _gpu_options(spec.argv) == flags
    if flags:
        assert spec.argv[spec.argv.index("--kill-on-bad-exit=1") + 1] == flags[0]
    torch = JobSpec.for_workers(cfg, "alpha", "gloo", 16, framework="torch-ddp")
    spec = build_launch(launcher="srun", job=torch, program_argv=PROG, training=tr, hosts=hosts)
    assert _gpu_options(spec.argv) == flags and "exec" in spec.argv
    assert _gpu_options(JobSpec.for_allreduce_id(cfg, "alpha_nccl_n2_w16").srun_args()) == flags
    # the job's SLURM resources (sbatch) are the same whatever the binding
    assert (
        job.slurm_resources() == JobSpec.for_workers(thesis, "alpha", "mpi", 16).slurm_resources()
    )


def test_gpu_bind_is_ignored_on_cpu_partitions():
    cfg = _with_bind(validate_config({}), "local", "single")
    for backend in ("mpi", "gloo"):
        job = JobSpec.for_workers(cfg, "local", backend, 2)
        assert job.gpu_bind_args == []
        spec = build_launch(launcher="srun", job=job, program_argv=PROG, training=cfg["training"])
        assert _gpu_options(spec.argv) == [] and not any("GPU" in n for n in spec.notes)


def test_gpu_bind_is_in_the_config_slice_of_gpu_runs_only(thesis):
    """A GPU run's slice (config.json) carries gpu_bind: it decides where each rank computes,
    so changing it retrains the partition's runs; the launcher reads it from the slice.
    A CPU partition ignores it: its runs' slices stay as they were before the key."""
    from hvdscale.matrix.allreduce_sweeps import allreduce_config
    from hvdscale.matrix.runtable import run_config

    run_id = "alpha_mpi_n2_w16_b75_lrnone_r0"
    per_task, single = _with_bind(thesis, "alpha", None), _with_bind(thesis, "alpha", "single")
    sliced = run_config(per_task, run_id)
    assert sliced["scaling"]["partitions"]["alpha"]["gpu_bind"] == "per-task"
    assert run_config(single, run_id)["scaling"]["partitions"]["alpha"]["gpu_bind"] == "single"
    assert run_config(single, run_id) != sliced
    job = JobSpec.for_run(validate_config(run_config(single, run_id)), find_run(single, run_id))
    assert job.gpu_bind_args == ["--gpu-bind=single:1"]
    assert allreduce_config(single, "alpha_nccl_n2_w16") != allreduce_config(
        per_task, "alpha_nccl_n2_w16"
    )
    cpu, cpu_single = validate_config({}), _with_bind(validate_config({}), "local", "single")
    for run in run_table(cpu):
        assert (
            "gpu_bind" not in run_config(cpu_single, run.run_id)["scaling"]["partitions"]["local"]
        )
        assert run_config(cpu_single, run.run_id) == run_config(cpu, run.run_id)


@pytest.mark.parametrize("bind", ["socket", "closest", "", 1])
def test_an_unknown_gpu_bind_is_refused_naming_the_key(thesis, bind):
    with pytest.raises(ConfigError, match=r"scaling\.partitions\.alpha\.gpu_bind"):
        _with_bind(thesis, "alpha", bind)


def test_gpu_bind_flags_are_not_site_sbatch_flags():
    for flags in ("--gpu-bind=single:1", "--gpus-per-task=1"):
        cfg = _site_config(flags)
        with pytest.raises(ConfigError, match=r"gpu_bind"):
            validate_config(cfg)
