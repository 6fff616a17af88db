"""The stress-strain network as a Keras model (imports TensorFlow when called). The
network's facts (input channels, labels, the parameter count in closed form, the
normalisation) are framework-free: ``hvdscale.trainer.model``."""

from __future__ import annotations

import numpy as np

from hvdscale.trainer.model import N_CHANNELS, N_LABELS, check_parameter_count
from hvdscale.workload.base import is_default, workload_for

#: training.precision -> the Keras dtype policy of the Dense layers (issue 32); the
#: variables stay float32 under a mixed policy, the step casts the output to float32
#: (fp16: the step scales the loss, hvdscale.trainer.horovod_tf.step.StepProgram)
POLICIES = {"fp32": "float32", "tf32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}


def build_model(cfg: dict):
    """The Keras model for ``cfg`` (imports TensorFlow)."""
    import tensorflow as tf

    n_points = cfg["data"]["n_points"]
    act = cfg["model"]["activation"]
    precision = cfg.get("training", {}).get("precision", "fp32")
    if precision not in POLICIES:
        raise ValueError(f"horovod-tf: training.precision {precision!r} is not built")
    policy = tf.keras.mixed_precision.Policy(POLICIES[precision])
    if not is_default(cfg):
        return _workload_model(tf, cfg, policy)
    layers = [
        tf.keras.Input(shape=(n_points, N_CHANNELS), name="curve"),
        tf.keras.layers.Flatten(name="flatten"),
    ]
    for i, units in enumerate(cfg["model"]["hidden_units"]):
        layers.append(tf.keras.layers.Dense(units, activation=act, name=f"hidden{i}", dtype=policy))
    layers.append(tf.keras.layers.Dense(N_LABELS, name="labels", dtype=policy))
    model = tf.keras.Sequential(layers, name="stress_strain_net")
    n = int(sum(int(np.prod(v.shape)) for v in model.trainable_variables))
    expected = check_parameter_count(cfg)
    if n != expected:  # the closed form and Keras must agree
        raise RuntimeError(f"model has {n} parameters, closed form says {expected}")
    return model


def keras_layers(tf, layers, policy) -> list:
    """Keras layers of a workload's layer description (``hvdscale.workload.base``)."""
    out = []
    for i, layer in enumerate(layers):
        kind = layer[0]
        if kind == "conv2d":
            out.append(tf.keras.layers.Conv2D(int(layer[1]), int(layer[2]), activation=layer[3],
                                              name=f"conv{i}", dtype=policy))  # fmt: skip
        elif kind == "maxpool2d":
            out.append(tf.keras.layers.MaxPooling2D(int(layer[1]), name=f"pool{i}", dtype=policy))
        elif kind == "flatten":
            out.append(tf.keras.layers.Flatten(name=f"flatten{i}"))
        else:
            out.append(tf.keras.layers.Dense(int(layer[1]), activation=layer[2], name=f"dense{i}",
                                             dtype=policy))  # fmt: skip
    return out


def _workload_model(tf, cfg: dict, policy):
    """Another workload's network: its ``keras_model(cfg)``, else its layer description."""
    wl = workload_for(cfg)
    layers = wl.layers(cfg)
    if layers is None:
        model = wl.keras_model(cfg)
    else:
        shape = wl.layout(cfg).sample_shape
        model = tf.keras.Sequential(
            [tf.keras.Input(shape=shape, name="sample"), *keras_layers(tf, layers, policy)],
            name=wl.name.replace("-", "_") + "_net",
        )
    n = int(sum(int(np.prod(v.shape)) for v in model.trainable_variables))
    expected = check_parameter_count(cfg)
    if n != expected:
        raise RuntimeError(f"model has {n} parameters, the workload says {expected}")
    return model
