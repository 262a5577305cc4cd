#!/usr/bin/env python
"""The conv suite's overhead part (fastpipe/bench/conv.py): per-call cost of the fused convolution on
small calls; `python -m fastpipe.bench conv --part overhead --threads 2`, results in benchmarks/results/.

    python benchmarks/conv_overhead_bench.py [--calls 5000] [--rounds 7] [--threads 2]
"""

import pathlib
import sys

sys.path.insert(1, str(pathlib.Path(__file__).resolve().parents[1]))  # an in-place build works too

from fastpipe.bench.cli import script  # noqa: E402

sys.exit(script(__file__, "conv", part="overhead", threads=2))  # 2: the cores of the VM the figures came from
