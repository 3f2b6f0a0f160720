"""KV dtypes: how many bytes one cached element takes, scales and zero points included.

Follows how engines store a quantised KV cache: vLLM's fp8 cache keeps one fp32 scale per layer
for K and one for V (not per token); int8/int4 schemes (e.g. KIVI, Liu et al. 2024) store a scale
and a zero point per group of elements.  Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from ..validate import count

__all__ = ["KV_DTYPES", "KVDType", "get_kv_dtype"]


@dataclass(frozen=True)
class KVDType:
    """How one cached element is stored.

    Attributes:
        name: e.g. ``"fp8"``.
        bits: bits per element (int4: 4, two elements per byte).
        group_size: elements that share one scale (and zero point), counted along one head's
            K or V vector of one token; ``None`` means the whole vector (``head_dim`` elements,
            or the MLA latent), i.e. per-token, per-head quantisation.  Ignored when
            ``scale_bytes`` is 0.
        scale_bytes: metadata bytes per group stored beside the values (0: none per token).

    Raises:
        ConfigError: ``bits < 1``, ``group_size < 1``, ``scale_bytes < 0`` or a non-integer.
    """

    name: str
    bits: int
    group_size: int | None = None
    scale_bytes: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"a KVDType's name must be a non-empty string, got {self.name!r}")
        minimum = {"bits": 1, "group_size": 1, "scale_bytes": 0}
        for field, low in minimum.items():
            value = getattr(self, field)
            if field == "group_size" and value is None:
                continue
            try:
                object.__setattr__(self, field, count(field, value, low))
            except ConfigError as e:
                extra = " (or None: one group per vector)" if field == "group_size" else ""
                raise ConfigError(f"KVDType {self.name!r}: {e}{extra}") from None

    def vector_bytes(self, n: int) -> int:
        """Bytes to store one vector of ``n`` elements, its scales included."""
        if (n * self.bits) % 8:
            raise ConfigError(f"{n} elements of {self.bits} bits do not fill whole bytes")
        groups = -(-n // (self.group_size or n)) if self.scale_bytes else 0  # ceil
        return n * self.bits // 8 + groups * self.scale_bytes


# fp8 keeps one fp32 scale per layer for K and one for V (vLLM's per-tensor k_scale/v_scale):
# 8 bytes a layer, not per token, so they do not appear here.  int8 and int4 are assumed to
# store an fp16 scale and an fp16 zero point (4 bytes) per group, one group per head vector.
KV_DTYPES: dict[str, KVDType] = {d.name: d for d in [
    KVDType("fp32", 32), KVDType("fp16", 16), KVDType("bf16", 16),
    KVDType("fp8", 8), KVDType("fp8_e4m3", 8), KVDType("fp8_e5m2", 8),
    KVDType("int8", 8, None, 4), KVDType("int4", 4, None, 4),
]}


def get_kv_dtype(d: str | KVDType) -> KVDType:
    """A :class:`KVDType` from its name (or itself).  Raises ``ConfigError`` on an unknown name."""
    if isinstance(d, KVDType):
        return d
    if isinstance(d, str) and d.lower() in KV_DTYPES:
        return KV_DTYPES[d.lower()]
    raise ConfigError(f"unknown KV dtype {d!r}; known: {', '.join(KV_DTYPES)} (or a KVDType)")
