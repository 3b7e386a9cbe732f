#!/usr/bin/env bash
# Resource report of the fused kernels: compiles each kernels/instances/flash_*.cu for one GPU
# architecture (default sm_90) and prints, per kernel, registers, spills, stack (ptxas -v), the
# dynamic shared memory its traits ask for, and the mma.sync / ldmatrix / cp.async counts in its
# PTX (static counts after unrolling: per loop body, not per execution), with ex2 and barriers. Needs nvcc and python3,
# no GPU.   scripts/resource_report.sh [arch]      e.g. scripts/resource_report.sh sm_80
# The architecture-specific instances (kernels/instances/<tag>/, e.g. sm90a/flash_fwd_hopper_*.cu: wgmma,
# TMA, setmaxnreg) exist for their architecture alone and are always compiled for it, whatever [arch]: -gencode arch=compute_90a,code=sm_90a (nvcc 13's -arch=sm_90a
# also emits compute_90 PTX, which cannot hold wgmma). Their counts add wgmma and TMA (cp.async.bulk.tensor).
set -euo pipefail
arch=${1:-sm_90}
root=$(cd "$(dirname "$0")/.." && pwd)
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

flags=(-std=c++17 -O3 --expt-relaxed-constexpr -I"$root/kernels")
for source in "$root"/kernels/instances/flash_*.cu "$root"/kernels/instances/sm*/flash_*.cu; do
  name=$(basename "$source" .cu)
  tag=$(basename "$(dirname "$source")")  # instances, or an architecture tag such as sm90a
  case $tag in
    sm*) cubin_arch=(-gencode arch=compute_${tag#sm},code=sm_${tag#sm}) ptx_arch=(-arch=compute_${tag#sm}) ;;
    *) cubin_arch=(-arch="$arch") ptx_arch=(-arch="$arch") ;;
  esac
  "$nvcc" "${flags[@]}" "${cubin_arch[@]}" -Xptxas -v -c "$source" -o "$work/$name.o" 2> "$work/$name.ptxas" ||
    { cat "$work/$name.ptxas"; exit 1; }
  "$nvcc" "${flags[@]}" "${ptx_arch[@]}" -ptx "$source" -o "$work/$name.ptx"
done

# Launch geometry and dynamic shared memory straight from the traits (host compiler, no GPU).
cat > "$work/geometry.cpp" <<'CPP'
#include <cstdio>
#include "forward/flash_fwd.cuh"
#include "forward/flash_fwd_simt.cuh"
#include "hopper/flash_fwd_hopper.cuh"
#include "hopper/flash_fwd_hopper_fp8.cuh"
using namespace selfattn::kernels;
template <int DQK, int DV> void hopper() {  // printed under q's and k's head dim, as tensor_core()
  using T = typename FlashFwdHopperConfig<DQK, DV>::Traits;
  std::printf("flash_fwd_hopper_kernel %d %d %d %d %zu %d %d\n", DQK, T::kThreads, T::kBlockRows, T::kBlockKeys,
              T::kSmemBytes, T::kProducerRegisters, T::kConsumerRegisters);
}
template <int D> void hopper_fp8() {
  using T = typename FlashFwdHopperFp8Config<D>::Traits;
  std::printf("flash_fwd_hopper_fp8_kernel %d %d %d %d %zu %d %d\n", D, T::kThreads, T::kBlockRows, T::kBlockKeys,
              T::kSmemBytes, T::kProducerRegisters, T::kConsumerRegisters);
}
template <int DQK, int DV> void tensor_core() {  // printed under q's and k's head dim (192 for MLA's pair)
  using T = typename FlashFwdConfig<DQK, DV>::Traits;
  std::printf("flash_fwd_kernel %d %d %d %d %zu\n", DQK, T::kThreads, T::kBlockRows, T::kBlockKeys, T::kSmemBytes);
}
int main() {
  tensor_core<32, 32>(); tensor_core<64, 64>(); tensor_core<96, 96>(); tensor_core<128, 128>();
  tensor_core<192, 128>(); tensor_core<256, 256>();
  using S = FlashFwdSimtTraits;
  for (int d : {32, 64, 128, 256})
    std::printf("flash_fwd_simt_kernel %d %d %d %d %zu\n", d, S::kThreads, S::kBlockRows, S::kBlockKeys, S::smem_bytes(d));
  hopper<64, 64>(); hopper<128, 128>(); hopper<192, 128>(); hopper<256, 256>();
  hopper_fp8<128>(); hopper_fp8<256>();
}
CPP
cuda_include=$(dirname "$(dirname "$nvcc")")/include
${CXX:-c++} -std=c++17 -I"$root/kernels" -I"$root/sim/include" -I"$cuda_include" "$work/geometry.cpp" -o "$work/geometry"
"$work/geometry" > "$work/geometry.txt"

python3 - "$work" <<'PY'
import glob, os, re, subprocess, sys
work = sys.argv[1]

def demangle(name):
    try:
        return subprocess.run(["c++filt", name], capture_output=True, text=True).stdout.strip()
    except OSError:
        return name

def short(name):
    # selfattn::kernels::cuda_target::flash_fwd_kernel<__half, FlashFwdTraits<128, 4, 2, 64> >(...)
    d = demangle(name)
    d = re.sub(r"selfattn::kernels::cuda_target::", "", d)
    d = re.sub(r"\(.*\)$", "", d)
    return d.replace("__nv_bfloat16", "bf16").replace("__half", "f16").replace("float", "f32")

def ptx_counts(ptx_text, entry):
    m = re.search(r"\.entry " + re.escape(entry) + r"\(", ptx_text)
    if not m:
        return (0, 0, 0, 0, 0, 0, 0)
    # The entry ends where the next one is declared: inline asm blocks ("{ ... }", the wgmma wrappers)
    # put closing braces at the start of lines too, so the first "\n}" is not the entry's end.
    nxt = re.search(r"\n(?:\.visible |\.weak )?\.(?:entry|func) |\n\s*// \.globl", ptx_text[m.end():])
    end = m.end() + nxt.start() if nxt else len(ptx_text)
    body = ptx_text[m.end():end]
    return (len(re.findall(r"\bmma\.sync", body)), len(re.findall(r"\bldmatrix", body)),
            len(re.findall(r"\bcp\.async\.(?:ca|cg)", body)), len(re.findall(r"\bex2\.approx", body)),
            len(re.findall(r"\bbar\.sync|\bbarrier\.sync", body)), len(re.findall(r"\bwgmma\.mma_async", body)),
            len(re.findall(r"\bcp\.async\.bulk\.tensor", body)))

rows = []
for ptxas in sorted(glob.glob(os.path.join(work, "*.ptxas"))):
    ptx_text = open(ptxas[:-6] + ".ptx").read()
    entry = None
    stack = spill_st = spill_ld = None
    for line in open(ptxas):
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            entry = m.group(1)
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and entry:
            stack, spill_st, spill_ld = m.groups()
        m = re.search(r"Used (\d+) registers", line)
        if m and entry:
            rows.append((short(entry), m.group(1), stack, spill_st, spill_ld) + ptx_counts(ptx_text, entry))
            entry = None

print(f"{'kernel':66} {'regs':>4} {'stack':>5} {'spill_st':>8} {'spill_ld':>8} {'mma':>5} {'ldmatrix':>8} "
      f"{'cp.async':>8} {'ex2':>5} {'bar':>4} {'wgmma':>5} {'tma':>4}")
for r in rows:
    print(f"{r[0][:66]:66} {r[1]:>4} {r[2]:>5} {r[3]:>8} {r[4]:>8} {r[5]:>5} {r[6]:>8} {r[7]:>8} {r[8]:>5} {r[9]:>4} "
          f"{r[10]:>5} {r[11]:>4}")
print("Counts are static PTX instructions per kernel (loop bodies once, fully unrolled fragment loops);")
print("wgmma and tma (cp.async.bulk.tensor): the Hopper kernels, built for sm_90a.")

# Occupancy on sm_90 (H100/H200): 64K registers, 228 KB shared memory (1 KB reserved per block),
# 64 warps and 32 blocks per SM; registers are allocated per warp in units of 256.
regs = {}
for r in rows:
    m = re.match(r"void (flash_fwd_kernel|flash_fwd_simt_kernel|flash_fwd_hopper_kernel|"
                 r"flash_fwd_hopper_fp8_kernel)<f16"
                 r"(?:, (?:FlashFwdTraits|FlashFwdHopperTraits|FlashFwdHopperFp8Traits)<(\d+))?", r[0])
    if m:
        regs[(m.group(1), int(m.group(2)) if m.group(2) else None)] = int(r[1])
print()
print(f"{'kernel (f16 out build)':34} {'threads':>7} {'rows':>5} {'keys':>5} {'smem_B':>8} {'regs':>5} {'blocks/SM':>9} {'warps/SM':>8}")
hopper_registers = []
for line in open(os.path.join(work, "geometry.txt")):
    kind, d, threads, block_rows, keys, smem = line.split()[:6]
    if kind in ("flash_fwd_hopper_kernel", "flash_fwd_hopper_fp8_kernel"):
        hopper_registers.append((kind, int(d), int(threads), *map(int, line.split()[6:8])))
    d, threads, smem = int(d), int(threads), int(smem)
    reg = regs.get((kind, d), regs.get((kind, None)))
    if reg is None:
        continue
    warps = threads // 32
    per_warp = -(-reg * 32 // 256) * 256
    by_regs = 65536 // (per_warp * warps)
    by_smem = (228 * 1024) // (smem + 1024)
    blocks = min(by_regs, by_smem, 64 // warps, 32)
    print(f"{kind + ' hd' + str(d):34} {threads:>7} {block_rows:>5} {keys:>5} {smem:>8} {reg:>5} {blocks:>9} {blocks * warps:>8}")
for kind, d, threads, producer, consumer in hopper_registers:
    reg = regs.get((kind, d))
    print(f"{kind} hd{d}: ptxas's {reg} registers are the launch-time allocation "
          f"(__launch_bounds__({threads}, 1)); setmaxnreg then moves registers at run time: producer warpgroup "
          f"{producer}, consumer warpgroups {consumer} ({128 * producer} + {(threads - 128) * consumer} = "
          f"{128 * producer + (threads - 128) * consumer} of the block's pool, {reg} x {threads} = "
          f"{reg * threads if reg else '?'}; more and the consumers' setmaxnreg.inc waits forever)")
PY
