// selfattn-bench: times attention() per path over a sweep of shapes, checks against the CPU
// reference on request, and reports a table, JSON and CSV. See bench/README.md.
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench.h"

namespace sb = selfattn_bench;

namespace {

// Command-line words for the enums.
// --dtype (the inputs': e4m3/e5m2 are the FP8 forward's, out bf16) and --kv-dtype (decode's cache).
const std::map<std::string, sb::DType> kDTypes = {{"fp32", sb::DType::f32}, {"fp16", sb::DType::f16},
                                                  {"bf16", sb::DType::bf16}, {"e4m3", sb::DType::e4m3},
                                                  {"e5m2", sb::DType::e5m2}};
const std::map<std::string, sb::DType>& kKvDTypes = kDTypes;
const std::map<std::string, sb::Causal> kCausals = {
    {"none", sb::Causal::none}, {"top_left", sb::Causal::top_left}, {"bottom_right", sb::Causal::bottom_right}};
const std::map<std::string, sb::Layout> kLayouts = {{"bhsd", sb::Layout::bhsd}, {"bshd", sb::Layout::bshd}};
const std::map<std::string, sb::Direction> kDirections = {
    {"fwd", sb::Direction::fwd}, {"bwd", sb::Direction::bwd}, {"fwd+bwd", sb::Direction::fwd_bwd}};
const std::map<std::string, sb::FusedKernel> kFusedKernels = {{"auto", sb::FusedKernel::automatic},
                                                              {"mma.sync", sb::FusedKernel::mma_sync}};
const std::map<std::string, sb::Backend> kBackends = {{"cuda", sb::Backend::cuda}, {"sim", sb::Backend::sim}};

std::vector<sb::Path> parse_paths(const std::vector<std::string>& words) {
  std::vector<sb::Path> paths;
  for (const std::string& w : words) {
    if (w == "all") {
      paths.insert(paths.end(), {sb::Path::naive, sb::Path::cublas, sb::Path::fused});
    } else if (w == "auto" || w == "automatic") {
      paths.push_back(sb::Path::automatic);
    } else if (w == "naive") {
      paths.push_back(sb::Path::naive);
    } else if (w == "cublas") {
      paths.push_back(sb::Path::cublas);
    } else if (w == "fused") {
      paths.push_back(sb::Path::fused);
    } else {
      throw CLI::ValidationError("--path", "unknown path '" + w + "' (naive, cublas, fused, all, auto)");
    }
  }
  return paths;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "selfattn-bench: times softmax(Q K^T * scale + mask) V per path.\n"
      "Without shape options it runs the default sweep: on cuda bf16, head_dim 128, seq 1k..16k with 16k tokens\n"
      "per batch; on the sim a few small shapes (sim times are CPU times, not GPU times).\n"
      "List options take comma-separated values and the sweep is their product."};
  app.get_formatter()->column_width(34);

  std::string backend_word;
  std::vector<std::string> path_words;
  std::vector<int> batch, heads, kv_heads, seq_q, seq_k, head_dim, head_dim_v;
  std::vector<std::string> dtype_words, causal_words, layout_words, direction_words, fused_kernel_words;
  sb::RunSettings settings;
  int warmup = -1, iters = -1;
  double tolerance = 0;
  std::string json_file, csv_file;
  bool no_ceilings = false;
  std::string mode = "attention";
  std::vector<int> cache_len, page_size, new_tokens, prefill_rows;
  int splits = 0;
  double sweep_mods_softcap = 0;
  bool sweep_mods_alibi = false;
  bool sweep_mods_sinks = false;
  std::vector<int> window;
  std::string bias_word = "none";

  app.add_option("--backend", backend_word, "cuda or sim (default: $SELFATTN_BACKEND, else cuda when a GPU is usable)")
      ->check(CLI::IsMember({"cuda", "sim"}));
  app.add_option("--path", path_words, "naive,cublas,fused (a list), all, or auto (default: all)")->delimiter(',')->option_text("PATH,...");
  auto sizes = [&](const char* flag, std::vector<int>& into, const char* help) {
    return app.add_option(flag, into, help)->delimiter(',')->check(CLI::PositiveNumber)->option_text("N,...")->group("Shape (comma lists)");
  };
  sizes("--batch", batch, "batch sizes (default 1)");
  sizes("--heads", heads, "query heads (default 16 on cuda, 2 on sim)");
  sizes("--kv-heads", kv_heads, "key/value heads; must divide heads (default: = heads)");
  sizes("--seq-q", seq_q, "query lengths (default: seq-k, else 1024 on cuda, 64 on sim)");
  sizes("--seq-k", seq_k, "key lengths (default: seq-q)");
  sizes("--head-dim", head_dim, "head dimensions (default 128 on cuda, 64 on sim)");
  sizes("--head-dim-v", head_dim_v, "v's and out's head dimensions where they differ from q's and k's (MLA's prefill: "
        "--head-dim 192 --head-dim-v 128); default: --head-dim");
  app.add_option("--dtype", dtype_words,
                 "fp32, fp16, bf16 (default bf16), or e4m3, e5m2: FP8 q, k, v with descales per (batch, kv head), "
                 "out bf16 (forward only)")
      ->delimiter(',')->check(CLI::IsMember({"fp32", "fp16", "bf16", "e4m3", "e5m2"}))->option_text("DTYPE,...");
  app.add_option("--causal", causal_words, "none, top_left, bottom_right (default: none; default sweep: none,top_left)")
      ->delimiter(',')->check(CLI::IsMember({"none", "top_left", "bottom_right"}))->option_text("MASK,...");
  app.add_option("--direction", direction_words,
                 "fwd (attention), bwd (attention_backward alone), fwd+bwd (both, as a training step); a list "
                 "(default: fwd; the default sweeps add a backward line)")
      ->delimiter(',')->check(CLI::IsMember({"fwd", "bwd", "fwd+bwd"}))->option_text("DIR,...");
  app.add_option("--fused-kernel", fused_kernel_words,
                 "the fused forward's kernel: auto (the library's choice: Hopper's on a 9.0 device) and/or mma.sync "
                 "(pinned: ContextOptions::hopper_kernels = false), a list (default: auto; the default cuda sweep "
                 "adds mma.sync where auto runs the Hopper kernel)")
      ->delimiter(',')->check(CLI::IsMember({"auto", "mma.sync"}))->option_text("KERNEL,...");
  app.add_option("--layout", layout_words, "bhsd or bshd (default bhsd)")
      ->delimiter(',')->check(CLI::IsMember({"bhsd", "bshd"}))->option_text("LAYOUT,...");
  app.add_option("--window", window, "sliding window L,R: keys i'-L..i'+R, -1 unbounded (default: none)")
      ->delimiter(',')->expected(2)->check(CLI::Range(-1, 1 << 30))->option_text("L,R")->group("Masks and score modifiers");
  app.add_option("--softcap", sweep_mods_softcap, "logit soft-cap C > 0: s -> C tanh(s / C) (default: none)")
      ->check(CLI::PositiveNumber)->group("Masks and score modifiers");
  app.add_flag("--alibi", sweep_mods_alibi, "ALiBi with slopes 2^(-8 (h+1) / heads)")->group("Masks and score modifiers");
  app.add_flag("--sinks", sweep_mods_sinks, "attention sinks, logits log(seq_k) - 0.5 + (h % 4) / 4 (the backward also "
               "computes their gradient)")->group("Masks and score modifiers");
  app.add_option("--bias", bias_word, "additive bias in the input dtype: full [b,h,q,k], heads [1,h,q,k], batch [b,1,q,k], none")
      ->check(CLI::IsMember({"full", "heads", "batch", "none"}))->group("Masks and score modifiers");
  app.add_flag("--check", settings.check,
               "compare each case with the double-precision CPU reference (sampled rows for large shapes); "
               "exit 1 when any check fails");
  app.add_option("--tolerance", tolerance,
                 "relative-error bound for --check (default: fp32 1e-5, fp16 2e-3, bf16 1e-2, e4m3/e5m2 1e-1)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--check-whole-limit", settings.whole_check_macs,
                 "problems with more multiply-adds than this are checked on sampled rows, not whole (default 3e7)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--warmup", warmup, "untimed calls per case (default 5 on cuda, 1 on sim)")->check(CLI::NonNegativeNumber);
  app.add_option("--iters", iters, "timed calls per case (default 30 on cuda, 3 on sim)")->check(CLI::PositiveNumber);
  app.add_option("--json", json_file, "write the results as JSON (schema: bench/README.md)");
  app.add_option("--csv", csv_file, "write the results as CSV");
  app.add_option("--mode", mode, "attention (default) or decode: attention_with_kv_cache over a paged cache")
      ->check(CLI::IsMember({"attention", "decode"}));
  app.add_option("--cache-len", cache_len, "decode: tokens per sequence in the cache (default 1k,4k,16k,32k on cuda)")
      ->delimiter(',')->check(CLI::PositiveNumber)->option_text("N,...")->group("Decode (--mode decode)");
  app.add_option("--page-size", page_size, "decode: tokens per page (default 16,64 on cuda)")
      ->delimiter(',')->check(CLI::PositiveNumber)->option_text("N,...")->group("Decode (--mode decode)");
  app.add_option("--new-tokens", new_tokens, "decode: query rows per sequence (default 1)")
      ->delimiter(',')->check(CLI::PositiveNumber)->option_text("N,...")->group("Decode (--mode decode)");
  app.add_option("--prefill-rows", prefill_rows,
                 "decode: a continuous-batching step: sequence 0 gets N new rows (a prefill chunk) beside the "
                 "others' --new-tokens, one packed attention_with_kv_cache_varlen call (default 0: the dense call)")
      ->delimiter(',')
      ->check(CLI::NonNegativeNumber)
      ->option_text("N,...")
      ->group("Decode (--mode decode)");
  app.add_option("--splits", splits, "decode: key splits on the fused path (default 0: the library's heuristic)")
      ->check(CLI::NonNegativeNumber)->group("Decode (--mode decode)");
  bool mla = false;
  app.add_flag("--mla", mla,
               "decode: DeepSeek's absorbed MLA: a latent cache of 576-value rows whose first 512 are V (one pool, "
               "read once), one kv head, 128 query heads (--heads 16: a tensor-parallel shard), page 64; "
               "--heads, --batch, --cache-len, --page-size, --kv-dtype e4m3 still apply")
      ->group("Decode (--mode decode)");
  std::string kv_dtype_word;
  app.add_option("--kv-dtype", kv_dtype_word,
                 "decode: the cache's dtype: e4m3 or e5m2 (an FP8 cache with fp32 scales per tensor; q and out stay "
                 "--dtype; bytes count K/V at one byte) or fp32/fp16/bf16 (default: --dtype)")
      ->check(CLI::IsMember({"fp32", "fp16", "bf16", "e4m3", "e5m2"}))->group("Decode (--mode decode)");
  app.add_flag("--no-ceilings", no_ceilings, "skip measuring the cuBLAS GEMM and copy ceilings (cuda)");
  bool profile = false;
  std::string profile_gpu = "H200";
  app.add_flag("--profile", profile,
               "sim only: one more call of each case under the sim's profiler; prints per launch the counters "
               "(sectors, wavefronts, tensor FLOPs, MUFU) and the speed-of-light bound, and adds them to the JSON")
      ->group("Profile (sim)");
  app.add_option("--gpu", profile_gpu, "--profile: the GPU whose ceilings bound each launch: H200 (default) or A100")
      ->check(CLI::IsMember({"H200", "A100"}, CLI::ignore_case))->group("Profile (sim)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help is a "ParseError" that exits 0
  }

  std::string command_line;
  for (int i = 0; i < argc; ++i) command_line += (i ? " " : "") + std::string(argv[i]);

  if (mla && mode != "decode") {
    std::fprintf(stderr, "selfattn-bench: --mla is a decode preset (--mode decode)\n");
    return 2;
  }
  if (mla && (!head_dim.empty() || !head_dim_v.empty() || !kv_heads.empty())) {
    std::fprintf(stderr, "selfattn-bench: --mla sets the head dims (576/512) and one kv head itself\n");
    return 2;
  }
  // Decode's q is 16- or 32-bit (an FP8 cache is --kv-dtype).
  if (mode == "decode" && !dtype_words.empty() && sb::is_fp8(kDTypes.at(dtype_words.front()))) {
    std::fprintf(stderr, "selfattn-bench: --mode decode --dtype %s: decode's q and out are fp32, fp16 or bf16; an FP8 "
                 "cache is --kv-dtype %s\n", dtype_words.front().c_str(), dtype_words.front().c_str());
    return 2;
  }
  // --kv-dtype: decode's cache only; a 16- or 32-bit cache has q's dtype (kv_cache.h), an FP8 one
  // differs from it.
  if (!kv_dtype_word.empty()) {
    const std::string q_word = dtype_words.empty() ? "bf16" : dtype_words.front();
    if (mode != "decode") {
      std::fprintf(stderr, "selfattn-bench: --kv-dtype is the decode cache's dtype (--mode decode)\n");
      return 2;
    }
    if (!sb::is_fp8(kKvDTypes.at(kv_dtype_word)) && kv_dtype_word != q_word) {
      std::fprintf(stderr, "selfattn-bench: --kv-dtype %s: a 16- or 32-bit cache has q's dtype (--dtype %s); an "
                   "FP8 one is e4m3 or e5m2\n", kv_dtype_word.c_str(), q_word.c_str());
      return 2;
    }
  }

  // Refused before a cuda context is made, so the message is the same on a machine without a GPU.
  const char* profile_on_cuda = "selfattn-bench: --profile counts on the sim only (--backend sim); on a GPU run the "
                                "bench under Nsight Compute (ncu), as bench/device-check.sh does\n";
  if (profile && backend_word == "cuda") {
    std::fprintf(stderr, "%s", profile_on_cuda);
    return 2;
  }

  std::optional<selfattn::Context> ctx;
  selfattn::ContextOptions options;
  try {
    if (!backend_word.empty()) options.backend = kBackends.at(backend_word);
    ctx.emplace(options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "selfattn-bench: no backend: %s\n", e.what());
    return 2;
  }
  const sb::Backend backend = ctx->backend();
  const bool on_cuda = backend == sb::Backend::cuda;
  if (profile && on_cuda) {  // the default backend on a machine with a GPU
    std::fprintf(stderr, "%s", profile_on_cuda);
    return 2;
  }
  if (profile && !sb::known_profile_gpu(profile_gpu)) {
    std::fprintf(stderr, "selfattn-bench: --gpu %s: the sim has no ceilings of that name\n", profile_gpu.c_str());
    return 2;
  }
  if (profile) {
    for (char& ch : profile_gpu) ch = char(std::toupper(static_cast<unsigned char>(ch)));  // --gpu h200 is H200
    settings.profile_gpu = profile_gpu;
  }
  settings.backend = backend;
  settings.warmup = warmup >= 0 ? warmup : (on_cuda ? 5 : 1);
  settings.iters = iters > 0 ? iters : (on_cuda ? 30 : 3);
  if (app.count("--tolerance")) settings.tolerance = tolerance;

  sb::RunHeader header;
  header.backend = selfattn::to_string(backend);
  header.gpu = ctx->device_name();
  header.fused_forward_kernel = ctx->uses_hopper_kernels() ? "hopper" : "mma.sync";
  header.library_version = SELFATTN_VERSION_STRING;
  header.git_commit = SELFATTN_GIT_COMMIT;
  header.command_line = command_line;
  header.settings = settings;
  if (!on_cuda)
    std::fprintf(stderr, "selfattn-bench: backend sim (%s): times are the CPU simulator's wall clock, not GPU times.\n",
                 header.gpu.c_str());
  if (on_cuda && !no_ceilings) {
    std::fprintf(stderr, "selfattn-bench: measuring ceilings (cuBLAS bf16 GEMM, device copy)...\n");
    try {
      header.ceilings = sb::measure_ceilings(*ctx);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "selfattn-bench: ceilings not measured: %s\n", e.what());
    }
  }

  std::vector<sb::CaseResult> results;
  if (mode == "decode") {
    sb::DecodeSweep decode = sb::default_decode_sweep(backend);
    if (mla) sb::apply_mla_preset(decode, backend);  // the lists given below still replace its own
    if (!batch.empty()) decode.batches = batch;
    if (!heads.empty()) decode.heads = heads.front();
    if (!kv_heads.empty()) decode.kv_heads = kv_heads.front();
    if (!head_dim.empty()) decode.head_dim = head_dim.front();
    if (!head_dim_v.empty()) decode.head_dim_v = head_dim_v.front();
    if (!dtype_words.empty()) decode.dtype = kDTypes.at(dtype_words.front());
    if (!cache_len.empty()) decode.cache_lengths = cache_len;
    if (!page_size.empty()) decode.page_sizes = page_size;
    if (!new_tokens.empty()) decode.new_tokens = new_tokens;
    if (!prefill_rows.empty()) decode.prefill_rows = prefill_rows;
    decode.splits = splits;
    if (!kv_dtype_word.empty()) decode.kv_dtype = kKvDTypes.at(kv_dtype_word);
    try {
      if (!path_words.empty()) decode.paths = parse_paths(path_words);
    } catch (const CLI::Error& e) {
      app.exit(e);
      return 2;
    }
    results = sb::run_decode(*ctx, decode, settings, header.ceilings);
    sb::relate_results(results, header.ceilings);
    for (const sb::CaseResult& r : results) sb::print_profile(r);
  } else {
    // The sweep: the default one, with any list given on the command line replacing its counterpart.
    sb::Sweep sweep = sb::default_sweep(backend);
    const bool custom_shape = !batch.empty() || !heads.empty() || !kv_heads.empty() || !seq_q.empty() ||
                              !seq_k.empty() || !head_dim.empty() || !head_dim_v.empty();
    if (custom_shape) {
      if (batch.empty()) batch = {1};
      if (heads.empty()) heads = {on_cuda ? 16 : 2};
      if (seq_q.empty()) seq_q = !seq_k.empty() ? seq_k : std::vector<int>{on_cuda ? 1024 : 64};
      if (head_dim.empty()) head_dim = {on_cuda ? 128 : 64};
      sweep.shapes.clear();
      for (int b : batch)
        for (int h : heads)
          for (int kvh : kv_heads.empty() ? std::vector<int>{h} : kv_heads)
            for (int sq : seq_q)
              for (int sk : seq_k.empty() ? std::vector<int>{sq} : seq_k)
                for (int d : head_dim)
                  for (int dv : head_dim_v.empty() ? std::vector<int>{0} : head_dim_v)
                    sweep.shapes.push_back({b, h, kvh, sq, sk, d, dv});
      sweep.causals = {sb::Causal::none};
      sweep.directions = {sb::Direction::fwd};
    }
    try {
      if (!path_words.empty()) sweep.paths = parse_paths(path_words);
    } catch (const CLI::Error& e) {
      app.exit(e);
      return 2;
    }
    auto mapped = [](const auto& table, const std::vector<std::string>& words, auto& into) {
      if (words.empty()) return;
      into.clear();
      for (const std::string& w : words) into.push_back(table.at(w));
    };
    mapped(kDTypes, dtype_words, sweep.dtypes);
    mapped(kCausals, causal_words, sweep.causals);
    mapped(kLayouts, layout_words, sweep.layouts);
    mapped(kDirections, direction_words, sweep.directions);
    mapped(kFusedKernels, fused_kernel_words, sweep.fused_kernels);
    // Without the Hopper kernel the two would be the same kernel: the default sweep keeps one.
    if (fused_kernel_words.empty() && !ctx->uses_hopper_kernels()) sweep.fused_kernels = {sb::FusedKernel::automatic};
    if (!window.empty()) {
      sweep.mods.window_left = window[0];
      sweep.mods.window_right = window[1];
    }
    sweep.mods.softcap = float(sweep_mods_softcap);
    sweep.mods.alibi = sweep_mods_alibi;
    sweep.mods.sinks = sweep_mods_sinks;
    sweep.mods.bias = bias_word == "full"    ? sb::BiasKind::full
                      : bias_word == "heads" ? sb::BiasKind::heads
                      : bias_word == "batch" ? sb::BiasKind::batch
                                             : sb::BiasKind::none;
    // The default sweep's extra lines (sliding window, the sim's backward) run only as they are: any shape or modifier
    // option replaces them, a path list keeps those on its paths.
    if (custom_shape || sweep.mods.any()) sweep.extra.clear();
    std::vector<sb::Case> kept;
    for (const sb::Case& c : sweep.extra)
      if (std::find(sweep.paths.begin(), sweep.paths.end(), c.path) != sweep.paths.end() &&
          (direction_words.empty() ||
           std::find(sweep.directions.begin(), sweep.directions.end(), c.direction) != sweep.directions.end()))
        kept.push_back(c);
    sweep.extra = kept;
    const std::vector<sb::Case> cases = sb::expand(sweep);

    // The pinned cases run on a second context on the same device and stream (so the inputs the
    // first one uploaded are ordered before them), made when the first such case comes.
    std::optional<selfattn::Context> mma_sync_ctx;
    auto context_for = [&](const sb::Case& c) -> selfattn::Context& {
      if (c.fused_kernel == sb::FusedKernel::automatic) return *ctx;
      if (!mma_sync_ctx) {
        selfattn::ContextOptions pinned = options;
        pinned.backend = ctx->backend();
        pinned.stream = ctx->stream();
        pinned.hopper_kernels = false;
        mma_sync_ctx.emplace(pinned);
      }
      return *mma_sync_ctx;
    };
    sb::InputCache inputs;
    const bool tty = isatty(fileno(stderr));
    for (size_t i = 0; i < cases.size(); ++i) {
      std::fprintf(stderr, "%s[%zu/%zu] %s ...", tty ? "\r\033[K" : "", i + 1, cases.size(), sb::describe(cases[i]).c_str());
      std::fflush(stderr);
      sb::CaseResult r;
      try {
        r = sb::measure_case(context_for(cases[i]), cases[i], settings, inputs);
      } catch (const std::exception& e) {  // e.g. out of memory for the inputs
        r.c = cases[i];
        r.resolved_path = sb::name(cases[i].path);
        r.status = sb::Status::error;
        r.note = e.what();
      }
      if (cases[i].fused_kernel == sb::FusedKernel::mma_sync) r.resolved_path += "/mma.sync";
      if (r.status == sb::Status::ok || r.status == sb::Status::check_failed)
        std::fprintf(stderr, " %.4f ms%s%s", r.ms_median, r.checked ? " check " : "",
                     r.checked ? (r.status == sb::Status::ok ? "pass" : "FAIL") : "");
      else
        std::fprintf(stderr, " %s", sb::name(r.status));
      std::fprintf(stderr, tty ? "" : "\n");
      results.push_back(r);
    }
    if (tty) std::fprintf(stderr, "\r\033[K");
    sb::relate_results(results, header.ceilings);
    sb::print_table(results, header);
    for (const sb::CaseResult& r : results) sb::print_profile(r);
  }

  try {
    if (!json_file.empty()) sb::write_json(json_file, results, header);
    if (!csv_file.empty()) sb::write_csv(csv_file, results);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "selfattn-bench: %s\n", e.what());
    return 2;
  }

  int failed = 0, errors = 0, ran = 0;
  for (const sb::CaseResult& r : results) {
    failed += r.status == sb::Status::check_failed;
    errors += r.status == sb::Status::error;
    ran += r.status == sb::Status::ok || r.status == sb::Status::check_failed;
  }
  std::printf("%d of %zu cases ran, %zu skipped, %d failed the check, %d errors\n", ran, results.size(),
              results.size() - size_t(ran) - size_t(errors), failed, errors);
  return failed || errors ? 1 : 0;
}
