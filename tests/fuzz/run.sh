#!/usr/bin/env bash
# Bounded coverage-guided fuzzing of the .npy header parser, the token-file opener, the WebDataset shard
# indexer (tar headers, samples, labels, JSON label fields, image headers) and the path of one
# JPEG, PNG or WebP (header, geometry, region decode with libjpeg, libspng or libwebp, resample, augmentations) (`make fuzz`):
# libFuzzer with AddressSanitizer and UndefinedBehaviorSanitizer, over a copy of tests/fuzz/corpus.
# Every input must end in a clean error; a crash, sanitizer report, leak, broken invariant or an input
# running past -timeout fails the run, with the reproducer's path and head.
#
# Needs clang with libFuzzer: installs Debian's clang-14 and libclang-rt-14-dev (the libFuzzer and
# sanitizer runtimes) when missing (root or sudo). FUZZ_SECONDS: seconds per harness (default 20);
# FUZZ_CXX: the compiler (default clang++-14, else clang++).
set -euo pipefail
cd "$(dirname "$0")/../.."

SECONDS_EACH=${FUZZ_SECONDS:-20}
HARNESSES=(npy_header_fuzz token_file_fuzz image_fuzz tar_fuzz)
# The engine sources each harness links (npy.cpp reads through File, which file.cpp's fault hooks need).
# gather.cpp opens image columns too, so the token-file opener links the image path, and it opens every
# column through record_source.cpp.
IMAGE_PATH="image_format jpeg_header jpeg_decode png_decode webp_decode resample resample_fixed augment"
declare -A SOURCES=([npy_header_fuzz]="npy file fault"
                    [token_file_fuzz]="npy file record_source fault gather image_column $IMAGE_PATH"
                    [image_fuzz]="$IMAGE_PATH image_scan file fault"
                    [tar_fuzz]="tar_index json_field $IMAGE_PATH image_scan file record_source fault")
declare -A CORPUS=([npy_header_fuzz]=npy [token_file_fuzz]=tokens [image_fuzz]=image [tar_fuzz]=tar)
# Token files may be .npy files too.
declare -A DICT=([npy_header_fuzz]=tests/fuzz/npy.dict [token_file_fuzz]=tests/fuzz/npy.dict)
FLAGS=(-std=c++17 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -g -O1 -I csrc -I tests/fuzz
       -DFASTPIPE_WITH_JPEG -DFASTPIPE_WITH_PNG -DFASTPIPE_WITH_WEBP)

has_libfuzzer() {
  command -v "$1" >/dev/null &&
    echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' |
    "$1" -x c++ -fsanitize=fuzzer,address,undefined - -o /dev/null 2>/dev/null
}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/fastpipe-fuzz.XXXXXX")
SHM=
# WORK is kept when something fails: it holds the reproducers and logs.
cleanup() {
  rm -rf ${SHM:+"$SHM"}
  if [[ ${KEEP_WORK:-0} == 0 ]]; then rm -rf "$WORK"; fi
}
trap cleanup EXIT

CXX=${FUZZ_CXX:-}
if [[ -z $CXX ]]; then
  for c in clang++-14 clang++; do
    if has_libfuzzer "$c"; then CXX=$c && break; fi
  done
fi
if [[ -z $CXX ]]; then
  echo "fuzz: installing clang-14 and libclang-rt-14-dev (libFuzzer) ..."
  SUDO=$([[ $(id -u) == 0 ]] || echo sudo)
  { $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends clang-14 libclang-rt-14-dev; } >"$WORK/apt.log" 2>&1 ||
    { cat "$WORK/apt.log" >&2; exit 1; }
  CXX=clang++-14
fi
has_libfuzzer "$CXX" || { echo "fuzz: $CXX cannot link -fsanitize=fuzzer,address,undefined" >&2; exit 1; }

mkdir -p "$WORK/obj" "$WORK/tmp"
# The harnesses write each input to a file under $TMPDIR, on a tmpfs where there is one (many times
# faster than a disk), and inputs read with O_DIRECT under FUZZ_DISK_DIR (see token_file_fuzz.cpp).
export TMPDIR=$WORK/tmp FUZZ_DISK_DIR=$WORK/tmp
if [[ -d /dev/shm && -w /dev/shm ]]; then
  SHM=$(mktemp -d /dev/shm/fastpipe-fuzz.XXXXXX)
  TMPDIR=$SHM
fi
export ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1
unset LD_PRELOAD

# Each translation unit once (the harnesses and the union of their SOURCES), $(nproc) at a time, through
# ccache where it is installed: tests/fuzz/test_fuzz_corpus.py compiles the same units with the same
# command lines (relative paths, from the checkout), so CI compiles them once.
CCACHE=$(command -v ccache || true)
# shellcheck disable=SC2068  # SOURCES' values are lists of words
mapfile -t units < <(printf '%s\n' canary_fuzz "${HARNESSES[@]}" ${SOURCES[@]} | awk '!seen[$0]++')
for u in "${units[@]}"; do
  src=csrc/core/$u.cpp
  [[ -f $src ]] || src=tests/fuzz/$u.cpp
  $CCACHE "$CXX" "${FLAGS[@]}" -c "$src" -o "$WORK/obj/$u.o" &
  while (($(jobs -rp | wc -l) >= $(nproc))); do wait -n || true; done
done
wait
for u in "${units[@]}"; do
  [[ -f $WORK/obj/$u.o ]] || { echo "fuzz: compiling $u failed" >&2; exit 1; }
done
link() {
  local name=$1 objs=("$WORK/obj/$1.o")
  for u in ${SOURCES[$name]:-}; do objs+=("$WORK/obj/$u.o"); done
  "$CXX" "${FLAGS[@]}" "${objs[@]}" -o "$WORK/$name" -lpthread -ljpeg -lspng -lwebp
}
for h in canary_fuzz "${HARNESSES[@]}"; do link "$h"; done

# The canary: libFuzzer must reach its heap overflow (coverage feedback and ASan live), and UBSan must
# stop it on any input when CANARY_UB is set.
mkdir -p "$WORK/canary"
start=$SECONDS
"$WORK/canary_fuzz" -max_total_time=30 -artifact_prefix="$WORK/canary/" "$WORK/canary" >"$WORK/canary.log" 2>&1 &&
  { echo "fuzz: the canary harness ran 30 s without its crash: libFuzzer or ASan is not working" >&2; exit 1; }
grep -q "ERROR: AddressSanitizer: heap-buffer-overflow" "$WORK/canary.log" ||
  { echo "fuzz: the canary failed without an AddressSanitizer report:" >&2; tail -20 "$WORK/canary.log" >&2; exit 1; }
echo x >"$WORK/canary/input"
if CANARY_UB=1 "$WORK/canary_fuzz" "$WORK/canary/input" >"$WORK/canary_ub.log" 2>&1 ||
  ! grep -q "runtime error: signed integer overflow" "$WORK/canary_ub.log"; then
  echo "fuzz: UBSan did not stop the canary's signed overflow:" >&2
  tail -20 "$WORK/canary_ub.log" >&2
  exit 1
fi
echo "fuzz: $($CXX --version | head -1); canary: overflow found in $((SECONDS - start)) s, UBSan fatal"

failed=0
for h in "${HARNESSES[@]}"; do
  corpus=$WORK/corpus/$h
  mkdir -p "$corpus" "$WORK/artifacts"
  cp tests/fuzz/corpus/"${CORPUS[$h]}"/* "$corpus"/
  seeds=$(ls "$corpus" | wc -l)
  args=(-max_total_time="$SECONDS_EACH" -timeout=5 -rss_limit_mb=2048 -print_final_stats=1
        -artifact_prefix="$WORK/artifacts/$h-")
  if [[ -n ${DICT[$h]:-} ]]; then args+=(-dict="${DICT[$h]}"); fi
  rc=0
  start=$SECONDS
  "$WORK/$h" "${args[@]}" "$corpus" >"$WORK/$h.log" 2>&1 || rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$WORK/$h.log" | grep -o '[0-9]*$' || echo '?')
  cov=$(grep -o 'cov: [0-9]* ft: [0-9]*' "$WORK/$h.log" | tail -1 || true)
  result=ok
  if [[ $rc != 0 ]]; then
    failed=1
    repro=$(ls "$WORK/artifacts/$h-"* 2>/dev/null | head -1 || true)
    kind=$(basename "${repro:-unknown-}" | sed "s/^$h-//; s/-.*//")
    result="FAILED ($kind, exit $rc)"
  fi
  echo "$h: $result; ${execs} execs in $((SECONDS - start)) s; ${cov:-cov: ?}; corpus $(ls "$corpus" | wc -l) (from $seeds seeds)"
  if [[ $rc != 0 ]]; then
    grep -m 3 -E "ERROR: |runtime error|deadly signal|uncaught|ALARM|out-of-memory" "$WORK/$h.log" | sed 's/^/  /'
    if [[ -n $repro ]]; then
      echo "  reproducer: $repro ($(stat -c %s "$repro") bytes; rerun: $WORK/$h $repro)"
      od -A x -t x1z -v "$repro" | head -16 | sed 's/^/    /'
    fi
    echo "  log: $WORK/$h.log"
  fi
done
if [[ $failed != 0 ]]; then
  KEEP_WORK=1
  exit 1
fi
