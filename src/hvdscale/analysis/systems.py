"""The system description per partition (results/scaling/systems.csv), from the run
records' optional ``system`` object (rank 0's hvdscale.record.system.collect_system):
CPU model, cores, memory, GPU model, driver, CUDA, cuDNN and NCCL versions, MPI
implementation and version, Horovod's controllers, network interfaces, node names,
kernel and OS; from each record's Horovod environment the cycle time the run had
(``auto`` gives 1 worker and several workers different values); and whether a Gloo run's
ranks had hvdscale.native's library (``config.gloo_epoll_yield``).

The command line, with what it reads and writes in full, is ``hvdscale tabulate-systems``
(``add_arguments``/``run`` at the end of this module).
"""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

from hvdscale.errors import UserError
from hvdscale.io import write_text_atomic
from hvdscale.matrix.backends import CONTROLLERS

COLUMNS = [
    "partition",
    "runs",
    "described",
    "nodes",
    "cpu_model",
    "cores",
    "memory_mb",
    "gpu_model",
    "gpu_driver",
    "gpu_memory",
    "cuda_driver",
    "cuda_build",
    "cudnn",
    "nccl",
    "mpi_implementation",
    "mpi_version",
    "mpi",
    "horovod_controllers",
    "horovod_cycle",
    "gloo_yield",
    "cpu_kernels",
    "interfaces",
    "nccl_socket_ifname",
    "kernel",
    "os",
    "errors",
]
# the report's labels, in its order (partition, runs, described: in the heading)
LABELS = {
    "nodes": "Nodes",
    "cpu_model": "CPU model",
    "cores": "Cores per node",
    "memory_mb": "Memory per node (MB)",
    "gpu_model": "GPU model",
    "gpu_driver": "GPU driver",
    "gpu_memory": "GPU memory",
    "cuda_driver": "CUDA (driver)",
    "cuda_build": "CUDA (framework build: TensorFlow, else PyTorch)",
    "cudnn": "cuDNN",
    "nccl": "NCCL (Horovod build, else PyTorch's)",
    "mpi_implementation": "MPI implementation",
    "mpi_version": "MPI version",
    "mpi": "mpirun --version",
    "horovod_controllers": "Horovod controllers built",
    "horovod_cycle": "Horovod cycle time (the runs' HOROVOD_CYCLE_TIME)",
    "gloo_yield": "Gloo's loop thread yields (hvdscale.native, Gloo runs)",
    "cpu_kernels": "CPU kernels of the matrix products (framework, BLAS and its code path)",
    "interfaces": "Network interfaces",
    "nccl_socket_ifname": "NCCL_SOCKET_IFNAME",
    "kernel": "Kernel",
    "os": "OS",
    "errors": "Probes that failed",
}
SEP = "; "


def _interfaces(items) -> str:
    return ", ".join(
        f"{i.get('name', '?')} ({' '.join(i['addresses'])})" if i.get("addresses") else i["name"]
        for i in items or []
        if isinstance(i, dict) and i.get("name")
    )


def _controllers(s: dict) -> str:
    built = [name for name in CONTROLLERS if s.get(f"horovod_{name}")]
    known = any(s.get(f"horovod_{n}") is not None for n in CONTROLLERS)
    return ", ".join(built) if built else ("none" if known else "")


def _cycle(rec: dict) -> str:
    """'0.01 ms at 2 workers': the Horovod cycle time this run had (training.horovod.
    cycle_time_ms, auto: by the run's placement, hvdscale.launch.launchspec); '' for a
    run without Horovod (torch-ddp) or a record without its Horovod environment."""
    cfg = rec.get("config") or {}
    hv = cfg.get("horovod_env")
    if not hv or not any(k.startswith("HOROVOD_") for k in hv):
        return ""
    w = cfg.get("workers")
    at = f" at {w} worker{'s' if w != 1 else ''}" if w else ""
    value = hv.get("HOROVOD_CYCLE_TIME")
    return (f"{value} ms" if value else "Horovod's default") + at


def _gloo_yield(rec: dict) -> str:
    """'yes' / 'no': whether a Gloo run's ranks had hvdscale.native's epoll_wait library
    (training.gloo_yield_when_spinning, the record's config.gloo_epoll_yield); '' for
    another backend and for a record from before it."""
    cfg = rec.get("config") or {}
    if cfg.get("backend") != "gloo" or "gloo_epoll_yield" not in cfg:
        return ""
    return "yes" if cfg["gloo_epoll_yield"] else "no"


def record_values(rec: dict) -> dict[str, list[str]]:
    """One record's values per column (lists: several GPUs, several hosts)."""
    env = rec.get("environment") or {}
    s = rec.get("system")
    gpus = (s or {}).get("gpus") or []
    if s is None:  # a record from before issue 13: what the environment block says
        return {
            "nodes": list(env.get("hostnames") or []),
            "cpu_model": [env.get("cpu_model") or ""],
            "mpi": [env.get("mpi") if env.get("mpi") not in (None, "none") else ""],
            "horovod_cycle": [_cycle(rec)],
            "gloo_yield": [_gloo_yield(rec)],
        }

    def one(key):
        v = s.get(key)
        return [] if v is None else [str(v)]

    return {
        "nodes": list(s.get("nodes") or env.get("hostnames") or []),
        **{k: one(k) for k in ("cpu_model", "cores", "memory_mb", "cuda_driver")},
        "gpu_model": [g.get("model", "") for g in gpus],
        "gpu_driver": [g.get("driver", "") for g in gpus],
        "gpu_memory": [g.get("memory", "") for g in gpus],
        **{k: one(k) for k in ("cuda_build", "cudnn", "nccl", "mpi_implementation")},
        **{k: one(k) for k in ("mpi_version", "mpi", "nccl_socket_ifname", "kernel", "os")},
        "horovod_controllers": [_controllers(s)],
        "horovod_cycle": [_cycle(rec)],
        "gloo_yield": [_gloo_yield(rec)],
        "cpu_kernels": one("cpu_kernels"),
        "interfaces": [_interfaces(s.get("interfaces"))],
        "errors": sorted(f"{k}: {v}" for k, v in (s.get("errors") or {}).items()),
    }


def _natural(text: str) -> list:
    """Sort key with numbers as numbers ('at 2 workers' before 'at 16 workers')."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", text)]


def system_rows(records: list[dict]) -> list[dict]:
    """The table: one row (column -> text) per partition, partitions sorted."""
    by_part: dict[str, list[dict]] = {}
    for rec in records:
        by_part.setdefault(str(rec["config"]["partition"]), []).append(rec)
    rows = []
    for part in sorted(by_part):
        recs = by_part[part]
        values: dict[str, set[str]] = {c: set() for c in COLUMNS[3:]}
        for rec in recs:
            for k, vs in record_values(rec).items():
                values[k].update(v for v in vs if v != "")
        row = {"partition": part, "runs": str(len(recs))}
        row["described"] = str(sum(1 for r in recs if r.get("system") is not None))
        row["nodes"] = ", ".join(sorted(values.pop("nodes")))
        row.update({k: SEP.join(sorted(v, key=_natural)) for k, v in values.items()})
        rows.append(row)
    return rows


def csv_text(rows: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def load_records(runs_dir, runs_csv) -> list[dict]:
    """The records of the runs in runs.csv (valid records of the run table), in its order."""
    runs_dir = Path(runs_dir)
    try:
        with open(runs_csv, newline="") as fh:
            ids = [row["run_id"] for row in csv.DictReader(fh)]
    except (OSError, KeyError) as exc:
        raise UserError(f"runs table {runs_csv}: cannot be read ({exc})") from None
    out = []
    for run_id in ids:
        path = runs_dir / run_id / "metrics.json"
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, ValueError) as exc:
            raise UserError(f"{path}: cannot be read ({exc}); run 'hvdscale aggregate'") from None
    return out


def read_systems(path) -> list[dict] | None:
    """systems.csv as rows of text, or None when not given or not there."""
    if not path or not Path(path).exists():
        return None
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


# -------------------------------------------------- the command: hvdscale tabulate-systems


def add_arguments(p):
    p.add_argument("--runs-dir", required=True, help="run directories, e.g. results/runs")
    p.add_argument(
        "--runs", required=True, help="runs.csv of hvdscale aggregate (which records count)"
    )
    p.add_argument("--out", required=True, help="systems.csv to write")


def run(args) -> int:
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
    rows = system_rows(load_records(args.runs_dir, args.runs))
    write_text_atomic(args.out, csv_text(rows))
    print(f"tabulate-systems: wrote {args.out} ({len(rows)} partition(s))")
    return 0
