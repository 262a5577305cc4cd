import sys

from fastpipe.bench.cli import main

sys.exit(main(prog="python -m fastpipe.bench"))
