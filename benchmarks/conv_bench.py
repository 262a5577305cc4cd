#!/usr/bin/env python
"""The conv suite's layers part (fastpipe/bench/conv.py), results in benchmarks/results/:
`python -m fastpipe.bench conv --part layers` with that default. See benchmarks/README.md.

    python benchmarks/conv_bench.py                         # CPU: batch 8, fp32, NCHW + channels_last
    python benchmarks/conv_bench.py --quick                 # a short CPU run
    python benchmarks/conv_bench.py --device cuda --batch 32 128 --dtype bf16 fp16 fp32
"""

import pathlib
import sys

sys.path.insert(1, str(pathlib.Path(__file__).resolve().parents[1]))  # an in-place build works too

from fastpipe.bench.cli import script  # noqa: E402

sys.exit(script(__file__, "conv", part="layers"))
