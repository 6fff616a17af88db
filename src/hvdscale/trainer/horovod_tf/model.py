"""The stress-strain network as a Keras model (imports TensorFlow when called). The
network's facts (input channels, labels, the parameter count in closed form, the
normalisation) are framework-free: ``hvdscale.trainer.model``."""

from __future__ import annotations

import numpy as np

from hvdscale.trainer.model import N_CHANNELS, N_LABELS, check_parameter_count

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
