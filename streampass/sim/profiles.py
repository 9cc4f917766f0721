"""Device profiles: the peak rates and fixed costs :class:`~streampass.sim.cost.CostModel` prices
kernels with (docs/cost_model.md has the sources of the numbers)."""

from __future__ import annotations

import math
import types
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from streampass.errors import StreamPassError


def finite(v: object) -> bool:
    """Whether ``v`` is a real number (not a bool), neither infinite nor NaN.

    >>> finite(2e12), finite(float("nan")), finite(True)
    (True, False, False)
    """
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


@dataclass(frozen=True)
class DeviceProfile:
    """Peak throughput numbers for one device.

    ``peak_flops`` maps a ``torch.dtype`` to FLOP/s; the key ``"default"`` gives the
    rate for any dtype not listed (when it is absent, the float32 rate is used, or
    failing that the lowest listed rate). The mapping is stored read-only.
    ``concurrent_streams``: whether work on different streams overlaps (a GPU); False where
    streams run one after another (the ``"cpu"`` profile: CPU streams are no-ops, every op
    runs on the calling thread), and the simulator then runs them so.

    >>> p = DeviceProfile("toy", {torch.bfloat16: 100e12, "default": 10e12},
    ...                   mem_bandwidth=1e12, launch_overhead=5e-6, sync_cost=2e-6)
    >>> p.flops_for(torch.bfloat16), p.flops_for(torch.int64)
    (100000000000000.0, 10000000000000.0)
    """

    name: str
    peak_flops: Mapping[torch.dtype | str, float] = field(hash=False)
    mem_bandwidth: float
    launch_overhead: float = 5e-6
    sync_cost: float = 2e-6
    concurrent_streams: bool = True

    def __post_init__(self) -> None:
        if not self.peak_flops:
            raise StreamPassError(f"profile {self.name!r}: peak_flops is empty")
        rates = {f"peak_flops[{k}]": v for k, v in self.peak_flops.items()}
        rates["mem_bandwidth"] = self.mem_bandwidth
        for what, v in rates.items():
            if not finite(v) or v <= 0:
                raise StreamPassError(f"profile {self.name!r}: {what} must be a finite number > 0, got {v!r}")
        for what in ("launch_overhead", "sync_cost"):
            v = getattr(self, what)
            if not finite(v) or v < 0:
                raise StreamPassError(f"profile {self.name!r}: {what} must be a finite number >= 0, got {v!r}")
        object.__setattr__(self, "peak_flops", types.MappingProxyType(dict(self.peak_flops)))

    def __reduce__(self):
        # a mappingproxy cannot be pickled or deep-copied: rebuild from a plain dict
        fields = (self.mem_bandwidth, self.launch_overhead, self.sync_cost, self.concurrent_streams)
        return (DeviceProfile, (self.name, dict(self.peak_flops), *fields))

    def flops_for(self, dtype: torch.dtype | None) -> float:
        """FLOP/s for ``dtype``, falling back as described on the class.

        >>> PROFILES["a100"].flops_for(torch.float16)
        312000000000000.0
        """
        if dtype in self.peak_flops:
            return self.peak_flops[dtype]
        if "default" in self.peak_flops:
            return self.peak_flops["default"]
        if torch.float32 in self.peak_flops:
            return self.peak_flops[torch.float32]
        return min(self.peak_flops.values())


_F8 = (torch.float8_e4m3fn, torch.float8_e5m2)

# Dense (no 2:4 sparsity) vendor datasheet numbers; see docs/cost_model.md.
_HOPPER_FLOPS: dict[torch.dtype | str, float] = {
    torch.bfloat16: 989e12,
    torch.float16: 989e12,
    torch.float32: 67e12,  # CUDA cores; TF32 tensor cores (494e12) are not assumed
    torch.float64: 67e12,  # FP64 tensor cores
    **{d: 1979e12 for d in _F8},
    torch.int8: 1979e12,
    "default": 67e12,
}

PROFILES: dict[str, DeviceProfile] = {
    "h100": DeviceProfile("h100", _HOPPER_FLOPS, mem_bandwidth=3.35e12, launch_overhead=5e-6, sync_cost=2e-6),
    "h200": DeviceProfile("h200", _HOPPER_FLOPS, mem_bandwidth=4.8e12, launch_overhead=5e-6, sync_cost=2e-6),
    "a100": DeviceProfile(
        "a100",
        {
            torch.bfloat16: 312e12,
            torch.float16: 312e12,
            torch.float32: 19.5e12,
            torch.float64: 19.5e12,
            torch.int8: 624e12,
            "default": 19.5e12,
        },
        mem_bandwidth=2.039e12,
        launch_overhead=5e-6,
        sync_cost=2e-6,
    ),
    "cpu": DeviceProfile(
        "cpu",
        {torch.float64: 0.5e12, "default": 1e12},
        mem_bandwidth=50e9,
        launch_overhead=1e-6,
        sync_cost=0.0,
        concurrent_streams=False,
    ),
}
"""Built-in profiles by name: ``"h100"``, ``"h200"``, ``"a100"``, ``"cpu"``."""
