#pragma once
// Rotary position embedding of one element (selfattn::Rotary's definition): element e of a row at
// `position`, given the row's elements through load(i). Each element is computed from itself and
// its partner, so threads can rotate a row's elements independently.
#include "../common/compat.h"
#include "kv_cache_params.h"

SELFATTN_KERNELS_BEGIN

// The position row (token) s of sequence b is rotated at: the caller's positions when given
// (selfattn::Rotary::positions and position_step), else `default_row0 + s`. 64-bit: any length or
// position plus the row; rotary_element clamps it to the table.
__device__ inline int64_t rotary_position(const RotaryTables& r, int b, int64_t default_row0, int s) {
  if (r.positions == nullptr) return default_row0 + s;
  return int64_t(r.positions[b]) + int64_t(r.position_step) * s;
}

// Entry `index` of a cos or sin table, whatever its element type.
__device__ inline float rotary_table_entry(const RotaryTables& r, const void* table, int64_t index) {
  switch (r.table_element) {
    case Element::f16: return __half2float(static_cast<const __half*>(table)[index]);
    case Element::bf16: return __bfloat162float(static_cast<const __nv_bfloat16*>(table)[index]);
    case Element::f32: break;
  }
  return static_cast<const float*>(table)[index];
}

// Element e of the row (the rotated ones: [first_dim, first_dim + rotary_dim), pairs counted from
// first_dim; load takes the row's own indices).
template <class Load>
__device__ inline float rotary_element(const RotaryTables& r, int64_t position, int e_in_row, Load load) {
  const int e = e_in_row - r.first_dim;
  if (r.cos == nullptr || e < 0 || e >= r.rotary_dim) return load(e_in_row);
  const int half = r.rotary_dim / 2;
  // Clamped so that a wrong length cannot index past the tables.
  const int row = position < 0 ? 0 : (position >= r.max_position ? r.max_position - 1 : int(position));
  bool first;
  int pair, partner;
  if (r.interleaved) {
    first = e % 2 == 0;
    pair = e / 2;
    partner = first ? e + 1 : e - 1;
  } else {
    first = e < half;
    pair = first ? e : e - half;
    partner = first ? e + half : e - half;
  }
  const float c = rotary_table_entry(r, r.cos, int64_t(row) * half + pair);
  const float s = rotary_table_entry(r, r.sin, int64_t(row) * half + pair);
  const float x = load(e_in_row), y = load(r.first_dim + partner);
  // first: x' = x cos - y sin (x is the pair's a); second: x' = y sin + x cos (y is the pair's a).
  return first ? x * c - y * s : y * s + x * c;
}

SELFATTN_KERNELS_END
