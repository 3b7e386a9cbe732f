# ctest driver for selfattn-bench on the sim: cmake -DBENCH=exe -DWORKDIR=dir -DMODE=sweep|fail|default|decode|decode_fail -P this
#   sweep:   odd small shapes, every path, --check; exit 0; the JSON and CSV hold every case with every field,
#            at least one case ran, and every case that ran passed its check with finite numbers. A low
#            --check-whole-limit makes the larger shapes use the sampled-row check, the smaller the whole one.
#   fail:    an impossible tolerance (0): the check must fail and the exit code must be 1.
#   default: no shape options: the sim's default sweep, which must say its times are not GPU times.
#   decode:  --mode decode, odd small caches (page sizes 1 and 16), every path, --check, the dense call
#            and a continuous-batching step (--prefill-rows 5: sequence 0's chunk beside the others'
#            rows, one packed call); exit 0; the JSON holds every case with the decode fields, each
#            checked and passed, and its bytes are K/V read + q read + out written.
#   decode_fail: --mode decode with an impossible tolerance (0): every check fails, exit code 1.
#   decode_fp8: --mode decode --kv-dtype e4m3 (an FP8 cache, q/out bf16), every path, --check, dense and
#            packed; exit 0; every case passed with kv_dtype "e4m3" and bytes counting K/V at one byte.
#            Then e5m2 passes too, e4m3 at tolerance 0 fails (the judge reads the dequantized cache, it
#            is not vacuous), and --kv-dtype outside decode or a 16-bit one other than --dtype exit 2.
#   sweep_fp8: --dtype e4m3,e5m2 (FP8 q, k, v with descales, out bf16), head dims 64 and 128, both masks,
#            every path, --check; exit 0; every case ran and passed, its bytes q, k, v at one byte and out at
#            two. Then the backward of FP8 inputs is skipped with the reason, and tolerance 0 fails.
#   backward: --direction bwd,fwd+bwd, odd small shapes, every path, --check; exit 0; every case ran and
#            passed its check, and its FLOPs are 2.5x (bwd) or 3.5x (fwd+bwd) the forward's.
#   head_dims: --head-dim 48 --head-dim-v 24 (v and out of another head dim, as MLA's prefill),
#            --direction fwd,bwd, every path, --check; exit 0; the naive and cublas cases ran and passed
#            with head_dim_v 24 and FLOPs 2 * heads * pairs * (48 + 24) forward, (3 * 48 + 2 * 24)
#            backward; the fused ones are skipped naming head_dim_v. --mla outside --mode decode exits 2.
#   mla_decode: --mode decode --mla (DeepSeek's latent cache 576/512, one kv head, 16 heads on the
#            sim), 1 and 2 new rows, every path, --check, bf16 and an e4m3 cache; exit 0; every case
#            ran and passed with latent true, head dims 576/512, and bytes counting the cache's rows
#            once (V is K's first 512 columns) + q read + out written.
#   fused_kernels: --fused-kernel auto,mma.sync on fused and cublas, --check; exit 0; every case ran and
#            passed, the pinned lines are "fused/mma.sync", and each auto fused line has its vs_mma_sync.
#   profile: --profile on the fused path (bf16, d64, seq 64, forward and backward), then a small decode
#            case: each case's profile has launches with a kernel, grid and limiter, nonzero tensor
#            FLOPs and DRAM bytes (the forward's DRAM floor is exactly q, k, v read and out written),
#            a positive bound and rate at it; and --profile --backend cuda is refused with exit 2.
file(REMOVE_RECURSE ${WORKDIR})
file(MAKE_DIRECTORY ${WORKDIR})
set(json ${WORKDIR}/out.json)
set(csv ${WORKDIR}/out.csv)

if(MODE STREQUAL "sweep")
  set(args --backend sim --path all --check --json ${json} --csv ${csv} --warmup 0 --iters 1
           --batch 2 --heads 4 --kv-heads 1,4 --seq-q 1,7,113 --seq-k 7,64 --head-dim 64
           --causal none,bottom_right --dtype fp16 --layout bshd --check-whole-limit 30000)
elseif(MODE STREQUAL "fail")
  set(args --backend sim --path all --check --tolerance 0 --json ${json} --warmup 0 --iters 1
           --batch 1 --heads 2 --seq-q 17 --seq-k 33 --head-dim 64 --dtype bf16)
elseif(MODE STREQUAL "default")
  set(args --backend sim --json ${json})
elseif(MODE STREQUAL "decode")
  set(decode_batch 2)
  set(decode_heads 4)
  set(decode_kv_heads 2)
  set(decode_head_dim 64)
  set(args --backend sim --mode decode --path all --check --json ${json} --csv ${csv} --warmup 0 --iters 1
           --batch ${decode_batch} --heads ${decode_heads} --kv-heads ${decode_kv_heads} --head-dim ${decode_head_dim}
           --cache-len 7,33 --page-size 1,16 --new-tokens 1,3 --prefill-rows 0,5 --splits 3 --dtype fp16)
elseif(MODE STREQUAL "decode_fp8")
  set(decode_batch 2)
  set(decode_heads 4)
  set(decode_kv_heads 2)
  set(decode_head_dim 64)
  set(fp8_common --backend sim --mode decode --path all --check --warmup 0 --iters 1 --batch ${decode_batch}
                 --heads ${decode_heads} --kv-heads ${decode_kv_heads} --head-dim ${decode_head_dim} --dtype bf16)
  set(args ${fp8_common} --json ${json} --csv ${csv} --cache-len 7,33 --page-size 16 --new-tokens 1
           --prefill-rows 0,5 --splits 3 --kv-dtype e4m3)
elseif(MODE STREQUAL "sweep_fp8")
  set(args --backend sim --path all --check --json ${json} --csv ${csv} --warmup 0 --iters 1 --batch 2 --heads 4
           --kv-heads 2 --seq-q 7,64 --seq-k 64 --head-dim 64,128 --causal none,bottom_right --dtype e4m3,e5m2)
elseif(MODE STREQUAL "decode_fail")
  set(args --backend sim --mode decode --path all --check --tolerance 0 --json ${json} --warmup 0 --iters 1
           --batch 1 --heads 2 --kv-heads 1 --head-dim 64 --cache-len 17 --page-size 16 --new-tokens 2 --dtype bf16)
elseif(MODE STREQUAL "backward")
  set(args --backend sim --path all --check --json ${json} --csv ${csv} --warmup 0 --iters 1 --direction bwd,fwd+bwd
           --batch 1 --heads 4 --kv-heads 2 --seq-q 7,33 --seq-k 40 --head-dim 64 --causal none,bottom_right
           --dtype fp16)
elseif(MODE STREQUAL "head_dims")
  set(args --backend sim --path naive,cublas,fused --check --json ${json} --csv ${csv} --warmup 0 --iters 1
           --direction fwd,bwd --batch 1 --heads 4 --kv-heads 2 --seq-q 7,33 --seq-k 40 --head-dim 48 --head-dim-v 24
           --causal none,bottom_right --dtype fp16)
elseif(MODE STREQUAL "fused_kernels")
  set(args --backend sim --path fused,cublas --fused-kernel auto,mma.sync --check --json ${json} --csv ${csv}
           --warmup 0 --iters 1 --batch 1 --heads 2 --kv-heads 1 --seq-q 7,113 --seq-k 200 --head-dim 64
           --causal none,bottom_right --dtype bf16)
elseif(MODE STREQUAL "mla_decode")
  set(decode_batch 2)
  set(mla_common --backend sim --mode decode --mla --path all --check --warmup 0 --iters 1 --batch ${decode_batch}
                 --cache-len 97 --page-size 64 --new-tokens 1,2 --dtype bf16)
  set(args ${mla_common} --json ${json} --csv ${csv})
elseif(MODE STREQUAL "profile")
  set(args --backend sim --path fused --profile --gpu h200 --json ${json} --warmup 0 --iters 1 --batch 1 --heads 2
           --seq-q 64 --head-dim 64 --dtype bf16 --direction fwd,bwd)
else()
  message(FATAL_ERROR "MODE must be sweep, sweep_fp8, fail, default, decode, decode_fail, decode_fp8, backward, "
                      "head_dims, mla_decode, fused_kernels or profile")
endif()

# visible_pairs(SQ CAUSAL OUT): the (query, key) pairs one head sees at seq_k 40, the backward and
# head_dims modes' shapes (no mask: 40 * seq_q; bottom_right 7 x 40: rows see 34..40 keys, 259
# pairs; 33 x 40: 8..40 keys, 792 pairs).
function(visible_pairs sq causal out)
  if(causal STREQUAL "none")
    math(EXPR pairs "40 * ${sq}")
  elseif(sq EQUAL 7)
    set(pairs 259)
  else()
    set(pairs 792)
  endif()
  set(${out} ${pairs} PARENT_SCOPE)
endfunction()

# check_profile(CASE WHAT): the --profile object of one case (bench/README.md documents its fields).
function(check_profile case what)
  string(JSON gpu GET "${case}" profile gpu)
  string(JSON launches LENGTH "${case}" profile launches)
  if(NOT gpu STREQUAL "H200" OR launches EQUAL 0)
    message(FATAL_ERROR "${what}: profile gpu '${gpu}', ${launches} launches: expected H200 and at least one")
  endif()
  math(EXPR last_launch "${launches} - 1")
  foreach(l RANGE ${last_launch})
    foreach(key kernel grid block dram_bytes global_read global_write buffers shared_wavefronts bank_conflicts
                conflict_pct tensor_flops mufu_ops seconds bound_seconds limiter)
      string(JSON value ERROR_VARIABLE missing GET "${case}" profile launches ${l} ${key})
      if(missing)
        message(FATAL_ERROR "${what}: profile.launches[${l}].${key} missing")
      endif()
    endforeach()
  endforeach()
  foreach(key tensor_flops dram_bytes bound_seconds tflops_at_bound gbps_at_bound)
    string(JSON value GET "${case}" profile totals ${key})
    if(NOT value GREATER 0)
      message(FATAL_ERROR "${what}: profile.totals.${key} = ${value}, expected > 0")
    endif()
  endforeach()
  string(JSON limiter GET "${case}" profile totals limiter)
  if(NOT limiter MATCHES "^(dram|tensor|shared|mufu)$")
    message(FATAL_ERROR "${what}: profile.totals.limiter = '${limiter}'")
  endif()
endfunction()

execute_process(COMMAND ${BENCH} ${args} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}")
if(NOT EXISTS ${json})
  message(FATAL_ERROR "selfattn-bench wrote no JSON (exit ${rc}): ${err}")
endif()
file(READ ${json} doc)

# Header: the fields the schema promises.
foreach(key schema backend gpu library_version git_commit warmup iters ceilings)
  string(JSON value ERROR_VARIABLE missing GET "${doc}" header ${key})
  if(missing)
    message(FATAL_ERROR "header.${key} missing: ${missing}")
  endif()
endforeach()
string(JSON backend GET "${doc}" header backend)
if(NOT backend STREQUAL "sim")
  message(FATAL_ERROR "header.backend is '${backend}', expected sim")
endif()

# Cases: every field present; ran cases have positive times and rates, and (with --check) errors.
string(JSON count LENGTH "${doc}" cases)
if(count EQUAL 0)
  message(FATAL_ERROR "no cases in the JSON")
endif()
set(fields backend gpu path resolved_path fused_kernel direction dtype batch heads kv_heads seq_q seq_k head_dim
           head_dim_v causal
           layout status ms_median ms_min ms_max tflops gbps pct_of_ceiling pct_of_copy_ceiling vs_cublas vs_mma_sync
           max_abs_err rel_err check bytes mode cache_len page_size new_tokens splits prefill_rows kv_dtype latent
           profile)
set(checked_mode OFF)
if(MODE STREQUAL "sweep" OR MODE STREQUAL "fail" OR MODE STREQUAL "decode" OR MODE STREQUAL "decode_fail" OR
   MODE STREQUAL "decode_fp8" OR MODE STREQUAL "sweep_fp8" OR MODE STREQUAL "backward" OR
   MODE STREQUAL "head_dims" OR MODE STREQUAL "mla_decode" OR MODE STREQUAL "fused_kernels")
  set(checked_mode ON)
endif()
set(decode_checks 0)
set(fp8_checks 0)
set(backward_checks 0)
set(head_dim_checks 0)
set(head_dim_refusals 0)
set(pinned_lines 0)
set(speedups 0)
set(ran 0)
set(failed 0)
set(sampled 0)
set(whole 0)
set(flop_checks 0)
math(EXPR last "${count} - 1")
foreach(i RANGE ${last})
  string(JSON case GET "${doc}" cases ${i})  # parse the big document once per case, not once per field
  foreach(key ${fields})
    string(JSON value ERROR_VARIABLE missing GET "${case}" ${key})
    if(missing)
      message(FATAL_ERROR "cases[${i}].${key} missing")
    endif()
  endforeach()
  string(JSON status GET "${case}" status)
  string(JSON check GET "${case}" check)
  string(JSON path GET "${case}" path)
  if(status STREQUAL "ERROR")
    string(JSON note GET "${case}" note)
    message(FATAL_ERROR "cases[${i}] (${path}) raised an error: ${note}")
  endif()
  if(status STREQUAL "ok" OR status STREQUAL "FAILED")
    math(EXPR ran "${ran} + 1")
    foreach(key ms_median ms_min ms_max tflops gbps)
      string(JSON type TYPE "${case}" ${key})
      string(JSON value GET "${case}" ${key})
      if(NOT type STREQUAL "NUMBER" OR NOT value GREATER 0)
        message(FATAL_ERROR "cases[${i}].${key} = ${value} (${type}): expected a positive number")
      endif()
    endforeach()
    if(checked_mode)
      string(JSON type TYPE "${case}" rel_err)
      if(NOT type STREQUAL "NUMBER")
        message(FATAL_ERROR "cases[${i}].rel_err is ${type} although --check was given")
      endif()
    endif()
    if(check STREQUAL "fail")
      math(EXPR failed "${failed} + 1")
    endif()
    # The FLOP count of a bottom-right mask with seq_q > seq_k: rows 49..112 see 1..64 keys, so
    # 2080 visible pairs, times 4 * batch 2 * heads 4 * head_dim 64.
    string(JSON sq GET "${case}" seq_q)
    string(JSON sk GET "${case}" seq_k)
    string(JSON causal GET "${case}" causal)
    if(MODE STREQUAL "sweep" AND sq EQUAL 113 AND sk EQUAL 64 AND causal STREQUAL "bottom_right")
      string(JSON flops GET "${case}" flops)
      if(flops LESS 4259839.5 OR flops GREATER 4259840.5)
        message(FATAL_ERROR "cases[${i}].flops = ${flops}, expected 4259840 (masked pairs excluded)")
      endif()
      math(EXPR flop_checks "${flop_checks} + 1")
    endif()
    # A decode case: its fields, and bytes = K/V of the cached tokens read + q read + out written
    # (fp16, bf16: 2 bytes an element; an FP8 cache's K/V 1).
    if(MODE STREQUAL "decode" OR MODE STREQUAL "decode_fp8")
      set(kv_size 2)
      set(want_kv_dtype fp16)
      if(MODE STREQUAL "decode_fp8")
        set(kv_size 1)
        set(want_kv_dtype e4m3)
      endif()
      string(JSON kv_dtype GET "${case}" kv_dtype)
      if(NOT kv_dtype STREQUAL want_kv_dtype)
        message(FATAL_ERROR "cases[${i}].kv_dtype = '${kv_dtype}', expected ${want_kv_dtype}")
      endif()
      string(JSON case_mode GET "${case}" mode)
      string(JSON cache_len GET "${case}" cache_len)
      string(JSON new_tokens GET "${case}" new_tokens)
      string(JSON splits GET "${case}" splits)
      string(JSON prefill_rows GET "${case}" prefill_rows)
      string(JSON bytes GET "${case}" bytes)
      if(NOT case_mode STREQUAL "decode" OR NOT splits EQUAL 3)
        message(FATAL_ERROR "cases[${i}]: mode '${case_mode}', splits ${splits}: expected decode, 3")
      endif()
      # Query rows: new_tokens per sequence, or sequence 0's prefill chunk beside the others' rows.
      math(EXPR rows "${decode_batch} * ${new_tokens}")
      if(prefill_rows GREATER 0)
        math(EXPR rows "${prefill_rows} + (${decode_batch} - 1) * ${new_tokens}")
      endif()
      math(EXPR wanted "2 * 2 * ${rows} * ${decode_heads} * ${decode_head_dim}
                       + ${kv_size} * 2 * ${decode_batch} * ${decode_kv_heads} * ${cache_len} * ${decode_head_dim}")
      if(bytes LESS wanted OR bytes GREATER wanted)
        message(FATAL_ERROR "cases[${i}].bytes = ${bytes}, expected ${wanted} (K/V read + q read + out written)")
      endif()
      if(NOT check STREQUAL "pass")
        message(FATAL_ERROR "cases[${i}] (${path}) check is '${check}': ${case}")
      endif()
      math(EXPR decode_checks "${decode_checks} + 1")
    endif()
    # An MLA decode case: the latent cache's rows read once (bf16), q (576) read, out (512) written.
    if(MODE STREQUAL "mla_decode")
      string(JSON latent GET "${case}" latent)
      string(JSON d GET "${case}" head_dim)
      string(JSON dv GET "${case}" head_dim_v)
      string(JSON new_tokens GET "${case}" new_tokens)
      string(JSON bytes GET "${case}" bytes)
      math(EXPR wanted "2 * ${decode_batch} * ${new_tokens} * 16 * (576 + 512) + 2 * ${decode_batch} * 97 * 576")
      if(NOT latent OR NOT d EQUAL 576 OR NOT dv EQUAL 512 OR bytes LESS wanted OR bytes GREATER wanted)
        message(FATAL_ERROR "cases[${i}]: latent ${latent}, head dims ${d}/${dv}, bytes ${bytes}: expected true, "
                            "576/512, ${wanted}")
      endif()
      if(NOT check STREQUAL "pass")
        message(FATAL_ERROR "cases[${i}] (${path}) check is '${check}': ${case}")
      endif()
      math(EXPR decode_checks "${decode_checks} + 1")
    endif()
    # An FP8 forward case: checked and passed; bytes q, k, v read at one byte, out written at two.
    if(MODE STREQUAL "sweep_fp8")
      string(JSON dtype GET "${case}" dtype)
      string(JSON d GET "${case}" head_dim)
      string(JSON bytes GET "${case}" bytes)
      math(EXPR wanted "2 * 4 * ${sq} * ${d} * 3 + 2 * 2 * 2 * 64 * ${d}")
      if(NOT dtype MATCHES "^e(4m3|5m2)$" OR bytes LESS wanted OR bytes GREATER wanted)
        message(FATAL_ERROR "cases[${i}]: dtype ${dtype}, bytes ${bytes}: expected e4m3/e5m2, ${wanted}")
      endif()
      if(NOT check STREQUAL "pass")
        string(JSON note GET "${case}" note)
        message(FATAL_ERROR "cases[${i}] (${path} ${dtype} d${d}) check is '${check}': ${note}")
      endif()
      math(EXPR fp8_checks "${fp8_checks} + 1")
    endif()
    # A backward case: checked and passed, FLOPs 2.5x / 3.5x the forward's 4 * b * h * d * pairs.
    if(MODE STREQUAL "backward")
      string(JSON direction GET "${case}" direction)
      string(JSON flops GET "${case}" flops)
      visible_pairs(${sq} ${causal} pairs)
      math(EXPR forward "4 * 4 * 64 * ${pairs}")
      if(direction STREQUAL "bwd")
        math(EXPR wanted "5 * ${forward} / 2")
      else()
        math(EXPR wanted "7 * ${forward} / 2")
      endif()
      if(flops LESS wanted OR flops GREATER wanted)
        message(FATAL_ERROR "cases[${i}] (${direction}).flops = ${flops}, expected ${wanted}")
      endif()
      if(NOT check STREQUAL "pass")
        string(JSON note GET "${case}" note)
        message(FATAL_ERROR "cases[${i}] (${path} ${direction}) check is '${check}': ${note}")
      endif()
      math(EXPR backward_checks "${backward_checks} + 1")
    endif()
    # Two head dims: FLOPs 2 * heads * pairs * (48 + 24) forward, 2 * heads * pairs * (3 * 48 + 2 * 24)
    # backward.
    if(MODE STREQUAL "head_dims")
      string(JSON direction GET "${case}" direction)
      string(JSON flops GET "${case}" flops)
      string(JSON dv GET "${case}" head_dim_v)
      visible_pairs(${sq} ${causal} pairs)
      if(direction STREQUAL "fwd")
        math(EXPR wanted "2 * 4 * ${pairs} * (48 + 24)")
      else()
        math(EXPR wanted "2 * 4 * ${pairs} * (3 * 48 + 2 * 24)")
      endif()
      if(NOT dv EQUAL 24 OR flops LESS wanted OR flops GREATER wanted)
        message(FATAL_ERROR "cases[${i}] (${path} ${direction}): head_dim_v ${dv}, flops ${flops}: expected 24, ${wanted}")
      endif()
      if(NOT check STREQUAL "pass")
        string(JSON note GET "${case}" note)
        message(FATAL_ERROR "cases[${i}] (${path} ${direction}) check is '${check}': ${note}")
      endif()
      math(EXPR head_dim_checks "${head_dim_checks} + 1")
    endif()
    string(JSON is_sampled GET "${case}" check_sampled)
    if(MODE STREQUAL "fused_kernels" AND check STREQUAL "pass")
      string(JSON resolved GET "${case}" resolved_path)
      string(JSON kernel GET "${case}" fused_kernel)
      string(JSON speedup_type TYPE "${case}" vs_mma_sync)
      if(resolved STREQUAL "fused/mma.sync" AND kernel STREQUAL "mma.sync" AND speedup_type STREQUAL "NULL")
        math(EXPR pinned_lines "${pinned_lines} + 1")
      elseif(resolved STREQUAL "fused" AND kernel STREQUAL "auto" AND speedup_type STREQUAL "NUMBER")
        math(EXPR speedups "${speedups} + 1")
      elseif(NOT resolved STREQUAL "cublas" OR NOT speedup_type STREQUAL "NULL")
        message(FATAL_ERROR "cases[${i}]: resolved_path '${resolved}', fused_kernel '${kernel}', vs_mma_sync ${speedup_type}")
      endif()
    endif()
    if(is_sampled STREQUAL "ON")
      math(EXPR sampled "${sampled} + 1")
    elseif(is_sampled STREQUAL "OFF")
      math(EXPR whole "${whole} + 1")
    endif()
  elseif(NOT status STREQUAL "skipped")
    message(FATAL_ERROR "cases[${i}].status is '${status}'")
  elseif(MODE STREQUAL "head_dims")
    string(JSON note GET "${case}" note)
    if(NOT path STREQUAL "fused" OR NOT note MATCHES "head_dim_v != head_dim_qk")
      message(FATAL_ERROR "cases[${i}] (${path}) skipped: ${note}")
    endif()
    math(EXPR head_dim_refusals "${head_dim_refusals} + 1")
  endif()
endforeach()
message(STATUS "${ran} of ${count} cases ran, ${failed} failed the check, exit code ${rc}")
if(ran EQUAL 0)
  message(FATAL_ERROR "no case ran: no path is available on the sim?")
endif()

if(MODE STREQUAL "sweep")
  if(NOT rc EQUAL 0 OR failed GREATER 0)
    message(FATAL_ERROR "the checked sweep failed (exit ${rc}, ${failed} failed checks):\n${err}")
  endif()
  file(STRINGS ${csv} csv_lines)
  list(LENGTH csv_lines csv_count)
  math(EXPR expected "${count} + 1")
  if(NOT csv_count EQUAL expected)
    message(FATAL_ERROR "the CSV has ${csv_count} lines, expected ${expected} (header + one per case)")
  endif()
  if(flop_checks EQUAL 0)
    message(FATAL_ERROR "the bottom_right 113x64 case did not run: its FLOP count went unchecked")
  endif()
  if(sampled EQUAL 0 OR whole EQUAL 0)
    message(FATAL_ERROR "expected both whole (${whole}) and sampled-row (${sampled}) checks")
  endif()
  if(count LESS 72)
    message(FATAL_ERROR "expected 72 cases (12 shapes x 2 masks x 3 paths), found ${count}")
  endif()
elseif(MODE STREQUAL "decode")
  if(NOT rc EQUAL 0 OR failed GREATER 0 OR NOT decode_checks EQUAL 48 OR NOT count EQUAL 48)
    message(FATAL_ERROR "the checked decode sweep: exit ${rc}, ${failed} failed checks, ${decode_checks} of ${count} "
                        "cases ran and passed, expected 48 (2 caches x 2 page sizes x 2 new-token counts x 2 prefill "
                        "chunks x 3 paths):\n${err}")
  endif()
elseif(MODE STREQUAL "sweep_fp8")
  if(NOT rc EQUAL 0 OR NOT fp8_checks EQUAL 48 OR NOT count EQUAL 48)
    message(FATAL_ERROR "the checked FP8 sweep: exit ${rc}, ${fp8_checks} of ${count} cases ran and passed, expected "
                        "48 (2 formats x 2 seq_q x 2 head dims x 2 masks x 3 paths):\n${err}")
  endif()
  set(fp8_small --backend sim --path all --check --warmup 0 --iters 1 --heads 2 --kv-heads 1 --seq-q 17 --seq-k 33
                --head-dim 64 --dtype e4m3)
  execute_process(COMMAND ${BENCH} ${fp8_small} --direction bwd RESULT_VARIABLE bwd_rc OUTPUT_VARIABLE bwd_out
                  ERROR_VARIABLE bwd_err)
  if(NOT bwd_rc EQUAL 0 OR NOT bwd_out MATCHES "0 of 3 cases ran, 3 skipped" OR NOT bwd_out MATCHES "no backward")
    message(FATAL_ERROR "--dtype e4m3 --direction bwd: exit ${bwd_rc}, expected every case skipped:\n${bwd_out}")
  endif()
  execute_process(COMMAND ${BENCH} ${fp8_small} --tolerance 0 RESULT_VARIABLE zero_rc OUTPUT_VARIABLE zero_out
                  ERROR_VARIABLE zero_err)
  if(NOT zero_rc EQUAL 1 OR NOT zero_out MATCHES "3 of 3 cases ran, 0 skipped, 3 failed the check")
    message(FATAL_ERROR "--dtype e4m3 --tolerance 0: exit ${zero_rc} (expected 1):\n${zero_out}\n${zero_err}")
  endif()
elseif(MODE STREQUAL "decode_fp8")
  if(NOT rc EQUAL 0 OR failed GREATER 0 OR NOT decode_checks EQUAL 12 OR NOT count EQUAL 12)
    message(FATAL_ERROR "the checked FP8 decode sweep: exit ${rc}, ${failed} failed checks, ${decode_checks} of "
                        "${count} cases ran and passed, expected 12 (2 caches x 2 prefill chunks x 3 paths):\n${err}")
  endif()
  # e5m2 as well (one cache, pages of 1), checked.
  execute_process(COMMAND ${BENCH} ${fp8_common} --cache-len 33 --page-size 1 --new-tokens 2 --kv-dtype e5m2
                  RESULT_VARIABLE e5m2_rc OUTPUT_VARIABLE e5m2_out ERROR_VARIABLE e5m2_err)
  if(NOT e5m2_rc EQUAL 0 OR NOT e5m2_out MATCHES "3 of 3 decode cases ran, 0 errors, 0 failed the check"
     OR NOT e5m2_out MATCHES "cache e5m2 \\(scales per tensor")
    message(FATAL_ERROR "--kv-dtype e5m2: exit ${e5m2_rc}:\n${e5m2_out}\n${e5m2_err}")
  endif()
  # Tolerance 0: every check fails, so the comparison with the dequantized cache is a real one.
  execute_process(COMMAND ${BENCH} ${fp8_common} --cache-len 17 --page-size 16 --kv-dtype e4m3 --tolerance 0
                  RESULT_VARIABLE zero_rc OUTPUT_VARIABLE zero_out ERROR_VARIABLE zero_err)
  if(NOT zero_rc EQUAL 1 OR NOT zero_out MATCHES "3 of 3 decode cases ran, 0 errors, 3 failed the check")
    message(FATAL_ERROR "--kv-dtype e4m3 --tolerance 0: exit ${zero_rc} (expected 1):\n${zero_out}\n${zero_err}")
  endif()
  # Usage errors, before any work: --kv-dtype outside decode, a 16-bit cache other than q's dtype.
  foreach(refused "--kv-dtype;e4m3;--seq-q;8" "--mode;decode;--dtype;bf16;--kv-dtype;fp16")
    execute_process(COMMAND ${BENCH} --backend sim ${refused} RESULT_VARIABLE usage_rc OUTPUT_VARIABLE usage_out
                    ERROR_VARIABLE usage_err)
    if(NOT usage_rc EQUAL 2 OR NOT usage_err MATCHES "--kv-dtype")
      message(FATAL_ERROR "${refused}: exit ${usage_rc} (expected 2), stderr: ${usage_err}")
    endif()
  endforeach()
elseif(MODE STREQUAL "backward")
  if(NOT rc EQUAL 0 OR NOT backward_checks EQUAL 24 OR NOT count EQUAL 24)
    message(FATAL_ERROR "the checked backward sweep: exit ${rc}, ${backward_checks} of ${count} cases ran and passed, "
                        "expected 24 (2 shapes x 2 masks x 2 directions x 3 paths):\n${err}")
  endif()
elseif(MODE STREQUAL "head_dims")
  if(NOT rc EQUAL 0 OR NOT head_dim_checks EQUAL 16 OR NOT head_dim_refusals EQUAL 8)
    message(FATAL_ERROR "the two-head-dim sweep: exit ${rc}, ${head_dim_checks} cases ran and passed (expected 16: "
                        "2 shapes x 2 masks x 2 directions x naive, cublas), ${head_dim_refusals} fused ones refused "
                        "(expected 8):\n${err}")
  endif()
  execute_process(COMMAND ${BENCH} --backend sim --mla RESULT_VARIABLE mla_rc OUTPUT_QUIET ERROR_VARIABLE mla_err)
  if(NOT mla_rc EQUAL 2 OR NOT mla_err MATCHES "--mla is a decode preset")
    message(FATAL_ERROR "--mla without --mode decode: exit ${mla_rc}, '${mla_err}': expected 2 and the reason")
  endif()
elseif(MODE STREQUAL "mla_decode")
  if(NOT rc EQUAL 0 OR NOT decode_checks EQUAL 6 OR NOT count EQUAL 6)
    message(FATAL_ERROR "the checked MLA decode sweep: exit ${rc}, ${decode_checks} of ${count} cases ran and passed, "
                        "expected 6 (2 new-row counts x 3 paths):\n${err}")
  endif()
  # An e4m3 latent cache (bf16 q: the latent kernel's FP8 instance on the fused path), checked.
  execute_process(COMMAND ${BENCH} ${mla_common} --kv-dtype e4m3 RESULT_VARIABLE fp8_rc OUTPUT_VARIABLE fp8_out
                  ERROR_VARIABLE fp8_err)
  if(NOT fp8_rc EQUAL 0 OR NOT fp8_out MATCHES "6 of 6 decode cases ran, 0 errors, 0 failed the check"
     OR NOT fp8_out MATCHES "latent \\(V: K's first 512 columns\\)")
    message(FATAL_ERROR "--mla --kv-dtype e4m3: exit ${fp8_rc}:\n${fp8_out}\n${fp8_err}")
  endif()
elseif(MODE STREQUAL "fused_kernels")
  if(NOT rc EQUAL 0 OR NOT count EQUAL 12 OR NOT pinned_lines EQUAL 4 OR NOT speedups EQUAL 4)
    message(FATAL_ERROR "the checked fused-kernel sweep: exit ${rc}, ${count} cases (expected 12: 2 shapes x 2 masks x "
                        "fused, fused/mma.sync, cublas), ${pinned_lines} pinned lines passed (4), ${speedups} fused lines "
                        "passed with vs_mma_sync (4):\n${err}")
  endif()
elseif(MODE STREQUAL "fail" OR MODE STREQUAL "decode_fail")
  if(NOT rc EQUAL 1 OR NOT failed EQUAL ran)
    message(FATAL_ERROR "tolerance 0 must fail every check that ran and exit 1 (exit ${rc}, ${failed} of ${ran} failed)")
  endif()
elseif(MODE STREQUAL "profile")
  if(NOT rc EQUAL 0 OR NOT count EQUAL 2 OR NOT out MATCHES "speed of light on H200")
    message(FATAL_ERROR "the profiled run: exit ${rc}, ${count} cases (expected 2: fwd, bwd), table printed?\n${err}")
  endif()
  foreach(i 0 1)
    string(JSON case GET "${doc}" cases ${i})
    string(JSON direction GET "${case}" direction)
    check_profile("${case}" "cases[${i}] (${direction})")
    if(direction STREQUAL "fwd")
      # Every byte of q, k, v read once and of out written once, none twice: the floor is the bench's bytes.
      string(JSON dram GET "${case}" profile totals dram_bytes)
      string(JSON bytes GET "${case}" bytes)
      if(NOT dram EQUAL bytes)
        message(FATAL_ERROR "the forward's DRAM floor is ${dram} bytes, expected the bench's ${bytes}")
      endif()
    endif()
  endforeach()
  # Decode: the same profile object on a --mode decode case.
  set(decode_json ${WORKDIR}/decode.json)
  execute_process(COMMAND ${BENCH} --backend sim --mode decode --path fused --profile --json ${decode_json} --warmup 0
                          --iters 1 --batch 1 --heads 4 --kv-heads 2 --head-dim 64 --cache-len 64 --page-size 16
                          --dtype bf16
                  RESULT_VARIABLE decode_rc OUTPUT_VARIABLE decode_out ERROR_VARIABLE decode_err)
  if(NOT decode_rc EQUAL 0 OR NOT EXISTS ${decode_json})
    message(FATAL_ERROR "the profiled decode run exited ${decode_rc}:\n${decode_out}\n${decode_err}")
  endif()
  file(READ ${decode_json} decode_doc)
  string(JSON decode_case GET "${decode_doc}" cases 0)
  check_profile("${decode_case}" "decode")
  # On a GPU the counters come from ncu: --profile with the cuda backend is a usage error.
  execute_process(COMMAND ${BENCH} --backend cuda --profile --seq-q 64 RESULT_VARIABLE cuda_rc OUTPUT_VARIABLE cuda_out
                  ERROR_VARIABLE cuda_err)
  if(NOT cuda_rc EQUAL 2 OR NOT cuda_err MATCHES "--profile counts on the sim only")
    message(FATAL_ERROR "--profile --backend cuda: exit ${cuda_rc} (expected 2), stderr: ${cuda_err}")
  endif()
elseif(MODE STREQUAL "default")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "the default sweep exited ${rc}:\n${err}")
  endif()
  if(NOT out MATCHES "not GPU times" AND NOT err MATCHES "not GPU times")
    message(FATAL_ERROR "the sim run must say its times are not GPU times")
  endif()
endif()
