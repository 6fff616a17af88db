"""hvdscale's training step against Keras ``model.fit`` at its best settings, one rank,
and the cost of the instrumented sample (train env). The method is in
docs/performance.md ("hvdscale's step against Keras model.fit" and "Instrumentation
overhead"). hvdscale variants: default (the config defaults), plain (no timed calls),
inst (every ``--instrument-every``-th call timed; the overhead row pairs it with plain),
host (batches from host arrays), spe1 (steps_per_execution 1) and, for information, xla
(``training.compile: default``: the forward and backward pass XLA-compiled); Keras
candidates ``spe{1,64}jit{0,1}``. Writes benchmarks/results/bench_train_overhead.csv.

  .venv-train/bin/python benchmarks/bench_train_overhead.py [--samples 30000] [--repeats 7]
      [--variants default,plain,xla] [--keras spe1jit0,spe1jit1,spe64jit0,spe64jit1] [--csv FILE]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
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
    ap.add_argument("--samples", type=int, default=30000, help="training samples")
    ap.add_argument("--batch", type=int, default=75)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--variants", default="default,plain,inst,xla",
                    help="hvdscale: default,plain,inst,host,spe1,xla")  # fmt: skip
    ap.add_argument("--instrument-every", type=int, default=10,
                    help="variant inst: every k-th call instrumented (the instrumentation "
                    "overhead row compares it with plain, k = 0)")  # fmt: skip
    ap.add_argument("--keras", default="spe1jit0,spe1jit1,spe64jit0,spe64jit1")
    ap.add_argument("--core", type=int, default=0, help="pin the process to this core")
    ap.add_argument("--csv", help="default: benchmarks/results/bench_train_overhead.csv")
    add_quiet_args(ap)
    args = ap.parse_args(argv)
    configure_quiet(args)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {args.core})  # before any thread exists, like every arm

    with Measured("bench_train_overhead") as meas:
        res, keras_cfg, hvd_cfg, extra, round_cpu = run(args)
    fields = round_fields(meas.fields(), round_cpu)
    med = {k: statistics.median(v) for k, v in res.items()}
    kbest = max(keras_cfg, key=lambda k: med[k])
    rows = []
    for k, v in res.items():
        m, lo, hi = median_interval(v, name="benchmark")
        rm, rlo, rhi = median_interval([a / b for a, b in zip(v, res[kbest])], name="benchmark")
        kind = "keras" if k in keras_cfg else "hvdscale"
        rows.append({"variant": k, "kind": kind, **(keras_cfg.get(k) or hvd_cfg.get(k)),
                     "samples_per_s": m, "samples_per_s_ci_low": lo, "samples_per_s_ci_high": hi,
                     "ratio_vs_keras_best": rm, "ratio_ci_low": rlo, "ratio_ci_high": rhi,
                     "keras_best": kbest, "repeats": len(v), "samples": args.samples,
                     "batch": args.batch, "core": args.core, **extra.get(k, {}),
                     **fields})  # fmt: skip
    if "plain" in res and "inst" in res:
        rows.append(overhead_row(res, hvd_cfg, args, fields))
    print(
        f"{args.samples} samples, batch {args.batch}, {args.repeats} rounds, core {args.core}; "
        f"load {meas.before:.2f} before, {meas.after:.2f} after"
    )
    for r in rows:
        if r["kind"] == "overhead":  # printed by overhead_row
            continue
        ci = "(n<3)" if r["ratio_ci_low"] is None else (
            f"({r['ratio_ci_low']:.3f}-{r['ratio_ci_high']:.3f})")  # fmt: skip
        print(
            f"  {r['kind']:8s} {r['variant']:10s} {r['samples_per_s']:9.0f} samples/s  "
            f"/ keras best ({kbest}) {r['ratio_vs_keras_best']:.3f} {ci}"
        )
    write_csv("bench_train_overhead", rows, args.csv)
    return 0


def round_fields(fields: dict, round_cpu: list[float | None]) -> dict:
    """The run's fields with foreign_cpu = the highest of the whole run and of every round
    (a burst in one round distorts that round's paired ratios)."""
    from _quiet import validity

    vals = [fields["foreign_cpu"], *round_cpu]
    worst = None if any(v is None for v in vals) else max(vals)
    ok, why = validity(worst)
    rounds = " ".join("" if v is None else f"{v:.3f}" for v in round_cpu)
    return {
        **fields,
        "foreign_cpu": worst,
        "foreign_cpu_rounds": rounds,
        "valid": "true" if ok else "false",
        "invalid_reason": why,
    }


def overhead_row(res: dict, hvd_cfg: dict, args, fields: dict) -> dict:
    """``instrumentation_overhead``: epoch time with every k-th call instrumented over
    epoch time with none, minus 1, per round (paired); goal <= 0.02."""
    per_round = [p / i - 1.0 for i, p in zip(res["inst"], res["plain"])]  # t_inst/t_plain - 1
    m, lo, hi = median_interval(per_round, name="benchmark")
    print(
        f"  instrumentation overhead (instrument_every {args.instrument_every} vs 0): "
        f"{100 * m:.2f} % of epoch time (goal <= 2 %)"
    )
    return {
        "variant": "instrumentation_overhead",
        "kind": "overhead",
        **hvd_cfg["inst"],
        "overhead": m,
        "overhead_ci_low": lo,
        "overhead_ci_high": hi,
        "overhead_goal": 0.02,
        "repeats": len(per_round),
        "samples": args.samples,
        "batch": args.batch,
        "core": args.core,
        **fields,
    }


def run(args):
    from hvdscale.trainer.worker import WorkerInfo

    worker = WorkerInfo.init()  # HVD: as in hvdscale train (one worker)
    import numpy as np
    import tensorflow as tf
    from _keras_arm import KerasArm

    from hvdscale.config.load import validate_config
    from hvdscale.trainer.horovod_tf.model import build_model
    from hvdscale.trainer.horovod_tf.step import build_step_program
    from hvdscale.trainer.loop import run_epoch_steps
    from hvdscale.trainer.placement import pin_device

    device, _desc = pin_device(worker, 1)
    cfg = validate_config({})
    tcfg = cfg["training"]
    rng = np.random.default_rng(0)
    n, B = args.samples, args.batch
    x = rng.standard_normal((n, cfg["data"]["n_points"], 3)).astype(np.float32)
    y = rng.standard_normal((n, 2)).astype(np.float32)
    x_test, y_test = x[: n // 4], y[: n // 4]
    steps = n // B
    lr = tcfg["learning_rate"]

    base = {"in_device_memory": tcfg["data_in_device_memory"], "spe": tcfg["steps_per_execution"]}
    base["instrument_every"] = tcfg["instrument_every"]
    hvd_cfg = {
        "default": base,
        "plain": {**base, "instrument_every": 0},
        "host": {**base, "in_device_memory": False},
        "xla": base,  # training.compile default: forward+backward XLA-compiled
        "inst": {**base, "instrument_every": args.instrument_every},
        "spe1": {**base, "spe": 1},
    }
    hvd_cfg = {v: hvd_cfg[v] for v in args.variants.split(",") if v}
    keras_cfg = {}
    for k in filter(None, args.keras.split(",")):
        spe, jit = k.removeprefix("spe").split("jit")
        keras_cfg[f"keras_{k}"] = {"spe": int(spe), "jit": int(jit)}

    progs = {}
    for v, o in hvd_cfg.items():
        tf.keras.utils.set_random_seed(1)
        model = build_model(cfg)
        opt = tf.keras.optimizers.Adam(learning_rate=lr)
        opt.build(model.trainable_variables)
        progs[v] = build_step_program(
            model,
            opt,
            worker,
            {**tcfg, "compile": "default"} if v == "xla" else tcfg,
            train=(x, y),
            test=(x_test, y_test),
            batch=B,
            device=device,
            in_device_memory=o["in_device_memory"],
        )
        progs[v].warm_up(o["spe"])
    arms = {}
    for k, o in keras_cfg.items():
        tf.keras.utils.set_random_seed(1)
        arms[k] = KerasArm(
            tf, lambda: build_model(cfg), x, y, B, steps, lr=lr, spe=o["spe"], jit=o["jit"]
        )
    data_share: dict = {v: [] for v in hvd_cfg}

    def one_epoch(k, epoch):
        perm = np.random.default_rng([1, epoch]).permutation(n)  # outside the clock
        if k in arms:
            return steps * B / arms[k].epoch(perm)
        o = hvd_cfg[k]
        timer, (_l, ph, _d, t_train) = run_epoch_steps(
            progs[k], perm, steps, o["spe"], o["instrument_every"]
        )
        if timer.timed_steps:
            data_share[k].append(float(ph[0]) / float(sum(ph)))
        return steps * B / t_train

    names = list(keras_cfg) + list(hvd_cfg)
    for k in names:  # warm-up (tracing, first calls)
        one_epoch(k, 0)
    from _quiet import CpuMeter

    res = {k: [] for k in names}
    round_cpu = []
    for r in range(args.repeats):
        order = names if r % 2 == 0 else names[::-1]
        meter = CpuMeter(sample_tree=False).start()  # one process: getrusage is exact
        for k in order:
            res[k].append(one_epoch(k, r + 1))
        round_cpu.append(meter.stop()[0])
    extra = {k: {"data_share": statistics.median(v) if v else None} for k, v in data_share.items()}
    return res, keras_cfg, hvd_cfg, extra, round_cpu


if __name__ == "__main__":
    sys.exit(main())
