"""What the data phase of hvdscale's step is made of (issue 11, item 5; train env).

The data phase of a timed step is ``t1 - t_prev``: from the end of the previous step's
update to the moment the batch exists. With ``data_in_device_memory`` (default) it holds
the cursor update (``cursor.assign_add``), the slice of the epoch's permutation, two
``tf.gather`` of the batch rows, the timestamp op itself and the while-loop iteration
boundary. This benchmark swaps only the batch source's ``fetch`` (per instance; hvdscale itself
is unchanged) and measures the data time per step of each variant:

  gather   the default: cursor + permutation slice + tf.gather of x and y
  loopvar  the same gather, indices from the loop variable (no cursor variable)
  slice    a contiguous slice of the shard by the cursor (no gather, no permutation)
  fixed    the same constant batch every step: what is left is the timestamp, the
           control dependencies and the loop boundary (the floor of the measurement)

plus the per-epoch host work outside the clock: drawing the permutation (numpy) and
uploading it (``start_epoch``), per step, which item 5 wants counted as data loading.
Pinned to core 0, 1 thread, the thesis network, random in-memory data; every call timed
(instrument_every 1); one warm-up epoch per variant, then interleaved epochs; medians.
Writes benchmarks/results/bench_data_phase.csv.

  .venv-train/bin/python benchmarks/bench_data_phase.py [--batches 75,1000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import types
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import (  # noqa: E402
    Measured,
    add_quiet_args,
    configure_quiet,
    quiet_main,
    write_csv,
)

from hvdscale.analysis.stats import median_interval  # noqa: E402


@quiet_main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--samples", type=int, default=30000)
    ap.add_argument("--batches", default="75,1000")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--csv")
    add_quiet_args(ap)
    a = ap.parse_args(argv)
    configure_quiet(a)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {0})

    from hvdscale.trainer.worker import WorkerInfo

    worker = WorkerInfo.init()  # HVD: as hvdscale train (one worker)
    import numpy as np
    import tensorflow as tf

    from hvdscale.matrix.config import validate_config
    from hvdscale.trainer.device import pin_device
    from hvdscale.trainer.horovod_tf.step import build_step_program
    from hvdscale.trainer.loop import run_epoch_steps
    from hvdscale.trainer.model import build_model

    device, _ = pin_device(worker, 1)
    cfg = validate_config({})
    spe = cfg["training"]["steps_per_execution"]
    rng = np.random.default_rng(0)
    n = a.samples
    x = rng.standard_normal((n, cfg["data"]["n_points"], 3)).astype(np.float32)
    y = rng.standard_normal((n, 2)).astype(np.float32)

    # variants of the batch source's fetch (hvdscale.trainer.horovod_tf.step.DeviceBatches.fetch),
    # installed on the instance before the first call traces the step
    def fetch_loopvar(src, j, feed):
        B = src.batch
        idx = src.perm[j * B : (j + 1) * B]
        return tf.gather(src.x, idx), tf.gather(src.y, idx)

    def fetch_slice(src, j, feed):
        B = src.batch
        i = src.cursor.assign_add(1) - 1
        return src.x[i * B : (i + 1) * B], src.y[i * B : (i + 1) * B]

    def fetch_fixed(src, j, feed):
        # identities created here, inside the step's control dependency on t_prev
        # (the constants alone would let the timestamp run before t_prev)
        return tf.identity(src.x_fixed), tf.identity(src.y_fixed)

    kinds = {"gather": None, "loopvar": fetch_loopvar, "slice": fetch_slice, "fixed": fetch_fixed}
    rows = []
    with Measured("bench_data_phase") as meas:
        for B in [int(b) for b in a.batches.split(",")]:
            steps = n // B
            progs = {}
            for name, fetch in kinds.items():
                tf.keras.utils.set_random_seed(1)
                model = build_model(cfg)
                opt = tf.keras.optimizers.Adam(cfg["training"]["learning_rate"])
                opt.build(model.trainable_variables)
                p = build_step_program(
                    model,
                    opt,
                    worker,
                    cfg["training"],
                    train=(x, y),
                    test=(x[:B], y[:B]),
                    batch=B,
                    device=device,
                    in_device_memory=True,
                )
                with tf.device(device):
                    p.source.x_fixed, p.source.y_fixed = tf.constant(x[:B]), tf.constant(y[:B])
                if fetch is not None:
                    p.source.fetch = types.MethodType(fetch, p.source)
                p.warm_up(spe)
                progs[name] = p
            res = {k: {"data": [], "step": [], "share": []} for k in kinds}
            host = []
            for r in range(a.repeats + 1):
                order = list(kinds) if r % 2 == 0 else list(kinds)[::-1]
                for k in order:
                    t0 = time.perf_counter()
                    perm = np.random.default_rng([1, r]).permutation(n)
                    progs[k].start_epoch(perm)
                    t_host = time.perf_counter() - t0
                    _t, (_l, ph, _d, t_train) = run_epoch_steps(progs[k], perm, steps, spe, 1)
                    if r == 0:
                        continue  # warm-up
                    res[k]["data"].append(float(ph[0]) / steps)
                    res[k]["step"].append(t_train / steps)
                    res[k]["share"].append(float(ph[0]) / float(sum(ph)))
                    if k == "gather":
                        host.append(t_host / steps)
            for k in kinds:
                d, lo, hi = median_interval(res[k]["data"], name="benchmark")
                rows.append(
                    {
                        "batch": B,
                        "variant": k,
                        "data_ms_per_step": 1e3 * d,
                        "data_ms_ci_low": 1e3 * lo if lo is not None else None,
                        "data_ms_ci_high": 1e3 * hi if hi is not None else None,
                        "step_ms": 1e3 * statistics.median(res[k]["step"]),
                        "data_share": statistics.median(res[k]["share"]),
                        "repeats": a.repeats,
                        "samples": n,
                    }
                )
            rows.append(
                {
                    "batch": B,
                    "variant": "host shuffle (outside the clock)",
                    "data_ms_per_step": 1e3 * statistics.median(host),
                    "step_ms": None,
                    "data_share": None,
                    "repeats": a.repeats,
                    "samples": n,
                }
            )
    for r in rows:
        r.update(meas.fields())
        share = f"{100 * r['data_share']:.1f} %" if r["data_share"] is not None else ""
        print(
            f"  batch {r['batch']:5d} {r['variant']:34s} data {r['data_ms_per_step']:.4f} ms/step "
            f"{share}"
        )
    write_csv("bench_data_phase", rows, a.csv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
