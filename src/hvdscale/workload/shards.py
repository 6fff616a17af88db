"""The data stage of every workload but stress-strain (whose generator has its own
physics checks, ``hvdscale.data``): make a generation shard from the workload's samples,
validate it against the declared layout, and split the shards into train/val/test with
the contract's rules (the split of each sample from (seed, sample id), checksummed
shards, manifest.json with the train split's normalisation statistics). ``import_data``
does all three at once for the user's own arrays (``hvdscale import-data``)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

from hvdscale import __version__
from hvdscale.data import generate, h5, validate
from hvdscale.data import split as split_mod
from hvdscale.data.check import MANIFEST_NAME, MANIFEST_VERSION, sha256_file, shard_name
from hvdscale.data.generate import shard_range
from hvdscale.data.normalisation import RunningStats
from hvdscale.data.physics import SPLIT_CODES, load_data_config, split_assign
from hvdscale.data.split import even_sizes, finish_file
from hvdscale.data.validate import _failures
from hvdscale.errors import DataError, UserError
from hvdscale.io import atomic_path, write_json_atomic
from hvdscale.workload.arrays import ArrayWorkload, read_arrays
from hvdscale.workload.base import Layout, Workload, workload_for, workload_name

SPLITS = ("train", "val", "test")
CHECKS = (
    "sample_shape", "label_shape", "dtypes",  # the whole arrays against the declared layout
    "all_values_finite", "label_in_classes", "sample_id_unique", "sample_id_matches_shard",
)  # fmt: skip


def write_shard(path, x, y, ids, layout: Layout, attrs: dict, chunk: int) -> None:
    """One HDF5 shard of the arrays, atomically, declaring its layout."""
    with atomic_path(path, ".h5") as tmp:
        w = h5.ShardWriter(tmp, len(ids), 0, attrs, chunk, layout=layout.as_dict())
        try:
            w.append(x, y, ids)
            w.close()
        finally:
            w.abort()


def _attrs(cfg: dict, wl: Workload, **extra) -> dict:
    return {
        "format_version": h5.FORMAT_VERSION,
        "seed": int(cfg["seed"]),
        "workload": wl.name,
        **extra,
    }


def generate_shard(cfg: dict, wl: Workload, shard: int, out) -> dict:
    """Generation shard ``shard`` of ``data.n_shards``: the workload's samples of its ids."""
    t0 = time.perf_counter()
    n_total, n_shards = wl.n_samples(cfg), int(cfg["data"]["n_shards"])
    start, stop = shard_range(n_total, n_shards, shard)
    if stop == start:
        raise UserError(
            f"config key data.n_shards: {n_shards} shards for {n_total} samples leaves shard "
            f"{shard} empty; use at most {n_total} shards"
        )
    ids = np.arange(start, stop, dtype=np.int64)
    x, y = (np.asarray(a) for a in wl.samples(cfg, ids))
    lay = wl.layout(cfg)
    bad = lay.problems(x, y, f"workload {wl.name}, sample ids {start}..{stop - 1}")
    if bad:
        raise DataError("; ".join(bad))
    attrs = _attrs(
        cfg,
        wl,
        kind="raw",
        shard_index=shard,
        n_shards=n_shards,
        id_start=start,
        id_stop=stop,
        n_samples=n_total,
    )
    write_shard(out, x, y, ids, lay, attrs, int(cfg["data"]["chunk_samples"]))
    return {"n_samples": stop - start, "seconds": time.perf_counter() - t0}


def validate_shard(cfg: dict, wl: Workload, path, out) -> dict:
    """Check a generation shard against the declared layout (shapes, dtypes, finite values,
    class range, contiguous sample ids); write the report (``passed``) to ``out``."""
    path = Path(path)
    x, y, ids = h5.read_shard(path, check=False)
    attrs = h5.inspect_shard(path)["attrs"]
    lay = wl.layout(cfg)
    problems = lay.problems(x, y, str(path))
    start = int(attrs.get("id_start", 0))
    if not problems:  # every sample through a pandera schema (the shapes are whole-array)
        problems = [
            f"{path}: check {check} failed, e.g. sample_id {', '.join(map(str, bad)) or '?'}"
            for check, bad in per_sample_failures(x, y, ids, lay, start).items()
        ]
    report = {
        "passed": not problems,
        "problems": problems,
        "checks": list(CHECKS),
        "workload": wl.name,
        "shard_file": path.name,
        "id_start": start,
        "id_stop": start + len(ids),
        "n_samples": len(ids),
        "seed": int(cfg["seed"]),
        "sha256": sha256_file(path),
    }
    write_json_atomic(out, report)
    if problems:
        raise DataError("; ".join(problems))
    return report


def per_sample_failures(x, y, ids, lay: Layout, start: int) -> dict[str, list[int]]:
    """{check: first sample ids} of the per-sample table (finite values, class range, sample
    ids unique and the shard's range) validated with a pandera schema; {} when all pass."""
    import pandas as pd  # reason: pandas/pandera live in the workflow env only
    import pandera.errors as pe
    import pandera.pandas as pa

    n = len(ids)
    finite = np.isfinite(x.reshape(n, -1)).all(axis=1)
    if y.dtype.kind == "f":
        finite &= np.isfinite(y.reshape(n, -1)).all(axis=1)
    table = {"sample_id": ids, "all_finite": finite}
    cols = {
        "sample_id": pa.Column(
            np.int64,
            [
                pa.Check(
                    lambda s: ~s.duplicated(), name="sample_id_unique", error="sample_id_unique"
                ),
                pa.Check(
                    lambda s: pd.Series(
                        s.to_numpy() == np.arange(start, start + len(s)), index=s.index
                    ),
                    name="sample_id_matches_shard",
                    error="sample_id_matches_shard",
                ),
            ],
        ),
        "all_finite": pa.Column(
            bool, pa.Check.eq(True, name="all_values_finite", error="all_values_finite")
        ),
    }
    if lay.n_classes is not None:
        table["label"] = y.astype(np.int64)
        cols["label"] = pa.Column(
            np.int64,
            pa.Check.in_range(
                0, lay.n_classes - 1, name="label_in_classes", error="label_in_classes"
            ),
        )
    try:
        pa.DataFrameSchema(cols, strict=True).validate(pd.DataFrame(table), lazy=True)
    except pe.SchemaErrors as err:
        return _failures(err, ids) or {"schema": []}
    return {}


def split(cfg: dict, wl: Workload, shards, validations, outdir) -> dict:
    """Split validated generation shards into ``outdir``/{train,val,test} and manifest.json."""
    reports = [json.loads(Path(v).read_text()) for v in validations]
    for v, r in zip(validations, reports):
        if r.get("passed") is not True or r.get("seed") != int(cfg["seed"]):
            raise DataError(f"{v}: validation did not pass for this seed; validate the shard again")
    parts = [h5.read_shard(p) for p in sorted(map(Path, shards))]
    x = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    ids = np.concatenate([p[2] for p in parts])
    order = np.argsort(ids, kind="stable")
    x, y, ids = x[order], y[order], ids[order]
    if not np.array_equal(ids, np.arange(len(ids))):
        raise DataError(
            f"shards {', '.join(map(str, shards))}: sample ids are not 0..{len(ids) - 1}"
        )
    summary = {
        "passed": True,
        "n_shards": len(reports),
        "n_samples": len(ids),
        "checks": list(CHECKS),
        "shards": reports,
    }
    return write_splits(cfg, wl, x, y, ids, outdir, summary)


def write_splits(cfg: dict, wl: Workload, x, y, ids, outdir, validation: dict) -> dict:
    """Train/val/test shards of the arrays (split per (seed, sample id)), validation.json and
    manifest.json in ``outdir``; returns the manifest."""
    d, outdir, lay = cfg["data"], Path(outdir), wl.layout(cfg)
    frac, vfrac, seed = float(d["train_fraction"]), float(d["val_fraction"]), int(cfg["seed"])
    which = split_assign(seed, wl.split_keys(cfg, ids), frac, vfrac)
    stats = {"curves": RunningStats(lay.sample_shape[-1] if lay.sample_shape else 1)}
    if wl.normalise_labels:
        stats["labels"] = RunningStats(int(np.prod(lay.label_shape or (1,))))
    entries, counts = {}, {"total": len(ids)}
    for s in SPLITS:
        sel = np.flatnonzero(which == SPLIT_CODES[s])
        counts[s] = len(sel)
        k = int(d["split_shards"][s])
        if len(sel) < k:
            raise DataError(
                f"{s} split: {len(sel)} samples for {k} shards (data.split_shards.{s}); use "
                "more samples or fewer shards"
            )
        entries[s], at = [], 0
        for i, m in enumerate(even_sizes(len(sel), k)):
            rows = sel[at : at + m]
            at += m
            path = outdir / s / shard_name(i)
            path.parent.mkdir(parents=True, exist_ok=True)
            attrs = _attrs(cfg, wl, kind=s, shard_index=i, n_shards=k)
            write_shard(path, x[rows], y[rows], ids[rows], lay, attrs, int(d["chunk_samples"]))
            entries[s].append(
                {
                    "file": f"{s}/{shard_name(i)}",
                    "n_samples": int(m),
                    "first_sample_id": int(ids[rows[0]]),
                    "last_sample_id": int(ids[rows[-1]]),
                    **finish_file(path),
                }
            )
            if s == "train":
                stats["curves"].add(x[rows].reshape(m, -1, stats["curves"].mean.shape[0]))
                if "labels" in stats:
                    stats["labels"].add(y[rows].reshape(m, -1).astype(np.float64))
    cm, cs = stats["curves"].result()
    lm, ls = stats["labels"].result() if "labels" in stats else ([], [])
    manifest = {
        "manifest_version": MANIFEST_VERSION,
        "format_version": h5.FORMAT_VERSION,
        "created_by": f"hvdscale {__version__}",
        "seed": seed,
        "workload": wl.name,
        "layout": lay.as_dict(),
        "n_points": None,
        "train_fraction": frac,
        "val_fraction": vfrac,
        "split_rule": f"u = uniform(seed, {wl.split_key_name}): val if u < train_fraction * "
        "val_fraction, train if u < train_fraction, else test "
        "(hvdscale.data.physics.split_assign)",
        "counts": counts,
        "shards": entries,
        "normalisation": {
            "source": "train split",
            "curves": {"axis": "last", "mean": cm, "std": cs},
            "labels": {"mean": lm, "std": ls},
        },
    }
    write_json_atomic(outdir / "validation.json", validation)
    write_json_atomic(outdir / MANIFEST_NAME, manifest)
    return manifest


def import_data(wl: Workload, cfg: dict, outdir) -> dict:
    """The user's arrays (the workload's samples, all of them) through the data stage of a
    study: one generation shard, its validation, the split into ``outdir`` (the same
    functions as rules generate_shard, validate_shard and split_dataset, so a study whose
    workload reads the same file with the same seed, fractions and shard counts gets the
    same shards and checksums); returns the manifest."""
    import tempfile

    cfg = {**cfg, "data": {**cfg["data"], "n_shards": 1}}
    Path(outdir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=outdir, prefix=".raw-") as tmp:
        raw, rep = Path(tmp) / "shard-0000.h5", Path(tmp) / "shard-0000.validation.json"
        generate_shard(cfg, wl, 0, raw)
        validate_shard(cfg, wl, raw, rep)
        return split(cfg, wl, [raw], [rep], outdir)


def handles(cfg: dict) -> bool:
    """Whether this module makes the data of ``cfg`` (every workload but stress-strain)."""
    return workload_name(cfg) != "stress-strain"


# ------------------------------------------- the data-stage commands of every workload
# generate-shard, validate-shard and split-dataset: stress-strain's own modules
# (hvdscale.data.generate/validate/split) or this module's functions for other workloads


def _data_cfg(args) -> dict:
    return load_data_config(args.config)


def _command(stock, make, said):
    """A data command for every workload: ``stock`` (the stress-strain module with its
    ``add_arguments``/``run``) where the config's workload is stress-strain, else ``make(cfg,
    workload, args)`` here and one line ``said(result, args)`` on stderr. The same flags
    and --help text as the stock command."""

    def add_arguments(p):
        stock.add_arguments(p)

    def run(args) -> int:
        cfg = _data_cfg(args)
        if not handles(cfg):
            return stock.run(args)
        print(said(make(cfg, workload_for(cfg), args), args), file=sys.stderr)
        return 0

    run.__doc__ = stock.run.__doc__
    return add_arguments, run


add_generate_arguments, run_generate = _command(
    generate,
    lambda cfg, w, a: generate_shard(cfg, w, a.shard, a.out) | {"workload": workload_name(cfg)},
    lambda info, a: (
        f"generate-shard {a.shard}: wrote {info['n_samples']} samples of workload "
        f"{info['workload']} to {a.out} in {info['seconds']:.1f} s"
    ),
)
add_validate_arguments, run_validate = _command(
    validate,
    lambda cfg, w, a: validate_shard(cfg, w, a.shard, a.out),
    lambda rep, a: f"validate-shard: {a.shard}: {rep['n_samples']} samples passed "
    f"{len(CHECKS)} checks",
)
add_split_arguments, run_split = _command(
    split_mod,
    lambda cfg, w, a: split(cfg, w, a.shards, a.validations, a.outdir),
    lambda m, a: f"split-dataset: {m['counts']} samples of workload {m['workload']} in {a.outdir}",
)


# -------------------------------------------------- the command: hvdscale import-data


def add_import_arguments(p):
    p.add_argument("--input", required=True, help="a .npz or HDF5 file with samples and labels")
    p.add_argument("--x-key", default="x", help="the samples' array in the file (default x)")
    p.add_argument("--y-key", default="y", help="the labels' array in the file (default y)")
    p.add_argument(
        "--n-classes",
        type=int,
        default=None,
        help="labels are class indices 0..N-1 (a classifier); leave out for regression",
    )
    p.add_argument("--name", help="the workload's name (default: the file's stem)")
    p.add_argument("--seed", type=int, default=0, help="seed of the split (default 0)")
    p.add_argument("--train-fraction", type=float, default=0.75)
    p.add_argument(
        "--val-fraction",
        type=float,
        default=0.1,
        help="share of the train fraction held out for validation (default 0.1)",
    )
    p.add_argument(
        "--shards",
        type=int,
        nargs=3,
        default=[1, 1, 1],
        metavar=("TRAIN", "VAL", "TEST"),
        help="shards per split (default 1 1 1)",
    )
    p.add_argument(
        "--chunk-samples",
        type=int,
        default=1024,
        help="HDF5 chunk size along the sample axis (data.chunk_samples, default 1024)",
    )
    p.add_argument(
        "--out", required=True, help="output data directory (manifest.json, train/, val/, test/)"
    )


def run_import(args) -> int:
    """Convert your own arrays into the sharded, checksummed, validated dataset format.

    Reads samples (float) and labels from a .npz or HDF5 file, checks them (the same shape
    for every sample, finite values, labels of a classifier integers in 0..N-1), decides
    each sample's split from (seed, row) with the dataset contract's rule (validation:
    u < train_fraction x val_fraction, train: u < train_fraction, else test), and writes
    train/val/test HDF5 shards with their sha256 and the train split's normalisation
    statistics in manifest.json. Sample i is row i of the file. Check the result with
    hvdscale check-data --verify-checksums.

    It runs the data stage of a study: a study whose workload is an ArrayWorkload on the
    same file (config key workload: module:object) makes the same shards, with the same
    checksums, from the same seed, fractions, shard counts and workload name.

    Example:
      hvdscale import-data --input my_arrays.npz --n-classes 3 --out mydata
    """
    x, y = read_arrays(args.input, args.x_key, args.y_key)
    if x.ndim < 2:
        raise UserError(
            f"{args.input}: samples {args.x_key!r} of shape {x.shape}; expected (n, ...)"
        )
    wl = ArrayWorkload(
        args.name or Path(args.input).stem,
        args.input,
        [],
        x.shape[1:],
        y.shape[1:] if args.n_classes is None else (),
        args.n_classes,
        args.x_key,
        args.y_key,
    )
    tr, va, te = args.shards
    cfg = {
        "seed": args.seed,
        "data": {
            "train_fraction": args.train_fraction,
            "val_fraction": args.val_fraction,
            "chunk_samples": args.chunk_samples,
            "split_shards": {"train": tr, "val": va, "test": te},
        },
    }
    m = import_data(wl, cfg, args.out)
    c = m["counts"]
    print(
        f"import-data: {c['total']} samples ({c['train']} train, {c['val']} val, {c['test']} "
        f"test) of shape {tuple(x.shape[1:])} written to {args.out}",
        file=sys.stderr,
    )
    return 0
