# hvdscale: the two commands for a fresh machine are `make run` and `make test`.
SHELL := /bin/bash
VENV := .venv
SNAKEMAKE := $(VENV)/bin/snakemake
PYTEST := $(VENV)/bin/python -m pytest
# linters (pinned in envs/workflow.lock.txt); override e.g. `make lint RUFF=ruff`
RUFF ?= $(VENV)/bin/ruff
SNAKEFMT ?= $(VENV)/bin/snakefmt
CONFIG ?= config/config.yaml
# the Snakemake profile of run, report-partial and export: profiles/local, or profiles/slurm on a cluster
PROFILE ?= profiles/local
# the results directory of $(CONFIG) (its results_dir)
RESULTS_DIR = $$($(VENV)/bin/python -c 'import sys; from hvdscale.study.plan import merged_config; print(merged_config(sys.argv[1:])["results_dir"])' $(CONFIG))

.PHONY: help setup setup-gpu run smoke report-partial plan status export report compare test test-quick test-slurm test-multinode \
        lint dry-run dry-run-thesis \
        bench bench-scaling bench-frameworks bench-train bench-data bench-costmodel perf-docs clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-16s %s\n", $$1, $$2}'

setup:  ## install Debian packages (as root), .venv and .venv-train (Horovod wheel cached; keeps the train env's CPU or GPU variant)
	bash scripts/setup.sh

setup-gpu:  ## setup with the GPU train env: TF 2.15.1 + CUDA, torch's CUDA build, Horovod with NCCL (no GPU needed to build; envs/README.md)
	HVD_GPU=1 bash scripts/setup.sh

run: setup  ## the main job: whole pipeline on $(CONFIG) with $(PROFILE) -> results/report.pdf
	$(SNAKEMAKE) --profile $(PROFILE) --configfile $(CONFIG) \
	  || { echo "make run: some jobs failed; completed runs are kept. Building the report from what exists:"; \
	       $(MAKE) --no-print-directory report-partial; exit 1; }
	@echo "make run: done -> $(RESULTS_DIR)/report.pdf"

smoke:  ## the smoke study of $(CONFIG) with $(PROFILE) (config/smoke.yaml): every partition, 1 and 2 workers, each backend, 3 epochs -> <results_dir>/smoke/report.pdf
	$(MAKE) --no-print-directory run CONFIG="$(CONFIG) config/smoke.yaml"

report-partial:  ## build the report of $(CONFIG) from the runs that exist, with $(PROFILE) (missing/failed runs are listed)
	$(SNAKEMAKE) --profile $(PROFILE) --configfile $(CONFIG) config/partial.yaml -- "$(RESULTS_DIR)/report.pdf"

plan:  ## node-/GPU-hour budget of $(CONFIG) per partition (SELECT="partition=alpha workers=1-8")
	$(VENV)/bin/python -m hvdscale.cli plan $(CONFIG) $(if $(SELECT),--select "$(SELECT)")

status:  ## progress of the study on $(CONFIG), also while it runs: runs done/running/queued/failed per partition, node-hours, ETA
	$(VENV)/bin/python -m hvdscale.cli status $(CONFIG) $(if $(SELECT),--select "$(SELECT)")

export:  ## one archive of the finished study on $(CONFIG) -> results/study.tar.gz
	$(SNAKEMAKE) --profile $(PROFILE) --configfile $(CONFIG) -- "$(RESULTS_DIR)/study.tar.gz"

report:  ## rebuild the report from an archive: make report FROM=study.tar.gz [OUT=rebuilt]; several clusters' studies: FROM="a b" (merged)
	@test -n "$(FROM)" || { echo "make report: give the archive, e.g. make report FROM=results/study.tar.gz (several clusters' studies: FROM=\"a.tar.gz b.tar.gz\")"; exit 2; }
	$(if $(word 2,$(FROM)),$(VENV)/bin/python -m hvdscale.cli merge $(FROM) --out $(or $(OUT),merged),$(VENV)/bin/python -m hvdscale.cli rebuild $(FROM) --out $(or $(OUT),rebuilt))

compare:  ## compare two studies: make compare A=old.tar.gz B=results [OUT=comparison]
	$(VENV)/bin/python -m hvdscale.cli compare $(A) $(B) --out $(or $(OUT),comparison)

test: setup lint  ## the full test suite (CI): lint, unit, Horovod, integration, real-SLURM and two-node tests (four streams at once: tests/run.sh)
	PYTHON=$(VENV)/bin/python bash tests/run.sh tests

test-quick:  ## fast tests for iteration (no slow, no SLURM)
	$(PYTEST) -m "not slow and not slurm" -x -q tests

test-slurm: setup  ## only the tests on the local SLURM cluster (root), two-node ones included
	$(PYTEST) -m slurm --durations=0 tests

test-multinode: setup  ## only the two-node runs: thesis job shapes (1-16 ranks), time-limit retry, job arrays (also in make test)
	$(PYTEST) -m multinode --durations=0 tests

lint:  ## snakemake --lint, snakefmt --check, ruff check, ruff format --check
	$(SNAKEMAKE) --lint
	$(SNAKEFMT) --check Snakefile workflow
	$(RUFF) check .
	$(RUFF) format --check .

dry-run:  ## plan the default config without running anything
	$(SNAKEMAKE) -n --configfile $(CONFIG)

dry-run-thesis:  ## plan the reference study through the SLURM profile (works without SLURM)
	$(SNAKEMAKE) -n --profile profiles/slurm --configfile config/thesis.yaml

bench:  ## the kept benchmarks, alone on the machine (waits for a 1-minute load below 0.25 per core first) -> benchmarks/results/*.csv -> docs/performance.md (bench-costmodel apart: root)
	$(VENV)/bin/python benchmarks/_quiet.py
	$(MAKE) --no-print-directory bench-scaling bench-frameworks bench-train bench-data perf-docs

bench-scaling:  ## 1 vs 2 workers against the machine's ceiling, Keras model.fit and MWMS; the bare allreduce of the gradient (MPI, Gloo)
	$(VENV)/bin/python benchmarks/bench_scaling.py
	.venv-train/bin/python benchmarks/bench_allreduce_bare.py

bench-frameworks:  ## Horovod-TF vs torch DDP over Gloo, 1 and 2 workers, batch 75 and 1000: epoch time, efficiency vs ceiling, time to target (the off/fp32 setting; the other settings' rows are kept)
	$(VENV)/bin/python benchmarks/bench_frameworks.py --add

bench-train:  ## hvdscale's step vs Keras model.fit at its best settings, 1 rank; the instrumentation overhead
	.venv-train/bin/python benchmarks/bench_train_overhead.py

bench-data:  ## data stage at 1,000,000 curves vs dd
	$(VENV)/bin/python benchmarks/bench_data.py

bench-costmodel:  ## allreduce sweeps on the emulated two-node partition -> cost model fitted from <= 4 ranks, validated on 8 and 16 (root)
	$(VENV)/bin/python benchmarks/bench_costmodel.py

perf-docs:  ## regenerate the tables of docs/performance.md from benchmarks/results/*.csv
	cd benchmarks && $(abspath $(VENV))/bin/python -m perfdocs

clean:  ## remove results and Snakemake state (keeps the envs)
	rm -rf results .snakemake
