"""Atomic file writes: write to a temporary file beside the target, fsync, rename."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path

from hvdscale.errors import DataError


@contextlib.contextmanager
def atomic_path(path: str | Path, suffix: str = ""):
    """Yield a temporary path in the target's directory; rename onto ``path`` on success.

    On an exception the temporary file is removed and ``path`` is left untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix + ".tmp", dir=path.parent)
    os.close(fd)
    # mkstemp creates 0600; give the result the permissions a plain open() would
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    try:
        yield Path(tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_json_atomic(path: str | Path, obj, indent: int = 2) -> None:
    with atomic_path(path, ".json") as tmp:
        with open(tmp, "w") as fh:
            json.dump(obj, fh, indent=indent, sort_keys=False, allow_nan=False)
            fh.write("\n")


def write_text_atomic(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        Path(tmp).write_text(text)


def read_json_object(
    path: Path, missing: str, kind: str = "JSON file", not_object: str = "expected a JSON object"
) -> dict:
    """A JSON object from ``path``; DataError "{path}: ..." if absent, unreadable or no object."""
    try:
        obj = json.loads(path.read_text())
    except FileNotFoundError:
        raise DataError(f"{path}: {missing}") from None
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: not a readable {kind}: {exc}") from None
    if not isinstance(obj, dict):
        raise DataError(f"{path}: {not_object}")
    return obj
