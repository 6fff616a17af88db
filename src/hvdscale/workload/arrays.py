"""A workload on the user's own arrays: ``ArrayWorkload`` reads samples and labels from
a NumPy ``.npz`` file (or an HDF5 file) with the layout the user declares; the data
stage converts them into the sharded, checksummed format (sample i is row i of the
file)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hvdscale.errors import ConfigError
from hvdscale.workload.base import VAL_ACCURACY, VAL_LOSS, Layout, Workload


def read_arrays(path: str | Path, x_key: str = "x", y_key: str = "y"):
    """(x, y) of a ``.npz`` or HDF5 file (keys ``x_key``/``y_key``); ConfigError naming the file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: file not found")
    try:
        if path.suffix in (".h5", ".hdf5"):
            import h5py  # reason: HDF5 input only

            with h5py.File(path, "r") as fh:
                return np.asarray(fh[x_key]), np.asarray(fh[y_key])
        with np.load(path, allow_pickle=False) as z:
            return np.asarray(z[x_key]), np.asarray(z[y_key])
    except KeyError as exc:
        raise ConfigError(
            f"{path}: no array {exc} (expected keys {x_key!r} and {y_key!r})"
        ) from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: not a readable .npz or HDF5 file ({exc})") from None


class ArrayWorkload(Workload):
    """Samples and labels from one file. ``n_classes`` set: a classifier (int64 labels,
    cross-entropy, target on the validation accuracy); else a regression (float32 labels,
    mean squared error, target on the validation loss)."""

    def __init__(
        self,
        name: str,
        path: str | Path,
        layers,
        sample_shape,
        label_shape=(),
        n_classes: int | None = None,
        x_key: str = "x",
        y_key: str = "y",
    ):
        self.name = name
        self.path = Path(path)
        self._layers = [tuple(layer) for layer in layers]
        self.x_key, self.y_key = x_key, y_key
        self.classifier = n_classes is not None
        self.loss = "cross_entropy" if self.classifier else "mse"
        self.metric = VAL_ACCURACY if self.classifier else VAL_LOSS
        self.normalise_labels = not self.classifier
        self._layout = Layout(
            tuple(sample_shape),
            tuple(label_shape),
            "float32",
            "int64" if self.classifier else "float32",
            n_classes,
        )
        self._arrays = None

    def _data(self):
        if self._arrays is None:
            self._arrays = read_arrays(self.path, self.x_key, self.y_key)
        return self._arrays

    def layout(self, cfg: dict) -> Layout:
        return self._layout

    def n_samples(self, cfg: dict) -> int:
        return len(self._data()[0])

    def samples(self, cfg: dict, ids: np.ndarray):
        x, y = self._data()
        ids = np.asarray(ids, dtype=np.int64)
        xs, ys = x[ids], y[ids]
        if xs.dtype.kind == "f":  # float64 arrays are stored as float32
            xs = xs.astype(np.float32)
        if ys.dtype.kind in ("iu" if self.classifier else "f"):
            ys = ys.astype(self._layout.label_dtype)
        return xs, ys

    def layers(self, cfg: dict):
        return self._layers
