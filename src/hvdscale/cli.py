"""The ``hvdscale`` command line: one subcommand per pipeline step.

Every subcommand is a thin entry beside its logic: ``add_arguments(parser)`` and
``run(args) -> int`` in the module that does the work (``COMMANDS`` names it;
"module:name" names ``add_<name>_arguments`` and ``run_<name>`` of a module with more
than one command). The ``run`` function's docstring is the command's ``--help``
description. Modules are imported only when their command runs, because the two
environments differ: the workflow env has pandas/pandera/matplotlib but no TensorFlow,
the train env has TensorFlow/Horovod but no pandas.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import sys

from hvdscale import __version__
from hvdscale.config.load import config_hash, data_section, load_config, validate_config
from hvdscale.errors import UserError
from hvdscale.io import write_json_atomic
from hvdscale.matrix.runtable import run_table
from hvdscale.workload.base import check_workload, is_default

# name -> (module or "module:name", one-line help). The order is the pipeline order.
COMMANDS: dict[str, tuple[str, str]] = {
    "check-config": (
        "hvdscale.cli:check_config",
        "validate a config file and print its run table",
    ),
    "plan": (
        "hvdscale.study.plan",
        "the node-hour budget of a config (per partition) before anything is submitted",
    ),
    "status": (
        "hvdscale.study.status",
        "progress of a study: runs done/running/queued/failed per partition, node-hours, ETA",
    ),
    "write-config": (
        "hvdscale.cli:write_config",
        "write the validated config (or its data section) as JSON",
    ),
    "generate-shard": (
        "hvdscale.workload.shards:generate",
        "generate one shard of the workload's samples (stress-strain: synthetic curves)",
    ),
    "validate-shard": (
        "hvdscale.workload.shards:validate",
        "validate a generated shard (stress-strain: with pandera, every sample)",
    ),
    "split-dataset": (
        "hvdscale.workload.shards:split",
        "split validated shards into train/val/test HDF5 shards + manifest.json",
    ),
    "import-data": (
        "hvdscale.workload.shards:import",
        "convert your own arrays (NumPy .npz or HDF5) into the sharded, checksummed format",
    ),
    "check-data": (
        "hvdscale.data.check",
        "check a data directory against its manifest (files, datasets, checksums)",
    ),
    "calibrate-target": (
        "hvdscale.target",
        "the study's target validation loss (absolute, or from the calibration runs)",
    ),
    "launch": (
        "hvdscale.launch.command",
        "start one training run as N ranks (horovodrun, mpirun or srun)",
    ),
    "preflight": (
        "hvdscale.launch.preflight",
        "check a partition (env, GPUs, backends, data) on its node before its training runs",
    ),
    "preflight-rank": (
        "hvdscale.trainer.preflight",
        "one rank of a partition's preflight (started by 'preflight')",
    ),
    "train": (
        "hvdscale.trainer.rank:train",
        "train one run (one rank; started by 'launch' or a launcher)",
    ),
    "measure-allreduce": (
        "hvdscale.trainer.horovod_tf.allreduce",
        "time Horovod allreduce over a range of message sizes",
    ),
    "aggregate": (
        "hvdscale.analysis.aggregate",
        "aggregate run records into runs.csv and summary.csv",
    ),
    "tabulate-systems": (
        "hvdscale.analysis.systems",
        "the run records' system descriptions per partition (systems.csv)",
    ),
    "select-tuned": (
        "hvdscale.analysis.aggregate:select_tuned",
        "pick the best learning-rate candidate per tuning group (selection.csv)",
    ),
    "fit-costmodel": (
        "hvdscale.analysis.costmodel",
        "fit the ring-allreduce cost model and predict scaling",
    ),
    "plot": ("hvdscale.figures.draw", "draw the scaling figures (PDF and PNG)"),
    "report": ("hvdscale.report.pdf", "typeset results/report.pdf"),
    "check-references": (
        "hvdscale.analysis.references",
        "compare measured values with the config's references (within/better/worse)",
    ),
    "compare": ("hvdscale.study.compare", "compare two studies (results dirs or archives)"),
    "export": ("hvdscale.study.export", "write one archive of a finished study"),
    "describe-system": (
        "hvdscale.record.system",
        "describe this machine (CPU, memory, GPUs, MPI, network, kernel) as JSON",
    ),
    "rebuild": (
        "hvdscale.study.export:rebuild",
        "rebuild every figure and the report from an archive (no training env)",
    ),
    "merge": (
        "hvdscale.study.merge",
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


def entry(target: str):
    """``(add_arguments, run)`` of a COMMANDS target: "module" (its ``add_arguments`` and
    ``run``) or "module:name" (its ``add_<name>_arguments`` and ``run_<name>``)."""
    module_name, _, name = target.partition(":")
    module = importlib.import_module(module_name)
    if name:
        return getattr(module, f"add_{name}_arguments"), getattr(module, f"run_{name}")
    return module.add_arguments, module.run


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    if not argv or argv[0] not in COMMANDS:
        args = parser.parse_args(argv)  # prints help/usage or errors for unknown commands
        parser.print_help()
        return 2
    name, rest = argv[0], argv[1:]
    target, help_text = COMMANDS[name]
    add_arguments, run = entry(target)
    sub = argparse.ArgumentParser(
        prog=f"hvdscale {name}",
        description=inspect.getdoc(run) or help_text,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(sub)
    args = sub.parse_args(rest)
    try:
        return int(run(args) or 0)
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


# -------------------------------------------------- the command: hvdscale check-config


def add_check_config_arguments(p):
    p.add_argument("config", help="YAML config file, e.g. config/config.yaml")
    p.add_argument("--quiet", action="store_true", help="print only the summary line")


def run_check_config(args) -> int:
    """Validate a config file (schema, defaults, cross-key checks, the workload: it imports,
    gives every part and its first samples match its declared shapes) and print its run
    table."""
    cfg = load_config(args.config)
    wl = check_workload(cfg)
    runs = run_table(cfg)
    if not args.quiet:
        for r in runs:
            print(
                f"{r.run_id}\tnodes={r.nodes}\tworkers={r.workers}\tglobal_batch={r.global_batch}"
            )
    if not is_default(cfg):
        print(wl.describe(cfg))
    print(f"{args.config}: valid; {len(runs)} training runs; config hash {config_hash(cfg)[:12]}")
    return 0


# -------------------------------------------------- the command: hvdscale write-config


def add_write_config_arguments(p):
    p.add_argument("--json", required=True, help="the config as a JSON string")
    p.add_argument(
        "--section",
        choices=["full", "data"],
        default="full",
        help="full config, or only what the data stage depends on (default: full)",
    )
    p.add_argument("--out", required=True, help="output JSON file")


def run_write_config(args) -> int:
    """Write the validated config (all of it, or the data section) as canonical JSON.

    Snakemake passes the config as JSON; the output is the snapshot that later steps read
    and whose hash goes into every run record.
    """
    cfg = validate_config(json.loads(args.json))
    write_json_atomic(args.out, data_section(cfg) if args.section == "data" else cfg)
    return 0


if __name__ == "__main__":
    finish(main())
