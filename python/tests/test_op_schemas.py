"""The torch custom ops' schemas stay callable by programs written against earlier releases (issue
54): op_schemas.txt pins every selfattn::* op, and the registered op must be backward compatible
with its pinned schema (torch's own rule, FunctionSchema.is_backward_compatible_with: the same name,
the same arguments in the same order with the same types and defaults, the same returns, and any
new argument appended with a default). An op registered without a pinned line fails too, so that
each new op's schema is committed deliberately. The rule itself is checked on planted changes, so
this test cannot pass by accepting everything."""
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not hasattr(torch.library, "custom_op"):
    pytest.skip("PyTorch < 2.4 has no torch.library.custom_op: the package registers no ops", allow_module_level=True)

from selfattn import _torch  # noqa: E402

PINNED_FILE = Path(__file__).with_name("op_schemas.txt")


def pinned_schemas():
    """{op name: its pinned FunctionSchema} from op_schemas.txt."""
    lines = [line for line in PINNED_FILE.read_text().splitlines() if line and not line.startswith("#")]
    schemas = [torch._C.parse_schema(line) for line in lines]
    return {schema.name: schema for schema in schemas}


def registered_schemas():
    """{op name: FunctionSchema} of every selfattn::* op, the context-parallel ones included."""
    _torch.ops()
    try:
        import selfattn.distributed  # noqa: F401  (registers ring_attention and ulysses_all_to_all)
    except ImportError:  # a PyTorch without torch.distributed: those ops are not registered anywhere
        pass
    return {schema.name: schema for schema in torch._C._jit_get_all_schemas() if schema.name.startswith("selfattn::")}


def incompatibility(new, old):
    """Why `new` cannot replace `old` for a caller written against `old`, or None. torch's rule
    decides; the reason names the first argument or return that differs."""
    if new.is_backward_compatible_with(old):
        return None
    for i, old_argument in enumerate(old.arguments):
        if i >= len(new.arguments):
            return f"argument {i} ({old_argument.name}) was removed"
        new_argument = new.arguments[i]
        if str(new_argument) != str(old_argument) or new_argument.kwarg_only != old_argument.kwarg_only:
            return f"argument {i} was `{old_argument}`, is now `{new_argument}`"
    for new_argument in new.arguments[len(old.arguments):]:
        if not new_argument.has_default_value():
            return f"the new argument `{new_argument}` has no default (new arguments go last, with a default)"
    if [str(r) for r in new.returns] != [str(r) for r in old.returns]:
        return f"the returns were {[str(r) for r in old.returns]}, are now {[str(r) for r in new.returns]}"
    return "torch's FunctionSchema.is_backward_compatible_with refuses it"


def test_every_pinned_op_is_registered_and_compatible():
    registered = registered_schemas()
    problems = []
    for name, old in sorted(pinned_schemas().items()):
        if name not in registered:
            problems.append(f"{name}: pinned but no longer registered (keep the op; add a new name beside it)")
            continue
        reason = incompatibility(registered[name], old)
        if reason:
            problems.append(f"{name}: {reason}\n  pinned:     {old}\n  registered: {registered[name]}")
    assert not problems, "op schemas changed incompatibly:\n" + "\n".join(problems)


def test_every_registered_op_is_pinned():
    unpinned = sorted(set(registered_schemas()) - set(pinned_schemas()))
    assert not unpinned, (f"ops without a pinned schema: {unpinned}; add their schemas (str(schema)) to "
                          f"{PINNED_FILE.name}")


OLD = "selfattn::example(Tensor q, str? causal, float? scale, SymInt window_left, float dropout_p=0.) -> (Tensor, Tensor)"
# The same op before it had a defaulted argument (what an argument appended without a default breaks).
OLD_NO_DEFAULTS = "selfattn::example(Tensor q, str? causal, float? scale) -> (Tensor, Tensor)"


@pytest.mark.parametrize("old, changed, accepted", [
    # An argument appended with a default: a call written against OLD still binds.
    (OLD, "selfattn::example(Tensor q, str? causal, float? scale, SymInt window_left, float dropout_p=0., "
          "Tensor? sinks=None) -> (Tensor, Tensor)", True),
    # Appended without a default: an old call no longer binds.
    (OLD_NO_DEFAULTS, "selfattn::example(Tensor q, str? causal, float? scale, bool deterministic) -> "
                      "(Tensor, Tensor)", False),
    # Inserted in the middle: old positional calls pass scale where it now stands.
    (OLD, "selfattn::example(Tensor q, str? causal, bool deterministic, float? scale, SymInt window_left, "
          "float dropout_p=0.) -> (Tensor, Tensor)", False),
    # Two arguments swapped.
    (OLD, "selfattn::example(Tensor q, float? scale, str? causal, SymInt window_left, float dropout_p=0.) -> "
          "(Tensor, Tensor)", False),
    # A type changed.
    (OLD, "selfattn::example(Tensor q, str? causal, float scale, SymInt window_left, float dropout_p=0.) -> "
          "(Tensor, Tensor)", False),
    # A default changed.
    (OLD, "selfattn::example(Tensor q, str? causal, float? scale, SymInt window_left, float dropout_p=0.5) -> "
          "(Tensor, Tensor)", False),
    # An argument removed.
    (OLD, "selfattn::example(Tensor q, str? causal, float? scale, SymInt window_left) -> (Tensor, Tensor)", False),
    # A return added.
    (OLD, "selfattn::example(Tensor q, str? causal, float? scale, SymInt window_left, float dropout_p=0.) -> "
          "(Tensor, Tensor, Tensor)", False),
])
def test_the_rule_refuses_what_breaks_old_callers(old, changed, accepted):
    reason = incompatibility(torch._C.parse_schema(changed), torch._C.parse_schema(old))
    assert (reason is None) == accepted, reason
