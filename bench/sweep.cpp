// Names and the default sweeps.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "bench.h"

namespace selfattn_bench {

const char* name(Path path) {
  switch (path) {
    case Path::automatic: return "auto";
    case Path::naive: return "naive";
    case Path::cublas: return "cublas";
    case Path::fused: return "fused";
  }
  return "?";
}
const char* name(Causal causal) {
  switch (causal) {
    case Causal::none: return "none";
    case Causal::top_left: return "top_left";
    case Causal::bottom_right: return "bottom_right";
  }
  return "?";
}
const char* name(Layout layout) { return layout == Layout::bhsd ? "bhsd" : "bshd"; }
const char* name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "fp32";
    case DType::f16: return "fp16";
    case DType::bf16: return "bf16";
    case DType::b8: return "b8";
    case DType::e4m3: return "e4m3";
    case DType::e5m2: return "e5m2";
  }
  return "?";
}
const char* name(Direction direction) {
  switch (direction) {
    case Direction::fwd: return "fwd";
    case Direction::bwd: return "bwd";
    case Direction::fwd_bwd: return "fwd+bwd";
  }
  return "?";
}
const char* name(FusedKernel kernel) { return kernel == FusedKernel::automatic ? "auto" : "mma.sync"; }

const char* name(Status status) {
  switch (status) {
    case Status::ok: return "ok";
    case Status::check_failed: return "FAILED";
    case Status::error: return "ERROR";
    case Status::skipped: return "skipped";
  }
  return "?";
}

std::string describe_mods(const ScoreMods& m) {
  std::string text;
  auto add = [&](const std::string& word) { text += (text.empty() ? "" : " ") + word; };
  if (m.window_left >= 0 || m.window_right >= 0) add("w" + std::to_string(m.window_left) + "," + std::to_string(m.window_right));
  if (m.softcap > 0) {
    char cap[32];
    std::snprintf(cap, sizeof cap, "cap%g", m.softcap);
    add(cap);
  }
  if (m.alibi) add("alibi");
  if (m.bias == BiasKind::full) add("bias=full");
  if (m.bias == BiasKind::heads) add("bias=heads");
  if (m.bias == BiasKind::batch) add("bias=batch");
  if (m.sinks) add("sinks");
  return text.empty() ? "-" : text;
}

std::string describe_head_dims(const Case& c) {
  const std::string qk = std::to_string(c.head_dim);
  return v_dim(c) == c.head_dim ? qk : qk + "/" + std::to_string(v_dim(c));
}

std::string describe(const Case& c) {
  char text[200];
  const std::string dims = describe_head_dims(c);
  std::snprintf(text, sizeof text, "%s%s %s %s b=%d h=%d kvh=%d sq=%d sk=%d d=%s causal=%s %s", name(c.path),
                c.fused_kernel == FusedKernel::mma_sync ? "/mma.sync" : "", name(c.direction), name(c.dtype), c.batch,
                c.heads, c.kv_heads, c.seq_q, c.seq_k, dims.c_str(), name(c.causal), name(c.layout));
  std::string described = text;
  if (c.decode)
    described += " decode cache=" + std::to_string(c.decode->cache_len) + " page=" + std::to_string(c.decode->page_size) +
                 " splits=" + (c.decode->splits ? std::to_string(c.decode->splits) : std::string("auto")) +
                 (c.decode->kv_dtype != c.dtype ? std::string(" kv=") + name(c.decode->kv_dtype) : std::string()) +
                 (c.decode->latent ? " latent" : "");
  return c.mods.any() ? described + " " + describe_mods(c.mods) : described;
}

float alibi_slope(const Case& c, int h) { return std::exp2(-8.0f * float(h + 1) / float(c.heads)); }

float sink_logit(const Case& c, int h) { return std::log(float(std::max(c.seq_k, 1))) + 0.25f * float(h % 4) - 0.5f; }

namespace {
// A case of the shape's sizes, every other field at its default.
Case case_of(const Shape& s) {
  Case c;
  c.batch = s.batch;
  c.heads = s.heads;
  c.kv_heads = s.kv_heads;
  c.seq_q = s.seq_q;
  c.seq_k = s.seq_k;
  c.head_dim = s.head_dim;
  c.head_dim_v = s.head_dim_v;
  return c;
}
}  // namespace

Sweep default_sweep(Backend backend) {
  Sweep sweep;
  sweep.paths = {Path::naive, Path::cublas, Path::fused};
  sweep.causals = {Causal::none, Causal::top_left};
  sweep.dtypes = {DType::bf16};
  sweep.layouts = {Layout::bhsd};
  if (backend == Backend::cuda) {
    // FlashAttention's benchmark shape: 16k tokens per batch (batch = 16384 / seq), model width
    // 2048 = 16 heads of 128, with and without the causal mask.
    for (int seq : {1024, 2048, 4096, 8192, 16384}) sweep.shapes.push_back({16384 / seq, 16, 16, seq, seq, 128});
    // The backward line: the same shapes and masks, attention_backward alone (bench/NOTES.md has
    // the prediction beside FlashAttention-2's published backward figures).
    sweep.directions = {Direction::fwd, Direction::bwd};
    // The fused forward once more with the mma.sync kernel pinned: on a Hopper GPU the Hopper
    // kernel's speed-up over it, measured in the same run (bench_main drops it elsewhere).
    sweep.fused_kernels = {FusedKernel::automatic, FusedKernel::mma_sync};
    // Sliding window (Mistral-style, 256 keys back, causal) over 32k tokens per call (batch = 32768 /
    // seq): the fused kernel skips key tiles outside the window, so each query row costs the same at
    // every seq_k and the time should stay flat from 4k to 32k.
    for (int seq : {4096, 8192, 16384, 32768}) {
      Case c;
      c.path = Path::fused;
      c.batch = 32768 / seq;
      c.heads = c.kv_heads = 16;
      c.seq_q = c.seq_k = seq;
      c.head_dim = 128;
      c.causal = Causal::bottom_right;
      c.mods.window_left = 256;
      c.mods.window_right = 0;
      sweep.extra.push_back(c);
    }
  } else {
    // The sim runs each CUDA thread as a fiber on the CPU: a few small shapes (one with GQA and
    // seq_q != seq_k) so the whole sweep takes seconds. Its times say nothing about a GPU.
    sweep.shapes = {{1, 2, 2, 64, 64, 64}, {1, 2, 1, 33, 80, 64}, {2, 2, 2, 128, 128, 64}};
    // The backward of the two small shapes on every path, checked like the forward.
    for (const Shape& s : {sweep.shapes[0], sweep.shapes[1]})
      for (Path path : sweep.paths) {
        Case c = case_of(s);
        c.path = path;
        c.direction = Direction::bwd;
        sweep.extra.push_back(c);
      }
  }
  return sweep;
}

std::vector<Case> expand(const Sweep& sweep) {
  // Paths innermost: the paths of one shape share its inputs (InputCache keeps the last shape).
  std::vector<Case> cases;
  for (DType dtype : sweep.dtypes)
    for (Layout layout : sweep.layouts)
      for (const Shape& s : sweep.shapes)
        for (Causal causal : sweep.causals)
          for (Direction direction : sweep.directions)
            for (Path path : sweep.paths)
              for (FusedKernel kernel : sweep.fused_kernels) {
                // Only the fused forward has a choice of kernel (the backward has one kernel family).
                if (kernel != FusedKernel::automatic && (path != Path::fused || direction != Direction::fwd)) continue;
                Case c = case_of(s);
                c.path = path;
                c.fused_kernel = kernel;
                c.direction = direction;
                c.dtype = dtype;
                c.causal = causal;
                c.layout = layout;
                c.mods = sweep.mods;
                cases.push_back(c);
              }
  cases.insert(cases.end(), sweep.extra.begin(), sweep.extra.end());
  return cases;
}

}  // namespace selfattn_bench
