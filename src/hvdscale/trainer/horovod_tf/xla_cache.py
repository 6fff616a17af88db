"""XLA's persistent compilation cache for the Horovod-TF step (issue 32: "the compiled
graphs are cached across runs of a study ... so 40 jobs do not compile 40 times").

TensorFlow 2.15 keeps the executables XLA compiled for ``jit_compile`` functions in a
folder when ``TF_XLA_FLAGS`` names one (``--tf_xla_persistent_cache_directory=DIR``): one
file per compiled program, ``PREFIX__KEY.pb`` (written to a ``.tmp`` file first, then
renamed), looked up by a key of the function's signature and the hash of its HLO module.
A later compilation of the same program reads the file instead of compiling again (the
HLO is still built: the key needs it).

**GPU ranks only.** TensorFlow 2.15.1 cannot store an executable XLA compiled for the CPU:
it falls back to ``LocalClient::CompileAheadOfTime`` without a target triple, and every
XLA compilation on the CPU then fails ("TargetRegistry::lookupTarget failed: No available
targets are compatible with triple "unknown"", TensorFlow issue 57649; measured with the
pinned tensorflow-cpu 2.15.1, tests/test_train.py). So the cache is restricted to XLA's GPU
device (``--tf_xla_persistent_cache_device_types=XLA_GPU_JIT``): a CPU rank compiles every
run (its record's ``compile_cache_dir`` is null), a GPU rank loads what an earlier run of
the study stored.

TensorFlow reads ``TF_XLA_FLAGS`` once, when it first lists its devices (measured: a flag
set after ``tf.config.list_physical_devices`` is ignored), so ``use_xla_cache`` sets the
flags before the rank pins its device, pointing the cache into the study's results folder
(``results/cache/xla`` for a run folder ``results/runs/RUN_ID``, as torch-ddp points
Inductor's cache at ``results/cache/torchinductor``); ``cache_for_device`` says, once the
device is known, whether the rank uses it. ``CacheWatch``
counts what one compilation did with that folder, for the record's
``compile_cache_hits`` and ``compile_cache_misses``; TensorFlow exposes no counter of
persistent-cache lookups to Python, so they are counted on the folder:

* misses: entries (``*.pb``) that appeared or were rewritten (another size or mtime)
  while the watch ran: programs compiled and stored;
* hits: entries that were in the folder before the watch, were opened while it ran
  (inotify ``IN_OPEN``) and were not rewritten: programs loaded instead of compiled.
  None (unknown) where inotify is not available (not Linux) or its queue overflowed.

Both count the folder, not the process: another process on the same node that stores or
loads an entry while the watch runs is counted too (the ranks of one run compile the
same program: rank 0's counts are the run's). No TensorFlow import here.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shlex
import struct
from pathlib import Path

from hvdscale.errors import UserError

FLAG = "--tf_xla_persistent_cache_directory"
DEVICE_TYPES_FLAG = "--tf_xla_persistent_cache_device_types"
#: XLA's compilation device types (TensorFlow's JIT registrations) of a GPU and a CPU rank
GPU_JIT, CPU_JIT = "XLA_GPU_JIT", "XLA_CPU_JIT"
#: the cache's folder inside the results folder (beside torch-ddp's ``torchinductor``)
CACHE_SUBDIR = "xla"
ENTRY_SUFFIX = ".pb"


def flag_value(flags: str, flag: str) -> str | None:
    """The value ``TF_XLA_FLAGS`` (``flags``) gives ``flag`` (``--name=value``; the last
    one, as TensorFlow reads them), or None."""
    found = None
    for token in shlex.split(flags):
        name, eq, value = token.partition("=")
        if eq and name == flag:
            found = value or None
    return found


def use_xla_cache(out_dir: Path | str | None, env=None) -> str | None:
    """Point XLA's persistent cache into the study's results folder, for GPU ranks only:
    ``--tf_xla_persistent_cache_directory=results/cache/xla`` (for a run folder
    results/runs/RUN_ID) and ``--tf_xla_persistent_cache_device_types=XLA_GPU_JIT`` added
    to ``TF_XLA_FLAGS``, unless they name a folder already (then theirs is used). Must run
    before TensorFlow lists its devices (``framework.HorovodTF.start``: before hvd.init).
    Returns the folder the flags name (absolute), or None: no cache for a run folder
    outside a ``runs`` folder (not a study's run)."""
    env = os.environ if env is None else env
    flags = env.get("TF_XLA_FLAGS", "")
    named = flag_value(flags, FLAG)
    if named:
        return os.path.abspath(named)
    if out_dir is None or Path(out_dir).resolve().parent.name != "runs":
        return None
    cache = Path(out_dir).resolve().parent.parent / "cache" / CACHE_SUBDIR
    ours = f"{FLAG}={shlex.quote(str(cache))} {DEVICE_TYPES_FLAG}={GPU_JIT}"
    env["TF_XLA_FLAGS"] = f"{flags} {ours}".strip()
    return str(cache)


def cache_for_device(folder: str | None, device: str, env=None) -> str | None:
    """The cache folder a rank on ``device`` (its TF device string, /GPU:0 or /CPU:0)
    uses: ``folder`` where the device-type flag includes its XLA device (or names none),
    else None. A CPU rank whose flags would use the cache is refused (UserError): TF 2.15's
    XLA then fails every CPU compilation (see the module)."""
    if folder is None:
        return None
    env = os.environ if env is None else env
    types = flag_value(env.get("TF_XLA_FLAGS", ""), DEVICE_TYPES_FLAG)
    jit = GPU_JIT if "GPU" in device.upper() else CPU_JIT
    if types is not None and jit not in types.split(","):
        return None
    if jit == CPU_JIT:
        raise UserError(
            f"TF_XLA_FLAGS: {FLAG}={folder} applies to XLA's CPU device, and TensorFlow "
            f"2.15 cannot store CPU executables (every XLA compilation on the CPU fails: "
            f"'TargetRegistry::lookupTarget failed'); add {DEVICE_TYPES_FLAG}={GPU_JIT} "
            f"or remove {FLAG}"
        )
    return folder


def _entries(folder: Path) -> dict[str, tuple[int, int]]:
    """The cache's entries: name -> (mtime_ns, size)."""
    out = {}
    try:
        with os.scandir(folder) as it:
            for e in it:
                if e.name.endswith(ENTRY_SUFFIX) and e.is_file():
                    st = e.stat()
                    out[e.name] = (st.st_mtime_ns, st.st_size)
    except FileNotFoundError:
        pass
    return out


class _Opens:
    """The names of files opened in one folder (Linux inotify through libc, IN_OPEN);
    ``open`` returns None where inotify is not available."""

    IN_OPEN = 0x20
    IN_Q_OVERFLOW = 0x4000
    _HEAD = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; name

    def __init__(self, libc, fd: int):
        self.libc, self.fd = libc, fd
        self.names: set[str] = set()
        self.overflow = False

    @classmethod
    def open(cls, folder: Path) -> _Opens | None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            init, add = libc.inotify_init1, libc.inotify_add_watch
        except (OSError, AttributeError):
            return None
        fd = init(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            return None
        if add(fd, os.fsencode(folder), cls.IN_OPEN) < 0:
            os.close(fd)
            return None
        return cls(libc, fd)

    def _drain(self) -> None:
        while True:
            try:
                buf = os.read(self.fd, 65536)
            except OSError as e:
                if e.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                    return
                raise
            if not buf:
                return
            pos = 0
            while pos + self._HEAD.size <= len(buf):
                _, mask, _, n = self._HEAD.unpack_from(buf, pos)
                name = buf[pos + self._HEAD.size : pos + self._HEAD.size + n].rstrip(b"\0")
                pos += self._HEAD.size + n
                if mask & self.IN_Q_OVERFLOW:
                    self.overflow = True
                elif mask & self.IN_OPEN and name:
                    self.names.add(os.fsdecode(name))

    def close(self) -> set[str] | None:
        """The names opened since ``open`` (None: events were lost); stops watching."""
        try:
            self._drain()
        finally:
            os.close(self.fd)
        return None if self.overflow else self.names


class CacheWatch:
    """What one compilation did with the cache folder: ``CacheWatch(folder)`` before it,
    ``counts()`` after (see the module: misses = entries stored, hits = entries that were
    there and were loaded)."""

    def __init__(self, folder: Path | str):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.opens = _Opens.open(self.folder)
        self.before = _entries(self.folder)

    def counts(self) -> tuple[int | None, int]:
        """(hits, misses); hits None where the folder's opens could not be watched."""
        opened = self.opens.close() if self.opens is not None else None
        after = _entries(self.folder)
        written = {name for name, st in after.items() if self.before.get(name) != st}
        hits = None
        if opened is not None:
            hits = len({n for n in opened if n in self.before and n not in written})
        return hits, len(written)

    def record(self) -> dict:
        """The record's ``compile_cache_*`` keys from ``counts()``."""
        hits, misses = self.counts()
        return {"compile_cache_dir": str(self.folder), "compile_cache_hits": hits,
                "compile_cache_misses": misses}  # fmt: skip
