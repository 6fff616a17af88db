"""The default workload: material parameters from synthetic stress-strain curves.

Its data stage is the physical generator with its own per-sample validation
(``hvdscale.data``); its network the Dense net of ``hvdscale.trainer.model``; its loss
the mean squared error of the normalised labels, which the target reads as the
validation loss to go below."""

from __future__ import annotations

import numpy as np

from hvdscale.data.physics import GeneratorParams, generate_block
from hvdscale.workload.base import VAL_LOSS, Layout, Workload

N_CHANNELS = 3
N_LABELS = 2


class StressStrain(Workload):
    name = "stress-strain"
    loss = "mse"
    metric = VAL_LOSS

    def layout(self, cfg: dict) -> Layout:
        return Layout((int(cfg["data"]["n_points"]), N_CHANNELS), (N_LABELS,))

    def samples(self, cfg: dict, ids: np.ndarray):
        return generate_block(GeneratorParams.from_config(cfg), np.asarray(ids, np.int64))

    def layers(self, cfg: dict):
        act = cfg["model"]["activation"]
        return [
            ("flatten",),
            *(("dense", int(u), act) for u in cfg["model"]["hidden_units"]),
            ("dense", N_LABELS, None),
        ]


WORKLOAD = StressStrain()
