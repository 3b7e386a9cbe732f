"""The library's error messages in the Python caller's terms.

The compiled module hands the library views in its own order, [batch, heads, seq, head_dim]
(bshd arrays with two axes swapped, packed varlen arrays with a batch axis of 1 put in front,
self_attention's x with a heads axis of 1), and the library names its options as C++ does
(options.bias, cache.k, backward.dlse). Its messages say "k.shape[1] (kv_heads)" for what a bshd
caller knows as k.shape[2]. The C++ messages stay as they are for C++ callers; each entry point
here runs its compiled call inside ``in_caller_terms(...)``, which rewrites the message of a
selfattn.Error on its way out: axis numbers of the arrays as the caller passed them, the Python
argument names, the Python way to raise the workspace limit. Argument, expected and got stay where
the library put them.
"""
from __future__ import annotations

import re

from ._selfattn import Error

# Where each of the library's four axes lies in the caller's array (None: the wrapper added it).
BHSD = (0, 1, 2, 3)
BSHD = (0, 2, 1, 3)
PACKED = (None, 1, 0, 2)  # varlen [total, heads, head_dim], viewed as [1, heads, total, head_dim]
ROWS = (0, None, 1, 2)  # [batch, seq, features] (self_attention's x, out with wo), viewed as [batch, 1, seq, ...]

# The library's names of what the Python functions take as keywords or return, in every call.
_PYTHON_NAMES = {
    "options.scale": "scale",
    "options.causal": "causal",
    "options.key_lengths": "key_lengths",
    "options.key_start": "key_start",
    "options.q_offset": "q_offset",
    "options.lse": "lse",
    "options.window_left": "window[0]",
    "options.window_right": "window[1]",
    "options.softcap": "softcap",
    "options.alibi_slopes_count": "alibi_slopes.size",
    "options.alibi_slopes": "alibi_slopes",
    "options.bias": "bias",
    "options.sinks": "sinks",
    "options.num_splits": "num_splits",
    "options.rotary.cos": "rotary_cos",
    "options.rotary.sin": "rotary_sin",
    "options.rotary.max_position": "rotary_cos.shape[0] (max_position)",
    "options.rotary.rotary_dim": "2 * rotary_cos.shape[1] (rotary_dim)",
    "options.q_descale": "q_descale",
    "options.k_descale": "k_descale",
    "options.v_descale": "v_descale",
    "backward.dlse": "dlse",
    "backward.dsinks": "dsinks",
    "cache.k": "k_cache",
    "cache.v": "v_cache",
    "cache.lengths": "lengths",
    "cache.block_table": "block_table",
    "cache.batch_index": "batch_index",
    "cache.max_pages_per_seq": "block_table.shape[1]",
    "cache.k_scale": "k_scale",
    "cache.v_scale": "v_scale",
    "cache.scale_count": "k_scale.size",
}

# self_attention's weights are 2-D arrays; the library speaks of them as matrices.
_MATRIX_FIELDS = {"rows": "shape[0]", "cols": "shape[1]", "row_stride": "strides[0]"}
_MATRICES = ("wq", "wk", "wv", "wo")

_WORKSPACE_ADVICE = ("raise ContextOptions::workspace_limit or Context::set_workspace_limit",
                     "raise it with context=selfattn.Context(..., workspace_limit=), or set workspace_limit on the "
                     "context in use (selfattn.default_context() for calls without context=)")


def layout_axes(layout: str) -> tuple:
    """The axes of an array of `layout` ("bhsd" or "bshd") as the library's views number them."""
    return BSHD if layout == "bshd" else BHSD


def _names_pattern(names) -> str:
    # A whole name: not the tail of a longer one (k in cache.k, out in out_a), nor a prefix of one.
    return r"(?<![\w.])(" + "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True)) + r")(?!\w)"


def translate(message: str, axes: dict, names: dict) -> str:
    """`message` with the axes of the arrays in `axes` (library name -> where each library axis lies
    in the caller's array) renumbered, then the library's names replaced by the caller's (`names`
    for this call, on top of the names every call shares)."""
    if axes:
        def renumber(match):
            axis = axes[match[1]][int(match[3])]
            return match[0] if axis is None else f"{match[1]}.{match[2]}[{axis}]"

        message = re.sub(_names_pattern(axes) + r"\.(shape|strides)\[(\d)\]", renumber, message)

        # "out.shape expected [2, 1, 5, 7] ([batch, 1, seq, wo.cols]), got [...]": whole shapes too.
        def reorder_shapes(match):
            where = axes[match[1]]

            def reorder(listed):
                items = listed[1].split(", ")
                if len(items) != 4:
                    return listed[0]
                caller_order = sorted((a, item) for a, item in zip(where, items) if a is not None)
                return "[" + ", ".join(item for _, item in caller_order) + "]"

            return f"{match[1]}.shape expected " + re.sub(r"\[([^\[\]]*)\]", reorder, match[2])

        message = re.sub(_names_pattern(axes) + r"\.shape expected (.*)$", reorder_shapes, message)

    message = re.sub(_names_pattern(_MATRICES) + r"\.(rows|cols|row_stride)(?!\w)",
                     lambda m: f"{m[1]}.{_MATRIX_FIELDS[m[2]]}", message)
    renames = {**_PYTHON_NAMES, **names}
    message = re.sub(_names_pattern(renames), lambda m: renames[m[1]], message)
    return message.replace(*_WORKSPACE_ADVICE)


class in_caller_terms:
    """Runs a compiled call and rewrites the message of the selfattn.Error it raises (see translate).

    axes: the arrays whose axes the wrapper reordered or extended, by the library's name for them
    (the views' order: "q", "cache.k"), each to one of BHSD, BSHD, PACKED, ROWS. names: this call's
    own names for the library's (a paged cache's batch is block_table's rows, say)."""

    def __init__(self, axes: dict = None, names: dict = None):
        self.axes = axes or {}
        self.names = names or {}

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        if isinstance(error, Error) and error.args and isinstance(error.args[0], str):
            error.args = (translate(error.args[0], self.axes, self.names),) + error.args[1:]
        return False  # the error goes on, its type and traceback unchanged
