"""The workload interface: ``Workload``, its data ``Layout`` and validation ``Metric``, the
layer description both frameworks build from, and ``workload_for(cfg)``, which finds the
config's workload (a built-in name or an importable ``module:object``) and checks that it
gives every part. Pure Python and numpy (both environments import it)."""

from __future__ import annotations

import importlib
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hvdscale.errors import ConfigError

DEFAULT = "stress-strain"
#: built-in workloads: name -> "module:object"
BUILTIN = {
    "stress-strain": "hvdscale.workload.stress_strain:WORKLOAD",
    "digits": "hvdscale.workload.digits:WORKLOAD",
}
LOSSES = ("mse", "cross_entropy")
SAMPLE_DTYPES = ("float32",)
LABEL_DTYPES = ("float32", "int64")


@dataclass(frozen=True)
class Metric:
    """The validation metric the study's target uses: ``key`` is its field in a record's
    epochs, ``goal`` whether the target is a value to go below (``min``, a loss) or to
    reach (``max``, an accuracy)."""

    key: str
    name: str
    goal: str
    units: str

    def reached(self, value, target) -> bool:
        """Whether ``value`` meets ``target`` (non-finite values never do)."""
        if not _finite(value) or not _finite(target):
            return False
        return value <= target if self.goal == "min" else value >= target

    def best(self, values):
        """The best finite value of ``values`` (None without one)."""
        vals = [float(v) for v in values if _finite(v)]
        if not vals:
            return None
        return min(vals) if self.goal == "min" else max(vals)

    def describe(self, value) -> str:
        """``value`` in the metric's units, e.g. 'validation accuracy 0.95 (fraction ...)'."""
        return f"{self.name} {float(value):.4g} ({self.units})"


VAL_LOSS = Metric(
    "val_loss", "validation loss", "min", "mean squared error of the normalised labels"
)
VAL_ACCURACY = Metric(
    "val_accuracy",
    "validation accuracy",
    "max",
    "fraction of validation samples classified correctly",
)

#: a metric's key -> the metric (target.json and run records name it by its key)
METRICS = {m.key: m for m in (VAL_LOSS, VAL_ACCURACY)}


def _finite(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True)
class Layout:
    """One sample and its label: shapes without the sample axis, dtypes, and for a
    classifier the number of classes (labels are class indices 0..n_classes-1)."""

    sample_shape: tuple[int, ...]
    label_shape: tuple[int, ...]
    sample_dtype: str = "float32"
    label_dtype: str = "float32"
    n_classes: int | None = None

    def as_dict(self) -> dict:
        return {
            "sample_shape": list(self.sample_shape),
            "label_shape": list(self.label_shape),
            "sample_dtype": self.sample_dtype,
            "label_dtype": self.label_dtype,
            "n_classes": self.n_classes,
        }

    @classmethod
    def from_dict(cls, d: dict) -> Layout:
        return cls(
            tuple(int(x) for x in d["sample_shape"]),
            tuple(int(x) for x in d["label_shape"]),
            str(d["sample_dtype"]),
            str(d["label_dtype"]),
            None if d.get("n_classes") is None else int(d["n_classes"]),
        )

    def problems(self, x: np.ndarray, y: np.ndarray, what: str) -> list[str]:
        """What is wrong with arrays ``x`` (n, *sample_shape) and ``y`` (n, *label_shape)."""
        out = []
        n = len(x)
        if tuple(x.shape) != (n, *self.sample_shape):
            out.append(
                f"{what}: samples of shape {tuple(x.shape)[1:]}, declared {self.sample_shape}"
            )
        if tuple(y.shape) != (len(y), *self.label_shape):
            out.append(f"{what}: labels of shape {tuple(y.shape)[1:]}, declared {self.label_shape}")
        if len(y) != n:
            out.append(f"{what}: {n} samples but {len(y)} labels")
        if x.dtype != np.dtype(self.sample_dtype):
            out.append(f"{what}: samples of dtype {x.dtype}, declared {self.sample_dtype}")
        if y.dtype != np.dtype(self.label_dtype):
            out.append(f"{what}: labels of dtype {y.dtype}, declared {self.label_dtype}")
        if out:
            return out
        bad = ~np.isfinite(x.reshape(n, -1)).all(axis=1)
        if y.dtype.kind == "f":
            bad |= ~np.isfinite(y.reshape(n, -1)).all(axis=1)
        if bad.any():
            out.append(
                f"{what}: {int(bad.sum())} sample(s) with NaN or infinite values, e.g. row "
                f"{int(np.flatnonzero(bad)[0])}"
            )
        if self.n_classes is not None:
            off = (y < 0) | (y >= self.n_classes)
            if off.any():
                i = int(np.flatnonzero(off.reshape(len(y), -1).any(axis=1))[0])
                out.append(
                    f"{what}: label {y[i].tolist()} of row {i} outside the classes "
                    f"0..{self.n_classes - 1}"
                )
        return out


# ------------------------------------------------------------------ layer descriptions
#: a network is a list of layers, each a tuple:
#:   ("conv2d", filters, kernel, activation)  'valid' padding, stride 1, channels last
#:   ("maxpool2d", size)                       stride = size
#:   ("flatten",)
#:   ("dense", units, activation or None)
ACTIVATIONS = ("relu", "tanh", "gelu", "swish", None)


def layer_problems(layers, sample_shape: tuple[int, ...]) -> list[str]:
    """What is wrong with a layer description for samples of ``sample_shape``."""
    shape = tuple(sample_shape)
    for i, layer in enumerate(layers):
        kind = layer[0] if isinstance(layer, tuple | list) and layer else None
        where = f"layer {i} {layer!r}"
        if kind == "conv2d":
            if len(shape) != 3 or len(layer) != 4 or layer[3] not in ACTIVATIONS:
                return [
                    f"{where}: conv2d needs (H, W, C) samples and (filters, kernel, activation)"
                ]
            k = int(layer[2])
            if shape[0] < k or shape[1] < k:
                return [f"{where}: kernel {k} larger than the input {shape}"]
            shape = (shape[0] - k + 1, shape[1] - k + 1, int(layer[1]))
        elif kind == "maxpool2d":
            if len(shape) != 3:
                return [f"{where}: maxpool2d needs (H, W, C) input, got {shape}"]
            s = int(layer[1])
            shape = (shape[0] // s, shape[1] // s, shape[2])
        elif kind == "flatten":
            shape = (int(np.prod(shape)),)
        elif kind == "dense":
            if len(shape) != 1 or len(layer) != 3 or layer[2] not in ACTIVATIONS:
                return [
                    f"{where}: dense needs flat input (add ('flatten',)) and (units, activation)"
                ]
            shape = (int(layer[1]),)
        else:
            return [f"{where}: unknown layer (expected conv2d, maxpool2d, flatten or dense)"]
    return []


def layers_parameter_count(layers, sample_shape: tuple[int, ...]) -> int:
    """Trainable parameters of a layer description (closed form, no framework needed)."""
    shape, n = tuple(sample_shape), 0
    for layer in layers:
        if layer[0] == "conv2d":
            k, f = int(layer[2]), int(layer[1])
            n += k * k * shape[2] * f + f
            shape = (shape[0] - k + 1, shape[1] - k + 1, f)
        elif layer[0] == "maxpool2d":
            s = int(layer[1])
            shape = (shape[0] // s, shape[1] // s, shape[2])
        elif layer[0] == "flatten":
            shape = (int(np.prod(shape)),)
        else:
            n += shape[0] * int(layer[1]) + int(layer[1])
            shape = (int(layer[1]),)
    return n


def output_width(layers) -> int:
    return int(layers[-1][1])


class Workload:
    """A workload. Subclass it (or set the attributes on an instance) and give:

    - ``name``; ``loss`` (``mse`` or ``cross_entropy``); ``metric`` (``VAL_LOSS`` or
      ``VAL_ACCURACY``, or a ``Metric`` of your own key ``val_loss``/``val_accuracy``);
    - ``layout(cfg)``: a ``Layout``;
    - ``n_samples(cfg)`` and ``samples(cfg, ids)``: the arrays (x, y) of the sample ids
      ``ids`` (an int64 array); sample i must depend only on (config seed, i);
    - ``layers(cfg)``: the network as a layer description (both frameworks build it), or
      ``keras_model(cfg)`` and ``torch_module(cfg)`` builders and ``parameter_count(cfg)``;
    - optionally ``split_keys(cfg, ids)``: the id that decides each sample's split (by
      default the sample id). Samples made from one source (augmented copies of one
      image) share a key, so they land in one split and the validation split holds only
      sources the network never trains on.
    """

    name: str = ""
    loss: str = "mse"
    metric: Metric = VAL_LOSS
    #: regression labels are normalised with the train split's statistics
    normalise_labels: bool = True

    def layout(self, cfg: dict) -> Layout:
        raise NotImplementedError

    def n_samples(self, cfg: dict) -> int:
        return int(cfg["data"]["n_samples"])

    def samples(self, cfg: dict, ids: np.ndarray):
        raise NotImplementedError

    def layers(self, cfg: dict):
        return None

    #: what ``split_keys`` returns, in words (manifest.json's split rule)
    split_key_name: str = "sample_id"

    def split_keys(self, cfg: dict, ids: np.ndarray) -> np.ndarray:
        """The key of each sample id whose (seed, key) decides its split: the id itself."""
        return np.asarray(ids, dtype=np.int64)

    def parameter_count(self, cfg: dict) -> int:
        layers = self.layers(cfg)
        if layers is None:
            raise NotImplementedError
        return layers_parameter_count(layers, self.layout(cfg).sample_shape)

    def describe(self, cfg: dict) -> str:
        lay = self.layout(cfg)
        lab = f"{lay.n_classes} classes" if lay.n_classes else f"labels {lay.label_shape}"
        return (
            f"workload {self.name}: samples {lay.sample_shape} {lay.sample_dtype}, {lab}, "
            f"{self.parameter_count(cfg):,} parameters, loss {self.loss}, target on the "
            f"{self.metric.name} ({self.metric.goal == 'min' and 'at or below' or 'at or above'})"
        )


def workload_name(cfg: dict | None) -> str:
    return str((cfg or {}).get("workload") or DEFAULT)


def is_default(cfg: dict | None) -> bool:
    return workload_name(cfg) == DEFAULT


def _import(spec: str, key: str = "workload"):
    target = BUILTIN.get(spec, spec)
    if ":" not in target:
        raise ConfigError(
            f"config key {key}: got {spec!r}; expected one of {', '.join(BUILTIN)} or "
            "'module:object' (an importable module and the workload object in it)"
        )
    mod_name, _, obj_name = target.partition(":")
    added = str(Path.cwd())
    if added not in sys.path:  # a module beside the config, as ``python -m`` would find it
        sys.path.append(added)
    try:
        mod = importlib.import_module(mod_name)
    except Exception as exc:  # noqa: BLE001 - any import failure is the user's to see
        raise ConfigError(
            f"config key {key}: cannot import module {mod_name!r} ({type(exc).__name__}: "
            f"{exc}); put it on PYTHONPATH (or in the directory snakemake runs in)"
        ) from None
    try:
        obj = getattr(mod, obj_name)
    except AttributeError:
        raise ConfigError(
            f"config key {key}: module {mod_name!r} has no object {obj_name!r}"
        ) from None
    return obj() if isinstance(obj, type) else obj


_CACHE: dict[str, Workload] = {}


def load_workload(spec: str) -> Workload:
    """The workload named ``spec`` (built-in name or ``module:object``), unchecked."""
    if spec not in _CACHE:
        _CACHE[spec] = _import(spec)
    return _CACHE[spec]


def workload_for(cfg: dict | None) -> Workload:
    """The config's workload (default stress-strain)."""
    return load_workload(workload_name(cfg))


def check_workload(cfg: dict, probe: int = 8) -> Workload:
    """The config's workload, after checking that it gives every part and that its
    first ``probe`` samples match its declared layout; ConfigError naming what is not."""
    spec = workload_name(cfg)
    wl = load_workload(spec)
    key = f"config key workload ({spec})"
    missing = []
    for part in ("name", "loss", "metric", "layout", "samples", "n_samples"):
        if not hasattr(wl, part):
            missing.append(part)
    if missing:
        raise ConfigError(
            f"{key}: the workload lacks {', '.join(missing)} (see hvdscale.workload.base.Workload)"
        )
    if wl.loss not in LOSSES:
        raise ConfigError(f"{key}: loss {wl.loss!r}; expected one of {', '.join(LOSSES)}")
    if (
        not isinstance(wl.metric, Metric)
        or wl.metric.key not in ("val_loss", "val_accuracy")
        or wl.metric.goal not in ("min", "max")
    ):
        raise ConfigError(
            f"{key}: metric must be VAL_LOSS or VAL_ACCURACY (hvdscale.workload.base)"
        )
    try:
        lay = wl.layout(cfg)
    except NotImplementedError:
        raise ConfigError(f"{key}: the workload lacks layout(cfg)") from None
    if not isinstance(lay, Layout):
        raise ConfigError(f"{key}: layout(cfg) must return a Layout, got {type(lay).__name__}")
    if lay.sample_dtype not in SAMPLE_DTYPES or lay.label_dtype not in LABEL_DTYPES:
        raise ConfigError(
            f"{key}: dtypes {lay.sample_dtype}/{lay.label_dtype}; samples must be "
            f"{'/'.join(SAMPLE_DTYPES)}, labels {'/'.join(LABEL_DTYPES)}"
        )
    if (wl.loss == "cross_entropy") != (lay.n_classes is not None):
        raise ConfigError(
            f"{key}: cross_entropy needs Layout.n_classes (class-index labels), mse needs none"
        )
    if wl.loss == "cross_entropy" and (lay.label_shape != () or lay.label_dtype != "int64"):
        raise ConfigError(f"{key}: a classifier's labels are int64 class indices of shape ()")
    layers = wl.layers(cfg)
    if layers is None:
        lacking = [p for p in ("keras_model", "torch_module") if not callable(getattr(wl, p, None))]
        if lacking:
            raise ConfigError(
                f"{key}: the workload gives no layers(cfg) and no {', '.join(lacking)}"
            )
    else:
        bad = layer_problems(layers, lay.sample_shape)
        width = n_outputs(lay)
        if not bad and output_width(layers) != width:
            bad = [f"the last layer has {output_width(layers)} units; the labels need {width}"]
        if bad:
            raise ConfigError(f"{key}: layers(cfg): {'; '.join(bad)}")
    try:
        n = int(wl.n_samples(cfg))
        ids = np.arange(min(probe, n), dtype=np.int64)
        x, y = wl.samples(cfg, ids)
    except NotImplementedError:
        raise ConfigError(f"{key}: the workload lacks samples(cfg, ids)") from None
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's code: name it, don't crash
        raise ConfigError(f"{key}: samples(cfg, ids) failed: {type(exc).__name__}: {exc}") from None
    bad = lay.problems(np.asarray(x), np.asarray(y), f"samples 0..{len(ids) - 1}")
    if bad:
        raise ConfigError(f"{key}: its data do not match its declared layout: {'; '.join(bad)}")
    return wl


def n_outputs(lay: Layout) -> int:
    """Width of the network's output: classes, or the flattened label size."""
    return int(lay.n_classes) if lay.n_classes else int(np.prod(lay.label_shape or (1,)))
