"""What the hardware under a device does natively, for the choices that depend on it."""

from __future__ import annotations

import os

import torch

__all__ = ["NATIVE_BF16_ENV", "native_bfloat16"]

#: Environment variable that overrides :func:`native_bfloat16` ("1" or "0"; unset or empty:
#: ask the hardware)
NATIVE_BF16_ENV = "GDACIL_NATIVE_BF16"

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _override() -> bool | None:
    """The value of :data:`NATIVE_BF16_ENV` as a bool, or None when it is unset or empty."""
    value = os.environ.get(NATIVE_BF16_ENV, "").strip().lower()
    if not value:
        return None
    if value in _TRUE or value in _FALSE:
        return value in _TRUE
    raise ValueError(f"{NATIVE_BF16_ENV}={os.environ[NATIVE_BF16_ENV]!r}: expected 1 or 0 "
                     "(or leave it unset to ask the hardware)")


def native_bfloat16(device) -> bool:
    """Whether ``device`` computes bfloat16 products natively: a CUDA GPU that supports
    bfloat16, or a CPU with AVX512-BF16 or AMX. Elsewhere bfloat16 is emulated, and slower than
    float32 (5-19x under autocast on an AVX2 CPU, ``benchmarks/precision.md``).

    The environment variable ``GDACIL_NATIVE_BF16`` overrides the answer for every device:
    ``1`` as if bfloat16 were native (so ``precision="auto"`` resolves to bf16 and "auto"
    screening of float32 low-rank heads uses bfloat16), ``0`` as if it were not (fp32); unset
    or empty, the hardware decides. It is meant for testing (run the suite on an AVX2 CPU as a
    native-bf16 CI machine would, or the reverse; subprocesses such as torchrun workers inherit
    it) and for deployments that want one precision whatever the machine. Emulated bfloat16 is
    correct, only slower. Any other value raises ``ValueError``."""
    forced = _override()
    if forced is not None:
        return forced
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return any(getattr(torch.cpu, name, lambda: False)()
                   for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))
    return False
