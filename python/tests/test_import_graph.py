"""The package's modules import one another without a circle (issue 34): the call modules
(_forward, _backward, _kv_cache) reach the torch custom ops through _calls.torch_ops(), _torch.py
imports the call modules, and the package's root imports them all. Read from the source with ast,
imports inside functions included: a circle closed by a lazy import ties the modules together as
much as one at the top does (neither module can be read, moved or imported without the other)."""
import ast
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "selfattn"
PACKAGE = "selfattn"
# The nanobind module (python/src), a module of the package beside the .py files that imports none
# of them.
COMPILED = "selfattn._selfattn"


def module_name(path):
    return PACKAGE if path.stem == "__init__" else f"{PACKAGE}.{path.stem}"


def imported_modules(tree, modules):
    """The modules of the package (names in `modules`) that `tree` imports anywhere in it:
    ``from . import x`` (x a module, or else a name taken from the package's root),
    ``from .x import ...``, and their absolute spellings (``from selfattn import x``,
    ``from selfattn.x import ...``, ``import selfattn.x``)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 0 and not (node.module or "").startswith(PACKAGE):
                continue  # another package
            if node.level > 1:
                raise AssertionError(f"line {node.lineno}: an import from above the package")
            source = node.module if node.level == 0 else (f"{PACKAGE}.{node.module}" if node.module else PACKAGE)
            if source == PACKAGE:
                for alias in node.names:
                    submodule = f"{PACKAGE}.{alias.name}"
                    found.add(submodule if submodule in modules else PACKAGE)
            else:
                found.add(".".join(source.split(".")[:2]))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == PACKAGE or alias.name.startswith(PACKAGE + "."):
                    found.add(".".join(alias.name.split(".")[:2]))
    return found & modules


def package_graph():
    """{module: the package's modules it imports}, for every .py file of the package."""
    paths = sorted(PACKAGE_DIR.glob("*.py"))
    modules = {module_name(p) for p in paths} | {COMPILED}
    graph = {module_name(p): imported_modules(ast.parse(p.read_text(), str(p)), modules) for p in paths}
    graph[COMPILED] = set()
    return graph


def cycles(graph):
    """Each import circle of `graph` as "a -> b -> a", one per back edge a depth-first walk meets."""
    found, state, stack = [], {}, []

    def visit(module):
        state[module] = "open"
        stack.append(module)
        for imported in sorted(graph.get(module, ())):
            if state.get(imported) == "open":
                found.append(" -> ".join(stack[stack.index(imported):] + [imported]))
            elif imported not in state:
                visit(imported)
        stack.pop()
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module)
    return found


def test_no_import_circle():
    circles = cycles(package_graph())
    assert not circles, "the package's modules import one another in a circle: " + "; ".join(circles)


def test_the_graph_holds_the_known_imports():
    # So that a reader that found no imports at all cannot pass the test above: the root imports
    # the families and _torch at the top, _torch's op bodies import the families lazily.
    graph = package_graph()
    assert {"selfattn._forward", "selfattn._backward", "selfattn._kv_cache", "selfattn._torch"} <= graph[PACKAGE]
    assert {"selfattn._forward", "selfattn._backward", "selfattn._kv_cache"} <= graph["selfattn._torch"]
    assert {"selfattn._calls", COMPILED} <= graph["selfattn._kv_cache"]


def test_a_circle_is_named():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"b"}, "d": {"d"}}
    assert cycles(graph) == ["b -> c -> b", "d -> d"]
    tree = ast.parse("def f():\n    from . import _torch, attention\n    from ._calls import torch_ops\n")
    assert imported_modules(tree, {PACKAGE, "selfattn._torch", "selfattn._calls"}) == \
        {PACKAGE, "selfattn._torch", "selfattn._calls"}


INTEGRATIONS_DIR = PACKAGE_DIR / "integrations"


def public_names():
    """The names selfattn's root exports (its __all__), read from the source."""
    tree = ast.parse((PACKAGE_DIR / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    raise AssertionError("selfattn/__init__.py has no __all__")


def package_imports(tree, depth, subpackage="integrations"):
    """(line, what) for each import of selfattn in `tree`, a module `depth` packages below the root
    (in `subpackage` when depth is 1)
    (relative imports resolved): "selfattn" for the root itself, "selfattn.X" for a module or name X
    taken from it, "selfattn.X.Y..." for anything deeper."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 0:
                if not (node.module or "").split(".")[0] == PACKAGE:
                    continue
                source = node.module
            else:
                if node.level > depth + 1:
                    raise AssertionError(f"line {node.lineno}: an import from above the package")
                base = [PACKAGE, subpackage][:depth + 2 - node.level]
                source = ".".join(base + ([node.module] if node.module else []))
            found += [(node.lineno, f"{source}.{alias.name}") for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == PACKAGE]
    return found


def test_integrations_use_the_public_api_only():
    # The integration modules (selfattn.integrations.*) build on what a user of selfattn sees: the
    # root package and the names in its __all__, never the private modules (whose functions
    # change with the package), and no other integration module. An integration may split itself
    # into private helper modules of its own (integrations/_<name>_*.py, imported by <name>.py and
    # by each other alone), which are held to the same rule.
    public = public_names()
    paths = sorted(INTEGRATIONS_DIR.glob("*.py"))
    assert paths, "no selfattn/integrations/*.py"
    integrations = [p.stem for p in paths if not p.stem.startswith("_")]
    for path in paths:
        owner = next((name for name in integrations if path.stem.startswith(f"_{name}_")), path.stem)
        own_helpers = f"{PACKAGE}.integrations._{owner}_"
        for line, what in package_imports(ast.parse(path.read_text(), str(path)), 1):
            parts = what.split(".")
            ok = what == PACKAGE or (len(parts) == 2 and parts[1] in public) or what.startswith(own_helpers)
            assert ok, f"{path.name}:{line} imports {what}: integrations may import selfattn's public API only"


def test_the_package_does_not_import_its_integrations():
    # Importing selfattn stays free of the integrations and of selfattn.distributed (and of what
    # they import, torch and torch.distributed included).
    for path in sorted(PACKAGE_DIR.glob("*.py")):
        for line, what in package_imports(ast.parse(path.read_text(), str(path)), 0):
            for subpackage in ("integrations", "distributed"):
                assert not what.startswith(f"{PACKAGE}.{subpackage}"), f"{path.name}:{line} imports {what}"


DISTRIBUTED_DIR = PACKAGE_DIR / "distributed"
# The one private name selfattn.distributed takes from the root: the package's op registration,
# called once at its import (a torch.compile'd call cannot register the ops itself).
DISTRIBUTED_PRIVATE = {f"{PACKAGE}._torch"}


def distributed_graph():
    """{module of selfattn.distributed: its modules that it imports}, and every import it makes of
    the rest of selfattn, as (file, line, what)."""
    paths = sorted(DISTRIBUTED_DIR.glob("*.py"))
    modules = {f"{PACKAGE}.distributed.{p.stem}" for p in paths if p.stem != "__init__"}
    graph, outside = {}, []
    for path in paths:
        name = f"{PACKAGE}.distributed" + ("" if path.stem == "__init__" else f".{path.stem}")
        graph[name] = set()
        for line, what in package_imports(ast.parse(path.read_text(), str(path)), 1, "distributed"):
            own = [m for m in modules if what == m or what.startswith(m + ".")]
            if own:
                graph[name].add(own[0])
            elif not what.startswith(f"{PACKAGE}.distributed."):
                outside.append((path.name, line, what))
    return graph, outside


def test_distributed_uses_the_public_api_and_no_circle():
    # selfattn.distributed builds on what a user of selfattn sees (the root and its __all__), as the
    # integrations do, but for DISTRIBUTED_PRIVATE; its own modules import one another without a
    # circle (lazy imports inside functions count, as above).
    public = public_names()
    graph, outside = distributed_graph()
    assert len(graph) >= 5 and outside, "selfattn/distributed/*.py not found, or no import of selfattn read"
    for name, line, what in outside:
        parts = what.split(".")
        ok = what == PACKAGE or (len(parts) == 2 and parts[1] in public) or what in DISTRIBUTED_PRIVATE
        assert ok, f"distributed/{name}:{line} imports {what}: selfattn's public API only (and {DISTRIBUTED_PRIVATE})"
    circles = cycles(graph)
    assert not circles, "selfattn.distributed's modules import one another in a circle: " + "; ".join(circles)
