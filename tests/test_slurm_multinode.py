"""Multi-node for real (issue 12), on the local cluster in emulated-Taurus mode
(`scripts/slurm-cluster.sh up --nodes 2 --emulate alpha`: node1 and node2 in their own
network namespaces, each declared with 8 GPUs as gres, 48 CPUs and 990000 MB).

- the scheduler accepts the thesis's job shapes and `srun --gpus-per-task=1` gives each
  rank its own CUDA_VISIBLE_DEVICES;
- the scaled-down thesis config (.test/slurm-thesis.yaml) runs through the Snakemake
  SLURM plugin (profiles/test-slurm) with 1, 2, 4, 8 and 16 workers: nodes, tasks per
  node, CPUs per task, gres, exclusive and memory as `scontrol show job` reports them,
  16 ranks filling node1 (ranks 0-7) and then node2 (8-15) under srun --mpi=pmix, and a
  16-rank gloo run across both nodes started by srun with Horovod's rendezvous from
  `hvdscale launch` (no ssh: no ssh server runs here); every run's ranks are started with
  the partition's gpu_bind (per-task, the default: srun --gpus-per-task=1) and its record
  shows each rank's one GPU id (environment.visible_gpus), distinct on its node, which
  the label proof compared (issue 29);
- a run that reaches its time limit is warned by SIGUSR1, checkpoints, exits 4 and is
  resumed by the retry, which gets a longer time limit;
- the runs of one job shape go through one SLURM job array (issue 20).
- a 16-rank torch-ddp run (issue 19) across both nodes, one srun task per rank with
  torch.distributed's rendezvous on node1.

These tests run in `make test` (CI, issue 20): one cluster start-up for the module, tiny
data and runs; the label proofs of the runs are checked against their timelines.

Real slurmctld/slurmd, real sbatch/srun, real Horovod (TensorFlow on the CPU: the GPUs
are emulated, and the run records say CPU). Needs root and Debian's slurm-wlm + munge.
"""

from __future__ import annotations

import csv
import json
import re
import shutil
import subprocess
import sys

import pytest
import yaml
from conftest_train import python_without_horovod
from required_layers import require_layer
from slurm_support import (
    PARTITION,
    PROJECT_ROOT,
    TRAIN_PYTHON,
    horovod_skip_reason,
    run,
    run_plugin,
    slurm_cluster_two_nodes,  # noqa: F401  (pytest fixture)
)

from hvdscale.matrix.runtable import run_table
from hvdscale.study.plan import array_commands, job_shapes, merged_config, plan

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.horovod]

ROOT = PROJECT_ROOT
SNAKEMAKE = [sys.executable, "-m", "snakemake"]
THESIS_TEST_CONFIG = ".test/slurm-thesis.yaml"
GPUS, CPUS, MEM_MB = 8, 48, 990000  # per emulated alpha node (slurm-cluster.sh defaults)


@pytest.fixture(scope="module")
def alpha_cluster(slurm_cluster_two_nodes):
    """The session's two-node cluster (slurm_support: brought up with the emulated alpha
    partition once for all two-node tests)."""
    require_layer("horovod", horovod_skip_reason())
    return {**slurm_cluster_two_nodes, "PYTHONPATH": str(ROOT / "src")}


@pytest.fixture(scope="module")
def results_dir():
    """One results directory for the module: the runs of both plugin tests share the
    data stage (same data section), so it runs once."""
    name = "results-test-slurm-multinode"
    shutil.rmtree(ROOT / name, ignore_errors=True)
    yield name
    shutil.rmtree(ROOT / name, ignore_errors=True)


def show_job(job_id: str, env: dict) -> str:
    return run(["scontrol", "show", "job", "-d", job_id], env).stdout


def field(text: str, name: str) -> str:
    m = re.search(rf"(?:^|\s){re.escape(name)}=(\S+)", text)
    assert m, f"{name} not in:\n{text}"
    return m.group(1)


def snakemake(args: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    """The plugin run; past ``timeout`` the test fails with the queue, the jobs and
    their newest logs (a hung job is killed by SLURM at its partition's runtime_min and
    retried first: .test/slurm-thesis.yaml keeps that limit short)."""
    results = ROOT / re.search(r"results_dir=(\S+)", " ".join(args)).group(1)
    return run_plugin(
        ["--profile", "profiles/test-slurm", *args],
        env,
        timeout,
        logs=[results / "logs", ROOT / ".snakemake" / "slurm_logs"],
    )


# --------------------------------------------------------------------------- partition


@pytest.mark.multinode
def test_emulated_partition_accepts_thesis_requests_and_binds_one_gpu_per_rank(
    alpha_cluster, tmp_path
):
    env = alpha_cluster
    nodes = run(["sinfo", "-h", "-N", "-p", "alpha", "-o", "%N %c %m %G %T"], env).stdout
    assert nodes.split("\n")[:2] == [
        f"node1 {CPUS} {MEM_MB} gpu:a100:{GPUS} idle",
        f"node2 {CPUS} {MEM_MB} gpu:a100:{GPUS} idle",
    ], nodes
    script = tmp_path / "shape.sh"
    script.write_text(
        "#!/bin/bash\n"
        "srun -l --gpus-per-task=1 bash -c "
        "'echo host=$(hostname) local=$SLURM_LOCALID cvd=$CUDA_VISIBLE_DEVICES'\n"
    )
    out = tmp_path / "shape.out"
    # the thesis's 16-worker shape on alpha: 2 exclusive nodes, 8 tasks (GPUs) per node,
    # 48 / 8 = 6 CPUs per task, all 8 GPUs and the whole memory of each node
    sub = run(
        [
            "sbatch",
            "--wait",
            "--parsable",
            "-p",
            "alpha",
            "-N",
            "2",
            "-n",
            "16",
            "--ntasks-per-node=8",
            f"--cpus-per-task={CPUS // GPUS}",
            f"--gres=gpu:{GPUS}",
            "--exclusive",
            f"--mem={MEM_MB}",
            "-o",
            str(out),
            str(script),
        ],
        env,
        timeout=300,
    )
    job = sub.stdout.strip().split(";")[0]
    text = out.read_text()
    ranks = {
        int(m[0]): (m[1], int(m[2]), m[3])
        for m in re.findall(r"^\s*(\d+): host=(\S+) local=(\d+) cvd=(\S*)$", text, re.M)
    }
    assert sorted(ranks) == list(range(16)), text
    for r, (host, local, cvd) in ranks.items():
        assert host == ("node1" if r < 8 else "node2") and local == r % 8, text
        assert cvd == str(local), f"rank {r}: CUDA_VISIBLE_DEVICES={cvd!r}\n{text}"
    shown = show_job(job, env)
    assert field(shown, "JobState") == "COMPLETED"
    assert field(shown, "NumNodes") == "2" and field(shown, "NumTasks") == "16"
    assert field(shown, "CPUs/Task") == str(CPUS // GPUS)
    assert field(shown, "OverSubscribe") == "NO"  # --exclusive
    assert field(shown, "MinMemoryNode") == f"{MEM_MB}M"
    assert field(shown, "TresPerNode") == f"gres:gpu:{GPUS}"
    assert field(shown, "JOB_GRES") == f"gpu:a100:{2 * GPUS}"  # 8 A100s on each of 2 nodes


# --------------------------------------------------------------------------- thesis shapes

RUNS = {  # run_id -> (nodes, tasks per node, gres GPUs per node)
    "alpha_mpi_n1_w1_b75_lrnone_r0": (1, 1, 1),
    "alpha_mpi_n1_w2_b75_lrnone_r0": (1, 2, 2),
    "alpha_mpi_n1_w4_b75_lrnone_r0": (1, 4, 4),
    "alpha_mpi_n1_w8_b75_lrnone_r0": (1, 8, 8),
    "alpha_mpi_n2_w16_b75_lrnone_r0": (2, 8, 8),
    "alpha_gloo_n2_w16_b75_lrnone_r0": (2, 8, 8),
}


@pytest.mark.multinode
def test_thesis_job_shapes_through_the_plugin(alpha_cluster, results_dir):
    env = alpha_cluster
    for node in ("node1", "node2"):  # no ssh server on the nodes: gloo must do without
        listening = subprocess.run(
            ["ip", "netns", "exec", f"hvd-{node}", "ss", "-Hltn", "sport = :22"],
            capture_output=True,
            text=True,
        )
        assert listening.returncode == 0 and not listening.stdout.strip(), listening
    targets = [f"{results_dir}/runs/{r}/metrics.json" for r in RUNS]
    out = snakemake(
        [
            "--configfile",
            THESIS_TEST_CONFIG,
            "--config",
            f"results_dir={results_dir}",
            "--",
            *targets,
        ],
        env,
        timeout=1500,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    for run_id, (nodes, per_node, gpus) in RUNS.items():
        rec = json.loads((ROOT / results_dir / "runs" / run_id / "metrics.json").read_text())
        workers = int(re.search(r"_w(\d+)_", run_id).group(1))
        envb = rec["environment"]
        assert rec["status"] == "completed" and rec["config"]["workers"] == workers
        assert rec["config"]["launcher"] == "srun"
        assert rec["config"]["controller"] == ("gloo" if "_gloo_" in run_id else "mpi")
        hosts = envb["hostnames"]  # in rank order
        if nodes == 2:  # sequential fill: ranks 0-7 on node1, 8-15 on node2
            assert hosts == ["node1"] * 8 + ["node2"] * 8, hosts
            nodelist = "node[1-2]"
        else:
            assert len(hosts) == workers and len(set(hosts)) == 1, hosts
            nodelist = hosts[0]
        assert all(d.startswith("CPU") for d in envb["devices"])  # emulated GPUs: CPU training
        # the partition declares it (scaling.partitions.alpha.emulated_gpus): the record says so
        assert rec["config"]["emulated_gpus"] is True and rec["config"]["gpus_per_node"] == 8
        # issue 29: gpu_bind per-task (the default): srun --gpus-per-task=1 gave every rank
        # exactly one GPU id of its own, different from the other ranks' on its node
        assert_one_gpu_per_rank(envb["visible_gpus"], hosts, run_id)
        # the label proof read the timeline: the backend's own collective carried the grads
        proof = rec["label_proof"]
        assert proof["ok"], proof
        assert proof["gpu_ids"] == envb["visible_gpus"], proof  # the bound ids, compared
        if workers > 1:
            want = "GLOO_ALLREDUCE" if "_gloo_" in run_id else "MPI_ALLREDUCE"
            assert proof["collective"] == want and proof["timeline_checked"], proof
        # the plugin's job step strips SLURM_JOB_NODELIST; the launcher finds it anyway
        assert envb["slurm_nodelist"] == nodelist, envb
        shown = show_job(envb["slurm_job_id"], env)
        assert field(shown, "Partition") == "alpha" and field(shown, "JobState") == "COMPLETED"
        assert field(shown, "NumNodes") == str(nodes)
        assert field(shown, "NumTasks") == str(workers)
        assert field(shown, "CPUs/Task") == str(CPUS // GPUS)
        assert field(shown, "OverSubscribe") == "NO"
        assert field(shown, "MinMemoryNode") == f"{MEM_MB}M"
        assert field(shown, "TresPerNode") == f"gres:gpu:{gpus}"
        # requested gpu:N per node; --exclusive allocates all 8 GPUs of every node
        assert field(shown, "JOB_GRES") == f"gpu:a100:{GPUS * nodes}"
        assert re.search(rf"NtasksPerN:B:S:C={per_node}:", shown), shown
        assert run_id in field(shown, "Comment")
        log = (ROOT / results_dir / "logs" / "train_run" / f"{run_id}.log").read_text()
        if workers == 1:  # issue 29: no srun; the rank has the GPU of the plugin's step
            job_step = f"{envb['slurm_job_id']}.0"
            assert f"runs as a child of this launcher in SLURM job step {job_step}" in log
            assert "the step's GPUs: CUDA_VISIBLE_DEVICES='0'" in log, log[-3000:]
            assert "srun --mpi" not in log and "--overlap" not in log
            continue
        assert "--gpus-per-task=1" in log and "GPU binding (gpu_bind per-task)" in log
        if "_gloo_" in run_id:
            assert "srun --mpi=none" in log and "Gloo rendezvous at" in log
            assert "horovodrun" not in log
        else:
            assert "srun --mpi=pmix" in log


def assert_one_gpu_per_rank(visible: list, hosts: list[str], run_id: str) -> None:
    """Every rank's CUDA_VISIBLE_DEVICES (the run record's environment.visible_gpus, rank
    order) names exactly one GPU id, and no two ranks of one node have the same one."""
    assert len(visible) == len(hosts), (run_id, visible)
    per_host: dict[str, list[str]] = {}
    for rank, (host, ids) in enumerate(zip(hosts, visible)):
        assert ids is not None and re.fullmatch(r"\d+", ids), (run_id, rank, ids)
        per_host.setdefault(host, []).append(ids)
    for host, ids in per_host.items():
        assert len(set(ids)) == len(ids), (run_id, host, ids)


# --------------------------------------------------------------------------- time limit


@pytest.mark.multinode
def test_time_limit_warns_checkpoints_and_the_retry_resumes_with_a_longer_limit(
    alpha_cluster, results_dir, tmp_path
):
    """2-minute limit, SIGUSR1 80 s before it (from hvdscale launch, and from slurmctld
    at its next 30-second check): the 2-rank run stops after an epoch with exit status
    4; Snakemake's retry (10-minute limit) resumes from the checkpoint. Horovod's cycle
    time makes every step wait >= 10 ms (140 steps per epoch), so the 30 epochs last
    past the warning on any machine, and the first epoch ends before the limit on a
    loaded one."""
    env = alpha_cluster
    run_id = "alpha_mpi_n1_w2_b8_lrnone_r0"
    epochs = 30
    override = tmp_path / "timelimit.yaml"
    override.write_text(
        yaml.safe_dump(
            {
                "training": {
                    "max_epochs": epochs,
                    "time_limit_margin_s": 80,
                    "timeline": False,
                    "horovod": {"cycle_time_ms": 10},
                },
                "scaling": {
                    "partitions": {"alpha": {"runtime_min": 2, "runtime_min_retry": 10}},
                    "sweeps": [
                        {
                            "name": "timelimit",
                            "partitions": ["alpha"],
                            "workers": [2],
                            "backends": ["mpi"],
                            "batch_sizes": [8],
                            "lr_rules": ["none"],
                        }
                    ],
                },
            }
        )
    )
    out = snakemake(
        [
            "--configfile",
            THESIS_TEST_CONFIG,
            str(override),
            "--config",
            f"results_dir={results_dir}",
            "--",
            f"{results_dir}/runs/{run_id}/metrics.json",
        ],
        env,
        timeout=900,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    rec = json.loads((ROOT / results_dir / "runs" / run_id / "metrics.json").read_text())
    assert rec["status"] == "completed" and len(rec["epochs"]) == epochs
    attempts = rec["resume"]["attempts"]
    assert rec["resume"]["resumed"] is True and len(attempts) == 2, attempts
    first, second = attempts[0]["slurm_job_id"], attempts[1]["slurm_job_id"]
    assert first != second and 1 <= attempts[1]["start_epoch"] < epochs
    # the first job asked for the warning, got it, checkpointed and stopped with exit 4
    assert attempts[0]["ended"] == "time_limit" and attempts[0]["exit_status"] == 4, attempts
    assert attempts[0]["epochs_done"] == attempts[1]["start_epoch"]
    shown = show_job(first, env)
    assert field(shown, "TimeLimit") == "00:02:00" and field(shown, "JobState") == "FAILED"
    assert "--signal=USR1@80" in out.stdout + out.stderr
    # the retry got the partition's runtime_min_retry and finished the run
    shown = show_job(second, env)
    assert field(shown, "TimeLimit") == "00:10:00" and field(shown, "JobState") == "COMPLETED"


# --------------------------------------------------------------------------- job arrays

ARRAY_RUNS = 6  # repeats of one job shape: 1 worker on the CPU partition "local"
ARRAY_OVERRIDE = {
    "training": {"repeats": ARRAY_RUNS, "timeline": False},
    "scaling": {
        "partitions": {
            "local": {
                "gpus_per_node": 0,
                "cores_per_node": 2,
                "mem_mb_per_node": 4000,
                "workers_per_node": 1,
                "runtime_min": 30,
            }
        },
        "sweeps": [
            {
                "name": "arrays",
                "partitions": ["local"],
                "workers": [1],
                "backends": ["mpi"],
                "batch_sizes": [75],
                "lr_rules": ["none"],
            }
        ],
    },
}


@pytest.mark.multinode
def test_the_runs_of_one_shape_are_one_job_array(alpha_cluster, results_dir, tmp_path):
    """Issue 20, item 4: `--slurm-array-jobs=train_run` (the command `hvdscale plan
    --arrays` prints per job shape) submits the runs of one shape with ONE sbatch call:
    the plugin's log says so, and SLURM shows every run's job as a task of that array."""
    env = alpha_cluster
    override = tmp_path / "arrays.yaml"
    override.write_text(yaml.safe_dump(ARRAY_OVERRIDE))
    cfg = merged_config([ROOT / THESIS_TEST_CONFIG, override])
    (shape,) = job_shapes(cfg)
    assert len(shape["runs"]) == ARRAY_RUNS
    (command,) = array_commands(cfg, [THESIS_TEST_CONFIG, "arrays.yaml"], "test-slurm")
    assert f"--slurm-array-jobs=train_run --jobs {ARRAY_RUNS}" in command, command
    args = ["--configfile", THESIS_TEST_CONFIG, str(override), "--config"]
    args.append(f"results_dir={results_dir}")
    # the data, the run configs and the partition's preflight first: the plugin sends jobs
    # that become ready one by one (here: after the local write_run_config jobs) as single
    # jobs, as a study's runs all become ready at once when the data stage ends
    prep = [f"{results_dir}/runs/{r}/config.json" for r in shape["runs"]]
    prep.append(f"{results_dir}/preflight/local.json")  # the partition's preflight: one job
    out = snakemake([*args, "--", f"{results_dir}/data/manifest.json", *prep], env, 600)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    targets = [f"{results_dir}/runs/{r}/metrics.json" for r in shape["runs"]]
    out = snakemake(
        [
            "--configfile",
            THESIS_TEST_CONFIG,
            str(override),
            "--slurm-array-jobs=train_run",
            "--jobs",
            str(ARRAY_RUNS),
            "--config",
            f"results_dir={results_dir}",
            "--",
            *targets,
        ],
        env,
        timeout=900,
    )
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-4000:]
    arrays = re.findall(
        r"Submitted array job with Snakemake IDs ([\d,]+) and SLURM job ID (\d+)", log
    )
    single = re.findall(r"Job \d+ has been submitted with SLURM jobid (\d+)", log)
    assert len(arrays) == 1 and len(arrays[0][0].split(",")) == ARRAY_RUNS, arrays
    array_id = arrays[0][1]
    tasks = set()
    for run_id in shape["runs"]:
        rec = json.loads((ROOT / results_dir / "runs" / run_id / "metrics.json").read_text())
        assert rec["status"] == "completed", run_id
        job = rec["environment"]["slurm_job_id"]
        assert job not in single  # no train_run job was submitted on its own
        shown = show_job(job, env)
        assert field(shown, "ArrayJobId") == array_id and field(shown, "JobState") == "COMPLETED"
        tasks.add(int(field(shown, "ArrayTaskId")))
    assert tasks == set(range(1, ARRAY_RUNS + 1)), tasks
    assert not single, single  # this invocation made 1 sbatch call for the runs


# --------------------------------------------------------------------------- torch-ddp


@pytest.mark.multinode
def test_a_torch_run_across_both_nodes_through_the_plugin(alpha_cluster, results_dir, tmp_path):
    """Issue 19: 16 torch-ddp ranks (gloo) fill node1 and then node2, one srun task per
    rank started by `hvdscale launch` inside the plugin's job, joined by torch.distributed's
    own rendezvous on the job's first host (no ssh, no server beside the launcher)."""
    env = alpha_cluster
    run_id = "alpha_torch-ddp_gloo_n2_w16_b75_lrnone_r0"
    override = tmp_path / "torch.yaml"
    sweep = {"name": "torch", "frameworks": ["torch-ddp"], "partitions": ["alpha"]}
    sweep.update(workers=[16], backends=["gloo"], batch_sizes=[75], lr_rules=["none"])
    override.write_text(yaml.safe_dump({"scaling": {"sweeps": [sweep]}}))
    target = f"{results_dir}/runs/{run_id}/metrics.json"
    args = ["--configfile", THESIS_TEST_CONFIG, str(override)]
    out = snakemake([*args, "--config", f"results_dir={results_dir}", "--", target], env, 1200)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    rec = json.loads((ROOT / target).read_text())
    envb, cfg = rec["environment"], rec["config"]
    assert rec["status"] == "completed" and cfg["framework"] == "torch-ddp"
    assert cfg["launcher"] == "srun" and cfg["controller"] == "gloo" and cfg["nodes"] == 2
    assert envb["hostnames"] == ["node1"] * 8 + ["node2"] * 8, envb["hostnames"]
    assert envb["slurm_nodelist"] == "node[1-2]"
    proof = rec["label_proof"]
    assert proof["ok"], proof
    assert proof["process_group_backend"] == "gloo" and proof["process_group_world_size"] == 16
    # issue 29: one GPU per task (srun --gpus-per-task=1), one id per rank, distinct per node
    assert_one_gpu_per_rank(envb["visible_gpus"], envb["hostnames"], run_id)
    assert proof["gpu_ids"] == envb["visible_gpus"], proof
    shown = show_job(envb["slurm_job_id"], env)
    assert field(shown, "NumNodes") == "2" and field(shown, "NumTasks") == "16"
    assert field(shown, "JobState") == "COMPLETED"
    log = (ROOT / results_dir / "logs" / "train_run" / f"{run_id}.log").read_text()
    assert "srun --mpi=none" in log and "exec --framework torch-ddp" in log
    assert "MASTER_ADDR=node1" in log and "horovodrun" not in log


# --------------------------------------------------------------------------- smoke study


def emulated_thesis() -> dict:
    """config/thesis.yaml on the emulated cluster, as .test/slurm-thesis.yaml maps it: its
    swept partitions onto the cluster's two (alpha as it is; hpdlf onto the default
    partition, with the emulated nodes' 8 A100 and 48 cores: the preflight checks the GPUs
    a node declares), emulated GPUs, nccl replaced by mpi (the ranks train on the
    CPU), one thread per rank (2 cores in all); everything else as in the thesis."""
    raw = yaml.safe_load((ROOT / "config" / "thesis.yaml").read_text())
    names = {"alpha": "alpha", "hpdlf": PARTITION}
    parts = raw["scaling"]["partitions"]
    raw["scaling"]["partitions"] = {
        names[p]: {**parts[p], "gpus_per_node": GPUS, "cores_per_node": CPUS}
        | {"gpu_model": "A100", "emulated_gpus": True}
        for p in names
    }
    for sweep in raw["scaling"]["sweeps"]:
        sweep["partitions"] = [names[p] for p in sweep["partitions"]]
        sweep["backends"] = list(dict.fromkeys(b.replace("nccl", "mpi") for b in sweep["backends"]))
    raw["training"].update(threads_per_worker=1, cpu_binding="none")
    raw["training"]["horovod"]["cycle_time_ms"] = 5
    return raw


@pytest.mark.multinode
def test_smoke_study_of_the_thesis_partitions_reaches_a_report(alpha_cluster, tmp_path):
    """`make smoke`'s study (config/smoke.yaml after the config) of config/thesis.yaml,
    mapped onto the emulated cluster, through the SLURM plugin: both partitions' preflight,
    1 and 2 workers with each backend, one calibration run, the allreduce sweeps and the
    report, in <results_dir>/smoke, within the plan's budget of under one node-hour per
    partition and with the smoke's short time limits."""
    env = alpha_cluster
    config = tmp_path / "thesis-emulated.yaml"
    config.write_text(yaml.safe_dump(emulated_thesis()))
    name = "results-test-smoke"
    shutil.rmtree(ROOT / name, ignore_errors=True)
    files = [str(config), "config/smoke.yaml"]
    cfg = merged_config(files, overrides=[f"results_dir={name}"])
    results = ROOT / cfg["results_dir"]
    assert cfg["results_dir"] == f"{name}/smoke"
    rows = {r["partition"]: r for r in plan(cfg, results)["partitions"]}
    assert set(rows) == {"alpha", PARTITION}
    assert all(r["node_hours_worst_all"] < 1 for r in rows.values()), rows
    runs = {r.run_id: r for r in run_table(cfg)}
    assert {(r.partition, r.backend, r.workers) for r in runs.values() if not r.kind} == {
        (p, b, w) for p in ("alpha", PARTITION) for b in ("mpi", "gloo") for w in (1, 2)
    }
    try:
        out = run_plugin(
            ["--profile", "profiles/test-slurm", "--configfile", *files, "--config"]
            + [f"results_dir={name}"],
            env,
            2400,
            logs=[results / "logs", ROOT / ".snakemake" / "slurm_logs"],
        )
        assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-6000:]
        assert (results / "report.pdf").stat().st_size > 0
        assert not (ROOT / name / "runs").exists()  # nothing beside the smoke folder
        for part in ("alpha", PARTITION):
            pre = json.loads((results / "preflight" / f"{part}.json").read_text())
            assert pre["ok"], pre
        for run_id, run in runs.items():
            rec = json.loads((results / "runs" / run_id / "metrics.json").read_text())
            assert rec["status"] == "completed", run_id
            shown = show_job(rec["environment"]["slurm_job_id"], env)
            assert field(shown, "Partition") == run.partition
            assert field(shown, "TimeLimit") == "00:05:00"  # the smoke's short limit
        # the aggregation saw every run, none missing or failed
        with open(results / "scaling" / "runs.csv") as fh:
            assert {row["run_id"] for row in csv.DictReader(fh)} >= set(runs)
    finally:
        shutil.rmtree(ROOT / name, ignore_errors=True)


# --------------------------------------------------------------------------- preflight

#: the preflight cases' run: not among the runs trained above in the module's results
#: directory (batch 50), so each case wants to train it and meets the preflight first
PREFLIGHT_RUN = "alpha_mpi_n1_w1_b50_lrnone_r0"


def preflight_study(tmp_path, name: str, alpha: dict = (), environment: dict = ()) -> str:
    """An override of .test/slurm-thesis.yaml: one 1-worker run on alpha (a 1-node
    preflight of 2 ranks), with ``alpha`` and ``environment`` changed."""
    sweep = {"name": "preflight", "partitions": ["alpha"], "workers": [1], "backends": ["mpi"]}
    sweep.update(batch_sizes=[50], lr_rules=["none"])
    study = {"scaling": {"sweeps": [sweep], "partitions": {"alpha": dict(alpha)}}}
    if environment:
        study["environment"] = dict(environment)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(study))
    return str(path)


def assert_stopped_before_any_train_run(out, env: dict, results, check: str) -> str:
    """The partition's preflight failed at ``check`` and no train_run job reached SLURM:
    every job this Snakemake submitted is the preflight (their SLURM comments name the
    rule), and the run left no log, benchmark or record. The preflight's log (its
    message) is returned."""
    text = out.stdout + out.stderr
    assert out.returncode != 0, text[-4000:]
    log = (results / "logs" / "preflight_partition" / "alpha.log").read_text()
    assert f"ERROR: preflight of partition alpha failed at check '{check}'" in log, log[-3000:]
    assert "No training run of alpha starts until this passes" in log
    assert not (results / "preflight" / "alpha.json").exists()  # removed: it runs again
    submitted = re.findall(r"Job \d+ has been submitted with SLURM jobid (\d+)", text)
    rules = [field(show_job(job, env), "Comment") for job in submitted]
    assert any("preflight_partition" in c for c in rules), (rules, text[-3000:])
    assert not any("train_run" in c for c in rules), rules
    assert "rule train_run:" not in text  # Snakemake started no train_run job
    assert not (results / "logs" / "train_run" / f"{PREFLIGHT_RUN}.log").exists()
    assert not (results / "benchmarks" / "train_run" / f"{PREFLIGHT_RUN}.tsv").exists()
    assert not (results / "runs" / PREFLIGHT_RUN / "metrics.json").exists()
    return log


@pytest.mark.multinode
def test_a_failed_preflight_stops_its_partition_before_any_train_run(
    alpha_cluster, results_dir, tmp_path
):
    """The preflight of the emulated alpha partition through the SLURM plugin: healthy,
    it passes and sees the nodes' typed gres (gpu:a100:8); a wrong gpu_model, a train env
    without Horovod and an unreadable shard each stop the partition with one message
    naming the check and its fix, and no train_run job is submitted. In the module's
    results directory, so its data stage is made once (this test comes last in it: it
    spoils a shard). (The shard is emptied: the tests run as root, who reads every file,
    and both nodes share this machine's file system.)"""
    env = alpha_cluster
    results = ROOT / results_dir
    target = f"{results_dir}/runs/{PREFLIGHT_RUN}/metrics.json"

    def snakemake_run(*configs: str, targets: list[str]):
        args = ["--configfile", THESIS_TEST_CONFIG, *configs]
        return snakemake(
            [*args, "--config", f"results_dir={results_dir}", "--", *targets], env, 900
        )

    # healthy: the thesis shapes' preflight passed (the runs above waited for it; made now
    # if this test runs alone, the data stage first)
    out = snakemake_run(targets=[f"{results_dir}/preflight/alpha.json"])
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    rec = json.loads((results / "preflight" / "alpha.json").read_text())
    assert rec["ok"] and rec["emulated_gpus"] and rec["launcher"] == "srun", rec
    checks = {c["name"]: c for c in rec["checks"]}
    assert list(checks)[:4] == ["modules", "data", "train-env", "gpus"], list(checks)
    assert set(list(checks)[4:]) == {"allreduce horovod-tf mpi", "allreduce horovod-tf gloo"}
    assert re.search(rf"node[12] declares gpu:a100:{GPUS}", checks["gpus"]["detail"]), checks
    assert "emulated GPUs (CPU)" in checks["gpus"]["detail"]
    # the nodes declare A100s: a partition that says H100 stops (the preflight is
    # repeated: gpu_model is among what it checks)
    h100 = preflight_study(tmp_path, "h100", alpha={"gpu_model": "H100"})
    out = snakemake_run(h100, targets=[target])
    log = assert_stopped_before_any_train_run(out, env, results, "gpus")
    assert "declares GPUs of type a100" in log and "gpu_model says H100" in log
    assert "set scaling.partitions.alpha.gpu_model to the nodes' GPU (A100)" in log
    # a train env without Horovod: a venv whose python cannot import horovod
    venv = results / "no-horovod"
    python_without_horovod(venv, TRAIN_PYTHON)
    venv_key = {"venv": str(venv.relative_to(ROOT))}
    no_horovod = preflight_study(tmp_path, "no-horovod", environment=venv_key)
    out = snakemake_run(no_horovod, targets=[target])
    log = assert_stopped_before_any_train_run(out, env, results, "train-env")
    assert "cannot import horovod.tensorflow" in log and "make setup" in log
    # a shard the node cannot read
    manifest = json.loads((results / "data" / "manifest.json").read_text())
    shard = results / "data" / manifest["shards"]["train"][0]["file"]
    shard.write_bytes(b"")
    out = snakemake_run(preflight_study(tmp_path, "healthy"), targets=[target])
    log = assert_stopped_before_any_train_run(out, env, results, "data")
    assert f"shard {shard.relative_to(ROOT)} read from node" in log
    assert "readable from the partition's compute nodes" in log
