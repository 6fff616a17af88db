#!/usr/bin/env bash
# Post-deploy script of envs/train.conda.yaml: Snakemake (--sdm conda) runs it with the
# new env activated, after conda and pip installed everything the yaml lists, so
# TensorFlow is there when Horovod is compiled against it. Its content is part of the
# env's hash: editing it makes Snakemake build a new env. Same build as scripts/setup.sh.
# Any failure stops here, and Snakemake removes the half-made env and reports it.
set -euo pipefail

HOROVOD_VERSION=0.28.1

if [[ -z "${CONDA_PREFIX:-}" ]]; then
    echo "train.conda.post-deploy.sh: no conda env active (CONDA_PREFIX unset); Snakemake" >&2
    echo "  runs this script with the env of envs/train.conda.yaml activated" >&2
    exit 1
fi
python -c 'import tensorflow' || {
    echo "train.conda.post-deploy.sh: TensorFlow is missing from $CONDA_PREFIX" >&2
    exit 1
}

# The env's cmake 3.25 (not pip's cmake 4) and its OpenMPI compilers. GPU nodes:
# export HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_HOME=... before snakemake (envs/README.md).
export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1
export HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1
HOROVOD_CMAKE="$(command -v cmake)"
export HOROVOD_CMAKE
MAKEFLAGS="-j$(nproc)"
export MAKEFLAGS
python -m pip install --no-build-isolation --no-cache-dir --no-deps "horovod==$HOROVOD_VERSION"

CHECK="$(horovodrun --check-build)"
for want in TensorFlow MPI Gloo; do
    if ! grep -q "\[X\] $want" <<<"$CHECK"; then
        echo "train.conda.post-deploy.sh: horovodrun --check-build does not list $want:" >&2
        echo "$CHECK" >&2
        exit 1
    fi
done
echo "train.conda.post-deploy.sh: Horovod $HOROVOD_VERSION built with TensorFlow, MPI and Gloo"
