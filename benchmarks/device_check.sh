#!/usr/bin/env bash
# GPU check of fastpipe, one command: build the extension in place, run the GPU tests, run the GPU
# conv benchmark, print a short table. Made for a GPU machine without internet access whose python3
# has torch, pytest, setuptools, ninja and pybind11, with nvcc on PATH. Each stage has a time limit, so
# the whole check ends within 10 minutes (about 6 expected on an H200).
#
#   benchmarks/device_check.sh [RESULTS_DIR]
#
# RESULTS_DIR (default: $OUT when set, else benchmarks/results/gpu) receives 8 files: summary.txt,
# build.log, gpu_tests.log, bench_progress.log, conv_gpu.json/.txt, conv_gpu_compile.json/.txt (a
# benchmark cut short by its limit leaves the rows it measured). Exit status: non-zero when the build or
# a test failed (the benchmark still runs after failed tests). Later GPU work adds its stages here.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
RESULTS=${1:-${OUT:-benchmarks/results/gpu}}
mkdir -p "$RESULTS"
export PYTHONUNBUFFERED=1
T0=$(date +%s)
say() { echo "[device_check +$(($(date +%s) - T0))s] $*"; }

# The toolkit: CUDA_HOME from nvcc's real location when unset (nvcc may be a link or a wrapper).
if [ -z "${CUDA_HOME:-}" ]; then
  NVCC=$(command -v nvcc) || { echo "device_check: no nvcc on PATH and CUDA_HOME unset" >&2; exit 1; }
  NVCC=$(readlink -f "$NVCC")
  if [ ! -f "$(dirname "$NVCC")/../include/cuda_runtime.h" ]; then  # a wrapper script: find the real one
    NVCC=$(grep -o '/[^ "]*/bin/nvcc' "$NVCC" | head -1)
  fi
  export CUDA_HOME=$(cd "$(dirname "$NVCC")/.." && pwd)
fi
export PATH="$CUDA_HOME/bin:$PATH"
# Compile for this GPU only (fewer passes than the default list), and fail rather than build CPU-only.
CAP=$($PY -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability())' 2>/dev/null || echo 9.0)
export FASTPIPE_CUDA=1 FASTPIPE_CUDA_ARCHS=${FASTPIPE_CUDA_ARCHS:-$CAP}
export TORCH_CUDA_ARCH_LIST=$FASTPIPE_CUDA_ARCHS

{
  echo "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null)"
  echo "torch: $($PY -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())')"
  echo "nvcc: $("$CUDA_HOME/bin/nvcc" --version | tail -1); CUDA_HOME=$CUDA_HOME; archs $FASTPIPE_CUDA_ARCHS"
  echo "python: $($PY --version 2>&1); host: $(nproc) cores"
} | tee "$RESULTS/summary.txt"

say "building in place (log: $RESULTS/build.log)"
if ! timeout 180 $PY setup.py build_ext --inplace >"$RESULTS/build.log" 2>&1; then
  tail -40 "$RESULTS/build.log"
  say "BUILD FAILED"
  exit 1
fi
$PY -c 'import fastpipe, json; print("build_info:", json.dumps(fastpipe.build_info()))' | tee -a "$RESULTS/summary.txt"

say "GPU tests (log: $RESULTS/gpu_tests.log)"
timeout 130 $PY -m pytest tests -m gpu -q -p no:cacheprovider -o addopts="" >"$RESULTS/gpu_tests.log" 2>&1
TESTS_RC=$?
tail -5 "$RESULTS/gpu_tests.log"
grep -E "^(FAILED|ERROR)" "$RESULTS/gpu_tests.log" | head -20
echo "gpu tests: $(tail -1 "$RESULTS/gpu_tests.log")" >>"$RESULTS/summary.txt"

# Every row against eager: both batch sizes, dtypes, layouts, forward and forward+backward.
say "benchmark: fused vs eager, batch 32 128, bf16 fp16 fp32, nchw channels_last, fwd fwdbwd"
timeout 160 $PY benchmarks/conv_bench.py --device cuda --batch 32 128 --dtype bf16 fp16 fp32 --reps 5 --no-compile \
  --out "$RESULTS/conv_gpu.json" >"$RESULTS/conv_gpu.txt" 2>>"$RESULTS/bench_progress.log" || {
  tail -5 "$RESULTS/bench_progress.log"; say "benchmark failed or stopped at its time limit"; }

# torch.compile compiles every row (seconds each): one configuration, forward.
say "benchmark: fused vs eager vs torch.compile, batch 32 bf16 channels_last, fwd"
timeout 100 $PY benchmarks/conv_bench.py --device cuda --batch 32 --dtype bf16 --layout channels_last --mode fwd \
  --reps 5 --out "$RESULTS/conv_gpu_compile.json" >"$RESULTS/conv_gpu_compile.txt" 2>>"$RESULTS/bench_progress.log" || {
  tail -5 "$RESULTS/bench_progress.log"; say "compile benchmark failed or stopped at its time limit"; }

say "summary"
$PY - "$RESULTS" <<'EOF' | tee -a "$RESULTS/summary.txt"
import json, pathlib, sys
results = pathlib.Path(sys.argv[1])
for name in ("conv_gpu.json", "conv_gpu_compile.json"):
    path = results / name
    if not path.exists():
        print(f"{name}: missing")
        continue
    doc = json.loads(path.read_text())
    worst = min(doc["rows"], key=lambda r: r["speedup"])
    done = "" if doc["complete"] else " (cut short)"
    print(f"\n{name}: {len(doc['rows'])} rows in {doc['seconds']} s{done}; slowest row vs eager: {worst['speedup']:.2f}x "
          f"({worst['row']}, {worst['dtype']} b{worst['batch']} {worst['layout']} {worst['mode']})")
    print(f"{'config':36s} {'family':13s} {'fused/eager':>11s} {'fused/compile':>13s}")
    for s in doc["summary"]:
        vs = f"{s['speedup_vs_compile']:12.2f}x" if "speedup_vs_compile" in s else f"{'':13s}"
        print(f"{s['config']:36s} {s['family']:13s} {s['speedup']:10.2f}x {vs}")
EOF
say "done; tests exit status $TESTS_RC"
exit $TESTS_RC
