"""The batch sources of the Horovod-TF step (``hvdscale.trainer.horovod_tf.step``):
``DeviceBatches`` holds the rank's shard as device tensors and gathers each batch inside
the graph; ``HostBatches`` slices host arrays and feeds the rows of
``steps_per_execution`` steps to each call. No TensorFlow import at module level: the
step passes its ``tf``.
"""

from __future__ import annotations

import time

import numpy as np


class DeviceBatches:
    """The rank's shard as device tensors; batches are gathered inside the step."""

    def __init__(self, tf, x, y, batch: int):
        self.tf = tf
        self.batch = batch
        self.cursor = tf.Variable(0, dtype=tf.int32, trainable=False, name="cursor")
        self.x = tf.constant(x)
        self.y = tf.constant(y)
        self.perm = tf.Variable(tf.zeros([len(x)], tf.int32), trainable=False, name="perm")

    def compile(self, loop):
        """tf.function running ``loop(n, feed)``: called with the step count only."""
        tf = self.tf
        sig = [tf.TensorSpec([], tf.int32)]
        return tf.function(lambda n: loop(n, ()), input_signature=sig, autograph=False)

    def fetch(self, j, feed):
        tf, B = self.tf, self.batch
        i = self.cursor.assign_add(1) - 1
        idx = self.perm[i * B : (i + 1) * B]
        return tf.gather(self.x, idx), tf.gather(self.y, idx)

    def start_epoch(self, perm: np.ndarray) -> None:
        self.cursor.assign(0)
        self.perm.assign(perm.astype(np.int32))

    def feed(self, start: int, n: int) -> tuple[tuple, float]:
        """The call's arguments before the step count, and the host-side data time."""
        return (), 0.0

    def empty_feed(self) -> tuple:
        return ()


class HostBatches:
    """Host arrays; each call gets the rows of its steps, gathered and converted on the
    host (that time counts as data loading)."""

    def __init__(self, tf, x, y, batch: int):
        self.tf = tf
        self.batch = batch
        self.x, self.y = x, y
        self.perm = np.arange(len(x))

    def compile(self, loop):
        """tf.function running ``loop(n, (xs, ys))``: called with the rows and the step count."""
        tf = self.tf
        sig = [
            tf.TensorSpec([None, *self.x.shape[1:]], tf.float32),
            tf.TensorSpec([None, *self.y.shape[1:]], tf.as_dtype(self.y.dtype)),
            tf.TensorSpec([], tf.int32),
        ]
        return tf.function(lambda x, y, n: loop(n, (x, y)), input_signature=sig, autograph=False)

    def fetch(self, j, feed):
        xs, ys = feed
        B = self.batch
        return xs[j * B : (j + 1) * B], ys[j * B : (j + 1) * B]

    def start_epoch(self, perm: np.ndarray) -> None:
        self.perm = perm

    def feed(self, start: int, n: int) -> tuple[tuple, float]:
        t0 = time.perf_counter()
        rows = self.perm[start * self.batch : (start + n) * self.batch]
        xs = self.tf.constant(self.x[rows])
        ys = self.tf.constant(self.y[rows])
        return (xs, ys), time.perf_counter() - t0

    def empty_feed(self) -> tuple:
        tf = self.tf
        return tf.zeros([0, *self.x.shape[1:]], tf.float32), tf.zeros(
            [0, *self.y.shape[1:]], tf.as_dtype(self.y.dtype)
        )
