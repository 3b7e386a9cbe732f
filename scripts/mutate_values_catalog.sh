# The mutants scripts/mutate_values.sh plants (sourced by it; not run alone): one `mutant` call
# each, with its name, the file, how many times the text must occur there, the text, its
# replacement, and the wrong value it plants. tests/README.md keeps what catches each.

# The online softmax and epilogue both fused forward kernels share (mma.sync and Hopper).
mutant fused_rescale_skipped_near_1 kernels/forward/flash_fwd_softmax.cuh 1 \
  'if (rescale == 1.0f) return;' 'if (rescale > 0.999f) return;' \
  'O not rescaled when the running max grows by under 0.1%'
mutant fused_mask_one_key_late kernels/forward/flash_fwd_softmax.cuh 1 \
  'if (needs_mask && (key < seen.begin || key >= seen.end)) {' \
  'if (needs_mask && (key < seen.begin || key > seen.end)) {' \
  'masked tiles let each row see one key too many'
mutant fused_scale_in_keys_64_to_127 kernels/forward/flash_fwd_softmax.cuh 1 \
  's *= p.scale_log2;' 's *= key0 / 64 == 1 ? p.scale_log2 * 1.0001f : p.scale_log2;' \
  'scores of keys 64-127 scaled 1e-4 too much'
mutant fused_sink_dropped kernels/forward/flash_fwd_softmax.cuh 1 \
  'softmax_row_end</*Log2=*/true>(state.max, sum, head_sink(p.mods, head));' \
  'softmax_row_end</*Log2=*/true>(state.max, sum, -INFINITY);' \
  'the sink left out of the row'"'"'s softmax'
mutant tc_block_rows_clamp kernels/forward/flash_fwd.cuh 1 \
  '? seq.q_len - block_row0 : Traits::kBlockRows;' '? seq.q_len - block_row0 - 1 : Traits::kBlockRows;' \
  'the last partial query block loses its last row (clamp off by one)'
mutant fused_unmasked_keys_off_by_one kernels/forward/flash_fwd_sequence.cuh 1 \
  'keys.unmasked = {last.begin, first.end};' 'keys.unmasked = {last.begin, first.end + 1};' \
  'a tile the first row sees only in part taken as unmasked'

# A varlen call's cu_seqlens as the fused kernels read them: their running maximum.
mutant offsets_scan_stops_halfway kernels/forward/running_max_offsets.cuh 1 \
  'for (int offset = 1; offset < threads; offset *= 2) {' 'for (int offset = 1; offset < threads / 2; offset *= 2) {' \
  'the maximum of the runs more than half a block back is lost'
mutant offsets_run_without_prefix kernels/forward/running_max_offsets.cuh 1 \
  'int32_t running = t > 0 ? maxima[t - 1] : INT_MIN;' 'int32_t running = INT_MIN;' \
  'each thread'"'"'s run ordered alone, without the runs before it'

# Where every softmax ends (score_mods.cuh): the LSE, the sink, the score limit.
mutant lse_ln2_fifth_digit kernels/common/score_mods.cuh 1 \
  'constexpr float kLn2 = 0.69314718055994531f;' 'constexpr float kLn2 = 0.6931f;' \
  'the exp2-domain LSE converted with ln 2 = 0.6931 (7e-5 relative)'
mutant sink_term_fourth_digit kernels/common/score_mods.cuh 1 \
  'sum * keys_share + expf(sink - shift);' 'sum * keys_share + 1.0001f * expf(sink - shift);' \
  'the sink'"'"'s term 1e-4 too large'
mutant score_limit_too_low kernels/common/score_mods.cuh 1 \
  'if (s <= -kScoreLimit) return -INFINITY;' 'if (s < -3.4e38f) return -INFINITY;' \
  'scores in (-FLT_MAX, -1e38] kept (they overflow in the exp2 domain)'

# Fused SIMT kernel (fp32, odd head dims, unaligned rows).
mutant simt_rescale_skipped_near_1 kernels/forward/flash_fwd_simt.cuh 1 \
  'for (int c = 0; c < C; ++c) acc[r][c] *= rescale;' \
  'for (int c = 0; c < C; ++c) acc[r][c] *= rescale < 0.999f ? rescale : 1.0f;' \
  'O not rescaled when the running max grows by under 0.1%'
mutant simt_mask_one_key_late kernels/forward/flash_fwd_simt.cuh 1 \
  'if (key < seen.begin || key >= seen.end) {' 'if (key < seen.begin || key > seen.end) {' \
  'each row sees one key too many'
mutant simt_scale_fifth_digit kernels/forward/flash_fwd_simt.cuh 1 \
  's = score[r] * p.scale_log2;' 's = score[r] * p.scale_log2 * 1.00001f;' \
  'scores scaled 1e-5 too much'

# Softmax rows (naive and cublas paths).
mutant softmax_inverse_fifth_digit kernels/unfused/softmax_rows.cuh 1 \
  'out[key] = from_float<P>(dropped(x[c] * end.inverse, key));' \
  'out[key] = from_float<P>(dropped(x[c] * end.inverse * 1.00001f, key));' \
  'short rows (cached): P 1e-5 too large'
mutant softmax_mask_one_key_early kernels/unfused/softmax_rows.cuh 1 \
  'x[c] = key >= seen.begin && key < seen.end ? score(s[key], key) : -INFINITY;' \
  'x[c] = key >= seen.begin && key + 1 < seen.end ? score(s[key], key) : -INFINITY;' \
  'short rows (cached) drop their last visible key'
mutant softmax_streaming_rescale_skipped kernels/unfused/softmax_rows.cuh 1 \
  'thread_sum = thread_sum * exp_below(thread_max, new_max) + exp_below(x, new_max);' \
  'thread_sum = (new_max - thread_max < 0.001f ? thread_sum : thread_sum * exp_below(thread_max, new_max)) + exp_below(x, new_max);' \
  'long rows: a thread'"'"'s sum not rescaled when its max grows by under 0.001'
mutant softmax_sink_dropped kernels/unfused/softmax_rows.cuh 2 \
  'softmax_row_end</*Log2=*/false>(row_max, row_sum, mods.sink);' \
  'softmax_row_end</*Log2=*/false>(row_max, row_sum, -INFINITY);' \
  'the sink left out of the row'"'"'s softmax'

# Tiled Q K^T and P V (naive path).
mutant qk_skips_tile_with_one_key kernels/unfused/qk_tiled.cuh 2 \
  'if (key0 >= seen.end || key0 + Tile::kTileN <= seen.begin) return;' \
  'if (key0 + 1 >= seen.end || key0 + Tile::kTileN <= seen.begin) return;' \
  'a key tile whose only visible key is its first is skipped (scores left stale)'
mutant pv_key_end_clamp kernels/unfused/pv_tiled.cuh 2 \
  'const int key_end = seen.end;' 'const int key_end = seen.end - 1;' \
  'P V stops one key short for every row tile'
mutant tile_last_row_clamp kernels/common/attention_heads.cuh 1 \
  '(row0 + tile_rows < p.rows ? row0 + tile_rows : p.rows) - 1;' \
  '(row0 + tile_rows < p.rows ? row0 + tile_rows : p.rows) - 2;' \
  'a row tile'"'"'s keys taken from its second-to-last row (clamp off by one)'
mutant pv_simt_out_fifth_digit kernels/unfused/pv_tiled.cuh 1 \
  'out[int64_t(row) * p.out_stride_seq + col] = from_float<Out>(acc[i][j]);' \
  'out[int64_t(row) * p.out_stride_seq + col] = from_float<Out>(acc[i][j] * 1.00001f);' \
  'SIMT P V (fp32 and odd head dims) output 1e-5 too large'
# The tensor-core P V writes f16/bf16, whose rounding (2^-11, 2^-8) hides 1e-5: 1e-3 is two f16 ulps.
mutant pv_mma_out_third_digit kernels/unfused/pv_tiled.cuh 1 \
  'out[int64_t(row) * p.out_stride_seq + col] = from_float<Out>(acc[tile][i]);' \
  'out[int64_t(row) * p.out_stride_seq + col] = from_float<Out>(acc[tile][i] * 1.001f);' \
  'tensor-core P V (f16/bf16) output 1e-3 too large'
mutant mma_stage_drops_last_column kernels/common/mma_tile.cuh 1 \
  '(row < count && col < c_end)' '(row < count && col + 1 < c_end)' \
  'tensor-core tiles zero the last column of each operand'

# KV-cache decode: the sink once per row, in the one-split epilogue or in the combine.
mutant decode_combine_sink_dropped kernels/decode/decode_combine.cuh 1 \
  'const float sink = p.sinks != nullptr ? p.sinks[head] : -INFINITY;' 'const float sink = -INFINITY;' \
  'the combine of several splits leaves the sink out'
mutant decode_one_split_sink_dropped kernels/decode/decode_split_kv_mma.cuh 1 \
  'const float sink = p.num_splits == 1 ? head_sink(p.mods, head) : -INFINITY;' \
  'const float sink = -INFINITY;' \
  'the tensor-core decode kernel with one split leaves the sink out'

# Issue 32: KV-cache family. Each aims at a class the KV-cache tests once missed because their
# tensors shared one layout or their sizes sat away from the kernels' edges (tests/support/
# kv_cache_check.h's per-tensor layouts, test_kv_cache_edges.cpp, the validate_metadata edges).
# One tensor read with another's strides:
mutant kv_v_row_with_k_stride kernels/decode/kv_pages.cuh 1 \
  'int64_t(t % c.page_size) * c.v_stride_row;' 'int64_t(t % c.page_size) * c.k_stride_row;' \
  'every cache V row addressed with K'"'"'s row stride'
mutant kv_pages_view_v_row_from_k host/src/kv_cache/cache_launch.cpp 1 \
  'view.v_stride_row = cache.v.strides[2];' 'view.v_stride_row = cache.k.strides[2];' \
  'the host passes K'"'"'s row stride as V'"'"'s'
mutant gather_v_at_k_offset kernels/decode/kv_gather.cuh 1 \
  'real(v_cache[kv_v_offset(p.cache, page, head, t) + e], scales.v);' \
  'real(v_cache[kv_k_offset(p.cache, page, head, t) + e], scales.v);' \
  'kv_gather (naive/cublas paths) reads V at K'"'"'s offsets'
mutant decode_mma_v_at_k_offset kernels/decode/decode_split_kv_mma.cuh 1 \
  'v_rows[threadIdx.x] = page >= 0 ? kv_v_offset(p.cache, page, kv_head, key) : -1;' \
  'v_rows[threadIdx.x] = page >= 0 ? kv_k_offset(p.cache, page, kv_head, key) : -1;' \
  'the tensor-core decode kernel stages V from K'"'"'s offsets'
mutant decode_out_with_q_row_stride host/src/kv_cache/split_kv_runner.cpp 1 \
  'params.out_stride_row = out.strides[2];' 'params.out_stride_row = q.strides[2];' \
  'split-KV decode writes out with q'"'"'s row stride'
mutant rotary_rows_in_with_out_stride host/src/kv_cache/cache_launch.cpp 1 \
  'params.in_stride_row = in.strides[2];' 'params.in_stride_row = out.strides[2];' \
  'q read for rotation with the rotated copy'"'"'s row stride'
mutant append_v_new_with_k_stride kernels/decode/kv_append.cuh 1 \
  'v_new[int64_t(t) * p.new_stride_row_v + e]' 'v_new[int64_t(t) * p.new_stride_row_k + e]' \
  'append_kv reads v_new with k_new'"'"'s row stride'
mutant merge_b_with_a_row_stride kernels/decode/merge_states.cuh 1 \
  'int64_t(s) * p.b_stride_row;' 'int64_t(s) * p.a_stride_row;' \
  'merge_states reads out_b with out_a'"'"'s row stride'
mutant merge_out_with_a_head_stride host/src/kv_cache/kv_cache.cpp 1 \
  'params.o_stride_head = out.strides[1];' 'params.o_stride_head = out_a.strides[1];' \
  'merge_states writes out with out_a'"'"'s head stride'
# Edges of the work division and of the tables:
mutant merge_grid_one_block_short host/src/kv_cache/kv_cache.cpp 1 \
  'shape.grid = dim3(unsigned((rows + kernel.threads - 1) / kernel.threads));' \
  'shape.grid = dim3(unsigned((rows + kernel.threads - 2) / kernel.threads));' \
  'merge_states'"'"' grid misses the last row when rows = k * kThreads + 1'
mutant combine_one_pass_of_columns kernels/decode/decode_combine.cuh 1 \
  'if (e < p.head_dim) out[e] = from_float<T>(' \
  'if (e < p.head_dim && e < kThreads) out[e] = from_float<T>(' \
  'decode_combine writes only the first kThreads columns of a row'
mutant decode_window_first_tile_late kernels/decode/decode_split_keys.cuh 1 \
  'const int first_tile = begin / tile_keys;' 'const int first_tile = (begin + 1) / tile_keys;' \
  'a window starting on the last key of a tile skips that tile'
mutant rotary_last_row_unused kernels/decode/rotary.cuh 1 \
  '(position >= r.max_position ? r.max_position - 1 : int(position));' \
  '(position >= r.max_position - 1 ? r.max_position - 2 : int(position));' \
  'the rotary tables'"'"' last row clamped to the one before'
# Which kernel and loads the host picks from each tensor's alignment (the sim refuses a misaligned
# 16-byte load, as the GPU faults):
mutant mma_choice_ignores_v_alignment host/src/kv_cache/split_kv_runner.cpp 1 \
  'rows_on_16_bytes(q) && rows_on_16_bytes(cache.k) && rows_on_16_bytes(cache.v);' \
  'rows_on_16_bytes(q) && rows_on_16_bytes(cache.k);' \
  'the tensor-core decode kernel taken with V rows off 16 bytes'
mutant vector_loads_ignore_v_alignment host/src/kv_cache/split_kv_runner.cpp 1 \
  'params.vector_loads = rows_on_16_bytes(cache.k) && rows_on_16_bytes(cache.v);' \
  'params.vector_loads = rows_on_16_bytes(cache.k);' \
  'the SIMT decode kernel loads V rows off 16 bytes 16 bytes at a time'
mutant validate_v_addresses_from_k host/src/validation/kv_cache_validation.cpp 1 \
  'expect_distinct_addresses(function, "cache.v", cache.v);' 'expect_distinct_addresses(function, "cache.v", cache.k);' \
  'append_kv checks K'"'"'s strides where V'"'"'s elements must not share addresses'
# The host's metadata checks (validate_metadata):
mutant validate_skips_last_partial_page host/src/validation/kv_metadata_validation.cpp 1 \
  'const int64_t pages_used = (length + extra_tokens + shape.page_size - 1) / shape.page_size;' \
  'const int64_t pages_used = (length + extra_tokens) / shape.page_size;' \
  'a bad block-table entry in the last, partly filled page passes'
mutant validate_ignores_new_tokens_pages host/src/validation/kv_metadata_validation.cpp 1 \
  'const int64_t pages_used = (length + extra_tokens + shape.page_size - 1) / shape.page_size;' \
  'const int64_t pages_used = (length + shape.page_size - 1) / shape.page_size;' \
  'append_kv: a bad entry in a page only the new tokens reach passes'
mutant validate_refuses_full_cache host/src/validation/kv_metadata_validation.cpp 1 \
  'if (length + extra_tokens > shape.capacity) {' 'if (length + extra_tokens >= shape.capacity) {' \
  'lengths that fill the capacity exactly are refused'

# Backward: the sinks' gradient.
mutant sink_gradient_fourth_digit kernels/backward/sink_gradient.cuh 1 \
  'sum += expf(sink - p.lse[first + i]) * p.d[first + i];' \
  'sum += expf(sink - p.lse[first + i]) * p.d[first + i] * 1.0001f;' \
  'dsinks 1e-4 too large'

# Issue 32: forward and backward
# A tensor read or written with another tensor's strides. The tests give each tensor of a call its
# own layout and row gap (tests/support/tensor_layouts.h); while all shared one, these were the
# same strides and no test could see them.
mutant fused_v_tiles_with_k_stride kernels/forward/flash_fwd.cuh 1 \
  'p.v_stride_row, Traits::kBlockKeys, seq.keys.begin - next0, seq.k_len - next0);' \
  'p.k_stride_row, Traits::kBlockKeys, seq.keys.begin - next0, seq.k_len - next0);' \
  'V tiles after the first read with K'"'"'s row stride'
mutant simt_out_with_q_stride kernels/forward/flash_fwd_simt.cuh 1 \
  'flash_simt_store(out, row * p.out_stride_row + col' 'flash_simt_store(out, row * p.q_stride_row + col' \
  'the SIMT kernel writes out with q'"'"'s row stride'
mutant hopper_out_with_q_head_stride kernels/hopper/flash_fwd_hopper_pipeline.cuh 1 \
  'batch * p.out_stride_batch + head * p.out_stride_head +' 'batch * p.out_stride_batch + head * p.q_stride_head +' \
  'the Hopper kernel places out'"'"'s heads with q'"'"'s head stride'
mutant naive_qk_k_with_q_stride kernels/unfused/qk_tiled.cuh 2 \
  'k, p.k.stride_seq, key0' 'k, p.q.stride_seq, key0' \
  'Q K^T tiles (naive forward, naive backward'"'"'s S) read K with q'"'"'s row stride'
mutant backward_dot_dout_with_out_stride kernels/backward/backward_dot.cuh 1 \
  'i * p.dout_stride_row' 'i * p.out_stride_row' \
  'D = rowsum(dO * O) reads dO with out'"'"'s row stride'
mutant fused_bwd_dv_with_dk_stride kernels/backward/flash_bwd_dkdv.cuh 1 \
  '(seq.k_row_start + key) * p.dv_stride_row;' '(seq.k_row_start + key) * p.dk_stride_row;' \
  'the fused backward stores dV with dK'"'"'s row stride'
mutant fused_bwd_dout_tiles_with_q_stride kernels/backward/flash_bwd_dkdv.cuh 1 \
  'd_o, p.dout_stride_row, BR' 'd_o, f.q_stride_row, BR' \
  'the dK/dV kernel stages dO tiles with q'"'"'s row stride'
# Edges of the work division and of the window, sized from the kernels' traits by the tests.
mutant fused_window_first_tile_one_late kernels/forward/flash_fwd_sequence.cuh 1 \
  'keys.first_tile = first.begin / tile_keys;' 'keys.first_tile = (first.begin + 1) / tile_keys;' \
  'a key tile whose last key is the window'"'"'s first is skipped (forward, deterministic dQ)'
mutant hopper_block_rows_clamp kernels/hopper/flash_fwd_hopper_pipeline.cuh 1 \
  '? seq.q_len - block_row0 : Traits::kBlockRows;' '? seq.q_len - block_row0 - 1 : Traits::kBlockRows;' \
  'the Hopper kernel'"'"'s last partial block takes its keys from its second-to-last row'
mutant fused_bwd_query_tiles_one_short kernels/backward/flash_bwd_dkdv.cuh 1 \
  '(rows.end + BR - 1) / BR - first_tile' '(rows.end + BR - 2) / BR - first_tile' \
  'the dK/dV kernel drops a last query tile holding one row'
mutant grad_kv_window_edge_slice_skipped kernels/backward/grad_kv_tiled.cuh 1 \
  'return key0 < seen.end && key0 + tile_keys > seen.begin;' 'return key0 < seen.end && key0 + tile_keys - 1 > seen.begin;' \
  'naive dK/dV skip rows whose window starts at the last key of the block'"'"'s key tile'
mutant qk_skips_tile_with_window_start kernels/unfused/qk_tiled.cuh 2 \
  'key0 + Tile::kTileN <= seen.begin' 'key0 + Tile::kTileN - 1 <= seen.begin' \
  'a key tile whose last key is the first a row tile'"'"'s window sees is skipped (scores left stale)'
# Reductions over rows: past the first sweep of the block's threads, and not past cu_seqlens.
mutant sink_gradient_first_sweep_only kernels/backward/sink_gradient.cuh 1 \
  'i < rows; i += SinkGradientTraits::kThreads' 'i < rows && i < SinkGradientTraits::kThreads; i += SinkGradientTraits::kThreads' \
  'dsinks sums only the rows of the threads'"'"' first sweep'
mutant sink_gradient_rows_past_cu_seqlens kernels/backward/sink_gradient.cuh 1 \
  'rows = min(max(*p.rows_end, 0), p.rows);' 'rows = p.rows;' \
  'dsinks also sums the rows no varlen sequence owns'
# Left padding (key_start): its rows hold NaN in the tests, and no kernel may read them.
# Issue 48: the fused forward's (192, 128) kernel, its V rows shorter than its Q and K rows.
mutant fused_v_rows_at_qk_length kernels/forward/flash_fwd.cuh 1 \
  '(ks * 16 + ((lane / 8) % 2) * 8 + lane % 8) * V_RE' '(ks * 16 + ((lane / 8) % 2) * 8 + lane % 8) * QK_RE' \
  'P V reads the V tile in rows of q'"'"'s head dim (only where head_dim_v != head_dim_qk)'
mutant fused_bwd_dv_rows_at_qk_length kernels/backward/flash_bwd_dkdv.cuh 1 \
  '* V_RE + dp * 16 + (lane / 16) * 8' '* QK_RE + dp * 16 + (lane / 16) * 8' \
  'the dK/dV kernel'"'"'s dV += P^T dO reads the dO tile in rows of q'"'"'s head dim (only where head_dim_v != head_dim_qk)'
mutant fused_bwd_dq_v_rows_at_qk_length kernels/backward/flash_bwd_dq.cuh 1 \
  'v_tile + (np * 16 + (lane / 16) * 8 + lane % 8) * V_RE' 'v_tile + (np * 16 + (lane / 16) * 8 + lane % 8) * QK_RE' \
  'the deterministic dQ kernel'"'"'s dP = dO V^T reads the V tile in rows of q'"'"'s head dim (only where the head dims differ)'
mutant fused_bwd_dq_accum_rows_at_v_length kernels/backward/flash_bwd_dkdv.cuh 1 \
  '* Traits::kHeadDimQk + dim0;' '* Traits::kHeadDimV + dim0;' \
  'the atomic dQ accumulator steps its rows by v'"'"'s head dim (only where the head dims differ)'
mutant hopper_scores_over_v_dim kernels/hopper/flash_fwd_hopper.cuh 1 \
  'for (int ks = 0; ks < DQK / 16; ++ks) {' 'for (int ks = 0; ks < DV / 16; ++ks) {' \
  'the Hopper kernel'"'"'s S = Q K^T runs over v'"'"'s head dim (only where head_dim_v != head_dim_qk)'
mutant hopper_v_boxes_at_qk_width kernels/hopper/flash_fwd_hopper.cuh 1 \
  'for (int c = 0; c < Traits::kVColumnBlocks; ++c)' 'for (int c = 0; c < Traits::kQkColumnBlocks; ++c)' \
  'the Hopper kernel loads V tiles as wide as K'"'"'s (one TMA box too many at (192, 128))'
mutant fused_left_padding_loaded kernels/forward/flash_fwd.cuh 1 \
  'const bool valid = row >= valid_begin && row < valid_end;' 'const bool valid = row < valid_end;' \
  'the mma.sync kernels load the padding rows before key_start (P V meets their NaN)'
mutant decode_left_padding_staged kernels/decode/decode_split_kv_mma.cuh 1 \
  'const int page = key >= sequence.begin && key < key_end' 'const int page = key < key_end' \
  'the tensor-core decode stages the padding rows before key_start'
mutant repair_ignores_key_start kernels/unfused/gemm_key_repair.cuh 1 \
  'p.causal, p.key_start, p.q_offset, 0)' 'p.causal, nullptr, p.q_offset, 0)' \
  'the cublas path'"'"'s GEMM repair sums over the left padding'
# Issue 36 item 1: packed KV-cache calls, each sequence with its own number of new rows.
mutant packed_rows_take_max_seqlen kernels/decode/decode_split_kv_mma.cuh 1 \
  '  const int seq_q = rows.count;' '  const int seq_q = rows.count > 0 ? p.q_rows.seq : 0;' \
  'the tensor-core decode gives every packed sequence max_seqlen_q rows'
mutant combine_writes_unowned_rows kernels/decode/decode_combine.cuh 1 \
  '    if (!packed_row_owned(p.q_rows, p.batch, i)) continue;' '    (void)packed_row_owned;' \
  'decode_combine writes the packed rows no sequence owns'
mutant packed_rotary_at_max_seqlen kernels/decode/rotary_rows.cuh 1 \
  'int64_t(p.lengths[b]) - rows.count : 0;' 'int64_t(p.lengths[b]) - p.rows.seq : 0;' \
  'q of a packed call rotated as if every sequence had max_seqlen_q rows'
mutant packed_rows_not_cut_at_max_seqlen kernels/decode/new_rows.cuh 1 \
  'return SequenceRows{end - begin < rows.seq ? end - begin : rows.seq, begin, 0};' \
  'return SequenceRows{end - begin, begin, 0};' \
  'a packed sequence longer than max_seqlen keeps its rows past the grid'"'"'s'

# Issue 36 item 3: attention dropout (kernels/common/dropout.cuh). Every path compares with the
# reference fed the library's own mask, so a mask bit, scale or coordinate wrong in one kernel
# fails by a whole probability; the rule itself (shared by the kernels and the reference) is held
# to its documentation by tests/primitives/test_philox.cpp and python/tests/test_dropout.py's own
# Philox. The default MUTATE_TESTS includes the programs that hold the dropout cases
# (tests/forward/test_dropout, tests/backward/test_backward_dropout, tests/primitives/test_philox);
# set it to those three alone to run these mutants quickly.
mutant dropout_rule_row_key_swapped kernels/common/dropout.cuh 1 \
  'const Philox4x32 counter{{uint32_t(key) >> 2, uint32_t(row), uint32_t(base), uint32_t(base >> 32)}};' \
  'const Philox4x32 counter{{uint32_t(row) >> 2, uint32_t(key), uint32_t(base), uint32_t(base >> 32)}};' \
  'the rule'"'"'s counter takes the row where the key goes (the kernels and the reference alike)'
mutant dropout_fused_row_key_swapped kernels/forward/flash_fwd_softmax.cuh 1 \
  's = dropout_apply(p.mods, mods.dropout_stream, row, key0 + t * 8 + 2 * in_group + j, s);' \
  's = dropout_apply(p.mods, mods.dropout_stream, key0 + t * 8 + 2 * in_group + j, row, s);' \
  'the mma.sync forward draws element (key, row) for (row, key)'
mutant dropout_simt_batch_head_swapped kernels/forward/flash_fwd_simt.cuh 1 \
  'dropout_stream(p.mods, batch, head)' 'dropout_stream(p.mods, head, batch)' \
  'the SIMT forward draws the mask of (head, batch) for (batch, head)'
mutant dropout_softmax_chunk_row kernels/unfused/softmax_rows.cuh 1 \
  'dropout_apply(p.mods, mods.dropout_stream, query, key, prob)' 'dropout_apply(p.mods, mods.dropout_stream, row, key, prob)' \
  'the naive/cublas softmax draws with the row in its chunk, not in the call'
mutant dropout_fused_bwd_dp_unscaled kernels/backward/flash_bwd_common.cuh 1 \
  'p * (dp * f.mods.dropout_scale - d_row) * factor' 'p * (dp - d_row) * factor' \
  'the fused backward'"'"'s dS takes dP without 1 / (1 - p) (both dQ modes)'
mutant dropout_naive_bwd_dv_unscaled kernels/backward/backward_scores.cuh 1 \
  'p_value = keep ? p_value * p.mods.dropout_scale : 0.0f;' 'p_value = keep ? p_value : 0.0f;' \
  'the naive/cublas backward'"'"'s dV takes the kept P without 1 / (1 - p)'
mutant dropout_varlen_sequence_lost host/src/forward/score_chunks.cpp 1 \
  'padded.dropout_batch_base = b;' 'padded.dropout_batch_base = 0;' \
  'the naive/cublas paths draw every varlen sequence'"'"'s mask as sequence 0'"'"'s'
mutant dropout_hopper_not_routed_away host/src/forward/fused_hopper.cpp 1 \
  'if (call.dropout_p > 0) return nullptr;' 'if (call.dropout_p > 1) return nullptr;' \
  'calls with dropout reach the Hopper kernel, which has none'

# Issue 46 item 2: attention_probabilities (the naive path's softmax writing the weights, dropped
# ones negated, into the caller's [batch, heads, seq_q, seq_k]); tests/forward/test_probabilities.
mutant probabilities_dropped_sign_inverted kernels/unfused/softmax_rows.cuh 1 \
  'query, key) ? prob : -prob;' 'query, key) ? -prob : prob;' \
  'attention_probabilities negates the kept weights instead of the dropped ones'
mutant probabilities_unseen_keys_signed kernels/unfused/softmax_rows.cuh 1 \
  'if (key < seen.begin || key >= seen.end) return 0.0f;' 'if (false) return 0.0f;' \
  'keys a row does not see come back -0 where dropout would drop them, not +0'
mutant probabilities_pair_stride_ignored host/src/forward/score_chunks.cpp 1 \
  'params.p_bh_stride = p_pair_stride >= 0 ? p_pair_stride : p_row_stride * chunk.rows;' \
  'params.p_bh_stride = p_row_stride * chunk.rows;' \
  'a chunk of rows writes each (batch, head) pair at the chunk'"'"'s stride, not the whole output'"'"'s'

# Issue 37: FP8 KV caches (dequantization in the decode kernels and the gather, quantization in
# append_kv, the per-kv-head scale).
mutant fp8_v_scale_dropped kernels/decode/decode_split_kv.cuh 1 \
  'to_float(x) * v_scale : to_float(x); };' 'to_float(x) : to_float(x); };' \
  'the split-KV kernel dequantizes an FP8 cache'"'"'s K with its scale but V without'
mutant fp8_quantize_truncates kernels/common/simt_tile.cuh 1 \
  '  r.__x = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);' \
  '  uint32_t bits; memcpy(&bits, &x, 4); bits &= 0xFFF00000u; memcpy(&x, &bits, 4); r.__x = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);' \
  'e4m3 quantization truncates toward zero instead of rounding to nearest even'
mutant fp8_mma_v_scale_dropped kernels/decode/decode_split_kv_mma.cuh 1 \
  'v_chunk = decode_mma_chunk<T>(v_cache + v_rows[n] + c, scales.v);' \
  'v_chunk = decode_mma_chunk<T>(v_cache + v_rows[n] + c, 1.0f);' \
  'the tensor-core decode stages an FP8 cache'"'"'s V without its scale'
mutant fp8_gather_v_scale_dropped kernels/decode/kv_gather.cuh 1 \
  'real(v_cache[kv_v_offset(p.cache, page, head, t) + e], scales.v);' \
  'real(v_cache[kv_v_offset(p.cache, page, head, t) + e], 1.0f);' \
  'the naive/cublas gather dequantizes an FP8 cache'"'"'s V without its scale'
mutant fp8_scale_per_tensor_only kernels/decode/kv_pages.cuh 1 \
  'return scales[scale_count > 1 ?' 'return scales[scale_count > 100000 ?' \
  'every kv head takes kv head 0'"'"'s scale (per-kv-head scales ignored)'

# Issue 37 item 3: FP8 attention inputs, dequantized for every path but the Hopper FP8 kernel.
mutant fp8_input_descale_batch_0 kernels/forward/dequantize_fp8.cuh 1 \
  '? dequantize_sequence_of(p.cu_seqlens, p.sequences, row) : b;' \
  '? dequantize_sequence_of(p.cu_seqlens, p.sequences, row) : 0;' \
  'every batch of a padded call takes batch 0'"'"'s descales'
mutant fp8_input_descale_per_query_head kernels/forward/dequantize_fp8.cuh 1 \
  'const int kv_head = head / p.heads_per_descale;' 'const int kv_head = head % p.kv_heads;' \
  'GQA: query head h takes kv head h % kv_heads'"'"'s q descale instead of h / group'"'"'s'
mutant fp8_input_sequence_search_low kernels/forward/dequantize_fp8.cuh 1 \
  'if (cu_seqlens[mid] <= row) {' 'if (cu_seqlens[mid] < row) {' \
  'a varlen row that starts its sequence takes the previous sequence'"'"'s descales'
# Issue 37 item 3: the Hopper FP8 forward (kernels/hopper/flash_fwd_hopper_fp8.cuh, its V^T
# pre-pass transpose_v_fp8.cuh), judged by tests/forward/test_fused_hopper_fp8 and test_fp8_forward
# (set MUTATE_TESTS to those two to run these quickly); what catches each: tests/README.md.
mutant fp8_qk_descale_ignored kernels/hopper/flash_fwd_hopper_fp8.cuh 1 \
  'if (qk_descale != 1.0f) {' 'if (false && qk_descale != 1.0f) {' \
  'the FP8 kernel'"'"'s scores left as stored (q_descale * k_descale ignored)'
mutant fp8_v_descale_ignored kernels/hopper/flash_fwd_hopper_fp8.cuh 1 \
  'if (v_descale != 1.0f) {' 'if (false && v_descale != 1.0f) {' \
  'the FP8 kernel'"'"'s O left without v_descale'
mutant fp8_vt_permutation_off_by_one kernels/hopper/transpose_v_fp8.cuh 1 \
  'fp8_pv_key(column % 16)' 'fp8_pv_key((column + 1) % 16)' \
  'V^T'"'"'s keys stored one place off P'"'"'s permutation'
mutant fp8_vt_reads_past_key_length kernels/hopper/transpose_v_fp8.cuh 1 \
  'if (key < k_len) value' 'if (key < p.seq_k) value' \
  'the pre-pass copies V'"'"'s rows past a batch'"'"'s key length (NaN there) instead of zeros'

# Issue 46 item 10: edges no test reached before - the rotary tables' last row and past it, a packed
# append's offsets out of order, a batch index at the cache's row count, the combine's blocks
# each serving several rows (ContextState::decode_combine_max_blocks lowered), and the sim
# profiler's 8-byte bank conflicts and speed-of-light writes (what catches each: tests/README.md).
mutant rotary_clamp_one_row_late kernels/decode/rotary.cuh 1 \
  '(position >= r.max_position ? r.max_position - 1' '(position > r.max_position ? r.max_position - 1' \
  'a position one past the rotary tables reads the row after their last'
mutant rotary_negative_unclamped kernels/decode/rotary.cuh 1 \
  'position < 0 ? 0 :' 'position < -1 ? 0 :' \
  'a position one before 0 reads the row before the rotary tables'"'"' first'
mutant packed_append_offsets_unordered host/src/kv_cache/kv_cache.cpp 1 \
  'params.rows = new_rows(k_new, ordered_offsets(state, packed, shape.batch, workspace, function), seq_new);' \
  'params.rows = new_rows(k_new, packed ? ((void)workspace, packed->cu_seqlens) : nullptr, seq_new);' \
  'append_kv_varlen reads cu_seqlens_new as given, not through its running maximum'
mutant batch_index_row_count_in_cache kernels/decode/kv_pages.cuh 1 \
  'return row >= 0 && row < c.num_pages ? row : -1;' 'return row >= 0 && row <= c.num_pages ? row : -1;' \
  'a batch index equal to the cache'"'"'s row count taken as a row of it'
mutant validate_batch_index_row_count_passes host/src/validation/kv_metadata_validation.cpp 1 \
  'rows[size_t(b)] >= shape.num_pages)' 'rows[size_t(b)] > shape.num_pages)' \
  'validate_metadata passes a batch index equal to the cache'"'"'s row count'
mutant combine_barrier_between_chunks_only kernels/decode/decode_combine.cuh 1 \
  '      __syncthreads();  // the previous chunk'"'"'s (or row'"'"'s) weights are read' \
  '      if (chunk > 0) __syncthreads();  // the previous chunk'"'"'s (or row'"'"'s) weights are read' \
  'decode_combine rewrites a row'"'"'s weights while its threads may still read the previous row'"'"'s'
mutant combine_stride_skips_rows kernels/decode/decode_combine.cuh 1 \
  'row < p.rows; row += gridDim.x) {' 'row < p.rows; row += 2 * gridDim.x) {' \
  'decode_combine'"'"'s blocks skip every other round of the rows past the grid'
mutant profile_eight_bytes_one_phase sim/src/profile.cpp 1 \
  'widest <= 4 ? 1 : widest <= 8 ? 2 : 4' 'widest <= 8 ? 1 : 4' \
  'the profiler serves a warp'"'"'s 8-byte shared accesses in one phase, not two half-warps'
mutant profile_phases_interleaved sim/src/profile.cpp 1 \
  'for (unsigned lane = phase * per_phase; lane < (phase + 1) * per_phase; ++lane) {' \
  'for (unsigned lane = phase; lane < kWarpSize; lane += phases) {' \
  'the profiler'"'"'s shared-memory phases take every other lane, not consecutive half- or quarter-warps'
mutant sol_sm_global_reads_only sim/src/speed_of_light.cpp 1 \
  '32.0 * double(std::max(reads.sectors, writes.sectors))' '32.0 * double(reads.sectors)' \
  'the speed of light'"'"'s per-SM global path counts the sectors read, not the larger direction'

# Issue 35 item 4: access-pattern regressions that change no value - an unpadded (conflicting)
# shared layout, a strided global load. Only the test_*_access_pattern programs (the sim's
# profiler) can catch them.
mutant fused_rows_unpadded kernels/forward/flash_fwd.cuh 1 \
  'static constexpr int kQkRowElems = HeadDimQk + 8;' 'static constexpr int kQkRowElems = HeadDimQk;' \
  'the fused forward'"'"'s Q/K rows unpadded: every ldmatrix of Q and K 8-way bank-conflicted'
mutant fused_tile_load_strided kernels/forward/flash_fwd.cuh 1 \
  'const int row = i / kChunks, chunk = i % kChunks;' 'const int row = i % rows, chunk = i / rows;' \
  'Q/K/V (and the backward'"'"'s Q/dO/K/V) tiles loaded down the rows: 32 sectors per request, not 16'
mutant fused_bwd_rows_unpadded kernels/backward/flash_bwd_dkdv.cuh 1 \
  'static constexpr int kQkRowElems = HeadDimQk + 8;' 'static constexpr int kQkRowElems = HeadDimQk;' \
  'the dK/dV kernel'"'"'s rows unpadded: its ldmatrix 8-way bank-conflicted'
mutant decode_rows_unpadded kernels/decode/decode_split_kv_mma.cuh 1 \
  'static constexpr int kLd = D + 8;' 'static constexpr int kLd = D;' \
  'the tensor-core decode'"'"'s staged K/V rows unpadded: its ldmatrix 8-way bank-conflicted'
mutant decode_merge_unpadded kernels/decode/decode_split_kv_mma.cuh 1 \
  'static constexpr int kMergeLd = D + 8;' 'static constexpr int kMergeLd = D;' \
  'the tensor-core decode'"'"'s merge rows unpadded: its float2 stores 4-way bank-conflicted'

# Issue 47 item 3: two head dims (head_dim_qk for q and k, head_dim_v for v and out) through the
# call; tests/forward/test_head_dims.
mutant naive_pv_over_qk_dim host/src/forward/path_naive.cpp 1 \
  '    pv.head_dim = call.head_dim_v;' '    pv.head_dim = call.head_dim_qk;' \
  'the naive path'"'"'s P V runs over q'"'"'s head dim, not v'"'"'s'
mutant cublas_pv_over_qk_dim host/src/forward/path_cublas.cpp 1 \
  '      pv.m = call.head_dim_v;' '      pv.m = call.head_dim_qk;' \
  'the cublas path'"'"'s P V GEMM has q'"'"'s head dim as its rows'
mutant fused_backward_names_no_pair host/src/backward/backward_fused.cpp 1 \
  '  if (entry_for(ctx, f) == nullptr && !f.equal_head_dims())' '  if (false)' \
  'the fused backward refuses an unequal pair it has no kernel for without naming head_dim_v != head_dim_qk'
mutant naive_backward_dv_accumulator_at_qk_width host/src/backward/backward_naive.cpp 1 \
  ': planned.call.forward.head_dim_v;' ': planned.call.forward.head_dim_qk;' \
  'the score backward'"'"'s dV accumulator laid out in rows of q'"'"'s head dim'
mutant cublas_backward_kv_ldc_at_qk_width host/src/backward/backward_cublas.cpp 1 \
  '          g.ldc = acc.row_length;' '          g.ldc = call.head_dim_qk;' \
  'the cublas backward'"'"'s dK/dV GEMMs step their accumulators by q'"'"'s head dim'
mutant score_backward_dp_over_qk_dim host/src/forward/score_chunks.cpp 1 \
  '  qk.head_dim = int(a.head_dim());' '  qk.head_dim = int(call.head_dim_qk);' \
  'the naive backward'"'"'s dP = dO V^T runs over q'"'"'s head dim, not v'"'"'s'
# Issue 48 item 2: caches whose K and V rows differ, and latent caches (V a view of K's leading columns).
mutant decode_v_rows_at_k_length kernels/decode/decode_split_kv.cuh 1 \
  'for (int n = 0; n < N; ++n) o = fmaf(p_s[r * N + n], v_s[n * dv + col], o);' \
  'for (int n = 0; n < N; ++n) o = fmaf(p_s[r * N + n], v_s[n * d + col], o);' \
  'the SIMT split-KV kernel reads staged V in rows of K'"'"'s head dim'
mutant gather_v_at_k_stride kernels/decode/kv_gather.cuh 1 \
  'v_out[int64_t(t) * p.v_out_stride_row + e] =' 'v_out[int64_t(t) * p.k_out_stride_row + e] =' \
  'the gather lays out V'"'"'s rows at K'"'"'s row stride'
mutant combine_at_k_width host/src/kv_cache/split_kv_runner.cpp 1 \
  'merge.head_dim = shape.head_dim_v;' 'merge.head_dim = shape.head_dim_qk;' \
  'decode_combine merges the splits'"'"' partial O in rows of K'"'"'s head dim'
mutant rotary_from_column_0 kernels/decode/rotary.cuh 1 \
  'const int e = e_in_row - r.first_dim;' 'const int e = e_in_row;' \
  'rotary ignores first_dim and rotates a row'"'"'s first columns'
# Issue 48 item 3: the latent decode kernel (DeepSeek's absorbed MLA on mma.sync).
mutant latent_s_one_depth_half kernels/decode/decode_latent_mma.cuh 1 \
  'const float dots[2] = {low.x + high.x, low.y + high.y};' 'const float dots[2] = {low.x, low.y};' \
  'the latent kernel'"'"'s scores leave out the second half of the depth'
mutant latent_v_columns_of_warp0 kernels/decode/decode_latent_mma.cuh 1 \
  'load_b_from_kn(vf, k_s, LD, column0 + n0, 16 * ks);' 'load_b_from_kn(vf, k_s, LD, n0, 16 * ks);' \
  'every warp of the latent kernel multiplies P by V'"'"'s first columns'
mutant latent_second_key_step_reads_first kernels/decode/decode_latent_mma.cuh 1 \
  'LD, column0 + n0, 16 * ks);' 'LD, column0 + n0, 0);' \
  'the latent kernel'"'"'s P V multiplies the tile'"'"'s last 16 probabilities by its first 16 keys'"'"' V'
mutant latent_rows_past_the_group kernels/decode/decode_latent_mma.cuh 1 \
  '    if (row >= group_rows) continue;' '    (void)group_rows;' \
  'the latent kernel writes the rows of its last block past the group'
