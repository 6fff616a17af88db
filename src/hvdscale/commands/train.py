"""Train one run: this is ONE rank of it (train env).

Started N times by `hvdscale launch` (horovodrun, mpirun or srun for a Horovod run,
torchrun or srun for a torch-ddp run); started directly it is a one-worker run. Reads the
validated config snapshot (JSON), finds the run in its scaling matrix (the run id names
the framework: horovod-tf unless it says torch-ddp), reads only this rank's part of the
train, validation and test splits, trains the stress-strain network with Adam (weights
and shuffle from the run's derived seed, hvdscale.matrix.runtable.run_seed) until the
validation loss reaches the target of ``--target target.json`` or a budget
(training.max_epochs, max_train_s) runs out, evaluates the test split once at the end,
and writes (rank 0 only) OUT_DIR/metrics.json (the run record, validated against
workflow/schemas/run.schema.json), OUT_DIR/history.csv, checkpoints in
OUT_DIR/checkpoint/ (training.checkpoint_every_s) and, for Horovod with training.timeline
(whole run) or training.timeline_steps (a window after the warm-up epochs),
OUT_DIR/timeline.json (written by Horovod; the label proof reads it).

Re-running the same command after a crash resumes from the last checkpointed epoch.
Each rank writes OUT_DIR/.pids/rank-N.pid (diagnostics: which process is which rank)
and OUT_DIR/.pids/rank-N.exit with its exit status.

Exit status: 0 completed; 3 the loss became NaN/inf (a run record with status nan_loss
is written); 4 stopped for the SLURM time limit (checkpoint written); 2 bad input
(config, data, checkpoint), with a one-line message; 1 other errors.

Example (one rank, without a launcher):
  hvdscale train --config results/config/runs/local_gloo_n1_w1_b75_lrnone_r0.json \\
      --run-id local_gloo_n1_w1_b75_lrnone_r0 --data-dir results/data \\
      --out-dir results/runs/local_gloo_n1_w1_b75_lrnone_r0
"""

from __future__ import annotations

from hvdscale.trainer import rank


def add_arguments(p):
    p.add_argument(
        "--config",
        required=True,
        help="validated config snapshot as JSON (hvdscale write-config), "
        "e.g. results/config/full.json",
    )
    p.add_argument(
        "--run-id",
        required=True,
        help="run of the config's scaling matrix, e.g. local_gloo_n1_w2_b75_lrnone_r0",
    )
    p.add_argument(
        "--data-dir", required=True, help="data directory with manifest.json, e.g. results/data"
    )
    p.add_argument("--out-dir", required=True, help="run directory, e.g. results/runs/RUN_ID")
    p.add_argument(
        "--target",
        default=None,
        help="target.json of the study (results/scaling/target.json: mode, value): train "
        "until the validation loss reaches its value or a budget runs out; without it the "
        "budget (training.max_epochs, training.max_train_s) is trained",
    )
    p.add_argument(
        "--no-horovod",
        action="store_true",
        help="run as a single process without importing Horovod (debugging; workers must be 1)",
    )


def run(args) -> int:
    """Train one rank with the trainer of the run's framework (hvdscale.trainer.rank)."""
    return rank.run(args, rank.framework_for_run(args.run_id))
