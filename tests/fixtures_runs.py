"""The synthetic run records and allreduce sweeps of the analysis/report tests live in
benchmarks/synthetic_runs.py, where benchmarks/bench_report.py makes its 1,000 records
with them (a benchmark imports nothing from tests/; tests may import from benchmarks/).
``import fixtures_runs`` is that module, under the name the tests use."""

import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1] / "benchmarks"))
import synthetic_runs  # noqa: E402

sys.modules[__name__] = synthetic_runs
