#!/usr/bin/env python3
"""Runs FlashAttention-2's own tests/test_flash_attn.py against selfattn.integrations.flash_attn, as a
project switching from FlashAttention would, on the sim (CPU tensors).

    scripts/flash_attn_upstream_tests.py --flash-attn PATH [--sample N] [--seed S] [--max-tokens T]
                                         [--build build] [-- PYTEST_ARGS...]

PATH is a checkout of github.com/Dao-AILab/flash-attention (its tests are read, never committed
here). The test file runs unchanged but for its device: every "cuda" in it becomes "cpu", and
torch.cuda's capability queries answer as an A100 would (8.0, 80 GB), so the file's own skips
decide as on that GPU. A package named flash_attn is put in front of it, made here:
  flash_attn                         the module's seven calls (the packed forms slice the packed
                                     tensor, as FlashAttention's wrappers do)
  flash_attn.flash_attn_interface    _get_block_size_n, flash_attn_gpu and the _flash_attn_* calls
                                     (the module's), USE_TRITON_ROCM = False
  flash_attn.bert_padding            pad_input, unpad_input, written here from their documented use
  flash_attn.layers.rotary           apply_rotary_emb, written here from FlashAttention's rotary rule
The test file's cases are many (half a million) and large for a CPU simulator: --sample N runs up
to N cases of each test function, drawn with --seed among those whose batch x heads x seqlen_q x
seqlen_k x d/64 stays under --max-tokens (the sizes read from each case's parameters), all when N
is 0. test_flash_attn_race_condition (250 repeats of a batch-60 call, hunting a GPU's
nondeterminism) is left out. Prints pytest's summary: every case of a feature the library has should pass; a refusal is a FlashAttnNotSupported
naming the argument. Needs PyTorch and einops (pip install einops) in the build's Python.
"""
import argparse
import os
import pathlib
import subprocess
import sys
import tempfile
import textwrap

HERE = pathlib.Path(__file__).resolve().parent.parent

PACKAGE = {
    "flash_attn/__init__.py": """
        from selfattn.integrations.flash_attn import (flash_attn_func, flash_attn_kvpacked_func,
            flash_attn_qkvpacked_func, flash_attn_varlen_func, flash_attn_varlen_kvpacked_func,
            flash_attn_varlen_qkvpacked_func, flash_attn_with_kvcache)
        """,
    "flash_attn/flash_attn_interface.py": """
        from selfattn.integrations.flash_attn import (_flash_attn_backward, _flash_attn_forward,
            _flash_attn_varlen_backward, _flash_attn_varlen_forward, _get_block_size_n, flash_attn_gpu)
        USE_TRITON_ROCM = False
        """,
    "flash_attn/bert_padding.py": """
        import torch
        import torch.nn.functional as F


        def unpad_input(hidden_states, attention_mask, unused_mask=None):
            # hidden_states [batch, seqlen, ...], attention_mask [batch, seqlen] (True: a token): the
            # tokens packed, their flat indices, cu_seqlens, the longest sequence, each length.
            mask = attention_mask if unused_mask is None else attention_mask | unused_mask
            seqlens = mask.sum(dim=-1, dtype=torch.int32)
            used = attention_mask.sum(dim=-1, dtype=torch.int32)
            indices = torch.nonzero(mask.flatten(), as_tuple=False).flatten()
            cu_seqlens = F.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
            packed = hidden_states.reshape(-1, *hidden_states.shape[2:])[indices]
            return packed, indices, cu_seqlens, int(seqlens.max().item()), used


        def pad_input(hidden_states, indices, batch, seqlen):
            # The inverse: packed tokens back at their flat indices of [batch, seqlen, ...], 0 elsewhere.
            out = torch.zeros(batch * seqlen, *hidden_states.shape[1:], dtype=hidden_states.dtype,
                              device=hidden_states.device)
            out[indices] = hidden_states
            return out.reshape(batch, seqlen, *hidden_states.shape[1:])
        """,
    "flash_attn/layers/__init__.py": "",
    "flash_attn/layers/rotary.py": """
        import torch


        def apply_rotary_emb(x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0, cu_seqlens=None,
                             max_seqlen=None):
            # x [batch, seqlen, heads, dim]; cos, sin [positions, rotary_dim / 2]: the first rotary_dim
            # features of token s rotated by the angles of position seqlen_offsets (+ s), pairs
            # (2i, 2i + 1) when interleaved, else (i, i + rotary_dim / 2); computed in fp32.
            assert cu_seqlens is None, "only the batched form is needed by test_flash_attn.py"
            half = cos.shape[1]
            seqlen = x.shape[1]
            offsets = torch.as_tensor(seqlen_offsets, device=x.device).reshape(-1, 1)
            positions = offsets + torch.arange(seqlen, device=x.device)[None, :]  # [batch or 1, seqlen]
            c = cos.float()[positions][:, :, None, :]
            s = sin.float()[positions][:, :, None, :]
            ro = x[..., :2 * half].float()
            if interleaved:
                a, b = ro[..., 0::2], ro[..., 1::2]
                rotated = torch.stack([a * c - b * s, a * s + b * c], dim=-1).flatten(-2)
            else:
                a, b = ro[..., :half], ro[..., half:]
                rotated = torch.cat([a * c - b * s, a * s + b * c], dim=-1)
            out = torch.cat([rotated.to(x.dtype), x[..., 2 * half:]], dim=-1)
            if inplace:
                x.copy_(out)
                return x
            return out
        """,
    "conftest.py": """
        import os
        import random
        import types

        import torch

        # The device: torch.cuda's queries answer as an A100 (8.0, 80 GB) would.
        torch.cuda.get_device_capability = lambda *args, **kwargs: (8, 0)
        torch.cuda.get_device_properties = lambda *args, **kwargs: types.SimpleNamespace(total_memory=80 * 2**30)

        SIZE_NAMES = ("seqlen", "seqlen_q", "seqlen_k")


        def _tokens(item):
            params = getattr(getattr(item, "callspec", None), "params", {})
            sizes = {name: params[name] for name in SIZE_NAMES if isinstance(params.get(name), int)}
            seq_q = sizes.get("seqlen_q", sizes.get("seqlen", 128))
            seq_k = sizes.get("seqlen_k", sizes.get("seqlen", 128))
            # batch x nheads as the tests set them (4 x 9, 8 x 9, 2 x 6 ...): 72 bounds them all.
            return 72 * seq_q * seq_k * max(1, params.get("d", 64)) // 64


        # What a CPU simulator cannot run in a session: 250 repeats of a batch-60 forward and backward
        # looking for a GPU's nondeterminism (the sim's own race checker covers the kernels instead).
        EXCLUDED = {"test_flash_attn_race_condition"}


        def pytest_collection_modifyitems(config, items):
            # Up to `sample` cases of each test function (all with 0), drawn among those that fit.
            sample = int(os.environ["SELFATTN_FA_SAMPLE"])
            limit = int(os.environ["SELFATTN_FA_MAX_TOKENS"])
            draw = random.Random(int(os.environ["SELFATTN_FA_SEED"]))
            by_function = {}
            for item in items:
                if item.originalname not in EXCLUDED and _tokens(item) <= limit:
                    by_function.setdefault(item.originalname, []).append(item)
            kept = []
            for cases in by_function.values():
                kept += draw.sample(cases, sample) if sample and len(cases) > sample else cases
            chosen = set(id(item) for item in kept)
            config.hook.pytest_deselected(items=[item for item in items if id(item) not in chosen])
            items[:] = [item for item in items if id(item) in chosen]
        """,
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flash-attn", required=True, type=pathlib.Path, help="a flash-attention checkout")
    parser.add_argument("--sample", type=int, default=10,
                        help="cases per test function (0: all that fit --max-tokens)")
    parser.add_argument("--seed", type=int, default=1, help="the sample's seed")
    parser.add_argument("--max-tokens", type=int, default=72 * 256 * 256,
                        help="largest batch x heads x seqlen_q x seqlen_k x d/64 of a sampled case")
    parser.add_argument("--build", type=pathlib.Path, default=HERE / "build", help="the build holding python/")
    parser.add_argument("pytest_args", nargs="*", help="after --: more pytest arguments (-k, -x, -q ...)")
    args = parser.parse_args()
    source = args.flash_attn / "tests" / "test_flash_attn.py"
    if not source.is_file():
        sys.exit(f"{source}: not found (--flash-attn expects a flash-attention checkout)")
    with tempfile.TemporaryDirectory(prefix="flash_attn_upstream_") as work:
        work = pathlib.Path(work)
        for relative, text in PACKAGE.items():
            path = work / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(text).lstrip())
        # The one change to the test file: its device.
        (work / "test_flash_attn.py").write_text(source.read_text().replace('"cuda"', '"cpu"'))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(work), str(args.build.resolve() / "python")]),
                   SELFATTN_FA_SAMPLE=str(args.sample), SELFATTN_FA_SEED=str(args.seed),
                   SELFATTN_FA_MAX_TOKENS=str(args.max_tokens), PYTHONDONTWRITEBYTECODE="1")
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE", "--tb=line",
                   str(work / "test_flash_attn.py"), *args.pytest_args]
        return subprocess.call(command, cwd=work, env=env)


if __name__ == "__main__":
    sys.exit(main())
