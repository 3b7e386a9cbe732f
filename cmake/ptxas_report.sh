#!/usr/bin/env bash
# CUDA compiler launcher for the kernel instances (cmake/SelfattnKernelResources.cmake): runs the
# compile it is given (built with -Xptxas -v) and keeps ptxas's report of it (the registers, shared
# memory and stack frame of each entry function, per architecture) in <object>.ptxas, the rest of
# the compiler's messages passing through as they were.
object=""
previous=""
for argument in "$@"; do
  [ "$previous" = "-o" ] && object=$argument
  previous=$argument
done
messages=$(mktemp)
"$@" 2> "$messages"
status=$?
grep -v -E '^ptxas info|^    [0-9]+ bytes stack frame' "$messages" >&2
[ -n "$object" ] && [ $status -eq 0 ] && grep -E '^ptxas info|^    [0-9]+ bytes stack frame' "$messages" > "$object.ptxas"
rm -f "$messages"
exit $status
