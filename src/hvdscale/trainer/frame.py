"""The frame around one rank's training, the same for every framework: the pid file, the
orphan watchdog, the SIGTERM handler, the SIGUSR1 time-limit stop, and the exit marker
OUT_DIR/.pids/rank-N.exit (diagnostics: a rank without one was killed or crashed hard;
``launch.runner`` reads the markers to name the rank that failed first)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

from hvdscale.errors import UserError
from hvdscale.slurm import timelimit


def run_rank(args, rank: int, train, on_term) -> int:
    """Pid file, orphan watchdog, SIGTERM handler ``on_term``, the SIGUSR1 time-limit
    stop, then ``train(args, out_dir)``; OUT_DIR/.pids/rank-N.exit gets the exit status
    however it ends."""
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_pid_file(out_dir, rank)
    start_orphan_watchdog()
    signal.signal(signal.SIGTERM, on_term)
    timelimit.install()  # SIGUSR1 before the SLURM time limit: checkpoint, exit 4
    code = 1
    try:
        code = train(args, out_dir)
        return code
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
        raise
    except UserError:
        code = 2
        raise
    finally:
        try:
            (out_dir / ".pids" / f"rank-{rank}.exit").write_text(f"{code}\n")
        except OSError:
            pass


def write_pid_file(out_dir: Path, rank: int) -> None:
    d = out_dir / ".pids"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"rank-{rank}.pid").write_text(f"{os.getpid()}\n")


def start_orphan_watchdog(interval_s: float = 1.0) -> None:
    """Exit if the launcher that started this rank dies (e.g. SIGKILL of its process group).

    A rank whose parent (mpirun, the horovodrun task shell, slurmstepd) disappears would
    otherwise keep training as an orphan and race a restarted run for the checkpoint.
    """
    if os.environ.get("HVDSCALE_ORPHAN_WATCHDOG", "1") == "0":
        return
    parent = os.getppid()
    if parent <= 1:
        return

    def watch():
        while True:
            time.sleep(interval_s)
            if os.getppid() != parent:
                print(
                    f"hvdscale train: the launcher (pid {parent}) is gone; exiting",
                    file=sys.stderr,
                    flush=True,
                )
                os._exit(70)

    threading.Thread(target=watch, name="orphan-watchdog", daemon=True).start()
