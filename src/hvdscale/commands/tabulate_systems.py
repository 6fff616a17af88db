"""The system description per partition (results/scaling/systems.csv), from the run
records' optional ``system`` object (rank 0's hvdscale.record.system.collect_system):
CPU model, cores, memory, GPU model, driver, CUDA, cuDNN and NCCL versions, MPI
implementation and version, Horovod's controllers, network interfaces, node names,
kernel and OS; from each record's Horovod environment the cycle time the run had
(``auto`` gives 1 worker and several workers different values); and whether a Gloo run's
ranks had hvdscale.native's library (``config.gloo_epoll_yield``).

One row per partition of runs.csv. A field lists every distinct value of the
partition's runs ('; ' between them; node names are the union of the runs' hosts); ''
where no run had it. Records written before runs described the system (no ``system``)
still give nodes, CPU model and MPI from their ``environment``; ``described`` counts the
runs that carried a description, ``errors`` names the probes that failed in any run.
Only the records decide the bytes (no clock, no machine), so a rebuild is identical.

Example
  hvdscale tabulate-systems --runs-dir results/runs --runs results/scaling/runs.csv \
      --out results/scaling/systems.csv
"""

from __future__ import annotations

from hvdscale.analysis.systems import csv_text, load_records, system_rows
from hvdscale.io import write_text_atomic


def add_arguments(p):
    p.add_argument("--runs-dir", required=True, help="run directories, e.g. results/runs")
    p.add_argument(
        "--runs", required=True, help="runs.csv of hvdscale aggregate (which records count)"
    )
    p.add_argument("--out", required=True, help="systems.csv to write")


def run(args) -> int:
    rows = system_rows(load_records(args.runs_dir, args.runs))
    write_text_atomic(args.out, csv_text(rows))
    print(f"tabulate-systems: wrote {args.out} ({len(rows)} partition(s))")
    return 0
