"""The budget of a study before anything is submitted (``hvdscale plan CONFIG``).

Per partition: training jobs (runs of the selected scaling matrix, the calibration runs
and, as a worst case, the re-runs of one selected candidate per tuning group), nodes per job,
worst-case node-hours and GPU-hours (every job runs to its partition's time limit,
scaling.partitions.*.runtime_min), and the expected hours where something is known:
the measured training time of runs that already have a record (results/scaling/runs.csv)
and the cost model's predicted epoch time x the epoch budget for the others
(results/scaling/costmodel.json). The allreduce size sweeps (rule measure_allreduce)
are listed on their own line with the same worst case.

Node-hours count whole nodes (jobs are exclusive); GPU-hours count the GPUs a job
requests (gres per node x nodes), 0 on CPU partitions.

GPUs the train env cannot use are said before anything runs (hvdscale.slurm.gpu_support,
issue 20): TensorFlow 2.15 is built against CUDA 12, which needs compute capability
>= 5.0, so a K80 partition (3.7, the thesis's gpu2) fails at run time with it. The plan,
Snakemake's start banner and the report's overview say so and what to do instead.

Job arrays (issue 20): snakemake-executor-plugin-slurm 2.8 submits the ready jobs of
a rule named in ``--slurm-array-jobs`` as one SLURM array, with the FIRST job's
resources for every task (its ``run_array_jobs``: "all jobs have the same resource
requirement. Thus, we can simply take the first job"). Training runs of different worker
counts or partitions need different allocations, so arrays are only right for runs of one
job shape: ``job_shapes`` groups the selected runs, and ``hvdscale plan --arrays`` prints
one submission per shape (one sbatch each instead of one per run).

Example
  hvdscale plan config/thesis.yaml [--select "partition=alpha workers=1-8"] [--csv plan.csv]
  hvdscale plan config/thesis.yaml --arrays    # one array submission per job shape
"""

from __future__ import annotations

import json

from hvdscale.study.plan import array_commands, format_plan, merged_config, plan, write_csv


def add_arguments(ap):
    ap.add_argument("config", nargs="+", help="config file(s), merged in order like --configfile")
    ap.add_argument("--select", help="a selection, e.g. 'partition=alpha workers=1-8 repeat=0'")
    ap.add_argument("--results", help="results directory (default: the config's results_dir)")
    ap.add_argument("--csv", help="also write the per-partition table as CSV")
    ap.add_argument("--json", action="store_true", help="print the plan as JSON")
    ap.add_argument(
        "--arrays",
        action="store_true",
        help="print one submission per job shape with train_run as a SLURM job array",
    )


def run(args) -> int:
    cfg = merged_config(args.config, args.select)
    p = plan(cfg, args.results)
    if args.csv:
        write_csv(p, args.csv)
    if args.arrays:
        print("\n".join(array_commands(cfg, args.config)))
    elif args.json:
        print(json.dumps(p, indent=2, sort_keys=True))
    else:
        print(format_plan(p))
    return 0
