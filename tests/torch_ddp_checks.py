"""Checks that tests/test_torch_ddp.py runs in the train env (.venv-train), one framework
per process, each writing its result to an npz file:

  python tests/torch_ddp_checks.py keras OUT.npz
      the Keras model (hvdscale.trainer.horovod_tf.model.build_model, seeded), a batch, its
      loss, and the weights after one Adam step (tf.keras.optimizers.Adam, LR_STEP) on
      that batch
  python tests/torch_ddp_checks.py torch KERAS.npz OUT.npz
      the same from the torch network with the Keras weights loaded (KerasAdam)
  python tests/torch_ddp_checks.py lr keras|torch
      the learning rate of updates 0..LR_UPDATES-1 of a 2-worker run with the linear LR
      rule and one warm-up epoch of LR_STEPS updates (JSON list on stdout)
  torchrun --standalone --nproc-per-node N tests/torch_ddp_checks.py ddp-step OUT.npz [timed]
      one TorchStepProgram step of the same global batch (GLOBAL_BATCH rows), each of the
      N ranks on its contiguous part; rank 0 writes the weights after the step
  horovodrun -np N --gloo python tests/torch_ddp_checks.py hvd-step OUT.npz [timed]
      the same with the Horovod trainer's StepProgram (Keras model, Adam, the grouped
      allreduce average): both frameworks' gradient average is checked alike
"""

from __future__ import annotations

import sys

import numpy as np

from hvdscale.config.load import validate_config

LR_STEP = 1e-3
GLOBAL_BATCH = 16
LR_STEPS, LR_UPDATES = 5, 9
SEED = 7


def config() -> dict:
    return validate_config({"seed": SEED, "training": {"learning_rate": LR_STEP}})


def batch(cfg: dict, n: int = GLOBAL_BATCH) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(SEED)
    x = rng.normal(size=(n, cfg["data"]["n_points"], 3)).astype(np.float32)
    y = rng.normal(size=(n, 2)).astype(np.float32)
    return x, y


def keras(out: str) -> None:
    import tensorflow as tf

    from hvdscale.trainer.horovod_tf.model import build_model

    cfg = config()
    tf.keras.utils.set_random_seed(SEED)
    model = build_model(cfg)
    x, y = batch(cfg)
    weights = model.get_weights()
    opt = tf.keras.optimizers.Adam(learning_rate=LR_STEP)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
    opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                            model.trainable_variables))  # fmt: skip
    arrays = {f"w{i}": w for i, w in enumerate(weights)}
    arrays.update({f"after{i}": w for i, w in enumerate(model.get_weights())})
    n = int(sum(int(np.prod(v.shape)) for v in model.trainable_variables))
    np.savez(out, x=x, y=y, loss=float(loss), n_params=n, epsilon=opt.epsilon, **arrays)


def torch_side(keras_npz: str, out: str) -> None:
    import torch

    from hvdscale.trainer.torch_ddp.net import (
        KerasAdam,
        build_net,
        keras_order_weights,
        load_keras_weights,
    )
    from hvdscale.trainer.torch_ddp.step import mse

    cfg = config()
    k = np.load(keras_npz)
    net = build_net(cfg)
    n_w = len([f for f in k.files if f.startswith("w")])
    load_keras_weights(net, [k[f"w{i}"] for i in range(n_w)])
    opt = KerasAdam(net.parameters(), lr=LR_STEP)
    loss = mse(net(torch.from_numpy(k["x"])), torch.from_numpy(k["y"]))
    loss.backward()
    opt.step()
    after = keras_order_weights(net)
    n = sum(p.numel() for p in net.parameters())
    np.savez(out, loss=float(loss.detach()), n_params=n, epsilon=opt.param_groups[0]["eps"],
             **{f"after{i}": w for i, w in enumerate(after)})  # fmt: skip


def ddp_step(out: str, timed: bool) -> None:
    from hvdscale.trainer.torch_ddp.dist import TorchWorker
    from hvdscale.trainer.torch_ddp.net import TorchOptimisation, keras_order_weights
    from hvdscale.trainer.torch_ddp.step import TorchStepProgram

    cfg = config()
    worker = TorchWorker.init("gloo")
    x, y = batch(cfg)
    part = GLOBAL_BATCH // worker.size
    lo, hi = worker.rank * part, (worker.rank + 1) * part
    optim = TorchOptimisation.build(cfg, "none", worker.size, steps=1, seed=SEED)
    program = TorchStepProgram(optim, worker, cfg["training"], train=(x[lo:hi], y[lo:hi]),
                               test=(x, y), val=(x, y), batch=part)  # fmt: skip
    program.start_epoch(np.arange(part))
    program.run_steps(0, 1, timed)
    if worker.is_root:
        np.savez(out, **{f"after{i}": w for i, w in enumerate(keras_order_weights(optim.net))})
    program.close()
    worker.shutdown()


def hvd_step(out: str, timed: bool, xla: bool = False) -> None:
    from hvdscale.trainer.horovod_tf.optim import Optimisation
    from hvdscale.trainer.horovod_tf.step import build_step_program
    from hvdscale.trainer.worker import WorkerInfo

    worker = WorkerInfo.init()  # HVD: hvd.init() first
    cfg = config()
    if xla:  # issue 32: the compute phase XLA-compiled; warm_up compiles and restores
        cfg["training"]["compile"] = "default"
    x, y = batch(cfg)
    part = GLOBAL_BATCH // worker.size
    lo, hi = worker.rank * part, (worker.rank + 1) * part
    optim = Optimisation.build(cfg, "none", worker.size, steps=1, seed=SEED)
    optim.broadcast(worker)
    program = build_step_program(
        optim.model, optim.optimizer, worker, cfg["training"], train=(x[lo:hi], y[lo:hi]),
        test=(x, y), val=(x, y), batch=part, device="/CPU:0",
    )  # fmt: skip
    before = optim.weights_sha256()
    program.warm_up(1)
    if xla and program._grad_fn is None:
        sys.exit("compile default built no XLA function")
    if optim.weights_sha256() != before or int(optim.optimizer.iterations.numpy()) != 0:
        sys.exit("warm_up changed the weights or the optimizer state")
    program.start_epoch(np.arange(part))
    program.run_steps(0, 1, timed)
    if worker.is_root:
        np.savez(out, **{f"after{i}": w for i, w in enumerate(optim.model.get_weights())})
    worker.barrier(name="done")


def learning_rates(framework: str) -> None:
    import json

    cfg = config()
    cfg["training"].update(lr_warmup=True, warmup_epochs=1)
    if framework == "keras":
        from hvdscale.trainer.horovod_tf.optim import Optimisation

        optim = Optimisation.build(cfg, "linear", 2, LR_STEPS, seed=SEED)
        it = optim.optimizer.iterations
    else:
        from hvdscale.trainer.torch_ddp.net import TorchOptimisation

        optim = TorchOptimisation.build(cfg, "linear", 2, LR_STEPS, seed=SEED)
    out = []
    for k in range(LR_UPDATES):
        if framework == "keras":
            it.assign(k)
        else:
            optim.optimizer.param_groups[0]["iterations"] = k
        out.append(optim.current_lr())
    print(json.dumps(out))


if __name__ == "__main__":
    what, *rest = sys.argv[1:]
    if what == "keras":
        keras(rest[0])
    elif what == "torch":
        torch_side(rest[0], rest[1])
    elif what == "lr":
        learning_rates(rest[0])
    elif what == "ddp-step":
        ddp_step(rest[0], timed=len(rest) > 1 and rest[1] == "timed")
    elif what == "hvd-step":
        hvd_step(rest[0], timed="timed" in rest[1:], xla="xla" in rest[1:])
    else:
        sys.exit(f"unknown check {what!r}")
