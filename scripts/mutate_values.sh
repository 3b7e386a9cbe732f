#!/usr/bin/env bash
# A check of the test judge itself (tests/README.md): plants small wrong-value bugs in the kernels,
# one at a time, rebuilds the sim tests that run them, runs them under both scheduler seeds, and
# reports which mutants the tests catch. Every mutant must be caught; one that is not is a hole
# in the judge or a missing test case (tighten the judge or add the case, never special-case the
# mutant).
#
#   scripts/mutate_values.sh            every mutant (rebuilds once per mutant: about an hour on 2 cores)
#   scripts/mutate_values.sh NAME...    only these
#   scripts/mutate_values.sh --list     the mutants
#
# Not in CI. It builds in its own directory (MUTATE_BUILD_DIR, default build-mutants; sim only, no
# nvcc), edits kernels/ in place and restores every file it touched on exit, failure or Ctrl-C.
# A mutant must change the compiled library (checked by its hash): a change compiled out counts
# as an error, not as caught. Prints a markdown table (also written to BUILD/mutants.md).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${MUTATE_BUILD_DIR:-$root/build-mutants}
seeds=(1 2)
test_programs=(tests/paths/test_fused tests/paths/test_fused_varlen tests/paths/test_score_paths)

# ---- The mutants: name, file, expected occurrences of the text, text, replacement.
names=() files=() counts=() froms=() tos=() whys=()
mutant() {
  names+=("$1") files+=("$2") counts+=("$3") froms+=("$4") tos+=("$5") whys+=("$6")
}

# Fused tensor-core kernel (f16/bf16).
mutant tc_lse_ln2_fifth_digit kernels/forward/flash_fwd.cuh 1 \
  '* 0.69314718055994531f : -INFINITY;' '* 0.6931f : -INFINITY;' \
  'LSE converted with ln 2 = 0.6931 (7e-5 relative)'
mutant tc_rescale_skipped_near_1 kernels/forward/flash_fwd.cuh 1 \
  'if (rescale != 1.0f) {' 'if (rescale < 0.999f) {' \
  'O not rescaled when the running max grows by under 0.1%'
mutant tc_mask_one_key_late kernels/forward/flash_fwd.cuh 1 \
  's = needs_mask && key >= visible[mt][half] ?' 's = needs_mask && key > visible[mt][half] ?' \
  'masked tiles let each row see one key too many'
mutant tc_scale_twice_in_tile_1 kernels/forward/flash_fwd.cuh 1 \
  ': s * p.scale_log2;' ': s * p.scale_log2 * (tile == 1 ? p.scale_log2 : 1.0f);' \
  'the scale applied twice in the second key tile'
mutant tc_block_rows_clamp kernels/forward/flash_fwd.cuh 1 \
  '? seq.q_len - block_row0 : Traits::kBlockRows;' '? seq.q_len - block_row0 - 1 : Traits::kBlockRows;' \
  'the last partial query block loses its last row (clamp off by one)'
mutant tc_unmasked_keys_off_by_one kernels/forward/flash_fwd.cuh 1 \
  'const int unmasked_keys = visible_keys(block_row0,' 'const int unmasked_keys = visible_keys(block_row0 + 1,' \
  'a tile the first row sees only in part taken as unmasked'

# Fused SIMT kernel (fp32, odd head dims, unaligned rows).
mutant simt_lse_ln2_fifth_digit kernels/forward/flash_fwd_simt.cuh 1 \
  '* 0.69314718055994531f : -INFINITY;' '* 0.69315f : -INFINITY;' \
  'LSE converted with ln 2 = 0.69315 (4e-6 relative)'
mutant simt_rescale_skipped_near_1 kernels/forward/flash_fwd_simt.cuh 1 \
  'for (int c = 0; c < C; ++c) acc[r][c] *= rescale;' \
  'for (int c = 0; c < C; ++c) acc[r][c] *= rescale < 0.999f ? rescale : 1.0f;' \
  'O not rescaled when the running max grows by under 0.1%'
mutant simt_mask_one_key_late kernels/forward/flash_fwd_simt.cuh 1 \
  'key0 + lane < visible[r] ?' 'key0 + lane <= visible[r] ?' \
  'each row sees one key too many'
mutant simt_scale_fifth_digit kernels/forward/flash_fwd_simt.cuh 1 \
  'score[r] * p.scale_log2 :' 'score[r] * p.scale_log2 * 1.00001f :' \
  'scores scaled 1e-5 too much'

# Softmax rows (naive and cublas paths).
mutant softmax_inverse_fifth_digit kernels/unfused/softmax_rows.cuh 2 \
  'visible > 0 ? 1.0f / row_sum : 0.0f;' 'visible > 0 ? 1.00001f / row_sum : 0.0f;' \
  'P normalised by 1.00001 / sum'
mutant softmax_lse_fifth_digit kernels/unfused/softmax_rows.cuh 1 \
  'row_max + logf(row_sum)' 'row_max + logf(row_sum * 1.00001f)' \
  'LSE off by 1e-5'
mutant softmax_mask_one_key_early kernels/unfused/softmax_rows.cuh 1 \
  'x[c] = key < visible ? s[key] * p.scale : -INFINITY;' 'x[c] = key + 1 < visible ? s[key] * p.scale : -INFINITY;' \
  'short rows (cached) drop their last visible key'
mutant softmax_streaming_rescale_skipped kernels/unfused/softmax_rows.cuh 1 \
  'thread_sum = thread_sum * exp_below(thread_max, new_max) + expf(x - new_max);' \
  'thread_sum = (new_max - thread_max < 0.001f ? thread_sum : thread_sum * exp_below(thread_max, new_max)) + expf(x - new_max);' \
  'long rows: a thread'"'"'s sum not rescaled when its max grows by under 0.001'

# Tiled Q K^T and P V (naive path).
mutant qk_skips_tile_with_one_key kernels/unfused/qk_tiled.cuh 2 \
  'if (key0 >= tile_visible_keys(p, at.batch, row0, Tile::kTileM)) return;' \
  'if (key0 + 1 >= tile_visible_keys(p, at.batch, row0, Tile::kTileM)) return;' \
  'a key tile whose only visible key is its first is skipped (scores left stale)'
mutant pv_key_end_clamp kernels/unfused/pv_tiled.cuh 2 \
  'const int key_end = tile_visible_keys(p, at.batch, row0, Tile::kTileM);' \
  'const int key_end = tile_visible_keys(p, at.batch, row0, Tile::kTileM) - 1;' \
  'P V stops one key short for every row tile'
mutant tile_last_row_clamp kernels/common/attention_heads.cuh 1 \
  '(row0 + tile_rows < p.rows ? row0 + tile_rows : p.rows) - 1;' \
  '(row0 + tile_rows < p.rows ? row0 + tile_rows : p.rows) - 2;' \
  'a row tile'"'"'s keys taken from its second-to-last row (clamp off by one)'
mutant pv_simt_out_fifth_digit kernels/unfused/pv_tiled.cuh 1 \
  'out[int64_t(row) * p.out_stride_seq + col] = from_float<T>(acc[i][j]);' \
  'out[int64_t(row) * p.out_stride_seq + col] = from_float<T>(acc[i][j] * 1.00001f);' \
  'SIMT P V output 1e-5 too large'
mutant mma_stage_drops_last_column kernels/common/mma_tile.cuh 1 \
  '(row < count && col < c_end)' '(row < count && col + 1 < c_end)' \
  'tensor-core tiles zero the last column of each operand'

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
  -DSELFATTN_BUILD_BENCH=OFF -DSELFATTN_BUILD_DEMO=OFF >"$build/mutant_configure.log" 2>&1 ||
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
