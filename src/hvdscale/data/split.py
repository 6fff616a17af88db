"""Split validated shards into train/val/test HDF5 shards, manifest.json and validation.json.

The command line, with what it reads and writes in full, is ``hvdscale split-dataset``
(``add_arguments``/``run`` at the end of this module).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import os
import re
import sys
import time
from pathlib import Path

import numpy as np

from hvdscale import __version__
from hvdscale.data import h5
from hvdscale.data.check import (
    MANIFEST_NAME,
    MANIFEST_VERSION,
    sha256_file,
    shard_name,
)
from hvdscale.data.generate import tune_malloc
from hvdscale.data.normalisation import RunningStats
from hvdscale.data.physics import (
    SPLIT_CODES,
    GeneratorParams,
    add_data_config_argument,
    load_data_config,
    split_assign,
)
from hvdscale.errors import DataError
from hvdscale.io import atomic_path, read_json_object, write_json_atomic

SPLITS = ("train", "val", "test")
BLOCK = 8192


# --------------------------------------------------------------------------- inputs


def _load_json(path: Path) -> dict:
    return read_json_object(
        path,
        missing="validation file not found",
        kind="validation JSON file",
        not_object="not a validation report (expected a JSON object)",
    )


def match_validations(
    shards: list[Path], validations: list[Path], params: GeneratorParams
) -> list[dict]:
    """For every shard its passing, matching validation report (else DataError).

    Returns ``[{"shard": Path, "validation": Path, "report": dict}]`` sorted by id_start.
    """
    reports = [(v, _load_json(v)) for v in validations]
    matched = []
    for shard in shards:
        if not shard.is_file():
            raise DataError(f"{shard}: shard file not found")
        cands = [(v, r) for v, r in reports if r.get("shard_file") == shard.name]
        if len(cands) > 1:  # same file name in several directories
            cands = [
                (v, r)
                for v, r in cands
                if Path(str(r.get("shard_path", ""))).resolve() == shard.resolve()
            ] or cands[:1]
        if not cands:
            raise DataError(
                f"{shard}: no validation report for this shard among --validations; "
                "run 'hvdscale validate-shard' on it first"
            )
        vpath, rep = cands[0]
        if rep.get("passed") is not True:
            raise DataError(f"{shard}: its validation {vpath} did not pass")
        st = shard.stat()
        if rep.get("bytes") != st.st_size:
            raise DataError(
                f"{shard}: changed since validation ({vpath} records {rep.get('bytes')} bytes, "
                f"the file has {st.st_size}); validate it again"
            )
        if rep.get("mtime_ns") != st.st_mtime_ns and rep.get("sha256") != sha256_file(shard):
            raise DataError(
                f"{shard}: changed since validation (sha256 differs from {vpath}); "
                "validate it again"
            )
        if rep.get("seed") != params.seed or rep.get("generator") != params.as_dict():
            raise DataError(
                f"{shard}: validated ({vpath}) for a different seed or generator parameters "
                "than this config; regenerate and validate it"
            )
        matched.append({"shard": shard, "validation": vpath, "report": rep})
    matched.sort(key=lambda m: m["report"]["id_start"])
    at = 0
    for m in matched:
        r = m["report"]
        if r["id_start"] != at:
            what = "missing" if r["id_start"] > at else "present twice"
            raise DataError(
                f"{m['shard']}: starts at sample id {r['id_start']}, expected {at} "
                f"(sample ids {min(at, r['id_start'])}..{max(at, r['id_start']) - 1} {what})"
            )
        at = r["id_stop"]
    if at != params.n_samples:
        raise DataError(
            f"shards cover sample ids 0..{at - 1}; data.n_samples is {params.n_samples} "
            "(a shard is missing from --shards)"
        )
    return matched


# --------------------------------------------------------------------------- writing


def split_shard_attrs(
    params: GeneratorParams,
    split: str,
    index: int,
    count: int,
    train_fraction: float,
    first_id: int,
    last_id: int,
    val_fraction: float = 0.0,
) -> dict:
    attrs = h5.common_attrs(params)
    attrs.update(
        {
            "kind": split,
            "split": split,
            "shard_index": index,
            "n_shards": count,
            "train_fraction": float(train_fraction),
            "val_fraction": float(val_fraction),
            "first_sample_id": int(first_id),
            "last_sample_id": int(last_id),
        }
    )
    return attrs


def even_sizes(n: int, k: int) -> list[int]:
    """``k`` sizes summing to ``n`` that differ by at most one."""
    return [(i + 1) * n // k - i * n // k for i in range(k)]


def write_split_shard(task: dict, finish: bool = True) -> dict:
    """Write one output shard (a task; runs in a worker process or in-process).

    Reads the raw rows covering the shard's sample id range, keeps the samples of its
    split and writes them to ``task["tmp"]``. Returns the shard's normalisation
    statistics (train split) and, with ``finish``, its sha256 and size after forcing
    it to disk (see :func:`finish_file`).
    """
    params = GeneratorParams(**task["params"])
    train = task["split"] == "train"
    attrs = split_shard_attrs(
        params,
        task["split"],
        task["index"],
        task["count"],
        task["train_fraction"],
        task["first_id"],
        task["last_id"],
        task["val_fraction"],
    )
    code = SPLIT_CODES[task["split"]]
    cstats, lstats = RunningStats(3), RunningStats(2)
    where = f"{task['split']}/{shard_name(task['index'])}"
    writer = h5.ShardWriter(task["tmp"], task["n"], params.n_points, attrs, task["chunk"])
    try:
        for path, row0, row1 in task["sources"]:
            for _a, curves, labels, ids in h5.iter_blocks(
                path, task["block"], params.n_points, row0, row1
            ):
                keep = (
                    split_assign(params.seed, ids, task["train_fraction"], task["val_fraction"])
                    == code
                )
                c, lab, i = curves[keep], labels[keep], ids[keep]
                if writer.at + len(i) > writer.n:
                    raise DataError(
                        f"{path}: more {task['split']} samples than planned for {where} "
                        "(input changed?)"
                    )
                writer.append(c, lab, i)
                if train:
                    cstats.add(c)
                    lstats.add(lab)
        if writer.at != writer.n:
            raise DataError(
                f"{where}: {writer.at} of {writer.n} samples found in the input (input changed?)"
            )
        writer.close()
    finally:
        writer.abort()
    res = {"curve_stats": cstats if train else None, "label_stats": lstats if train else None}
    if finish:
        res.update(finish_file(task["tmp"]))
    return res


def finish_file(path: str | Path) -> dict:
    """Force a written shard to disk and hash it: ``{"sha256", "bytes"}``."""
    with open(path, "rb+") as fh:
        os.fsync(fh.fileno())
    return {"sha256": sha256_file(path), "bytes": Path(path).stat().st_size}


def default_workers() -> int:
    """CPUs this process may use (SLURM/cgroup affinity), at most 4."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        n = os.cpu_count() or 1
    return max(1, min(4, n))


def split_dataset(cfg: dict, shards, validations, outdir, progress=None, workers: int = 1) -> dict:
    """Split validated generation shards into ``outdir``; returns the manifest.

    ``workers`` processes write the output shards in parallel (one task per shard);
    the files, checksums and statistics do not depend on it.
    """
    t0 = time.perf_counter()
    params = GeneratorParams.from_config(cfg)
    d = cfg["data"]
    frac = float(d["train_fraction"])
    counts = {s: int(d["split_shards"][s]) for s in SPLITS}
    outdir = Path(outdir)
    matched = match_validations([Path(s) for s in shards], [Path(v) for v in validations], params)
    tasks, n = _plan_split_tasks(params, d, frac, counts, matched)
    results = _write_split_tasks(tasks, outdir, workers, progress, t0)
    # leaving the stack renamed every shard into place (all or none)
    _remove_stale(outdir, counts)
    manifest = _build_manifest(params, (frac, float(d["val_fraction"])), n, tasks, results)
    write_json_atomic(outdir / "validation.json", _validation_summary(params, matched))
    write_json_atomic(outdir / MANIFEST_NAME, manifest)
    if progress:
        progress(
            f"wrote {params.n_samples} samples ({n['train']} train, {n['val']} val) "
            f"in {time.perf_counter() - t0:.1f} s"
        )
    return manifest


def _plan_split_tasks(params, d: dict, frac: float, counts: dict, matched: list):
    """One write task per output shard, with the input row ranges it reads; and the
    sample count per split."""
    all_ids = np.arange(params.n_samples, dtype=np.int64)
    which = split_assign(params.seed, all_ids, frac, d["val_fraction"])
    n = {s: int((which == SPLIT_CODES[s]).sum()) for s in SPLITS}
    tasks = []
    for s in SPLITS:
        ids_s = all_ids[which == SPLIT_CODES[s]]
        if len(ids_s) < counts[s]:
            raise DataError(
                f"{s} split has {len(ids_s)} samples, fewer than data.split_shards.{s} "
                f"({counts[s]}); increase data.n_samples"
            )
        sizes = even_sizes(len(ids_s), counts[s])
        at = 0
        for k, size in enumerate(sizes):
            first, last = int(ids_s[at]), int(ids_s[at + size - 1])
            at += size
            tasks.append(
                {
                    "split": s,
                    "index": k,
                    "count": counts[s],
                    "n": size,
                    "first_id": first,
                    "last_id": last,
                    "sources": _task_sources(matched, first, last),
                    "params": params.as_dict(),
                    "train_fraction": frac,
                    "val_fraction": float(d["val_fraction"]),
                    "chunk": int(d["chunk_samples"]),
                    "block": BLOCK,
                    "file": f"{s}/{shard_name(k)}",
                }
            )
    return tasks, n


def _task_sources(matched: list, first: int, last: int) -> list:
    """(input shard, row start, row stop) for every input shard overlapping [first, last]."""
    sources = []
    for m in matched:
        a, b = m["report"]["id_start"], m["report"]["id_stop"]
        lo, hi = max(a, first), min(b, last + 1)
        if lo < hi:
            sources.append((str(m["shard"]), lo - a, hi - a))
    return sources


def _write_split_tasks(tasks: list, outdir: Path, workers: int, progress, t0: float) -> dict:
    """Write every output shard (all renamed into place or none); results by file name."""
    results: dict[str, dict] = {}
    with contextlib.ExitStack() as stack:
        for t in tasks:  # every output exists only as a temporary file until all are written
            t["tmp"] = str(stack.enter_context(atomic_path(outdir / t["file"], ".h5")))
        # most input rows per output row first (test shards), for a balanced finish
        order = sorted(tasks, key=lambda t: -sum(r1 - r0 for _p, r0, r1 in t["sources"]))
        # a thread forces every finished file to disk and hashes it while the next ones are written
        tpool = cf.ThreadPoolExecutor(max_workers=1)
        stack.callback(tpool.shutdown, wait=True, cancel_futures=True)
        if workers > 1 and len(tasks) > 1:
            import multiprocessing as mp

            ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else None
            pool = cf.ProcessPoolExecutor(max_workers=min(workers, len(tasks)), mp_context=ctx)
            stack.callback(pool.shutdown, wait=True, cancel_futures=True)
            futures = {pool.submit(write_split_shard, t, False): t for t in order}
            written = ((futures[f], f.result()) for f in cf.as_completed(futures))
        else:
            written = ((t, write_split_shard(t, finish=False)) for t in order)
        pending = []
        last = t0
        for t, res in written:
            pending.append((t["file"], res, tpool.submit(finish_file, t["tmp"])))
            now = time.perf_counter()
            if progress and now - last > 5.0:
                progress(f"{len(pending)}/{len(tasks)} shards written, {now - t0:.1f} s")
                last = now
        for name, res, fut in pending:
            res.update(fut.result())
            results[name] = res
        with contextlib.suppress(FileNotFoundError):
            (outdir / MANIFEST_NAME).unlink()  # the old manifest no longer describes the files
    return results


def _build_manifest(params, fracs: tuple, n: dict, tasks: list, results: dict) -> dict:
    """The dataset manifest: shard entries and train-split normalisation statistics."""
    cstats, lstats = RunningStats(3), RunningStats(2)
    entries: dict[str, list] = {s: [] for s in SPLITS}
    for t in tasks:  # fixed order: the statistics do not depend on the worker count
        r = results[t["file"]]
        if t["split"] == "train":
            cstats.merge(r["curve_stats"])
            lstats.merge(r["label_stats"])
        entries[t["split"]].append(
            {
                "file": t["file"],
                "n_samples": t["n"],
                "first_sample_id": t["first_id"],
                "last_sample_id": t["last_id"],
                "bytes": r["bytes"],
                "sha256": r["sha256"],
            }
        )
    cmean, cstd = cstats.result()
    lmean, lstd = lstats.result()
    return {
        "manifest_version": MANIFEST_VERSION,
        "format_version": h5.FORMAT_VERSION,
        "created_by": f"hvdscale {__version__}",
        "seed": params.seed,
        "generator": params.as_dict(),
        "n_points": params.n_points,
        "channel_names": list(h5.CHANNEL_NAMES),
        "label_names": list(h5.LABEL_NAMES),
        "label_units": list(params.label_units),
        "label_ranges": {
            name: [lo, hi]
            for name, lo, hi in zip(
                h5.LABEL_NAMES, params.label_min.tolist(), params.label_max.tolist()
            )
        },
        "train_fraction": fracs[0],
        "val_fraction": fracs[1],
        "split_rule": "u = uniform(seed, sample_id): val if u < train_fraction * val_fraction, "
        "train if u < train_fraction, else test (hvdscale.data.physics.split_assign)",
        "counts": {"total": params.n_samples, **n},
        "shards": entries,
        "normalisation": {
            "source": "train split",
            "curves": {"channels": list(h5.CHANNEL_NAMES), "mean": cmean, "std": cstd},
            "labels": {"names": list(h5.LABEL_NAMES), "mean": lmean, "std": lstd},
        },
    }


def _validation_summary(params, matched: list) -> dict:
    """validation.json of the split: the input shards and their validation reports."""
    return {
        "passed": True,
        "n_shards": len(matched),
        "n_samples": params.n_samples,
        "checks": matched[0]["report"].get("checks", []) if matched else [],
        "shards": [
            {
                "shard": str(m["shard"]),
                "validation": str(m["validation"]),
                "id_start": m["report"]["id_start"],
                "id_stop": m["report"]["id_stop"],
                "n_samples": m["report"]["n_samples"],
                "sha256": m["report"].get("sha256"),
                "seconds": m["report"].get("seconds", {}).get("total"),
            }
            for m in matched
        ],
    }


_SHARD_RE = re.compile(r"shard-(\d{4,})\.h5")


def _remove_stale(outdir: Path, counts: dict) -> None:
    """Remove shard files left from an earlier split with more shards."""
    for s in SPLITS:
        d = outdir / s
        if not d.is_dir():
            continue
        for f in d.iterdir():
            m = _SHARD_RE.fullmatch(f.name)
            if m and int(m.group(1)) >= counts[s]:
                f.unlink()


# -------------------------------------------------- the command: hvdscale split-dataset


def add_arguments(p):
    add_data_config_argument(p)
    p.add_argument("--shards", required=True, nargs="+", help="all generated HDF5 shards")
    p.add_argument(
        "--validations",
        required=True,
        nargs="+",
        help="their validation reports (hvdscale validate-shard), in any order",
    )
    p.add_argument("--outdir", required=True, help="output directory, e.g. results/data")
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="processes writing output shards in parallel (default: the CPUs this process may use, "
        "at most 4); the output does not depend on it",
    )


def run(args) -> int:
    """Split validated shards into train/val/test HDF5 shards, manifest.json and validation.json.

    Refuses to run unless every input shard has a passing validation report that matches it
    (same file: name, size and modification time, or else the same sha256; same seed and
    generator parameters) and the shards cover the sample ids 0..n-1 exactly once.

    Each sample's split comes from one uniform u hashed from (seed, sample id)
    (hvdscale.data.physics.split_assign): u < train_fraction x val_fraction: validation;
    u < train_fraction: train; else test. So the split does not depend on the shard layout,
    and the validation split is val_fraction of the train share. Each split is written as
    data.split_shards.{train,val,test} files
    ``OUTDIR/{train,val,test}/shard-NNNN.h5`` holding consecutive runs of the split's samples in
    ascending sample id (shard sizes differ by at most one), in the same layout and with the
    same attributes as the generated shards. ``OUTDIR/manifest.json`` records counts, sha256
    checksums, the generator parameters and normalisation statistics of the train split
    (per-channel and per-label mean and std); ``OUTDIR/validation.json`` summarises the shard
    validations. Input is streamed block by block (memory stays small for 1M curves), and
    nothing is renamed into place unless every file was written.

    Example:
      hvdscale split-dataset --config results/config/data.json \
      --shards results/data/raw/shard-*.h5 --validations results/data/raw/*.validation.json \
      --outdir results/data
    """
    tune_malloc()
    cfg = load_data_config(args.config)

    def progress(msg):
        print(f"split-dataset: {msg}", file=sys.stderr, flush=True)

    workers = args.workers if args.workers else default_workers()
    m = split_dataset(
        cfg, args.shards, args.validations, args.outdir, progress=progress, workers=workers
    )
    c = m["counts"]
    progress(
        f"{args.outdir}: {c['train']} train / {c['val']} val / {c['test']} test samples in "
        f"{' + '.join(str(len(m['shards'][s])) for s in SPLITS)} shards"
    )
    return 0
