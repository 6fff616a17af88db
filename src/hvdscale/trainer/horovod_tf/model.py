"""The stress-strain network as a Keras model (imports TensorFlow when called). The
network's facts (input channels, labels, the parameter count in closed form, the
normalisation) are framework-free: ``hvdscale.trainer.model``."""

from __future__ import annotations

import numpy as np

from hvdscale.trainer.model import N_CHANNELS, N_LABELS, check_parameter_count


def build_model(cfg: dict):
    """The Keras model for ``cfg`` (imports TensorFlow)."""
    import tensorflow as tf

    n_points = cfg["data"]["n_points"]
    act = cfg["model"]["activation"]
    layers = [
        tf.keras.Input(shape=(n_points, N_CHANNELS), name="curve"),
        tf.keras.layers.Flatten(name="flatten"),
    ]
    for i, units in enumerate(cfg["model"]["hidden_units"]):
        layers.append(tf.keras.layers.Dense(units, activation=act, name=f"hidden{i}"))
    layers.append(tf.keras.layers.Dense(N_LABELS, name="labels"))
    model = tf.keras.Sequential(layers, name="stress_strain_net")
    n = int(sum(int(np.prod(v.shape)) for v in model.trainable_variables))
    expected = check_parameter_count(cfg)
    if n != expected:  # the closed form and Keras must agree
        raise RuntimeError(f"model has {n} parameters, closed form says {expected}")
    return model
