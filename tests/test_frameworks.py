"""The framework axis (issue 19): sweeps, tuning and calibration name frameworks
(horovod-tf, the default, and torch-ddp); run ids name a framework only when it is not
the default, so Horovod studies keep their ids, config slices and seeds; the config
refuses a backend a framework lacks and nccl on CPU partitions; the launch spec starts
torch-ddp runs with torchrun, or one srun task per rank with torch's own rendezvous."""

from __future__ import annotations

import ast
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hvdscale.cli import main
from hvdscale.config.load import ConfigError, validate_config
from hvdscale.launch.launchspec import TRAIN_PROGRAM, build_launch
from hvdscale.matrix import backends
from hvdscale.matrix.allreduce_sweeps import allreduce_jobs
from hvdscale.matrix.runid import parse_run_id
from hvdscale.matrix.runkinds import rerun_runs, target_config
from hvdscale.matrix.runtable import find_run, run_config, run_table
from hvdscale.slurm.jobspec import JobSpec
from hvdscale.trainer.rank import check_framework, framework_for_run, load_framework

SWEEP = {"partitions": ["local"], "workers": [1, 2], "batch_sizes": [75], "lr_rules": ["none"]}
GPU = {
    "gpus_per_node": 4,
    "cores_per_node": 8,
    "mem_mb_per_node": 8000,
    "runtime_min": 30,
    "workers_per_node": 4,
}


def both(**extra) -> dict:
    sweep = {"name": "both", "frameworks": ["horovod-tf", "torch-ddp"], "backends": ["gloo"]}
    return validate_config({"scaling": {"sweeps": [{**SWEEP, **sweep}]}, **extra})


def test_run_ids_name_only_a_framework_other_than_the_default():
    ids = [r.run_id for r in run_table(both()) if not r.kind]
    assert ids == [
        "local_gloo_n1_w1_b75_lrnone_r0",
        "local_gloo_n1_w2_b75_lrnone_r0",
        "local_torch-ddp_gloo_n1_w1_b75_lrnone_r0",
        "local_torch-ddp_gloo_n1_w2_b75_lrnone_r0",
    ]
    for rid in ids:
        d = parse_run_id(rid)
        run = find_run(both(), rid)
        assert run.run_id == rid and d["framework"] == run.framework
        assert (d["partition"], d["backend"], d["workers"]) == ("local", "gloo", run.workers)
    # a partition name with a dash and a tuning candidate of torch-ddp parse too
    d = parse_run_id("gpu-a_torch-ddp_nccl_n2_w8_b75_lrlinear_m0p5_wu1_rerun_r3")
    assert (d["partition"], d["framework"], d["backend"]) == ("gpu-a", "torch-ddp", "nccl")
    assert (d["lr_mult"], d["tune_warmup"], d["kind"], d["repeat"]) == (0.5, 1, "rerun", 3)


def test_a_run_id_with_a_backend_its_framework_lacks_is_refused():
    with pytest.raises(ConfigError, match="framework torch-ddp has no backend 'mpi'"):
        parse_run_id("local_torch-ddp_mpi_n1_w2_b75_lrnone_r0")
    with pytest.raises(ConfigError, match="expected"):
        parse_run_id("local_torch-tf_gloo_n1_w2_b75_lrnone_r0")


def test_both_frameworks_share_the_seeds_of_a_repeat():
    runs = {(r.framework, r.workers): r.seed for r in run_table(both()) if not r.kind}
    assert len(set(runs.values())) == 1  # paired: same repeat, same seed, any framework


def test_the_default_keeps_horovod_studies_as_they_were():
    cfg = validate_config({})
    assert [s["frameworks"] for s in cfg["scaling"]["sweeps"]] == [["horovod-tf"]]
    assert all(r.framework == "horovod-tf" for r in run_table(cfg))
    assert all("torch-ddp" not in r.run_id for r in run_table(cfg))
    # the config slices of a Horovod run and of the target name no framework (their
    # config files, and so the trained runs, stay untouched)
    for r in run_table(cfg):
        sl = run_config(cfg, r.run_id)
        assert "frameworks" not in sl["scaling"]["sweeps"][0]
        assert "framework" not in (sl["training"].get("target") or {}).get("calibration", {})
    tgt = target_config(cfg)
    assert "framework" not in tgt["training"]["target"]["calibration"]
    assert "frameworks" not in tgt["scaling"]["sweeps"][0]


def test_a_torch_run_config_slice_is_a_valid_config_of_that_run():
    cfg = both()
    rid = "local_torch-ddp_gloo_n1_w2_b75_lrnone_r0"
    sl = validate_config(run_config(cfg, rid))
    assert sl["scaling"]["sweeps"][0]["frameworks"] == ["torch-ddp"]
    assert find_run(sl, rid).framework == "torch-ddp"


def test_torch_ddp_with_mpi_is_refused_naming_sweep_framework_and_backend():
    bad = {"name": "mixed", "frameworks": ["torch-ddp"], "backends": ["gloo", "mpi"]}
    with pytest.raises(ConfigError) as err:
        validate_config({"scaling": {"sweeps": [{**SWEEP, **bad}]}})
    assert (
        "config key scaling.sweeps.0.backends (sweep 'mixed'): framework 'torch-ddp' has no "
        "backend 'mpi'; torch-ddp runs with 'nccl' or 'gloo'"
    ) in str(err.value)


def test_nccl_is_refused_on_a_cpu_partition_and_allowed_on_a_gpu_one():
    sweep = {**SWEEP, "frameworks": ["torch-ddp"], "backends": ["nccl"]}
    with pytest.raises(ConfigError, match="'nccl' needs GPUs but partition 'local'.*use 'gloo'"):
        validate_config({"scaling": {"sweeps": [sweep]}})
    cfg = validate_config(
        {"scaling": {"partitions": {"gpu": GPU}, "sweeps": [{**sweep, "partitions": ["gpu"]}]}}
    )
    assert "gpu_torch-ddp_nccl_n1_w2_b75_lrnone_r0" in [r.run_id for r in run_table(cfg)]
    # the calibration runs follow the first sweep: torch-ddp nccl on the GPU partition
    cal = cfg["training"]["target"]["calibration"]
    assert (cal["framework"], cal["backend"]) == ("torch-ddp", "nccl")


def test_tuning_candidates_and_their_reruns_carry_the_framework():
    tune = {
        "frameworks": ["horovod-tf", "torch-ddp"],
        "partitions": ["local"],
        "workers": [2],
        "backends": ["gloo"],
        "batch_sizes": [75],
        "lr_multipliers": [0.5],
        "rerun_repeats": 2,
    }
    cfg = both(training={"target": {"mode": "absolute", "value": 0.05}})
    cfg = validate_config({**cfg, "scaling": {**cfg["scaling"], "tune": tune}})
    cands = [r.run_id for r in run_table(cfg) if r.candidate]
    assert cands == [
        "local_gloo_n1_w2_b75_lrlinear_m0p5_wu1_r0",
        "local_torch-ddp_gloo_n1_w2_b75_lrlinear_m0p5_wu1_r0",
    ]
    reruns = [r.run_id for r in rerun_runs(cfg, [cands[1]])]
    assert reruns == [
        "local_torch-ddp_gloo_n1_w2_b75_lrlinear_m0p5_wu1_rerun_r0",
        "local_torch-ddp_gloo_n1_w2_b75_lrlinear_m0p5_wu1_rerun_r1",
    ]
    row = {"partition": "local", "backend": "gloo", "workers": 2, "batch": 75}
    row.update(lr_rule="linear", candidate="m0p5_wu1")  # a tuned.csv row without framework
    assert [r.framework for r in rerun_runs(cfg, [row])] == ["horovod-tf"] * 2
    assert find_run(cfg, reruns[1]).framework == "torch-ddp"
    with pytest.raises(ConfigError, match="framework 'torch-ddp' has no backend 'mpi'"):
        validate_config(
            {**cfg, "scaling": {**cfg["scaling"], "tune": {**tune, "backends": ["mpi"]}}}
        )


def test_the_allreduce_sweeps_measure_horovod_runs_only():
    assert [j["id"] for j in allreduce_jobs(both())] == ["local_gloo_n1_w2"]


def test_the_job_of_a_torch_run_has_its_framework_and_the_same_slurm_resources():
    cfg = both()
    horovod = JobSpec.for_run(cfg, find_run(cfg, "local_gloo_n1_w2_b75_lrnone_r0"))
    torch = JobSpec.for_run(cfg, find_run(cfg, "local_torch-ddp_gloo_n1_w2_b75_lrnone_r0"))
    assert (horovod.framework, torch.framework) == ("horovod-tf", "torch-ddp")
    assert torch.slurm_resources() == horovod.slurm_resources()


def test_the_registry_has_the_torch_backends_with_their_facts():
    assert backends.frameworks() == ["horovod-tf", "torch-ddp"] == list(backends.FRAMEWORKS)
    assert backends.names("torch-ddp") == ["nccl", "gloo"]
    assert backends.names() == ["nccl", "mpi", "gloo"]  # the default framework's
    gloo, nccl = backends.get("gloo", "torch-ddp"), backends.get("nccl", "torch-ddp")
    assert (gloo.process_group, gloo.needs_gpu, gloo.timeline_op) == ("gloo", False, "")
    assert (nccl.process_group, nccl.needs_gpu) == ("nccl", True)
    assert gloo.cpu_operations is gloo.gpu_operations is None  # no Horovod variables
    assert list(gloo.controllers) == ["torchrun", "srun"]
    with pytest.raises(backends.UserError, match="backend 'mpi' of framework torch-ddp"):
        backends.get("mpi", "torch-ddp")
    with pytest.raises(backends.UserError, match="framework 'jax'"):
        backends.get("gloo", "jax")


SRC = Path(__file__).resolve().parents[1] / "src" / "hvdscale"


def _hvdscale_imports(path: Path) -> set[str]:
    """The hvdscale modules a file imports (anywhere in it)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("hvdscale"):
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("hvdscale"))
    return out


def test_each_framework_is_one_folder_with_its_trainer_named_by_the_registry():
    """docs/extending.md, "A framework": matrix.backends.TRAINERS names each framework's
    object (trainer/<folder>/framework.py: FRAMEWORK), which trainer.rank.train_rank runs;
    no framework folder imports another's."""
    assert list(backends.TRAINERS) == list(backends.FRAMEWORKS) == backends.frameworks()
    folders = {}
    for name, target in backends.TRAINERS.items():
        module, attr = target.split(":")
        *pkg, last = module.split(".")
        assert pkg[:2] == ["hvdscale", "trainer"] and len(pkg) == 3, target
        assert (last, attr) == ("framework", "FRAMEWORK"), target
        folders[name] = ".".join(pkg)
        assert (SRC / "trainer" / pkg[2] / "framework.py").is_file(), target
    for name, folder in folders.items():
        others = [f for n, f in folders.items() if n != name]
        for path in (SRC / "trainer" / folder.split(".")[-1]).glob("*.py"):
            imported = _hvdscale_imports(path)
            bad = [m for m in imported for o in others if m == o or m.startswith(o + ".")]
            assert not bad, f"{path.relative_to(SRC)} imports {bad}"
    # the Horovod object loads in the workflow env (TensorFlow only when it trains)
    hvd = load_framework("horovod-tf")
    assert hvd.name == "horovod-tf" and framework_for_run("local_gloo_n1_w2_b75_lrnone_r0") is hvd
    with pytest.raises(backends.UserError, match="framework 'jax'"):
        load_framework("jax")


def test_a_trainer_refuses_a_run_of_another_framework():
    cfg = both()
    torch_run = find_run(cfg, "local_torch-ddp_gloo_n1_w2_b75_lrnone_r0")
    with pytest.raises(backends.UserError, match="run of framework torch-ddp, not horovod-tf"):
        check_framework(torch_run, load_framework("horovod-tf"))
    check_framework(find_run(cfg, "local_gloo_n1_w2_b75_lrnone_r0"), load_framework("horovod-tf"))


# --------------------------------------------------------------------------- launch spec


def torch_job(workers=2, nodes=1, per_node=2) -> JobSpec:
    return JobSpec("local", "gloo", nodes, workers, per_node, framework="torch-ddp")


PROG = ["/venv/bin/python", *TRAIN_PROGRAM, "--run-id", "x"]


@pytest.mark.parametrize("launcher", ["horovodrun", "mpirun", "torchrun"])
def test_a_torch_run_starts_with_torchrun_on_one_machine(launcher):
    spec = build_launch(launcher=launcher, job=torch_job(), program_argv=PROG, training={})
    assert spec.argv == [
        "/venv/bin/python", "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
        "--nproc-per-node=2", "--max-restarts=0", "-m", "hvdscale.cli", "train",
        "--run-id", "x",
    ]  # fmt: skip
    assert spec.launcher == "torchrun" and spec.controller == "gloo"
    assert not [k for k in spec.env if k.startswith("HOROVOD_")]
    assert spec.env["OMP_NUM_THREADS"] == "1"
    assert bool(spec.notes) == (launcher != "torchrun")
    with pytest.raises(backends.UserError, match="--launcher srun"):
        build_launch(launcher=launcher, job=torch_job(4, 2), program_argv=PROG, training={})


def test_a_torch_run_under_srun_is_one_task_per_rank_with_torch_rendezvous(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "123456")
    job = torch_job(4, 2, 2)
    spec = build_launch(
        launcher="srun", job=job, program_argv=PROG, training={}, hosts=["n1", "n2"]
    )
    assert spec.argv[: len(job.srun_args(mpi="none"))] == job.srun_args(mpi="none")
    assert "--mpi=none" in spec.argv and "--distribution=block" in spec.argv
    tail = ["-m", "hvdscale.slurm.rendezvous", "exec", "--framework", "torch-ddp", "--", *PROG]
    assert spec.argv[-len(tail) :] == tail
    assert (spec.env["MASTER_ADDR"], spec.env["MASTER_PORT"]) == ("n1", str(20000 + 3456))
    assert spec.launcher == "srun" and not [k for k in spec.env if k.startswith("HOROVOD_")]


@pytest.mark.parametrize("launcher", ["horovodrun", "mpirun", "torchrun", "srun"])
def test_the_ranks_of_every_framework_execute_hvdscale_train(tmp_path, capsys, launcher):
    """What the ranks execute is one command for every framework (``hvdscale train`` reads
    the framework from the run id): a framework adds no entry to the launcher."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps(both(training={"gloo_yield_when_spinning": False})))
    seen = set()
    for run in run_table(both()):
        if run.kind or run.workers != 2:
            continue
        out = tmp_path / run.run_id
        argv = ["launch", "--config", str(config), "--run-id", run.run_id, "--data-dir", "d",
                "--out-dir", str(out), "--launcher", launcher, "--hosts", "n1"]  # fmt: skip
        assert main([*argv, "--dry-run"]) == 0
        words = shlex.split(capsys.readouterr().out.splitlines()[0])
        at = words.index("hvdscale.cli")
        train = ["-m", "hvdscale.cli", "train", "--config", str(config.resolve())]
        assert words[at - 1 : at + 4] == train
        assert words[words.index("--run-id", at) + 1] == run.run_id
        assert "hvdscale.trainer.torch_ddp" not in words
        seen.add(run.framework)
    assert seen == set(backends.FRAMEWORKS)


def test_exec_gives_each_srun_task_its_torch_rank(tmp_path):
    """``rendezvous exec --framework torch-ddp``, as srun's task 3 of 4 on the second node."""
    env = {
        **os.environ,
        "HVDSCALE_GLOO_HOSTS": "n1,n2",
        "HVDSCALE_GLOO_PER_NODE": "2",
        "HVDSCALE_GLOO_WORKERS": "4",
        "SLURM_PROCID": "3",
        "SLURM_NODEID": "1",
        "SLURM_LOCALID": "1",
        "SLURM_STEP_NUM_TASKS": "4",
    }
    show = "import os; print(*(os.environ[k] for k in ('RANK','WORLD_SIZE','LOCAL_RANK','LOCAL_WORLD_SIZE','GROUP_RANK')))"  # noqa: E501
    cmd = [sys.executable, "-m", "hvdscale.slurm.rendezvous", "exec", "--framework"]
    r = subprocess.run(
        [*cmd, "torch-ddp", "--", sys.executable, "-c", show],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["3", "4", "1", "2", "1"]
    env["SLURM_LOCALID"] = "0"  # srun placed it elsewhere than the plan: refused
    r = subprocess.run(
        [*cmd, "torch-ddp", "--", sys.executable, "-c", show],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2 and "local id 0" in r.stderr


def test_the_failing_rank_s_own_exit_status_replaces_torchrun_s(tmp_path):
    from hvdscale.launch.runner import describe_failure, first_failed_rank, torchrun_status

    pids = tmp_path / ".pids"
    pids.mkdir()
    for r in (0, 1, 2):
        (pids / f"rank-{r}.pid").write_text("1\n")
    (pids / "rank-2.exit").write_text("2\n")
    time.sleep(0.02)
    (pids / "rank-0.exit").write_text("143\n")  # stopped after rank 2 failed
    assert first_failed_rank(tmp_path, 3) == (2, 2)
    assert torchrun_status(1, "", tmp_path, 3) == 2
    msg = describe_failure("", 1, tmp_path, 3)
    assert "no exit marker (killed or crashed) from rank(s) 1" in msg
    assert "rank 0: 143, rank 2: 2" in msg
    # no marker: the signal from torchrun's own summary
    tail = (
        "Root Cause (first observed failure):\n[0]:\n  time      : 2026\n  host      : h\n"
        "  rank      : 1 (local_rank: 1)\n  exitcode  : -9 (pid: 77)\n"
    )
    # torchrun saw rank 1 abort after it wrote its own status: the marker wins
    (pids / "rank-1.exit").write_text("4\n")
    assert torchrun_status(1, tail.replace("-9", "-6"), tmp_path, 3) == 4
    for f in pids.glob("*.exit"):
        f.unlink()
    assert torchrun_status(1, tail, tmp_path, 3) == 137
    assert "rank 1 failed first (exit code -9: signal 9)" in describe_failure(tail, 1, tmp_path, 3)


def test_the_time_limit_warning_goes_to_the_ranks_of_a_torchrun_job(monkeypatch, tmp_path):
    """torchrun would die of SIGUSR1: the launcher signals the ranks (pid files) instead."""
    from hvdscale.slurm import timelimit

    monkeypatch.setenv("SLURM_JOB_ID", "4711")
    monkeypatch.setattr(timelimit, "job_end_time", lambda job: time.time() + 3.0)
    env = timelimit.launch_env({"time_limit_margin_s": 2}, tmp_path / "run", 2)
    pids = tmp_path / "run" / ".pids"
    pids.mkdir(parents=True)
    trap = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGUSR1, lambda *a: (print('USR1', flush=True), sys.exit(0)))\n"
        "time.sleep(60)\n"
    )
    ranks = [
        subprocess.Popen([sys.executable, "-c", trap], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    for k, r in enumerate(ranks):
        (pids / f"rank-{k}.pid").write_text(f"{r.pid}\n")
    torchrun = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.5)  # the ranks' handlers are in place
        timelimit.watch(torchrun, env, to_ranks=True)
        outs = [r.communicate(timeout=30)[0] for r in ranks]
        assert [r.returncode for r in ranks] == [0, 0] and [o.strip() for o in outs] == ["USR1"] * 2
        assert torchrun.poll() is None  # not signalled
    finally:
        torchrun.kill()
        torchrun.wait()
