// The terminal table, JSON and CSV. The JSON schema is documented in bench/README.md.
#include <cstdio>
#include <ctime>
#include <fstream>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "bench.h"

namespace selfattn_bench {
namespace {

bool ran(const CaseResult& r) { return r.status == Status::ok || r.status == Status::check_failed; }

const char* check_word(const CaseResult& r) {
  if (!ran(r)) return r.status == Status::error ? "error" : "skipped";
  if (!r.checked) return "off";
  return r.status == Status::check_failed ? "fail" : "pass";
}

bool same_decode(const Case& a, const Case& b) {
  if (a.decode.has_value() != b.decode.has_value()) return false;
  return !a.decode || (a.decode->page_size == b.decode->page_size && a.decode->splits == b.decode->splits &&
                       a.decode->prefill_rows == b.decode->prefill_rows && a.decode->kv_dtype == b.decode->kv_dtype &&
                       a.decode->latent == b.decode->latent);
}

bool same_problem(const Case& a, const Case& b) {
  return a.dtype == b.dtype && a.batch == b.batch && a.heads == b.heads && a.kv_heads == b.kv_heads &&
         a.seq_q == b.seq_q && a.seq_k == b.seq_k && a.head_dim == b.head_dim && v_dim(a) == v_dim(b) &&
         a.causal == b.causal &&
         a.direction == b.direction &&
         a.layout == b.layout && describe_mods(a.mods) == describe_mods(b.mods) && same_decode(a, b);
}

std::string utc_now() {
  char text[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return text;
}

nlohmann::json number_or_null(const std::optional<double>& x) { return x ? nlohmann::json(*x) : nlohmann::json(nullptr); }

}  // namespace

void relate_results(std::vector<CaseResult>& results, const Ceilings& ceilings) {
  for (CaseResult& r : results) {
    if (!ran(r) || r.ms_median <= 0) continue;
    if (ceilings.gemm_tflops > 0) r.pct_of_ceiling = 100.0 * r.tflops / ceilings.gemm_tflops;
    if (ceilings.copy_gbps > 0) r.pct_of_copy = 100.0 * r.gbps / ceilings.copy_gbps;
    for (const CaseResult& other : results) {
      if (!ran(other) || other.ms_median <= 0 || !same_problem(other.c, r.c)) continue;
      if (other.c.path == Path::cublas && !r.vs_cublas) r.vs_cublas = other.ms_median / r.ms_median;
      const bool pinned_twin = r.c.path == Path::fused && other.c.path == Path::fused &&
                               r.c.fused_kernel == FusedKernel::automatic && other.c.fused_kernel == FusedKernel::mma_sync;
      if (pinned_twin) r.vs_mma_sync = other.ms_median / r.ms_median;
    }
  }
}

void print_table(const std::vector<CaseResult>& results, const RunHeader& header) {
  std::printf("\nselfattn-bench %s (%s) on %s [%s]\n", header.library_version.c_str(), header.git_commit.c_str(),
              header.gpu.c_str(), header.backend.c_str());
  std::printf("fused forward kernel: %s\n", header.fused_forward_kernel == "hopper"
                                                 ? "hopper (wgmma + TMA) where it takes the case, else mma.sync"
                                                 : "mma.sync (SELFATTN_HOPPER_KERNELS=0, or not a 9.0 device)");
  if (header.backend == "sim")
    std::printf("NOTE: sim times are CPU wall-clock times of the simulator; they say nothing about GPU speed.\n");
  if (header.ceilings.gemm_tflops > 0)
    std::printf("ceilings: cuBLAS GEMM %.1f TFLOPS (%s), copy %.0f GB/s (%s)\n", header.ceilings.gemm_tflops,
                header.ceilings.gemm_shape.c_str(), header.ceilings.copy_gbps, header.ceilings.copy_bytes.c_str());
  std::printf("%-14s %-7s %-5s %4s %4s %4s %6s %6s %7s %-12s %-4s %-14s %10s %10s %8s %8s %6s %8s %8s %9s %s\n", "path",
              "dir", "dtype", "b", "h", "kvh", "seq_q", "seq_k", "d", "causal", "lay", "mods", "median_ms", "min_ms", "TFLOPS",
              "GB/s", "%ceil", "vs_cublas", "vs_mma", "rel_err", "check");
  for (const CaseResult& r : results) {
    const Case& c = r.c;
    std::printf("%-14s %-7s %-5s %4d %4d %4d %6d %6d %7s %-12s %-4s %-14s ", r.resolved_path.c_str(), name(c.direction),
                name(c.dtype), c.batch, c.heads, c.kv_heads, c.seq_q, c.seq_k, describe_head_dims(c).c_str(),
                name(c.causal), name(c.layout), describe_mods(c.mods).c_str());
    if (!ran(r)) {
      std::printf("%s: %s\n", name(r.status), r.note.c_str());
      continue;
    }
    std::printf("%10.4f %10.4f %8.3g %8.3g ", r.ms_median, r.ms_min, r.tflops, r.gbps);
    if (r.pct_of_ceiling) std::printf("%6.1f ", *r.pct_of_ceiling); else std::printf("%6s ", "-");
    if (r.vs_cublas) std::printf("%8.2fx ", *r.vs_cublas); else std::printf("%9s ", "-");
    if (r.vs_mma_sync) std::printf("%7.2fx ", *r.vs_mma_sync); else std::printf("%8s ", "-");
    if (r.checked) std::printf("%9.2e ", r.rel_err); else std::printf("%9s ", "-");
    std::printf("%s%s%s\n", check_word(r), r.sampled ? " (sampled rows)" : "",
                r.status == Status::check_failed ? (": " + r.note).c_str() : "");
  }
}

void write_json(const std::string& file, const std::vector<CaseResult>& results, const RunHeader& header) {
  using nlohmann::json;
  json head = {
      {"schema", "selfattn-bench/1"},
      {"backend", header.backend},
      {"gpu", header.gpu},
      {"fused_forward_kernel", header.fused_forward_kernel},
      {"library_version", header.library_version},
      {"git_commit", header.git_commit},
      {"command_line", header.command_line},
      {"date_utc", utc_now()},
      {"timing", header.backend == "cuda" ? "CUDA events on the context's stream, after warm-up"
                                          : "wall clock around call + synchronize (sim: not GPU times)"},
      {"warmup", header.settings.warmup},
      {"iters", header.settings.iters},
      {"check", header.settings.check},
      {"tolerance", header.settings.tolerance ? json(*header.settings.tolerance) : json("per dtype")},
      {"profile_gpu", header.settings.profile_gpu.empty() ? json(nullptr) : json(header.settings.profile_gpu)},
      {"ceilings",
       {{"gemm_tflops", header.ceilings.gemm_tflops > 0 ? json(header.ceilings.gemm_tflops) : json(nullptr)},
        {"gemm_shape", header.ceilings.gemm_shape},
        {"copy_gbps", header.ceilings.copy_gbps > 0 ? json(header.ceilings.copy_gbps) : json(nullptr)},
        {"copy_bytes", header.ceilings.copy_bytes}}},
  };
  json cases = json::array();
  for (const CaseResult& r : results) {
    const Case& c = r.c;
    const bool timed = ran(r) && r.ms_median > 0;
    auto timed_value = [&](double x) { return timed ? json(x) : json(nullptr); };
    cases.push_back({
        {"backend", header.backend},
        {"gpu", header.gpu},
        {"path", name(c.path)},
        {"resolved_path", r.resolved_path},
        {"fused_kernel", c.path == Path::fused ? json(name(c.fused_kernel)) : json(nullptr)},
        {"direction", name(c.direction)},
        {"dtype", name(c.dtype)},
        {"batch", c.batch},
        {"heads", c.heads},
        {"kv_heads", c.kv_heads},
        {"seq_q", c.seq_q},
        {"seq_k", c.seq_k},
        {"head_dim", c.head_dim},
        {"head_dim_v", v_dim(c)},
        {"causal", name(c.causal)},
        {"mods", describe_mods(c.mods)},
        {"layout", name(c.layout)},
        {"status", name(r.status)},
        {"note", r.note},
        {"ms_median", timed_value(r.ms_median)},
        {"ms_min", timed_value(r.ms_min)},
        {"ms_max", timed_value(r.ms_max)},
        {"tflops", timed_value(r.tflops)},
        {"gbps", timed_value(r.gbps)},
        {"pct_of_ceiling", number_or_null(r.pct_of_ceiling)},
        {"pct_of_copy_ceiling", number_or_null(r.pct_of_copy)},
        {"vs_cublas", number_or_null(r.vs_cublas)},
        {"vs_mma_sync", number_or_null(r.vs_mma_sync)},
        {"max_abs_err", r.checked ? json(r.max_abs_err) : json(nullptr)},
        {"rel_err", r.checked ? json(r.rel_err) : json(nullptr)},
        {"check", check_word(r)},
        {"check_sampled", r.checked ? json(r.sampled) : json(nullptr)},
        {"flops", attention_flops(c)},
        {"bytes", attention_bytes(c)},
        {"input_copies", r.copies},
        {"mode", c.decode ? "decode" : "attention"},
        {"cache_len", c.decode ? json(c.decode->cache_len) : json(nullptr)},
        {"page_size", c.decode ? json(c.decode->page_size) : json(nullptr)},
        {"new_tokens", c.decode ? json(c.decode->new_tokens) : json(nullptr)},
        {"splits", c.decode ? json(c.decode->splits) : json(nullptr)},
        {"prefill_rows", c.decode ? json(c.decode->prefill_rows) : json(nullptr)},
        {"kv_dtype", c.decode ? json(name(c.decode->kv_dtype)) : json(nullptr)},
        {"latent", c.decode ? json(c.decode->latent) : json(nullptr)},
        {"profile", profile_json(r)},
    });
  }
  std::ofstream out(file);
  if (!out) throw std::runtime_error("cannot write " + file);
  out << json{{"header", head}, {"cases", cases}}.dump(2) << "\n";
}

void write_csv(const std::string& file, const std::vector<CaseResult>& results) {
  std::ofstream out(file);
  if (!out) throw std::runtime_error("cannot write " + file);
  out << "path,resolved_path,direction,dtype,batch,heads,kv_heads,seq_q,seq_k,head_dim,head_dim_v,causal,layout,status,"
         "ms_median,ms_min,"
         "ms_max,tflops,gbps,pct_of_ceiling,vs_cublas,vs_mma_sync,max_abs_err,rel_err,check,mods,note\n";
  for (const CaseResult& r : results) {
    const Case& c = r.c;
    const bool timed = ran(r) && r.ms_median > 0;
    auto num = [](double x) { char s[32]; std::snprintf(s, sizeof s, "%.6g", x); return std::string(s); };
    auto opt = [&](const std::optional<double>& x) { return x ? num(*x) : std::string(); };
    std::string note = r.note;
    for (char& ch : note)
      if (ch == '"') ch = '\'';
    out << name(c.path) << ',' << r.resolved_path << ',' << name(c.direction) << ',' << name(c.dtype) << ',' << c.batch << ',' << c.heads << ','
        << c.kv_heads << ',' << c.seq_q << ',' << c.seq_k << ',' << c.head_dim << ',' << v_dim(c) << ','
        << name(c.causal) << ','
        << name(c.layout) << ',' << name(r.status) << ',' << (timed ? num(r.ms_median) : "") << ','
        << (timed ? num(r.ms_min) : "") << ',' << (timed ? num(r.ms_max) : "") << ',' << (timed ? num(r.tflops) : "")
        << ',' << (timed ? num(r.gbps) : "") << ',' << opt(r.pct_of_ceiling) << ',' << opt(r.vs_cublas) << ',' << opt(r.vs_mma_sync) << ','
        << (r.checked ? num(r.max_abs_err) : "") << ',' << (r.checked ? num(r.rel_err) : "") << ',' << check_word(r)
        << ',' << describe_mods(c.mods) << ",\"" << note << "\"\n";
  }
}

}  // namespace selfattn_bench
