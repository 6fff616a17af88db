"""The arithmetic and the compilation of a torch-ddp step: ``training.precision`` and
``training.compile`` (issue 32, "each framework at its best").

Precision (mixed: the weights, their gradients and KerasAdam's moments stay float32):

* ``fp32``: float32 throughout; on a GPU TF32 matrix multiplies are switched *off*
  explicitly (``torch.backends.cuda.matmul.allow_tf32``), so a changed torch default
  cannot slip a different arithmetic into an fp32 run.
* ``tf32``: float32 tensors, TF32 matrix multiplies (GPUs of compute capability >= 8.0).
* ``bf16``: forward pass and loss under ``torch.autocast(dtype=torch.bfloat16)`` (CPU and
  GPU; no loss scaling: bfloat16 has float32's exponent range).
* ``fp16``: the same with float16 and dynamic loss scaling (``torch.amp.GradScaler``): the
  loss is scaled before the backward pass, the gradients unscaled before the update, and an
  update with non-finite gradients is skipped (the scale halves). GPU only.

The evaluation (validation and test losses) runs in float32 (the settings change how the
network is trained, not how its result is measured); TF32 applies to it too.

Compilation (``compiled``): ``off`` is eager; ``default`` is ``torch.compile`` with its
default mode; ``max`` is ``mode="max-autotune-no-cudagraphs"`` on a CPU and
``"reduce-overhead"`` (CUDA graphs) on a GPU. DDP wraps the compiled network
(``DDP(torch.compile(net))``), so DDP's reducer, ``no_sync`` and communication hook work
as in eager mode, outside the compiled graphs. The other order (``torch.compile(ddp)``,
TorchDynamo's DDPOptimizer splitting the graph at DDP's buckets) breaks the graph in DDP's
own forward under torch 2.13 (its logger) and compiled nothing. What the chosen order
gives up: the backward pass is one compiled graph, so DDP's allreduce starts when the
whole gradient is ready instead of bucket by bucket. For this network that costs nothing:
its 153,441 float32 parameters (0.6 MB) fit DDP's first bucket (1 MB), so in eager mode
too the one bucket's allreduce starts after the last gradient. The optimizer update stays
eager (its learning rate is a Python number that changes every
update; KerasAdam uses multi-tensor ``torch._foreach_*`` ops). Shapes are static
(``dynamic=False``: every step has the run's batch). Inductor's compiled kernels are cached
on disk (``TORCHINDUCTOR_CACHE_DIR``; the trainer points it into the study's results
folder, ``cache/torchinductor``, unless it is set), so runs of one study after the first
load them instead of compiling again. Whether they did is in the record
(``compile_cache_facts``): the cache lookups of the warm-up that hit and missed, counted by
torch itself (``torch._dynamo.utils.counters``: Inductor's FX graph cache, one lookup per
compiled forward and backward graph, plus AOTAutograd's cache, one per compiled region,
which wraps the FX graphs: a second run of one study hits both), and the cache folder.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import torch

from hvdscale.errors import UserError

#: precision -> the autocast dtype (mixed precision); fp32 / tf32 run without autocast
AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}
#: precisions a CPU cannot run (config.load refuses them for partitions without GPUs)
GPU_ONLY = ("fp16", "tf32")


def check_precision(precision: str, device: torch.device, run_id: str) -> None:
    """A UserError naming the run when ``device`` cannot run ``precision``."""
    if device.type != "cuda":
        if precision in GPU_ONLY:
            raise UserError(
                f"run {run_id}: training.precision {precision!r} needs a GPU, and this rank "
                f"runs on the CPU; on a CPU use fp32 or bf16"
            )
        return
    cap = torch.cuda.get_device_capability(device)
    name = torch.cuda.get_device_name(device)
    if precision == "tf32" and cap < (8, 0):
        raise UserError(
            f"run {run_id}: training.precision 'tf32' needs a GPU of compute capability "
            f"8.0 or later; {name} has {cap[0]}.{cap[1]}"
        )
    if precision == "bf16" and not torch.cuda.is_bf16_supported():
        raise UserError(f"run {run_id}: training.precision 'bf16': {name} has no bfloat16")


def set_matmul_precision(precision: str) -> None:
    """TF32 matrix multiplies on for ``tf32``, explicitly off otherwise."""
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32


def autocast(precision: str, device: torch.device):
    """The context of a step's forward pass and loss."""
    dtype = AUTOCAST.get(precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def grad_scaler(precision: str, device: torch.device):
    """fp16's loss scaler (None for the other precisions)."""
    if precision != "fp16":
        return None
    return torch.amp.GradScaler(device.type)


def compile_mode(setting: str, device: torch.device) -> str | None:
    """``torch.compile``'s mode for ``training.compile`` on ``device``; None: eager."""
    if setting == "off":
        return None
    if setting == "default":
        return "default"
    if setting == "max":
        return "reduce-overhead" if device.type == "cuda" else "max-autotune-no-cudagraphs"
    raise ValueError(f"training.compile: {setting!r}; expected off, default or max")


def compiled(module, setting: str, device: torch.device):
    """``module`` compiled for ``setting`` (itself when off)."""
    mode = compile_mode(setting, device)
    if mode is None:
        return module
    return torch.compile(module, mode=mode, dynamic=False)


def use_compile_cache(out_dir: Path | None, env=None) -> str | None:
    """Point Inductor's on-disk cache into the study's results folder (results/cache/
    torchinductor for a run folder results/runs/RUN_ID) unless TORCHINDUCTOR_CACHE_DIR is
    set; returns the folder in use (None: Inductor's default, for a run folder outside a
    ``runs`` folder)."""
    env = os.environ if env is None else env
    if env.get("TORCHINDUCTOR_CACHE_DIR"):
        return env["TORCHINDUCTOR_CACHE_DIR"]
    if out_dir is None or Path(out_dir).resolve().parent.name != "runs":
        return None  # not a study's run folder: Inductor's default (/tmp/torchinductor_USER)
    cache = Path(out_dir).resolve().parent.parent / "cache" / "torchinductor"
    env["TORCHINDUCTOR_CACHE_DIR"] = str(cache)
    return str(cache)


#: torch's counters of compiled-graph cache lookups (``torch._dynamo.utils.counters``,
#: torch 2.13): Inductor's FX graph cache and AOTAutograd's cache, (group, hit, miss)
CACHE_COUNTERS = (
    ("inductor", "fxgraph_cache_hit", "fxgraph_cache_miss"),
    ("aot_autograd", "autograd_cache_hit", "autograd_cache_miss"),
)


def cache_counts() -> tuple[int, int]:
    """(hits, misses) of the compiled-graph caches in this process so far, summed over
    ``CACHE_COUNTERS`` (counters torch does not have count 0)."""
    from torch._dynamo.utils import counters  # reason: torch's private counters

    hits = sum(int(counters[group][hit]) for group, hit, _ in CACHE_COUNTERS)
    misses = sum(int(counters[group][miss]) for group, _, miss in CACHE_COUNTERS)
    return hits, misses


def inductor_cache_dir() -> str:
    """The folder Inductor's on-disk cache uses (TORCHINDUCTOR_CACHE_DIR, else its default
    /tmp/torchinductor_USER), absolute."""
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir
    except ImportError:  # another torch: the variable, as Inductor reads it
        return os.path.abspath(os.environ.get("TORCHINDUCTOR_CACHE_DIR", "torchinductor"))
    return cache_dir()


def compile_cache_facts(before: tuple[int, int] | None) -> dict:
    """The record's ``compile_cache_hits``, ``compile_cache_misses`` and
    ``compile_cache_dir``: the lookups since ``before`` (``cache_counts()`` taken before the
    compilation) and Inductor's cache folder; all None for an eager run (``before`` None)."""
    if before is None:
        return {"compile_cache_hits": None, "compile_cache_misses": None,
                "compile_cache_dir": None}  # fmt: skip
    hits, misses = cache_counts()
    return {
        "compile_cache_hits": hits - before[0],
        "compile_cache_misses": misses - before[1],
        "compile_cache_dir": inductor_cache_dir(),
    }
