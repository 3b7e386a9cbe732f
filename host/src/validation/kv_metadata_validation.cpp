// The KV-cache calls' checks that read device metadata back to the host (kv_cache_validation.h):
// options.validate_metadata's, and the packed call's offsets on the naive and cublas paths, which
// read them back anyway. Each message names the entry and what the kernels do with it unchecked.
#include <string>
#include <vector>

#include "selfattn/error.h"
#include "validation/kv_cache_validation.h"

namespace selfattn::detail {
namespace {

[[noreturn]] void fail(const char* function, const std::string& message) {
  throw InvalidArgument(std::string(function) + ": " + message);
}

std::string str(int64_t value) { return std::to_string(value); }

}  // namespace

void check_packed_offsets(const char* function, const std::vector<int32_t>& offsets, const PackedRows& packed,
                          int64_t total, bool appending, const std::string& consequence) {
  const std::string name = appending ? "cu_seqlens_new" : "cu_seqlens_q";
  const std::string bound = appending ? "max_seqlen_new" : "max_seqlen_q";
  const std::string rows = appending ? "k_new" : "q";
  const auto entry = [&](size_t i) { return name + "[" + str(int64_t(i)) + "]"; };
  const auto refuse = [&](const std::string& what) { fail(function, what + " (" + consequence + ")"); };
  if (offsets.empty()) return;
  if (offsets[0] != 0) {
    refuse(entry(0) + " = " + str(offsets[0]) + " expected 0 (sequence 0 starts at " + rows + "'s first row)");
  }
  for (size_t i = 1; i < offsets.size(); ++i) {
    const int64_t first = offsets[i - 1], last = offsets[i], b = int64_t(i) - 1;
    const std::string sequence = "sequence " + str(b);
    const std::string span = "rows [" + str(first) + ", " + str(last) + ")";
    if (last < first) {
      refuse(entry(i) + " = " + str(last) + " is below " + entry(i - 1) + " = " + str(first) + " (" + sequence +
             " would own " + str(last - first) + " rows; the offsets must not decrease)");
    }
    if (last > total) {
      refuse(entry(i) + " = " + str(last) + " runs past " + rows + "'s " + str(total) + " rows (" + sequence + ": " +
             span + ")");
    }
    if (last - first > packed.max_seqlen) {
      refuse(entry(i) + " - " + entry(i - 1) + " = " + str(last - first) + " exceeds " + bound + " = " +
             str(packed.max_seqlen) + " (" + sequence + ": " + span + ")");
    }
  }
}

void check_metadata(const char* function, ContextState& ctx, const KvCache& cache, const CacheShape& shape,
                    int extra_tokens, const PackedRows* packed, int64_t total, bool appending) {
  if (shape.batch == 0) return;
  // Each message says what the kernels do with the entry without validate_metadata.
  const std::string unchecked = "validate_metadata; without it the kernels ";
  std::vector<int32_t> lengths(size_t(shape.batch));
  ctx.device->copy(lengths.data(), cache.lengths, lengths.size() * sizeof(int32_t), /*async=*/false);
  std::vector<int32_t> offsets;
  if (packed) {
    const std::string name = appending ? "cu_seqlens_new" : "cu_seqlens_q";
    offsets.resize(size_t(shape.batch) + 1);
    ctx.device->copy(offsets.data(), packed->cu_seqlens, offsets.size() * sizeof(int32_t), /*async=*/false);
    check_packed_offsets(function, offsets, *packed, total, appending,
                         unchecked + "clamp " + name + ": read in order, each entry into [0, " + str(total) +
                             "], each sequence cut to " + (appending ? "max_seqlen_new" : "max_seqlen_q") + " rows");
  }
  std::vector<int32_t> table, rows;
  if (cache.batch_index != nullptr) {
    rows.resize(size_t(shape.batch));
    ctx.device->copy(rows.data(), cache.batch_index, rows.size() * sizeof(int32_t), /*async=*/false);
  }
  if (cache.paged()) {
    table.resize(size_t(shape.batch) * size_t(shape.max_pages_per_seq));
    ctx.device->copy(table.data(), cache.block_table, table.size() * sizeof(int32_t), /*async=*/false);
  }
  for (int b = 0; b < shape.batch; ++b) {
    if (packed && appending) extra_tokens = offsets[size_t(b) + 1] - offsets[size_t(b)];
    const int64_t length = lengths[size_t(b)];
    const std::string entry = "cache.lengths[" + str(b) + "]";
    if (length < 0) fail(function, entry + " expected >= 0, got " + str(length) + " (" + unchecked + "read it as 0)");
    if (length + extra_tokens > shape.capacity) {
      const std::string clamped = length > shape.capacity ? "read it as the capacity" : "drop the tokens past it";
      fail(function, entry + " expected <= " + str(int64_t(shape.capacity) - extra_tokens) + " (capacity " +
                         str(shape.capacity) + (extra_tokens ? " - seq_new " + str(extra_tokens) : std::string()) +
                         "), got " + str(length) + " (" + unchecked + clamped + ")");
    }
    if (!rows.empty() && (rows[size_t(b)] < 0 || rows[size_t(b)] >= shape.num_pages)) {
      fail(function, "cache.batch_index[" + str(b) + "] expected a row in [0, " + str(shape.num_pages) +
                         ") (cache.k.shape[0]), got " + str(rows[size_t(b)]) + " (" + unchecked +
                         "read no token from it and write none to it)");
    }
    if (!cache.paged()) continue;
    const int64_t pages_used = (length + extra_tokens + shape.page_size - 1) / shape.page_size;
    for (int64_t i = 0; i < pages_used; ++i) {
      const int32_t page = table[size_t(b) * size_t(shape.max_pages_per_seq) + size_t(i)];
      if (page < 0 || page >= shape.num_pages) {
        fail(function, "cache.block_table[" + str(b) + "][" + str(i) + "] expected a page in [0, " +
                           str(shape.num_pages) + ") (cache.k.shape[0]), got " + str(page) + " (" + unchecked +
                           "read it as zeros and write nothing to it)");
      }
    }
  }
}

void check_offsets_read_back(const char* function, ContextState& ctx, const PackedRows& packed, int batch,
                             int64_t total) {
  if (batch == 0) return;
  std::vector<int32_t> offsets(size_t(batch) + 1);
  ctx.device->copy(offsets.data(), packed.cu_seqlens, offsets.size() * sizeof(int32_t), /*async=*/false);
  check_packed_offsets(function, offsets, packed, total, /*appending=*/false,
                       "the naive and cublas paths read cu_seqlens_q back and refuse it; the fused path clamps it "
                       "unless validate_metadata is set");
}

}  // namespace selfattn::detail
