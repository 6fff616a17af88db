"""The native pieces of hvdscale: two LD_PRELOAD libraries. epoll_yield.so makes Gloo's
spinning TCP loop thread yield its core (epoll_yield.c says why; docs/performance.md,
"Gloo's spinning loop thread", measures it); mkl_intel_path.so makes the MKL in torch
take its Intel code path on a non-Intel CPU (mkl_intel_path.c, issue 32).

``scripts/setup.sh`` builds it next to its source (``python -m hvdscale.native build``,
with the system C compiler). ``hvdscale launch`` preloads it into the ranks of a run
whose collectives are Gloo's, Horovod's or torch.distributed's
(``training.gloo_yield_when_spinning``, default true) and refuses to start such a run
when it is not built. A rank records whether it was loaded (run record
``config.gloo_epoll_yield``). The ranks of torch-ddp runs preload mkl_intel_path.so when
``training.mkl_code_path`` is intel (same refusal; run record ``config.mkl_code_path``).

  python -m hvdscale.native build [--out PATH] [--mkl-out PATH] [--cc CC]  # both (atomic)
  python -m hvdscale.native path [--mkl]                    # where a library is
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
MKL_SOURCE = Path(__file__).with_name("mkl_intel_path.c")
#: its name has "mkl" in it: hvdscale.record.system.cpu_kernels names the override
MKL_LIBRARY = Path(__file__).with_name("mkl_intel_path.so")
MKL_CONFIG_KEY = "training.mkl_code_path"


def build(
    out: str | Path = LIBRARY, cc: str | None = None, mkl_out: str | Path | None = None
) -> Path:
    """Compile epoll_yield.c into the shared library ``out`` and mkl_intel_path.c into
    ``mkl_out`` (default: mkl_intel_path.so next to ``out``) with the same compiler; both
    are written atomically, and neither when either fails. Returns ``out``."""
    cc = cc or os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise UserError(
            f"building {out}: no C compiler (cc or gcc) on PATH; install build-essential "
            f"(scripts/setup.sh does) or set {CONFIG_KEY}: false"
        )
    out = Path(out)
    mkl_out = out.with_name(MKL_LIBRARY.name) if mkl_out is None else Path(mkl_out)
    with atomic_path(out, ".so") as tmp, atomic_path(mkl_out, ".so") as mkl_tmp:
        _compile(cc, out, tmp, SOURCE, "-ldl")
        _compile(cc, mkl_out, mkl_tmp, MKL_SOURCE)
    return out


def _compile(cc: str, out: Path, tmp: Path, source: Path, *libs: str) -> None:
    argv = [cc, "-O2", "-Wall", "-shared", "-fPIC", "-o", str(tmp), str(source), *libs]
    p = subprocess.run(argv, capture_output=True, text=True)
    if p.returncode != 0:
        raise UserError(f"building {out} from {source} failed:\n{p.stderr.strip()}")


def preload_value(library: str | Path | None = None, environ=None) -> str:
    """LD_PRELOAD for a rank: the library first, then what the caller already preloads."""
    library = LIBRARY if library is None else library
    environ = os.environ if environ is None else environ
    prev = [p for p in environ.get("LD_PRELOAD", "").replace(" ", ":").split(":") if p]
    return ":".join([str(library), *[p for p in prev if p != str(library)]])


def check_built(env: dict) -> None:
    """Refuse a launch whose ranks would preload a library when it is not built (the
    dynamic loader would only print a warning and run without it)."""
    preload = env.get("LD_PRELOAD", "").split(":")
    if str(LIBRARY) in preload and not LIBRARY.is_file():
        raise UserError(
            f"{CONFIG_KEY} is true (Gloo run) but {LIBRARY} is not built: run `make setup` "
            f"or `python -m hvdscale.native build`, or set {CONFIG_KEY}: false"
        )
    if str(MKL_LIBRARY) in preload and not MKL_LIBRARY.is_file():
        raise UserError(
            f"{MKL_CONFIG_KEY} is intel (torch-ddp run) but {MKL_LIBRARY} is not built: run "
            f"`make setup` or `python -m hvdscale.native build`, or set {MKL_CONFIG_KEY}: "
            "vendor"
        )


def loaded(maps: str | Path = "/proc/self/maps", library: str | Path = LIBRARY) -> bool:
    """Whether this process has ``library`` (default: the Gloo one; MKL_LIBRARY) mapped,
    by file name (the rank's own check, for its record)."""
    try:
        text = Path(maps).read_text()
    except OSError:
        return False
    name = "/" + Path(library).name
    return any(line.rstrip().endswith(name) for line in text.splitlines())


def mkl_code_path(maps: str | Path = "/proc/self/maps") -> str:
    """The record's ``config.mkl_code_path`` of a torch rank: intel when mkl_intel_path.so
    is mapped in this process, else vendor (MKL's own choice)."""
    return "intel" if loaded(maps, MKL_LIBRARY) else "vendor"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hvdscale.native", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="compile epoll_yield.c and mkl_intel_path.c")
    b.add_argument("--out", default=str(LIBRARY), help="the Gloo library")
    b.add_argument("--mkl-out", default=None, help="the MKL library (default: next to --out)")
    b.add_argument("--cc", default=None, help="C compiler (default: $CC, cc, gcc)")
    pa = sub.add_parser("path", help="print the Gloo library's path")
    pa.add_argument("--mkl", action="store_true", help="the MKL library's path instead")
    a = ap.parse_args(argv)
    if a.cmd == "path":
        print(MKL_LIBRARY if a.mkl else LIBRARY)
        return 0
    try:
        out = build(a.out, a.cc, a.mkl_out)
        print(out)
        print(out.with_name(MKL_LIBRARY.name) if a.mkl_out is None else a.mkl_out)
    except UserError as e:
        print(f"hvdscale.native: error: {e}", file=sys.stderr)
        return 2
    return 0
