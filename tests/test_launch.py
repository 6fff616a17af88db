"""`hvdscale launch`: argv and environment for every launcher/backend (unit tests, no
processes), the command line (dry run, errors, no TensorFlow), failure.json, and the
allreduce sweep launched through the same code."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest_train import TRAIN_PY, base_config, needs_train_env, sub_env, write_config

from hvdscale.config.load import validate_config
from hvdscale.errors import UserError
from hvdscale.launch.launchspec import (
    build_launch,
    controller_for,
    cycle_time_ms,
    default_train_python,
    horovod_env,
)
from hvdscale.launch.runner import describe_failure, job_for
from hvdscale.matrix.allreduce_sweeps import allreduce_config
from hvdscale.slurm.jobspec import JobSpec

PROG = ["/venv/bin/python", "-m", "hvdscale.cli", "train", "--run-id", "X"]
T = {
    "threads_per_worker": 1,
    "timeline": False,
    "horovod": {"cycle_time_ms": None, "fusion_threshold_mb": None},
}


def spec(launcher, backend, workers=2, nodes=1, wpn=2, gpus=0, **kw):
    kw.setdefault("is_root_user", False)
    kw.setdefault("cpu_count", 16)
    return build_launch(
        launcher=launcher,
        job=JobSpec("p", backend, nodes, workers, wpn, gpus),
        program_argv=PROG,
        training=kw.pop("training", T),
        **kw,
    )


def test_horovodrun_gloo():
    s = spec("horovodrun", "gloo", horovodrun="/venv/bin/horovodrun")
    assert s.argv[:6] == ["/venv/bin/horovodrun", "-np", "2", "-H", "localhost:2", "--gloo"]
    assert s.argv[6:] == PROG
    assert s.env["HOROVOD_CPU_OPERATIONS"] == "gloo" and s.controller == "gloo"
    assert s.env["HVDSCALE_LAUNCHER"] == "horovodrun" and s.env["OMP_NUM_THREADS"] == "1"
    assert "HOROVOD_GPU_OPERATIONS" not in s.env


def test_horovodrun_mpi_as_root_allows_mpirun_as_root():
    s = spec("horovodrun", "mpi", is_root_user=True)
    assert s.argv[:6] == ["horovodrun", "-np", "2", "-H", "localhost:2", "--mpi"]
    assert s.env["HOROVOD_CPU_OPERATIONS"] == "mpi" and s.controller == "mpi"
    assert s.env["OMPI_ALLOW_RUN_AS_ROOT"] == "1" and s.env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] == "1"
    assert "OMPI_ALLOW_RUN_AS_ROOT" not in spec("horovodrun", "mpi").env


def test_mpirun_mpi():
    s = spec("mpirun", "mpi", workers=4, wpn=4)
    assert s.argv[:7] == ["mpirun", "-np", "4", "--bind-to", "none", "--map-by", "slot"]
    assert s.argv[-len(PROG) :] == PROG
    exported = [s.argv[i + 1] for i, a in enumerate(s.argv) if a == "-x"]
    assert "HOROVOD_CPU_OPERATIONS" in exported and "HVDSCALE_LAUNCHER" in exported
    assert "-H" not in s.argv and "--oversubscribe" not in s.argv
    assert s.env["HOROVOD_CPU_OPERATIONS"] == "mpi" and s.controller == "mpi"


@pytest.mark.parametrize(
    "launcher, backend, framework",
    [
        ("horovodrun", "gloo", "horovod-tf"),
        ("horovodrun", "mpi", "horovod-tf"),
        ("mpirun", "mpi", "horovod-tf"),
        ("srun", "mpi", "horovod-tf"),
        ("srun", "gloo", "horovod-tf"),  # srun + Horovod's rendezvous (slurm.rendezvous)
        ("torchrun", "gloo", "torch-ddp"),
        ("srun", "gloo", "torch-ddp"),  # one srun task per rank (slurm.rendezvous)
    ],
)
def test_every_launcher_passes_the_launch_stamp_to_the_ranks(launcher, backend, framework):
    """Issue 30 item 7: the launcher's start reaches every rank as HVDSCALE_LAUNCH_START,
    in the launcher's environment (horovodrun passes all of it, srun exports it, torchrun's
    workers inherit it) and, for mpirun, as one of its -x variables."""
    from hvdscale.record.startup import LAUNCH_START_ENV, launch_stamp

    job = JobSpec("p", backend, 1, 2, 2, framework=framework)
    kw = dict(launcher=launcher, job=job, program_argv=PROG, training=T, hosts=["localhost"])
    kw.update(is_root_user=False, cpu_count=16)
    s = build_launch(**kw, started_at=1_700_000_000.125)
    assert s.launcher == launcher
    assert s.env[LAUNCH_START_ENV] == "1700000000.125"
    assert launch_stamp(s.env) == 1_700_000_000.125  # what a rank reads back
    if launcher == "mpirun":
        assert LAUNCH_START_ENV in [s.argv[i + 1] for i, a in enumerate(s.argv) if a == "-x"]
    # nothing narrows srun's export of the launcher's environment
    assert not [a for a in s.argv if a.startswith("--export") and a != "--export=ALL"]
    assert LAUNCH_START_ENV not in build_launch(**kw).env  # no stamp given: none invented


def test_mpirun_oversubscribes_when_ranks_exceed_cores():
    assert "--oversubscribe" in spec("mpirun", "mpi", workers=4, wpn=4, cpu_count=2).argv


def test_mpirun_multi_node_hosts():
    s = spec("mpirun", "mpi", workers=8, nodes=2, wpn=4, hosts=["n1", "n2"])
    i = s.argv.index("-H")
    assert s.argv[i + 1] == "n1:4,n2:4"


def test_srun_mpi():
    # every count explicit: the Snakemake SLURM job step strips SLURM_NTASKS & co.
    s = spec("srun", "mpi", workers=2)
    assert s.argv[:8] == [
        "srun",
        "--mpi=pmix",
        "-n",
        "2",
        "-N",
        "1",
        "--ntasks-per-node=2",
        "--cpus-per-task=1",
    ]
    assert "--kill-on-bad-exit=1" in s.argv and "--overlap" not in s.argv
    assert s.argv[-len(PROG) :] == PROG
    s = spec("srun", "mpi", workers=8, nodes=2, wpn=4)
    assert s.argv[4:7] == ["-N", "2", "--ntasks-per-node=4"]


def test_srun_single_worker_starts_its_rank_without_srun():
    # a 1-worker run is a plain plugin job whose job step holds the CPUs, the memory and
    # the GPUs: the rank runs in it, an MPI singleton (issue 29, tests/test_launch_in_step.py)
    s = spec("srun", "mpi", workers=1, wpn=1)
    assert s.argv == ["env", "-u", "SLURM_STEP_ID", "-u", "SLURM_STEPID", *PROG]
    assert s.launcher == "srun" and s.controller == "mpi" and "srun" not in s.argv
    assert s.env == spec("srun", "mpi", workers=2).env  # the ranks' variables, as for 2


@pytest.mark.parametrize("launcher", ["horovodrun", "mpirun", "srun"])
def test_nccl_sets_gpu_operations(launcher):
    s = spec(launcher, "nccl", gpus=2)
    assert s.env["HOROVOD_GPU_OPERATIONS"] == "NCCL"
    assert "HOROVOD_CPU_OPERATIONS" not in s.env


# issue 12: srun + gloo starts its own rendezvous (tests/test_gloo_slurm.py)
@pytest.mark.parametrize("launcher", ["mpirun"])
def test_gloo_always_starts_with_horovodrun(launcher, monkeypatch):
    # Gloo needs horovodrun's rendezvous: mpirun/srun + gloo would crash in hvd.init()
    s = spec(launcher, "gloo")
    assert s.launcher == "horovodrun" and s.argv[:6] == [
        "horovodrun",
        "-np",
        "2",
        "-H",
        "localhost:2",
        "--gloo",
    ]
    assert s.env["HVDSCALE_LAUNCHER"] == "horovodrun" and any(
        "Gloo rendezvous" in n for n in s.notes
    )
    assert controller_for("horovodrun", "gloo") == "gloo"
    with pytest.raises(UserError, match="horovodrun"):
        controller_for(launcher, "gloo")
    # inside a SLURM allocation of two nodes the hosts come from the allocation
    monkeypatch.setattr("hvdscale.slurm.slots.slurm_hostnames", lambda: ["c1", "c2"])
    s = spec(launcher, "gloo", workers=4, nodes=2, wpn=2)
    assert s.argv[s.argv.index("-H") + 1] == "c1:2,c2:2"


def test_horovod_tuning_knobs_and_timeline(tmp_path):
    t = {
        "threads_per_worker": 2,
        "timeline": True,
        "horovod": {"cycle_time_ms": 2.5, "fusion_threshold_mb": 64},
    }
    s = spec("mpirun", "mpi", training=t, out_dir=tmp_path)
    assert s.env["HOROVOD_CYCLE_TIME"] == "2.5"
    assert s.env["HOROVOD_FUSION_THRESHOLD"] == str(64 * 1024 * 1024)
    assert s.env["HOROVOD_TIMELINE"] == str(tmp_path.resolve() / "timeline.json")
    assert s.env["OMP_NUM_THREADS"] == "2"
    exported = [s.argv[i + 1] for i, a in enumerate(s.argv) if a == "-x"]
    assert {"HOROVOD_CYCLE_TIME", "HOROVOD_FUSION_THRESHOLD", "HOROVOD_TIMELINE"} <= set(exported)
    assert horovod_env({"horovod": {}}, "gloo") == {"HOROVOD_CPU_OPERATIONS": "gloo"}


@pytest.mark.parametrize(
    "workers, wpn, cores, binding, expected",
    [
        (1, 1, 2, "auto", "1"),  # alone: nothing to coordinate, Horovod's default
        (2, 2, 2, "auto", "0.01"),  # two ranks, a core each, bound by cpu_binding auto
        (2, 2, 2, "core", "0.01"),
        (2, 2, 2, "none", "0.1"),  # unbound: the OS places the threads
        (16, 8, 2, "auto", "0.1"),  # oversubscribed: a short cycle would poll on shared cores
        (4, 2, 16, "auto", "0.01"),  # two nodes, a core each
        (2, 1, 16, "auto", "0.1"),  # one rank per node: cpu_binding auto leaves it alone
    ],
)
def test_cycle_time_auto(workers, wpn, cores, binding, expected):
    t = {**T, "cpu_binding": binding, "horovod": {"cycle_time_ms": "auto"}}
    nodes = -(-workers // wpn)
    hosts = [f"h{i}" for i in range(nodes)] if nodes > 1 else None
    s = spec("mpirun", "mpi", workers, nodes, wpn, training=t, cpu_count=cores, hosts=hosts)
    assert s.env["HOROVOD_CYCLE_TIME"] == expected
    exported = [s.argv[i + 1] for i, a in enumerate(s.argv) if a == "-x"]
    assert "HOROVOD_CYCLE_TIME" in exported  # mpirun -x passes it to the ranks


def test_cycle_time_number_and_null_win_over_placement():
    assert cycle_time_ms(2.5, 1, False) == 2.5 and cycle_time_ms(2.5, 8, True) == 2.5
    assert cycle_time_ms(None, 2, True) is None  # Horovod's own default: no variable
    assert "HOROVOD_CYCLE_TIME" not in horovod_env({"horovod": {"cycle_time_ms": None}}, "mpi")
    assert cycle_time_ms("auto", 1, True) == 1.0
    assert validate_config({})["training"]["horovod"]["cycle_time_ms"] == "auto"


def test_cycle_time_bad_value_names_key_and_choices():
    expected = r"cycle_time_ms: got 0; expected a number > 0 or null or 'auto'"
    with pytest.raises(UserError, match=expected):
        validate_config({"training": {"horovod": {"cycle_time_ms": 0}}})


def test_horovodrun_multi_node_needs_hosts(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_NODELIST", raising=False)
    with pytest.raises(UserError, match="host"):
        spec("horovodrun", "gloo", workers=4, nodes=2, wpn=2)
    s = spec("horovodrun", "gloo", workers=3, nodes=2, wpn=2, hosts=["a", "b"])
    assert s.argv[s.argv.index("-H") + 1] == "a:2,b:1"


def test_unknown_launcher():
    with pytest.raises(UserError, match="launcher"):
        spec("pbsdsh", "mpi")


def _cfg(**training):
    return validate_config(base_config(**training))


def test_job_for_run_id_and_allreduce_id():
    cfg = _cfg()
    job, ident = job_for(cfg, "train", "local_mpi_n1_w2_b75_lrnone_r0", None)
    assert (job.backend, job.workers, job.nodes, job.workers_per_node) == ("mpi", 2, 1, 2)
    job, ident = job_for(cfg, "measure-allreduce", None, "local_gloo_n1_w2")
    assert (job.partition, job.backend, job.workers, ident) == (
        "local",
        "gloo",
        2,
        "local_gloo_n1_w2",
    )
    with pytest.raises(UserError, match="allreduce-id"):
        job_for(cfg, "measure-allreduce", None, "local_gloo_w2")
    with pytest.raises(UserError, match="need 2 node"):
        job_for(cfg, "measure-allreduce", None, "local_gloo_n1_w4")
    with pytest.raises(UserError, match="spread evenly"):
        job_for(cfg, "measure-allreduce", None, "local_gloo_n3_w2")
    job, _ = job_for(cfg, "measure-allreduce", None, "local_gloo_n2_w2")  # allreduce.sweeps
    assert (job.nodes, job.workers_per_node) == (2, 1)


def test_default_train_python():
    cfg = _cfg()
    assert default_train_python(cfg).endswith(".venv-train/bin/python")
    cfg["environment"]["deployment"] = "env-modules"
    assert default_train_python(cfg) == "python"


def test_describe_failure_names_the_rank(tmp_path):
    hvd_tail = (
        "Process 1 exit with status code 137.\n"
        "RuntimeError: Horovod detected that one or more processes "
        "exited with non-zero status, thus causing the job to be terminated. "
        "The first process to do so "
        "was:\nProcess name: 1\nExit code: 137\n"
    )
    assert "rank 1 failed first (exit code 137: signal 9)" in describe_failure(hvd_tail, 1, None, 2)
    mpi_tail = (
        "mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 (Killed)."
    )
    assert "rank 1 failed first (signal 9)" in describe_failure(mpi_tail, 137, None, 2)
    pids = tmp_path / ".pids"
    pids.mkdir()
    for r in (0, 1):
        (pids / f"rank-{r}.pid").write_text("1\n")
    (pids / "rank-0.exit").write_text("1\n")
    msg = describe_failure("", 1, tmp_path, 2)
    assert "no exit marker (killed or crashed) from rank(s) 1" in msg and "rank 0: 1" in msg


# --------------------------------------------------------------------------- command line


def _hvd(*args, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "hvdscale.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=sub_env(),
    )


def test_dry_run_prints_the_command_without_tensorflow(tmp_path):
    cfg = write_config(tmp_path / "config.json", base_config(timeline=True))
    code = (
        "import sys; from hvdscale.cli import main; rc = main(sys.argv[1:]); "
        "assert 'tensorflow' not in sys.modules and 'horovod' not in sys.modules; sys.exit(rc)"
    )
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "launch",
            "--config",
            str(cfg),
            "--run-id",
            "local_gloo_n1_w2_b75_lrnone_r0",
            "--data-dir",
            "d",
            "--out-dir",
            str(tmp_path / "run"),
            "--dry-run",
        ],
        capture_output=True,
        text=True,
        env=sub_env(),
    )
    assert r.returncode == 0, r.stderr
    line = r.stdout.strip().splitlines()[0]
    assert "horovodrun -np 2 -H localhost:2 --gloo" in line
    assert "HOROVOD_CPU_OPERATIONS=gloo" in line and "HOROVOD_TIMELINE=" in line
    assert "-m hvdscale.cli train" in line and "--run-id local_gloo_n1_w2_b75_lrnone_r0" in line
    assert "HVDSCALE_LAUNCH_START=" in line  # the launcher's start, for the ranks' start-up
    assert not (tmp_path / "run").exists()  # a dry run starts and writes nothing
    r = _hvd(
        "launch",
        "--config",
        cfg,
        "--run-id",
        "local_mpi_n1_w2_b75_lrnone_r0",
        "--data-dir",
        "d",
        "--out-dir",
        tmp_path / "run",
        "--launcher",
        "mpirun",
        "--dry-run",
    )
    assert r.returncode == 0 and "mpirun -np 2 --bind-to none --map-by slot" in r.stdout
    r = _hvd(
        "launch",
        "--config",
        cfg,
        "--run-id",
        "local_gloo_n1_w2_b75_lrnone_r0",
        "--data-dir",
        "d",
        "--out-dir",
        tmp_path / "run",
        "--launcher",
        "srun",
        "--dry-run",
    )
    # issue 12: gloo under srun: srun --mpi=none + Horovod's rendezvous, no horovodrun
    assert r.returncode == 0 and "srun --mpi=none -n 2" in r.stdout, r.stdout + r.stderr
    assert "hvdscale.slurm.rendezvous exec" in r.stdout and "horovodrun" not in r.stdout


def test_user_errors_are_one_line(tmp_path):
    cfg = write_config(tmp_path / "config.json", base_config())
    r = _hvd(
        "launch",
        "--config",
        cfg,
        "--run-id",
        "local_gloo_n1_w3_b75_lrnone_r0",
        "--data-dir",
        "d",
        "--out-dir",
        tmp_path / "run",
        "--dry-run",
    )
    assert r.returncode == 2 and "not in the scaling matrix" in r.stderr
    r = _hvd("launch", "--config", tmp_path / "missing.json", "--run-id", "x", "--dry-run")
    assert r.returncode == 2 and "not found" in r.stderr and "Traceback" not in r.stderr
    r = _hvd("launch", "--config", cfg, "--run-id", "local_gloo_n1_w2_b75_lrnone_r0", "--dry-run")
    assert r.returncode == 2 and "--data-dir" in r.stderr


@pytest.mark.slow
@pytest.mark.horovod
def test_a_launcher_that_fails_leaves_failure_json(tmp_path):
    cfg = write_config(tmp_path / "config.json", base_config())
    out = tmp_path / "run"
    out.mkdir()
    (out / "failure.json").write_text("{}")  # stale, from an earlier attempt
    r = _hvd(
        "launch",
        "--config",
        cfg,
        "--run-id",
        "local_mpi_n1_w1_b75_lrnone_r0",
        "--data-dir",
        tmp_path,
        "--out-dir",
        out,
        "--launcher",
        "mpirun",
        "--train-python",
        "/bin/false",
        timeout=120,
    )
    assert r.returncode != 0
    assert "ERROR: local_mpi_n1_w1_b75_lrnone_r0: failed" in r.stderr
    failure = json.loads((out / "failure.json").read_text())
    assert failure["run_id"] == "local_mpi_n1_w1_b75_lrnone_r0" and failure["status"] == "failed"
    assert failure["exit_status"] == r.returncode and failure["time_utc"].endswith("Z")
    assert failure["command"][0] == "mpirun" and failure["launcher"] == "mpirun"
    assert not (out / "metrics.json").exists()


@pytest.mark.slow
@pytest.mark.horovod
@needs_train_env
@pytest.mark.parametrize(
    "allreduce_id,launcher", [("local_gloo_n1_w2", "horovodrun"), ("local_mpi_n1_w2", "mpirun")]
)
def test_measure_allreduce_through_launch(tmp_path, allreduce_id, launcher):
    # the sweep's own config slice, as the workflow's write_allreduce_config writes it
    sliced = allreduce_config(validate_config(base_config()), allreduce_id)
    cfg = write_config(tmp_path / "config" / f"{allreduce_id}.json", sliced)
    out = tmp_path / "allreduce" / f"{allreduce_id}.csv"
    r = _hvd(
        "launch",
        "--program",
        "measure-allreduce",
        "--config",
        cfg,
        "--allreduce-id",
        allreduce_id,
        "--out",
        out,
        "--launcher",
        launcher,
        "--train-python",
        TRAIN_PY,
        "--sizes",
        "8:64Ki:x4",
        "--iterations",
        "5",
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    rows = list(csv.DictReader(out.open()))
    assert [int(x["bytes"]) for x in rows] == [8, 32, 128, 512, 2048, 8192, 32768]
    for x in rows:
        assert x["partition"] == "local" and x["backend"] == allreduce_id.split("_")[1]
        assert int(x["workers"]) == 2 and int(x["nodes"]) == 1 and int(x["iterations"]) == 5
        t, p10, p90 = float(x["time_s"]), float(x["p10"]), float(x["p90"])
        assert 0 < p10 <= t <= p90
        assert float(x["algbw"]) == pytest.approx(int(x["bytes"]) / t, rel=1e-6)
        assert float(x["busbw"]) == pytest.approx(float(x["algbw"]) * 2 * (2 - 1) / 2, rel=1e-6)
    assert not Path(str(out) + ".failure.json").exists()


def test_allreduce_size_parsing():
    from hvdscale.trainer.horovod_tf.allreduce import bus_bandwidth, parse_sizes

    assert parse_sizes("8:128Mi")[-1] == 128 * 1024 * 1024 and parse_sizes("8:128Mi")[0] == 8
    assert len(parse_sizes("8:128Mi")) == 25
    assert parse_sizes("8:1Ki:x4") == [8, 32, 128, 512]
    assert bus_bandwidth(1.0, 4) == pytest.approx(1.5)
    with pytest.raises(UserError):
        parse_sizes("8")
    with pytest.raises(UserError):
        parse_sizes("8:1Mi:x3")


@pytest.mark.parametrize(
    ("framework", "status", "fast"),
    [(None, 0, False), ("tensorflow", 0, True), ("torch", 0, True), ("tensorflow", 3, False)],
)
def test_finish_skips_the_teardown_only_after_a_framework_command_succeeded(
    framework, status, fast
):
    """hvdscale.cli.finish: a process that imported TensorFlow (or torch) and succeeded
    shuts Horovod down (MPI_Finalize: mpirun fails a rank without it), flushes
    stdout/stderr and leaves with os._exit (its interpreter teardown costs ~0.7 s per rank
    and run); any other exit is ordinary (atexit handlers run)."""
    fake = ""
    if framework:
        fake = f"sys.modules[{framework!r}] = types.ModuleType({framework!r}); "
        fake += (
            "hvd = types.ModuleType('horovod.tensorflow'); "
            "hvd.shutdown = lambda: print('hvd-shutdown', end=''); "
            "sys.modules['horovod.tensorflow'] = hvd; "
        )
    code = (
        "import atexit, sys, types; "
        + fake
        + "atexit.register(lambda: print('teardown', flush=True)); "
        "from hvdscale.cli import finish; "
        f"print('buffered', end=''); print('err', end='', file=sys.stderr); finish({status})"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=sub_env())
    assert r.returncode == status
    assert r.stderr == "err"  # flushed before os._exit
    assert r.stdout == ("bufferedhvd-shutdown" if fast else "bufferedteardown\n")
