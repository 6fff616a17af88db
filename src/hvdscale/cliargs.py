"""The options of the ``hvdscale`` commands, declared as tables and added by one loop.

A command's ``add_arguments(p)`` calls ``add_options(p, *options)`` with its options in
``--help`` order. An option is

- a flag of ``SHARED`` ("--runs"): an option several commands share, defined here once;
- ``(flag, "help")``: the flag with this help text (and, for a flag of ``SHARED``, its
  other keywords there);
- ``(flag, {keywords})``: the flag with exactly these ``add_argument`` keywords;
- ``(flag, "help", {keywords})``: the same as ``(flag, {**keywords, "help": "help"})``.

Standard library only, so every command module, in either environment, can import it.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping

# the help of an option whose default says it all
DEFAULT_HELP = "(default: %(default)s)"


def defaulted(path: str) -> dict:
    """The keywords of an option that defaults to ``path`` and says so in its help."""
    return {"default": path, "help": DEFAULT_HELP}


# flag -> add_argument keywords of an option that several commands share
SHARED: dict[str, dict] = {
    "--config": {"help": "the validated config JSON (results/config/full.json)"},
    "--runs": defaulted("results/scaling/runs.csv"),
    "--summary": defaulted("results/scaling/summary.csv"),
    "--status": defaulted("results/scaling/status.csv"),
    "--quiet": {"action": "store_true"},
}

Option = str | tuple[str, str | Mapping] | tuple[str, str, Mapping]


def add_options(parser: argparse.ArgumentParser, *options: Option) -> None:
    """Add ``options`` to ``parser`` in order (the forms are in the module docstring)."""
    for option in options:
        if isinstance(option, str):
            flag, own = option, None
        elif len(option) == 3:
            flag, own = option[0], {**option[2], "help": option[1]}
        else:
            flag, own = option
        if own is None:
            keywords = SHARED[flag]
        elif isinstance(own, str):
            keywords = {**SHARED.get(flag, {}), "help": own}
        else:
            keywords = own
        parser.add_argument(flag, **keywords)
