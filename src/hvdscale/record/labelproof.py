"""Every run proves its label (issue 12, item 8): what actually ran, against the run_id.

From the run record (written by rank 0 from every rank's allgathered host and device)
and, when the run wrote one, Horovod's timeline:

- world size = workers of the label; distinct hosts = nodes; ranks per host follow the
  sequential fill (workers_per_node on each node but the last), in rank order;
- device per rank (GPU or CPU), against the partition (``config.gpus_per_node``): on a
  partition with GPUs every rank, whatever the backend, must have computed on one, unless
  the partition declares its GPUs emulated (``config.emulated_gpus``, the local test
  cluster's); an nccl run must have run on GPUs in any case;
- no two ranks on one host used the same GPU (the id in each rank's device label,
  ``GPU:{id} (...)``: the node's id, from CUDA_VISIBLE_DEVICES where set), nor were bound
  the same one: a rank whose CUDA_VISIBLE_DEVICES (``environment.visible_gpus``, records
  since issue 29) names exactly one id was given that GPU by its launcher (srun
  --gpus-per-task=1, ``scaling.partitions.<name>.gpu_bind``), even where it trained on
  the CPU (no usable GPU, e.g. the emulated partition of the local cluster); each rank's
  cores (``environment.cores``, records since issue 29) and the ranks of a host whose cores
  overlap, as information only (a launcher may leave placement to the OS);
- the controller Horovod reports (gloo/mpi) matches the backend;
- the collective that carried the gradients: the activity names Horovod's timeline
  records inside each ALLREDUCE of the ``grads`` tensors (MPI_ALLREDUCE, GLOO_ALLREDUCE,
  NCCL_ALLREDUCE, ...) must be the backend's.

``prove(record, timeline)`` returns the proof (``ok`` false with ``problems`` for a
mislabelled run); training stores it as ``label_proof`` in the record.
``python -m hvdscale.record.labelproof RUN_DIR...`` checks finished runs (exit 1 if any is
mislabelled).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from hvdscale.matrix import backends

#: the collective each backend label must show: the timeline activity of its allreduce
#: (Horovod's common.h names; hvdscale.matrix.backends timeline_op). mpi/gloo runs on GPUs
#: reduce on the host (issue 20, hvdscale.trainer.horovod_tf.step.host_reduction), else Horovod
#: built with NCCL would show NCCL_ALLREDUCE. (The registry at import; prove() reads it at call
#: time.)
EXPECTED = {b.name: b.timeline_op for b in backends.entries()}
COLLECTIVES = (
    "MPI_ALLREDUCE",
    "MPI_CUDA_ALLREDUCE",
    "GLOO_ALLREDUCE",
    "NCCL_ALLREDUCE",
    "CCL_ALLREDUCE",
    "ADASUM_ALLREDUCE",
)


def collectives() -> set[str]:
    """The activities counted: Horovod's allreduce names and every backend's."""
    return {*COLLECTIVES, *(b.timeline_op for b in backends.entries() if b.timeline_op)}


def timeline_collectives(path: str | Path, tensor_filter: str = "grads") -> Counter:
    """How often each collective activity ran for the tensors named like ``tensor_filter``."""
    text = Path(path).read_text().strip()
    if not text.endswith("]"):  # Horovod leaves the JSON array open while it runs
        text = text.rstrip(",") + "]"
    events = json.loads(text)
    names = {
        e.get("pid"): str(e.get("args", {}).get("name", ""))
        for e in events
        if e.get("ph") == "M" and e.get("name") == "process_name"
    }
    counts: Counter = Counter()
    known = collectives()
    for e in events:
        if e.get("ph") in ("B", "X") and e.get("name") in known:
            if tensor_filter in names.get(e.get("pid"), ""):
                counts[e["name"]] += 1
    return counts


def expected_ranks_per_host(workers: int, per_node: int) -> list[int]:
    out, left = [], workers
    while left > 0:
        out.append(min(per_node, left))
        left -= out[-1]
    return out


def gpu_id(label: str) -> str | None:
    """The GPU id in a device label (``GPU:3 (CUDA_VISIBLE_DEVICES=3; NVIDIA A100)`` -> ``3``,
    the token after ``GPU:`` up to the first space); None for a CPU rank."""
    label = str(label)
    if not label.startswith("GPU:"):
        return None
    return label[4:].split(" ", 1)[0] or None


def compact_cores(cores) -> str:
    """A set of core ids as the record writes it (``environment.cores``, read back by
    ``parse_cores``): sorted, runs of consecutive ids as ``a-b``, joined by commas, e.g.
    ``0-3,8,10-11``; ``""`` for none."""
    ids = sorted(set(int(c) for c in cores))
    runs: list[list[int]] = []
    for c in ids:
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def parse_cores(text: str) -> set[int]:
    """The core ids of a compact core string (``0-3,8`` -> {0, 1, 2, 3, 8};
    ``compact_cores`` writes them); empty for ``""``."""
    out: set[int] = set()
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        a, _, b = part.partition("-")
        out.update(range(int(a), int(b or a) + 1))
    return out


def visible_ids(visible: str | None) -> list[str]:
    """The ids a CUDA_VISIBLE_DEVICES value names ([] when unset or empty); the trainer's
    device choice (hvdscale.trainer.placement) reads the variable with it too."""
    return [v.strip() for v in (visible or "").split(",") if v.strip()]


def bound_gpu_id(visible: str | None) -> str | None:
    """The GPU a launcher bound to a rank: the one id its CUDA_VISIBLE_DEVICES names
    (``3``, a UUID or a MIG id); None when unset, empty or naming several ids (the rank
    sees several GPUs and takes its local rank's)."""
    ids = visible_ids(visible)
    return ids[0] if len(ids) == 1 else None


def rank_gpu_ids(devices: list, visible: list | None) -> list[str | None]:
    """Each rank's GPU id: the one its device label names (it computed there), else the
    one its launcher bound to it (``bound_gpu_id`` of ``environment.visible_gpus``; a CPU
    rank of a GPU job), else None."""
    visible = list(visible or [])
    out = []
    for i, d in enumerate(devices):
        used = gpu_id(d)
        out.append(
            used if used is not None else bound_gpu_id(visible[i] if i < len(visible) else None)
        )
    return out


def shared_gpus(
    hosts: list[str], gpus: list[str | None], bound: list[bool] | None = None
) -> list[str]:
    """One problem per pair of ranks on the same host with the same GPU id (``bound[i]``:
    rank i's id is the one its launcher bound, not one it computed on)."""
    problems, first = [], {}
    for rank, (host, gpu) in enumerate(zip(hosts, gpus)):
        if gpu is None:
            continue
        if (host, gpu) in first:
            how = "were bound" if bound and bound[rank] else "share"
            problems.append(
                f"ranks {first[host, gpu]} and {rank} on host {host} {how} GPU {gpu}"
                + (" (CUDA_VISIBLE_DEVICES)" if how == "were bound" else "")
            )
        else:
            first[host, gpu] = rank
    return problems


def gpu_lines(hosts: list[str], gpus: list[str | None], visible: list | None) -> list[str]:
    """The GPU id of every rank, per host in rank order (``-``: none), for the CLI; empty
    when no rank has a GPU id and none saw CUDA_VISIBLE_DEVICES."""
    if all(g is None for g in gpus) and not any(v is not None for v in visible or []):
        return []
    lines = []
    for host in dict.fromkeys(hosts):
        ranks = [i for i, h in enumerate(hosts) if h == host]
        ids = " ".join(
            f"{i}:{gpus[i] if i < len(gpus) and gpus[i] is not None else '-'}" for i in ranks
        )
        lines.append(f"  GPU ids on {host} (rank:id): {ids}")
    return lines


def core_overlaps(hosts: list[str], cores: list[str]) -> list[str]:
    """Pairs of ranks on the same host whose cores overlap (information, not a problem)."""
    sets = []
    for c in cores:
        try:
            sets.append(parse_cores(c))
        except ValueError:
            sets.append(set())
    out = []
    for i in range(len(sets)):
        for j in range(i + 1, min(len(sets), len(hosts))):
            common = sets[i] & sets[j] if hosts[i] == hosts[j] else set()
            if common:
                out.append(
                    f"ranks {i} and {j} on host {hosts[i]} share cores "
                    f"{','.join(map(str, sorted(common)))}"
                )
    return out


def device_problems(cfg: dict, devices: list, needs_gpu: bool) -> list[str]:
    """The ranks that computed on the CPU where they must not: every rank of a partition
    with GPUs (``cfg["gpus_per_node"]`` > 0; records before it was recorded say nothing
    here) unless its GPUs are emulated (``cfg["emulated_gpus"]``), and every rank of a
    backend that needs GPUs (``needs_gpu``, e.g. nccl) anywhere."""
    cpu = [i for i, d in enumerate(devices) if not str(d).startswith("GPU")]
    if not cpu:
        return []
    ranks = ", ".join(map(str, cpu[:8])) + (", ..." if len(cpu) > 8 else "")
    gpn = int(cfg.get("gpus_per_node") or 0)
    why = []
    if gpn > 0 and not cfg.get("emulated_gpus", False):
        why.append(f"partition {cfg.get('partition')} has {gpn} GPUs per node")
    if needs_gpu:
        why.append(f"backend {cfg.get('backend')} needs GPUs")
    if not why:
        return []
    return [f"{' and '.join(why)}, but {len(cpu)} rank(s) ran on the CPU (rank {ranks})"]


def prove(record: dict, timeline: str | Path | None = None) -> dict:
    cfg, env = record["config"], record.get("environment") or {}
    backend, workers, nodes = cfg["backend"], cfg["workers"], cfg["nodes"]
    hosts = list(env.get("hostnames") or [])
    devices = list(env.get("devices") or [])
    problems = []
    if len(hosts) != workers:
        problems.append(f"world size {len(hosts)}, label says {workers} workers")
    order = list(dict.fromkeys(hosts))
    if len(order) != nodes:
        problems.append(f"{len(order)} distinct host(s) {order}, label says {nodes} node(s)")
    per_host = [hosts.count(h) for h in order]
    want = expected_ranks_per_host(workers, cfg["workers_per_node"])
    blocks = [h for i, h in enumerate(hosts) if i == 0 or hosts[i - 1] != h]
    if per_host != want or len(blocks) != len(order):
        problems.append(f"ranks per host {dict(zip(order, per_host))}, sequential fill is {want}")
    kinds = Counter("GPU" if str(d).startswith("GPU") else "CPU" for d in devices)
    entry = backends.get(backend, cfg.get("framework") or backends.DEFAULT_FRAMEWORK)
    problems += device_problems(cfg, devices, entry.needs_gpu)
    visible = env.get("visible_gpus")
    gpus = rank_gpu_ids(devices, visible)
    problems += shared_gpus(hosts, gpus, [gpu_id(d) is None for d in devices])
    cores = env.get("cores")
    overlaps = core_overlaps(hosts, cores) if cores is not None else []
    controller = cfg.get("controller")
    if entry.controller is not None and controller != entry.controller:
        problems.append(f"backend {backend} but Horovod's controller was {controller}")
    collective, counts = None, {}
    if workers > 1 and timeline is not None and Path(timeline).is_file():
        counts = dict(timeline_collectives(timeline))
        collective = max(counts, key=counts.get) if counts else None
        if collective != entry.timeline_op:
            problems.append(
                f"gradients were reduced by {collective or 'no collective'} "
                f"({counts}), backend {backend} means {entry.timeline_op}"
            )
    return {
        "ok": not problems,
        "problems": problems,
        "world_size": len(hosts),
        "hosts": order,
        "ranks_per_host": dict(zip(order, per_host)),
        "devices": dict(kinds),
        "gpus_per_node": cfg.get("gpus_per_node"),
        "emulated_gpus": bool(cfg.get("emulated_gpus", False)),
        "gpu_ids": gpus,
        "visible_gpus": None if visible is None else list(visible),
        "cores": None if cores is None else list(cores),
        "core_overlaps": overlaps,
        "controller": controller,
        "collective": collective,
        "collective_counts": counts,
        "expected_collective": entry.timeline_op if workers > 1 else None,
        "timeline_checked": bool(counts) or collective is not None,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hvdscale.record.labelproof", description=__doc__)
    p.add_argument("run_dirs", nargs="+", help="run directories with metrics.json")
    args = p.parse_args(argv)
    bad = 0
    for d in map(Path, args.run_dirs):
        rec = json.loads((d / "metrics.json").read_text())
        proof = prove(rec, d / "timeline.json")
        bad += not proof["ok"]
        lines = [
            f"{rec['run_id']}: {'ok' if proof['ok'] else 'MISLABELLED'}; "
            f"{proof['world_size']} ranks on {proof['ranks_per_host']}, "
            f"devices {proof['devices']}, collective {proof['collective']}",
            *gpu_lines(
                rec.get("environment", {}).get("hostnames") or [],
                proof["gpu_ids"],
                proof.get("visible_gpus"),
            ),
            *(f"  - {m}" for m in proof["problems"]),
        ]
        print("\n".join(lines))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
