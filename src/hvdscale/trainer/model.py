"""The stress-strain network's facts, framework-free: a fully connected net from a
flattened curve to 2 labels. Each framework builds it (Keras:
``trainer.horovod_tf.model.build_model``; torch: ``trainer.torch_ddp.net.build_net``) and
checks its parameter count against ``parameter_count``.

Input: one curve of ``data.n_points`` points x 3 channels (strain, stress, flag),
normalised with the train split's statistics (done once on the arrays, see
``normalise``), flattened to ``n_points * 3`` numbers. Hidden layers: ``model.hidden_units``
Dense layers with ``model.activation``. Output: 2 linear units (the normalised labels).
The thesis network ([192, 175, 24], 600 inputs) has exactly 153,441 trainable
parameters (0.61 MB in float32).
"""

from __future__ import annotations

import numpy as np

from hvdscale.errors import UserError
from hvdscale.workload.base import is_default, workload_for, workload_name

N_CHANNELS = 3
N_LABELS = 2


def parameter_count(n_points: int, hidden_units: list[int], n_labels: int = N_LABELS) -> int:
    """Trainable parameters of the network (no TensorFlow needed)."""
    sizes = [n_points * N_CHANNELS, *hidden_units, n_labels]
    return sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:]))


def check_parameter_count(cfg: dict) -> int:
    """The parameter count; a clear error if ``model.expected_parameters`` is set and differs.
    Another workload than stress-strain counts its own network (``Workload.parameter_count``)."""
    if not is_default(cfg):
        n = workload_for(cfg).parameter_count(cfg)
        expected = cfg["model"].get("expected_parameters")
        if expected is not None and n != expected:
            raise UserError(
                f"config key model.expected_parameters: the network of workload "
                f"{workload_name(cfg)} has {n} trainable parameters, expected {expected}; set "
                f"model.expected_parameters to {n} or to null"
            )
        return n
    n = parameter_count(cfg["data"]["n_points"], cfg["model"]["hidden_units"])
    expected = cfg["model"].get("expected_parameters")
    if expected is not None and n != expected:
        raise UserError(
            f"config key model.expected_parameters: the model built from model.hidden_units="
            f"{cfg['model']['hidden_units']} and data.n_points={cfg['data']['n_points']} has {n} "
            f"trainable parameters, expected {expected}; fix model.hidden_units or set "
            "model.expected_parameters to null"
        )
    return n


def normalisation_from_manifest(manifest: dict) -> dict:
    """The train split's statistics from the manifest (``hvdscale.data.check.normalisation``).

    Returns ``{"curves": (mean (3,), std (3,)), "labels": (mean (2,), std (2,))}`` as
    float32; a standard deviation of 0 (e.g. a constant channel) is replaced by 1.
    """
    from hvdscale.data.check import normalisation  # reason: h5py, which launch need not load

    try:
        nm = normalisation(manifest)
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"manifest.json: bad normalisation block ({exc})") from None
    if "layout" in manifest:  # another workload's data: per last-axis channel, labels if any
        return {
            part: (
                nm[f"{key}_mean"].reshape(-1).astype(np.float32),
                np.where(nm[f"{key}_std"] > 0, nm[f"{key}_std"], 1.0)
                .reshape(-1)
                .astype(np.float32),
            )
            if nm[f"{key}_mean"].size
            else None
            for part, key in (("curves", "curve"), ("labels", "label"))
        }
    out = {}
    for part, key, size in (("curves", "curve", N_CHANNELS), ("labels", "label", N_LABELS)):
        mean, std = nm[f"{key}_mean"].reshape(-1), nm[f"{key}_std"].reshape(-1)
        if mean.shape != (size,) or std.shape != (size,):
            raise UserError(f"manifest.json: normalisation.{part} needs {size} means and stds")
        out[part] = (mean.astype(np.float32), np.where(std > 0, std, 1.0).astype(np.float32))
    return out


def normalise(curves: np.ndarray, labels: np.ndarray, norm: dict) -> tuple[np.ndarray, np.ndarray]:
    """Normalised float32 copies of ``curves`` (n, points, 3) and ``labels`` (n, 2); of
    another workload's samples per last-axis channel, its labels only when it normalises
    them (class indices stay as they are)."""
    cm, cs = norm["curves"]
    x = ((curves - cm) / cs).astype(np.float32, copy=False)
    if norm["labels"] is None:
        return x, labels
    lm, ls = norm["labels"]
    shape = labels.shape[1:]
    y = ((labels - lm.reshape(shape)) / ls.reshape(shape)).astype(np.float32, copy=False)
    return x, y
