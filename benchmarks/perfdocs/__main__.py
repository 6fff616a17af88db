"""``python -m perfdocs`` (from benchmarks/): regenerate or ``--check`` docs/performance.md."""

import sys

from perfdocs.generate import main

sys.exit(main())
