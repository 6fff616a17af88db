"""The horovod-tf framework, the default: one rank of a Horovod job with TensorFlow 2.
``hvdscale train`` (``hvdscale.trainer.rank.run_train``) runs ``trainer.rank.train_rank`` with
its object (``framework``); model (the Keras network), optim (Adam and the LR schedule),
step (the compiled step: a clock and a batch source), allreduce (the allreduce sweep of
``hvdscale measure-allreduce``), xla_cache (XLA's persistent compilation cache in the
results folder, issue 32).

Nothing here imports TensorFlow or Horovod at module level, and this file imports
nothing: import the module that defines a name (``hvdscale.trainer.horovod_tf.step``, ...).
"""
