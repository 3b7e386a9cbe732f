#pragma once
// What selfattn-bench measures: one Case is one shape, dtype, mask, layout and path; its CaseResult
// holds the timings, derived rates and the accuracy check. Shared by the bench's source files.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "selfattn/selfattn.h"

namespace selfattn_bench {

using selfattn::Backend;
using selfattn::Causal;
using selfattn::DType;
using selfattn::is_fp8;
using selfattn::Path;

enum class Layout { bhsd, bshd };

// Additive bias of a case (AttentionOptions::bias), in the input dtype, a view of:
//   full [batch, heads, q, k]; heads [1, heads, q, k]; batch [batch, 1, q, k].
enum class BiasKind { none, full, heads, batch };

// Masks and score modifiers of a case (AttentionOptions).
struct ScoreMods {
  int window_left = -1, window_right = -1;  // -1: unbounded
  float softcap = 0;                        // 0: none
  bool alibi = false;                       // slopes 2^(-8 (h + 1) / heads), [heads]
  BiasKind bias = BiasKind::none;
  bool sinks = false;                       // attention sinks sink_logit(c, h), [heads]
  bool any() const {
    return window_left >= 0 || window_right >= 0 || softcap > 0 || alibi || bias != BiasKind::none || sinks;
  }
};

// A decode case (--mode decode): attention_with_kv_cache over a paged cache of cache_len tokens per
// sequence (Case::seq_k), new_tokens query rows (Case::seq_q), bottom-right, q/out BSHD.
struct DecodeShape {
  int cache_len = 0, page_size = 0, new_tokens = 0;
  int splits = 0;  // KvAttentionOptions::num_splits as asked (0: the library's heuristic)
  // > 0: a continuous-batching step, sequence 0 with this many new rows (a prefill chunk) beside the
  // others' new_tokens, in one packed attention_with_kv_cache_varlen call (q, out [total, heads, d]).
  int prefill_rows = 0;
  // New query rows of sequence b.
  int rows_of(int b) const { return b == 0 && prefill_rows > 0 ? prefill_rows : new_tokens; }
  // The cache's dtype: Case::dtype (q's and out's), or an FP8 format (--kv-dtype: K/V stored in
  // e4m3/e5m2 with fp32 scales per tensor, kv_cache.h), whose bytes are what the cache reads count.
  DType kv_dtype = DType::bf16;
  // A latent cache (MLA's absorbed decode, --mla): V is the first v_dim columns of K's rows, one
  // pool read once (its bytes count K's alone).
  bool latent = false;
};

// What a case times: the forward (attention()), the backward alone (attention_backward() on the
// forward's out and LSE, computed once before timing), or both in sequence, as a training step runs them.
enum class Direction { fwd, bwd, fwd_bwd };

// Which kernel the fused path's forward may use: the library's choice (the Hopper kernel on a 9.0
// device), or the mma.sync kernel pinned (ContextOptions::hopper_kernels = false) - the baseline the
// Hopper kernel is measured against in the same run.
enum class FusedKernel { automatic, mma_sync };

// A case's dtype is its inputs' (q, k, v); FP8 inputs (--dtype e4m3|e5m2, attention.h's FP8
// forward, with descales per (batch, kv head)) give out in bf16, FlashAttention-3's output dtype.
struct Case;
DType out_dtype(const Case& c);
// FP8 inputs' descale of tensor `which` (0 q, 1 k, 2 v) at (batch b, kv head g): four values of few
// significant bits (code x descale is exact in bf16), chosen so normal(0, 1) inputs stay far inside
// either format's finite range.
float fp8_descale(int which, int b, int g);

struct Case {
  Path path = Path::fused;
  Direction direction = Direction::fwd;
  DType dtype = DType::bf16;
  int batch = 1, heads = 1, kv_heads = 1, seq_q = 1, seq_k = 1, head_dim = 64;
  int head_dim_v = 0;  // v's and out's head dim where it is not q's and k's (--head-dim-v); 0: head_dim
  Causal causal = Causal::none;
  Layout layout = Layout::bhsd;
  ScoreMods mods;
  std::optional<DecodeShape> decode;  // set on --mode decode cases
  FusedKernel fused_kernel = FusedKernel::automatic;  // fused path only
};

inline DType out_dtype(const Case& c) { return is_fp8(c.dtype) ? DType::bf16 : c.dtype; }
inline int v_dim(const Case& c) { return c.head_dim_v > 0 ? c.head_dim_v : c.head_dim; }

// "w256,0 cap30 alibi bias=heads sinks", or "-" without modifiers.
std::string describe_mods(const ScoreMods& mods);
// The head dim, or "192/128" (q's and k's / v's) where v's differs.
std::string describe_head_dims(const Case& c);
// The bias value the bench stores at (b, h, row, key) of a case, rounded to its dtype: a cheap
// deterministic pattern (the check recomputes it instead of keeping a copy).
float bias_value(const Case& c, int b, int h, int row, int key);
// ALiBi slope of head h.
float alibi_slope(const Case& c, int h);
// The sink logit of head h: near log(seq_k), where a sink weighs as much as the keys together.
float sink_logit(const Case& c, int h);

// inputs.cpp: host conversions of a float already rounded to f16/bf16 (round to nearest even).
uint16_t to_half_bits(float x, DType dtype);
float from_half_bits(uint16_t bits, DType dtype);
float round_to(float x, DType dtype);
// A tensor of the case as the device stored it (c.layout, c.dtype; c.heads x c.seq_q rows of
// `row_length`: out's is v_dim(c)) to floats in BHSD order.
std::vector<float> from_device_bytes(const std::vector<unsigned char>& bytes, const Case& c, int row_length);
// The case's bias as a device view over `storage` (filled with bias_value), in out's dtype.
selfattn::TensorView make_bias(selfattn::Context& ctx, const Case& c, selfattn::DeviceBuffer<unsigned char>& storage);

// Everything the sweep needs besides the list of cases.
struct RunSettings {
  Backend backend = Backend::sim;
  int warmup = 1;
  int iters = 3;
  bool check = false;
  std::optional<double> tolerance;  // relative-error bound; unset: a per-dtype default
  double whole_check_macs = 3e7;    // larger problems are checked on sampled rows
  std::string profile_gpu;          // --profile (sim): the GPU whose ceilings bound each case; "" = off
};

// Peak rates measured in the same run (cuda only); 0 where not measured.
struct Ceilings {
  double gemm_tflops = 0;  // a large bf16 cuBLAS GEMM, fp32 accumulate
  double copy_gbps = 0;    // device-to-device copy, bytes read + written per second
  std::string gemm_shape;  // e.g. "8192x8192x8192 bf16"
  std::string copy_bytes;  // e.g. "1 GiB"
};

// profile.cpp: one call of a case under the sim's profiler; what it holds is private to profile.cpp.
struct CaseProfile;

// ok: ran (and passed --check when asked); check_failed: ran but the output was wrong; error: the
// library threw a BackendError or similar; skipped: the path does not support the case (note says why).
enum class Status { ok, check_failed, error, skipped };

struct CaseResult {
  Case c;
  Status status = Status::skipped;
  std::string note;            // why skipped, what failed, or which path `auto` chose
  std::string resolved_path;   // the path that ran (differs from c.path for auto)
  double ms_median = 0, ms_min = 0, ms_max = 0;
  double tflops = 0, gbps = 0;
  std::optional<double> pct_of_ceiling;  // tflops / gemm ceiling, percent
  std::optional<double> pct_of_copy;     // gbps / copy ceiling, percent
  std::optional<double> vs_cublas;       // cublas path's median / this median (>1: faster than cublas)
  std::optional<double> vs_mma_sync;     // fused, library's choice: the pinned mma.sync kernel's median / this median
  bool checked = false;                  // --check ran on this case
  bool sampled = false;                  // the check compared sampled rows, not the whole output
  double max_abs_err = 0, rel_err = 0;
  int copies = 1;                        // input sets rotated while timing
  std::shared_ptr<const CaseProfile> profile;  // --profile: one call's launches and their bounds; else null
};

// "fused fwd bf16 b=1 h=2 kvh=2 sq=64 sk=64 d=64 causal=none bhsd" (+ mods, + the decode shape).
std::string describe(const Case& c);

// Names used on the command line, in the table and in JSON/CSV.
const char* name(Path path);
const char* name(Causal causal);
const char* name(Layout layout);
const char* name(DType dtype);
const char* name(Status status);
const char* name(Direction direction);
const char* name(FusedKernel kernel);

// FlashAttention's convention: 4 * b * h * d per visible (query, key) pair for the forward; pairs
// masked by the causal mask or the sliding window are not counted (the bench's bias masks nothing).
// The backward counts 2.5 times that (five matrix products against the forward's two: dV, dP, dQ,
// dK and the recomputed S), fwd+bwd 3.5 times. A decode step with a prefill chunk counts each
// sequence's own rows.
double attention_flops(const Case& c);
// Forward: q, k, v read once and out written once. Backward: q, k, v, out and dout read, dq, dk, dv
// written (LSE and D, one float a row, not counted). fwd+bwd: both. Each at its own dtype's size:
// FP8 inputs one byte an element and out two (bf16), an FP8 decode cache's K/V one byte
// (DecodeShape::kv_dtype); the scales and descales (a float per tensor or per (batch, kv head)) are
// not counted.
double attention_bytes(const Case& c);

// sweep.cpp: a sweep is the product of its lists; the default one depends on the backend.
struct Shape {
  int batch, heads, kv_heads, seq_q, seq_k, head_dim;
  int head_dim_v = 0;  // as Case::head_dim_v
};
struct Sweep {
  std::vector<Shape> shapes;
  std::vector<DType> dtypes;
  std::vector<Causal> causals;
  std::vector<Layout> layouts;
  std::vector<Path> paths;
  std::vector<Direction> directions{Direction::fwd};
  std::vector<FusedKernel> fused_kernels{FusedKernel::automatic};  // each fused forward case once per entry
  ScoreMods mods;          // applied to every case of the product
  std::vector<Case> extra; // cases beyond the product (the default cuda sweep's sliding-window line)
};
Sweep default_sweep(Backend backend);
std::vector<Case> expand(const Sweep& sweep);

// measure.cpp: runs one case (check first when asked, then warm-up and timed iterations). The
// cache keeps the last shape's inputs, so the paths of one shape share them.
class InputCache {
 public:
  struct Inputs;
  InputCache();
  ~InputCache();
  Inputs& get(selfattn::Context& ctx, const Case& c);

 private:
  std::unique_ptr<Inputs> inputs_;
};
CaseResult measure_case(selfattn::Context& ctx, const Case& c, const RunSettings& settings, InputCache& cache);

// device_timing.cpp: per-call times on the context's stream (CUDA events on cuda, wall clock on sim),
// and the ceilings (cuda only).
class CallTimer {
 public:
  explicit CallTimer(selfattn::Context& ctx);
  ~CallTimer();
  CallTimer(const CallTimer&) = delete;
  CallTimer& operator=(const CallTimer&) = delete;
  void begin();  // before a call
  void end();    // after it
  // Waits for the queued work, returns each begin..end interval in ms, and starts afresh.
  std::vector<double> collect_ms();

 private:
  struct Impl;
  Impl* impl_;
};
Ceilings measure_ceilings(selfattn::Context& ctx);
// L2 size in bytes (0 on the sim): sizes the rotation of input copies.
size_t device_l2_bytes(selfattn::Context& ctx);

// decode.cpp: --mode decode, attention_with_kv_cache over a paged cache (bytes-per-second rates).
struct DecodeSweep {
  std::vector<int> batches, cache_lengths, page_sizes;
  std::vector<int> new_tokens{1};
  std::vector<int> prefill_rows{0};  // DecodeShape::prefill_rows; 0: the dense call
  int heads = 32, kv_heads = 8, head_dim = 128;
  int head_dim_v = 0;   // V's rows where they differ from K's (--head-dim-v); 0: head_dim
  bool latent = false;  // V a view of K's leading head_dim_v columns (--mla; DecodeShape::latent)
  DType dtype = DType::bf16;
  std::optional<DType> kv_dtype;  // --kv-dtype: an FP8 cache (e4m3, e5m2) beside q/out of `dtype`; unset: `dtype`
  int splits = 0;  // 0: the library's heuristic
  std::vector<Path> paths{Path::fused, Path::cublas, Path::naive};
};
DecodeSweep default_decode_sweep(Backend backend);
// --mla: DeepSeek's absorbed decode (issue 48): a latent cache 576 / 512, one kv head, 128 query
// heads, page 64; cuda sweeps batch 1-128 and cache 1k-32k, the sim one small case.
void apply_mla_preset(DecodeSweep& sweep, Backend backend);
// Runs every case (with --check first: the output against the double reference), printing one line
// per case; the results go to the JSON/CSV like the attention mode's (report.cpp).
std::vector<CaseResult> run_decode(selfattn::Context& ctx, const DecodeSweep& sweep, const RunSettings& settings,
                                   const Ceilings& ceilings);

// profile.cpp: --profile on the sim (sim/README.md, "The profiler"). The bench is a user of the sim's
// public profiler API here (selfattn_sim/profile.h), nowhere else.
// The GPUs whose ceilings a case can be bounded by ("H200", "A100"): true for a name the sim knows.
bool known_profile_gpu(const std::string& name);
// Runs `call` once with the sim's profiler on (earlier profiles dropped first, the option restored
// after) and returns its launches' counters with each launch's speed-of-light bound on `gpu`.
std::shared_ptr<const CaseProfile> profile_call(const std::function<void()>& call, const std::string& gpu);
// The table of one case's launches (printed for each profiled case) and its JSON "profile" object
// (null without a profile); the totals relate the bound to the case's own FLOPs and bytes.
void print_profile(const CaseResult& result);
nlohmann::json profile_json(const CaseResult& result);

// report.cpp
struct RunHeader {
  std::string backend, gpu, library_version, git_commit, command_line;
  std::string fused_forward_kernel;  // "hopper" (wgmma/TMA where it takes the case) or "mma.sync"
  Ceilings ceilings;
  RunSettings settings;
};
void print_table(const std::vector<CaseResult>& results, const RunHeader& header);
void write_json(const std::string& file, const std::vector<CaseResult>& results, const RunHeader& header);
void write_csv(const std::string& file, const std::vector<CaseResult>& results);
// Fills pct_of_ceiling, vs_cublas and vs_mma_sync once all cases have run.
void relate_results(std::vector<CaseResult>& results, const Ceilings& ceilings);

}  // namespace selfattn_bench
