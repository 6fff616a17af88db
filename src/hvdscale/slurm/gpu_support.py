"""GPUs the train env cannot use (issue 20), said before anything runs.

TensorFlow 2.15 (the train env) is built against CUDA 12, which needs compute capability
>= 5.0, so a K80 partition (3.7, the thesis's gpu2) fails at run time with it.
``hvdscale plan``, Snakemake's start banner and the report's overview read
``gpu_support_notes``. Which partitions have GPUs: hvdscale.matrix.backends.partition_kind.
"""

from __future__ import annotations

from hvdscale.matrix.backends import is_gpu_partition

#: compute capability per GPU model (scaling.partitions.*.gpu_model; NVIDIA's tables)
COMPUTE_CAPABILITY = {
    "K20": 3.5,
    "K40": 3.5,
    "K80": 3.7,
    "M40": 5.2,
    "M60": 5.2,
    "P100": 6.0,
    "V100": 7.0,
    "T4": 7.5,
    "A100": 8.0,
    "A40": 8.6,
    "H100": 9.0,
    "H200": 9.0,
}
#: TensorFlow 2.15 (the train env) is built against CUDA 12, whose oldest target is sm_50
TRAIN_ENV_MIN_CC = 5.0


def compute_capability(gpu_model: str) -> float | None:
    """Compute capability of a gpu_model such as "K80" or "Tesla K80" (None: unknown)."""
    words = str(gpu_model or "").upper().replace("-", " ").split()
    return next((COMPUTE_CAPABILITY[w] for w in words if w in COMPUTE_CAPABILITY), None)


def gpu_support_notes(cfg: dict) -> list[str]:
    """One sentence per swept GPU partition whose GPUs TF 2.15 (CUDA 12) cannot use, with
    what the user does instead. Empty when every swept partition is fine."""
    parts = cfg.get("scaling", {}).get("partitions", {})
    swept = dict.fromkeys(
        p for s in cfg.get("scaling", {}).get("sweeps", []) for p in s["partitions"]
    )
    deployment = (cfg.get("environment") or {}).get("deployment", "venv")
    notes = []
    for name in swept:
        part = parts.get(name, {})
        cc = compute_capability(part.get("gpu_model", ""))
        if not is_gpu_partition(part) or cc is None or cc >= TRAIN_ENV_MIN_CC:
            continue
        unless = (
            ""
            if deployment == "venv"  # .venv-train: TensorFlow 2.15
            else f" unless environment: (deployment {deployment}) gives it a CUDA-11 build"
        )
        notes.append(
            f"Partition {name} ({part['gpu_model']}, compute capability {cc}) cannot run "
            f"the train env's TensorFlow 2.15: its CUDA 12 needs compute capability >= "
            f"{TRAIN_ENV_MIN_CC}, so {name}'s runs would fail at run time{unless}. Instead "
            f"run {name} with a CUDA-11 TensorFlow (and Horovod built against it) through "
            "environment: (deployment env-modules or conda) in a config for select "
            f"'partition={name}', or drop {name} from the sweeps."
        )
    return notes + torch_gpu_notes(cfg, parts)


def torch_gpu_notes(cfg: dict, parts: dict) -> list[str]:
    """torch-ddp on GPU partitions: the train env's torch is the CPU build (issue 19); the
    NCCL path has run on one GPU (issue 33), never on several."""
    swept = dict.fromkeys(
        name
        for s in cfg.get("scaling", {}).get("sweeps", [])
        if "torch-ddp" in (s.get("frameworks") or [])
        for name in s["partitions"]
        if is_gpu_partition(parts.get(name, {}))
    )
    if not swept:
        return []
    names = ", ".join(swept)
    return [
        f"torch-ddp on GPU partition(s) {names}: the train env's torch 2.13.0 is the CPU "
        "build, so give these runs the site's CUDA build of PyTorch through environment: "
        "(env-modules or conda) or they fail at the first NCCL call. hvdscale's torch-ddp "
        "NCCL path has run on one GPU (an H200, one rank: docs/performance.md, 'One GPU'); "
        "with several GPUs it is untested and its scaling unmeasured."
    ]
