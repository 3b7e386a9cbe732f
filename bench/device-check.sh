#!/usr/bin/env bash
# The whole GPU check of selfattn in one script, for a lent H200 (CUDA toolkit, CMake, ninja, Python
# with PyTorch; no Debian -dev packages, no network). Everything lands in OUTDIR; a short summary
# is printed last. Budget: under 8 minutes.
#
#   bench/device-check.sh --prepare        here: copy CLI11, nlohmann/json and GoogleTest's sources into
#                                          .deps/ (gitignored) and stamp the commit; carry .deps to the device
#   bench/device-check.sh OUTDIR           on the device: Release build for sm_90a, the Hopper primitives
#                                          test first (before any other GPU test or timing), the gpu tests,
#                                          compute-sanitizer memcheck + racecheck on small cases of each path,
#                                          the default sweep with --check, compare_torch.py, the plot
#   bench/device-check.sh --dry-run OUTDIR here: the same build and the sim parts (no GPU)
#
# On the device tool:  run(command="bench/device-check.sh $OUT", carry=[".deps"], timeout_s=540)
# (the script budgets itself 450 s, BUDGET_S to change; a fresh machine adds its start-up before that)
# OUTDIR then holds at most 7 files (the tool brings back 8): summary.txt, hopper_primitives.log (the
# Hopper primitives test's whole output, kept outside the tarball so it survives a run cut short),
# bench.json, torch.json, throughput.png, sim.json (dry run) and logs.tar.gz (every step's log).
# Environment knobs: BUILD_DIR (default build-device; dry run build-bench), JOBS, BUDGET_S, CUDA_ARCH
# (default 90a), BUILD_ALL=0 (build only the bench: no gpu tests besides the Hopper primitives),
# HOPPER_PRIMS=0 (skip the Hopper primitives test).
set -u -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEPS=$ROOT/.deps
JOBS=${JOBS:-$(nproc)}

prepare() {
  rm -rf "$DEPS"
  mkdir -p "$DEPS/include"
  cp -r /usr/include/CLI "$DEPS/include/" || { echo "CLI11 headers missing: apt-get install libcli11-dev"; exit 1; }
  cp -r /usr/include/nlohmann "$DEPS/include/" || { echo "nlohmann/json missing: apt-get install nlohmann-json3-dev"; exit 1; }
  cp -r /usr/src/googletest "$DEPS/googletest" || { echo "GoogleTest sources missing: apt-get install googletest"; exit 1; }
  (git -C "$ROOT" rev-parse --short=12 HEAD 2>/dev/null || echo unknown) > "$DEPS/git-commit"
  if ! git -C "$ROOT" diff-index --quiet HEAD -- 2>/dev/null; then sed -i 's/$/-dirty/' "$DEPS/git-commit"; fi
  echo "prepared $DEPS ($(du -sh "$DEPS" | cut -f1)), commit $(cat "$DEPS/git-commit"); carry .deps to the device"
}

DRY_RUN=0
case "${1:-}" in
  --prepare) prepare; exit 0 ;;
  --dry-run) DRY_RUN=1; shift ;;
  -h|--help|"") awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
esac
OUTDIR=$(mkdir -p "$1" && cd "$1" && pwd)
LOGS=$OUTDIR/logs
mkdir -p "$LOGS"
if [ "$DRY_RUN" = 1 ]; then
  BUILD=${BUILD_DIR:-$ROOT/build-bench}
  JOBS=${JOBS_DRY:-2}
else
  BUILD=${BUILD_DIR:-$ROOT/build-device}
fi
SUMMARY=$OUTDIR/summary.txt
: > "$SUMMARY"
START=$(date +%s)
# Every step's limit is cut to what is left of the budget, so the whole check ends in time even
# when a step hangs; a step with under 15 s left is skipped and says so.
BUDGET_S=${BUDGET_S:-450}
[ "$DRY_RUN" = 1 ] && BUDGET_S=${BUDGET_S_DRY:-3000}
DEADLINE=$(( START + BUDGET_S ))

# step NAME TIMEOUT_S COMMAND...: runs COMMAND with its output in logs/NAME.log, records the outcome.
step() {
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s) rc
  local left=$(( DEADLINE - t0 ))
  if [ $left -lt 15 ]; then
    printf '%-22s %-24s\n' "$name" "SKIPPED (time budget)" | tee -a "$SUMMARY"
    return 125
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== $name: $*" | tee -a "$LOGS/$name.log"
  timeout --kill-after=10 "$limit" "$@" >> "$LOGS/$name.log" 2>&1
  rc=$?
  local verdict=ok
  [ $rc -ne 0 ] && verdict="FAILED (exit $rc)"
  [ $rc -eq 124 ] && verdict="TIMED OUT after ${limit}s"
  printf '%-22s %-24s %4ss\n' "$name" "$verdict" "$(( $(date +%s) - t0 ))" | tee -a "$SUMMARY"
  return $rc
}

[ -d "$DEPS/include/CLI" ] && [ -d "$DEPS/googletest" ] || {
  echo "$DEPS is incomplete: run bench/device-check.sh --prepare here first, and carry .deps"; exit 1; }
echo "selfattn device check: commit $(cat "$DEPS/git-commit" 2>/dev/null), build $BUILD, $JOBS jobs, dry run $DRY_RUN" | tee -a "$SUMMARY"
[ "$DRY_RUN" = 0 ] && { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$SUMMARY"; }

# GoogleTest from the carried sources (the device has no libgtest-dev), installed beside the build.
GTEST_PREFIX=$BUILD/_gtest/install
if [ ! -f "$GTEST_PREFIX/lib/cmake/GTest/GTestConfig.cmake" ]; then
  step gtest 180 bash -c "cmake -S '$DEPS/googletest' -B '$BUILD/_gtest/build' -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DBUILD_GMOCK=ON -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DCMAKE_INSTALL_PREFIX='$GTEST_PREFIX' \
      -DCMAKE_INSTALL_LIBDIR=lib && cmake --build '$BUILD/_gtest/build' -j $JOBS && cmake --install '$BUILD/_gtest/build'"
fi

# Release, sm_90a only (wgmma / TMA need the 'a' target; nothing else is built). The dry run keeps its
# build folder's architectures (changing them would rebuild every CUDA kernel here for nothing).
# -U: find CLI11 and nlohmann/json afresh, so .deps/include (searched first) is what the build uses.
ARCH=(-DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCH:-90a})
[ "$DRY_RUN" = 1 ] && ARCH=()
# The Python package needs nanobind, which the device machine lacks (and cannot download): off here,
# so compare_torch.py runs PyTorch's SDPA alone there.
step configure 120 cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release "${ARCH[@]}" \
  -USELFATTN_CLI11_INCLUDE_DIR -USELFATTN_JSON_INCLUDE_DIR -DGTest_DIR="$GTEST_PREFIX/lib/cmake/GTest" \
  -DSELFATTN_BUILD_TESTS=ON -DSELFATTN_BUILD_PYTHON=OFF || tail -30 "$LOGS/configure.log"
# The Hopper primitives (tests/primitives/test_hopper_primitives_gpu: TMA, wgmma SS/RS and the mbarrier
# ring, each against mma.sync on the same data) before anything else runs on the GPU: every later
# result is read knowing whether they hold on this chip. Building it builds the library, which the
# bench needs anyway (build-bench then only adds the bench).
HOPPER_TEST=$BUILD/tests/primitives/test_hopper_primitives_gpu
if [ "$DRY_RUN" = 0 ] && [ "${HOPPER_PRIMS:-1}" != 0 ]; then
  step build-hopper-prims 300 cmake --build "$BUILD" -j "$JOBS" --target test_hopper_primitives_gpu
  if [ -x "$HOPPER_TEST" ]; then
    step hopper-prims 60 "$HOPPER_TEST" --gtest_color=no
  else
    echo "hopper-prims: no $HOPPER_TEST (SELFATTN_HAVE_HOPPER_KERNELS off, or see build-hopper-prims.log)" |
      tee -a "$SUMMARY"
  fi
  cp "$LOGS/hopper-prims.log" "$OUTDIR/hopper_primitives.log" 2>/dev/null ||
    cp "$LOGS/build-hopper-prims.log" "$OUTDIR/hopper_primitives.log" 2>/dev/null
fi
# The bench next, so the sweep runs even if building every test takes too long.
step build-bench 1500 cmake --build "$BUILD" -j "$JOBS" --target selfattn-bench
[ "$DRY_RUN" = 0 ] && [ "${BUILD_ALL:-1}" != 0 ] && step build-all 200 cmake --build "$BUILD" -j "$JOBS"
BENCH=$BUILD/bench/selfattn-bench
[ -x "$BENCH" ] || { echo "no $BENCH: see build-bench.log"; tail -40 "$LOGS/build-bench.log"; }

if [ "$DRY_RUN" = 1 ]; then
  # The sim parts: the bench's own ctests, the sim default sweep with --check, compare_torch's
  # graceful failure without torch, and the plot of the sim JSON.
  step bench-ctests 600 ctest --test-dir "$BUILD" -R '^bench\.' --output-on-failure
  step sim-sweep 300 "$BENCH" --backend sim --check --json "$OUTDIR/sim.json" --csv "$LOGS/sim.csv"
  python3 "$ROOT/bench/compare_torch.py" --json "$OUTDIR/torch.json" > "$LOGS/compare_torch.log" 2>&1
  echo "compare_torch (exit $?, 2 = no torch/GPU): $(tail -1 "$LOGS/compare_torch.log")" | tee -a "$SUMMARY"
  step plot 60 python3 "$ROOT/bench/plot" "$OUTDIR/sim.json" -o "$OUTDIR/throughput.png"
  TABLE_FROM=$LOGS/sim-sweep.log
else
  export SELFATTN_BACKEND=cuda
  step gpu-tests 90 ctest --test-dir "$BUILD" -L gpu --no-tests=error --output-on-failure --timeout 120
  SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
  if [ -n "$SANITIZER" ]; then
    # Small cases of each path: odd lengths, both head dims of the fused kernels, a causal mask.
    SMALL=(--backend cuda --path naive,cublas,fused --batch 1 --heads 2 --kv-heads 1 --seq-q 7,65 --seq-k 70
           --head-dim 64,128 --dtype bf16 --causal none,bottom_right --warmup 0 --iters 1 --no-ceilings --check)
    step memcheck 60 "$SANITIZER" --tool memcheck --error-exitcode 99 --print-limit 20 "$BENCH" "${SMALL[@]}"
    step racecheck 75 "$SANITIZER" --tool racecheck --racecheck-report hazard --error-exitcode 99 --print-limit 20 \
      "$BENCH" "${SMALL[@]}"
  else
    echo "compute-sanitizer: not found, memcheck/racecheck skipped" | tee -a "$SUMMARY"
  fi
  step sweep 150 "$BENCH" --backend cuda --check --json "$OUTDIR/bench.json" --csv "$LOGS/bench.csv"
  step compare-torch 90 python3 "$ROOT/bench/compare_torch.py" --from "$OUTDIR/bench.json" --json "$OUTDIR/torch.json"
  PLOT_INPUTS=("$OUTDIR/bench.json")
  [ -f "$OUTDIR/torch.json" ] && PLOT_INPUTS+=("$OUTDIR/torch.json")
  step plot 60 python3 "$ROOT/bench/plot" "${PLOT_INPUTS[@]}" -o "$OUTDIR/throughput.png"
  TABLE_FROM=$LOGS/sweep.log
fi

echo "total $(( $(date +%s) - START ))s" | tee -a "$SUMMARY"
{
  # The verdict lines of the test and sanitizer logs.
  [ -f "$LOGS/hopper-prims.log" ] && grep -h -E "^\[  (PASSED|FAILED|SKIPPED) \]|test suites? ran" "$LOGS/hopper-prims.log" |
    sed "s/^/hopper-prims: /" | head -20
  for log in bench-ctests gpu-tests; do
    [ -f "$LOGS/$log.log" ] && grep -h -E "tests passed|tests failed|No tests were found|\*\*\*Failed|\(Failed\)" \
      "$LOGS/$log.log" | sed "s/^/$log: /" | head -20
  done
  for log in memcheck racecheck; do
    [ -f "$LOGS/$log.log" ] && grep -h -E "ERROR SUMMARY|RACECHECK SUMMARY|Device not supported|cases ran" "$LOGS/$log.log" \
      | sed "s/^/$log: /" | head -5
  done
  echo
  # The bench's table (everything after its "selfattn-bench <version>" title line) and torch's.
  sed -n '/^selfattn-bench [0-9]/,$p' "$TABLE_FROM" 2>/dev/null
  [ -f "$LOGS/compare-torch.log" ] && { echo; sed -n '/^path /,$p' "$LOGS/compare-torch.log"; }
} >> "$SUMMARY"
tar -czf "$OUTDIR/logs.tar.gz" -C "$OUTDIR" logs && rm -rf "$LOGS"
echo
echo "==================== summary ($SUMMARY) ===================="
cat "$SUMMARY"
