"""HDF5 shard files: the one place that opens, checks, reads and writes them.

Layout (the dataset contract, ``format_version`` 1):

* ``curves``    float32 (n, n_points, 3), channels strain, stress, flag
* ``labels``    float32 (n, 2), yield_stress, hardening_modulus
* ``sample_id`` int64 (n,)
* attributes ``format_version``, ``seed``, ``channel_names``, ``label_names``,
  ``label_units``, label ranges (``label_min``, ``label_max``), the generator
  parameters (``generator_json`` and one attribute each) and per-file information.

Every dataset is chunked along the sample axis and uncompressed. Files are written so
that their bytes depend only on their content (no timestamps, space allocated at
creation in chunk order, no fill pass): the same config gives the same sha256.

Every problem with a file (missing, truncated, not HDF5, a dataset missing or of the
wrong dtype/shape, non-finite values) is raised as :class:`hvdscale.errors.DataError`
naming the file and what is wrong. Only numpy and h5py are imported, so the training
environment (numpy 1.26, no pandas) can use :func:`read_shard` and :func:`read_shards`.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import h5py
import numpy as np

from hvdscale.errors import DataError

FORMAT_VERSION = 1
CHANNEL_NAMES = ("strain", "stress", "flag")
LABEL_NAMES = ("yield_stress", "hardening_modulus")
DATASETS = {"curves": np.float32, "labels": np.float32, "sample_id": np.int64}
REQUIRED_ATTRS = ("format_version", "seed", "channel_names", "label_names", "label_units")


def _h5_message(exc: BaseException) -> str:
    msg = str(exc).strip() or type(exc).__name__
    return msg.replace("\n", " ")[:300]


@contextlib.contextmanager
def open_h5(path: str | Path) -> Iterator[h5py.File]:
    """Open a shard read-only; any HDF5 failure inside the block becomes a DataError."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: file not found")
    if not path.is_file():
        raise DataError(f"{path}: not a regular file")
    try:
        fh = h5py.File(path, "r")
    except (OSError, ValueError, RuntimeError) as exc:
        size = path.stat().st_size
        raise DataError(
            f"{path}: not a readable HDF5 file (truncated, corrupt or not HDF5; {size} bytes): "
            f"{_h5_message(exc)}"
        ) from None
    try:
        with fh:
            yield fh
    except DataError:
        raise
    except (OSError, ValueError, RuntimeError, KeyError, TypeError) as exc:
        raise DataError(
            f"{path}: cannot read (corrupt or truncated HDF5 file): {_h5_message(exc)}"
        ) from None


def _decode(v):
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, np.ndarray):
        if v.dtype.kind in ("O", "S", "U"):
            return [x.decode() if isinstance(x, bytes) else str(x) for x in v.tolist()]
        return v.tolist()
    if isinstance(v, np.generic):
        return v.item()
    return v


def read_attrs(fh: h5py.File) -> dict:
    """File attributes as plain Python values (str, int, float, list)."""
    return {k: _decode(fh.attrs[k]) for k in fh.attrs.keys()}


def check_layout(fh: h5py.File, path: str | Path, n_points: int | None = None) -> int:
    """Check datasets, dtypes, shapes and required attributes; return the sample count.

    A shard of another workload than stress-strain carries its layout (attribute
    ``layout_json``: sample and label shapes and dtypes) and is checked against it."""
    path = Path(path)
    if "layout_json" in fh.attrs:
        return _check_declared_layout(fh, path)
    missing = [name for name in DATASETS if name not in fh]
    if missing:
        have = ", ".join(sorted(fh.keys())) or "none"
        raise DataError(f"{path}: dataset(s) {', '.join(missing)} missing (has: {have})")
    for name, dtype in DATASETS.items():
        ds = fh[name]
        if not isinstance(ds, h5py.Dataset):
            raise DataError(f"{path}: '{name}' is not a dataset")
        if ds.dtype != np.dtype(dtype):
            raise DataError(
                f"{path}: dataset '{name}' has dtype {ds.dtype}; expected {np.dtype(dtype)}"
            )
    curves, labels, ids = fh["curves"], fh["labels"], fh["sample_id"]
    if curves.ndim != 3 or curves.shape[2] != len(CHANNEL_NAMES):
        raise DataError(
            f"{path}: dataset 'curves' has shape {curves.shape}; expected (n, n_points, 3)"
        )
    n = curves.shape[0]
    if n_points is not None and curves.shape[1] != n_points:
        raise DataError(
            f"{path}: dataset 'curves' has shape {curves.shape}; expected (n, {n_points}, 3)"
        )
    if labels.shape != (n, len(LABEL_NAMES)):
        raise DataError(
            f"{path}: dataset 'labels' has shape {labels.shape}; expected ({n}, {len(LABEL_NAMES)})"
        )
    if ids.shape != (n,):
        raise DataError(f"{path}: dataset 'sample_id' has shape {ids.shape}; expected ({n},)")
    absent = [a for a in REQUIRED_ATTRS if a not in fh.attrs]
    if absent:
        raise DataError(f"{path}: attribute(s) {', '.join(absent)} missing")
    version = _decode(fh.attrs["format_version"])
    if version != FORMAT_VERSION:
        raise DataError(f"{path}: format_version {version!r}; this hvdscale reads {FORMAT_VERSION}")
    if tuple(_decode(fh.attrs["channel_names"])) != CHANNEL_NAMES:
        raise DataError(
            f"{path}: channel_names {_decode(fh.attrs['channel_names'])}; "
            f"expected {list(CHANNEL_NAMES)}"
        )
    if tuple(_decode(fh.attrs["label_names"])) != LABEL_NAMES:
        raise DataError(
            f"{path}: label_names {_decode(fh.attrs['label_names'])}; expected {list(LABEL_NAMES)}"
        )
    return n


def _check_declared_layout(fh: h5py.File, path: Path) -> int:
    """``check_layout`` of a shard that declares its layout (``layout_json``)."""
    lay = json.loads(_decode(fh.attrs["layout_json"]))
    want = {
        "curves": (np.dtype(lay["sample_dtype"]), tuple(lay["sample_shape"])),
        "labels": (np.dtype(lay["label_dtype"]), tuple(lay["label_shape"])),
        "sample_id": (np.dtype(np.int64), ()),
    }
    missing = [name for name in want if name not in fh]
    if missing:
        have = ", ".join(sorted(fh.keys())) or "none"
        raise DataError(f"{path}: dataset(s) {', '.join(missing)} missing (has: {have})")
    n = fh["curves"].shape[0] if fh["curves"].ndim else -1
    for name, (dtype, shape) in want.items():
        ds = fh[name]
        if ds.dtype != dtype:
            raise DataError(f"{path}: dataset '{name}' has dtype {ds.dtype}; expected {dtype}")
        if tuple(ds.shape) != (n, *shape):
            raise DataError(
                f"{path}: dataset '{name}' has shape {ds.shape}; expected {(n, *shape)}"
            )
    version = _decode(fh.attrs.get("format_version"))
    if version != FORMAT_VERSION:
        raise DataError(f"{path}: format_version {version!r}; this hvdscale reads {FORMAT_VERSION}")
    return n


def _buffers(fh: h5py.File, n: int):
    """Empty arrays for ``n`` rows of the shard's curves, labels and sample ids."""
    return (
        np.empty((n, *fh["curves"].shape[1:]), dtype=fh["curves"].dtype),
        np.empty((n, *fh["labels"].shape[1:]), dtype=fh["labels"].dtype),
        np.empty(n, dtype=np.int64),
    )


def inspect_shard(path: str | Path, n_points: int | None = None) -> dict:
    """Open and check a shard without reading the arrays: ``{"n", "n_points", "attrs"}``."""
    with open_h5(path) as fh:
        n = check_layout(fh, path, n_points)
        return {
            "n": n,
            "n_points": fh["curves"].shape[1],
            "attrs": read_attrs(fh),
            "row_shapes": (fh["curves"].shape[1:], fh["labels"].shape[1:]),
            "dtypes": (fh["curves"].dtype, fh["labels"].dtype),
        }


def _first_bad(mask: np.ndarray, ids: np.ndarray, k: int = 10) -> str:
    return ", ".join(str(int(i)) for i in ids[np.flatnonzero(mask)[:k]])


def check_finite(path, curves: np.ndarray, labels: np.ndarray, ids: np.ndarray) -> None:
    """Raise DataError naming the file and the first sample ids with NaN/inf values."""
    bad_c = ~np.isfinite(curves).reshape(len(curves), -1).all(axis=1)
    bad_l = ~np.isfinite(labels).reshape(len(labels), -1).all(axis=1)
    bad = bad_c | bad_l
    if bad.any():
        raise DataError(
            f"{path}: {int(bad.sum())} sample(s) with NaN or infinite values, e.g. sample_id "
            f"{_first_bad(bad, ids)}"
        )


def read_shard(path: str | Path, n_points: int | None = None, check: bool = True):
    """Read one shard.

    Returns ``(curves float32 (n, n_points, 3), labels float32 (n, 2), sample_id int64 (n,))``.

    With ``check`` (the default) non-finite values raise DataError.
    """
    with open_h5(path) as fh:
        n = check_layout(fh, path, n_points)
        curves, labels, ids = _buffers(fh, n)
        if n:
            fh["curves"].read_direct(curves)
            fh["labels"].read_direct(labels)
            fh["sample_id"].read_direct(ids)
    if check:
        check_finite(path, curves, labels, ids)
    return curves, labels, ids


def read_shards(paths: Sequence[str | Path], n_points: int | None = None, check: bool = True):
    """Read and concatenate several shards (in the given order) without an extra copy."""
    paths = [Path(p) for p in paths]
    if not paths:
        raise DataError("no shard files given")
    infos = [inspect_shard(p, n_points) for p in paths]
    n_points = infos[0]["n_points"]
    for p, info in zip(paths, infos):
        if info["n_points"] != n_points:
            raise DataError(f"{p}: {info['n_points']} points per curve; {paths[0]} has {n_points}")
    for p, info in zip(paths, infos):
        if info["row_shapes"] != infos[0]["row_shapes"] or info["dtypes"] != infos[0]["dtypes"]:
            raise DataError(f"{p}: sample or label layout differs from {paths[0]}")
    total = sum(i["n"] for i in infos)
    curves, labels, ids = empty_rows(infos[0], total)
    at = 0
    for p, info in zip(paths, infos):
        n = info["n"]
        with open_h5(p) as fh:
            check_layout(fh, p, n_points)
            if fh["curves"].shape[0] != n:
                raise DataError(f"{p}: changed while reading")
            if n:
                fh["curves"].read_direct(curves, dest_sel=np.s_[at : at + n])
                fh["labels"].read_direct(labels, dest_sel=np.s_[at : at + n])
                fh["sample_id"].read_direct(ids, dest_sel=np.s_[at : at + n])
        if check:
            check_finite(p, curves[at : at + n], labels[at : at + n], ids[at : at + n])
        at += n
    return curves, labels, ids


def empty_rows(info: dict, n: int):
    """Empty arrays for ``n`` rows laid out as the shard ``info`` (``inspect_shard``)."""
    (cs, ls), (cd, ld) = info["row_shapes"], info["dtypes"]
    return np.empty((n, *cs), dtype=cd), np.empty((n, *ls), dtype=ld), np.empty(n, dtype=np.int64)


def read_range(
    paths: Sequence[str | Path],
    start: int,
    stop: int,
    n_points: int | None = None,
    check: bool = True,
):
    """Rows [start, stop) of the concatenation of ``paths`` (in order), as ``read_shards``.

    Only the files and rows in the range are read, so each worker of a run can load just
    its contiguous slice of a split.
    """
    paths = [Path(p) for p in paths]
    if not paths:
        raise DataError("no shard files given")
    infos = [inspect_shard(p, n_points) for p in paths]
    n_points = infos[0]["n_points"]
    total = sum(i["n"] for i in infos)
    if not 0 <= start <= stop <= total:
        raise DataError(
            f"rows {start}..{stop}: outside the {total} samples of {paths[0]} .. {paths[-1]}"
        )
    m = stop - start
    curves, labels, ids = empty_rows(infos[0], m)
    offset = 0  # first row of the current file in the concatenation
    for p, info in zip(paths, infos):
        lo, hi = max(start, offset), min(stop, offset + info["n"])
        if lo < hi:
            with open_h5(p) as fh:
                check_layout(fh, p, n_points)
                src, dst = np.s_[lo - offset : hi - offset], np.s_[lo - start : hi - start]
                fh["curves"].read_direct(curves, source_sel=src, dest_sel=dst)
                fh["labels"].read_direct(labels, source_sel=src, dest_sel=dst)
                fh["sample_id"].read_direct(ids, source_sel=src, dest_sel=dst)
            if check:
                check_finite(p, curves[dst], labels[dst], ids[dst])
        offset += info["n"]
    return curves, labels, ids


def iter_blocks(
    path: str | Path,
    block: int,
    n_points: int | None = None,
    start: int = 0,
    stop: int | None = None,
) -> Iterator[tuple]:
    """Stream rows [start, stop) of a shard: yields ``(row, curves, labels, sample_id)`` blocks.

    Blocks hold at most ``block`` samples; the arrays are reused between iterations
    (copy them to keep them). No finiteness check (validation reports non-finite values
    itself).
    """
    with open_h5(path) as fh:
        n = check_layout(fh, path, n_points)
        cbuf, lbuf, ibuf = _buffers(fh, block)
        stop = n if stop is None else min(int(stop), n)
        for a in range(max(0, int(start)), stop, block):
            b = min(stop, a + block)
            m = b - a
            fh["curves"].read_direct(cbuf, source_sel=np.s_[a:b], dest_sel=np.s_[:m])
            fh["labels"].read_direct(lbuf, source_sel=np.s_[a:b], dest_sel=np.s_[:m])
            fh["sample_id"].read_direct(ibuf, source_sel=np.s_[a:b], dest_sel=np.s_[:m])
            yield a, cbuf[:m], lbuf[:m], ibuf[:m]


# --------------------------------------------------------------------------- writing


def common_attrs(params) -> dict:
    """The contract attributes plus the generator parameters (``physics.GeneratorParams``)."""
    d = params.as_dict()
    attrs = {
        "format_version": FORMAT_VERSION,
        "seed": int(params.seed),
        "channel_names": list(CHANNEL_NAMES),
        "label_names": list(LABEL_NAMES),
        "label_units": list(params.label_units),
        "label_min": np.asarray(params.label_min, dtype=np.float64),
        "label_max": np.asarray(params.label_max, dtype=np.float64),
        "generator_json": json.dumps(d, sort_keys=True, separators=(",", ":")),
    }
    for k in (
        "generator",
        "generator_version",
        "n_samples",
        "n_points",
        "youngs_modulus",
        "max_strain",
        "cycles",
        "noise_std",
    ):
        attrs[k] = d[k]
    return attrs


def _writeback_starter():
    """``start(fd)``: ask Linux to begin writing a file's dirty pages (no waiting), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        fn = libc.sync_file_range
        fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    except (OSError, AttributeError):
        return None
    sync_file_range_write = 2

    def start(fd: int) -> None:
        fn(fd, 0, 0, sync_file_range_write)

    return start


_START_WRITEBACK = _writeback_starter()


class ShardWriter:
    """Write one shard of exactly ``n`` samples, appended in order, to ``path``.

    ``path`` should be a temporary path (see ``hvdscale.io.atomic_path``). Space for
    every chunk is allocated when the datasets are created (in chunk order, without a
    fill pass), and no timestamps are stored, so the bytes depend only on the content.
    With ``writeback`` (Linux), the kernel is asked to start writing the data to disk
    after every append, so the final fsync finds little left to do and the disk works
    while the next block is computed.
    """

    def __init__(
        self,
        path: str | Path,
        n: int,
        n_points: int,
        attrs: dict,
        chunk_samples: int = 1024,
        writeback: bool = True,
        layout: dict | None = None,
    ):
        self.path = Path(path)
        self.n = int(n)
        self.at = 0
        self.fh = h5py.File(self.path, "w", libver=("earliest", "v110"), track_order=False)
        self._fd = None
        if writeback and _START_WRITEBACK is not None:
            try:
                self._fd = int(self.fh.id.get_vfd_handle())
            except (TypeError, ValueError, OSError, RuntimeError):
                self._fd = None
        try:
            for k, v in attrs.items():
                if isinstance(v, (list, tuple)) and v and all(isinstance(x, str) for x in v):
                    v = np.array(v, dtype=h5py.string_dtype())
                self.fh.attrs[k] = v
            chunk = max(1, min(int(chunk_samples), self.n)) if self.n else 1
            if layout is not None:  # another workload's shard (``Layout.as_dict``)
                self.fh.attrs["layout_json"] = json.dumps(layout, sort_keys=True)
                self._dtypes = (np.dtype(layout["sample_dtype"]), np.dtype(layout["label_dtype"]))
                cs, ls = tuple(layout["sample_shape"]), tuple(layout["label_shape"])
                self.curves = self._create("curves", (self.n, *cs), self._dtypes[0], (chunk, *cs))
                self.labels = self._create("labels", (self.n, *ls), self._dtypes[1], (chunk, *ls))
                self.ids = self._create("sample_id", (self.n,), np.int64, (chunk,))
                return
            self._dtypes = (np.dtype(np.float32), np.dtype(np.float32))
            self.curves = self._create(
                "curves",
                (self.n, n_points, len(CHANNEL_NAMES)),
                np.float32,
                (chunk, n_points, len(CHANNEL_NAMES)),
            )
            self.labels = self._create(
                "labels", (self.n, len(LABEL_NAMES)), np.float32, (chunk, len(LABEL_NAMES))
            )
            self.ids = self._create("sample_id", (self.n,), np.int64, (chunk,))
        except BaseException:
            self.fh.close()
            raise

    def _create(self, name, shape, dtype, chunks):
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_chunk(chunks)
        dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
        dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
        dcpl.set_obj_track_times(False)
        space = h5py.h5s.create_simple(shape, shape)
        tid = h5py.h5t.py_create(np.dtype(dtype), logical=True)
        dsid = h5py.h5d.create(self.fh.id, name.encode(), tid, space, dcpl=dcpl)
        return h5py.Dataset(dsid)

    def append(self, curves: np.ndarray, labels: np.ndarray, ids: np.ndarray) -> None:
        m = len(ids)
        if m == 0:
            return
        if self.at + m > self.n:
            raise ValueError(
                f"{self.path}: {self.at + m} samples written; the shard holds {self.n}"
            )
        sel = np.s_[self.at : self.at + m]
        self.curves.write_direct(np.ascontiguousarray(curves, dtype=self._dtypes[0]), dest_sel=sel)
        self.labels.write_direct(np.ascontiguousarray(labels, dtype=self._dtypes[1]), dest_sel=sel)
        self.ids.write_direct(np.ascontiguousarray(ids, dtype=np.int64), dest_sel=sel)
        self.at += m
        if self._fd is not None:
            _START_WRITEBACK(self._fd)

    @property
    def full(self) -> bool:
        return self.at >= self.n

    def close(self) -> None:
        if self.fh:
            if self.at != self.n:
                self.fh.close()
                self.fh = None
                raise ValueError(f"{self.path}: {self.at} of {self.n} samples written")
            self.fh.close()
            self.fh = None

    def abort(self) -> None:
        if self.fh:
            self.fh.close()
            self.fh = None
