"""The horovod-tf framework: what ``trainer.rank.train_rank`` runs for a Horovod run with
TensorFlow 2 (``FRAMEWORK``, named in ``matrix.backends.TRAINERS``).

In the order of Horovod's TF2 examples: bind the rank's CPUs, ``hvd.init()``, pin one
device per local rank (``start``); the Keras model and Adam with the run's LR rule and
warm-up (``optim.Optimisation``), weights and optimizer state broadcast from rank 0; the
compiled step with the grouped gradient allreduce (``step.StepProgram``); a Horovod
timeline window (training.timeline_steps) or the launcher's whole-run timeline
(training.timeline), which the label proof reads; ``hvd.shutdown()`` at the end. Every
Horovod-specific line is marked ``# HVD:``. Nothing here imports TensorFlow or Horovod
at module level (the workflow env imports the package).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hvdscale.matrix import backends
from hvdscale.record.labelproof import prove
from hvdscale.slurm.threads import threads_for_rank
from hvdscale.trainer.horovod_tf.optim import Optimisation
from hvdscale.trainer.horovod_tf.step import build_step_program
from hvdscale.trainer.horovod_tf.xla_cache import cache_for_device, use_xla_cache
from hvdscale.trainer.loop import TimelineWindow
from hvdscale.trainer.placement import GpuDemand, bind_cpus, pin_device
from hvdscale.trainer.rank import Started
from hvdscale.trainer.worker import WorkerInfo, detect_launcher, launcher_rank_env


class HorovodTF:
    """Horovod with TensorFlow 2: ``hvdscale train``'s trainer for a run whose id names
    no framework."""

    name = backends.DEFAULT_FRAMEWORK
    log_name = "hvdscale train"
    record_config: dict = {}  # build_record's config block as it is
    compile_cache: str | None = None  # XLA's persistent cache folder (start sets it)

    @staticmethod
    def on_term(*_):
        # a launcher's SIGTERM (clean-up after another rank failed) ends this rank through
        # the normal exit path, so the exit marker says "143" and not "killed"
        sys.exit(143)

    def rank_env(self) -> dict:
        return launcher_rank_env()

    def start(self, args, run_, tcfg: dict, demand: GpuDemand | None = None) -> Started:
        bound = bind_cpus(tcfg.get("cpu_binding", "auto"))  # before any thread exists
        dynamic_timeline(tcfg, args.no_horovod)  # before hvd.init
        # issue 32: XLA's compiled programs cached in results/cache/xla (TF_XLA_FLAGS, read
        # when TensorFlow first lists its devices), GPU ranks only (xla_cache says why); the
        # step program counts the warm-up's hits and misses
        xla_flags_cache = (
            use_xla_cache(getattr(args, "out_dir", None)) if tcfg.get("compile", "off") != "off"
            else None
        )  # fmt: skip
        worker = WorkerInfo.init(use_horovod=not args.no_horovod)  # HVD: hvd.init() first
        threads = threads_for_rank(tcfg["threads_per_worker"], os.environ)
        device, desc = pin_device(worker, threads, demand)  # HVD: one per rank
        self.compile_cache = cache_for_device(xla_flags_cache, device)
        set_tf32(tcfg.get("precision", "fp32"))
        summary = f"{worker.size} worker(s), controller {worker.controller}, {desc}"
        if self.compile_cache:
            summary += f", XLA cache {self.compile_cache}"
        return Started(worker, device, desc, bound, summary)

    def optimisation(self, cfg: dict, run_, worker, steps: int, device) -> Optimisation:
        return Optimisation.build(cfg, run_.lr_rule, worker.size, steps, run_.seed)

    def step_program(self, optim, worker, tcfg, device, *, train, test, val, batch):
        return build_step_program(
            optim.model, optim.optimizer, worker, tcfg, train=train, test=test, val=val,
            batch=batch, device=device, compile_cache=self.compile_cache,
            loss=optim.loss,
        )  # fmt: skip

    def timeline_window(self, worker, tcfg: dict, out_dir: Path, start_epoch: int):
        return timeline_window(worker, tcfg, out_dir, start_epoch)

    def versions(self) -> dict:
        import tensorflow as tf  # reason: TensorFlow lives in the train env only

        return {"tensorflow": tf.__version__, "horovod": _horovod_version()}

    def label_facts(self, worker) -> dict:
        return {}  # the proof reads Horovod's timeline (label_proof)

    def shutdown(self, worker, program) -> None:
        worker.barrier(name="train_end")  # HVD:
        if worker.hvd is not None:
            worker.hvd.shutdown()  # HVD: flush the timeline before rank 0 reads it

    def launcher(self) -> str:
        return detect_launcher()

    def timeline_file(self) -> Path | None:
        env = os.environ.get("HOROVOD_TIMELINE")
        return Path(env) if env and env != "DYNAMIC" else None  # training.timeline

    def label_proof(self, record: dict, facts: dict, out_dir: Path) -> dict:
        timeline = out_dir / "timeline.json"
        return prove(record, timeline if timeline.is_file() else None)

    def leave(self) -> None:
        """Nothing: hvdscale.cli.finish shuts Horovod down after a run that succeeded."""


def set_tf32(precision: str) -> None:
    """TensorFloat-32 matrix multiplies on for ``tf32`` and explicitly off otherwise:
    TensorFlow enables them by default on Ampere and later GPUs, so an fp32 run would
    otherwise compute its matmuls in TF32 there (issue 32)."""
    import tensorflow as tf  # reason: TensorFlow lives in the train env only

    tf.config.experimental.enable_tensor_float_32_execution(precision == "tf32")


FRAMEWORK = HorovodTF()


def dynamic_timeline(tcfg: dict, no_horovod: bool) -> None:
    """HOROVOD_TIMELINE=DYNAMIC (before hvd.init) lets the run record a timeline window
    with hvd.start_timeline (training.timeline_steps); a whole-run timeline
    (training.timeline, set by the launcher) is left alone."""
    if tcfg["timeline_steps"] > 0 and not no_horovod and not os.environ.get("HOROVOD_TIMELINE"):
        os.environ["HOROVOD_TIMELINE"] = "DYNAMIC"


def timeline_window(worker: WorkerInfo, tcfg: dict, out_dir: Path, start_epoch: int):
    """OUT_DIR/timeline.json for training.timeline_steps steps from the first epoch after
    the warm-up epochs (this attempt's first epoch if it starts later; the last epoch if
    every epoch is warm-up), or None (off, no Horovod, or a whole-run timeline)."""
    if worker.hvd is None or os.environ.get("HOROVOD_TIMELINE") != "DYNAMIC":
        return None
    epoch = min(max(tcfg["warmup_epochs"], start_epoch), tcfg["max_epochs"] - 1)
    return TimelineWindow(worker.hvd, str(out_dir / "timeline.json"), epoch, tcfg["timeline_steps"])


def _horovod_version() -> str:
    try:
        import horovod  # reason: Horovod lives in the train env only

        return horovod.__version__
    except ImportError:
        return "none"
