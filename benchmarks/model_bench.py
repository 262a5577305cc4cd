#!/usr/bin/env python
"""The conv suite's models part (fastpipe/bench/conv.py): whole torchvision models, fuse() against eager
and fold-only; `python -m fastpipe.bench conv --part models`, results in benchmarks/results/.

    python benchmarks/model_bench.py [--models resnet18,mobilenet_v2] [--batch 1 8] [--reps 7]
"""

import pathlib
import sys

sys.path.insert(1, str(pathlib.Path(__file__).resolve().parents[1]))  # an in-place build works too

from fastpipe.bench.cli import script  # noqa: E402

sys.exit(script(__file__, "conv", part="models"))
