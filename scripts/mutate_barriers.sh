#!/usr/bin/env bash
# Barrier mutation test: removes each `__syncthreads();` statement of the kernels in turn, rebuilds
# the sim tests and runs them, and reports which mutants the tests catch (and how: the racecheck's
# hazard class, or another failure). Every barrier should be caught; one that is not is either
# redundant or untested. Not part of CI: it rebuilds once per mutant (about a minute each on two
# cores, plus the sim tests).
#
#   scripts/mutate_barriers.sh [build-dir]     (default: build-mutants, beside the source)
#   scripts/mutate_barriers.sh build-mutants kernels/hopper/flash_fwd_hopper_pipeline.cuh ...
#                                              only the barriers of these files (or FILE:LINE sites)
#   MUTATE_CTEST_REGEX='FusedHopper' scripts/mutate_barriers.sh ...
#                                              only the sim tests ctest -R selects (default: every one)
#
# The mutants share one build directory of their own (configured without the CUDA backend: only the
# sim runs), so each rebuild recompiles just what includes the mutated file. The source is restored
# after each mutant, and on any exit (a trap), so an interrupted run leaves kernels/ as it found it.
set -euo pipefail

root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
cd "$root"
build=${1:-build-mutants}
only=("${@:2}")
jobs=${JOBS:-2}

if ! git diff --quiet -- kernels; then
  echo "mutate_barriers.sh: kernels/ has uncommitted changes; commit or stash them first" >&2
  exit 1
fi

# Barrier statements: lines of kernels/ (not kernels/common, which defines the name) that start with
# the call.
mapfile -t sites < <(grep -rn -E '^[[:space:]]*__syncthreads\(\);' kernels --include='*.cuh' --include='*.h' \
  --include='*.cu' | grep -v '^kernels/common/' | cut -d: -f1,2)
if [ ${#only[@]} -gt 0 ]; then
  chosen=()
  for site in "${sites[@]}"; do
    for want in "${only[@]}"; do
      if [ "$site" = "$want" ] || [ "${site%%:*}" = "$want" ]; then chosen+=("$site"); break; fi
    done
  done
  sites=(${chosen[@]+"${chosen[@]}"})
fi
if [ ${#sites[@]} -eq 0 ]; then
  echo "mutate_barriers.sh: no __syncthreads(); statements found in kernels/${only[*]:+ (among ${only[*]})}" >&2
  exit 1
fi

mutated=""
restore() {
  if [ -n "$mutated" ]; then
    git checkout --quiet -- "$mutated"
    mutated=""
  fi
}
trap restore EXIT INT TERM

mkdir -p "$build"
cmake -S . -B "$build" -G Ninja -DSELFATTN_ENABLE_CUDA=OFF -DSELFATTN_BUILD_BENCH=OFF -DSELFATTN_BUILD_DEMO=OFF -DSELFATTN_BUILD_PYTHON=OFF \
  > "$build/configure.log" 2>&1 || { cat "$build/configure.log"; exit 1; }

results=()
for site in "${sites[@]}"; do
  file=${site%%:*}
  line=${site##*:}
  code=$(sed -n "${line}p" "$file" | sed -E 's/^[[:space:]]+//')
  mutated=$file
  sed -i "${line}s|__syncthreads();|/* __syncthreads(); removed by mutate_barriers.sh */|" "$file"
  echo "== mutant: $file:$line: $code" >&2
  if ! cmake --build "$build" -j"$jobs" > "$build/mutant.build.log" 2>&1; then
    restore
    results+=("| \`$file:$line\` | \`$code\` | build failed | see $build/mutant.build.log |")
    continue
  fi
  log="$build/mutant.test.log"
  if ctest --test-dir "$build" -L sim ${MUTATE_CTEST_REGEX:+-R "$MUTATE_CTEST_REGEX"} -j"$jobs" --output-on-failure \
    > "$log" 2>&1; then
    verdict="**not caught**"
    how="every sim test passes"
  else
    failed=$(grep -cE '^[[:space:]]*[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess aborted|Exception)\)' "$log" || true)
    verdict="caught"
    # The racecheck's reports, most frequent first: "write after read, read after write".
    hazards=$(grep -oE 'shared-memory hazard \([a-z. ]+\)|global-memory write conflict' "$log" |
      sed -E 's/shared-memory hazard \((.*)\)/\1/' | sort | uniq -c | sort -rn | sed -E 's/^ *[0-9]+ //' |
      paste -sd, - | sed 's/,/, /g')
    how="$failed tests fail (${hazards:+racecheck: }${hazards:-no racecheck report: wrong values})"
  fi
  restore
  results+=("| \`$file:$line\` | \`$code\` | $verdict | $how |")
  echo "   $verdict: $how" >&2
done

echo
echo "| barrier removed | statement | result | how |"
echo "| --- | --- | --- | --- |"
printf '%s\n' "${results[@]}"
