#pragma once
// The harness's device tensors and operands, shared by its checks (attention_harness.cpp,
// varlen_check.cpp, backward_padding_check.cpp) and by nothing else: a case's tensor in device
// memory with its row gaps, one input's logical values and device copy, the host copies' indexing,
// and the judging of out and lse. Internal to the support library (namespace harness).
#include <cstddef>
#include <random>
#include <string>
#include <vector>

#include "attention_harness.h"

namespace selfattn::testing::harness {

// A tensor of the case in device memory. Each batch is a [heads, seq, head_dim] block in the
// layout tensor_layout() gives the tensor's role, every row (one head's head_dim elements) followed
// by its row gap (as a slice of a packed QKV projection is); consecutive batches are c.batch_gap
// elements further apart, so host copies go batch by batch and the gaps (possibly gigabytes on the
// sim) are never touched. The view starts c.misalign elements into the allocation.
struct DeviceTensor {
  DeviceBuffer<unsigned char> device;
  TensorView view;
  size_t element = 0;      // bytes per element
  size_t batch_bytes = 0;  // one batch block, row gaps included
  size_t misalign_bytes = 0;
  size_t batch_offset_bytes(int b) const { return misalign_bytes + size_t(b * view.strides[0]) * element; }
};

DeviceTensor make_tensor(Context& ctx, const AttentionCase& c, Role role, int heads, int seq, const char* label);

// Index of element (b, h, s, d) in the host copy: the batches' blocks back to back.
size_t host_index(const DeviceTensor& t, int b, int h, int s, int d);

// " label=[v0,v1,...]" for a case's name, or "" when `values` is empty (the option unset).
std::string values_name(const char* label, const std::vector<int32_t>& values);

// Per-sequence int32 metadata (key lengths, starts, offsets) on the device: `values` uploaded into
// `buffer`, its pointer returned; nullptr (the option unset) when `values` is empty.
const int32_t* upload_ints(Context& ctx, DeviceBuffer<int32_t>& buffer, const std::vector<int32_t>& values,
                           const char* label);

void upload(DeviceTensor& t, const std::vector<unsigned char>& host, int batch);
std::vector<unsigned char> download(const DeviceTensor& t, int batch);

// One input of the case: logical values (rounded to the dtype, as double for the reference) and
// their device copy laid out as the view says. keys: how the rows are drawn (Keys).
struct Operand {
  std::vector<double> logical;  // [b, h, s, d] contiguous
  DeviceTensor tensor;
};

// padded_rows: k and v, whose rows past c.key_lengths[b] are padding.
// unowned_rows: the last rows of every head, which no sequence of a varlen call owns: NaN on the
// device (and 0 in `logical`), like the row gaps.
Operand make_operand(Context& ctx, const AttentionCase& c, Role role, int heads, int seq, std::mt19937_64& rng,
                     const char* label, Keys keys = Keys::random, bool padded_rows = false, int unowned_rows = 0);

// The dtype a tensor of the case is stored in: c.fp8 for q, k and v when set, else c.dtype.
DType stored_dtype(const AttentionCase& c, Role role);

// FP8 inputs: op's logical values (the stored ones) times fp8_descale(role, b', h / group), b' the
// batch, or row_batch[s] when given (a packed varlen tensor: each row's sequence).
void apply_fp8_descales(Operand& op, Role role, int batch, int heads, int group, int seq, int head_dim,
                        const std::vector<int>& row_batch = {});
// fp8_descale(role, b, g) for every (b, g): what options.*_descale point at.
std::vector<float> fp8_descales(Role role, int batch, int kv_heads);

// The values of out as the reference orders them ([b, h, s, d]), read from the host copy.
std::vector<double> out_values(const DeviceTensor& out, const std::vector<unsigned char>& host, int batch, int heads,
                               int first_row, int rows);

// Judges out, then lse when the call asked for it; m receives both judgements.
::testing::AssertionResult judge_attention(const std::string& name, const AttentionExpected& expected,
                                           const std::vector<double>& out, const std::vector<double>* lse,
                                           const RowNamer& row_name, Measured& m);

}  // namespace selfattn::testing::harness
