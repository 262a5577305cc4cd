#!/usr/bin/env bash
# GPU check of fastpipe, in parts ordered by what they are worth when the lent time runs out: build (for
# this GPU's arch only), the loader's GPU tests, the conv engines' GPU tests and validation runs,
# compute-sanitizer, benchmarks. Each part has a time limit under 10 minutes, writes its logs as it goes
# (a part cut short loses nothing already written) and appends its line to summary.txt when it ends.
# Made for a GPU machine without internet access whose python3 has torch, pytest (pytest-xdist to run
# tests in parallel), setuptools, ninja and numpy, with nvcc on PATH.
#
#   benchmarks/device_check.sh [RESULTS_DIR] [PARTS]
#
# PARTS: a comma-separated list of build, loader, conv, sanitize, bench, where parts joined by '+' run at
# the same time (the machine has 16 cores and the tests leave the GPU mostly idle); or tests
# (build,loader+conv), rest (sanitize,bench; the build must be there), all (the default:
# build,loader+conv+sanitize,bench); or rehearse: on a machine WITHOUT a GPU, every step that needs none (a copy of the tree
# built with $PYTHON, e.g. torch 2.11.0+cu130 from `make rehearse-device`, for sm_90; GPU tests collected
# and skipped; sanitizer and benchmark entry points checked), each part timed.
# RESULTS_DIR (default: /tmp/fastpipe-device-check when $OUT is set, else benchmarks/results/gpu;
# /tmp/fastpipe-device-rehearsal for the rehearsal) receives summary.txt (machine facts,
# then one line per part: status and seconds), <part>.log, the tests' logs (with every failure's reason)
# and JUnit XML, each crashed test rerun alone with every thread's native stack, the sanitizers' logs
# with the reports that name fastpipe's code whole, and the benchmarks' .json/.txt/.md.
# PACK_DIR (default: $OUT when set): at the end, or when the build fails, everything is packed there into
# at most 8 files of 16 MiB (what a lease brings back): summary.txt and results.tgz.N (a tar split in
# parts; a log too large for them keeps its first and last MiBs, the reports naming fastpipe stay whole). Exit status: non-zero when a prerequisite is missing, the build fails, a
# test fails, or a sanitizer reports errors or runs out of time.
# DEADLINE_S (seconds from the start; default none) fits the whole check into a lease: every part's and
# benchmark's limit is cut to the time left before it, and a part with under 20 s left is skipped.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
PARTS=${2:-all}
DEFAULT_RESULTS=benchmarks/results/gpu
[ -n "${OUT:-}" ] && DEFAULT_RESULTS=/tmp/fastpipe-device-check  # $OUT gets the packed results
[ "$PARTS" = rehearse ] && DEFAULT_RESULTS=/tmp/fastpipe-device-rehearsal  # it holds a copy of the tree
RESULTS=${1:-$DEFAULT_RESULTS}
PACK_DIR=${PACK_DIR:-${OUT:-}}
case "$PARTS" in
  all) PARTS=build,loader+conv+sanitize,bench ;;
  tests) PARTS=build,loader+conv ;;
  rest) PARTS=sanitize,bench ;;
esac
REHEARSE=0
if [ "$PARTS" = rehearse ]; then REHEARSE=1; PARTS=build,loader,conv,sanitize,bench; fi
for p in ${PARTS//[,+]/ }; do
  case "$p" in build|loader|conv|sanitize|bench) ;;
    *) echo "device_check: parts are build, loader, conv, sanitize, bench, tests, rest, all or rehearse; got '$p'" >&2
       exit 2 ;;
  esac
done
mkdir -p "$RESULTS"
RESULTS=$(cd "$RESULTS" && pwd)
export PYTHONUNBUFFERED=1
T0=$(date +%s)
say() { echo "[device_check +$(($(date +%s) - T0))s] $*"; }
DEADLINE_S=${DEADLINE_S:-0}
# capped LIMIT_S [MARGIN_S]: LIMIT_S, or the seconds left before DEADLINE_S less MARGIN_S (default 15, for
# the summary; a step inside a part takes a larger one, so that the part can still report) if fewer.
capped() {
  local left
  [ "$DEADLINE_S" -gt 0 ] || { echo "$1"; return; }
  left=$((DEADLINE_S - ($(date +%s) - T0) - ${2:-15}))
  [ "$left" -lt "$1" ] && echo "$left" || echo "$1"
}
fail() { echo "device_check: $*" >&2; exit 2; }

# Prerequisites, each with a clear line when missing.
command -v "$PY" >/dev/null || fail "no $PY"
for mod in torch pytest setuptools ninja numpy; do
  $PY -c "import $mod" 2>/dev/null || fail "python module '$mod' is missing ($PY -m pip install $mod)"
done
if [ "$REHEARSE" = 1 ]; then
  # The rehearsal builds and runs in a copy of the tree (tracked and untracked files), so that the
  # checkout's own extension, built against another torch, stays as it is.
  TREE="$RESULTS/tree"
  rm -rf "$TREE" && mkdir -p "$TREE"
  git ls-files -co --exclude-standard -z | tar --null -T - -cf - 2>/dev/null | tar -xf - -C "$TREE"
  cd "$TREE"
  CAP=${FASTPIPE_CUDA_ARCHS:-9.0}
else
  $PY -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' || fail "torch sees no CUDA device"
  CAP=$($PY -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability())')
fi
# The toolkit: CUDA_HOME from nvcc's real location when unset (nvcc may be a link or a wrapper).
if [ -z "${CUDA_HOME:-}" ]; then
  NVCC=$(command -v nvcc) || fail "no nvcc on PATH and CUDA_HOME unset"
  NVCC=$(readlink -f "$NVCC")
  if [ ! -f "$(dirname "$NVCC")/../include/cuda_runtime.h" ]; then  # a wrapper script: find the real one
    NVCC=$(grep -o '/[^ "]*/bin/nvcc' "$NVCC" | head -1)
  fi
  export CUDA_HOME=$(cd "$(dirname "$NVCC")/.." && pwd)
fi
export PATH="$CUDA_HOME/bin:$PATH"
NVCC_MAJOR=$("$CUDA_HOME/bin/nvcc" --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
TORCH_MAJOR=$($PY -c 'import torch; print((torch.version.cuda or "none").split(".")[0])')
[ "$NVCC_MAJOR" = "$TORCH_MAJOR" ] || fail "nvcc is CUDA $NVCC_MAJOR but torch was built with CUDA $TORCH_MAJOR: extensions must match"
# Compile for this GPU only (fewer passes than the default list), and fail rather than build CPU-only;
# with line tables, so that native stacks and sanitizer reports name our files and lines.
export FASTPIPE_CUDA=1 FASTPIPE_CUDA_ARCHS=$CAP TORCH_CUDA_ARCH_LIST=$CAP FASTPIPE_LINEINFO=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the in-place build, from any script
XDIST=""
$PY -c "import xdist" 2>/dev/null && XDIST="-n ${TEST_WORKERS:-6}"
SUMMARY="$RESULTS/summary.txt"
{
  echo "device_check $(date -u +%FT%TZ): parts $PARTS$([ "$REHEARSE" = 1 ] && echo ' (rehearsal, no GPU)')"
  echo "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo none)"
  echo "torch: $($PY -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())')"
  echo "nvcc: $("$CUDA_HOME/bin/nvcc" --version | tail -1); CUDA_HOME=$CUDA_HOME; arch $CAP"
  echo "python: $($PY --version 2>&1); host: $(nproc) cores; pytest-xdist: ${XDIST:-no}; cupy: $($PY -c 'import cupy; print(cupy.__version__)' 2>/dev/null || echo none)"
} | tee "$SUMMARY"

RC=0
# run_part NAME LIMIT_S: part_NAME in a shell of its own, stopped (with all it started) at the limit; its
# output in NAME.log and on the terminal as it goes.
run_part() {
  local name=$1 limit t=$(date +%s) rc
  limit=$(capped "$2")
  if [ "$limit" -lt 20 ]; then
    echo "part $name: SKIPPED (out of time: DEADLINE_S=$DEADLINE_S)" | tee -a "$SUMMARY"
    return 1
  fi
  say "part $name (limit ${limit}s, log: $RESULTS/$name.log)"
  timeout --kill-after=10 "$limit" bash -c "part_$name" > >(tee "$RESULTS/$name.log") 2>&1
  rc=$?
  local status=ok
  [ "$rc" = 0 ] || status="FAILED (exit $rc$([ "$rc" = 124 ] && echo ': out of time'))"
  [ "$rc" = 0 ] || RC=1
  echo "part $name: $status in $(($(date +%s) - t)) s" | tee -a "$SUMMARY"
  [ "$rc" = 0 ]
}

# The native stacks benchmarks/native_backtrace.c wrote to STACKS (the first 3, 40 frames each),
# demangled, with the frames in fastpipe's extension resolved to functions and lines by addr2line.
native_stacks() {
  local stacks=$1 line so off
  [ -s "$stacks" ] || return 0
  echo "native stacks of crashed test processes ($(grep -c "^--- native backtrace" "$stacks") in $(basename "$stacks"); the first 3):"
  awk '/^--- native backtrace/{k++; n=0; if (k > 3) exit; print "  " $0; next} k && n < 40 {print; n++}' "$stacks" |
    while IFS= read -r line; do
      echo "    $line"
      if [[ "$line" =~ ^([^\(]*/_C[^/\(]*\.so)\(\+(0x[0-9a-f]+)\) ]] && command -v addr2line >/dev/null; then
        so=${BASH_REMATCH[1]}; off=${BASH_REMATCH[2]}
        echo "      = $(addr2line -Cfpe "$so" "$off" 2>/dev/null)"
      fi
    done | { command -v c++filt >/dev/null && c++filt || cat; }
}

# pytest over the GPU tests of some paths; the rehearsal collects them and checks they skip cleanly.
# Every failure's reason (-rfE) and a JUnit XML beside the log; a test whose worker crashed is rerun
# alone, outside xdist, with every thread's native stack (rerun_crashed).
gpu_tests() {  # log name, seconds, paths...
  local log=$1 limit=$2; shift 2
  local report=(-rfE --junitxml="$RESULTS/${log%.log}.xml")
  if [ "$REHEARSE" = 1 ]; then
    $PY -m pytest "$@" -m gpu -q -p no:cacheprovider -o addopts="" --collect-only >"$RESULTS/$log.collect" 2>&1 || return 1
    echo "collected: $(tail -1 "$RESULTS/$log.collect")"
    timeout "$limit" $PY -m pytest "$@" -m gpu -q -p no:cacheprovider -o addopts="" "${report[@]}" $XDIST \
      >"$RESULTS/$log" 2>&1
  else
    FASTPIPE_REQUIRE_GPU=1 LD_PRELOAD="$NATIVE_BACKTRACE" NATIVE_BACKTRACE_LOG="$RESULTS/${log%.log}_stacks.txt" timeout "$(capped "$limit" 30)" $PY -m pytest "$@" -m gpu -q \
      -p no:cacheprovider -o addopts="" "${report[@]}" $XDIST >"$RESULTS/$log" 2>&1
  fi
  local rc=$?
  tail -3 "$RESULTS/$log"
  grep -E "^(FAILED|ERROR)" "$RESULTS/$log" | head -20
  native_stacks "$RESULTS/${log%.log}_stacks.txt"
  rerun_crashed "$RESULTS/$log"
  return $rc
}

# The tests whose xdist worker crashed in LOG (the first 3), each run again alone under gdb (every
# thread's backtrace; the crash reporter's stack without gdb): LOG_crash_K.log.
rerun_crashed() {
  local log=$1 k=0 id out
  grep -o "crashed while running '[^']*'" "$log" | sed "s/^crashed while running '//; s/'$//" | sort -u | head -3 |
    while IFS= read -r id; do
      k=$((k + 1)); out="${log%.log}_crash_$k.log"
      say "rerunning the crashed $id alone: $(basename "$out")"
      if command -v gdb >/dev/null; then
        FASTPIPE_REQUIRE_GPU=1 timeout "$(capped 90 30)" gdb -batch -nx -ex "set pagination off" -ex run \
          -ex "thread apply all bt 40" --args $PY -m pytest "$id" -q -p no:cacheprovider -o addopts="" -rfE >"$out" 2>&1
      else
        FASTPIPE_REQUIRE_GPU=1 LD_PRELOAD="$NATIVE_BACKTRACE" NATIVE_BACKTRACE_LOG="${out%.log}_stacks.txt" \
          timeout "$(capped 90 30)" $PY -m pytest "$id" -q -p no:cacheprovider -o addopts="" -rfE >"$out" 2>&1
        native_stacks "${out%.log}_stacks.txt" >>"$out"
      fi
      grep -E "^(Thread|#[0-9]+ .*fastpipe|Program received)" "$out" | head -12
    done
}

part_build() {
  # The crash reporter the tests run under (a crash in native code shows its native stack).
  gcc -shared -fPIC -O1 -Wall -o "$NATIVE_BACKTRACE" benchmarks/native_backtrace.c || return 1
  if ! timeout $((300 * SCALE)) $PY setup.py build_ext --inplace >"$RESULTS/build_ext.log" 2>&1; then
    tail -40 "$RESULTS/build_ext.log"
    return 1
  fi
  $PY -c 'import fastpipe, json; print("build_info:", json.dumps(fastpipe.build_info()))' | tee -a "$SUMMARY"
  if [ "$REHEARSE" = 0 ]; then
    $PY -c 'import torch, fastpipe; from fastpipe.data import _device; C = fastpipe._ext._C
print("jpeg:", C.JPEG, "nvjpeg:", C.nvjpeg_status(torch.cuda.current_device(), _device.nvjpeg_library()))' \
      | tee -a "$SUMMARY"
  fi
  # Register spills in the hot kernels (issue 12 asks for none): ptxas's report for this GPU's arch.
  local sm=${CAP/./} cu
  for cu in csrc/cuda/depthwise.cu csrc/cuda/epilogue.cu; do
    "$CUDA_HOME/bin/nvcc" -std=c++17 -O3 --use_fast_math -Icsrc -gencode "arch=compute_$sm,code=sm_$sm" -Xptxas -v \
      -c "$cu" -o /dev/null 2>&1 | grep -c "[1-9][0-9]* bytes spill" | sed "s|^|spilling kernels in $cu: |" | tee -a "$SUMMARY"
  done
  return 0
}

part_loader() {
  XDIST=${XDIST:+-n 3}  # 21 tests; the conv part runs beside it
  gpu_tests loader_tests.log 240 tests/data tests/test_batch_size.py tests/test_monitor.py tests/test_build.py
  return $?
}

part_conv() {
  gpu_tests conv_tests.log 240 tests/nn
  local rc=$?
  if [ "$REHEARSE" = 0 ]; then
    # The validation figures of the engines not yet validated (issue 12): every engine forced on every
    # row, forward, with the engine that really ran; after the tests, so a failing engine is known first.
    timeout "$(capped 60 30)" $PY benchmarks/conv_bench.py --device cuda --batch 32 --dtype fp16 fp32 --mode fwd --reps 5 --no-compile \
      --force-engines --out "$RESULTS/conv_engines_gpu.json" >"$RESULTS/conv_engines_gpu.txt" 2>&1 ||
      echo "forced-engine benchmark failed or stopped at its time limit"
    grep -A40 "each engine forced" "$RESULTS/conv_engines_gpu.txt" | head -45
    # The depthwise backward kernels (forced with the forward ones) against aten.convolution_backward.
    timeout "$(capped 45 30)" $PY benchmarks/conv_bench.py --device cuda --batch 32 --dtype fp16 fp32 --mode fwdbwd --rows dw --reps 5 \
      --no-compile --force-engines --out "$RESULTS/conv_engines_bwd_gpu.json" >"$RESULTS/conv_engines_bwd_gpu.txt" 2>&1 ||
      echo "forced-engine backward benchmark failed or stopped at its time limit"
    grep -A25 "each engine forced" "$RESULTS/conv_engines_bwd_gpu.txt" | head -30
  else
    $PY benchmarks/conv_bench.py --help >/dev/null || rc=1
    # The tests of what a torch build or version can change (the `torch_build` marker: the conv ops,
    # the threaded ones included, tensors, torchvision's references, trainers) against the GPU machine's
    # torch, without a GPU (issue 29: the conv keyed path crashed there, and CI otherwise runs them
    # against other torch versions only).
    timeout $((180 * SCALE)) $PY -m pytest tests -m "torch_build and not gpu" -q -p no:cacheprovider -o addopts="" \
      >"$RESULTS/torch_build_tests.log" 2>&1 || rc=1
    echo "torch_build tests against torch $($PY -c 'import torch; print(torch.__version__)'): $(tail -1 "$RESULTS/torch_build_tests.log")"
    grep -E "^(FAILED|ERROR)" "$RESULTS/torch_build_tests.log" | head -20
  fi
  return $rc
}

# sanitizer_reports LOG: "OURS OTHERS", the compute-sanitizer reports in LOG that name fastpipe's kernels
# (fastpipe::) or a frame in its extension (_C*.so), and the rest. sanitizer_reports LOG ours: those
# reports themselves, whole.
sanitizer_reports() {
  awk -v print_ours="${2:-}" '
       function close_report() { if (open) { if (hit) { ours++; if (print_ours) printf "%s", text } else others++ } open = 0 }
       /^========= [^ ]/ && !/COMPUTE-SANITIZER|SUMMARY|Target application/ { close_report(); open = 1; hit = 0; text = "" }
       open && /^=========  / && /fastpipe::|\/_C[^\/ ]*\.so/ { hit = 1 }
       /^[^=]/ { close_report() }
       open { text = text $0 "\n" }
       END { close_report(); if (!print_ours) print ours + 0, others + 0 }' "$1"
}

# compute-sanitizer over slices of the kernel tests and the device loader's tests (it slows kernels
# ~100x), all at once (the host has the cores). Without torch's caching allocator every tensor is its own
# cudaMalloc, so an out-of-bounds access or a read of memory never written is caught at the tensor. A
# run that ends by its time limit has checked nothing to the end: it fails the part.
part_sanitize() {
  local sanitizer="$CUDA_HOME/bin/compute-sanitizer" rc=0
  if [ ! -x "$sanitizer" ]; then
    echo "compute-sanitizer: not in $CUDA_HOME/bin$([ "$REHEARSE" = 1 ] && echo " (the rehearsal's toolkit lacks it; the GPU machine's has it)")" \
      | tee -a "$SUMMARY"
    [ "$REHEARSE" = 1 ] || return 1
  fi
  local runs=(  # tool|log name|test file|-k expression
    "memcheck|depthwise|tests/nn/test_depthwise_kernel.py|float32"
    "initcheck|depthwise|tests/nn/test_depthwise_kernel.py|float32"
    "racecheck|depthwise_backward|tests/nn/test_depthwise_backward.py|gpu"
    "memcheck|depthwise_backward|tests/nn/test_depthwise_backward.py|gpu"
    "memcheck|gemm1x1|tests/nn/test_gemm1x1.py|gpu and float32"
    "initcheck|gemm1x1|tests/nn/test_gemm1x1.py|gpu and float32"
    "memcheck|act_backward|tests/nn/test_ops.py|activation_backward_op and cuda and float32"
    "initcheck|act_backward|tests/nn/test_ops.py|activation_backward_op and cuda and float32"
    "memcheck|loader|tests/data/test_loader_gpu.py|gpu and not graph and not capture"
    "memcheck|augment|tests/data/test_image_augment.py|gpu"
    "racecheck|augment|tests/data/test_image_augment.py|gpu"
    "memcheck|augmix|tests/data/test_image_augmix.py|gpu"
    "memcheck|filters|tests/data/test_image_filters.py|gpu"
    "memcheck|device_decode|tests/data/test_image_device.py|gpu"
    "racecheck|augmix|tests/data/test_image_augmix.py|gpu"
    "initcheck|loader|tests/data/test_loader_gpu.py|gpu and not graph and not capture"
  )
  local pids=() names=() names_log=() run tool name file expr
  for run in "${runs[@]}"; do
    IFS='|' read -r tool name file expr <<<"$run"
    local log="$RESULTS/sanitizer_${name}_$tool.log"
    if [ "$REHEARSE" = 1 ]; then  # each selection collected, all at once
      $PY -m pytest -m gpu -q -p no:cacheprovider -o addopts="" --collect-only "$file" -k "$expr" >"$log" 2>&1 &
      pids+=($!); names+=("$tool over $name"); names_log+=("${name}_$tool")
      continue
    fi
    FASTPIPE_UNDER_SANITIZER=1 PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout "$(capped 300 30)" "$sanitizer" --tool "$tool" \
      --error-exitcode 9 $PY -m pytest -m gpu -q -p no:cacheprovider -o addopts="" "$file" -k "$expr" >"$log" 2>&1 &
    pids+=($!); names+=("$tool over $name"); names_log+=("${name}_$tool")
  done
  local k
  if [ "$REHEARSE" = 1 ]; then
    for k in "${!pids[@]}"; do
      wait "${pids[$k]}" || rc=1
      echo "${names[$k]}: $(tail -1 "$RESULTS/sanitizer_${names_log[$k]}.log")"
    done
    return $rc
  fi
  for k in "${!pids[@]}"; do
    wait "${pids[$k]}"; local r=$?
    local what="clean"
    if [ "$r" = 9 ]; then
      # initcheck reports torch's and CUB's reductions reading staging memory they fill in ways it cannot
      # follow (NVIDIA/cccl#1790 and others): only reports that name fastpipe's kernels or extension count.
      read -r ours others < <(sanitizer_reports "$RESULTS/sanitizer_${names_log[$k]}.log")
      sanitizer_reports "$RESULTS/sanitizer_${names_log[$k]}.log" ours >"$RESULTS/sanitizer_${names_log[$k]}_ours.txt"
      if [ "$ours" = 0 ]; then
        r=0; what="clean ($others reports outside fastpipe's code, not counted)"
      else
        what="ERRORS FOUND ($ours in fastpipe's code, $others elsewhere)"
      fi
    fi
    [ "$r" = 0 ] || rc=1
    [ "$r" = 124 ] && what="OUT OF TIME (checked nothing to the end)"
    [ "$r" != 0 ] && [ "$r" != 9 ] && [ "$r" != 124 ] && what="tests failed (exit $r)"
    echo "compute-sanitizer ${names[$k]}: $what" | tee -a "$SUMMARY"
  done
  return $rc
}

# bench_step SECONDS NAME COMMAND...: one benchmark, its output in NAME.txt; stopped at its limit.
bench_step() {
  local limit name=$2; limit=$(capped "$1"); shift 2
  if [ "$REHEARSE" = 1 ]; then
    "$@" --help >/dev/null 2>&1 && echo "$name: entry point ok" || { echo "$name: entry point FAILED"; return 1; }
    return 0
  fi
  [ "$limit" -ge 10 ] || { say "benchmark $name skipped: out of time"; return 0; }
  say "benchmark $name (limit ${limit}s)"
  timeout "$limit" "$@" >"$RESULTS/$name.txt" 2>>"$RESULTS/bench_progress.log" || say "$name failed or stopped at its limit"
  return 0
}

part_bench() {
  local rc=0
  bench_step 100 loader_gpu $PY benchmarks/gpu_loader_bench.py --out "$RESULTS/loader_gpu.json" || rc=1
  bench_step 70 conv_gpu $PY benchmarks/conv_bench.py --device cuda --batch 32 128 --dtype bf16 fp16 fp32 --reps 5 \
    --no-compile --out "$RESULTS/conv_gpu.json" || rc=1
  bench_step 30 next_cost_gpu $PY benchmarks/next_cost_bench.py --batches 2000 --device cpu,cuda \
    --out "$RESULTS/next_cost_gpu.json" || rc=1
  bench_step 100 jpeg_gpu $PY benchmarks/gpu_jpeg_bench.py --out "$RESULTS/jpeg_gpu.json" \
    --data-dir /tmp/fastpipe-bench-data || rc=1
  bench_step 90 train_gpu $PY -m fastpipe.bench train --steps 40 --warmup 10 --reps 1 --no-progress --tag gpu \
    --out-dir "$RESULTS" --data-dir /tmp/fastpipe-bench-data || rc=1
  bench_step 40 soak_gpu $PY -m fastpipe.bench soak --device cuda --batches 5000 --no-progress --tag gpu \
    --out-dir "$RESULTS" --data-dir /tmp/fastpipe-bench-data || rc=1
  # The CPU loader on 16 cores (issue 21 asks for the default against one thread there too).
  bench_step 110 loader_cpu16 $PY -m fastpipe.bench loader --only cifar,imagenet --reps 3 --no-progress --tag cpu16 \
    --out-dir "$RESULTS" --data-dir /tmp/fastpipe-bench-data || rc=1
  $PY - "$RESULTS" <<'PYEOF' | tee -a "$SUMMARY"
import json, pathlib, sys
results = pathlib.Path(sys.argv[1])
path = results / "loader_gpu.json"
if path.exists():
    doc = json.loads(path.read_text())
    print("loader:", {k: round(v, 3) for k, v in doc["ratios"].items()})
    for which, r in doc["train"].items():
        print(f"  {which:10s} {r['images_per_s']:8.0f} img/s  wait {100 * r['wait_fraction']:5.1f}%  "
              f"CPU {r['cpu_ms_per_batch']:6.2f} ms/batch")
else:
    print("loader_gpu.json: missing")
path = results / "conv_gpu.json"
if not path.exists():
    print("conv_gpu.json: missing")
else:
    doc = json.loads(path.read_text())
    layers = doc["results"]["layers"]
    worst = min(layers["rows"], key=lambda r: r["speedup"])
    done = "" if layers["complete"] else " (cut short)"
    print(f"conv_gpu.json: {len(layers['rows'])} rows in {doc['seconds']} s{done}; slowest row vs eager: "
          f"{worst['speedup']:.2f}x ({worst['row']}, {worst['dtype']} b{worst['batch']} {worst['layout']} {worst['mode']})")
    for s in layers["summary"]:
        print(f"  {s['config']:36s} {s['family']:13s} {s['speedup']:10.2f}x")
path = results / "jpeg_gpu.json"
if not path.exists():
    print("jpeg_gpu.json: missing")
else:
    doc = json.loads(path.read_text())
    print(f"jpeg: nvJPEG {doc.get('nvjpeg')}; {doc['images']} images {doc['jpeg_variants']}")
    for row in ("host", "device", "torchvision"):
        r = doc.get(row, {})
        if "images_per_s" in r:
            print(f"  {row:11s} {r['images_per_s']:8.0f} img/s  gap p99 {r['batch_gap_ms_p99']:6.1f} ms  "
                  f"CPU {r['cpu_cores']:4.1f} cores  planar {r.get('decoded_planar', '-')}  host {r.get('decoded_on_host', '-')}")
        elif r:
            print(f"  {row:11s} {r}")
PYEOF
  return $rc
}

# Everything in RESULTS packed into PACK_DIR as at most 8 files of 16 MiB, 64 MiB in all (what a lease
# brings back): summary.txt, and results.tgz.0... (cat them, then tar -xzf). Logs are kept whole while the
# archive fits in 4 parts of 15 MiB; otherwise each log over 2 MiB keeps its first and last MiB (the
# reports naming fastpipe's code, in their own files, stay whole).
pack_results() {
  [ -n "$PACK_DIR" ] || return 0
  mkdir -p "$PACK_DIR" && rm -f "$PACK_DIR"/results.tgz.*
  cp "$SUMMARY" "$PACK_DIR/summary.txt"
  local stage f
  stage=$(mktemp -d)
  (cd "$RESULTS" && find . -path ./tree -prune -o -type f -size -64M -print0 | tar --null -T - -cf - 2>/dev/null) |
    tar -xf - -C "$stage"
  cut_log() {  # FILE [DEST]: its first and last MiB
    { head -c 1M "$1"; printf '\n[... %s bytes cut by pack_results ...]\n' "$(stat -c %s "$1")"; tail -c 1M "$1"; } >"$2"
  }
  (cd "$RESULTS" && find . -path ./tree -prune -o -type f -size +64M -print) | while IFS= read -r f; do
    mkdir -p "$stage/$(dirname "$f")" && cut_log "$RESULTS/$f" "$stage/$f"
  done
  (cd "$stage" && tar -czf - .) | split -b 15M -d -a 1 - "$PACK_DIR/results.tgz."
  if [ "$(ls "$PACK_DIR"/results.tgz.* | wc -l)" -gt 4 ]; then
    rm -f "$PACK_DIR"/results.tgz.*
    find "$stage" -type f -size +2M ! -name '*_ours.txt' | while IFS= read -r f; do
      cut_log "$f" "$f.cut" && mv "$f.cut" "$f"
    done
    (cd "$stage" && tar -czf - .) | split -b 15M -d -a 1 - "$PACK_DIR/results.tgz."
  fi
  rm -rf "$stage"
  local n
  n=$(ls "$PACK_DIR" | wc -l)
  say "packed into $PACK_DIR: $(cd "$PACK_DIR" && ls | tr '\n' ' ')($(du -sh "$PACK_DIR" | cut -f1))"
  [ "$n" -le 8 ] || say "WARNING: $n files in $PACK_DIR: a lease brings back 8"
}

# The rehearsal's machine has a few cores where the GPU machine has 16: its limits are scaled (the times
# it reports are what to compare).
SCALE=${LIMIT_SCALE:-$([ "$REHEARSE" = 1 ] && echo 8 || echo 1)}
NATIVE_BACKTRACE=/tmp/fastpipe_native_backtrace.so
export PY RESULTS REHEARSE CAP XDIST SUMMARY T0 SCALE DEADLINE_S NATIVE_BACKTRACE
export -f say capped native_stacks sanitizer_reports gpu_tests rerun_crashed bench_step part_build part_loader part_conv part_sanitize part_bench
declare -A LIMIT=([build]=330 [loader]=270 [conv]=400 [sanitize]=330 [bench]=560)
for group in ${PARTS//,/ }; do
  if [ "$group" = build ]; then
    run_part build "$((LIMIT[build] * SCALE))" || { say "the build failed: nothing else can run"; pack_results; exit 1; }
    continue
  fi
  pids=()
  for p in ${group//+/ }; do
    run_part "$p" "$((LIMIT[$p] * SCALE))" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || RC=1; done
done
say "done; exit status $RC"
pack_results
exit $RC
