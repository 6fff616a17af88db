"""A non-root cluster user with Lmod modules, for tests/test_lmod_user.py (issue 29).

What a login node gives an hvdscale user, emulated on the test machine (as root):

- Lmod: Debian's ``lmod`` package (``scripts/setup.sh`` installs it as root, with the
  SLURM packages). Its ``/etc/profile.d/lmod.sh`` runs in login shells: it defines the
  ``module`` shell function, exports it (``export -f module``) and sets
  ``BASH_ENV=/usr/share/lmod/lmod/init/bash``, so the non-interactive bash of a SLURM
  job (which inherits the submitting shell's environment) has ``module`` too:
  Snakemake's ``--sdm env-modules`` runs a job as ``module purge &&
  MODULES_VERBOSITY=concise module load A B; CMD`` (snakemake/deployment/env_modules.py).
- A user account (``hvduser``, home ``/home/hvduser``) made with ``useradd``; idempotent.
- Lua modulefiles in ``<home>/lmod/modulefiles`` (the user's own tree, ``module use``):
  ``openmpi/4.1.4`` (Debian's OpenMPI 4.1.4: MPI_HOME, its library directory),
  ``python/3.11`` (Debian's /usr/bin/python3.11 as ``python``, from a bin directory of
  its own as a site's Python module has) and ``tensorflow-horovod/2.15.1`` (the
  site's TensorFlow + Horovod module: the ``site-packages`` of the ``.venv-train`` that
  ``make setup`` built in the user's clone from that Python and OpenMPI, on
  PYTHONPATH, as EasyBuild's TensorFlow modules put theirs). Not a site's module tree
  (no hierarchy, no EasyBuild): the modules the test's config loads.

Everything the user runs goes through :func:`run_as_user`: ``runuser`` into a login
shell (``bash -l``) with a clean environment (HOME, USER, PATH=/usr/local/bin:/usr/bin:/bin,
and what the caller adds, e.g. SLURM_CONF), as on a login node; nothing of root's
environment (its pyenv Python, its venvs) leaks in.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
USER = os.environ.get("HVD_LMOD_USER", "hvduser")
LMOD_INIT = Path("/usr/share/lmod/lmod/init/bash")
LMOD_PROFILE = Path("/etc/profile.d/lmod.sh")
SYSTEM_PYTHON = Path("/usr/bin/python3.11")
OPENMPI_ROOT = Path("/usr/lib/x86_64-linux-gnu/openmpi")
#: the modules of the test's config, in load order
MODULES = ["openmpi/4.1.4", "python/3.11", "tensorflow-horovod/2.15.1"]
CLEAN_PATH = "/usr/local/bin:/usr/bin:/bin"


def lmod_skip_reason() -> str | None:
    """Why a non-root Lmod user cannot be emulated here, or None when it can."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "making a non-root test user needs root (useradd, runuser)"
    if not LMOD_INIT.exists() or not LMOD_PROFILE.exists():
        return (
            f"Lmod not installed ({LMOD_INIT}, {LMOD_PROFILE}): apt-get install -y lmod "
            "(scripts/setup.sh installs it as root)"
        )
    missing = [c for c in ("useradd", "runuser", "git") if shutil.which(c) is None]
    if missing:
        return f"missing {', '.join(missing)} (Debian packages passwd, util-linux, git)"
    if not SYSTEM_PYTHON.exists():
        return f"{SYSTEM_PYTHON} missing: apt-get install -y python3 python3-venv python3-dev"
    if not (OPENMPI_ROOT / "lib").is_dir():
        return f"{OPENMPI_ROOT}/lib missing: apt-get install -y openmpi-bin libopenmpi-dev"
    return None


def ensure_user(name: str = USER) -> pwd.struct_passwd:
    """The account ``name`` (home /home/<name>, bash), made when missing."""
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    subprocess.run(
        ["useradd", "--create-home", "--home-dir", f"/home/{name}", "--shell", "/bin/bash"]
        + ["--comment", "hvdscale test user (tests/lmod_support.py)", name],
        check=True,
        capture_output=True,
        text=True,
    )
    return pwd.getpwnam(name)


def chown_tree(path: Path, user: pwd.struct_passwd) -> None:
    for p in [path, *path.rglob("*")]:
        os.lchown(p, user.pw_uid, user.pw_gid)


def run_as_user(
    script: str,
    user: pwd.struct_passwd,
    env: dict[str, str] | None = None,
    timeout: float = 600,
) -> subprocess.CompletedProcess:
    """Run ``script`` in a login bash of ``user`` with a clean environment (plus ``env``);
    stdout and stderr together in ``stdout``."""
    base = {
        "HOME": user.pw_dir,
        "USER": user.pw_name,
        "LOGNAME": user.pw_name,
        "SHELL": "/bin/bash",
        "PATH": CLEAN_PATH,
        "LANG": "C.UTF-8",
    }
    assigns = [f"{k}={v}" for k, v in {**base, **(env or {})}.items()]
    return subprocess.run(
        ["runuser", "-u", user.pw_name, "--", "env", "-i", *assigns, "bash", "-lc", script],
        cwd="/",
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )


def give_wheel_cache(user: pwd.struct_passwd) -> Path | None:
    """Copy root's Horovod wheel cache (HVD_WHEEL_CACHE or ~/.cache/hvdscale/wheels,
    filled by the `make setup` that CI runs first) into the user's, so the user's
    `make setup` installs the cached wheel instead of compiling Horovod (minutes). The
    user's cache directory, or None when root has none (then setup compiles)."""
    src = Path(os.environ.get("HVD_WHEEL_CACHE", Path.home() / ".cache/hvdscale/wheels"))
    if not src.is_dir():
        return None
    dest = Path(user.pw_dir) / ".cache" / "hvdscale" / "wheels"
    shutil.copytree(src, dest, dirs_exist_ok=True)
    chown_tree(Path(user.pw_dir) / ".cache", user)
    return dest


def clone_head(
    user: pwd.struct_passwd, dest: Path, root: Path = PROJECT_ROOT, keep_envs: bool = False
) -> str:
    """``git clone`` of ``root``'s HEAD into ``dest`` as ``user``; the commit cloned.

    The user clones a bundle of HEAD that root writes: the checkout itself may be in a
    directory the user cannot read, and git refuses to read a repository another user
    owns ("detected dubious ownership"). What the clone holds is the committed HEAD, as
    in CI's fresh clone.

    ``keep_envs``: a clone that an earlier run left in ``dest`` is brought to HEAD in
    place instead (fetch, checkout, and ``git clean`` of everything untracked but its
    venvs ``.venv`` and ``.venv-train``), so the user's ``make setup`` reinstalls an env
    only where its lock stamp changed (scripts/setup.sh); no clone there: a fresh one."""
    head = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="hvd-bundle-") as tmp:
        os.chmod(tmp, 0o755)
        bundle = Path(tmp) / "hvdscale.bundle"
        subprocess.run(
            ["git", "-C", str(root), "bundle", "create", str(bundle), "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        )
        os.chmod(bundle, 0o644)
        if keep_envs and (dest / ".git").is_dir():
            git = f"git -C '{dest}'"
            cmd = (
                f"{git} fetch -q '{bundle}' HEAD && {git} checkout -q -f --detach {head}"
                f" && {git} clean -q -ffdx -e /.venv -e /.venv-train"
            )
        else:
            cmd = (
                f"rm -rf '{dest}' && git clone -q --no-checkout '{bundle}' '{dest}'"
                f" && git -C '{dest}' checkout -q --detach {head}"
            )
        out = run_as_user(cmd, user, timeout=300)
    if out.returncode != 0:
        raise AssertionError(f"git clone as {user.pw_name} failed:\n{out.stdout}")
    overlay_worktree(user, dest, root)
    return head


def overlay_worktree(user: pwd.struct_passwd, dest: Path, root: Path = PROJECT_ROOT) -> list[str]:
    """For trying uncommitted changes (a clone holds HEAD only): the paths listed in
    HVD_TEST_CLONE_OVERLAY (space-separated, relative to the project root) are copied from
    the working tree into the clone. Unset (CI): nothing is copied."""
    paths = os.environ.get("HVD_TEST_CLONE_OVERLAY", "").split()
    for rel in paths:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, target)
        os.chown(target, user.pw_uid, user.pw_gid)
    return paths


def write_modulefiles(user: pwd.struct_passwd, clone: Path) -> Path:
    """The Lua modulefiles of :data:`MODULES` under <home>/lmod/modulefiles (owned by the
    user); the directory to `module use`. tensorflow-horovod/2.15.1 points at the
    ``.venv-train`` of ``clone``."""
    base = Path(user.pw_dir) / "lmod"
    tree = base / "modulefiles"
    pybin = base / "sw" / "python-3.11" / "bin"
    shutil.rmtree(base, ignore_errors=True)
    pybin.mkdir(parents=True)
    for name in ("python", "python3"):
        (pybin / name).symlink_to(SYSTEM_PYTHON)
    site = clone / ".venv-train" / "lib" / "python3.11" / "site-packages"
    files = {
        "openmpi/4.1.4.lua": f"""\
-- Debian's OpenMPI 4.1.4 (openmpi-bin, libopenmpi-dev): stand-in for a site's OpenMPI module
whatis("Name: OpenMPI 4.1.4 (Debian package, tests/lmod_support.py)")
family("mpi")
setenv("MPI_HOME", "{OPENMPI_ROOT}")
prepend_path("LD_LIBRARY_PATH", "{OPENMPI_ROOT}/lib")
""",
        "python/3.11.lua": f"""\
-- Debian's Python 3.11 ({SYSTEM_PYTHON}) as `python`: stand-in for a site's Python module
whatis("Name: Python 3.11 (Debian package, tests/lmod_support.py)")
family("python")
prepend_path("PATH", "{pybin}")
""",
        "tensorflow-horovod/2.15.1.lua": f"""\
-- TensorFlow 2.15.1 + Horovod 0.28.1 for python/3.11 and openmpi/4.1.4: the site-packages
-- of the train env `make setup` built in {clone}, as a site's TensorFlow module
whatis("Name: TensorFlow 2.15.1, Horovod 0.28.1 (tests/lmod_support.py)")
prereq("python/3.11", "openmpi/4.1.4")
prepend_path("PYTHONPATH", "{site}")
""",
    }
    for rel, text in files.items():
        path = tree / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    chown_tree(base, user)
    return tree
