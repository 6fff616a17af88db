"""The torch-ddp trainer (issue 19, phase 1): the same network, loss and optimizer step as
the Keras one (each framework in its own train-env process, tests/torch_ddp_checks.py),
the DDP gradient average, and real 1- and 2-rank torchrun runs on a few hundred curves
made by the project's data pipeline, whose records validate against the run schema."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from conftest_train import (
    PROJECT_ROOT,
    TRAIN_PY,
    base_config,
    cached_data,
    check_plausible,
    fault_env,
    kill_group,
    load_record,
    needs_train_env,
    run_train_code,
    train_code_env,
    wait_for,
    write_config,
)
from required_layers import layer_skipif

from hvdscale.launch.launchspec import build_launch
from hvdscale.launch.runner import companion
from hvdscale.slurm.jobspec import JobSpec
from hvdscale.trainer.model import parameter_count
from hvdscale.trainer.schedule import warmup_lr, warmup_updates

CHECKS = PROJECT_ROOT / "tests" / "torch_ddp_checks.py"
TORCHRUN = TRAIN_PY.parent / "torchrun"
# the torch-ddp runs of the tests' config (a sweep of framework torch-ddp, issue 19)
TORCH_SWEEP = {
    "name": "torch",
    "frameworks": ["torch-ddp"],
    "partitions": ["local"],
    "workers": [1, 2],
    "backends": ["gloo"],
    "batch_sizes": [8, 75],
    "lr_rules": ["none"],
}
TORCH_ID2 = "local_torch-ddp_gloo_n1_w2_b8_lrnone_r0"


def has_torch() -> bool:
    if not TRAIN_PY.exists():
        return False
    r = subprocess.run([str(TRAIN_PY), "-c", "import torch"], capture_output=True)
    return r.returncode == 0


needs_torch = layer_skipif("torch", None if has_torch() else "torch missing in .venv-train")


def train_env() -> dict:
    return train_code_env(OMP_NUM_THREADS="1")


def run_check(*args, torchrun_ranks: int | None = None, timeout=240) -> str:
    cmd = [str(TRAIN_PY), str(CHECKS), *map(str, args)]
    if torchrun_ranks is not None:
        cmd = [str(TORCHRUN), "--standalone", "--nproc-per-node", str(torchrun_ranks), *cmd[1:]]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=train_env())
    assert r.returncode == 0, f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return r.stdout


# --------------------------------------------------------------------------- framework-free


def test_warmup_rule_is_the_keras_schedules_formula():
    t = {"lr_warmup": True, "warmup_epochs": 2, "horovod": {"backward_passes_per_step": 2}}
    assert warmup_updates(t, 1e-3, 4e-3, steps=10) == 2 * 5
    assert warmup_updates(t, 1e-3, 1e-3, steps=10) == 0  # the rule kept the rate
    assert warmup_updates({**t, "lr_warmup": False}, 1e-3, 4e-3, steps=10) == 0
    assert [warmup_lr(1.0, 3.0, 4, k) for k in (0, 2, 4, 9)] == [1.0, 2.0, 3.0, 3.0]


def _epoch(warmup, sync_s, steps=10, **extra):
    return {"warmup": warmup, "time_sync_s": sync_s, "steps": steps, "timed_steps": 2, **extra}


def test_sync_block_per_framework():
    """timing.sync (issue 19): medians over the non-warm-up epochs of per-step values;
    Horovod's exposed sync is its allreduce, DDP's the plain step minus the no-comm step."""
    from hvdscale.record.timing import sync_block

    hv = [_epoch(True, 9.0), _epoch(False, 0.1), _epoch(False, 0.3), _epoch(False, 0.2)]
    b = sync_block(hv, 2, "horovod-tf", plain_step_s=0.05)
    assert b["allreduce_s"] == pytest.approx(0.02) == b["exposed_s"]
    assert b["comm_hook_s"] is None and b["no_comm_step_s"] is None
    td = [
        _epoch(True, 9.0, comm_hook_step_s=1.0, step_s_no_comm=1.0),
        _epoch(False, 0.1, comm_hook_step_s=0.004, step_s_no_comm=0.010),
        _epoch(False, 0.2, comm_hook_step_s=0.006, step_s_no_comm=0.012),
        _epoch(False, 0.1, comm_hook_step_s=0.005, step_s_no_comm=0.011),
    ]
    b = sync_block(td, 2, "torch-ddp", plain_step_s=0.014)
    assert b["allreduce_s"] == pytest.approx(0.01) and b["comm_hook_s"] == pytest.approx(0.005)
    assert b["no_comm_step_s"] == pytest.approx(0.011)
    assert b["exposed_s"] == pytest.approx(0.003)
    assert sync_block(td, 2, "torch-ddp", plain_step_s=None)["exposed_s"] is None
    one = sync_block(td, 1, "torch-ddp", plain_step_s=0.014)
    assert one["allreduce_s"] == 0 == one["exposed_s"] and one["comm_hook_s"] is None
    for b in (sync_block(hv, 2, "horovod-tf", None), sync_block(td, 2, "torch-ddp", 0.01), one):
        assert b["definition"] and set(b) == {
            "allreduce_s", "comm_hook_s", "exposed_s", "no_comm_step_s", "definition"
        }  # fmt: skip


def test_the_run_schema_knows_torchrun_and_the_framework():
    from hvdscale.record.build import load_run_schema

    props = load_run_schema()["properties"]
    assert "torchrun" in props["config"]["properties"]["launcher"]["enum"]
    assert props["config"]["properties"]["framework"]["enum"] == ["horovod-tf", "torch-ddp"]


# --------------------------------------------------------------------------- the same math


@pytest.fixture(scope="module")
def keras_and_torch(tmp_path_factory) -> tuple[dict, dict]:
    d = tmp_path_factory.mktemp("frameworks")
    run_check("keras", d / "keras.npz")
    run_check("torch", d / "keras.npz", d / "torch.npz")
    return dict(np.load(d / "keras.npz")), dict(np.load(d / "torch.npz"))


@pytest.mark.slow  # TensorFlow and torch in train-env subprocesses
@needs_torch
def test_the_parameter_count_is_the_keras_models(keras_and_torch):
    k, t = keras_and_torch
    assert int(k["n_params"]) == int(t["n_params"]) == parameter_count(200, [192, 175, 24])
    assert int(t["n_params"]) == 153441


@pytest.mark.slow  # TensorFlow and torch in train-env subprocesses
@needs_torch
def test_same_weights_same_batch_same_loss(keras_and_torch):
    k, t = keras_and_torch
    assert float(t["loss"]) == pytest.approx(float(k["loss"]), rel=1e-6)


@pytest.mark.slow  # TensorFlow and torch in train-env subprocesses
@needs_torch
def test_one_adam_step_moves_the_weights_as_keras_does(keras_and_torch):
    """KerasAdam = tf.keras.optimizers.Adam: the same epsilon (1e-7) in the same place.
    The first step moves each weight by about lr; the two agree to 1 % of it."""
    k, t = keras_and_torch
    assert float(k["epsilon"]) == float(t["epsilon"]) == 1e-7
    for i in range(8):
        moved = np.abs(k[f"after{i}"] - k[f"w{i}"]).max()
        assert moved > 5e-4
        np.testing.assert_allclose(t[f"after{i}"], k[f"after{i}"], rtol=0, atol=1e-5)


@pytest.mark.slow  # TensorFlow and torch in train-env subprocesses
@needs_torch
def test_the_lr_rule_and_warm_up_ramp_are_the_keras_ones():
    """Linear rule on 2 workers: 1e-3 -> 2e-3 over one warm-up epoch of 5 updates."""
    keras = json.loads(run_check("lr", "keras").strip().splitlines()[-1])
    torch_ = json.loads(run_check("lr", "torch").strip().splitlines()[-1])
    assert keras[0] == pytest.approx(1e-3) and keras[5:] == pytest.approx([2e-3] * 4)
    assert torch_ == pytest.approx(keras, rel=1e-6)
    assert torch_[:6] == pytest.approx([1e-3 * (1 + k / 5) for k in range(6)])


@pytest.mark.slow
@needs_torch
@pytest.mark.parametrize("timed", [False, True], ids=["ddp-overlapped", "timed-allreduce"])
def test_two_rank_step_equals_one_rank_step_on_the_whole_batch(tmp_path, timed):
    """After one step, 2-rank DDP weights = 1-rank weights on the concatenated batch (the
    allreduce average), for the plain DDP step and the timed step's own allreduce."""
    mode = "timed" if timed else "plain"
    run_check("ddp-step", tmp_path / "one.npz", mode, torchrun_ranks=1)
    run_check("ddp-step", tmp_path / "two.npz", mode, torchrun_ranks=2)
    one, two = np.load(tmp_path / "one.npz"), np.load(tmp_path / "two.npz")
    assert one.files == two.files and len(one.files) == 8
    # 1e-5, as the Horovod twin: the two ranks sum their halves of the batch and then
    # each other's, one rank sums the whole batch, so float rounding differs; Adam
    # divides each gradient by its own magnitude, so a weight whose gradient is near
    # zero moves by up to lr x its relative rounding error (seen here: 5 of 115,200
    # weights 5.3e-6 apart, with this code and with the code before issue 31 alike)
    for f in one.files:
        np.testing.assert_allclose(two[f], one[f], rtol=0, atol=1e-5)


def run_hvd_check(ranks: int, *args) -> None:
    """tests/torch_ddp_checks.py under horovodrun --gloo with ``ranks`` ranks (the launch
    code of the training runs)."""
    spec = build_launch(
        launcher="horovodrun",
        job=JobSpec("local", "gloo", 1, ranks, ranks),
        program_argv=[str(TRAIN_PY), str(CHECKS), *map(str, args)],
        training={"threads_per_worker": 1},
        horovodrun=companion(str(TRAIN_PY), "horovodrun"),
    )
    env = {**train_env(), **spec.env}
    r = subprocess.run(spec.argv, capture_output=True, text=True, timeout=240, env=env)
    assert r.returncode == 0, f"{spec.argv} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"


@pytest.mark.slow
@pytest.mark.horovod
@needs_train_env
@pytest.mark.parametrize(
    "mode", ["plain", "timed", "timed xla"], ids=["plain", "timed", "timed-xla"]
)
def test_two_rank_horovod_step_equals_one_rank_step_on_the_whole_batch(tmp_path, mode):
    """The Horovod arm checked as the DDP one above: after one step (Keras Adam, the
    grouped allreduce average), 2-rank weights = 1-rank weights on the concatenated
    batch, for the plain and the timed (phase-stamped) compiled step. Tolerance: 1 % of
    the first Adam step (about lr = 1e-3 per weight); Adam divides by |g|, so where a
    gradient is tiny the float32 rounding of a different reduction order is magnified
    (measured: 1 of 115,200 weights off by 1.3e-6, the rest within 1e-6). A rank that
    used its own half-batch gradient would be off by up to 2e-3 in many weights. With
    XLA (issue 32, training.compile): each side first warms up, which compiles by running
    two steps and must put every variable back (the check exits otherwise); the 1-rank
    reference is the graph step without XLA."""
    run_hvd_check(1, "hvd-step", tmp_path / "one.npz", mode.replace(" xla", ""))
    run_hvd_check(2, "hvd-step", tmp_path / "two.npz", *mode.split())
    one, two = np.load(tmp_path / "one.npz"), np.load(tmp_path / "two.npz")
    assert one.files == two.files and len(one.files) == 8
    close = []
    for f in one.files:
        np.testing.assert_allclose(two[f], one[f], rtol=0, atol=1e-5)
        close.append(np.abs(two[f] - one[f]) <= 1e-6)
    assert np.mean(np.concatenate([c.ravel() for c in close])) > 0.999


# --------------------------------------------------------------------------- real runs


@pytest.fixture(scope="module")
def tiny_run_setup(tmp_path_factory) -> tuple[Path, Path]:
    """A few hundred curves through the data pipeline (about 270 train, 30 validation and
    100 test samples), and a 3-epoch config with one warm-up epoch."""
    data = cached_data(tmp_path_factory, n_samples=400, train_shards=2, test_shards=1)
    d = tmp_path_factory.mktemp("torch_cfg")
    kw = {"n_samples": 400, "train_shards": 2, "test_shards": 1, "epochs": 3}
    cfg = base_config(**kw)
    cfg["scaling"]["sweeps"].append(dict(TORCH_SWEEP))
    return write_config(d / "config.json", cfg), data


def torchrun_cmd(ranks: int, config: Path, run_id: str, data: Path, out: Path) -> list[str]:
    return [str(TORCHRUN), "--standalone", "--nproc-per-node", str(ranks),
            "-m", "hvdscale.cli", "train", "--config", str(config), "--run-id", run_id,
            "--data-dir", str(data), "--out-dir", str(out)]  # fmt: skip


@pytest.mark.slow
@needs_torch
@pytest.mark.parametrize("workers,launcher", [(1, "torchrun"), (2, "torchrun"), (1, "direct")])
def test_a_run_writes_a_valid_record_with_its_label_proof(
    tmp_path, tiny_run_setup, workers, launcher
):
    config, data = tiny_run_setup
    cfg = json.loads(config.read_text())  # plain and instrumented calls in every epoch
    cfg["training"].update(steps_per_execution=2, instrument_every=2)
    config = tmp_path / "config.json"
    config.write_text(json.dumps(cfg))
    rid = f"local_torch-ddp_gloo_n1_w{workers}_b8_lrnone_r0"
    out = tmp_path / "run"
    cmd = torchrun_cmd(workers, config, rid, data, out)
    if launcher == "direct":  # one process without torchrun: a private one-rank group
        cmd = [str(TRAIN_PY), *cmd[4:]]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=train_env())
    assert r.returncode == 0, r.stdout + r.stderr
    rec = load_record(out)  # validates against run.schema.json
    check_plausible(rec, workers, epochs=3)
    assert rec["config"]["framework"] == "torch-ddp" and rec["config"]["launcher"] == launcher
    assert rec["config"]["controller"] == "gloo" and rec["environment"]["torch"].startswith("2.")
    assert rec["environment"]["tensorflow"] == "none" == rec["environment"]["horovod"]
    assert rec["environment"]["devices"] == ["CPU:0"] * workers  # gloo: on the CPU
    assert rec["environment"]["torch_cuda"] is None and rec["config"]["data_in_device_memory"]
    # issue 32: the CPU kernel path of the matrix products (torch's own build facts)
    assert rec["system"]["cpu_kernels"].startswith("PyTorch: fp32 GEMM MKL "), rec["system"]
    assert "TensorFlow" not in rec["system"]["cpu_kernels"]
    # the torch trainer's own timing method, not the Horovod trainer's in-graph one
    assert "perf_counter" in rec["timing_method"] and "tf.timestamp" not in rec["timing_method"]
    proof = rec["label_proof"]
    assert proof["ok"], proof["problems"]
    assert proof["process_group_backend"] == "gloo"
    assert proof["process_group_world_size"] == proof["world_size"] == workers
    assert proof["devices"] == {"CPU": workers} and proof["nccl_version"] is None
    assert len(proof["hosts"]) == 1 and sum(proof["ranks_per_host"].values()) == workers
    assert rec["config"]["timeline_steps"] == 0 and rec["timeline"] is None  # none recorded
    assert rec["initial_weights_sha256"] and rec["summary"]["final_test_loss"] is not None
    assert (out / "history.csv").is_file() and (out / "checkpoint" / "LATEST").is_file()
    assert [(out / ".pids" / f"rank-{k}.exit").read_text() for k in range(workers)] == [
        "0\n"
    ] * workers
    check_sync_block(rec, workers)


@pytest.mark.slow
@needs_torch
def test_a_compiled_bf16_run_keeps_ddp_and_records_its_settings(tmp_path, tiny_run_setup):
    """Issue 32: training.compile default and precision bf16 on 2 gloo ranks: DDP's
    communication hook still times every synchronising step (DDP wraps the compiled
    network), Inductor compiled the step (its cache counters), its cache lands in the
    study's results folder, and the record states the settings."""
    config, data = tiny_run_setup
    cfg = json.loads(config.read_text())
    cfg["training"].update(
        precision="bf16", compile="default", instrument_every=2, steps_per_execution=2
    )  # plain and timed calls in every epoch
    # horovod-tf has neither setting: a config with its sweeps is refused (test_config)
    cfg["scaling"]["sweeps"] = [s for s in cfg["scaling"]["sweeps"] if s["name"] == "torch"]
    cfg["training"]["target"]["calibration"]["framework"] = "torch-ddp"  # also its runs
    config = tmp_path / "config.json"
    config.write_text(json.dumps(cfg))
    rid = "local_torch-ddp_gloo_n1_w2_b8_lrnone_bf16_cdefault_r0"  # the id names the setting
    out = tmp_path / "results" / "runs" / rid
    r = subprocess.run(torchrun_cmd(2, config, rid, data, out), capture_output=True,
                       text=True, timeout=400, env=train_env())  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    rec = load_record(out)
    check_plausible(rec, 2, epochs=3)
    assert (rec["config"]["precision"], rec["config"]["compile"]) == ("bf16", "default")
    assert rec["config"]["compile_mode"] == "default"
    # Inductor compiled before the epoch loop (torch's cache counters, not a clock): the
    # graphs were built (misses) into the study's cache folder
    assert rec["config"]["compile_cache_misses"] > 0, rec["config"]
    assert rec["config"]["compile_cache_dir"] == str(
        (tmp_path / "results" / "cache" / "torchinductor").resolve()
    )
    assert "precision bf16, compile default (mode default" in r.stdout + r.stderr
    assert list((tmp_path / "results" / "cache" / "torchinductor").iterdir())
    check_sync_block(rec, 2)


def one_rank_run(config: Path, rid: str, data: Path, out: Path) -> dict:
    """A direct 1-rank run (no torchrun) writing ``out``; its validated record. Inductor's
    cache goes where the trainer puts it (TORCHINDUCTOR_CACHE_DIR unset)."""
    env = train_env()
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    cmd = [str(TRAIN_PY), *torchrun_cmd(1, config, rid, data, out)[4:]]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    rec = load_record(out)
    check_plausible(rec, 1, epochs=3)
    return rec


@pytest.fixture(scope="module")
def eager_and_compiled_runs(tmp_path_factory, tiny_run_setup) -> dict:
    """Issue 32, fp32 on one rank: an eager run, and two runs of the same compiled config
    (training.compile default) one after the other in one results folder (its own run
    folders, one compile cache: results/cache/torchinductor). Plain and timed steps in
    every epoch."""
    config, data = tiny_run_setup
    d = tmp_path_factory.mktemp("compile_cache")
    cfg = json.loads(config.read_text())
    cfg["training"].update(instrument_every=2, steps_per_execution=2)
    eager_cfg = d / "eager.json"
    eager_cfg.write_text(json.dumps(cfg))
    cfg["training"]["compile"] = "default"
    cfg["scaling"]["sweeps"] = [s for s in cfg["scaling"]["sweeps"] if s["name"] == "torch"]
    cfg["training"]["target"]["calibration"]["framework"] = "torch-ddp"
    compiled_cfg = d / "compiled.json"
    compiled_cfg.write_text(json.dumps(cfg))
    runs = d / "results" / "runs"
    rid = "local_torch-ddp_gloo_n1_w1_b8_lrnone_cdefault_r0"
    return {
        "cache": (d / "results" / "cache" / "torchinductor").resolve(),
        "eager": one_rank_run(eager_cfg, TORCH_ID2.replace("_w2_", "_w1_"), data, d / "eager"),
        "first": one_rank_run(compiled_cfg, rid, data, runs / rid),
        "second": one_rank_run(compiled_cfg, rid, data, runs / f"{rid}-again"),
    }


@pytest.mark.slow
@needs_torch
def test_a_second_compiled_run_loads_its_graphs_from_the_cache(eager_and_compiled_runs):
    """Issue 32: the compiled graphs are cached across the runs of a study. The first
    compiled run fills the cache in the results folder (misses), the second run of the
    same config loads from it (hits; no new compilation), as torch's own cache counters
    recorded them, not a clock. Eager runs compile nothing and say so (null)."""
    runs = eager_and_compiled_runs
    first, second = runs["first"]["config"], runs["second"]["config"]
    assert first["compile_mode"] == second["compile_mode"] == "default"
    assert first["compile_cache_misses"] > 0, first
    assert second["compile_cache_hits"] > 0, second
    assert second["compile_cache_misses"] == 0, second  # everything came from the cache
    assert first["compile_cache_dir"] == second["compile_cache_dir"] == str(runs["cache"])
    assert list(runs["cache"].iterdir())
    eager = runs["eager"]["config"]
    assert eager["compile_mode"] is None
    assert [eager[k] for k in ("compile_cache_hits", "compile_cache_misses")] == [None, None]
    assert eager["compile_cache_dir"] is None


@pytest.mark.slow
@needs_torch
def test_the_compiled_step_gives_the_eager_losses_at_fp32(eager_and_compiled_runs):
    """Issue 32: at fp32 torch.compile (default) trains as the eager step does: the same
    initial weights and batches (one seed), per-epoch train and validation losses equal
    within float tolerance (Inductor fuses and reorders the float arithmetic, so not
    bit for bit). The compiled run really compiled (its cache lookups missed), and the
    losses move (check_plausible: the last epoch's train loss < half the first's), so
    agreeing is no accident of a flat curve."""
    runs = eager_and_compiled_runs
    eager, comp = runs["eager"], runs["first"]
    assert comp["config"]["compile"] == "default" and eager["config"]["compile"] == "off"
    assert comp["config"]["compile_cache_misses"] > 0  # Inductor built the step's graphs
    assert comp["initial_weights_sha256"] == eager["initial_weights_sha256"]
    for key in ("train_loss", "val_loss"):
        e = [ep[key] for ep in eager["epochs"]]
        c = [ep[key] for ep in comp["epochs"]]
        np.testing.assert_allclose(c, e, rtol=1e-4, err_msg=key)
    assert comp["summary"]["final_test_loss"] == pytest.approx(
        eager["summary"]["final_test_loss"], rel=1e-4
    )


@needs_torch
def test_fp16_and_tf32_are_refused_on_the_cpu_and_bf16_is_not(tmp_path):
    """The CPU refusal at the rank (speed.check_precision), for a config that got past
    the matrix check (which refuses them for partitions without GPUs)."""
    code = (
        "import torch\n"
        "from hvdscale.errors import UserError\n"
        "from hvdscale.trainer.torch_ddp.precision_compile import check_precision, compile_mode\n"
        "cpu = torch.device('cpu')\n"
        "for p in ('fp16', 'tf32'):\n"
        "    try:\n"
        "        check_precision(p, cpu, 'RID')\n"
        "    except UserError as e:\n"
        "        assert 'run RID' in str(e) and 'needs a GPU' in str(e), e\n"
        "    else:\n"
        "        raise SystemExit(p + ' accepted on the CPU')\n"
        "check_precision('bf16', cpu, 'RID'); check_precision('fp32', cpu, 'RID')\n"
        "assert compile_mode('max', cpu) == 'max-autotune-no-cudagraphs'\n"
        "assert compile_mode('max', torch.device('cuda', 0)) == 'reduce-overhead'\n"
        "assert compile_mode('off', cpu) is None\n"
    )
    run_train_code(code, OMP_NUM_THREADS="1")


def check_sync_block(rec: dict, workers: int) -> None:
    """timing.sync (issue 19 item 2): with 2 ranks a measured comm-hook time, a no-comm
    step and a finite exposed time that is the plain step minus it; 1 rank: 0 / null."""
    sync = rec["timing"]["sync"]
    if workers == 1:
        assert sync["allreduce_s"] == 0 == sync["exposed_s"]
        assert sync["comm_hook_s"] is None and sync["no_comm_step_s"] is None
        assert "one worker" in sync["definition"]
        return
    assert sync["comm_hook_s"] > 0 and sync["allreduce_s"] > 0 and sync["no_comm_step_s"] > 0
    assert np.isfinite(sync["exposed_s"])
    plain = rec["timing"]["instrumentation"]["uninstrumented_step_s"]
    assert sync["exposed_s"] == pytest.approx(plain - sync["no_comm_step_s"], abs=1e-8)
    assert "DDP" in sync["definition"] and "no_sync" in sync["definition"]
    timed = [e for e in rec["epochs"] if not e["warmup"]]
    assert all(e["comm_hook_step_s"] > 0 and e["step_s_no_comm"] > 0 for e in timed)


def live(pids: list[int]) -> list[int]:
    return [p for p in pids if Path(f"/proc/{p}").exists()]


@pytest.mark.slow
@needs_torch
def test_a_killed_rank_ends_the_job_with_a_clear_message_and_no_orphans(tmp_path, tiny_run_setup):
    config, data = tiny_run_setup
    cfg = json.loads(config.read_text())
    cfg["training"]["max_epochs"] = 500
    long = tmp_path / "long.json"
    long.write_text(json.dumps(cfg))
    out = tmp_path / "run"
    proc = subprocess.Popen(
        torchrun_cmd(2, long, TORCH_ID2, data, out),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=train_env(),
        start_new_session=True,
    )  # fmt: skip
    try:
        wait_for(lambda: (out / "checkpoint" / "LATEST").exists(), 120, "an epoch", proc)
        pids = [int((out / ".pids" / f"rank-{k}.pid").read_text()) for k in (0, 1)]
        time.sleep(0.3)
        os.kill(pids[1], signal.SIGKILL)
        try:
            output, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("the job hung for 60 s after rank 1 was killed")
    finally:
        kill_group(proc)
    assert proc.returncode != 0
    assert "Root Cause" in output and "rank      : 1" in output and "SIGKILL" in output, output
    assert not (out / "metrics.json").exists()
    wait_for(lambda: not live(pids), 30, "every rank to exit", interval=0.2)


@pytest.mark.slow
@needs_torch
def test_ranks_exit_when_torchrun_itself_is_killed(tmp_path, tiny_run_setup):
    """The orphan watchdog: SIGKILL of torchrun alone leaves no training rank behind."""
    config, data = tiny_run_setup
    cfg = json.loads(config.read_text())
    cfg["training"]["max_epochs"] = 500
    long = tmp_path / "long.json"
    long.write_text(json.dumps(cfg))
    out = tmp_path / "run"
    proc = subprocess.Popen(
        torchrun_cmd(2, long, TORCH_ID2, data, out),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=train_env(),
        start_new_session=True,
    )  # fmt: skip
    try:
        wait_for(lambda: (out / "checkpoint" / "LATEST").exists(), 120, "an epoch", proc)
        pids = [int((out / ".pids" / f"rank-{k}.pid").read_text()) for k in (0, 1)]
        proc.kill()  # torchrun only, not its group
        proc.wait(timeout=10)
        wait_for(lambda: not live(pids), 30, "the orphaned ranks to exit", interval=0.2)
    finally:
        kill_group(proc)


@pytest.mark.slow
@needs_torch
def test_sigusr1_stops_with_a_checkpoint_and_the_rerun_resumes_to_the_same_result(
    tmp_path, tiny_run_setup
):
    """SLURM's time-limit warning (slurm.timelimit): both ranks stop after the epoch's
    checkpoint with exit 4; the same command resumes from it (weights, KerasAdam state,
    shuffle by epoch) and ends where an uninterrupted run ends."""
    config, data = tiny_run_setup
    cfg = json.loads(config.read_text())
    cfg["training"]["max_epochs"] = 8
    cfg8 = tmp_path / "config8.json"
    cfg8.write_text(json.dumps(cfg))
    rid = TORCH_ID2
    out, whole = tmp_path / "run", tmp_path / "whole"
    proc = subprocess.Popen(
        torchrun_cmd(2, cfg8, rid, data, out), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, env={**train_env(), "SLURM_JOB_ID": "4242"},
        start_new_session=True,
    )  # fmt: skip
    try:
        wait_for(lambda: (out / "checkpoint" / "LATEST").exists(), 120, "an epoch", proc)
        for k in (0, 1):
            os.kill(int((out / ".pids" / f"rank-{k}.pid").read_text()), signal.SIGUSR1)
        output, _ = proc.communicate(timeout=120)
    finally:
        kill_group(proc)
    assert proc.returncode != 0 and "exit 4" in output, output[-3000:]
    assert [(out / ".pids" / f"rank-{k}.exit").read_text() for k in (0, 1)] == ["4\n"] * 2
    assert not (out / "metrics.json").exists()
    for d in (out, whole):
        r = subprocess.run(torchrun_cmd(2, cfg8, rid, data, d), capture_output=True,
                           text=True, timeout=300, env=train_env())  # fmt: skip
        assert r.returncode == 0, r.stdout + r.stderr
    resumed, straight = load_record(out), load_record(whole)
    attempts = resumed["resume"]["attempts"]
    assert resumed["resume"]["resumed"] and attempts[0]["ended"] == "time_limit"
    assert attempts[0]["exit_status"] == 4 and attempts[1]["start_epoch"] > 0
    assert len(resumed["epochs"]) == len(straight["epochs"]) == 8
    assert resumed["initial_weights_sha256"] == straight["initial_weights_sha256"]
    for a, b in zip(resumed["epochs"], straight["epochs"]):
        assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-5)
    assert resumed["summary"]["final_test_loss"] == pytest.approx(
        straight["summary"]["final_test_loss"], rel=1e-5
    )


@pytest.mark.slow
@needs_torch
def test_a_diverging_run_writes_a_nan_loss_record(tmp_path, tiny_run_setup):
    """As for Horovod: status nan_loss, exit 3 on rank 0 (torchrun reports it as its
    failure; the launcher of phase 2 reads it as a result), 0 on the others."""
    config, data = tiny_run_setup
    cfg = json.loads(config.read_text())
    cfg["training"]["learning_rate"] = 1e8
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(cfg))
    out = tmp_path / "run"
    r = subprocess.run(torchrun_cmd(2, bad, TORCH_ID2, data, out),
                       capture_output=True, text=True, timeout=300, env=train_env())  # fmt: skip
    assert r.returncode != 0 and "loss is not finite" in r.stderr, r.stderr[-3000:]
    assert "status nan_loss" in r.stdout
    rec = load_record(out)
    assert rec["status"] == "nan_loss" and rec["exit_status"] == 3 and "not finite" in rec["error"]
    assert len(rec["epochs"]) == 1 and rec["epochs"][0]["train_loss"] is None
    assert [(out / ".pids" / f"rank-{k}.exit").read_text() for k in (0, 1)] == ["3\n", "0\n"]


@pytest.mark.slow
@needs_torch
def test_the_noise_scale_sums_are_in_no_phase(tmp_path, tiny_run_setup):
    """As for Horovod-TF (tests/test_train.py): a 100 ms delay in the noise-scale sums of
    every timed 2-rank update grows no phase and not the launch overhead; the epoch's
    other time holds it."""
    config, data = tiny_run_setup
    cfg = json.loads(config.read_text())
    cfg["training"].update(steps_per_execution=2, instrument_every=1)
    config = tmp_path / "config.json"
    config.write_text(json.dumps(cfg))
    out = tmp_path / "run"
    cmd = torchrun_cmd(2, config, "local_torch-ddp_gloo_n1_w2_b8_lrnone_r0", data, out)
    env = fault_env("noise:0.1", train_env())
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    ep = load_record(out)["epochs"][-1]
    assert ep["noise_steps"] == ep["timed_steps"] > 0, ep
    per_step = {p: ep[f"time_{p}_s"] / ep["steps"] for p in ("data", "compute", "sync", "update")}
    assert all(v < 0.05 for v in per_step.values()), per_step
    slept = 0.1 * ep["noise_steps"]
    assert ep["time_other_s"] >= 0.8 * slept, (ep["time_other_s"], slept, per_step)
    assert ep["time_dispatch_s"] < 0.5 * slept, (ep["time_dispatch_s"], slept)
