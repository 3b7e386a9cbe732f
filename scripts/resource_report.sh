#!/usr/bin/env bash
# Resource report of the fused kernels: compiles each kernels/instances/flash_*.cu for one GPU
# architecture (default sm_90) and prints, per kernel, registers, spills, stack (ptxas -v), the
# dynamic shared memory its traits ask for, and the mma.sync / ldmatrix / cp.async counts in its
# PTX (static counts after unrolling: per loop body, not per execution), with ex2 and barriers. Needs nvcc and python3,
# no GPU.   scripts/resource_report.sh [arch]      e.g. scripts/resource_report.sh sm_80
set -euo pipefail
arch=${1:-sm_90}
root=$(cd "$(dirname "$0")/.." && pwd)
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

flags=(-std=c++17 -O3 -arch="$arch" --expt-relaxed-constexpr -I"$root/kernels")
for source in "$root"/kernels/instances/flash_*.cu; do
  name=$(basename "$source" .cu)
  "$nvcc" "${flags[@]}" -Xptxas -v -c "$source" -o "$work/$name.o" 2> "$work/$name.ptxas" ||
    { cat "$work/$name.ptxas"; exit 1; }
  "$nvcc" "${flags[@]}" -ptx "$source" -o "$work/$name.ptx"
done

# Launch geometry and dynamic shared memory straight from the traits (host compiler, no GPU).
cat > "$work/geometry.cpp" <<'CPP'
#include <cstdio>
#include "flash_fwd.cuh"
#include "flash_fwd_simt.cuh"
using namespace selfattn::kernels;
template <int D> void tensor_core() {
  using T = typename FlashFwdConfig<D>::Traits;
  std::printf("flash_fwd_kernel %d %d %d %d %zu\n", D, T::kThreads, T::kBlockRows, T::kBlockKeys, T::kSmemBytes);
}
int main() {
  tensor_core<32>(); tensor_core<64>(); tensor_core<96>(); tensor_core<128>(); tensor_core<256>();
  using S = FlashFwdSimtTraits;
  for (int d : {32, 64, 128, 256})
    std::printf("flash_fwd_simt_kernel %d %d %d %d %zu\n", d, S::kThreads, S::kBlockRows, S::kBlockKeys, S::smem_bytes(d));
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
        return (0, 0, 0, 0, 0)
    end = ptx_text.find("\n}", m.end())
    body = ptx_text[m.end():end]
    return (len(re.findall(r"\bmma\.sync", body)), len(re.findall(r"\bldmatrix", body)),
            len(re.findall(r"\bcp\.async\.(?:ca|cg)", body)), len(re.findall(r"\bex2\.approx", body)),
            len(re.findall(r"\bbar\.sync|\bbarrier\.sync", body)))

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

print(f"{'kernel':58} {'regs':>4} {'stack':>5} {'spill_st':>8} {'spill_ld':>8} {'mma':>5} {'ldmatrix':>8} "
      f"{'cp.async':>8} {'ex2':>5} {'bar':>4}")
for r in rows:
    print(f"{r[0][:58]:58} {r[1]:>4} {r[2]:>5} {r[3]:>8} {r[4]:>8} {r[5]:>5} {r[6]:>8} {r[7]:>8} {r[8]:>5} {r[9]:>4}")
print("Counts are static PTX instructions per kernel (loop bodies once, fully unrolled fragment loops).")

# Occupancy on sm_90 (H100/H200): 64K registers, 228 KB shared memory (1 KB reserved per block),
# 64 warps and 32 blocks per SM; registers are allocated per warp in units of 256.
regs = {}
for r in rows:
    m = re.match(r"void (flash_fwd_kernel|flash_fwd_simt_kernel)<f16(?:, FlashFwdTraits<(\d+))?", r[0])
    if m:
        regs[(m.group(1), int(m.group(2)) if m.group(2) else None)] = int(r[1])
print()
print(f"{'kernel (f16 build)':28} {'threads':>7} {'rows':>5} {'keys':>5} {'smem_B':>8} {'regs':>5} {'blocks/SM':>9} {'warps/SM':>8}")
for line in open(os.path.join(work, "geometry.txt")):
    kind, d, threads, block_rows, keys, smem = line.split()
    d, threads, smem = int(d), int(threads), int(smem)
    reg = regs.get((kind, d), regs.get((kind, None)))
    if reg is None:
        continue
    warps = threads // 32
    per_warp = -(-reg * 32 // 256) * 256
    by_regs = 65536 // (per_warp * warps)
    by_smem = (228 * 1024) // (smem + 1024)
    blocks = min(by_regs, by_smem, 64 // warps, 32)
    print(f"{kind + ' hd' + str(d):28} {threads:>7} {block_rows:>5} {keys:>5} {smem:>8} {reg:>5} {blocks:>9} {blocks * warps:>8}")
PY
