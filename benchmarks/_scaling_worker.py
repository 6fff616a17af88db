"""One rank of a bench_scaling.py arm (train env; not a user command), pinned to its core
by bench_scaling.py like every other arm:

  keras    Keras ``model.fit`` on one worker (benchmarks/_keras_arm.py).
  mwms     ``model.fit`` under MultiWorkerMirroredStrategy, one process per worker with
           TF_CONFIG on 127.0.0.1 (CPU collectives RING or AUTO).
  hvdstep  hvdscale's own step code (StepProgram + run_epoch_steps, config defaults) for
           one worker: the "independent" control starts two at once with ``--barrier``
           (before every epoch each process leaves a file in DIR and waits for N files).

The same rows, threads, steps per epoch and timer scope as ``hvdscale train``
(docs/performance.md, "Scaling: 1 vs 2 workers"); epoch 0 is warm-up. Writes
OUT.rankR.json: the per-epoch times and the samples per epoch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def file_barrier(d: Path, tag: str, me: int, n: int, timeout_s: float = 300.0) -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{tag}.{me}").touch()
    t_end = time.monotonic() + timeout_s
    while len(list(d.glob(f"{tag}.*"))) < n:
        if time.monotonic() > t_end:
            raise SystemExit(f"barrier {tag}: the other process did not arrive")
        time.sleep(0.0005)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["keras", "mwms", "hvdstep"], required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--epochs", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rank", type=int, default=0, help="mwms: this worker's index")
    ap.add_argument("--workers", type=int, default=1, help="mwms: number of workers")
    ap.add_argument("--port", type=int, default=23456, help="mwms: first port of the workers")
    ap.add_argument("--impl", choices=["ring", "auto"], default="ring", help="mwms collectives")
    ap.add_argument("--spe", type=int, default=64, help="keras/mwms: steps_per_execution")
    ap.add_argument("--jit", type=int, default=0, help="keras/mwms: compile(jit_compile=...)")
    ap.add_argument("--lr-scale", type=float, default=1.0, help="learning rate x this")
    ap.add_argument("--barrier", help="directory of a per-epoch file barrier")
    ap.add_argument("--barrier-n", type=int, default=2)
    ap.add_argument("--barrier-id", type=int, default=0)
    ap.add_argument(
        "--instrument-every",
        type=int,
        default=None,
        help="hvdstep: every k-th call timed per phase (default: the config's; 0: none)",
    )
    a = ap.parse_args()

    if a.mode == "mwms" and a.workers > 1:
        os.environ["TF_CONFIG"] = json.dumps(
            {
                "cluster": {"worker": [f"127.0.0.1:{a.port + i}" for i in range(a.workers)]},
                "task": {"type": "worker", "index": a.rank},
            }
        )
    worker = None
    if a.mode == "hvdstep":
        from hvdscale.trainer.worker import WorkerInfo

        worker = WorkerInfo.init()  # HVD: as hvdscale train (Horovod with one worker)
        rank, size = 0, 1
    else:
        rank, size = a.rank, a.workers
    import numpy as np
    import tensorflow as tf

    from hvdscale.config.load import validate_config
    from hvdscale.trainer.data import plan_rows, prepare_data, steps_per_epoch
    from hvdscale.trainer.horovod_tf.model import build_model
    from hvdscale.trainer.worker import WorkerInfo

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.set_visible_devices([], "GPU")

    cfg = validate_config(json.loads(Path(a.config).read_text()))
    tcfg = cfg["training"]
    info = worker or WorkerInfo(rank=rank, size=size)  # prepare_data uses rank/size only
    arrays, _info = prepare_data(Path(a.data_dir), cfg, info, a.batch)
    (x, y), (xt, yt) = arrays["train"], arrays["test"]
    B = a.batch
    counts = [
        int(e["n_samples"])
        for e in json.loads((Path(a.data_dir) / "manifest.json").read_text())["shards"]["train"]
    ]
    per_rank = [
        sum(hi - lo for _, lo, hi in plan_rows(counts, size, r, tcfg["shard_policy"]))
        for r in range(size)
    ]
    steps = steps_per_epoch(per_rank, B, 1)
    n_local = len(x)
    lr = tcfg["learning_rate"] * a.lr_scale
    tf.keras.utils.set_random_seed(cfg["seed"])

    def perm_of(epoch):  # drawn outside the clock, as hvdscale train does
        return np.random.default_rng([cfg["seed"], epoch, rank]).permutation(n_local)

    def barrier(epoch):
        if a.barrier:
            file_barrier(Path(a.barrier), f"e{epoch}", a.barrier_id, a.barrier_n)

    times: list[float] = []
    if a.mode == "hvdstep":
        from hvdscale.trainer.horovod_tf.step import build_step_program
        from hvdscale.trainer.loop import run_epoch_steps
        from hvdscale.trainer.placement import pin_device

        device, _ = pin_device(worker, tcfg["threads_per_worker"])
        model = build_model(cfg)
        opt = tf.keras.optimizers.Adam(learning_rate=lr)
        opt.build(model.trainable_variables)
        prog = build_step_program(
            model, opt, worker, tcfg, train=(x, y), test=(xt, yt), batch=B, device=device
        )
        spe, k_inst = tcfg["steps_per_execution"], tcfg["instrument_every"]
        if a.instrument_every is not None:
            k_inst = a.instrument_every
        prog.warm_up(spe)
        for epoch in range(a.epochs):
            perm = perm_of(epoch)
            barrier(epoch)
            times.append(run_epoch_steps(prog, perm, steps, spe, k_inst)[1][3])  # t_train
    else:
        from _keras_arm import KerasArm

        strategy = None
        if a.mode == "mwms":
            impls = tf.distribute.experimental.CommunicationImplementation
            opts = tf.distribute.experimental.CommunicationOptions(
                implementation=impls.RING if a.impl == "ring" else impls.AUTO
            )
            strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=opts)
        arm = KerasArm(tf, lambda: build_model(cfg), x, y, B, steps, lr=lr, spe=a.spe, jit=a.jit,
                       strategy=strategy)  # fmt: skip
        for epoch in range(a.epochs):
            perm = perm_of(epoch)
            barrier(epoch)
            times.append(arm.epoch(perm))

    out = {"mode": a.mode, "rank": rank, "workers": size, "batch": B, "steps": steps,
           "samples_per_epoch": steps * B * size, "epoch_times": times}  # fmt: skip
    Path(f"{a.out}.rank{rank}.json").write_text(json.dumps(out))
    if worker is not None and worker.hvd is not None:
        worker.hvd.shutdown()  # HVD:
    return 0


if __name__ == "__main__":
    sys.exit(main())
