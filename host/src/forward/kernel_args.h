#pragma once
// The host's enums as the kernels spell them (kernels/ knows nothing of the public API).
#include <cstdint>

#include "kernels/common/dropout.cuh"
#include "kernels/forward/flash_fwd_params.h"
#include "kernels/decode/kv_cache_params.h"
#include "kernels/params.h"
#include "forward/paths.h"
#include "selfattn/types.h"

namespace selfattn::detail {

inline kernels::Element element_of(DType dtype) {
  switch (dtype) {
    case DType::f32: return kernels::Element::f32;
    case DType::f16: return kernels::Element::f16;
    case DType::bf16: return kernels::Element::bf16;
    case DType::b8: break;  // only a bias: bias_element_of
    case DType::e4m3:
    case DType::e5m2: break;  // only a KV cache: cache_element_of
  }
  return kernels::Element::f32;
}

inline kernels::BiasElement bias_element_of(DType dtype) {
  switch (dtype) {
    case DType::f32: return kernels::BiasElement::f32;
    case DType::f16: return kernels::BiasElement::f16;
    case DType::bf16: return kernels::BiasElement::bf16;
    case DType::b8: return kernels::BiasElement::b8;
    case DType::e4m3:
    case DType::e5m2: break;  // never a bias (validation refuses it)
  }
  return kernels::BiasElement::f32;
}

// An FP8 cache's element (is_fp8(dtype)); e4m3 for anything else, never asked.
inline kernels::CacheElement cache_element_of(DType dtype) {
  return dtype == DType::e5m2 ? kernels::CacheElement::e5m2 : kernels::CacheElement::e4m3;
}

inline kernels::CausalMask causal_mask_of(Causal causal) {
  switch (causal) {
    case Causal::none: return kernels::CausalMask::none;
    case Causal::top_left: return kernels::CausalMask::top_left;
    case Causal::bottom_right: return kernels::CausalMask::bottom_right;
  }
  return kernels::CausalMask::none;
}

// The call's window, softcap, ALiBi, bias and sinks as every kernel takes them (kernels/common/score_mods.cuh).
inline kernels::ScoreMods score_mods_of(const AttentionCall& call) {
  kernels::ScoreMods mods{};
  mods.window_left = call.window_left;
  mods.window_right = call.window_right;
  mods.softcap = call.softcap;
  mods.alibi_slopes = call.alibi_slopes;
  mods.alibi_stride_batch = call.alibi_stride_batch;
  if (call.bias) {
    const TensorView& bias = *call.bias;
    mods.bias = bias.data;
    mods.bias_element = bias_element_of(bias.dtype);
    mods.bias_stride_batch = bias.strides[0];
    mods.bias_stride_head = bias.strides[1];
    mods.bias_stride_row = bias.strides[2];
    mods.bias_stride_key = bias.strides[3];
    mods.bias_rows = int(bias.shape[2]);
    mods.bias_keys = int(bias.shape[3]);
  }
  mods.changes_values = call.softcap > 0 || call.alibi_slopes != nullptr || call.bias.has_value();
  mods.sinks = call.sinks;
  if (call.dropout_p > 0) {
    mods.dropout_threshold = kernels::dropout_threshold(call.dropout_p);
    mods.dropout_scale = float(1.0 / (1.0 - double(call.dropout_p)));
    mods.dropout_seed = call.dropout_seed;
    mods.dropout_offset = call.dropout_offset;
  }
  mods.dropout_heads = call.heads;
  mods.dropout_batch_base = call.dropout_batch_base;
  return mods;
}

// The fused forward kernels' parameters for a call (path_fused.cpp); the fused backward uses them to
// describe the forward call it differentiates.
kernels::FlashFwdParams flash_fwd_params_of(const AttentionCall& call);

// Whether every row of the view starts on 16 bytes (data and every stride): the fused kernels move
// rows in 16-byte cp.async chunks (path_fused.cpp; the fused backward requires it of every view).
bool rows_16_byte_aligned(const TensorView& view);

}  // namespace selfattn::detail
