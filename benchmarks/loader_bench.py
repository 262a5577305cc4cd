#!/usr/bin/env python
"""The loader suite (fastpipe/bench/loader.py) with its data in benchmarks/data/ and results in
benchmarks/results/: `python -m fastpipe.bench loader` with those defaults. See benchmarks/README.md.

    python benchmarks/loader_bench.py [--quick] [--only cifar,direct] [--tag mybox] [--help]
"""

import pathlib
import sys

sys.path.insert(1, str(pathlib.Path(__file__).resolve().parents[1]))  # an in-place build works too

from fastpipe.bench.cli import script  # noqa: E402

sys.exit(script(__file__, "loader"))
