"""Training of one rank (train env), in the order a rank runs:

- frame: the rank's process frame (pid file, signals, exit marker);
- rank: ``train_rank``, the recipe for every framework, and ``Framework``, the small
  object through which a framework fills in its steps (one per framework folder);
- placement (rank detection, CPU binding, TensorFlow's device pinning), worker (who am I,
  and the book-keeping collectives), data (row planning, reading, normalisation, steps
  per epoch), model (the network's facts), schedule (the LR warm-up), protocols (what the loop
  asks of a step program and an optimizer), checkpoint (find/save, ResumeState), metrics
  (EpochMetrics and its allreduce), loop (the epochs), utilisation (the CPU sampler):
  shared by the frameworks;
- one folder per framework: horovod_tf (the default), torch_ddp.

The run record is built by hvdscale.record.build. Nothing here imports TensorFlow,
Horovod or torch at module level, except the framework folders' modules that say so.
"""
