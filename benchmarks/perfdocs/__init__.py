"""The generator of docs/performance.md (the targets and the current figures) and
docs/performance-history.md (concluded investigations) from the benchmark results under
benchmarks/results/*.csv (``make perf-docs``; ``--check`` for tests/test_perf_docs.py).

Run from benchmarks/, beside the benchmarks whose results it reads and whose row validity
(``_quiet.row_validity``) it applies:

  cd benchmarks && ../.venv/bin/python -m perfdocs [--check] [--docs DIR] [--results DIR]

generate: the pages' blocks (``PAGES``: which block is on which page) and the command
line; common: reading the CSVs, formatting, provenance and validity cells; frameworks,
bound, sync, cluster: the blocks of bench_frameworks, the efficiency bound, the sync
breakdown and the SLURM benchmarks.
"""
