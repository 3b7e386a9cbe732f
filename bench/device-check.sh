#!/usr/bin/env bash
# The whole GPU check of selfattn in one script, for a lent H200. The device image has the CUDA
# toolkit, CMake, ninja and a python3 with PyTorch, nanobind, scikit-build-core, NumPy, ml_dtypes and
# pytest; it has no Debian -dev packages, no .venv and no network. Everything the build needs beyond
# that travels in .deps, which --prepare makes here.
#
#   bench/device-check.sh --prepare             here: .deps/ gets CLI11, nlohmann/json, GoogleTest's
#                                               sources, the CUTLASS/CuTe headers (a tarball, from the
#                                               .venv's nvidia-cutlass) and the commit; carry .deps
#   bench/device-check.sh OUTDIR                on the device, in this order: configure and build
#                                               (sm_90a) from .deps alone; the Hopper primitives test;
#                                               one small forward per path against the reference;
#                                               the gpu tests; the default sweep --check; the Python
#                                               package (pip, against the built library) and its
#                                               CUDA tests; compare_torch.py (SDPA and the library's
#                                               torch op); compute-sanitizer memcheck + racecheck and
#                                               ncu counters where the runtime allows them, beside the
#                                               sim profiler's counts of the same cases; the plot
#   bench/device-check.sh --dry-run OUTDIR      here, under the device's conditions: a copy of what the
#                                               device tool sends (tracked and untracked files) plus
#                                               .deps, no .venv on PATH, /usr's packages ignored by
#                                               CMake; the same steps, on the sim where they need a GPU
#   bench/device-check.sh --configure-only DIR  here: --prepare into a copy of the tree in DIR and the
#                                               device's configure of it under those conditions
#                                               (ctest bench.device_kit_configure, label device-kit)
#
# On the device tool:  run(command="bench/device-check.sh $OUT", carry=[".deps"], timeout_s=560)
# The script budgets itself 480 s (BUDGET_S); a step that would start with under 15 s left is
# skipped and says so, and each step's verdict is in summary.txt as soon as it ends. OUTDIR then
# holds at most 8 files (what the tool brings back): summary.txt, hopper_primitives.log, bench.json,
# torch.json, throughput.png, ncu.csv, sim_profile.json and logs.tar.gz (every step's log, re-made
# after each step, so a run cut short still brings back what ran); a dry run writes sim.json
# instead of bench.json, and no hopper_primitives.log or ncu.csv.
# Knobs: BUILD_DIR (default build-device), JOBS, BUDGET_S, CUDA_ARCH (default 90a), DEVICE_PYTHON
# (default python3; the dry run: the .venv's, standing in for the device image's), KEEP_BUILD=1 (dry
# run: keep the copy's build folder between runs instead of starting clean).
set -u -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEPS=$ROOT/.deps
JOBS=${JOBS:-$(nproc)}
CUDA_ARCH=${CUDA_ARCH:-90a}

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

# The CUTLASS include folder (cute/, cutlass/) of the nvidia-cutlass wheel, as cmake/SelfattnCutlass.cmake finds it.
cutlass_include() {
  if [ -n "${SELFATTN_CUTLASS_INCLUDE:-}" ]; then echo "$SELFATTN_CUTLASS_INCLUDE"; return 0; fi
  local py dir
  for py in "$ROOT/.venv/bin/python3" python3; do
    dir=$("$py" -c "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source', 'include'))" 2>/dev/null) &&
      [ -f "$dir/cute/arch/mma_sm90_desc.hpp" ] && { echo "$dir"; return 0; }
  done
  return 1
}

# prepare DEST: everything the device build needs and the device image lacks.
prepare() {
  local dest=$1 cutlass
  rm -rf "$dest"
  mkdir -p "$dest/include"
  cp -r /usr/include/CLI "$dest/include/" || { echo "CLI11 headers missing: apt-get install libcli11-dev"; return 1; }
  cp -r /usr/include/nlohmann "$dest/include/" || { echo "nlohmann/json missing: apt-get install nlohmann-json3-dev"; return 1; }
  cp -r /usr/src/googletest "$dest/googletest" || { echo "GoogleTest sources missing: apt-get install googletest"; return 1; }
  cutlass=$(cutlass_include) || {
    echo "CUTLASS/CuTe headers not found: run scripts/setup-deps (nvidia-cutlass into .venv) or set SELFATTN_CUTLASS_INCLUDE"
    return 1; }
  # 27 MB of headers travel as a 2.4 MB tarball; the device unpacks it into its build folder.
  tar -czf "$dest/cutlass-include.tar.gz" -C "$cutlass" cute cutlass || return 1
  (git -C "$ROOT" rev-parse --short=12 HEAD 2>/dev/null || echo unknown) > "$dest/git-commit"
  if ! git -C "$ROOT" diff-index --quiet HEAD -- 2>/dev/null; then sed -i 's/$/-dirty/' "$dest/git-commit"; fi
  echo "prepared $dest ($(du -sh "$dest" | cut -f1)), commit $(cat "$dest/git-commit"), CUTLASS from $cutlass"
}

# copy_tree DEST: the files the device tool sends (tracked and untracked-but-not-ignored), nothing else.
copy_tree() {
  local dest=$1
  rm -rf "$dest" && mkdir -p "$dest" || return 1
  if ! git -C "$ROOT" rev-parse --git-dir > /dev/null 2>&1; then  # a tree without git: all but what .gitignore names
    tar -C "$ROOT" --exclude='./build*' --exclude=./.venv --exclude=./.deps --exclude=__pycache__ -cf - . |
      tar -C "$dest" -xpf -
    return
  fi
  git -C "$ROOT" ls-files -z --cached --others --exclude-standard |
    while IFS= read -r -d '' f; do [ -f "$ROOT/$f" ] && printf '%s\0' "$f"; done |
    tar -C "$ROOT" --null -T - -cf - | tar -C "$dest" -xpf -
}

# as_device MODE ARG: re-runs this script's copy in $TREE under the device's conditions: a fresh
# environment, PATH without the .venv (so no python with its packages), SELFATTN_DEVICE_CONDITIONS=1
# (the configure then ignores the /usr prefix, where this machine's -dev packages live).
as_device() {
  local mode=$1 arg=$2 path_clean
  path_clean=$(printf '%s' "$PATH" | tr ':' '\n' | grep -v -e '/\.venv' -e "^$ROOT" | paste -sd: -)
  exec env -i HOME="$HOME" PATH="$path_clean" LANG=C.UTF-8 TMPDIR="${TMPDIR:-/tmp}" \
    SELFATTN_DEVICE_CONDITIONS=1 JOBS="$JOBS" CUDA_ARCH="$CUDA_ARCH" ${BUDGET_S:+BUDGET_S=$BUDGET_S} \
    ${BUILD_DIR:+BUILD_DIR=$BUILD_DIR} DEVICE_PYTHON="${DEVICE_PYTHON:-$ROOT/.venv/bin/python3}" \
    bash "$TREE/bench/device-check.sh" "$mode" "$arg"
}

# The device's configure: every dependency named explicitly from .deps. Under the device's
# conditions here, CMake also ignores /usr, so a dependency .deps lacks fails here as it would there.
configure() {
  local build=$1
  mkdir -p "$build/_deps/cutlass"
  [ -f "$build/_deps/cutlass/cute/arch/mma_sm90_desc.hpp" ] ||
    tar -xzf "$DEPS/cutlass-include.tar.gz" -C "$build/_deps/cutlass" || return 1
  local extra=()
  [ "${SELFATTN_DEVICE_CONDITIONS:-0}" = 1 ] && extra+=(-DCMAKE_IGNORE_PREFIX_PATH=/usr)
  cmake -S "$ROOT" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH" \
    -DSELFATTN_CLI11_INCLUDE_DIR="$DEPS/include" -DSELFATTN_JSON_INCLUDE_DIR="$DEPS/include" \
    -DSELFATTN_GTEST_SOURCE_DIR="$DEPS/googletest" -DSELFATTN_CUTLASS_INCLUDE="$build/_deps/cutlass" \
    -DSELFATTN_BUILD_TESTS=ON -DSELFATTN_BUILD_PYTHON=OFF "${extra[@]}" 2>&1 | tee "$build/configure.out"
  [ "${PIPESTATUS[0]}" -eq 0 ] || return 1
  # The device is a Hopper GPU: a configure that leaves the wgmma kernels out checks the wrong kernel.
  case "$CUDA_ARCH" in *90a*)
    grep -q "selfattn: sm90a kernels ON" "$build/configure.out" || {
      echo "CUDA_ARCH=$CUDA_ARCH, but the configure left the Hopper (sm_90a) kernels out"; return 1; } ;;
  esac
  check_dependencies "$build"
}

# The configured build takes its dependencies from .deps (or what was unpacked from it) and nothing
# from a .venv: what would be missing on the device is missing here.
check_dependencies() {
  local cache=$1/CMakeCache.txt bad=0 name value
  for name in SELFATTN_CLI11_INCLUDE_DIR SELFATTN_JSON_INCLUDE_DIR SELFATTN_GTEST_SOURCE_DIR SELFATTN_CUTLASS_INCLUDE; do
    value=$(sed -n "s/^$name:[A-Z]*=//p" "$cache")
    case "$value" in
      "$DEPS"/*|"$1"/_deps/*) echo "dependency $name = $value" ;;
      *) echo "dependency $name = '$value' is not from .deps"; bad=1 ;;
    esac
  done
  if grep -n '/\.venv/' "$cache"; then echo "the configure found the lines above in a .venv, which the device has not"; bad=1; fi
  return $bad
}

MODE=device
case "${1:-}" in
  --prepare) prepare "$DEPS"; exit ;;
  --dry-run) MODE=dry; shift ;;
  --configure-only) MODE=configure; shift ;;
  -h|--help|"") usage; exit 0 ;;
  -*) echo "unknown option $1"; usage; exit 2 ;;
esac
[ $# -eq 1 ] || { usage; exit 2; }

if [ "$MODE" = configure ]; then
  WORK=$(mkdir -p "$1" && cd "$1" && pwd)
  if [ "${SELFATTN_DEVICE_CONDITIONS:-0}" != 1 ]; then
    TREE=$WORK/src
    copy_tree "$TREE" && prepare "$TREE/.deps" || exit 1
    as_device --configure-only "$WORK"
  fi
  rm -rf "$WORK/build"
  configure "$WORK/build"
  exit
fi

if [ "$MODE" = dry ] && [ "${SELFATTN_DEVICE_CONDITIONS:-0}" != 1 ]; then
  OUTDIR=$(mkdir -p "$1" && cd "$1" && pwd)
  [ -f "$DEPS/cutlass-include.tar.gz" ] || prepare "$DEPS" || exit 1
  TREE=$ROOT/build-device-dry/tree
  BUILD_DIR=${BUILD_DIR:-$ROOT/build-device-dry/build}
  [ "${KEEP_BUILD:-0}" = 1 ] || rm -rf "$BUILD_DIR"
  copy_tree "$TREE" && cp -r "$DEPS" "$TREE/.deps" || exit 1
  echo "dry run: the tree as the device tool sends it, in $TREE; build in $BUILD_DIR"
  as_device --dry-run "$OUTDIR"
fi

OUTDIR=$(mkdir -p "$1" && cd "$1" && pwd)
LOGS=$OUTDIR/logs
mkdir -p "$LOGS"
BUILD=${BUILD_DIR:-$ROOT/build-device}
PY=${DEVICE_PYTHON:-python3}
SUMMARY=$OUTDIR/summary.txt
: > "$SUMMARY"
START=$(date +%s)
BUDGET_S=${BUDGET_S:-480}
[ "$MODE" = dry ] && BUDGET_S=${BUDGET_S_DRY:-3000}
DEADLINE=$(( START + BUDGET_S ))
ON_GPU=1
[ "$MODE" = dry ] && ON_GPU=0
# compute-sanitizer and ncu need a runtime that lets them reach the GPU: Firecracker does, gVisor
# (kernel 4.4.0 in uname) does not ("Device not supported", "LibraryNotLoaded").
RUNTIME=$(uname -r)
case "$RUNTIME" in 4.4.0) RUNTIME="gVisor ($RUNTIME)" ;; *fc*) RUNTIME="Firecracker ($RUNTIME)" ;; esac
NO_TOOLS=""
case "$RUNTIME" in gVisor*) NO_TOOLS="not available on this runtime ($RUNTIME)" ;; esac
UNAVAILABLE_PATTERN='Device not supported|LibraryNotLoaded|ERR_NVGPUCTRPERM|not supported on this (device|platform)'

note() { printf '%-22s %s\n' "$1" "$2" | tee -a "$SUMMARY"; }

# step NAME TIMEOUT_S COMMAND...: runs COMMAND with its output in logs/NAME.log and records the
# verdict and time in summary.txt at once. A profiler or sanitizer that cannot reach the GPU on
# this runtime is "not available on this runtime", not FAILED.
step() {
  local name=$1 limit=$2; shift 2
  local t0 left rc verdict
  t0=$(date +%s)
  left=$(( DEADLINE - t0 ))
  if [ $left -lt 15 ]; then
    note "$name" "SKIPPED (time budget)"
    return 125
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== $name: $*" | tee -a "$LOGS/$name.log"
  # Through bash, so that a step may be one of this script's functions (exported below).
  timeout --kill-after=10 "$limit" bash -c '"$@"' "$name" "$@" >> "$LOGS/$name.log" 2>&1
  rc=$?
  verdict=ok
  if [ $rc -eq 124 ]; then verdict="TIMED OUT after ${limit}s"
  elif [ $rc -ne 0 ] && grep -qE "$UNAVAILABLE_PATTERN" "$LOGS/$name.log"; then
    verdict="not available on this runtime"
  elif [ $rc -ne 0 ]; then verdict="FAILED (exit $rc)"
  fi
  printf '%-22s %-30s %4ss\n' "$name" "$verdict" "$(( $(date +%s) - t0 ))" | tee -a "$SUMMARY"
  tar -czf "$OUTDIR/logs.tar.gz" -C "$OUTDIR" logs 2>/dev/null
  return $rc
}

[ -d "$DEPS/include/CLI" ] && [ -d "$DEPS/googletest" ] && [ -f "$DEPS/cutlass-include.tar.gz" ] || {
  echo "$DEPS is incomplete: run bench/device-check.sh --prepare here first, and carry .deps"; exit 1; }
echo "selfattn device check: commit $(cat "$DEPS/git-commit" 2>/dev/null), build $BUILD, $JOBS jobs," \
     "$([ $ON_GPU = 1 ] && echo "on the GPU" || echo "dry run (device conditions, sim)"), runtime $RUNTIME" | tee -a "$SUMMARY"
[ $ON_GPU = 1 ] && { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$SUMMARY"; }
echo "python: $PY ($("$PY" -c 'import sys, importlib.util as u; print(sys.version.split()[0], *[m for m in ("torch", "nanobind", "scikit_build_core", "numpy", "ml_dtypes", "pytest") if u.find_spec(m)])' 2>&1))" |
  tee -a "$SUMMARY"

export ROOT DEPS BUILD CUDA_ARCH
export -f configure check_dependencies
step configure 120 configure "$BUILD" || { tail -30 "$LOGS/configure.log"; }
BENCH=$BUILD/bench/selfattn-bench
BACKEND=cuda
[ $ON_GPU = 1 ] || BACKEND=sim

# First what decides whether the rest is worth running: the Hopper primitives (TMA, wgmma SS/RS,
# the mbarrier ring, each against mma.sync on the same data), then one small forward per path
# against the double reference. Building both targets builds the library.
step build-first 300 cmake --build "$BUILD" -j "$JOBS" --target test_hopper_primitives_gpu selfattn-bench
HOPPER_TEST=$BUILD/tests/primitives/test_hopper_primitives_gpu
if [ $ON_GPU = 1 ]; then
  if [ -x "$HOPPER_TEST" ]; then
    step hopper-prims 60 "$HOPPER_TEST" --gtest_color=no
  else
    note hopper-prims "no $HOPPER_TEST (see build-first.log)"
  fi
  cp "$LOGS/hopper-prims.log" "$OUTDIR/hopper_primitives.log" 2>/dev/null ||
    cp "$LOGS/build-first.log" "$OUTDIR/hopper_primitives.log" 2>/dev/null
else
  note hopper-prims "GPU only (built: $([ -x "$HOPPER_TEST" ] && echo yes || echo NO))"
fi
# Odd lengths, both head dims of the fused kernels (the Hopper kernel for bf16 d64/d128 on 9.0), a causal mask.
SMALL=(--backend "$BACKEND" --path naive,cublas,fused --batch 1 --heads 2 --kv-heads 1 --seq-q 7,65 --seq-k 70
       --head-dim 64,128 --dtype bf16 --causal none,bottom_right --warmup 0 --iters 1 --no-ceilings --check)
step smoke 60 "$BENCH" "${SMALL[@]}"

# The gpu-labelled tests: the programs registered for the GPU (target selfattn_gpu_tests: the sim
# tests' `.gpu` registrations and the GPU-only programs); on the sim each skips with its reason.
step build-gpu-tests 240 cmake --build "$BUILD" -j "$JOBS" --target selfattn_gpu_tests
step gpu-tests 150 ctest --test-dir "$BUILD" -L gpu -j 4 --no-tests=error --output-on-failure --timeout 120

if [ $ON_GPU = 1 ]; then
  step sweep 150 "$BENCH" --backend cuda --check --json "$OUTDIR/bench.json" --csv "$LOGS/bench.csv"
  TABLE_FROM=$LOGS/sweep.log
  # FP8 forward (issue 37; bench/NOTES.md, "FP8 forward on Hopper"): e4m3 beside bf16 on the same
  # shapes in one run, d128 and d256, checked at a small size first.
  step fp8-smoke 60 "$BENCH" --backend cuda --path fused --batch 1 --heads 2 --seq-q 7,300 --head-dim 128,256 \
    --dtype e4m3 --causal none,bottom_right --direction fwd --warmup 0 --iters 1 --no-ceilings --check
  step fp8-sweep 120 "$BENCH" --backend cuda --path fused --batch 2 --heads 16 --seq-q 4096,8192 \
    --head-dim 128,256 --dtype e4m3,bf16 --causal none,bottom_right --direction fwd --json "$OUTDIR/bench_fp8.json"
  # MLA's prefill pair (issue 48; bench/NOTES.md, "MLA prefill"): q, k of 192 and v of 128 on the
  # fused path (the Hopper kernel, and the mma.sync kernel every other GPU runs) beside cublas, and
  # the fused backward, checked; the NOTES' prediction counts 2 b h (192 + 128) FLOPs per visible
  # pair in the forward, as the bench does.
  step mla-sweep 120 "$BENCH" --backend cuda --path fused,cublas --batch 2 --heads 16 --seq-q 4096,8192 \
    --head-dim 192 --head-dim-v 128 --dtype bf16 --causal none,bottom_right --direction fwd,bwd \
    --fused-kernel auto,mma.sync --check --json "$LOGS/bench_mla.json"
  # MLA's absorbed decode (issue 48; bench/NOTES.md, "MLA decode"): the latent kernel at 128 heads
  # (tensor work) and at 16 (a tensor-parallel shard: bytes), bf16 and an e4m3 cache, checked,
  # beside the copy ceiling of the same run.
  step mla-decode-128 60 "$BENCH" --backend cuda --mode decode --mla --path fused --heads 128 --batch 8,64 \
    --cache-len 4096 --check --json "$LOGS/bench_mla_decode_128.json"
  step mla-decode-16 45 "$BENCH" --backend cuda --mode decode --mla --path fused --heads 16 --batch 64 \
    --cache-len 16384 --check --json "$LOGS/bench_mla_decode_16.json"
  step mla-decode-fp8 45 "$BENCH" --backend cuda --mode decode --mla --path fused --heads 16 --batch 64 \
    --cache-len 16384 --kv-dtype e4m3 --check --json "$LOGS/bench_mla_decode_fp8.json"
else
  step sim-sweep 300 "$BENCH" --backend sim --check --json "$OUTDIR/sim.json" --csv "$LOGS/sim.csv"
  TABLE_FROM=$LOGS/sim-sweep.log
fi

# The sim profiler's counts (issue 35; bench/README.md, "Profile") of one small case per kernel family,
# the cases ncu profiles on the GPU below, so the first GPU run says where the model and the hardware
# differ: the same shapes on both sides, so each launch's grid, sectors, wavefronts and DRAM bytes
# compare one to one. The per-tile pattern is the target shapes' (full 128-row / 128-key tiles of the
# Hopper forward, GQA 32/8 decode with 16-token pages); only the tile count is smaller.
profile_args() {
  case $1 in
    fwd) echo --path fused --batch 1 --heads 2 --seq-q 512 --head-dim 128 --dtype bf16 --causal none --direction fwd ;;
    bwd) echo --path fused --batch 1 --heads 2 --seq-q 512 --head-dim 128 --dtype bf16 --causal none --direction bwd ;;
    decode) echo --mode decode --path fused --batch 2 --heads 32 --kv-heads 8 --head-dim 128 --cache-len 1024 \
              --page-size 16 --dtype bf16 ;;
  esac
}
# The three profiles in one JSON (sim_profile.json: the bench's schema, the cases of the three runs).
sim_profile() {
  local family
  for family in fwd bwd decode; do
    # shellcheck disable=SC2046  # profile_args's words are the bench's arguments
    SELFATTN_SIM_RACECHECK=0 "$BENCH" --backend sim --profile --warmup 0 --iters 1 $(profile_args $family) \
      --json "$LOGS/sim_profile_$family.json" || return 1
  done
  "$PY" - "$OUTDIR/sim_profile.json" "$LOGS"/sim_profile_{fwd,bwd,decode}.json <<'MERGE'
import json, sys
runs = [json.load(open(name)) for name in sys.argv[2:]]
merged = runs[0]
merged["header"]["command_line"] = " ; ".join(run["header"]["command_line"] for run in runs)
merged["cases"] = [case for run in runs for case in run["cases"]]
json.dump(merged, open(sys.argv[1], "w"), indent=1)
MERGE
}
export BENCH LOGS OUTDIR PY
export -f profile_args sim_profile
step sim-profile 60 sim_profile

# The Python package as a user on the device would install it: pip, no build isolation (the image
# has scikit-build-core and nanobind), the module built against the library built above.
python_package() {
  local prefix=$BUILD/_install site=$BUILD/_python_site config
  # nanobind compiles against Python.h: a python without its headers cannot build the module.
  "$PY" -c "import os, sys, sysconfig; d = sysconfig.get_paths()['include']; os.path.exists(os.path.join(d, 'Python.h')) or sys.exit(f'{sys.executable} has no Python.h in {d}: the package cannot be built with it')" ||
    return 1
  cmake --install "$BUILD" --component library --prefix "$prefix" || return 1
  config=$(find "$prefix" -name selfattnConfig.cmake | head -1)
  rm -rf "$site"
  "$PY" -m pip install --no-build-isolation --no-deps --no-index --no-cache-dir --disable-pip-version-check \
    --target "$site" --config-settings=cmake.source-dir=python \
    --config-settings=cmake.define.selfattn_DIR="$(dirname "$config")" \
    --config-settings=build-dir="$BUILD/_python_build" "$ROOT"
}
# The tests marked device_check (tests/README.md): the torch ops forward and backward, the KV cache,
# DLPack zero-copy, torch.compile; on CUDA tensors on the GPU, on CPU tensors (the sim) in a dry run.
python_tests() {
  local marks="device_check and gpu"
  [ $ON_GPU = 1 ] || marks="device_check and not gpu"
  cd "$ROOT/python/tests" &&
    PYTHONPATH=$BUILD/_python_site PYTHONDONTWRITEBYTECODE=1 "$PY" -m pytest -q -p no:cacheprovider -m "$marks" -rs .
}
export PY ON_GPU
export -f python_package python_tests

# ncu's counters of the sim-profile step's cases (one per kernel family), clocks left alone, caches
# flushed before each kernel (ncu's default), so DRAM bytes are a cold launch's, as the sim's lower
# bound assumes. Each launch of the family's kernels in the bench's two calls (the checked one and
# the timed one). The sim's counts and their ncu names: global requests / sectors (ld, st and
# cp.async's ldgsts), shared wavefronts and bank conflicts (ld, st; ldmatrix is an ld), tensor
# instructions (hmma: mma.sync per warp; gmma: wgmma, per warp of the warpgroup), MUFU (the xu pipe,
# per warp: the sim counts per thread), DRAM bytes read and written. ncu.csv holds the three CSVs,
# each after a "# family" line naming its command.
NCU_METRICS=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,\
l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,\
l1tex__t_requests_pipe_lsu_mem_global_op_st.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum,\
l1tex__t_requests_pipe_lsu_mem_global_op_ldgsts.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts.sum,\
l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,\
l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,\
l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,\
smsp__inst_executed_op_ldsm.sum,sm__inst_executed_pipe_tensor_op_hmma.sum,sm__inst_executed_pipe_tensor_op_gmma.sum,\
sm__inst_executed_pipe_xu.sum
ncu_families() {
  local family kernels rc=0
  : > "$OUTDIR/ncu.csv"
  for family in fwd bwd decode; do
    case $family in
      fwd) kernels='regex:flash_fwd' ;;
      bwd) kernels='regex:flash_bwd|backward_dot|store_gradient' ;;  # not the forwards that make its inputs
      decode) kernels='regex:decode' ;;
    esac
    echo "# family $family: selfattn-bench --backend cuda $(profile_args $family) --warmup 0 --iters 1 --no-ceilings" |
      tee -a "$OUTDIR/ncu.csv"
    # shellcheck disable=SC2046
    "$NCU" --clock-control none --csv --page raw --metrics "$NCU_METRICS" --kernel-name "$kernels" --launch-count 8 \
      --log-file "$LOGS/ncu_$family.csv" "$BENCH" --backend cuda $(profile_args $family) --warmup 0 --iters 1 \
      --no-ceilings || rc=1
    cat "$LOGS/ncu_$family.csv"  # into the step's log too, where an unavailable profiler is recognised
    cat "$LOGS/ncu_$family.csv" >> "$OUTDIR/ncu.csv"
  done
  return $rc
}
export NCU_METRICS
export -f ncu_families
PYTHON_OK=0
step python-package 180 python_package && PYTHON_OK=1
[ $PYTHON_OK = 1 ] && step python-tests 120 python_tests

if [ $ON_GPU = 1 ]; then
  # SDPA's backends beside the library through its torch op (selfattn.attention on torch tensors).
  COMPARE_PATHS=()
  [ $PYTHON_OK = 1 ] && COMPARE_PATHS=(--paths auto,fused)
  export PYTHONPATH=$BUILD/_python_site
  step compare-torch 90 "$PY" "$ROOT/bench/compare_torch.py" --from "$OUTDIR/bench.json" \
    --json "$OUTDIR/torch.json" "${COMPARE_PATHS[@]}"
  SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || true)
  export NCU
  if [ -n "$NO_TOOLS" ]; then
    note "memcheck, racecheck" "$NO_TOOLS"
    note ncu "$NO_TOOLS"
  else
    if [ -n "$SANITIZER" ]; then
      step memcheck 60 "$SANITIZER" --tool memcheck --error-exitcode 99 --print-limit 20 "$BENCH" "${SMALL[@]}"
      step racecheck 75 "$SANITIZER" --tool racecheck --racecheck-report hazard --error-exitcode 99 --print-limit 20 \
        "$BENCH" "${SMALL[@]}"
    else
      note "memcheck, racecheck" "compute-sanitizer not found"
    fi
    if [ -n "$NCU" ]; then
      step ncu 90 ncu_families
    else
      note ncu "ncu not found"
    fi
  fi
  PLOT_INPUTS=("$OUTDIR/bench.json")
  [ -f "$OUTDIR/torch.json" ] && PLOT_INPUTS+=("$OUTDIR/torch.json")
else
  # Without a GPU compare_torch.py says so and exits 2; what matters here is that it starts.
  export PYTHONPATH=$BUILD/_python_site
  "$PY" "$ROOT/bench/compare_torch.py" --json "$OUTDIR/torch.json" > "$LOGS/compare_torch.log" 2>&1
  note compare-torch "exit $? (2 = no GPU): $(tail -1 "$LOGS/compare_torch.log")"
  PLOT_INPUTS=("$OUTDIR/sim.json")
fi
if "$PY" -c "import matplotlib" 2>/dev/null; then
  step plot 60 "$PY" "$ROOT/bench/plot" "${PLOT_INPUTS[@]}" -o "$OUTDIR/throughput.png"
else
  note plot "matplotlib is not in $PY (the device image has it)"
fi

echo "total $(( $(date +%s) - START ))s" | tee -a "$SUMMARY"
{
  # The verdict lines of the test and sanitizer logs.
  [ -f "$LOGS/hopper-prims.log" ] && grep -h -E "^\[  (PASSED|FAILED|SKIPPED) \]|test suites? ran" "$LOGS/hopper-prims.log" |
    sed "s/^/hopper-prims: /" | head -20
  for log in smoke; do
    [ -f "$LOGS/$log.log" ] && grep -h -E "cases ran|FAILED|error" "$LOGS/$log.log" | sed "s/^/$log: /" | head -10
  done
  for log in gpu-tests; do
    [ -f "$LOGS/$log.log" ] && grep -h -E "tests passed|tests failed|No tests were found|\*\*\*Failed|\(Failed\)" \
      "$LOGS/$log.log" | sed "s/^/$log: /" | head -20
  done
  [ -f "$LOGS/python-tests.log" ] && grep -h -E "passed|failed|error" "$LOGS/python-tests.log" | tail -5 | sed "s/^/python-tests: /"
  # The sim profiler's per-case totals (its tables are in logs/sim-profile.log and sim_profile.json).
  [ -f "$LOGS/sim-profile.log" ] && grep -h -E "^profile: |^  total: " "$LOGS/sim-profile.log" | sed "s/^/sim-profile: /"
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
