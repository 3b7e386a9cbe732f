#!/usr/bin/env bash
# Resource report of the fused kernels: compiles each kernels/instances/flash_*.cu for one GPU
# architecture (default sm_90) and prints, per kernel, registers, spills, stack (ptxas -v), the
# dynamic shared memory its traits ask for, and the mma.sync / ldmatrix / cp.async counts in its
# PTX (static counts after unrolling: per loop body, not per execution). Needs nvcc and python3,
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
        return (0, 0, 0)
    end = ptx_text.find("\n}", m.end())
    body = ptx_text[m.end():end]
    return (len(re.findall(r"\bmma\.sync", body)), len(re.findall(r"\bldmatrix", body)),
            len(re.findall(r"\bcp\.async\.(?:ca|cg)", body)))

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
            mma, ldm, cpa = ptx_counts(ptx_text, entry)
            rows.append((short(entry), m.group(1), stack, spill_st, spill_ld, mma, ldm, cpa))
            entry = None

print(f"{'kernel':62} {'regs':>4} {'stack':>5} {'spill_st':>8} {'spill_ld':>8} {'mma':>5} {'ldmatrix':>8} {'cp.async':>8}")
for r in rows:
    print(f"{r[0][:62]:62} {r[1]:>4} {r[2]:>5} {r[3]:>8} {r[4]:>8} {r[5]:>5} {r[6]:>8} {r[7]:>8}")
PY
