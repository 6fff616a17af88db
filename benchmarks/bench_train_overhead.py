"""Throughput of hvdscale's training path against plain Keras ``model.fit`` (train env).

One rank, one intra-/inter-op thread, the thesis network (153,441 parameters), batch 75,
the same in-memory arrays for both. The hvdscale path is the step code ``hvdscale
train`` runs (StepProgram + run_epoch_steps, Horovod initialised with one worker) with
the config's default settings (instrumentation on, every instrument_every-th call);
Keras is ``model.fit`` of the same model with the same optimizer. One epoch of each is
a warm-up (not counted); then REPEATS epochs of each, interleaved (so a change of the
machine's load hits both), report the median samples/s and the ratio. Target: ratio >=
0.95, with the phase split adding up to the step loop time within 5 %.

Run when the machine is quiet (uptime load < 1):
  .venv-train/bin/python benchmarks/bench_train_overhead.py [--samples 30000] [--repeats 5]
      [--variants default,plain,host,spe1] [--json benchmarks/out/train_overhead.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--samples",
        type=int,
        default=30000,
        help="training samples (default 30000: the default config's train split)",
    )
    ap.add_argument("--batch", type=int, default=75)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--variants",
        default="default,plain,host,spe1",
        help="hvdscale variants besides Keras: default (config defaults), plain (no timed calls), "
        "host (batches from host arrays), spe1 (steps_per_execution 1)",
    )
    ap.add_argument(
        "--keras-spe",
        type=int,
        default=64,
        help="also time model.fit compiled with this steps_per_execution "
        "(information only; 1: skip)",
    )
    ap.add_argument("--json", help="also write the figures to this JSON file")
    args = ap.parse_args(argv)
    load0 = os.getloadavg()[0]

    from hvdscale.worker import WorkerInfo

    worker = WorkerInfo.init()  # HVD: as in hvdscale train (one worker)
    import numpy as np
    import tensorflow as tf

    from hvdscale.config import validate_config
    from hvdscale.model import build_model
    from hvdscale.train import StepProgram, pin_device, run_epoch_steps

    device, desc = pin_device(worker, 1)
    cfg = validate_config({})
    tcfg = cfg["training"]
    rng = np.random.default_rng(0)
    n, B = args.samples, args.batch
    x = rng.standard_normal((n, cfg["data"]["n_points"], 3)).astype(np.float32)
    y = rng.standard_normal((n, 2)).astype(np.float32)
    x_test, y_test = x[: n // 4], y[: n // 4]
    steps = n // B

    def make_program(in_device_memory):
        tf.keras.utils.set_random_seed(1)
        model = build_model(cfg)
        opt = tf.keras.optimizers.Adam(learning_rate=tcfg["learning_rate"])
        opt.build(model.trainable_variables)
        prog = StepProgram(
            model=model,
            optimizer=opt,
            worker=worker,
            x_train=x,
            y_train=y,
            x_test=x_test,
            y_test=y_test,
            batch=B,
            device=device,
            in_device_memory=in_device_memory,
            compression="none",
            backward_passes_per_step=1,
        )
        return prog

    variants = {
        "default": dict(
            dev=tcfg["data_in_device_memory"],
            spe=tcfg["steps_per_execution"],
            k=tcfg["instrument_every"],
        ),
        "plain": dict(dev=tcfg["data_in_device_memory"], spe=tcfg["steps_per_execution"], k=0),
        "host": dict(dev=False, spe=tcfg["steps_per_execution"], k=tcfg["instrument_every"]),
        "spe1": dict(dev=tcfg["data_in_device_memory"], spe=1, k=tcfg["instrument_every"]),
    }
    chosen = [v for v in args.variants.split(",") if v]
    progs = {}
    for v in chosen:
        p = make_program(variants[v]["dev"])
        p.warm_up(variants[v]["spe"])
        progs[v] = p

    def hvd_epoch(v, epoch):
        p, o = progs[v], variants[v]
        perm = np.random.default_rng([1, epoch]).permutation(n)
        timer, (loss_sum, phases, dispatch, t_train) = run_epoch_steps(
            p, perm, steps, o["spe"], o["k"]
        )
        timer.phase_sums = list(phases)
        timer.dispatch_sum = dispatch
        timer.train_wall = t_train
        tot = timer.totals()
        split = sum(tot[f"time_{ph}_s"] for ph in ("data", "compute", "sync", "update"))
        return steps * B / t_train, abs(split - t_train) / t_train if timer.timed_steps else None

    tf.keras.utils.set_random_seed(1)
    kmodel = build_model(cfg)
    kmodel.compile(
        optimizer=tf.keras.optimizers.Adam(learning_rate=tcfg["learning_rate"]), loss="mse"
    )

    def keras_epoch(m=None):
        t0 = time.perf_counter()
        (m or kmodel).fit(x, y, batch_size=B, epochs=1, shuffle=True, verbose=0)
        return (n // B * B) / (time.perf_counter() - t0)

    kmodel_spe = None
    if args.keras_spe > 1:  # for information: Keras with the same steps per call
        tf.keras.utils.set_random_seed(1)
        kmodel_spe = build_model(cfg)
        kmodel_spe.compile(
            optimizer=tf.keras.optimizers.Adam(learning_rate=tcfg["learning_rate"]),
            loss="mse",
            steps_per_execution=args.keras_spe,
        )

    # warm-up (not counted)
    keras_epoch()
    if kmodel_spe is not None:
        keras_epoch(kmodel_spe)
    for v in chosen:
        hvd_epoch(v, 0)
    res = {"keras": []}
    if kmodel_spe is not None:
        res["keras_spe"] = []
    split = {v: [] for v in chosen}
    for v in chosen:
        res[v] = []
    for r in range(args.repeats):
        res["keras"].append(keras_epoch())
        if kmodel_spe is not None:
            res["keras_spe"].append(keras_epoch(kmodel_spe))
        for v in chosen:
            thr, err = hvd_epoch(v, r + 1)
            res[v].append(thr)
            split[v].append(err)
    load = os.getloadavg()[0]  # includes this benchmark's own thread
    med = {k: statistics.median(v) for k, v in res.items()}
    print(
        f"device {desc}; {n} samples, batch {B}, {args.repeats} repeats (median); "
        f"load average {load0:.2f} "
        f"before, {load:.2f} after"
    )
    print(f"{'keras model.fit':28s} {med['keras']:9.0f} samples/s  (reference)")
    if kmodel_spe is not None:
        print(
            f"{'keras fit, ' + str(args.keras_spe) + ' steps/call':28s} "
            f"{med['keras_spe']:9.0f} samples/s  "
            f"ratio {med['keras_spe'] / med['keras']:.3f}  (information only)"
        )
    for v in chosen:
        o = variants[v]
        errs = [e for e in split[v] if e is not None]
        serr = f"split adds up within {max(errs):.1%}" if errs else "no timed steps"
        print(
            f"{'hvdscale ' + v:28s} {med[v]:9.0f} samples/s  ratio {med[v] / med['keras']:.3f}  "
            f"(device memory {o['dev']}, steps/call {o['spe']}, "
            f"instrument_every {o['k'] or 'off'}; "
            f"{serr})"
        )
    out = {
        "keras_samples_per_s": med["keras"],
        "keras_spe_samples_per_s": med.get("keras_spe"),
        "load_average_before": load0,
        "load_average_after": load,
        "samples": n,
        "batch": B,
        "repeats": args.repeats,
        "runs": res,
        "variants": {
            v: {
                "samples_per_s": med[v],
                "ratio": med[v] / med["keras"],
                **variants[v],
                "split_error_max": max([e for e in split[v] if e is not None], default=None),
            }
            for v in chosen
        },
    }
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2))
    ok = med.get("default", med["keras"]) / med["keras"] >= 0.95
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
