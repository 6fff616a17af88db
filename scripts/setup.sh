#!/usr/bin/env bash
# Set up hvdscale on a Debian machine: system packages, the workflow env (.venv) and
# the train env (.venv-train, with Horovod 0.28.1 built against TensorFlow 2.15.1).
#
# Idempotent: a second run only checks. The Horovod wheel is cached (default
# ~/.cache/hvdscale/wheels, override with HVD_WHEEL_CACHE) so a second setup on the
# same machine installs it in seconds instead of compiling it again.
set -euo pipefail

usage() {
    cat <<'EOF'
Usage: scripts/setup.sh [--workflow-only] [--help]

Installs what hvdscale needs on a Debian 12 machine:
  1. Debian packages (build tools, OpenMPI, SLURM + munge for the tests, poppler).
     As root they are installed with apt-get; otherwise the exact apt-get line is
     printed and setup stops.
  2. .venv        workflow env: Snakemake 9, SLURM executor plugin, pandas, pandera,
                  matplotlib, h5py, reportlab, pytest (envs/workflow.lock.txt).
  3. .venv-train  train env: tensorflow-cpu 2.15.1, numpy 1.26.4, h5py, torch 2.13.0 (CPU) and Horovod
                  0.28.1 compiled with MPI and Gloo (envs/train.lock.txt).

Options:
  --workflow-only   set up .venv only (enough for dry runs: snakemake -n)
  --help            show this help

Environment:
  PYTHON            interpreter for both envs (default: python3; must be 3.11)
  HVD_WHEEL_CACHE   where the built Horovod wheel is cached (default ~/.cache/hvdscale/wheels)
  HVD_SKIP_APT=1    do not check Debian packages (e.g. non-Debian clusters with modules)
EOF
}

WORKFLOW_ONLY=0
for arg in "$@"; do
    case "$arg" in
        --workflow-only) WORKFLOW_ONLY=1 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "setup: unknown option '$arg' (see --help)" >&2; exit 2 ;;
    esac
done

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
WHEEL_CACHE="${HVD_WHEEL_CACHE:-$HOME/.cache/hvdscale/wheels}"
HOROVOD_VERSION=0.28.1
log() { printf '[setup] %s\n' "$*"; }

# --------------------------------------------------------------------------- 1. Debian packages
# binary -> package, for what the pipeline, the Horovod build and the tests need.
APT_PACKAGES=(build-essential cmake git openmpi-bin libopenmpi-dev slurm-wlm munge
              poppler-utils iproute2 procps python3-venv python3-dev)
missing_packages() {
    local missing=()
    for pkg in "${APT_PACKAGES[@]}"; do
        # python3-venv/-dev are only needed when PYTHON is Debian's own python3
        if [[ "$pkg" == python3-* ]] && [[ "$("$PYTHON" -c 'import sys; print(sys.prefix)')" != /usr ]]; then
            continue
        fi
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
    done
    echo "${missing[@]:-}"
}

if [[ "${HVD_SKIP_APT:-0}" != 1 ]]; then
    if ! command -v dpkg-query >/dev/null; then
        log "not a Debian system (no dpkg-query): install the equivalents of: ${APT_PACKAGES[*]}"
        log "then rerun with HVD_SKIP_APT=1"
        exit 1
    fi
    MISSING="$(missing_packages)"
    if [[ -n "$MISSING" ]]; then
        if [[ "$(id -u)" == 0 ]]; then
            log "installing Debian packages: $MISSING"
            export DEBIAN_FRONTEND=noninteractive
            apt-get update -qq
            # shellcheck disable=SC2086
            apt-get install -y -q --no-install-recommends $MISSING
        else
            echo "setup: missing Debian packages. Install them with:" >&2
            echo "  sudo apt-get install -y $MISSING" >&2
            echo "then run this script again." >&2
            exit 1
        fi
    else
        log "Debian packages: all present"
    fi
fi

# --------------------------------------------------------------------------- Python
PYVER="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if [[ "$PYVER" != 3.11 ]]; then
    echo "setup: $PYTHON is Python $PYVER; hvdscale needs Python 3.11 (TensorFlow 2.15 supports" >&2
    echo "  at most 3.11, Snakemake 9 at least 3.11). Set PYTHON=/path/to/python3.11." >&2
    exit 1
fi

# stamp-based idempotence: reinstall an env only when its lock file changed
stamp_ok() { [[ -f "$1/.hvdscale-stamp" ]] && [[ "$(cat "$1/.hvdscale-stamp")" == "$2" ]]; }
lock_hash() { cat "$@" pyproject.toml | sha256sum | cut -c1-16; }

make_venv() {
    local dir="$1"
    if [[ ! -x "$dir/bin/python" ]]; then
        log "creating $dir"
        "$PYTHON" -m venv "$dir"
        "$dir/bin/python" -m pip install -q --upgrade pip
    fi
}

# --------------------------------------------------------------------------- 2. workflow env
WF_HASH="$(lock_hash envs/workflow.lock.txt)"
if stamp_ok .venv "$WF_HASH"; then
    log ".venv: up to date"
else
    make_venv .venv
    log ".venv: installing envs/workflow.lock.txt"
    .venv/bin/python -m pip install -q -r envs/workflow.lock.txt
    .venv/bin/python -m pip install -q --no-deps -e .
    echo "$WF_HASH" > .venv/.hvdscale-stamp
fi
.venv/bin/python -c "import snakemake, snakemake_executor_plugin_slurm, pandera, hvdscale" \
    || { echo "setup: .venv is broken; remove it and run setup again" >&2; exit 1; }

[[ "$WORKFLOW_ONLY" == 1 ]] && { log "done (workflow env only)"; exit 0; }

# --------------------------------------------------------------------------- 3. train env
TR_HASH="$(lock_hash envs/train.lock.txt)"
if stamp_ok .venv-train "$TR_HASH"; then
    log ".venv-train: up to date"
else
    make_venv .venv-train
    log ".venv-train: installing envs/train.lock.txt"
    .venv-train/bin/python -m pip install -q -r envs/train.lock.txt
    .venv-train/bin/python -m pip install -q wheel==0.48.0 setuptools==84.2.1
    .venv-train/bin/python -m pip install -q --no-deps -e .

    # Horovod: build once against this exact TensorFlow, cache the wheel.
    TF_VERSION="$(.venv-train/bin/python -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null)"
    CACHE_DIR="$WHEEL_CACHE/tf-$TF_VERSION"
    WHEEL="$(ls "$CACHE_DIR"/horovod-"$HOROVOD_VERSION"-*.whl 2>/dev/null | head -n1 || true)"
    if [[ -z "$WHEEL" ]]; then
        log "building Horovod $HOROVOD_VERSION against TensorFlow $TF_VERSION (a few minutes; cached in $CACHE_DIR)"
        mkdir -p "$CACHE_DIR"
        # Pitfalls (see DEVELOPERS.md): no build isolation (it must see this TF); the
        # system cmake 3.25, not pip's cmake 4 (breaks Horovod's vendored gloo).
        env PATH="$ROOT/.venv-train/bin:/usr/local/bin:/usr/bin:/bin" \
            HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
            HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
            HOROVOD_CMAKE="$(command -v cmake)" MAKEFLAGS="-j$(nproc)" \
            .venv-train/bin/python -m pip wheel --no-build-isolation --no-deps \
                -w "$CACHE_DIR" "horovod==$HOROVOD_VERSION"
        WHEEL="$(ls "$CACHE_DIR"/horovod-"$HOROVOD_VERSION"-*.whl | head -n1)"
    else
        log "using cached Horovod wheel $WHEEL"
    fi
    .venv-train/bin/python -m pip install -q --no-deps --force-reinstall "$WHEEL"
    echo "$TR_HASH" > .venv-train/.hvdscale-stamp
fi

# --------------------------------------------------------------------------- native library
# Gloo ranks (Horovod's and torch-ddp's) preload it (training.gloo_yield_when_spinning,
# src/hvdscale/native/epoll_yield.c): Gloo's loop thread yields instead of spinning.
NATIVE=src/hvdscale/native
if [[ ! -f "$NATIVE/epoll_yield.so" || "$NATIVE/epoll_yield.c" -nt "$NATIVE/epoll_yield.so" ]]; then
    log "building $NATIVE/epoll_yield.so"
    .venv-train/bin/python -m hvdscale.native build >/dev/null
fi

# --------------------------------------------------------------------------- check
CHECK="$(PATH="$ROOT/.venv-train/bin:$PATH" .venv-train/bin/horovodrun --check-build 2>/dev/null)"
for want in "TensorFlow" "MPI" "Gloo"; do
    if ! grep -q "\[X\] $want" <<<"$CHECK"; then
        echo "setup: horovodrun --check-build does not list $want:" >&2
        echo "$CHECK" >&2
        echo "remove .venv-train and the cached wheel ($WHEEL_CACHE) and run setup again" >&2
        exit 1
    fi
done
log "horovodrun --check-build: TensorFlow, MPI and Gloo available"
log "done: workflow env .venv, train env .venv-train"
