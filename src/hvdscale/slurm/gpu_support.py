"""GPUs the train env cannot use, refused or said before anything runs.

TensorFlow 2.15.1 (the pinned train env) is built against CUDA 12 for compute
capabilities sm_50 to sm_80 and compute_90 (TensorFlow's official build configuration), so
a K80 partition (3.7, the reference study's gpu2) cannot run it. A config whose run table
has a run on such a partition is refused by the config check (``unsupported_gpu_problems``,
read by ``validate_config``: ``hvdscale plan``, ``snakemake -n`` and every command stop
there) while the train env is the pinned one (deployment venv, or conda with the project's
envs/train.conda.yaml). With the site's own stack (env-modules, or conda with another env
file) the user may bring a CUDA-11 TensorFlow: then ``gpu_support_notes`` says it in
``hvdscale plan``, Snakemake's start banner and the report's overview. Which partitions have
GPUs: hvdscale.matrix.backends.partition_kind.
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
#: the conda env file of the pinned train env (config key environment.conda_env's default)
PINNED_CONDA_ENV = "envs/train.conda.yaml"


def pinned_train_env(cfg: dict) -> bool:
    """Whether the training jobs run the project's pinned TensorFlow 2.15.1: deployment
    venv (.venv-train, made by setup from the lock files), or conda with the project's
    env file; not with env-modules or another conda env file (the site's own stack)."""
    env = cfg.get("environment") or {}
    deployment = env.get("deployment", "venv")
    if deployment == "venv":
        return True
    return deployment == "conda" and env.get("conda_env", PINNED_CONDA_ENV) == PINNED_CONDA_ENV


def unsupported_gpu_problems(cfg: dict, partitions) -> list[str]:
    """One config problem per partition of ``partitions`` (those with runs in the run
    table) whose gpu_model the pinned TensorFlow cannot run, naming the partition, its
    compute capability and the way out; empty when the train env is the site's own
    (``pinned_train_env`` false: ``gpu_support_notes`` says it instead)."""
    if not pinned_train_env(cfg):
        return []
    parts = cfg.get("scaling", {}).get("partitions", {})
    problems = []
    for name in dict.fromkeys(partitions):
        part = parts.get(name, {})
        cc = compute_capability(part.get("gpu_model", ""))
        if not is_gpu_partition(part) or cc is None or cc >= TRAIN_ENV_MIN_CC:
            continue
        problems.append(
            f"config key scaling.partitions.{name}.gpu_model: {part['gpu_model']} has compute "
            f"capability {cc}, but the train env's TensorFlow 2.15.1 (CUDA 12) needs "
            f">= {TRAIN_ENV_MIN_CC}, so every run on partition {name!r} would fail on its "
            f"GPUs; drop {name} from scaling.sweeps (and the tuning sweep and calibration), "
            f"or leave it out with select, or run {name} in a config of its own with a "
            "CUDA-11 TensorFlow (<= 2.11) and Horovod built against it through "
            "environment.deployment env-modules (the site's modules) or conda with your own "
            "environment.conda_env"
        )
    return problems


def compute_capability(gpu_model: str) -> float | None:
    """Compute capability of a gpu_model such as "K80" or "Tesla K80" (None: unknown)."""
    words = str(gpu_model or "").upper().replace("-", " ").split()
    return next((COMPUTE_CAPABILITY[w] for w in words if w in COMPUTE_CAPABILITY), None)


def gpu_support_notes(cfg: dict) -> list[str]:
    """One sentence per swept GPU partition whose GPUs TF 2.15 (CUDA 12) cannot use, with
    what the user does instead, where the train env is the site's own (env-modules, or
    conda with another env file: it may be a CUDA-11 build); with the pinned train env the
    config check refuses such a partition instead (``unsupported_gpu_problems``). Empty
    when every swept partition is fine."""
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
        if pinned_train_env(cfg):  # refused by the config check (unsupported_gpu_problems)
            continue
        unless = f" unless environment: (deployment {deployment}) gives it a CUDA-11 build"
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
