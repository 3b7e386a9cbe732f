"""`pip install .` into a fresh virtual environment, then import selfattn there, run a call, and find the integrations
and selfattn.distributed installed.

To stay within a few minutes on two cores it reuses the library this build already compiled:
`cmake --install BUILD --component library` into a temporary prefix, then `pip install .` with
cmake.source-dir=python, which builds only the nanobind module against that library (the wheel
carries the library beside the module). pip fetches the build requirements (scikit-build-core,
nanobind, numpy) from PyPI or its cache. Needs SELFATTN_BUILD_DIR, SELFATTN_SOURCE_DIR and
SELFATTN_CMAKE (set by the ctest entry)."""
import glob
import os
import subprocess
import sys
import time

import pytest

PIP_TIMEOUT_S = 600


def run(command, **kwargs):
    result = subprocess.run([str(c) for c in command], capture_output=True, text=True, **kwargs)
    assert result.returncode == 0, f"{' '.join(map(str, command))} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def test_pip_install_into_fresh_venv(tmp_path):
    build, source = os.environ.get("SELFATTN_BUILD_DIR"), os.environ.get("SELFATTN_SOURCE_DIR")
    if not build or not source:
        pytest.skip("run through ctest (SELFATTN_BUILD_DIR and SELFATTN_SOURCE_DIR unset)")
    cmake = os.environ.get("SELFATTN_CMAKE", "cmake")
    prefix = tmp_path / "prefix"
    run([cmake, "--install", build, "--component", "library", "--prefix", prefix])
    config = glob.glob(str(prefix / "**" / "selfattnConfig.cmake"), recursive=True)
    assert config, "cmake --install put no selfattnConfig.cmake under the prefix"

    venv = tmp_path / "venv"
    run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", venv])
    python = venv / "bin" / "python"
    started = time.monotonic()
    run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check",
         "--config-settings=cmake.source-dir=python",
         f"--config-settings=cmake.define.selfattn_DIR={os.path.dirname(config[0])}",
         f"--config-settings=build-dir={tmp_path / 'build'}", source], timeout=PIP_TIMEOUT_S)
    print(f"pip install took {time.monotonic() - started:.1f} s")

    # From another folder, so nothing in the source or build tree is imported by accident.
    check = ("import numpy as np, selfattn, os; "
             "q = np.ones((1, 2, 3, 8), np.float32); out = selfattn.attention(q, q, q); "
             "assert np.allclose(out, 1), out; "
             "assert os.path.exists(os.path.join(os.path.dirname(selfattn.__file__), '_selfattn.pyi')); "
             "assert all(os.path.exists(os.path.join(os.path.dirname(selfattn.__file__), 'integrations', f)) "
             "for f in ('flash_attn.py', 'transformers.py')); "
             "assert os.path.exists(os.path.join(os.path.dirname(selfattn.__file__), 'distributed', '_ring.py')); "
             "print(selfattn.__version__, selfattn.__file__)")
    printed = run([python, "-c", check], cwd=tmp_path, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    version, location = printed.split()
    assert location.startswith(str(venv)), location
    with open(os.path.join(source, "CMakeLists.txt")) as f:
        assert f"VERSION {version} " in f.read()
