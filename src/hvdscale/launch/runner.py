"""Run a launch spec and read its outcome: the launcher process and its output, the
ranks' exit markers, the failure message, and the check that the ranks' interpreter finds
hvdscale. The command line, with what it reads and writes in full, is ``hvdscale launch``
(hvdscale.launch.command).
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

from hvdscale.errors import UserError
from hvdscale.launch.launchspec import (
    TRAIN_PROGRAM,
    LaunchSpec,
)
from hvdscale.matrix.runtable import find_run
from hvdscale.record.build import EXIT_NAN, read_record
from hvdscale.slurm import timelimit
from hvdscale.slurm.jobspec import JobSpec


def companion(python: str, tool: str) -> str:
    """``tool`` next to the train python (its venv's bin), else from PATH."""
    p = Path(python)
    if p.parent != Path("."):
        cand = p.parent / tool
        if cand.exists():
            return str(cand)
    return shutil.which(tool) or tool


#: what the ranks import besides TensorFlow, Horovod or torch: hvdscale and its own
#: dependencies (pyproject.toml), import name -> package name
RANK_IMPORTS = {
    "hvdscale": "hvdscale",
    "numpy": "numpy",
    "h5py": "h5py",
    "yaml": "pyyaml",
    "jsonschema": "jsonschema",
}
_FIND_SPECS = (
    "import importlib.util as u, sys\n"
    "print(' '.join(m for m in sys.argv[1:] if u.find_spec(m) is None))\n"
    "print(sys.executable, sys.version.split()[0])"
)


def train_python_problem(python: str, env: dict[str, str]) -> str | None:
    """Whether the ranks' interpreter ``python`` (env-modules/conda: the `python` of the
    loaded modules or the conda env), in the ranks' environment ``env``, finds hvdscale
    and its dependencies; the message naming what it lacks, or None. Imports nothing
    (importlib.util.find_spec), so it costs a Python start-up, not TensorFlow's."""
    try:
        out = subprocess.run(
            [python, "-c", _FIND_SPECS, *RANK_IMPORTS],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    except FileNotFoundError:
        return (
            f"the train env's interpreter {python!r} is not on PATH: environment.modules "
            "(or the conda env) gives the training jobs no Python"
        )
    if out.returncode != 0:
        return f"the train env's interpreter {python!r} did not start: {out.stderr.strip()[-500:]}"
    missing, _, which = out.stdout.partition("\n")
    if not missing.strip():
        return None
    packages = ", ".join(RANK_IMPORTS[m] for m in missing.split())
    return (
        f"the train env's {python} ({which.strip()}) cannot import {packages}: the ranks "
        "run `-m hvdscale.cli` with the project's src on PYTHONPATH, so hvdscale's own "
        "dependencies (numpy, h5py, pyyaml, jsonschema) must come with environment.modules "
        "(or the conda env). Load modules that provide them, or make a venv on top of the "
        "module's Python (python -m venv --system-site-packages DIR; DIR/bin/pip install "
        "pyyaml jsonschema; DIR/bin/pip install --no-deps -e .) and use deployment venv "
        "with environment.venv: DIR (a path inside the project)"
    )


# =========================================================================== running


def rank_exit_codes(out_dir: Path, workers: int) -> dict[int, str]:
    """Exit status each rank recorded in OUT_DIR/.pids/rank-N.exit (absent: killed/crashed hard)."""
    codes = {}
    for r in range(workers):
        f = out_dir / ".pids" / f"rank-{r}.exit"
        if f.is_file():
            codes[r] = f.read_text().strip()
    return codes


def _reader(stream, sink, tail: collections.deque):
    for line in iter(stream.readline, ""):
        sink.write(line)
        sink.flush()
        tail.append(line)
    stream.close()


def run_spec(spec: LaunchSpec, timeout_s: float | None = None) -> tuple[int, str]:
    """Start the launcher in its own process group; stream its output; return (status, tail).

    SIGTERM/SIGINT to this process are forwarded to the launcher's group.
    """
    env = dict(os.environ)
    env.update(spec.env)
    tail_out: collections.deque = collections.deque(maxlen=200)
    tail_err: collections.deque = collections.deque(maxlen=200)
    proc = subprocess.Popen(
        spec.argv,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        bufsize=1,
        errors="replace",
    )
    # SIGUSR1 to the ranks before the time limit (torchrun would die of it: to the ranks)
    timelimit.watch(proc, spec.env, to_ranks=spec.launcher == "torchrun")
    threads = [
        threading.Thread(target=_reader, args=(proc.stdout, sys.stdout, tail_out), daemon=True),
        threading.Thread(target=_reader, args=(proc.stderr, sys.stderr, tail_err), daemon=True),
    ]
    for t in threads:
        t.start()

    def forward(signum, _frame):
        try:
            proc.send_signal(signum)
        except ProcessLookupError:
            pass

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        status = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            status = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            status = proc.wait()
        tail_err.append(f"hvdscale launch: timed out after {timeout_s} s\n")
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    for t in threads:
        t.join(timeout=10)
    tail = "".join(list(tail_out)[-60:]) + "".join(list(tail_err)[-100:])
    return status, tail


_FIRST_FAILED = (
    re.compile(
        r"The first process to do so was:\s*Process name:\s*(\d+)\s*Exit code:\s*(-?\d+)"
    ),  # horovodrun
    re.compile(
        r"mpirun noticed that process rank (\d+) with PID \S+ on node \S+ exited on signal (\d+)"
    ),
    re.compile(r"Process (\d+) exit with status code (-?\d+)"),  # horovodrun, per process
    re.compile(
        r"srun: error: \S+: task (\d+): (?:Exited with exit code|Killed|Terminated)\s*(\d*)"
    ),
    re.compile(  # torchrun's error summary
        r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)",
        re.S,
    ),
)


def describe_failure(tail: str, status: int, out_dir: Path | None, workers: int) -> str:
    """One line naming the rank that failed first (from the launcher's own report) and
    the ranks that left no exit marker (killed or crashed hard)."""
    parts = [f"launcher exit status {status}"]
    first = None
    for pat in _FIRST_FAILED:
        m = pat.search(tail)
        if m:
            first = (int(m.group(1)), m.group(2))
            break
    if first is not None:
        r, code = first
        how = ""
        if code and code.lstrip("-").isdigit():
            c = int(code)
            if pat is _FIRST_FAILED[1]:
                how = f" (signal {c})"
            elif c > 128 or c < 0:
                how = f" (exit code {c}: signal {c - 128 if c > 128 else -c})"
            else:
                how = f" (exit code {c})"
        parts.append(f"rank {r} failed first{how}")
    if out_dir is not None:
        codes = rank_exit_codes(out_dir, workers)
        started = [r for r in range(workers) if (out_dir / ".pids" / f"rank-{r}.pid").is_file()]
        lost = [r for r in started if r not in codes]
        if lost:
            parts.append(
                "no exit marker (killed or crashed) from rank(s) " + ", ".join(map(str, lost))
            )
        bad = {r: c for r, c in codes.items() if c not in ("0", str(EXIT_NAN))}
        if bad:
            parts.append(
                "exit status by rank: "
                + ", ".join(f"rank {r}: {c}" for r, c in sorted(bad.items()))
            )
    return "; ".join(parts)


# =========================================================================== command


def job_for(
    cfg: dict, program: str, run_id: str | None, allreduce_id: str | None
) -> tuple[JobSpec, str]:
    """The job layout and identifier of a training run or an allreduce sweep."""
    if program == "train" or (run_id and not allreduce_id):
        if not run_id:
            raise UserError("--run-id is required")
        r = find_run(cfg, run_id)
        return JobSpec.for_run(cfg, r), r.run_id
    if not allreduce_id:
        raise UserError("measure-allreduce needs --allreduce-id (or --run-id)")
    return JobSpec.for_allreduce_id(cfg, allreduce_id), allreduce_id


def train_program(args, python: str, ident: str) -> tuple[Path, Path, list[str]]:
    """(run directory, failure.json, the ranks' command) of a training run: the same
    command for every framework (``hvdscale train`` reads the framework from the run id)."""
    if not args.data_dir or not args.out_dir:
        raise UserError("train needs --data-dir and --out-dir")
    out_dir = Path(args.out_dir)
    prog = [
        *(python, *TRAIN_PROGRAM),
        *("--config", str(Path(args.config).resolve())),
        *("--run-id", ident),
        *("--data-dir", str(Path(args.data_dir).resolve())),
        *("--out-dir", str(out_dir.resolve())),
    ]
    if args.target:
        prog += ["--target", str(Path(args.target).resolve())]
    return out_dir, out_dir / "failure.json", prog


def allreduce_program(args, python: str, job: JobSpec) -> tuple[Path, Path, list[str]]:
    """(output directory, OUT.failure.json, the ranks' command) of an allreduce sweep."""
    if not args.out:
        raise UserError("measure-allreduce needs --out CSV")
    out_dir = Path(args.out_dir) if args.out_dir else Path(args.out).parent
    prog = [
        *(python, "-m", "hvdscale.cli", "measure-allreduce"),
        *("--out", str(Path(args.out).resolve())),
        *("--partition", job.partition),
        *("--backend", job.backend),
        *("--nodes", str(job.nodes)),
    ]
    if args.sizes:
        prog += ["--sizes", args.sizes]
    if args.iterations:
        prog += ["--iterations", str(args.iterations)]
    if args.warmup_iterations:
        prog += ["--warmup-iterations", str(args.warmup_iterations)]
    return out_dir, Path(str(args.out) + ".failure.json"), prog


def first_failed_rank(out_dir: Path, workers: int) -> tuple[int, int] | None:
    """(rank, exit status) of the rank whose exit marker says it failed first (the oldest
    marker with a status other than 0 and EXIT_NAN), or None."""
    failed = []
    for r, code in rank_exit_codes(out_dir, workers).items():
        if code.lstrip("-").isdigit() and int(code) not in (0, EXIT_NAN):
            mtime = (out_dir / ".pids" / f"rank-{r}.exit").stat().st_mtime
            failed.append((mtime, r, int(code)))
    return min(failed)[1:] if failed else None


def torchrun_status(status: int, tail: str, out_dir: Path, workers: int) -> int:
    """The exit status of a failed torchrun job (torchrun exits 1 whichever rank failed
    and however): the status in the exit marker of the rank torchrun saw fail first (its
    own report can be a later abort), else 128 + the signal that killed it, else the
    oldest failed exit marker's (e.g. 2 bad input, 4 stopped for the time limit)."""
    m = _FIRST_FAILED[-1].search(tail)
    if m:
        rank, code = int(m.group(1)), int(m.group(2))
        marker = rank_exit_codes(out_dir, workers).get(rank, "")
        if marker.isdigit() and int(marker) != 0:
            return int(marker) if int(marker) < 256 else 1
        if code < 0:
            return 128 - code
    first = first_failed_rank(out_dir, workers)
    if first is not None:
        return first[1] if 0 < first[1] < 256 else 1
    return int(m.group(2)) if m and 0 < int(m.group(2)) < 256 else status


def clear_stale(program: str, out_dir: Path, failure_path: Path) -> None:
    """Create the output directory; remove the failure record and rank pids of an earlier try."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if failure_path.exists():
        failure_path.unlink()  # stale: from an earlier attempt
    if program == "train":
        pids = out_dir / ".pids"
        if pids.is_dir():
            shutil.rmtree(pids, ignore_errors=True)


def train_outcome(
    ident: str, out_dir: Path, status: int, tail: str, t0: float, took: float, workers: int
) -> tuple[bool, int, str]:
    """(succeeded, exit status, failure message) of a training run from its fresh record."""
    metrics = out_dir / "metrics.json"
    record = read_record(metrics) if metrics.exists() else None
    fresh = record is not None and metrics.stat().st_mtime >= t0 - 1
    if record is not None and fresh and record["status"] == "completed" and status == 0:
        print(f"hvdscale launch: {ident}: completed in {took:.1f} s", file=sys.stderr)
        return True, 0, ""
    if record is not None and fresh and record["status"] == "nan_loss":
        print(
            f"ERROR: {ident}: training diverged ({record.get('error')}); the run record "
            f"{metrics} has status nan_loss and stays for the report",
            file=sys.stderr,
        )
        return True, 0, ""
    if status == 0:
        # a launcher that says 0 without a valid record is a failure too
        return False, 1, "the ranks exited 0 but no valid metrics.json was written"
    return False, status, describe_failure(tail, status, out_dir, workers)


def allreduce_outcome(
    ident: str, out: str, status: int, tail: str, took: float, workers: int
) -> tuple[bool, int, str]:
    """(succeeded, exit status, failure message) of an allreduce sweep from its CSV."""
    if status == 0 and Path(out).is_file():
        print(
            f"hvdscale launch: {ident}: allreduce sweep written to {out} in {took:.1f} s",
            file=sys.stderr,
        )
        return True, 0, ""
    msg = describe_failure(tail, status, None, workers) if status else "no output CSV written"
    return False, status or 1, msg
