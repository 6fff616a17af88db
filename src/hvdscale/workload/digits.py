"""Handwritten digits: image classification on scikit-learn's ``load_digits`` (1,797
grey 8x8 images, 10 classes, shipped inside scikit-learn: nothing is fetched), enlarged
to ``data.n_samples`` samples.

Sample i is image ``i mod 1797``, shifted by up to one pixel in each direction and with
Gaussian pixel noise (standard deviation 0.05 of the full scale), both drawn from a
generator seeded with (seed, i): it depends only on (seed, i). Pixels are scaled to
[0, 1]; a sample is (8, 8, 1) float32, its label the digit (int64). The split is decided
per source image: every copy of image k goes to the split that (seed, k) draws, so no
image is in two splits and the validation accuracy is that of images the network never
trained on.

The network: a small CNN (3x3 convolution with 16 filters, 2x2 max-pooling, a Dense
layer of 64, 10 outputs; 10,090 parameters), trained with cross-entropy; the target is a
validation accuracy to reach."""

from __future__ import annotations

import numpy as np

from hvdscale.workload.base import VAL_ACCURACY, Layout, Workload

NOISE = 0.05
N_CLASSES = 10
N_IMAGES = 1797  # scikit-learn's load_digits


def base_images() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits as (1797, 8, 8) float32 in [0, 1] and int64 labels."""
    from sklearn.datasets import load_digits  # reason: scikit-learn, the workflow env's only

    d = load_digits()
    return (d.images / 16.0).astype(np.float32), d.target.astype(np.int64)


class Digits(Workload):
    name = "digits"
    loss = "cross_entropy"
    metric = VAL_ACCURACY
    normalise_labels = False

    def layout(self, cfg: dict) -> Layout:
        return Layout((8, 8, 1), (), "float32", "int64", N_CLASSES)

    def samples(self, cfg: dict, ids: np.ndarray):
        images, labels = base_images()
        ids = np.asarray(ids, dtype=np.int64)
        x = np.zeros((len(ids), 8, 8, 1), dtype=np.float32)
        seed = int(cfg["seed"])
        for k, i in enumerate(ids.tolist()):
            rng = np.random.default_rng([seed, i])
            dy, dx = rng.integers(-1, 2, size=2)
            img = np.roll(images[i % len(images)], (int(dy), int(dx)), axis=(0, 1))
            noisy = img + rng.normal(0.0, NOISE, size=img.shape).astype(np.float32)
            x[k, :, :, 0] = np.clip(noisy, 0.0, 1.0)
        return x, labels[ids % len(images)]

    split_key_name = f"source image (sample_id mod {N_IMAGES})"

    def split_keys(self, cfg: dict, ids: np.ndarray) -> np.ndarray:
        """Source image ``i mod 1797`` of sample i: its copies share a split."""
        return np.asarray(ids, dtype=np.int64) % N_IMAGES

    def layers(self, cfg: dict):
        return [
            ("conv2d", 16, 3, "relu"),
            ("maxpool2d", 2),
            ("flatten",),
            ("dense", 64, "relu"),
            ("dense", N_CLASSES, None),
        ]


WORKLOAD = Digits()
