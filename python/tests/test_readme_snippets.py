"""The README's Python snippets of the integrations run as they are printed there (on CPU tensors,
the sim): the first ```python block under each section named below is read from README.md and
executed. Each skips without the packages it imports (PyTorch; transformers)."""
import contextlib
import io
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"

# section heading -> the modules its snippet needs
SECTIONS = {
    "### Switching from flash_attn": ["torch"],
    "### Using selfattn inside Hugging Face transformers": ["torch", "transformers"],
}


def snippet(heading):
    """The first ```python block between `heading` and the next heading of its level or above
    (lines in code blocks are never headings: a comment there starts with '#' too)."""
    lines = README.read_text().splitlines()
    level = len(heading.split()[0])
    start = lines.index(heading)
    block, fence = None, False
    for line in lines[start + 1:]:
        if line.startswith("```"):
            if block is not None and fence:
                return "\n".join(block) + "\n"
            fence = not fence
            if fence and line == "```python":
                block = []
            continue
        if fence and block is not None:
            block.append(line)
        elif not fence and re.match(rf"#{{1,{level}}} ", line):
            break
    raise AssertionError(f"no ```python block under {heading!r} in README.md")


@pytest.mark.parametrize("heading", list(SECTIONS))
def test_snippet_runs(heading):
    for module in SECTIONS[heading]:
        pytest.importorskip(module, reason=f"{module} is not installed (optional: scripts/setup-deps installs it)")
    code = snippet(heading)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, f"README.md: {heading}", "exec"), {"__name__": "readme_snippet"})
    if "print(" in code:
        assert printed.getvalue().strip()
