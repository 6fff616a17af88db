"""The Keras ``model.fit`` arm of the benchmarks (train env), shared by
bench_train_overhead.py and _scaling_worker.py so that both time Keras alike.

Timer scope, the same as hvdscale's step-loop clock (``run_epoch_steps``' t_train): the
caller draws the epoch's permutation before the epoch; the gather of each batch by it
runs inside the clock (an index dataset mapped through tf.gather, like hvdscale's
in-graph tf.gather); the clock is on_epoch_begin .. on_epoch_end of one ``fit`` call per
epoch (Keras creates the epoch's iterator before on_epoch_begin); no evaluation inside.
"""

from __future__ import annotations

import time


class KerasArm:
    """A compiled Keras model (optionally under a tf.distribute strategy) that trains one
    epoch per ``epoch(perm)`` call and returns the epoch's step-loop seconds."""

    def __init__(self, tf, model_fn, x, y, batch, steps, *, lr, spe, jit, strategy=None):
        self.tf, self.B, self.steps = tf, int(batch), int(steps)
        self.strategy = strategy
        with tf.device("/CPU:0"):
            self.X, self.Y = tf.constant(x), tf.constant(y)
        times: list[float] = []
        self.times = times

        class EpochClock(tf.keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                self.t0 = time.perf_counter()

            def on_epoch_end(self, epoch, logs=None):
                times.append(time.perf_counter() - self.t0)

        self.clock = EpochClock()
        scope = strategy.scope() if strategy is not None else tf.distribute.get_strategy().scope()
        with scope:
            self.model = model_fn()
            self.model.compile(
                loss="mse",
                optimizer=tf.keras.optimizers.Adam(lr),
                steps_per_execution=int(spe),
                jit_compile=bool(jit),
            )
        self.n_epochs = 0

    def _dataset(self, perm):
        tf, B = self.tf, self.B
        idx = tf.constant(perm[: self.steps * B].astype("int32"))
        ds = tf.data.Dataset.from_tensor_slices(idx).batch(B, drop_remainder=True)
        ds = ds.map(lambda i: (tf.gather(self.X, i), tf.gather(self.Y, i)))
        return ds.prefetch(tf.data.AUTOTUNE)

    def epoch(self, perm) -> float:
        if self.strategy is not None:
            data = self.strategy.distribute_datasets_from_function(lambda ctx: self._dataset(perm))
        else:
            data = self._dataset(perm)
        e = self.n_epochs
        self.model.fit(
            data,
            epochs=e + 1,
            initial_epoch=e,
            steps_per_epoch=self.steps,
            verbose=0,
            callbacks=[self.clock],
        )
        self.n_epochs += 1
        return self.times[-1]
