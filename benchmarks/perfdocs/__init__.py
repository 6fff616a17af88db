"""The generator of docs/performance.md from the benchmark results under
benchmarks/results/*.csv (``make perf-docs``; ``--check`` for tests/test_perf_docs.py).

Run from benchmarks/, beside the benchmarks whose results it reads and whose row validity
(``_quiet.row_validity``) it applies:

  cd benchmarks && ../.venv/bin/python -m perfdocs [--check]

generate: the page's blocks and the command line; common: reading the CSVs, formatting,
provenance and validity cells; frameworks, bound, sync, cluster: the blocks of
bench_frameworks, the efficiency bound, the sync breakdown and the SLURM benchmarks.
"""
