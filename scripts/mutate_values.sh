#!/usr/bin/env bash
# A check of the test judge itself (tests/README.md): plants small wrong-value bugs in the kernels
# (and, at the end of the list, access-pattern regressions only the profiler's tests can see), one
# at a time, rebuilds the sim tests that run them, runs them under both scheduler seeds, and
# reports which mutants the tests catch. Every mutant must be caught; one that is not is a hole
# in the judge or a missing test case (tighten the judge or add the case, never special-case the
# mutant).
#
#   scripts/mutate_values.sh            every mutant (rebuilds once per mutant: about an hour on 2 cores)
#   scripts/mutate_values.sh NAME...    only these
#   scripts/mutate_values.sh --list     the mutants
#   scripts/mutate_values.sh --check    only that each mutant's text is still in its file (no build)
#
# Not in CI. It builds in its own directory (MUTATE_BUILD_DIR, default build-mutants; sim only, no
# nvcc), edits kernels/ in place and restores every file it touched on exit, failure or Ctrl-C.
# A mutant must change the compiled library (checked by its hash): a change compiled out counts
# as an error, not as caught. Prints a markdown table (also written to BUILD/mutants.md).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${MUTATE_BUILD_DIR:-$root/build-mutants}
seeds=(1 2)
# The test programs each mutant runs (MUTATE_TESTS, space-separated, to choose others).
read -r -a test_programs <<<"${MUTATE_TESTS:-tests/forward/test_fused tests/forward/test_fused_varlen tests/forward/test_fused_varlen_metadata tests/forward/test_score_paths tests/forward/test_score_mods tests/forward/test_score_mods_window_reads tests/validation/test_score_mods_arguments tests/kv_cache/test_kv_cache tests/kv_cache/test_kv_cache_varlen tests/kv_cache/test_kv_cache_fp8 tests/backward/test_backward_naive tests/backward/test_backward_fused tests/forward/test_fused_access_pattern tests/backward/test_backward_access_pattern tests/kv_cache/test_decode_access_pattern tests/forward/test_sequence_offsets tests/forward/test_dropout tests/forward/test_probabilities tests/backward/test_backward_dropout tests/primitives/test_philox tests/forward/test_fp8_forward tests/forward/test_fused_hopper_fp8 tests/kv_cache/test_kv_cache_append tests/kv_cache/test_kv_cache_edges tests/kv_cache/test_kv_cache_varlen_append tests/validation/test_kv_cache_arguments tests/sim/test_sim_profile_memory tests/sim/test_sim_profile_compute tests/forward/test_head_dims tests/backward/test_backward_head_dims tests/kv_cache/test_kv_cache_head_dims}"

# ---- The mutants: name, file, expected occurrences of the text, text, replacement.
names=() files=() counts=() froms=() tos=() whys=()
mutant() {
  names+=("$1") files+=("$2") counts+=("$3") froms+=("$4") tos+=("$5") whys+=("$6")
}

# The catalog: scripts/mutate_values_catalog.sh.
source "$root/scripts/mutate_values_catalog.sh"

# Fails unless file $1 holds text $3 exactly $2 times (the kernels moved on: update the mutant).
check_mutant() {
  local file=$1 count=$2 from=$3 content
  content=$(<"$root/$file")
  local without=${content//"$from"/}
  local found=$(((${#content} - ${#without}) / ${#from}))
  if ((found != count)); then
    echo "mutant text found $found times in $file, expected $count: $from" >&2
    return 1
  fi
}

# --check: every mutant's text is where the catalog says, as many times (ctest's
# mutants.catalog_current runs it, so a moved or rewritten line is caught when it moves).
if [[ ${1:-} == --check ]]; then
  stale=0
  for i in "${!names[@]}"; do
    check_mutant "${files[$i]}" "${counts[$i]}" "${froms[$i]}" 2>/dev/null ||
      { echo "stale mutant ${names[$i]}: $(check_mutant "${files[$i]}" "${counts[$i]}" "${froms[$i]}" 2>&1)"; stale=1; }
  done
  ((stale == 0)) && echo "${#names[@]} mutants, each text where the catalog says"
  exit $stale
fi
if [[ ${1:-} == --list ]]; then
  for i in "${!names[@]}"; do printf '%-36s %-28s %s\n' "${names[$i]}" "${files[$i]}" "${whys[$i]}"; done
  exit 0
fi
selected=("$@")

# ---- Restore whatever is mutated, however the script ends.
backup_dir=$(mktemp -d)
mutated_file=""
restore() {
  if [[ -n $mutated_file ]]; then
    cp "$backup_dir/original" "$root/$mutated_file"
    mutated_file=""
  fi
}
trap 'restore; rm -rf "$backup_dir"' EXIT
trap 'restore; exit 130' INT TERM

# Replaces every occurrence of $3 in file $1 by $4, keeping the original for restore().
apply_mutant() {
  local file=$1 from=$3 to=$4 content
  content=$(<"$root/$file")
  cp "$root/$file" "$backup_dir/original"
  mutated_file=$file
  printf '%s\n' "${content//"$from"/"$to"}" >"$root/$file"
}

library_hash() { sha256sum "$build"/host/libselfattn.so.*.*.* | cut -d' ' -f1; }

build_tests() {
  cmake --build "$build" -j2 --target "${test_programs[@]##*/}" >"$build/mutant_build.log" 2>&1
}

# Runs every test program under every seed; prints the failing tests (empty: all passed).
run_tests() {
  local failures="" seed program log
  for seed in "${seeds[@]}"; do
    for program in "${test_programs[@]}"; do
      log="$build/mutant_test.log"
      if ! SELFATTN_BACKEND=sim SELFATTN_SIM_SEED=$seed timeout 900 "$build/$program" --gtest_brief=1 >"$log" 2>&1; then
        # gtest's summary lists each failed test once: "[  FAILED  ] Suite.Name".
        local failed count
        failed=$(grep -o '^\[  FAILED  \] [A-Za-z0-9_./]*' "$log" | sed 's/^\[  FAILED  \] //' | sort -u)
        count=$(grep -c . <<<"$failed" || true)
        if [[ -z $failed ]]; then
          failures+="${program##*/} crashed (seed $seed); "
        elif ((count > 2)); then
          failures+="$(head -2 <<<"$failed" | paste -sd, | sed 's/,/, /') and $((count - 2)) more (seed $seed); "
        else
          failures+="$(paste -sd, <<<"$failed" | sed 's/,/, /') (seed $seed); "
        fi
      fi
    done
    [[ -n $failures ]] && break  # caught: the second seed adds nothing
  done
  printf '%s' "$failures"
}

is_selected() { ((${#selected[@]} == 0)) || [[ " ${selected[*]} " == *" $1 "* ]]; }
for i in "${!names[@]}"; do
  if is_selected "${names[$i]}"; then check_mutant "${files[$i]}" "${counts[$i]}" "${froms[$i]}"; fi
done

mkdir -p "$build"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSELFATTN_ENABLE_CUDA=OFF \
  -DSELFATTN_BUILD_BENCH=OFF -DSELFATTN_BUILD_DEMO=OFF -DSELFATTN_BUILD_PYTHON=OFF >"$build/mutant_configure.log" 2>&1 ||
  { cat "$build/mutant_configure.log"; exit 1; }
echo "baseline: building and running the unmutated tests..." >&2
build_tests || { cat "$build/mutant_build.log"; exit 1; }
baseline_hash=$(library_hash)
baseline_failures=$(run_tests)
if [[ -n $baseline_failures ]]; then
  echo "the unmutated tests fail: $baseline_failures" >&2
  exit 1
fi

table="| mutant | file | wrong value planted | caught by |
|---|---|---|---|"
missed=0
for i in "${!names[@]}"; do
  name=${names[$i]}
  is_selected "$name" || continue
  echo "mutant $name..." >&2
  apply_mutant "${files[$i]}" "${counts[$i]}" "${froms[$i]}" "${tos[$i]}"
  if ! build_tests; then
    verdict="ERROR: does not build (see $build/mutant_build.log)"
    missed=$((missed + 1))
  elif [[ $(library_hash) == "$baseline_hash" ]]; then
    verdict="ERROR: compiled out (the library did not change)"
    missed=$((missed + 1))
  else
    failures=$(run_tests)
    if [[ -n $failures ]]; then
      verdict=${failures%; }
    else
      verdict="**NOT CAUGHT**"
      missed=$((missed + 1))
    fi
  fi
  restore
  echo "  $verdict" >&2
  table+="
| \`$name\` | ${files[$i]#kernels/} | ${whys[$i]} | $verdict |"
done

# Leave the build matching the sources again.
build_tests || true
printf '%s\n' "$table" | tee "$build/mutants.md"
if ((missed)); then
  echo "$missed mutant(s) not caught" >&2
  exit 1
fi
