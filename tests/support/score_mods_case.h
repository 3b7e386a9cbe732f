#pragma once
// Masks and score modifiers of a test case (sliding window, softcap, ALiBi, additive bias, attention
// sinks): what a case asks for, and the inputs made from it - random slopes, bias and sinks uploaded
// to the device in the asked layout, and the same values, the bias expanded to dense [batch, heads,
// seq_q, seq_k], for the double reference. Used by the attention harness (AttentionCase::mods, VarlenCase::mods).
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "selfattn/selfattn.h"

namespace selfattn::testing {

// How the bias is stored. Each is a view of one allocation, never an expanded copy:
//   full    [batch, heads, seq_q, seq_k], rows padded (row stride seq_k + 3)
//   heads   [1, heads, seq_q, seq_k]      shared by the batch (extent 1)
//   batch   [batch, 1, seq_q, seq_k]      shared by the heads
//   keys    [1, 1, seq_q, seq_k]          one [q, k] matrix for every (batch, head)
//   stride0 [batch, heads, seq_q, seq_k]  full shape, strides 0 on batch and heads
enum class BiasLayout : uint8_t { none, full, heads, batch, keys, stride0 };
const char* to_string(BiasLayout layout);

enum class AlibiSlopes : uint8_t { none, heads, batch_heads };

struct ScoreModsCase {
  int window_left = -1, window_right = -1;
  std::optional<float> softcap;
  AlibiSlopes alibi = AlibiSlopes::none;
  BiasLayout bias = BiasLayout::none;
  bool bias_in_input_dtype = false;  // else fp32
  // A boolean mask (DType::b8: 1 where a key may be seen, 0 where it is masked) instead of values:
  // the masked entries below, every other entry 0.
  bool bias_bool = false;
  // -inf entries of the bias: query rows r with r % masked_row_period == masked_row_period - 1
  // entirely (rows that see no key), keys k with k % masked_key_period == 1 (columns). 0: none.
  int masked_row_period = 0, masked_key_period = 0;
  // Masked entries hold the bias dtype's lowest finite value (-FLT_MAX for f32 and bf16's -3.39e38:
  // torch.finfo(dtype).min, the additive masks of many models) instead of -inf.
  bool mask_with_lowest = false;
  // Extra elements between the bias's batches (full and batch layouts): 2^31 puts batch 1 past
  // 32-bit element offsets; only the batches' blocks are touched (the sim reserves the gap).
  int64_t bias_batch_gap = 0;
  // Attention sinks: one logit per head, drawn around the scores' own size (so that the sink takes a
  // real share of each row: a sink far below every score would change nothing measurable); every
  // third head (h % 3 == 2) has none (-inf).
  bool sinks = false;
  // Dropout (AttentionOptions::dropout_p, seed, offset); the reference gets the library's mask
  // (reference::dropout_keep_mask). Not for the KV cache, which has none.
  float dropout_p = 0;
  uint64_t dropout_seed = 0, dropout_offset = 0;

  bool any() const;
  // "" when none, else " window=L,R softcap=C alibi=heads bias=full/f32 -inf=rows5,keys7".
  std::string name() const;
};

// The device inputs of one case's modifiers and their logical values.
struct ScoreModsData {
  DeviceBuffer<float> slopes;
  DeviceBuffer<unsigned char> bias_storage;
  std::optional<TensorView> bias;
  std::vector<double> slopes_logical;  // as uploaded: [heads] or [batch, heads]
  std::vector<double> bias_logical;    // dense [batch, heads, seq_q, seq_k]
  DeviceBuffer<float> sinks;
  std::vector<double> sinks_logical;   // [heads] or empty
  int batch = 0, heads = 0, seq_q = 0, seq_k = 0;

  // The options of attention() or attention_with_kv_cache() (the fields have the same names).
  template <class Options>
  void apply(const ScoreModsCase& c, Options& options) const {
    options.window_left = c.window_left;
    options.window_right = c.window_right;
    options.softcap = c.softcap;
    if (!slopes_logical.empty()) {
      options.alibi_slopes = slopes.data();
      options.alibi_slopes_count = int64_t(slopes_logical.size());
    }
    options.bias = bias;
    if (!sinks_logical.empty()) options.sinks = sinks.data();
    if constexpr (std::is_same_v<Options, AttentionOptions>) {
      options.dropout_p = c.dropout_p;
      options.dropout_seed = c.dropout_seed;
      options.dropout_offset = c.dropout_offset;
    }
  }
  // The reference problem of the whole call, or (varlen) of sequence `b` alone with len_q rows and
  // len_k keys of the [batch, heads, max_q, max_k] bias.
  void apply(const ScoreModsCase& c, reference::Problem& problem) const;
  void apply_sequence(const ScoreModsCase& c, reference::Problem& problem, int b, int len_q, int len_k) const;
};

// Random slopes (positive, ALiBi-sized) and bias (normal, with the case's -inf pattern) for a call
// of extent [batch, heads, seq_q, seq_k]; dtype is q's (for bias_in_input_dtype).
ScoreModsData make_score_mods(Context& ctx, const ScoreModsCase& c, DType dtype, int batch, int heads, int seq_q,
                              int seq_k, std::mt19937_64& rng);

}  // namespace selfattn::testing
