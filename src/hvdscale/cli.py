"""The ``hvdscale`` command line: one subcommand per pipeline step.

Every subcommand lives in its own module exposing ``add_arguments(parser)`` and
``run(args) -> int``. Modules are imported only when their command runs, because the
two environments differ: the workflow env has pandas/pandera/matplotlib but no
TensorFlow, the train env has TensorFlow/Horovod but no pandas.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from hvdscale import __version__
from hvdscale.errors import UserError

# name -> (module, one-line help). The order is the pipeline order.
COMMANDS: dict[str, tuple[str, str]] = {
    "check-config": (
        "hvdscale.commands.check_config",
        "validate a config file and print its run table",
    ),
    "plan": (
        "hvdscale.commands.plan",
        "the node-hour budget of a config (per partition) before anything is submitted",
    ),
    "write-config": (
        "hvdscale.commands.write_config",
        "write the validated config (or its data section) as JSON",
    ),
    "generate-shard": (
        "hvdscale.commands.generate_shard",
        "generate one shard of synthetic stress-strain curves",
    ),
    "validate-shard": (
        "hvdscale.commands.validate_shard",
        "validate a generated shard with pandera (every sample)",
    ),
    "split-dataset": (
        "hvdscale.commands.split_dataset",
        "split validated shards into train/val/test HDF5 shards + manifest.json",
    ),
    "check-data": (
        "hvdscale.commands.check_data",
        "check a data directory against its manifest (files, datasets, checksums)",
    ),
    "calibrate-target": (
        "hvdscale.commands.calibrate_target",
        "the study's target validation loss (absolute, or from the calibration runs)",
    ),
    "launch": (
        "hvdscale.commands.launch",
        "start one training run as N ranks (horovodrun, mpirun or srun)",
    ),
    "train": (
        "hvdscale.commands.train",
        "train one run (one rank; started by 'launch' or a launcher)",
    ),
    "measure-allreduce": (
        "hvdscale.commands.measure_allreduce",
        "time Horovod allreduce over a range of message sizes",
    ),
    "aggregate": (
        "hvdscale.commands.aggregate",
        "aggregate run records into runs.csv and summary.csv",
    ),
    "tabulate-systems": (
        "hvdscale.commands.tabulate_systems",
        "the run records' system descriptions per partition (systems.csv)",
    ),
    "select-tuned": (
        "hvdscale.commands.select_tuned",
        "pick the best learning-rate candidate per tuning group (selection.csv)",
    ),
    "fit-costmodel": (
        "hvdscale.commands.fit_costmodel",
        "fit the ring-allreduce cost model and predict scaling",
    ),
    "plot": ("hvdscale.commands.plot", "draw the scaling figures (PDF and PNG)"),
    "report": ("hvdscale.commands.report", "typeset results/report.pdf"),
    "check-references": (
        "hvdscale.commands.check_references",
        "compare measured values with the config's references (within/better/worse)",
    ),
    "compare": ("hvdscale.commands.compare", "compare two studies (results dirs or archives)"),
    "export": ("hvdscale.commands.export", "write one archive of a finished study"),
    "describe-system": (
        "hvdscale.commands.describe_system",
        "describe this machine (CPU, memory, GPUs, MPI, network, kernel) as JSON",
    ),
    "rebuild": (
        "hvdscale.commands.rebuild",
        "rebuild every figure and the report from an archive (no training env)",
    ),
    "merge": (
        "hvdscale.commands.merge",
        "one report from several studies of one config, one per cluster (results dirs or archives)",
    ),
}


class CLIError(Exception):
    """An error for the user: printed as one clear message, exit status 2, no traceback."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hvdscale",
        description="Reproducible Horovod scaling studies. Each command is one pipeline step; "
        "Snakemake rules call these commands, and you can run them by hand.",
    )
    parser.add_argument("--version", action="version", version=f"hvdscale {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_module, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    if not argv or argv[0] not in COMMANDS:
        args = parser.parse_args(argv)  # prints help/usage or errors for unknown commands
        parser.print_help()
        return 2
    name, rest = argv[0], argv[1:]
    module_name, help_text = COMMANDS[name]
    module = importlib.import_module(module_name)
    sub = argparse.ArgumentParser(
        prog=f"hvdscale {name}",
        description=module.__doc__ or help_text,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    module.add_arguments(sub)
    args = sub.parse_args(rest)
    try:
        return int(module.run(args) or 0)
    except KeyboardInterrupt:
        print(f"hvdscale {name}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # user-facing errors carry their own clear message
        if isinstance(exc, (UserError, CLIError)):
            print(f"hvdscale {name}: error: {exc}", file=sys.stderr)
            return 2
        raise


# frameworks whose interpreter teardown is slow: a process that imported TensorFlow spends
# about 0.7 s (2 cores) in it after its work is done, once per rank and run
_SLOW_TEARDOWN = ("tensorflow", "torch")


def finish(code: int) -> None:
    """Exit the command-line process with ``code``. After a training or allreduce command
    that succeeded (a framework was imported, status 0) every file is written and closed
    and the exit marker is on disk: Horovod is shut down (which finalizes MPI; mpirun
    reports a rank that exits without it as a failure), stdout and stderr are flushed
    and the interpreter teardown is skipped (os._exit). Otherwise an ordinary exit."""
    if code == 0 and any(name in sys.modules for name in _SLOW_TEARDOWN):
        hvd = sys.modules.get("horovod.tensorflow")
        if hvd is not None:
            hvd.shutdown()  # a no-op when the command shut Horovod down itself
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    finish(main())
