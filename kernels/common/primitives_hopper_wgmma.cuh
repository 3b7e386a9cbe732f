#pragma once
// Hopper (sm_90a) warpgroup MMA: wgmma.mma_async (f16/bf16 k16 and e4m3 k32, A from shared memory or
// registers), its fence, commit and wait, the operand fences, and P's packing into e4m3, each
// instruction's nvcc body with its sim twin beside it. Split by subject from primitives_hopper.cuh,
// whose header holds the callers' contract for both halves and which includes this file (either
// may be included first).
#include "primitives_hopper.cuh"

SELFATTN_KERNELS_BEGIN

// ===================================== warpgroup MMA =========================================
// D (64 x N, f32, per warpgroup) {=, +=} A (64 x 16) * B (16 x N), f16 or bf16 operands. A and B
// are in shared memory, described by GMMA descriptors (kernels/hopper/smem_layout.h builds them),
// or A is in registers (the m16n8k16 A fragment of each warp's 16 rows: warp w of the warpgroup
// holds rows 16w..16w+15). d[i] of thread t is D's element wgmma_accumulator_coord(t, i): per
// warp, the m16n8 C fragment of each n8 column tile j in d[4j .. 4j+3].

#if SELFATTN_SIM
namespace sim_hopper {

// One issued wgmma, shared by the 128 threads of its warpgroup: what it read at issue (registers)
// and where its shared-memory operands and results are.
struct WgmmaOp {
  int n = 0;
  int k = 16, element_bytes = 2;  // m64nNk16 on 16-bit inputs, m64nNk32 on 8-bit (e4m3)
  bool accumulate = false, a_in_registers = false, transpose_b = false;
  bool chained = false;  // accumulates into the registers of an earlier op still in flight
  std::shared_ptr<WgmmaOp> predecessor;  // that op, whose result is this one's C
  std::vector<float> result;  // D (64 x n) once performed, until wgmma_fence_operands writes it back
  sim_warp::Operand type = sim_warp::Operand::f16;
  uint64_t desc_a = 0, desc_b = 0;
  std::vector<float> a, c;   // A (64 x k) when in registers; C (64 x n) as issued
  float* d[128] = {};        // each thread's accumulator array
  // Each thread's A registers and what they held at issue: the hardware may read them until the
  // wait, so a kernel that changes them before it is told so at the wait (wgmma_perform).
  const uint32_t* a_registers[128] = {};
  uint32_t a_issued[128][4] = {};
  unsigned first_thread = 0;  // the warpgroup's thread 0: what its shared reads are charged to
  const void* site = nullptr;
  std::vector<std::pair<uint32_t, uint32_t>> smem_ranges;  // [begin, end) byte offsets it reads
};

struct WgmmaIssue {
  float* d;
  const uint32_t* a_registers;  // the caller's A fragment (register A), else null
  uint32_t a[4];
  uint64_t desc_a, desc_b;
  int n, accumulate;
  bool a_in_registers, transpose_b;
  sim_warp::Operand type;
  const void* site;  // the kernel's wgmma, for the racecheck's reports
};
struct WgmmaHandle {
  std::shared_ptr<void> op;
};

inline float operand_value(sim_warp::Operand type, uint16_t bits) {
  if (type == sim_warp::Operand::e4m3) return e4m3_bits_to_float(uint8_t(bits));
  return type == sim_warp::Operand::f16 ? sim_warp::f16_bits_to_float(bits) : sim_warp::bf16_bits_to_float(bits);
}

// The byte offsets of an operand of `rows` x k elements.
SELFATTN_SIM_UNCHECKED inline void add_operand_ranges(std::vector<uint32_t>& offsets, uint64_t desc, bool k_major,
                                                      int rows, int k_extent, int element_bytes) {
  for (int r = 0; r < rows; ++r)
    for (int k = 0; k < k_extent; ++k) offsets.push_back(gmma_element_offset(desc, k_major, r, k, element_bytes));
}

SELFATTN_SIM_UNCHECKED inline void wgmma_issue_combine(const WgmmaIssue* const* ins, WgmmaHandle* const* outs) {
  auto op = std::make_shared<WgmmaOp>();
  const WgmmaIssue& first = *ins[0];
  for (int t = 1; t < 128; ++t) {
    const WgmmaIssue& x = *ins[t];
    if (x.desc_a != first.desc_a || x.desc_b != first.desc_b || x.n != first.n || x.accumulate != first.accumulate)
      sim_warp::fail("wgmma.mma_async", "descriptors, shape and scale-d must be the same in all 128 threads of the warpgroup");
  }
  op->n = first.n;
  op->accumulate = first.accumulate != 0;
  op->a_in_registers = first.a_in_registers;
  op->transpose_b = first.transpose_b;
  op->type = first.type;
  if (op->type == sim_warp::Operand::e4m3) {
    op->k = 32;
    op->element_bytes = 1;
    if (op->transpose_b) sim_warp::fail("wgmma.mma_async", "8-bit operands are K-major only (no transpose)");
  }
  op->desc_a = first.desc_a;
  op->desc_b = first.desc_b;
  op->site = first.site;
  op->first_thread = sim::current_thread().linear_tid / 128 * 128;
  op->c.assign(size_t(64) * op->n, 0.0f);
  if (op->a_in_registers) op->a.assign(size_t(64) * op->k, 0.0f);
  // A wgmma that accumulates into the registers of one still in flight (the k-steps of one
  // product) takes as C that one's result, as the hardware chains them: it reads its C when it is
  // performed, after its predecessor. Otherwise C is read now and the registers become NaN, as
  // they are undefined until the wait.
  const sim::ThreadContext& issuer = sim::current_thread();
  auto note_if_same = [&](const std::shared_ptr<void>& other) {
    if (static_cast<const WgmmaOp*>(other.get())->d[0] == first.d) op->predecessor = std::static_pointer_cast<WgmmaOp>(other);
  };
  for (const auto& group : issuer.wgmma_groups)
    for (const auto& other : group) note_if_same(other);
  for (const auto& other : issuer.wgmma_open) note_if_same(other);  // the latest one in flight
  op->chained = op->predecessor != nullptr;
  for (int t = 0; t < 128; ++t) {
    const WgmmaIssue& x = *ins[t];
    op->d[t] = x.d;
    for (int i = 0; i < op->n / 2 && !op->chained; ++i) {
      const FragmentCoord at = wgmma_accumulator_coord(t, i);
      op->c[size_t(at.row) * op->n + at.col] = x.d[i];
      x.d[i] = NAN;
    }
    if (op->a_in_registers) {
      op->a_registers[t] = x.a_registers;
      std::memcpy(op->a_issued[t], x.a, sizeof x.a);
      if (op->element_bytes == 1) {
        for (int i = 0; i < 16; ++i) {
          const FragmentCoord at = wgmma_a8_coord(t, i);
          op->a[at.row * 32 + at.col] = operand_value(op->type, uint16_t((x.a[i / 4] >> (8 * (i % 4))) & 0xffu));
        }
      } else {
        for (int i = 0; i < 8; ++i) {
          const FragmentCoord at = wgmma_a_coord(t, i);
          op->a[at.row * 16 + at.col] = operand_value(op->type, sim_warp::register_half(x.a[i / 2], i & 1));
        }
      }
    }
  }
  std::vector<uint32_t> offsets;
  if (!op->a_in_registers) add_operand_ranges(offsets, op->desc_a, true, 64, op->k, op->element_bytes);
  add_operand_ranges(offsets, op->desc_b, !op->transpose_b, op->n, op->k, op->element_bytes);
  std::sort(offsets.begin(), offsets.end());
  const sim::ThreadContext& ctx = sim::current_thread();
  const uint32_t eb = uint32_t(op->element_bytes);
  for (uint32_t off : offsets) {
    if (off + eb > ctx.dynamic_smem_bytes)
      sim_warp::fail("wgmma.mma_async", "a shared-memory operand reaches past the block's dynamic shared memory");
    if (!op->smem_ranges.empty() && op->smem_ranges.back().second >= off) {
      op->smem_ranges.back().second = std::max(op->smem_ranges.back().second, off + eb);
    } else {
      op->smem_ranges.push_back({off, off + eb});
    }
  }
  for (const auto& r : op->smem_ranges)
    sim::racecheck_async_read_begin(op->first_thread, ctx.dynamic_smem + r.first, r.second - r.first, op->site);
  if (sim::profiling())  // once per warpgroup
    sim::profile_tensor_op(64, unsigned(op->n), unsigned(op->k),
                           op->type == sim_warp::Operand::f16    ? "f16"
                           : op->type == sim_warp::Operand::bf16 ? "bf16"
                                                                 : "e4m3");
  for (int t = 0; t < 128; ++t) outs[t]->op = op;
}

// The operation happens now: its shared-memory operands are read as they are at the wait. Its
// result waits in the op until each thread's wgmma_fence_operands copies its fragment out, so a
// kernel that reads the accumulators without that fence reads the NaN of the issue.
SELFATTN_SIM_UNCHECKED inline void wgmma_perform(WgmmaOp& op) {
  const unsigned char* smem = sim::current_thread().dynamic_smem;
  // The registers wgmma owns until this wait must be as it left them: A as issued, and the
  // accumulators of an op that is not chained still the NaN its issue put there.
  for (int t = 0; t < 128; ++t) {
    if (op.a_in_registers && std::memcmp(op.a_registers[t], op.a_issued[t], sizeof op.a_issued[t]) != 0)
      sim_warp::fail("wgmma.mma_async", "its A registers were changed before the wgmma.wait_group that retires it "
                                        "(wgmma may read them until then)");
    for (int i = 0; i < op.n / 2 && !op.chained; ++i)
      if (!std::isnan(op.d[t][i]))
        sim_warp::fail("wgmma.mma_async", "its accumulator registers were written before the wgmma.wait_group "
                                          "that retires it (they are wgmma's until then)");
  }
  // Unchecked like the function: a lambda does not inherit its attribute, and the racecheck (and the
  // profiler) would charge these reads, made for the warpgroup, to the thread running the wait.
  auto element = [&](uint32_t offset) SELFATTN_SIM_UNCHECKED {
    uint16_t bits = 0;
    std::memcpy(&bits, smem + offset, size_t(op.element_bytes));  // little-endian: a byte lands in the low half
    return operand_value(op.type, bits);
  };
  if (op.chained) {
    op.c = op.predecessor->result;  // performed before this one: an earlier group, or earlier in this one
    op.predecessor.reset();
  }
  const int kk = op.k, eb = op.element_bytes;
  std::vector<float> a(size_t(64) * kk), b(size_t(kk) * op.n), d = op.c;
  for (int r = 0; r < 64; ++r)
    for (int k = 0; k < kk; ++k)
      a[r * kk + k] = op.a_in_registers ? op.a[r * kk + k] : element(gmma_element_offset(op.desc_a, true, r, k, eb));
  for (int col = 0; col < op.n; ++col)
    for (int k = 0; k < kk; ++k)
      b[size_t(k) * op.n + col] = element(gmma_element_offset(op.desc_b, !op.transpose_b, col, k, eb));
  if (op.type == sim_warp::Operand::f16) {
    wgmma_tile<sim_warp::Operand::f16>(op.n, a.data(), b.data(), d.data(), op.accumulate);
  } else if (op.type == sim_warp::Operand::e4m3) {
    wgmma_tile<sim_warp::Operand::e4m3>(op.n, a.data(), b.data(), d.data(), op.accumulate);
  } else {
    wgmma_tile<sim_warp::Operand::bf16>(op.n, a.data(), b.data(), d.data(), op.accumulate);
  }
  op.result = std::move(d);
  for (const auto& r : op.smem_ranges)
    sim::racecheck_async_read_end(op.first_thread, smem + r.first, r.second - r.first);
}

// noinline: its return address is the kernel's wgmma, which the racecheck reports.
template <sim_warp::Operand Type, int N>
__attribute__((noinline)) void wgmma_issue(float* d, const uint32_t* a, uint64_t desc_a, uint64_t desc_b, int accumulate, bool transpose_b) {
  WgmmaIssue in{};
  in.d = d;
  in.a_registers = a;
  if (a) std::memcpy(in.a, a, sizeof in.a);
  in.desc_a = desc_a;
  in.desc_b = desc_b;
  in.n = N;
  in.accumulate = accumulate;
  in.a_in_registers = a != nullptr;
  in.transpose_b = transpose_b;
  in.type = Type;
  in.site = __builtin_return_address(0);
  if (!sim::current_thread().wgmma_fenced)
    sim_warp::fail("wgmma.mma_async", "issued without a wgmma.fence since the last wgmma.wait_group (or the "
                                      "thread's start): register accesses before it are not ordered with it");
  WgmmaHandle out;
  sim::warpgroup_collective(in, out, [](const WgmmaIssue* const* ins, WgmmaHandle* const* outs) SELFATTN_SIM_UNCHECKED {
    wgmma_issue_combine(ins, outs);
  });
  sim::current_thread().wgmma_open.push_back(std::move(out.op));
}

// wgmma_fence_operands on accumulators: this thread's fragment of the latest retired op that
// writes `d` lands in its registers (older retired ops of the same chain are superseded).
SELFATTN_SIM_UNCHECKED inline void wgmma_write_back(float* d, int count) {
  sim::ThreadContext& t = sim::current_thread();
  const unsigned thread = t.linear_tid % 128;
  std::shared_ptr<WgmmaOp> latest;
  std::vector<std::shared_ptr<void>> kept;
  for (std::shared_ptr<void>& any : t.wgmma_retired) {
    auto op = std::static_pointer_cast<WgmmaOp>(any);
    if (op->d[thread] == d) latest = op; else kept.push_back(std::move(any));
  }
  t.wgmma_retired = std::move(kept);
  if (!latest) return;  // nothing retired into these registers since their last fence
  if (latest->n / 2 != count) sim_warp::fail("wgmma_fence_operands", "the array is not the accumulator of the wgmma that wrote it");
  for (int i = 0; i < count; ++i) {
    const FragmentCoord at = wgmma_accumulator_coord(int(thread), i);
    d[i] = latest->result[size_t(at.row) * latest->n + at.col];
  }
}

}  // namespace sim_hopper
#else
#include "wgmma_ptx.inc"
#endif

// Orders this thread's earlier register accesses before the wgmma that follows (wgmma.fence).
__device__ __forceinline__ void wgmma_fence() {
#if !SELFATTN_SIM
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#else
  sim::current_thread().wgmma_fenced = true;
#endif
}

// Closes the group of wgmma operations issued since the last commit.
__device__ __forceinline__ void wgmma_commit() {
#if !SELFATTN_SIM
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#else
  sim::ThreadContext& t = sim::current_thread();
  t.wgmma_groups.push_back(std::move(t.wgmma_open));
  t.wgmma_open.clear();
#endif
}

// Waits until at most Pending committed groups are in flight: the older ones' results are in their
// accumulators and their shared-memory operands are free.
template <int Pending>
__device__ __forceinline__ void wgmma_wait() {
  static_assert(Pending >= 0 && Pending <= 7, "wgmma.wait_group takes 0..7");
#if !SELFATTN_SIM
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(Pending) : "memory");
#else
  sim::ThreadContext& t = sim::current_thread();
  const size_t groups = t.wgmma_groups.size();
  int unused = 0;
  // The warpgroup meets (wait_group is .sync.aligned); the last thread to arrive performs every
  // retired operation once, for all 128 (each thread's queue holds the same shared operations).
  sim::warpgroup_collective(groups, unused, [](const size_t* const* ins, int* const*) SELFATTN_SIM_UNCHECKED {
    for (int i = 1; i < 128; ++i)
      if (*ins[i] != *ins[0]) sim_warp::fail("wgmma.wait_group", "threads of the warpgroup committed different groups");
    const std::vector<std::vector<std::shared_ptr<void>>>& queue = sim::current_thread().wgmma_groups;
    for (size_t g = 0; g + Pending < queue.size(); ++g)
      for (const std::shared_ptr<void>& op : queue[g]) sim_hopper::wgmma_perform(*static_cast<sim_hopper::WgmmaOp*>(op.get()));
  });
  if (groups > size_t(Pending)) {
    for (auto group = t.wgmma_groups.begin(); group != t.wgmma_groups.end() - Pending; ++group)
      t.wgmma_retired.insert(t.wgmma_retired.end(), group->begin(), group->end());
    t.wgmma_groups.erase(t.wgmma_groups.begin(), t.wgmma_groups.end() - Pending);
  }
  t.wgmma_fenced = false;
#endif
}

// After the wgmma_wait that retires a wgmma: its accumulators (and A fragment) are the kernel's
// again. To the compiler, wgmma wrote them, and read A, at issue: without this it may move a read of
// the results above the wait, or give A's registers to other values while wgmma still reads them.
// An empty asm that "writes" each register at this point orders both (CUTLASS's
// warpgroup_fence_operand). On the sim, the results land in the registers here (wgmma_perform).
template <int N>
__device__ __forceinline__ void wgmma_fence_operands(float (&d)[N]) {
#if !SELFATTN_SIM
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
#else
  sim_hopper::wgmma_write_back(d, N);
#endif
}
template <int K>
__device__ __forceinline__ void wgmma_fence_operands(uint32_t (&a)[K][4]) {
#if !SELFATTN_SIM
#pragma unroll
  for (int k = 0; k < K; ++k)
#pragma unroll
    for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(a[k][i])::"memory");
#else
  (void)a;  // the sim's registers are memory: nothing to reorder
#endif
}

// wgmma with both operands in shared memory (A K-major; B K-major, or MN-major when TransposeB).
template <class T, int N, int TransposeB = 0>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  static_assert(std::is_same<T, __half>::value || std::is_same<T, __nv_bfloat16>::value, "f16 or bf16");
  static_assert(N == 64 || N == 128 || N == 256, "the shipped wgmma shapes (scripts/gen_wgmma_ptx.py)");
#if !SELFATTN_SIM
  if constexpr (std::is_same<T, __half>::value) {
    if constexpr (N == 64) wgmma_ss_m64n64k16_f16<TransposeB>(d, desc_a, desc_b, accumulate);
    else if constexpr (N == 128) wgmma_ss_m64n128k16_f16<TransposeB>(d, desc_a, desc_b, accumulate);
    else wgmma_ss_m64n256k16_f16<TransposeB>(d, desc_a, desc_b, accumulate);
  } else {
    if constexpr (N == 64) wgmma_ss_m64n64k16_bf16<TransposeB>(d, desc_a, desc_b, accumulate);
    else if constexpr (N == 128) wgmma_ss_m64n128k16_bf16<TransposeB>(d, desc_a, desc_b, accumulate);
    else wgmma_ss_m64n256k16_bf16<TransposeB>(d, desc_a, desc_b, accumulate);
  }
#else
  constexpr auto type = std::is_same<T, __half>::value ? sim_warp::Operand::f16 : sim_warp::Operand::bf16;
  sim_hopper::wgmma_issue<type, N>(d, nullptr, desc_a, desc_b, accumulate, TransposeB != 0);
#endif
}

// wgmma with A from registers (a: the m16n8k16 A fragment of this warp's 16 rows).
template <class T, int N, int TransposeB = 0>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b, bool accumulate) {
  static_assert(std::is_same<T, __half>::value || std::is_same<T, __nv_bfloat16>::value, "f16 or bf16");
  static_assert(N == 64 || N == 128 || N == 256, "the shipped wgmma shapes (scripts/gen_wgmma_ptx.py)");
#if !SELFATTN_SIM
  if constexpr (std::is_same<T, __half>::value) {
    if constexpr (N == 64) wgmma_rs_m64n64k16_f16<TransposeB>(d, a, desc_b, accumulate);
    else if constexpr (N == 128) wgmma_rs_m64n128k16_f16<TransposeB>(d, a, desc_b, accumulate);
    else wgmma_rs_m64n256k16_f16<TransposeB>(d, a, desc_b, accumulate);
  } else {
    if constexpr (N == 64) wgmma_rs_m64n64k16_bf16<TransposeB>(d, a, desc_b, accumulate);
    else if constexpr (N == 128) wgmma_rs_m64n128k16_bf16<TransposeB>(d, a, desc_b, accumulate);
    else wgmma_rs_m64n256k16_bf16<TransposeB>(d, a, desc_b, accumulate);
  }
#else
  constexpr auto type = std::is_same<T, __half>::value ? sim_warp::Operand::f16 : sim_warp::Operand::bf16;
  sim_hopper::wgmma_issue<type, N>(d, a, 0, desc_b, accumulate, TransposeB != 0);
#endif
}

// FP8 wgmma: D (64 x N, f32) {=, +=} A (64 x 32) * B (32 x N), e4m3 x e4m3 (m64nNk32). Both operands
// K-major (8-bit wgmma has no transpose): A from shared memory or from registers (4 registers of
// 4 e4m3 each; element i is byte i%4 of register i/4, at (row, col) = wgmma_a8_coord), B from
// shared memory. A 1-byte K-major tile with the 128-byte swizzle holds 128 elements per row, so a
// k-step of 32 elements advances the descriptor's start by 32 bytes (kernels/hopper/smem_layout.h).
// The accumulator fragment is the 16-bit wgmma's.
template <int N>
__device__ __forceinline__ void wgmma_ss_e4m3(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  static_assert(N == 64 || N == 128 || N == 256, "the shipped FP8 wgmma shapes (scripts/gen_wgmma_ptx.py)");
#if !SELFATTN_SIM
  if constexpr (N == 64) wgmma_ss_m64n64k32_e4m3(d, desc_a, desc_b, accumulate);
  else if constexpr (N == 128) wgmma_ss_m64n128k32_e4m3(d, desc_a, desc_b, accumulate);
  else wgmma_ss_m64n256k32_e4m3(d, desc_a, desc_b, accumulate);
#else
  sim_hopper::wgmma_issue<sim_warp::Operand::e4m3, N>(d, nullptr, desc_a, desc_b, accumulate, false);
#endif
}

template <int N>
__device__ __forceinline__ void wgmma_rs_e4m3(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b,
                                              bool accumulate) {
  static_assert(N == 64 || N == 128 || N == 256, "the shipped FP8 wgmma shapes (scripts/gen_wgmma_ptx.py)");
#if !SELFATTN_SIM
  if constexpr (N == 64) wgmma_rs_m64n64k32_e4m3(d, a, desc_b, accumulate);
  else if constexpr (N == 128) wgmma_rs_m64n128k32_e4m3(d, a, desc_b, accumulate);
  else wgmma_rs_m64n256k32_e4m3(d, a, desc_b, accumulate);
#else
  sim_hopper::wgmma_issue<sim_warp::Operand::e4m3, N>(d, a, 0, desc_b, accumulate, false);
#endif
}

// Four floats as four e4m3 in one register, x0 in the low byte: round to nearest even, saturating
// to +-448 (cvt.rn.satfinite.e4m3x2.f32 puts its first source in the high byte).
__device__ __forceinline__ uint32_t pack4_e4m3(float x0, float x1, float x2, float x3) {
#if !SELFATTN_SIM
  uint16_t lo, hi;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(lo) : "f"(x1), "f"(x0));
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(hi) : "f"(x3), "f"(x2));
  return uint32_t(lo) | uint32_t(hi) << 16;
#else
  auto byte = [](float x) { return uint32_t(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)); };
  return byte(x0) | byte(x1) << 8 | byte(x2) << 16 | byte(x3) << 24;
#endif
}

SELFATTN_KERNELS_END
