"""Checkpoints and resuming: rank 0 alone writes ``OUT_DIR/checkpoint/epoch-NNNN/`` after
an epoch (atomically: every epoch, or once ``training.checkpoint_every_s`` has passed
since the last one, and always after the last epoch and before a time-limit stop) and,
when the same run starts again, reads the newest one and broadcasts where to continue.
``ResumeState`` is what a run carries from one attempt to the next: the epochs done, the
elapsed time, the attempts and the utilisation samples."""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from hvdscale.io import write_json_atomic, write_text_atomic
from hvdscale.record.build import utc_now
from hvdscale.trainer.worker import WorkerInfo

SHUFFLE_RULE = "numpy default_rng([seed, epoch, rank]).permutation"


def checkpoint_dir(out_dir: Path) -> Path:
    return Path(out_dir) / "checkpoint"


def find_checkpoint(out_dir: Path) -> tuple[Path, dict] | None:
    """The newest complete checkpoint (directory, state) or None."""
    ck = checkpoint_dir(out_dir)
    if not ck.is_dir():
        return None
    candidates = []
    latest = ck / "LATEST"
    if latest.is_file():
        candidates.append(ck / latest.read_text().strip())
    candidates += sorted((p for p in ck.glob("epoch-*") if p.is_dir()), reverse=True)
    for d in candidates:
        try:
            state = json.loads((d / "state.json").read_text())
            if (d / "weights.index").is_file():
                return d, state
        except (OSError, ValueError):
            continue
    return None


def save_checkpoint(out_dir: Path, ckpt, state: dict) -> Path:
    """Write weights + optimizer state + state.json into a temporary directory, fsync,
    rename it to checkpoint/epoch-NNNN (atomic), then point LATEST at it."""
    ck = checkpoint_dir(out_dir)
    ck.mkdir(parents=True, exist_ok=True)
    name = f"epoch-{state['epoch']:04d}"
    tmp = ck / f".tmp-{name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    ckpt.write(str(tmp / "weights"))
    write_json_atomic(tmp / "state.json", state)
    for f in tmp.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    final = ck / name
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    dfd = os.open(ck, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    write_text_atomic(ck / "LATEST", name + "\n")
    for old in ck.iterdir():  # older checkpoints and leftovers of killed writers
        if old.name != name and (old.name.startswith("epoch-") or old.name.startswith(".tmp-")):
            shutil.rmtree(old, ignore_errors=True)
    return final


@dataclass
class ResumeState:
    """Where a run stands: restored from a checkpoint's state.json (or empty for a fresh
    run), then updated after every epoch and saved with every checkpoint."""

    start_epoch: int = 0  # the first epoch this attempt runs
    history: list[dict] = field(default_factory=list)  # per-epoch records, all attempts
    elapsed_s: float = 0.0  # training wall time, all attempts
    attempts: list[dict] = field(default_factory=list)
    utilisation_samples: list = field(default_factory=list)  # of the earlier attempts
    initial_weights_sha256: str | None = None  # of the fresh start (rank 0)

    @classmethod
    def from_state(cls, state: dict | None) -> ResumeState:
        if not state:
            return cls()
        return cls(
            start_epoch=state["epoch"] + 1,
            history=list(state["epochs"]),
            elapsed_s=float(state["elapsed_s"]),
            attempts=list(state["attempts"]),
            utilisation_samples=list(state.get("utilisation_samples", [])),
            initial_weights_sha256=state.get("initial_weights_sha256"),
        )

    @property
    def resumed(self) -> bool:
        return len(self.attempts) > 1

    def begin_attempt(self, started_utc: str) -> None:
        self.attempts.append(
            {
                "started_utc": started_utc,
                "start_epoch": self.start_epoch,
                "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
            }
        )

    def loop_started(self, startup_s: float | None) -> None:
        """This attempt's start-up: seconds from the launcher's start to its epoch loop
        (hvdscale.record.startup; None without the launcher's stamp). Saved with every
        checkpoint in the attempt's entry, so that a resumed run keeps each attempt's."""
        self.attempts[-1]["startup_s"] = startup_s

    def epochs_this_attempt(self) -> int:
        return len(self.history) - self.start_epoch


@dataclass
class Checkpointer:
    """Saves and restores one run's checkpoints (rank 0 reads and writes them)."""

    out_dir: Path
    ckpt: object  # tf.train.Checkpoint(model=..., optimizer=...)
    run_id: str
    config_hash: str
    workers: int
    seed: int
    enabled: bool = True
    every_s: float = 0.0  # training.checkpoint_every_s: 0 = after every epoch
    _last_save: float = field(default_factory=lambda: time.monotonic(), repr=False)

    @classmethod
    def for_run(cls, out_dir, ckpt, run_id, config_hash, workers, seed, tcfg: dict):
        """A run's checkpointer, with what the training config says of checkpoints
        (training.checkpoint, training.checkpoint_every_s); both trainers use it."""
        return cls(
            out_dir, ckpt, run_id, config_hash, workers, seed,
            enabled=tcfg["checkpoint"], every_s=tcfg["checkpoint_every_s"],
        )  # fmt: skip

    def due(self, *, last_epoch: bool) -> bool:
        """Whether to checkpoint after this epoch: every epoch when ``every_s`` is 0,
        otherwise once ``every_s`` seconds have passed since the last checkpoint (or the
        start); always after the run's last epoch of this attempt (``last_epoch``: the
        target, a budget or a time-limit stop ends it)."""
        if not self.enabled:
            return False
        return last_epoch or time.monotonic() - self._last_save >= self.every_s

    def identity(self) -> dict:
        return {"run_id": self.run_id, "config_hash": self.config_hash, "workers": self.workers}

    def restore(self, worker: WorkerInfo, log) -> ResumeState:
        """Rank 0 reads the newest matching checkpoint (weights and optimizer state) and
        broadcasts its state; a checkpoint of another configuration is ignored."""
        state = None
        found = find_checkpoint(self.out_dir) if worker.is_root and self.enabled else None
        if found is not None:
            d, saved = found
            mismatch = [k for k, v in self.identity().items() if saved.get(k) != v]
            if mismatch:
                log(
                    f"WARNING: checkpoint {d} is from another configuration "
                    f"({', '.join(mismatch)} differ); starting from epoch 0"
                )
            else:
                self.ckpt.read(str(d / "weights")).assert_existing_objects_matched()
                state = saved
                log(f"resuming from {d} (epochs 0..{saved['epoch']} done)")
        state = worker.broadcast_object(state, root_rank=0, name="resume_state")  # HVD:
        return ResumeState.from_state(state)

    def save(self, epoch: int, progress: ResumeState, utilisation_samples: list) -> Path | None:
        """Checkpoint after ``epoch`` (rank 0 only; the caller checks)."""
        if not self.enabled:
            return None
        self._last_save = time.monotonic()
        return save_checkpoint(
            self.out_dir,
            self.ckpt,
            {
                **self.identity(),
                "epoch": epoch,
                "epochs": progress.history,
                "elapsed_s": progress.elapsed_s,
                "attempts": progress.attempts,
                "shuffle": {"seed": self.seed, "rule": SHUFFLE_RULE, "next_epoch": epoch + 1},
                "utilisation_samples": utilisation_samples,
                "initial_weights_sha256": progress.initial_weights_sha256,
                "saved_utc": utc_now(),
            },
        )
