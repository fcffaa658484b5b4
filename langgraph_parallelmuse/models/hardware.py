"""What the CPU computes fast: the one place that decides float32 or bfloat16 for this machine.

bfloat16 matrix products are fast only where the CPU has native bfloat16 instructions (x86
AVX-512-BF16 or AMX-BF16, Arm's BF16 extension). Elsewhere PyTorch falls back to a generic kernel:
measured on an AVX2-only AMD EPYC, a 1,024² bfloat16 matrix product ran at 0.8 GFLOP/s against
44 in float32, and vLLM-CPU in bfloat16 prefilled 32 tokens/s. So ``"auto"`` means bfloat16 on a
CPU with native support and float32 everywhere else, for the in-process engine and for the vLLM
servers the library starts alike. No torch import: the serving side asks too.

float32 matrix products with few rows (decode steps) are slow in MKL, PyTorch's BLAS, on CPUs
other than Intel's: on the AMD EPYC above, MKL multiplied 8 rows by SmolLM2's matrices at a
third of the CPU's peak and numpy's OpenBLAS (on the transposed weights) twice as fast, and
OpenBLAS was faster at every row count up to 2,048 (BENCHMARKS.md section 6). MKL stays on Intel
CPUs, its home ground.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Literal

__all__ = [
    "PRECISIONS",
    "Precision",
    "blas_for_float32",
    "cpu_flags",
    "cpu_vendor",
    "native_bfloat16",
    "resolve_precision",
]

#: Precisions the engine accepts; ``"auto"`` resolves per machine (:func:`resolve_precision`).
PRECISIONS = ("auto", "float32", "bfloat16")
Precision = Literal["auto", "float32", "bfloat16"]

# x86 flag names (Linux /proc/cpuinfo) and Arm's feature name for native bfloat16 arithmetic.
_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


@functools.cache
def _cpuinfo(cpuinfo: str = "/proc/cpuinfo") -> dict[str, str]:
    """The fields of the first CPU listed in ``cpuinfo`` (empty where unreadable)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            break
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_flags() -> frozenset[str]:
    """The instruction-set flags of this machine's CPU (x86 ``flags``, Arm ``Features``).

    Example:
        >>> isinstance(cpu_flags(), frozenset)
        True
    """
    info = _cpuinfo()
    return frozenset((info.get("flags") or info.get("Features") or "").split())


def cpu_vendor() -> str:
    """The CPU's vendor string (``GenuineIntel``, ``AuthenticAMD``, ...; empty where unknown).

    Example:
        >>> isinstance(cpu_vendor(), str)
        True
    """
    return _cpuinfo().get("vendor_id", "")


def blas_for_float32(vendor: str | None = None) -> Literal["mkl", "openblas"]:
    """Which BLAS the engine's float32 matrix products use: MKL on Intel CPUs, OpenBLAS elsewhere.

    Example:
        >>> blas_for_float32("GenuineIntel"), blas_for_float32("AuthenticAMD")
        ('mkl', 'openblas')
    """
    return "mkl" if (cpu_vendor() if vendor is None else vendor) == "GenuineIntel" else "openblas"


def native_bfloat16(flags: frozenset[str] | None = None) -> bool:
    """Whether the CPU multiplies bfloat16 matrices natively (``flags``: this machine's by default).

    Example:
        >>> native_bfloat16(frozenset({"avx2", "fma"})), native_bfloat16(frozenset({"amx_bf16"}))
        (False, True)
    """
    return bool(_BF16_FLAGS & (cpu_flags() if flags is None else flags))


def resolve_precision(precision: str, flags: frozenset[str] | None = None) -> Literal["float32", "bfloat16"]:
    """``"float32"`` or ``"bfloat16"`` for ``precision``; ``"auto"`` picks by :func:`native_bfloat16`.

    Raises:
        ValueError: ``precision`` is not one of :data:`PRECISIONS`.

    Example:
        >>> resolve_precision("auto", frozenset({"avx2"})), resolve_precision("auto", frozenset({"amx_bf16"}))
        ('float32', 'bfloat16')
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision == "auto":
        return "bfloat16" if native_bfloat16(flags) else "float32"
    return precision  # type: ignore[return-value]
