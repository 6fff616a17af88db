#!/usr/bin/env bash
# Set up hvdscale: system pieces (installed as root on Debian, else checked on PATH), the
# workflow env (.venv) and the train env (.venv-train, with Horovod 0.28.1 built against
# TensorFlow 2.15.1 and the MPI, compilers and CUDA on the user's PATH). The train env is
# the CPU variant (envs/train.lock.txt) or the GPU variant (envs/train-gpu.lock.txt: TF with
# its CUDA libraries, torch's CUDA build, Horovod with NCCL); see HVD_GPU below.
#
# Idempotent: a second run only checks. The Horovod wheel is cached (default
# ~/.cache/hvdscale/wheels, override with HVD_WHEEL_CACHE) so a second setup on the
# same machine installs it in seconds instead of compiling it again. The cache directory
# is keyed by TensorFlow, MPI implementation + version and CUDA, e.g.
# tf-2.15.1_openmpi-4.1.4_cuda-none (GPU: tf-2.15.1_openmpi-4.1.4_cuda-13.0_torch-2.13.0),
# with build-info.txt (what the build used) beside it.
set -euo pipefail

usage() {
    cat <<'EOF'
Usage: scripts/setup.sh [--workflow-only] [--check-only] [--help]

Installs what hvdscale needs:
  1. System pieces. As root on Debian the Debian packages (build tools, OpenMPI,
     SLURM + munge and Lmod for the tests, poppler) are installed with apt-get. Otherwise
     (ordinary user, or not Debian) no root is needed: the pieces must be on PATH,
     from the OS or from modules: a C and C++ compiler, MPI (mpicc, mpirun), cmake,
     Python 3.11 with venv and headers, pdftoppm/pdftotext (report tests). What is
     missing is named in one message with what provides it (the apt-get line to run
     as root, or a module, e.g. module load GCC OpenMPI CMake Python/3.11).
  2. .venv        workflow env: Snakemake 9, SLURM executor plugin, pandas, pandera,
                  matplotlib, h5py, reportlab, pytest (envs/workflow.lock.txt).
  3. .venv-train  train env, CPU variant: tensorflow-cpu 2.15.1, numpy 1.26.4, h5py, torch 2.13.0
                  (CPU) and Horovod 0.28.1 compiled with MPI and Gloo (envs/train.lock.txt).
                  GPU variant: tensorflow 2.15.1 with its CUDA 12 libraries, torch 2.13.0's
                  CUDA 13 build and Horovod 0.28.1 compiled with MPI, Gloo, NCCL, TensorFlow
                  and PyTorch (envs/train-gpu.lock.txt; about 9 GB). No GPU is needed to
                  build it: nvcc, the CUDA headers and NCCL come from the lock's nvidia
                  packages unless a CUDA 13 is on PATH (e.g. module load CUDA/13.0).

Options:
  --workflow-only   set up .venv only (enough for dry runs: snakemake -n; needs Python only)
  --check-only      check the system pieces, list them (or what is missing) and exit
  --help            show this help

Environment:
  PYTHON            interpreter for both envs (default: python3; must be 3.11)
  HVD_WHEEL_CACHE   where the built Horovod wheel is cached (default ~/.cache/hvdscale/wheels)
  HVD_SKIP_APT=1    as root on Debian, do not install Debian packages (only check the pieces)
  HVD_GPU           which train env: 1 = GPU variant (also: make setup-gpu), 0 = CPU variant,
                    auto (default) = GPU when a HOROVOD_GPU* variable asks for GPU
                    operations, else the variant the train env already has, else GPU when
                    nvidia-smi lists a GPU, else CPU. An nvcc on PATH alone does not switch
                    (CPU machines often have one).
  HVD_TRAIN_ENV     where the train env goes (default .venv-train in the checkout)
  HOROVOD_CUDA_HOME, HOROVOD_NCCL_HOME
                    GPU variant: the CUDA toolkit and NCCL to build Horovod with (default: a
                    CUDA 13 nvcc on PATH, else the nvidia packages in the train env)
EOF
}

WORKFLOW_ONLY=0
CHECK_ONLY=0
for arg in "$@"; do
    case "$arg" in
        --workflow-only) WORKFLOW_ONLY=1 ;;
        --check-only) CHECK_ONLY=1 ;;
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
TRAIN_ENV="${HVD_TRAIN_ENV:-$ROOT/.venv-train}"
[[ "$TRAIN_ENV" == /* ]] || TRAIN_ENV="$ROOT/$TRAIN_ENV"

# CPU or GPU train env. auto: GPU where the environment asks for GPU operations (a HOROVOD_GPU*
# variable, as Horovod's own build reads them), else the variant the train env already has,
# else GPU where a GPU is visible; an nvcc on PATH alone is no reason (CPU machines and login
# nodes often have a CUDA toolkit).
asks_for_gpu_ops() {
    local var
    for var in $(compgen -v HOROVOD_GPU || true); do [[ -n "${!var}" ]] && return 0; done
    return 1
}
gpu_visible() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; }
case "${HVD_GPU:-auto}" in
    1|yes|true) VARIANT=gpu; VARIANT_WHY="HVD_GPU=${HVD_GPU}" ;;
    0|no|false) VARIANT=cpu; VARIANT_WHY="HVD_GPU=${HVD_GPU}" ;;
    auto|"")
        KEPT="$(sed -n 's/^variant: //p' "$TRAIN_ENV/.hvdscale-stamp" 2>/dev/null || true)"
        if asks_for_gpu_ops; then VARIANT=gpu; VARIANT_WHY="a HOROVOD_GPU* variable asks for GPU operations"
        elif [[ "$KEPT" == gpu || "$KEPT" == cpu ]]; then
            # the variant the train env already has (make setup-gpu, then make run keeps it)
            VARIANT="$KEPT"; VARIANT_WHY="the variant $TRAIN_ENV has; HVD_GPU=0/1 switches"
        elif gpu_visible; then VARIANT=gpu; VARIANT_WHY="nvidia-smi lists a GPU"
        else VARIANT=cpu; VARIANT_WHY="no GPU asked for or visible; HVD_GPU=1 (make setup-gpu) builds the GPU variant"
        fi ;;
    *) echo "setup: HVD_GPU='$HVD_GPU': use 1 (GPU train env), 0 (CPU train env) or auto" >&2; exit 2 ;;
esac
if [[ "$VARIANT" == gpu ]]; then TRAIN_LOCK=envs/train-gpu.lock.txt; else TRAIN_LOCK=envs/train.lock.txt; fi

# --------------------------------------------------------------------------- 1. system pieces
# As root on Debian (unless HVD_SKIP_APT=1) the Debian packages are installed as before.
# Everyone else needs only the pieces themselves on PATH, from the OS or from modules;
# slurm-wlm and munge are for the SLURM tests only, not for setup, and so is lmod (the
# non-root module user of tests/test_lmod_user.py).
APT_PACKAGES=(build-essential cmake git openmpi-bin libopenmpi-dev slurm-wlm munge
              poppler-utils iproute2 procps python3-venv python3-dev lmod)
HAS_DPKG=0; command -v dpkg-query >/dev/null 2>&1 && HAS_DPKG=1
python_is_system() { [[ "$("$PYTHON" -c 'import sys; print(sys.prefix)' 2>/dev/null)" == /usr ]]; }
missing_packages() {
    local missing=()
    for pkg in "${APT_PACKAGES[@]}"; do
        # python3-venv/-dev are only needed when PYTHON is Debian's own python3
        if [[ "$pkg" == python3-* ]] && ! python_is_system; then
            continue
        fi
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
    done
    echo "${missing[@]:-}"
}

if [[ "$CHECK_ONLY" == 0 && "${HVD_SKIP_APT:-0}" != 1 && "$(id -u)" == 0 && "$HAS_DPKG" == 1 ]]; then
    MISSING="$(missing_packages)"
    if [[ -n "$MISSING" ]]; then
        log "installing Debian packages: $MISSING"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        # shellcheck disable=SC2086
        apt-get install -y -q --no-install-recommends $MISSING
    else
        log "Debian packages: all present"
    fi
fi

# first line of a command's output (stdout and stderr), empty when it fails to run
first_line() { local out; out="$("$@" 2>&1)" || true; printf '%s\n' "${out%%$'\n'*}"; }

# check_pieces: what setup needs, found on PATH. Fills MISSING_DESC (one line per missing
# piece), MISSING_APT (the Debian packages that provide them) and FOUND_DESC.
MISSING_DESC=(); MISSING_APT=(); FOUND_DESC=()
need() {  # need "description" "apt packages" "module" cmd-alternatives... (one of them suffices)
    local desc="$1" apt="$2" module="$3" cmd
    shift 3
    for cmd in "$@"; do
        if command -v "$cmd" >/dev/null 2>&1; then
            FOUND_DESC+=("$desc: $(command -v "$cmd")")
            return 0
        fi
    done
    if [[ "$HAS_DPKG" == 1 ]]; then
        MISSING_DESC+=("$desc [$*]: as root: apt-get install -y $apt; or load a module, e.g. module load $module")
    else
        MISSING_DESC+=("$desc [$*]: load a module, e.g. module load $module (Debian package: $apt)")
    fi
    MISSING_APT+=("$apt")
}
check_python() {
    local problem=""
    if ! command -v "$PYTHON" >/dev/null 2>&1; then
        problem="not found"
    else
        PYVER="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || echo "?")"
        if [[ "$PYVER" != 3.11 ]]; then
            problem="is Python $PYVER; TensorFlow 2.15 supports at most 3.11, Snakemake 9 at least 3.11: set PYTHON=/path/to/python3.11"
        elif ! "$PYTHON" -c 'import venv, ensurepip' >/dev/null 2>&1; then
            problem="has no venv/ensurepip module"
        elif [[ "$WORKFLOW_ONLY" == 0 ]] && ! "$PYTHON" -c \
                'import os, sysconfig, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' 2>/dev/null; then
            problem="has no C headers (Python.h; the Horovod build needs them)"
        fi
    fi
    if [[ -z "$problem" ]]; then
        FOUND_DESC+=("Python 3.11: $(command -v "$PYTHON")")
        return 0
    fi
    if [[ "$HAS_DPKG" == 1 ]] && { python_is_system || [[ "$PYTHON" == python3 ]]; }; then
        MISSING_DESC+=("Python 3.11 ($PYTHON $problem): as root: apt-get install -y python3 python3-venv python3-dev; or load a module, e.g. module load Python/3.11")
        MISSING_APT+=("python3 python3-venv python3-dev")
    else
        MISSING_DESC+=("Python 3.11 ($PYTHON $problem): load a module, e.g. module load Python/3.11, or set PYTHON to a Python 3.11 with venv and headers")
    fi
}
check_pieces() {
    check_python
    [[ "$WORKFLOW_ONLY" == 1 ]] && return 0
    need "C compiler" build-essential GCC cc gcc
    need "C++ compiler" build-essential GCC c++ g++
    need "MPI compiler wrapper" libopenmpi-dev OpenMPI mpicc
    need "MPI launcher" openmpi-bin OpenMPI mpirun
    need "cmake (Horovod build)" cmake CMake cmake
    if [[ "$VARIANT" == gpu ]]; then need "patch (GPU Horovod build)" patch patch patch; fi
    need "pdftoppm (report tests)" poppler-utils poppler pdftoppm
    need "pdftotext (report tests)" poppler-utils poppler pdftotext
}

# The MPI and CUDA the Horovod build uses (the user's PATH): they key the wheel cache.
sanitize() { tr '[:upper:]' '[:lower:]' | sed -E 's/[^a-z0-9.+]+/-/g; s/^-+//; s/-+$//'; }
mpi_line() {
    local line
    line="$(first_line mpicc -showme:version)"
    [[ "$line" == *"Open MPI"* ]] || line="$(first_line mpirun --version)"
    printf '%s\n' "$line"
}
mpi_key() {
    local line all
    line="$(mpi_line)"
    all="$(mpirun --version 2>&1 || true)"
    if [[ "$line" =~ Open\ MPI\)?\ ([0-9][^ ]*) ]]; then
        echo "openmpi-${BASH_REMATCH[1]}" | sanitize
    elif [[ "$all" =~ Intel\(R\)\ MPI\ Library.*Version\ ([0-9][^ ,]*) ]]; then
        echo "intelmpi-${BASH_REMATCH[1]}" | sanitize
    elif [[ "$all" == *HYDRA* || "$all" == *MPICH* ]] && [[ "$all" =~ Version:[[:space:]]*([0-9][^[:space:]]*) ]]; then
        echo "mpich-${BASH_REMATCH[1]}" | sanitize
    else
        printf '%s\n' "${line:-unknown}" | sanitize | cut -c1-40
    fi
}
nvcc_release() {  # nvcc_release [nvcc]: the release an nvcc reports (e.g. 13.0), empty without one
    "${1:-nvcc}" --version 2>/dev/null | sed -n 's/.*release \([0-9][0-9.]*\).*/\1/p' | head -n1 || true
}
path_nvcc() {  # the nvcc on PATH and its release, or none
    if command -v nvcc >/dev/null 2>&1; then echo "$(command -v nvcc) (release $(nvcc_release))"; else echo none; fi
}
# The GPU variant's CUDA: torch 2.13.0's CUDA build is CUDA 13 (envs/train-gpu.lock.txt), so
# Horovod's torch and NCCL ops are compiled with a CUDA 13 toolkit: HOROVOD_CUDA_HOME, else
# a CUDA 13 nvcc on PATH (a module), else the nvcc, headers and runtime of the lock's nvidia
# packages (site-packages/nvidia/cu13). Sets CUDA_SOURCE, CUDA_RELEASE and CUDA_ROOT (empty
# for the packages until the train env exists).
TORCH_CUDA_MAJOR=13
HVD_PATCH="$ROOT/envs/horovod-$HOROVOD_VERSION-torch-cxx17.patch"
lock_version() { sed -n "s/^$1==\([^ ;]*\).*/\1/p" "$2" | head -n1; }
plan_gpu_cuda() {
    local rel nvcc_dir
    if [[ -n "${HOROVOD_CUDA_HOME:-}" ]]; then
        CUDA_ROOT="$HOROVOD_CUDA_HOME"; CUDA_SOURCE="HOROVOD_CUDA_HOME"
        CUDA_RELEASE="$(nvcc_release "$CUDA_ROOT/bin/nvcc")"
        return 0
    fi
    rel="$(nvcc_release)"
    if [[ "${rel%%.*}" == "$TORCH_CUDA_MAJOR" ]]; then
        # the toolkit of the nvcc on PATH (a wrapper script or symlink: ask nvcc itself)
        nvcc_dir="$(nvcc -dryrun -E -x cu /dev/null 2>&1 | sed -n 's/^#\$ TOP=\(.*\)$/\1/p' | head -n1)"
        [[ -n "$nvcc_dir" ]] || nvcc_dir="$(dirname "$(readlink -f "$(command -v nvcc)")")/.."
        nvcc_dir="$(cd "$nvcc_dir" && pwd)"
        CUDA_ROOT="$nvcc_dir"; CUDA_SOURCE="nvcc on PATH"; CUDA_RELEASE="$rel"
        return 0
    fi
    CUDA_ROOT=""; CUDA_SOURCE="the nvidia packages of $TRAIN_LOCK"
    [[ -n "$rel" ]] && CUDA_SOURCE="$CUDA_SOURCE (the nvcc on PATH is release $rel, not CUDA $TORCH_CUDA_MAJOR)"
    CUDA_RELEASE="$(lock_version nvidia-cuda-nvcc "$TRAIN_LOCK" | cut -d. -f1-2)"
}
# The CPU variant compiles no CUDA code (cuda-none); the GPU variant's key names the CUDA
# release and the torch it was built against (its PyTorch ops are torch-specific).
cuda_key() {
    if [[ "$VARIANT" == gpu ]]; then
        plan_gpu_cuda
        echo "$(echo "cuda-${CUDA_RELEASE:-unknown}" | sanitize)_$(echo "torch-$(lock_version torch "$TRAIN_LOCK")" | sanitize)"
    else
        echo "cuda-none"
    fi
}
build_info() {  # what the Horovod build on this PATH uses
    local nvcc="none" cc cxx
    cc="$(command -v cc || command -v gcc)"; cxx="$(command -v c++ || command -v g++)"
    command -v nvcc >/dev/null 2>&1 && nvcc="$(command -v nvcc), release $(nvcc_release)"
    echo "horovod: $HOROVOD_VERSION"
    echo "tensorflow: $TF_VERSION"
    echo "cache key: $CACHE_KEY"
    echo "mpicc: $(command -v mpicc) ($(mpi_line))"
    echo "mpirun: $(command -v mpirun) ($(first_line mpirun --version))"
    echo "cc: $cc ($(first_line "$cc" --version))"
    echo "c++: $cxx ($(first_line "$cxx" --version))"
    echo "cmake: $HVD_CMAKE ($(first_line "$HVD_CMAKE" --version))"
    echo "cuda: $(cuda_key) (nvcc on PATH: $nvcc)"
    echo "train env variant: $VARIANT ($VARIANT_WHY)"
    if [[ "$VARIANT" == gpu ]]; then
        echo "torch: $TORCH_VERSION (CUDA $TORCH_CUDA)"
        echo "CUDA toolkit: $HOROVOD_CUDA_HOME_USED (from $CUDA_SOURCE; nvcc release $(nvcc_release "$HOROVOD_CUDA_HOME_USED/bin/nvcc"))"
        echo "NCCL: include $NCCL_INCLUDE_USED, lib $NCCL_LIB_USED (NCCL $NCCL_VERSION_USED)"
        echo "flags: HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_WITH_PYTORCH=1 HOROVOD_BUILD_CUDA_CC_LIST=$CC_LIST_USED"
        echo "patch: $HVD_PATCH (sha256 $(sha256sum < "$HVD_PATCH" | cut -c1-16)): PyTorch ops as C++17 with the C++17 Gloo"
    fi
    echo "PATH: $BUILD_PATH"
}
HVD_CMAKE="$(command -v cmake || true)"  # the user's cmake, not a pip cmake 4 in the venv (breaks gloo)
BUILD_PATH="$TRAIN_ENV/bin:$PATH"

check_pieces
if [[ ${#MISSING_DESC[@]} -gt 0 ]]; then
    {
        echo "setup: missing what hvdscale needs (looked on PATH=$PATH):"
        printf '  - %s\n' "${MISSING_DESC[@]}"
        if [[ ${#MISSING_APT[@]} -gt 0 && "$HAS_DPKG" == 1 ]]; then
            # shellcheck disable=SC2046
            echo "Install them as root with: apt-get install -y --no-install-recommends" \
                $(printf '%s\n' "${MISSING_APT[@]}" | tr ' ' '\n' | sort -u)
        fi
        [[ "$HAS_DPKG" == 1 ]] && printf 'or load' || printf 'Load'
        echo " modules that provide them, e.g. module load GCC OpenMPI CMake Python/3.11; then run scripts/setup.sh again."
    } >&2
    exit 1
fi
# stamp-based idempotence: reinstall an env only when its lock file changed; the train env's
# stamp also names the variant and the MPI and CUDA on PATH: a change of any of them (another
# module, HVD_GPU) reinstalls it and rebuilds or picks the matching Horovod wheel.
stamp_ok() { [[ -f "$1/.hvdscale-stamp" ]] && [[ "$(cat "$1/.hvdscale-stamp")" == "$2" ]]; }
lock_hash() { cat "$@" pyproject.toml | sha256sum | cut -c1-16; }
train_stamp() {
    local files=("$TRAIN_LOCK")
    [[ "$VARIANT" == gpu ]] && files+=("$HVD_PATCH")
    printf '%s\n' "lock: $TRAIN_LOCK $(lock_hash "${files[@]}")" "variant: $VARIANT" \
        "mpi: $(mpi_key) ($(command -v mpicc))" "nvcc on PATH: $(path_nvcc)" \
        "HOROVOD_CUDA_HOME: ${HOROVOD_CUDA_HOME:-}" "HOROVOD_NCCL_HOME: ${HOROVOD_NCCL_HOME:-}"
}

if [[ "$CHECK_ONLY" == 1 ]]; then
    log "all pieces present:"
    printf '  %s\n' "${FOUND_DESC[@]}"
    if [[ "$WORKFLOW_ONLY" == 0 ]]; then
        log "train env: $VARIANT variant ($VARIANT_WHY), $TRAIN_LOCK"
        if [[ "$VARIANT" == gpu ]]; then plan_gpu_cuda; log "CUDA for the Horovod build: ${CUDA_ROOT:-site-packages/nvidia/cu13} (from $CUDA_SOURCE)"; fi
        log "Horovod wheel cache key: tf-<TensorFlow>_$(mpi_key)_$(cuda_key)"
        log "train env stamp: $(train_stamp | paste -sd';' - | sed 's/;/; /g')"
    fi
    exit 0
fi

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
TRAIN_STAMP="$(train_stamp)"
TRAIN_NAME="${TRAIN_ENV#"$ROOT"/}"
PIP=("$TRAIN_ENV/bin/python" -m pip)
site_packages() { "$TRAIN_ENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
if stamp_ok "$TRAIN_ENV" "$TRAIN_STAMP"; then
    log "$TRAIN_NAME: up to date ($VARIANT variant)"
else
    OLD_VARIANT="$(sed -n 's/^variant: //p' "$TRAIN_ENV/.hvdscale-stamp" 2>/dev/null || true)"
    [[ -f "$TRAIN_ENV/.hvdscale-stamp" && -z "$OLD_VARIANT" ]] && OLD_VARIANT=cpu  # a stamp from before variants
    if [[ -n "$OLD_VARIANT" && "$OLD_VARIANT" != "$VARIANT" && -f "$TRAIN_ENV/pyvenv.cfg" ]]; then
        # tensorflow-cpu and tensorflow (and torch's CPU and CUDA builds) share their modules:
        # one over the other breaks both, so a change of variant starts from an empty env
        log "$TRAIN_NAME: $OLD_VARIANT -> $VARIANT variant ($VARIANT_WHY): recreating it"
        rm -rf "$TRAIN_ENV"
    fi
    make_venv "$TRAIN_ENV"
    log "$TRAIN_NAME: installing $TRAIN_LOCK ($VARIANT variant: $VARIANT_WHY)"
    "${PIP[@]}" install -q -r "$TRAIN_LOCK"
    if [[ "$VARIANT" == gpu ]]; then
        # nvidia-nccl-cu12 (TensorFlow's pin) and nvidia-cu13's NCCL (torch's) both own
        # nvidia/nccl/lib/libnccl.so.2; torch 2.13 needs NCCL >= 2.2x (ncclCommResume), so the
        # newer one goes last, whatever order pip chose. TensorFlow and Horovod load it too.
        NCCL_REQ="$(mktemp)"
        grep '^nvidia-nccl-cu13==' "$TRAIN_LOCK" > "$NCCL_REQ"
        "${PIP[@]}" install -q --no-deps --force-reinstall -r "$NCCL_REQ"
        rm -f "$NCCL_REQ"
    fi
    "${PIP[@]}" install -q wheel==0.48.0 setuptools==84.2.1
    "${PIP[@]}" install -q --no-deps -e .

    # Horovod: build once against this exact TensorFlow and the MPI/CUDA on PATH, cache the wheel.
    TF_VERSION="$("$TRAIN_ENV/bin/python" -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null)"
    MPI_KEY="$(mpi_key)"
    CUDA_KEY="$(cuda_key)"
    CACHE_KEY="$(echo "tf-$TF_VERSION" | sanitize)_${MPI_KEY}_${CUDA_KEY}"
    CACHE_DIR="$WHEEL_CACHE/$CACHE_KEY"
    find_wheel() { ls "$1"/horovod-"$HOROVOD_VERSION"-*.whl 2>/dev/null | head -n1 || true; }
    WHEEL="$(find_wheel "$CACHE_DIR")"
    OLD_WHEEL="$(find_wheel "$WHEEL_CACHE/tf-$TF_VERSION")"
    if [[ -z "$WHEEL" && -n "$OLD_WHEEL" && "$MPI_KEY" == openmpi-4.1.4 && "$CUDA_KEY" == cuda-none ]]; then
        # a cache from before the key named MPI and CUDA: those wheels were built with the
        # Debian 12 OpenMPI 4.1.4 and no GPU operations, which is what this build would use
        log "adopting the cached wheel $OLD_WHEEL as $CACHE_KEY (built with OpenMPI 4.1.4, no CUDA)"
        if ! { mkdir -p "$CACHE_DIR" && cp -p "$OLD_WHEEL" "$CACHE_DIR/"; }; then
            log "cannot write $CACHE_DIR: using $OLD_WHEEL where it is"
            CACHE_DIR="$WHEEL_CACHE/tf-$TF_VERSION"
        elif [[ ! -f "$CACHE_DIR/build-info.txt" ]]; then
            { echo "adopted from $WHEEL_CACHE/tf-$TF_VERSION (a cache from before build info was recorded;"
              echo "  built by setup.sh with PATH=/usr/local/bin:/usr/bin:/bin: Debian's OpenMPI 4.1.4, no CUDA)"
              echo "this setup's tools:"
              build_info; } > "$CACHE_DIR/build-info.txt"
        fi
        WHEEL="$(find_wheel "$CACHE_DIR")"
    fi
    if [[ -z "$WHEEL" ]]; then
        # Pitfalls (see DEVELOPERS.md): no build isolation (it must see this TF); the
        # user's cmake (Debian's 3.25), not pip's cmake 4 (breaks Horovod's vendored gloo);
        # the user's PATH (module MPI, compilers, CUDA), the venv's bin first.
        HVD_ENV=(PATH="$BUILD_PATH" HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1
                 HOROVOD_WITHOUT_MXNET=1 HOROVOD_CMAKE="$HVD_CMAKE" MAKEFLAGS="-j$(nproc)")
        HVD_SRC="horovod==$HOROVOD_VERSION"
        if [[ "$VARIANT" == gpu ]]; then
            SITE="$(site_packages)"
            plan_gpu_cuda
            if [[ -z "$CUDA_ROOT" ]]; then
                # nvidia/cu13 of the lock's packages is a toolkit root but for the names a
                # build looks for: lib64 (nvcc.profile) and an unversioned libcudart.so
                CUDA_ROOT="$SITE/nvidia/cu13"
                ln -sfn lib "$CUDA_ROOT/lib64"
                ln -sf libcudart.so.$TORCH_CUDA_MAJOR "$CUDA_ROOT/lib/libcudart.so"
            fi
            if [[ -n "${HOROVOD_NCCL_HOME:-}" ]]; then
                NCCL_INCLUDE_USED="${HOROVOD_NCCL_INCLUDE:-$HOROVOD_NCCL_HOME/include}"
                NCCL_LIB_USED="${HOROVOD_NCCL_LIB:-$HOROVOD_NCCL_HOME/lib}"
            else
                NCCL_INCLUDE_USED="$SITE/nvidia/nccl/include"; NCCL_LIB_USED="$SITE/nvidia/nccl/lib"
                ln -sf libnccl.so.2 "$NCCL_LIB_USED/libnccl.so"
            fi
            NCCL_VERSION_USED="$(sed -n 's/^#define NCCL_\(MAJOR\|MINOR\|PATCH\) *\([0-9]*\).*/\2/p' \
                "$NCCL_INCLUDE_USED/nccl.h" 2>/dev/null | paste -sd. -)"
            HOROVOD_CUDA_HOME_USED="$CUDA_ROOT"
            CC_LIST_USED="${HOROVOD_BUILD_CUDA_CC_LIST:-75,80,86,89,90}"
            TORCH_VERSION="$("$TRAIN_ENV/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null)"
            TORCH_CUDA="$("$TRAIN_ENV/bin/python" -c 'import torch; print(torch.version.cuda)' 2>/dev/null)"
            # $ORIGIN: the wheel's libraries (horovod/<framework>/*.so) find the env's NCCL and
            # CUDA 13 runtime wherever the env lives; a module's CUDA comes from LD_LIBRARY_PATH.
            HVD_ENV+=(HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_WITH_PYTORCH=1 HOROVOD_NCCL_LINK=SHARED
                      HOROVOD_CUDA_HOME="$CUDA_ROOT" CUDA_HOME="$CUDA_ROOT"
                      HOROVOD_NCCL_INCLUDE="$NCCL_INCLUDE_USED" HOROVOD_NCCL_LIB="$NCCL_LIB_USED"
                      HOROVOD_BUILD_CUDA_CC_LIST="$CC_LIST_USED"
                      LDFLAGS="${LDFLAGS:-} -Wl,-rpath,\\\$ORIGIN/../../nvidia/nccl/lib:\\\$ORIGIN/../../nvidia/cu13/lib")
            # Horovod 0.28.1 compiles its PyTorch ops as C++14, torch >= 2.1 needs C++17:
            # build from the sdist with envs/horovod-0.28.1-torch-cxx17.patch applied.
            HVD_TMP="$(mktemp -d)"
            "${PIP[@]}" download -q --no-deps --no-binary :all: -d "$HVD_TMP" "horovod==$HOROVOD_VERSION"
            tar xzf "$HVD_TMP"/horovod-"$HOROVOD_VERSION".tar.gz -C "$HVD_TMP"
            HVD_SRC="$HVD_TMP/horovod-$HOROVOD_VERSION"
            patch -s -p1 -d "$HVD_SRC" < "$HVD_PATCH"
        else
            HVD_ENV+=(HOROVOD_WITHOUT_PYTORCH=1)
        fi
        log "building Horovod $HOROVOD_VERSION against TensorFlow $TF_VERSION (cached in $CACHE_DIR;" \
            "CPU: a few minutes; GPU: see envs/README.md)"
        mkdir -p "$CACHE_DIR"
        build_info > "$CACHE_DIR/build-info.txt.partial"
        sed 's/^/[setup]   /' "$CACHE_DIR/build-info.txt.partial"
        env "${HVD_ENV[@]}" "$TRAIN_ENV/bin/python" -m pip wheel --no-build-isolation --no-deps \
            -w "$CACHE_DIR" "$HVD_SRC"
        [[ -n "${HVD_TMP:-}" ]] && rm -rf "$HVD_TMP"
        mv "$CACHE_DIR/build-info.txt.partial" "$CACHE_DIR/build-info.txt"
        WHEEL="$(find_wheel "$CACHE_DIR")"
    else
        log "using cached Horovod wheel $WHEEL"
        if [[ -f "$CACHE_DIR/build-info.txt" ]]; then sed 's/^/[setup]   /' "$CACHE_DIR/build-info.txt"; fi
    fi
    "${PIP[@]}" install -q --no-deps --force-reinstall "$WHEEL"
    echo "$TRAIN_STAMP" > "$TRAIN_ENV/.hvdscale-stamp"
fi

# --------------------------------------------------------------------------- native libraries
# Gloo ranks (Horovod's and torch-ddp's) preload epoll_yield.so (training.gloo_yield_when_spinning,
# src/hvdscale/native/epoll_yield.c): Gloo's loop thread yields instead of spinning.
# torch-ddp ranks preload mkl_intel_path.so when training.mkl_code_path is intel
# (src/hvdscale/native/mkl_intel_path.c): MKL takes its Intel code path. One build makes both.
NATIVE=src/hvdscale/native
if [[ ! -f "$NATIVE/epoll_yield.so" || "$NATIVE/epoll_yield.c" -nt "$NATIVE/epoll_yield.so" \
      || ! -f "$NATIVE/mkl_intel_path.so" || "$NATIVE/mkl_intel_path.c" -nt "$NATIVE/mkl_intel_path.so" ]]; then
    log "building $NATIVE/epoll_yield.so and $NATIVE/mkl_intel_path.so"
    "$TRAIN_ENV/bin/python" -m hvdscale.native build >/dev/null
fi

# --------------------------------------------------------------------------- check
WANT=(TensorFlow MPI Gloo)
[[ "$VARIANT" == gpu ]] && WANT+=(PyTorch NCCL)
CHECK="$(PATH="$TRAIN_ENV/bin:$PATH" "$TRAIN_ENV/bin/horovodrun" --check-build 2>/dev/null)"
for want in "${WANT[@]}"; do
    if ! grep -q "\[X\] $want" <<<"$CHECK"; then
        echo "setup: horovodrun --check-build does not list $want:" >&2
        echo "$CHECK" >&2
        echo "remove $TRAIN_NAME and the cached wheel ($WHEEL_CACHE) and run setup again" >&2
        exit 1
    fi
done
log "horovodrun --check-build: $(IFS=,; echo "${WANT[*]}" | sed 's/,/, /g') available"
log "done: workflow env .venv, train env $TRAIN_NAME ($VARIANT variant)"
