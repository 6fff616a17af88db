"""The one native piece of hvdscale: an LD_PRELOAD library that makes Gloo's spinning
TCP loop thread yield its core (epoll_yield.c says why; docs/performance.md, "Gloo's
spinning loop thread", measures it).

``scripts/setup.sh`` builds it next to its source (``python -m hvdscale.native build``,
with the system C compiler). ``hvdscale launch`` preloads it into the ranks of a run
whose collectives are Gloo's, Horovod's or torch.distributed's
(``training.gloo_yield_when_spinning``, default true) and refuses to start such a run
when it is not built. A rank records whether it was loaded (run record
``config.gloo_epoll_yield``).

  python -m hvdscale.native build [--out PATH] [--cc CC]   # compile (atomic)
  python -m hvdscale.native path                            # where the library is
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from hvdscale.errors import UserError
from hvdscale.io import atomic_path

SOURCE = Path(__file__).with_name("epoll_yield.c")
LIBRARY = Path(__file__).with_name("epoll_yield.so")
CONFIG_KEY = "training.gloo_yield_when_spinning"


def build(out: str | Path = LIBRARY, cc: str | None = None) -> Path:
    """Compile epoll_yield.c into the shared library ``out`` (written atomically)."""
    cc = cc or os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise UserError(
            f"building {out}: no C compiler (cc or gcc) on PATH; install build-essential "
            f"(scripts/setup.sh does) or set {CONFIG_KEY}: false"
        )
    out = Path(out)
    with atomic_path(out, ".so") as tmp:
        argv = [cc, "-O2", "-Wall", "-shared", "-fPIC", "-o", str(tmp), str(SOURCE), "-ldl"]
        p = subprocess.run(argv, capture_output=True, text=True)
        if p.returncode != 0:
            raise UserError(f"building {out} from {SOURCE} failed:\n{p.stderr.strip()}")
    return out


def preload_value(library: str | Path | None = None, environ=None) -> str:
    """LD_PRELOAD for a rank: the library first, then what the caller already preloads."""
    library = LIBRARY if library is None else library
    environ = os.environ if environ is None else environ
    prev = [p for p in environ.get("LD_PRELOAD", "").replace(" ", ":").split(":") if p]
    return ":".join([str(library), *[p for p in prev if p != str(library)]])


def check_built(env: dict) -> None:
    """Refuse a launch whose ranks would preload the library when it is not built (the
    dynamic loader would only print a warning and run without it)."""
    if str(LIBRARY) in env.get("LD_PRELOAD", "").split(":") and not LIBRARY.is_file():
        raise UserError(
            f"{CONFIG_KEY} is true (Gloo run) but {LIBRARY} is not built: run `make setup` "
            f"or `python -m hvdscale.native build`, or set {CONFIG_KEY}: false"
        )


def loaded(maps: str | Path = "/proc/self/maps") -> bool:
    """Whether this process has the library mapped (the rank's own check, for its record)."""
    try:
        text = Path(maps).read_text()
    except OSError:
        return False
    return any(line.rstrip().endswith("/" + LIBRARY.name) for line in text.splitlines())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hvdscale.native", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="compile epoll_yield.c")
    b.add_argument("--out", default=str(LIBRARY))
    b.add_argument("--cc", default=None, help="C compiler (default: $CC, cc, gcc)")
    sub.add_parser("path", help="print the library's path")
    a = ap.parse_args(argv)
    if a.cmd == "path":
        print(LIBRARY)
        return 0
    try:
        print(build(a.out, a.cc))
    except UserError as e:
        print(f"hvdscale.native: error: {e}", file=sys.stderr)
        return 2
    return 0
