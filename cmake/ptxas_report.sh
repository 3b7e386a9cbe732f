#!/usr/bin/env bash
# CUDA compiler launcher for the kernel instances (cmake/SelfattnKernelResources.cmake): runs the
# compile it is given (built with -Xptxas -v) and keeps, in <object>.ptxas,
#   - ptxas's report of it (the registers, shared memory and stack frame of each entry function,
#     per architecture), the rest of the compiler's messages passing through as they were;
#   - each entry's launch bounds, which ptxas does not report: the `.maxntid X, Y, Z` directive
#     __launch_bounds__ puts in the PTX, read from the PTX the compile leaves in a temporary
#     -keep-dir (one line per entry: "launch bounds of '<mangled name>': X Y Z").
object=""
previous=""
for argument in "$@"; do
  [ "$previous" = "-o" ] && object=$argument
  previous=$argument
done
messages=$(mktemp)
kept=$(mktemp -d)
trap 'rm -rf "$messages" "$kept"' EXIT
"$@" -keep -keep-dir "$kept" 2> "$messages"
status=$?
if [ $status -eq 0 ] && ! compgen -G "$kept/*.ptx" > /dev/null; then
  # A compiler cache replayed the object without the PTX: compile it once more without the cache.
  CCACHE_DISABLE=1 "$@" -keep -keep-dir "$kept" 2> /dev/null
fi
grep -v -E '^ptxas info|^    [0-9]+ bytes stack frame' "$messages" >&2
if [ -n "$object" ] && [ $status -eq 0 ]; then
  {
    grep -E '^ptxas info|^    [0-9]+ bytes stack frame' "$messages"
    # Every architecture's PTX has the same bounds (they come from the source): one copy of each line.
    cat "$kept"/*.ptx 2> /dev/null | awk '
      /\.entry / { name = $NF; sub(/\(.*$/, "", name); next }
      /^\.maxntid / && name != "" { gsub(/,/, ""); print "launch bounds of '"'"'" name "'"'"': " $2, $3, $4 }
      /^\{/ { name = "" }' | sort -u
  } > "$object.ptxas"
fi
exit $status
