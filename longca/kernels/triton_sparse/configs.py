"""Default tile configs per head dim (starting points from FlashAttention-2-in-Triton practice on
sm80/sm90; benchmarks/sparse_triton.py --tune measures alternatives on the target GPU).

Tile sizes shrink automatically to divide uniform blocks (block 64 runs 64-wide tiles), see
plan.tile_sizes; on variable blocks they are iterated inside each block with ragged edges masked.
"""

from __future__ import annotations

from longca.kernels.triton_sparse.plan import KernelConfig, TileConfig

_DEFAULTS: dict[int, KernelConfig] = {
    16: KernelConfig(TileConfig(64, 32, 4, 2), TileConfig(32, 64, 4, 2), TileConfig(64, 32, 4, 2)),
    32: KernelConfig(TileConfig(64, 64, 4, 2), TileConfig(32, 64, 4, 2), TileConfig(64, 32, 4, 2)),
    64: KernelConfig(TileConfig(128, 64, 4, 3), TileConfig(32, 128, 4, 3), TileConfig(128, 32, 4, 3)),
    # Backward tiles (32 x 64 for dK/dV, 64 x 32 for dQ): on the H200 (call 6) these ran the block-64
    # backward at 316-365 TFLOP/s, while 32 x 128 / 128 x 32 ran block 128 at 144-178 (the 128-wide
    # dK/dV accumulators spill). Not yet re-measured at block 128 with these tiles (NOTES.md).
    128: KernelConfig(TileConfig(128, 64, 8, 3), TileConfig(32, 64, 4, 3), TileConfig(64, 32, 4, 3)),
    256: KernelConfig(TileConfig(64, 32, 8, 2), TileConfig(16, 64, 8, 1), TileConfig(64, 16, 8, 1)),
}


def default_config(head_dim: int) -> KernelConfig:
    if head_dim not in _DEFAULTS:
        raise ValueError(f"no default tile config for head_dim={head_dim}; have {sorted(_DEFAULTS)}")
    return _DEFAULTS[head_dim]


def parse_config(text: str) -> KernelConfig:
    """'fwd=128,64,8,3;dkdv=32,128,4,3;dq=128,32,4,3' (missing passes keep KernelConfig's defaults)."""
    parts: dict[str, TileConfig] = {}
    for item in filter(None, (s.strip() for s in text.split(";"))):
        name, _, vals = item.partition("=")
        nums = [int(x) for x in vals.split(",")]
        if name not in ("fwd", "dkdv", "dq") or len(nums) != 4:
            raise ValueError(f"bad config item {item!r}: want fwd|dkdv|dq=BLOCK_M,BLOCK_N,WARPS,STAGES")
        parts[name] = TileConfig(*nums)
    return KernelConfig(**parts)
