"""A description of the machine: CPU model, cores, memory, GPUs (model, driver, memory),
CUDA, cuDNN and NCCL versions where present, MPI implementation and version, network
interfaces (with their addresses; NCCL_SOCKET_IFNAME), node names, kernel, host name.

Used by ``hvdscale export`` (system.json in the archive: the machine the study was
exported on) and by training: rank 0 puts ``collect_system(nodes=...)`` into the
optional ``system`` object of metrics.json (``hvdscale.trainer.rank``), and aggregation
tabulates it per partition (``hvdscale.analysis.systems``, results/scaling/systems.csv).

Standard library only, so both environments can import it. Nothing here raises: a probe
that fails leaves its field empty ('' or []) and names itself in ``errors``. TensorFlow
and Horovod are only asked when the caller has already imported them (the training
ranks), never imported here (seconds in the workflow env, and absent there).
"""

from __future__ import annotations

from pathlib import Path

from hvdscale.record.system import collect_system


def add_arguments(p):
    p.add_argument("--out", help="write JSON here (default: print)")


def run(args) -> int:
    import json

    text = json.dumps(collect_system(), indent=2, sort_keys=True)
    if args.out:
        Path(args.out).write_text(text + "\n")
    else:
        print(text)
    return 0
