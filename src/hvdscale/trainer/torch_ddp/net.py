"""The stress-strain network, its optimizer and learning rate in PyTorch, with the
semantics of the Keras ones (``hvdscale.trainer.horovod_tf.model``,
``hvdscale.trainer.horovod_tf.optim``):

- the same layers: Flatten of the (n_points, 3) curve in row-major order, Dense layers
  ``model.hidden_units`` with ``model.activation``, 2 linear outputs; Keras' default
  initialisation (Glorot-uniform kernels, zero biases); the same parameter count;
- Adam with Keras 2.15's update rule and defaults (beta 0.9/0.999, epsilon 1e-7 added to
  sqrt(v) *without* bias correction, unlike ``torch.optim.Adam``), ``KerasAdam``;
- the run's LR rule (``matrix.runtable.learning_rate_for``) and warm-up ramp over optimizer
  updates (``trainer.schedule.warmup_updates`` / ``warmup_lr``).

A Keras kernel is (in, out), a torch Linear weight (out, in): ``load_keras_weights``
transposes (the cross-framework test loads Keras' weights this way).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from hvdscale.matrix.runtable import learning_rate_for
from hvdscale.trainer.model import N_CHANNELS, N_LABELS, check_parameter_count
from hvdscale.trainer.schedule import warmup_lr, warmup_updates
from hvdscale.workload.base import is_default, workload_for

#: Keras activation name -> torch module (Keras' gelu is the exact one, swish = SiLU)
ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "gelu": nn.GELU, "swish": nn.SiLU}
KERAS_ADAM = {"betas": (0.9, 0.999), "eps": 1e-7}  # tf.keras.optimizers.Adam defaults


def build_net(cfg: dict) -> nn.Sequential:
    """The network for ``cfg`` with Keras' default initialisation (seed torch first)."""
    if not is_default(cfg):
        return _workload_net(cfg)
    n_points = cfg["data"]["n_points"]
    act = ACTIVATIONS[cfg["model"]["activation"]]
    layers: list[nn.Module] = [nn.Flatten()]
    width = n_points * N_CHANNELS
    for units in cfg["model"]["hidden_units"]:
        layers += [nn.Linear(width, units), act()]
        width = units
    layers.append(nn.Linear(width, N_LABELS))
    net = nn.Sequential(*layers)
    for m in net:
        if isinstance(m, nn.Linear):
            nn.init.xavier_uniform_(m.weight)  # = Keras glorot_uniform
            nn.init.zeros_(m.bias)
    n = sum(p.numel() for p in net.parameters() if p.requires_grad)
    expected = check_parameter_count(cfg)
    if n != expected:  # the closed form and torch must agree
        raise RuntimeError(f"model has {n} parameters, closed form says {expected}")
    return net


class ChannelsFirst(nn.Module):
    """(n, H, W, C) samples, as Keras reads them, to torch's (n, C, H, W)."""

    def forward(self, x):
        return x.permute(0, 3, 1, 2)


def torch_layers(layers, sample_shape) -> list[nn.Module]:
    """torch modules of a workload's layer description (``hvdscale.workload.base``), with
    Keras' default initialisation (Glorot-uniform kernels, zero biases)."""
    out: list[nn.Module] = []
    shape = tuple(sample_shape)
    if layers and layers[0][0] == "conv2d":
        out.append(ChannelsFirst())
    for layer in layers:
        kind = layer[0]
        if kind == "conv2d":
            f, k = int(layer[1]), int(layer[2])
            out.append(nn.Conv2d(shape[2], f, k))
            if layer[3]:
                out.append(ACTIVATIONS[layer[3]]())
            shape = (shape[0] - k + 1, shape[1] - k + 1, f)
        elif kind == "maxpool2d":
            s = int(layer[1])
            out.append(nn.MaxPool2d(s))
            shape = (shape[0] // s, shape[1] // s, shape[2])
        elif kind == "flatten":
            out.append(nn.Flatten())
            shape = (int(np.prod(shape)),)
        else:
            out.append(nn.Linear(shape[0], int(layer[1])))
            if layer[2]:
                out.append(ACTIVATIONS[layer[2]]())
            shape = (int(layer[1]),)
    for m in out:
        if isinstance(m, nn.Linear | nn.Conv2d):
            nn.init.xavier_uniform_(m.weight)  # = Keras glorot_uniform (fans include the kernel)
            nn.init.zeros_(m.bias)
    return out


def _workload_net(cfg: dict) -> nn.Module:
    """Another workload's network: its ``torch_module(cfg)``, else its layer description."""
    wl = workload_for(cfg)
    layers = wl.layers(cfg)
    net = (
        wl.torch_module(cfg)
        if layers is None
        else nn.Sequential(*torch_layers(layers, wl.layout(cfg).sample_shape))
    )
    n = sum(p.numel() for p in net.parameters() if p.requires_grad)
    expected = check_parameter_count(cfg)
    if n != expected:
        raise RuntimeError(f"model has {n} parameters, the workload says {expected}")
    return net


def linear_layers(net: nn.Module) -> list[nn.Linear]:
    return [m for m in net.modules() if isinstance(m, nn.Linear)]


def load_keras_weights(net: nn.Module, weights: list[np.ndarray]) -> None:
    """Keras ``model.get_weights()`` order (kernel, bias per Dense) into ``net``."""
    layers = linear_layers(net)
    if len(weights) != 2 * len(layers):
        raise ValueError(f"{len(weights)} Keras arrays for {len(layers)} Linear layers")
    with torch.no_grad():
        for i, lin in enumerate(layers):
            lin.weight.copy_(torch.from_numpy(np.asarray(weights[2 * i]).T.copy()))
            lin.bias.copy_(torch.from_numpy(np.asarray(weights[2 * i + 1])))


def keras_order_weights(net: nn.Module) -> list[np.ndarray]:
    """The weights in Keras' order and layout (kernels transposed to (in, out))."""
    out = []
    for m in net.modules():
        if isinstance(m, nn.Linear):
            w = m.weight.detach().cpu().numpy().T.copy()
        elif isinstance(m, nn.Conv2d):  # torch (out, in, kh, kw) -> Keras (kh, kw, in, out)
            w = m.weight.detach().cpu().numpy().transpose(2, 3, 1, 0).copy()
        else:
            continue
        out += [w, m.bias.detach().cpu().numpy().copy()]
    return out


class KerasAdam(torch.optim.Optimizer):
    """Adam as tf.keras.optimizers.Adam (Keras 2.15) applies it: with t = update + 1,
    alpha = lr * sqrt(1 - b2^t) / (1 - b1^t); m += (g - m)(1 - b1); v += (g^2 - v)(1 - b2);
    w -= alpha * m / (sqrt(v) + eps), with multi-tensor ``torch._foreach_*`` ops (the same
    element-wise arithmetic, a few kernels per update instead of five per tensor).
    ``iterations`` (Keras' name) counts the updates and is saved with the state
    (``param_groups``)."""

    def __init__(self, params, lr: float, betas=KERAS_ADAM["betas"], eps=KERAS_ADAM["eps"]):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "iterations": 0})

    @property
    def iterations(self) -> int:
        return int(self.param_groups[0]["iterations"])

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            t = group["iterations"] + 1
            b1, b2 = group["betas"]
            alpha = group["lr"] * math.sqrt(1.0 - b2**t) / (1.0 - b1**t)
            params = [p for p in group["params"] if p.grad is not None]
            for p in params:
                st = self.state[p]
                if not st:
                    st["m"] = torch.zeros_like(p)
                    st["v"] = torch.zeros_like(p)
            if params:  # multi-tensor ops: a few kernels for all tensors (GPU launches)
                grads = [p.grad for p in params]
                ms = [self.state[p]["m"] for p in params]
                vs = [self.state[p]["v"] for p in params]
                torch._foreach_lerp_(ms, grads, 1.0 - b1)
                torch._foreach_mul_(vs, b2)
                torch._foreach_addcmul_(vs, grads, grads, value=1.0 - b2)
                denom = torch._foreach_sqrt(vs)
                torch._foreach_add_(denom, group["eps"])
                torch._foreach_addcdiv_(params, ms, denom, value=-alpha)
            group["iterations"] = t
        return None


@dataclass
class TorchOptimisation:
    """The torch counterpart of ``trainer.horovod_tf.optim.Optimisation``: the network,
    KerasAdam, and the learning rate of every update (``set_lr`` before each)."""

    net: nn.Module
    optimizer: KerasAdam
    lr_base: float
    lr: float
    ramp: int  # warm-up updates (0: none)
    n_params: int
    loss: str = "mse"  # the workload's loss (hvdscale.workload)

    @classmethod
    def build(cls, cfg: dict, lr_rule: str, workers: int, steps: int, seed: int | None = None,
              device: torch.device | None = None):  # fmt: skip
        """Seeded weights (drawn on the CPU, so a GPU run starts from the same ones), then
        the network on ``device``; KerasAdam's moments are made beside the weights."""
        tcfg = cfg["training"]
        torch.manual_seed(cfg["seed"] if seed is None else int(seed))
        net = build_net(cfg)
        if device is not None:
            net = net.to(device)
        lr_base = tcfg["learning_rate"]
        lr = learning_rate_for(lr_base, lr_rule, workers)
        ramp = warmup_updates(tcfg, lr_base, lr, steps)
        opt = KerasAdam(net.parameters(), lr=lr if not ramp else lr_base)
        return cls(net, opt, lr_base, lr, ramp, check_parameter_count(cfg), workload_for(cfg).loss)

    def current_lr(self) -> float:
        """The learning rate of the next update (Keras: the schedule at ``iterations``)."""
        if not self.ramp:
            return float(self.lr)
        return warmup_lr(self.lr_base, self.lr, self.ramp, self.optimizer.iterations)

    def set_lr(self) -> None:
        for g in self.optimizer.param_groups:
            g["lr"] = self.current_lr()

    def weights_sha256(self) -> str:
        """sha256 of the float32 weights in Keras' variable order and layout."""
        h = hashlib.sha256()
        for w in keras_order_weights(self.net):
            h.update(np.ascontiguousarray(w, dtype=np.float32).tobytes())
        return h.hexdigest()

    def checkpoint(self) -> TorchCheckpoint:
        return TorchCheckpoint(self)

    def broadcast(self, worker) -> None:
        """Rank 0's weights and optimizer state on every rank (fresh start or resumed;
        DDP's constructor broadcasts the weights too, this covers the Adam moments)."""
        if worker.distributed:
            state = worker.broadcast_object(
                to_cpu({"net": self.net.state_dict(), "opt": self.optimizer.state_dict()})
            )  # host tensors: unpickled on another rank they must not land on GPU 0
            self.net.load_state_dict(state["net"])
            self.optimizer.load_state_dict(state["opt"])


def to_cpu(obj):
    """``obj`` (nested dicts, lists, tuples of tensors and plain values) with every tensor
    copied to the host; ``load_state_dict`` moves them back beside the weights."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(v) for v in obj)
    return obj


class _Restored:
    def assert_existing_objects_matched(self):  # what tf.train.Checkpoint.read returns
        return self


class TorchCheckpoint:
    """``tf.train.Checkpoint``'s write/read for ``trainer.checkpoint.Checkpointer``:
    PREFIX.pt holds the weights and the optimizer state, PREFIX.index (what
    ``find_checkpoint`` looks for) names it."""

    def __init__(self, optim: TorchOptimisation):
        self.optim = optim

    def write(self, prefix: str) -> None:
        state = {"net": self.optim.net.state_dict(), "opt": self.optim.optimizer.state_dict()}
        torch.save(to_cpu(state), prefix + ".pt")  # host tensors: resumable on any device
        with open(prefix + ".index", "w") as fh:
            fh.write("torch-ddp checkpoint: weights and KerasAdam state in the .pt file\n")

    def read(self, prefix: str) -> _Restored:
        state = torch.load(prefix + ".pt", weights_only=True, map_location="cpu")
        self.optim.net.load_state_dict(state["net"])
        self.optim.optimizer.load_state_dict(state["opt"])
        return _Restored()
