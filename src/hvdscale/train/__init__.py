"""Train one run: this is ONE rank of a Horovod job (train env).

Started N times by `hvdscale launch` (horovodrun, mpirun or srun); started directly it
is a one-worker run. Reads the validated config snapshot (JSON), finds the run in its
scaling matrix, reads only this rank's part of the train, validation and test splits,
trains the stress-strain network with Adam and Horovod (weights and shuffle from the
run's derived seed, hvdscale.runtable.run_seed) until the validation loss reaches the
target of ``--target target.json`` or a budget (training.max_epochs, max_train_s) runs
out, evaluates the test split once at the end, and writes (rank 0 only)
OUT_DIR/metrics.json (the run record, validated against workflow/schemas/run.schema.json),
OUT_DIR/history.csv, a checkpoint per epoch in OUT_DIR/checkpoint/ and, with
training.timeline (whole run) or training.timeline_steps (a window after the warm-up
epochs), OUT_DIR/timeline.json (written by Horovod; the label proof reads it).

Re-running the same command after a crash resumes from the last completed epoch.
Each rank writes OUT_DIR/.pids/rank-N.pid (diagnostics: which process is which rank).

Exit status: 0 completed; 3 the loss became NaN/inf (a run record with status nan_loss
is written); 2 bad input (config, data, checkpoint), with a one-line message; 1 other
errors.

Example (one rank, without a launcher):
  hvdscale train --config results/config/runs/local_gloo_n1_w1_b75_lrnone_r0.json \\
      --run-id local_gloo_n1_w1_b75_lrnone_r0 --data-dir results/data \\
      --out-dir results/runs/local_gloo_n1_w1_b75_lrnone_r0

Layout of the package: device (rank detection, CPU binding, device pinning), data (row
planning, reading, normalisation, steps per epoch), checkpoint (find/save, ResumeState),
optim (model, optimizer, LR schedule), step (the compiled step: a clock and a batch
source), metrics (EpochMetrics and its allreduce), loop (the epochs), fault (test-only
delay hook), main (command line and the top-level function). The run record is built by
hvdscale.runrecord. Nothing here imports TensorFlow or Horovod at module level.
"""

from hvdscale.train.checkpoint import (
    Checkpointer,
    ResumeState,
    checkpoint_dir,
    find_checkpoint,
    save_checkpoint,
)
from hvdscale.train.data import (
    RankData,
    load_rank_data,
    plan_rows,
    prepare_data,
    read_rows,
    steps_per_epoch,
)
from hvdscale.train.device import bind_cpus, local_rank_and_size, pin_device
from hvdscale.train.fault import FaultDelay
from hvdscale.train.loop import (
    STOP_REASONS,
    LoopPlan,
    NanLoss,
    TimelineWindow,
    run_epoch_steps,
    train_epochs,
)
from hvdscale.train.main import (
    add_arguments,
    run,
    start_orphan_watchdog,
    train_rank,
    write_pid_file,
)
from hvdscale.train.metrics import EpochMetrics
from hvdscale.train.optim import Optimisation, WarmupSchedule
from hvdscale.train.step import EVAL_BATCH, StepProgram

__all__ = [
    "EVAL_BATCH",
    "STOP_REASONS",
    "TimelineWindow",
    "Checkpointer",
    "EpochMetrics",
    "FaultDelay",
    "LoopPlan",
    "NanLoss",
    "Optimisation",
    "RankData",
    "ResumeState",
    "StepProgram",
    "WarmupSchedule",
    "add_arguments",
    "bind_cpus",
    "checkpoint_dir",
    "find_checkpoint",
    "load_rank_data",
    "local_rank_and_size",
    "pin_device",
    "plan_rows",
    "prepare_data",
    "read_rows",
    "run",
    "run_epoch_steps",
    "save_checkpoint",
    "start_orphan_watchdog",
    "steps_per_epoch",
    "train_epochs",
    "train_rank",
    "write_pid_file",
]
