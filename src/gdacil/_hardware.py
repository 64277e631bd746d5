"""What the hardware under a device does natively, for the choices that depend on it."""

from __future__ import annotations

import torch

__all__ = ["native_bfloat16"]


def native_bfloat16(device) -> bool:
    """Whether ``device`` computes bfloat16 products natively: a CUDA GPU that supports
    bfloat16, or a CPU with AVX512-BF16 or AMX. Elsewhere bfloat16 is emulated, and slower than
    float32 (5-19x under autocast on an AVX2 CPU, ``benchmarks/precision.md``)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return any(getattr(torch.cpu, name, lambda: False)()
                   for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))
    return False
