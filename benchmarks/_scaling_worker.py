"""One rank of a bench_scaling.py comparison run (train env): naive Horovod Keras or
TensorFlow's MultiWorkerMirroredStrategy, on the same data, model and threads as
``hvdscale train``. Not a user command: bench_scaling.py starts it.

  naive: started by horovodrun (--gloo or --mpi) with Horovod's defaults; Keras
         model.fit with hvd.DistributedOptimizer and BroadcastGlobalVariablesCallback,
         as in Horovod's Keras example.
  mwms:  started once per worker with TF_CONFIG (127.0.0.1 ports); model.fit under
         tf.distribute.MultiWorkerMirroredStrategy with CPU collectives (RING or AUTO),
         per-worker datasets (distribute_datasets_from_function), steps_per_execution as
         hvdscale uses it (its best case).

Each rank reads only its own rows of the splits through hvdscale.train.prepare_data
(the same rows as hvdscale train), trains, times every epoch with perf_counter around
the step loop (on_epoch_begin .. on_epoch_end; no evaluation inside), then computes the
sum of squared errors over its test rows and writes OUT.rankN.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["naive", "mwms"], required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--epochs", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rank", type=int, default=0, help="mwms: this worker's index")
    ap.add_argument("--workers", type=int, default=1, help="mwms: number of workers")
    ap.add_argument("--port", type=int, default=23456, help="mwms: first port of the workers")
    ap.add_argument(
        "--impl",
        choices=["ring", "auto"],
        default="ring",
        help="mwms: CPU collective implementation",
    )
    ap.add_argument("--spe", type=int, default=64, help="mwms: steps_per_execution")
    ap.add_argument(
        "--lr-scale", type=float, default=1.0, help="learning rate = config's x this (LR rule)"
    )
    a = ap.parse_args()

    if a.mode == "mwms" and a.workers > 1:
        os.environ["TF_CONFIG"] = json.dumps(
            {
                "cluster": {"worker": [f"127.0.0.1:{a.port + i}" for i in range(a.workers)]},
                "task": {"type": "worker", "index": a.rank},
            }
        )
    hvd = None
    if a.mode == "naive":
        import horovod.tensorflow.keras as hvd  # HVD: Horovod's Keras binding, library defaults

        hvd.init()
        rank, size = hvd.rank(), hvd.size()
    else:
        rank, size = a.rank, a.workers
    import numpy as np
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.set_visible_devices([], "GPU")

    from hvdscale.config import validate_config
    from hvdscale.model import build_model
    from hvdscale.train import plan_rows, prepare_data
    from hvdscale.worker import WorkerInfo

    cfg = validate_config(json.loads(Path(a.config).read_text()))
    worker = WorkerInfo(rank=rank, size=size)  # only rank/size are used by prepare_data
    x, y, xt, yt, _info = prepare_data(Path(a.data_dir), cfg, worker, a.batch)
    B = a.batch
    # same number of steps on every rank (as hvdscale: the smallest rank's full batches)
    counts = [
        int(e["n_samples"])
        for e in json.loads((Path(a.data_dir) / "manifest.json").read_text())["shards"]["train"]
    ]
    n_min = min(
        sum(hi - lo for _, lo, hi in plan_rows(counts, size, r, cfg["training"]["shard_policy"]))
        for r in range(size)
    )
    steps = min(len(x), n_min) // B
    x, y = x[: steps * B], y[: steps * B]
    lr = cfg["training"]["learning_rate"] * a.lr_scale
    tf.keras.utils.set_random_seed(cfg["seed"])

    times: list[float] = []

    class EpochClock(tf.keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.t0 = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            times.append(time.perf_counter() - self.t0)

    if a.mode == "naive":
        model = build_model(cfg)
        opt = hvd.DistributedOptimizer(tf.keras.optimizers.Adam(lr))  # HVD: defaults
        model.compile(loss="mse", optimizer=opt)
        cbs = [EpochClock(), hvd.callbacks.BroadcastGlobalVariablesCallback(0)]  # HVD:
        model.fit(x, y, batch_size=B, epochs=a.epochs, shuffle=True, verbose=0, callbacks=cbs)
    else:
        impl = (
            tf.distribute.experimental.CommunicationImplementation.RING
            if a.impl == "ring"
            else tf.distribute.experimental.CommunicationImplementation.AUTO
        )
        strategy = tf.distribute.MultiWorkerMirroredStrategy(
            communication_options=tf.distribute.experimental.CommunicationOptions(
                implementation=impl
            )
        )
        n = len(x)

        def dataset_fn(ctx):
            ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(n, seed=cfg["seed"] + rank)
            return ds.batch(B, drop_remainder=True).repeat().prefetch(2)

        with strategy.scope():
            model = build_model(cfg)
            model.compile(
                loss="mse", optimizer=tf.keras.optimizers.Adam(lr), steps_per_execution=a.spe
            )
        dist = strategy.distribute_datasets_from_function(dataset_fn)
        model.fit(dist, epochs=a.epochs, steps_per_epoch=steps, verbose=0, callbacks=[EpochClock()])

    # the rank's own test rows, outside any strategy (model.predict under MWMS shards its input)
    pred = np.concatenate(
        [model(xt[i : i + 4096], training=False).numpy() for i in range(0, len(xt), 4096)]
    )
    sse = float(np.sum((pred.astype(np.float64) - yt) ** 2))
    out = {
        "mode": a.mode,
        "rank": rank,
        "workers": size,
        "batch": B,
        "steps": steps,
        "samples_per_epoch": steps * B * size,
        "epoch_times": times,
        "test_sse": sse,
        "test_values": int(yt.size),
        "impl": a.impl if a.mode == "mwms" else None,
    }
    Path(f"{a.out}.rank{rank}.json").write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
