"""This rank's data: which rows of the splits it reads, reading and normalising them, and
the number of steps every rank runs per epoch. No TensorFlow here."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hvdscale.data import h5
from hvdscale.data.check import load_manifest, verify_data_dir, verify_shard
from hvdscale.errors import DataError, UserError
from hvdscale.trainer.model import check_parameter_count, normalisation_from_manifest, normalise
from hvdscale.trainer.worker import WorkerInfo
from hvdscale.workload.base import workload_for


def plan_rows(
    counts: list[int], workers: int, rank: int, policy: str, what: str = "train"
) -> list[tuple[int, int, int]]:
    """This rank's part of a split: [(shard index, first row, end row), ...].

    ``whole`` (or ``auto`` when the shard count is divisible by the workers): every rank
    gets shards_per_rank whole consecutive shards. ``slices`` (or ``auto`` otherwise): the
    split's samples in shard order are cut into ``workers`` contiguous ranges of equal
    size (+-1), each rank reading only the shard rows of its range.
    """
    n = len(counts)
    if policy not in ("auto", "whole", "slices"):
        raise UserError(
            f"config key training.shard_policy: got {policy!r}; expected auto, whole or slices"
        )
    if policy == "whole" or (policy == "auto" and n % workers == 0):
        if n % workers:
            raise DataError(
                f"{what} split: {n} shard(s) cannot be divided among {workers} workers as whole "
                f"shards (training.shard_policy 'whole'); make data.split_shards.{what} a "
                f"multiple of {workers} or set training.shard_policy to 'auto' or 'slices'"
            )
        k = n // workers
        return [(i, 0, counts[i]) for i in range(rank * k, (rank + 1) * k)]
    total = sum(counts)
    a, b = total * rank // workers, total * (rank + 1) // workers
    out, off = [], 0
    for i, c in enumerate(counts):
        lo, hi = max(a, off), min(b, off + c)
        if lo < hi:
            out.append((i, lo - off, hi - off))
        off += c
    return out


def read_rows(data_dir: Path, entries: list[dict], plan: list[tuple[int, int, int]], n_points: int):
    """Read the planned rows (whole shards via h5.read_shards, else row ranges)."""
    if plan and all(lo == 0 and hi == entries[i]["n_samples"] for i, lo, hi in plan):
        return h5.read_shards([data_dir / entries[i]["file"] for i, _, _ in plan], n_points)
    total = sum(hi - lo for _, lo, hi in plan)
    first = h5.inspect_shard(data_dir / entries[plan[0][0]]["file"], n_points) if plan else None
    if first is None:  # no rows: stress-strain's empty arrays
        curves = np.empty((0, n_points, 3), dtype=np.float32)
        labels, ids = np.empty((0, 2), dtype=np.float32), np.empty(0, dtype=np.int64)
        return curves, labels, ids
    curves, labels, ids = h5.empty_rows(first, total)
    at = 0
    for i, lo, hi in plan:
        path = data_dir / entries[i]["file"]
        m = hi - lo
        with h5.open_h5(path) as fh:
            n = h5.check_layout(fh, path, n_points)
            if hi > n:
                raise DataError(f"{path}: {n} samples; rows {lo}..{hi - 1} needed")
            sel = np.s_[at : at + m]
            fh["curves"].read_direct(curves, source_sel=np.s_[lo:hi], dest_sel=sel)
            fh["labels"].read_direct(labels, source_sel=np.s_[lo:hi], dest_sel=sel)
            fh["sample_id"].read_direct(ids, source_sel=np.s_[lo:hi], dest_sel=sel)
        h5.check_finite(path, curves[at : at + m], labels[at : at + m], ids[at : at + m])
        at += m
    return curves, labels, ids


EVAL_SPLITS = ("val", "test")  # read like the test split: every rank a part, no policy
SPLITS = ("train", *EVAL_SPLITS)


def check_val_split(data_dir: Path, manifest: dict) -> None:
    """UserError naming the directory when the data have no validation split."""
    listed = isinstance(manifest.get("shards"), dict) and manifest["shards"].get("val")
    if not listed or not (data_dir / "val").is_dir():
        raise UserError(
            f"{data_dir}: no validation split (expected {data_dir / 'val'}/shard-NNNN.h5 listed "
            f"as shards.val in {data_dir / 'manifest.json'}); rebuild the data with a data "
            "stage that writes the val split (data.val_fraction)"
        )


def check_manifest_layout(data_dir: Path, manifest: dict, cfg: dict) -> None:
    """DataError when the data are not the config's workload's (name and layout)."""
    wl = workload_for(cfg)
    want = wl.layout(cfg).as_dict()
    if manifest.get("workload") != wl.name or manifest["layout"] != want:
        raise DataError(
            f"{data_dir / 'manifest.json'}: data of workload {manifest.get('workload')!r} "
            f"({manifest['layout']}); the config's workload {wl.name!r} declares {want}; "
            "rebuild the data stage"
        )


def prepare_data(data_dir: Path, cfg: dict, worker: WorkerInfo, batch: int):
    """Check and read this rank's rows of the three splits; raise UserError/DataError on
    problems.

    Returns ({split: (x, y)}, info), normalised with the manifest's train-split statistics.
    """
    tcfg = cfg["training"]
    manifest = load_manifest(data_dir)
    check_val_split(data_dir, manifest)
    n_points = cfg["data"]["n_points"]
    if "layout" in manifest:  # another workload's data: its declared layout, no n_points
        n_points = None
        check_manifest_layout(data_dir, manifest, cfg)
    elif manifest["n_points"] != n_points:
        raise DataError(
            f"{data_dir / 'manifest.json'}: {manifest['n_points']} points per curve; "
            f"the config says data.n_points = {n_points}"
        )
    plans = {}
    for split in SPLITS:
        entries = manifest["shards"][split]
        policy = tcfg["shard_policy"] if split == "train" else "auto"
        plans[split] = plan_rows(
            [int(e["n_samples"]) for e in entries], worker.size, worker.rank, policy, split
        )
    # checksums: rank 0 verifies every shard, every other rank the shards it reads
    if worker.is_root:
        verify_data_dir(data_dir, verify_checksums=True)  # train and test
    for split in ("val",) if worker.is_root else SPLITS:
        entries = manifest["shards"][split]
        mine = range(len(entries)) if worker.is_root else {i for i, _, _ in plans[split]}
        for i in sorted(mine):
            verify_shard(data_dir, entries[i], manifest, verify_checksum=True)
    norm = normalisation_from_manifest(manifest)
    arrays = {}
    for split in SPLITS:
        curves, labels, _ids = read_rows(
            data_dir, manifest["shards"][split], plans[split], n_points
        )
        arrays[split] = normalise(curves, labels, norm)
        del curves, labels
    info = {
        "rank0_train_rows": [
            [manifest["shards"]["train"][i]["file"], lo, hi] for i, lo, hi in plans["train"]
        ],
        "counts": manifest["counts"],
    }
    return arrays, info


def steps_per_epoch(counts: list[int], batch: int, bpps: int) -> int:
    """Steps every rank runs per epoch: the smallest rank's full batches (a multiple of
    backward_passes_per_step), so that all ranks issue the same collectives."""
    steps = (min(counts) // batch) // bpps * bpps
    if steps < 1:
        raise DataError(
            f"train split: the smallest rank's part has {min(counts)} samples, fewer than one "
            f"step of batch {batch} x backward_passes_per_step {bpps}; use more data or fewer "
            "workers"
        )
    return steps


@dataclass
class RankData:
    """This rank's normalised arrays, the steps every rank runs per epoch, and what the
    run record says about the data (``info``)."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    steps: int
    info: dict
    x_val: np.ndarray | None = None
    y_val: np.ndarray | None = None

    def release(self) -> None:
        """Drop the host arrays (the step program holds its own copies)."""
        self.x_train = self.y_train = self.x_test = self.y_test = None
        self.x_val = self.y_val = None


def load_rank_data(data_dir: Path, cfg: dict, worker: WorkerInfo, batch: int) -> RankData:
    """Check the config against the model and read this rank's data. Every rank learns of
    every other rank's problem, so all stop together with the same clear message
    (DataError) before any training."""
    error = data = None
    try:
        check_parameter_count(cfg)
        data = prepare_data(Path(data_dir), cfg, worker, batch)
    except UserError as exc:
        error = str(exc)
    problems = worker.agree(error, name="setup_errors")  # HVD: (allgather_object)
    if problems:
        if len({e for _, e in problems}) == 1 and len(problems) == worker.size:
            raise DataError(problems[0][1])
        raise DataError("; ".join(f"rank {r}: {e}" for r, e in problems))
    arrays, info = data
    x_train, y_train = arrays["train"]
    counts = worker.allgather_object(
        len(x_train), name="train_counts"
    )  # HVD: every rank's sample count
    bpps = cfg["training"]["horovod"]["backward_passes_per_step"]
    info["train_samples_per_rank"] = counts
    return RankData(
        x_train,
        y_train,
        *arrays["test"],
        steps_per_epoch(counts, batch, bpps),
        info,
        *arrays["val"],
    )
