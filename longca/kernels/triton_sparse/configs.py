"""Default tile configs per head dim (starting points from FlashAttention-2-in-Triton practice on
sm80/sm90; benchmarks/sparse_triton.py --tune measures alternatives on the target GPU).

Tile sizes shrink automatically to divide uniform blocks (block 64 runs 64-wide tiles), see
plan.tile_sizes; on variable blocks they are iterated inside each block with ragged edges masked.
"""

from __future__ import annotations

from dataclasses import replace

from longca.kernels.triton_sparse.plan import FWD_KERNELS, KernelConfig, TileConfig

_DEFAULTS: dict[int, KernelConfig] = {
    16: KernelConfig(TileConfig(64, 32, 4, 2), TileConfig(32, 64, 4, 2), TileConfig(64, 32, 4, 2)),
    32: KernelConfig(TileConfig(64, 64, 4, 2), TileConfig(32, 64, 4, 2), TileConfig(64, 32, 4, 2)),
    64: KernelConfig(TileConfig(128, 64, 4, 3), TileConfig(32, 128, 4, 3), TileConfig(128, 32, 4, 3)),
    # D=128 on blocks that are not multiples of 64 (variable blocks): the forward tile that ran
    # variable blocks at 364-370 TFLOP/s on the H200; backward tiles as for uniform blocks.
    128: KernelConfig(TileConfig(128, 64, 8, 3), TileConfig(64, 64, 4, 2), TileConfig(64, 64, 4, 3)),
    256: KernelConfig(TileConfig(64, 32, 8, 2), TileConfig(16, 64, 8, 1), TileConfig(64, 16, 8, 1)),
}

# Uniform blocks, by (head_dim, block size the tiles must divide): tuned on the H200 with
# `benchmarks/sparse_triton.py --tune-only` (32K tokens, 16:2 heads, density 0.5; the
# candidates and their TFLOP/s are in docs/sparse.md). The warp count matters as much as the tile:
# block 64 runs its 64 x 64 forward at 446 TFLOP/s with 4 warps and 285 with 8.
_BY_BLOCK: dict[tuple[int, int], KernelConfig] = {
    # Forward: TMA loads with Triton's warp specialization, 128 x 128 tiles, 4 warps, 2 stages: 567-573
    # TFLOP/s at the 64K goal shape, 0.95-0.96 of dense cuDNN, where the pointer kernel's 128 x 128 x 8
    # x 3 ran 485 (0.81) in the same run (`sparse_triton.py --variants`, docs/sparse.md).
    (128, 128): KernelConfig(
        TileConfig(128, 128, 4, 2), TileConfig(64, 64, 4, 2), TileConfig(64, 64, 4, 3), fwd_kernel="tma_ws"
    ),
    (128, 64): KernelConfig(TileConfig(64, 64, 4, 3), TileConfig(64, 64, 4, 2), TileConfig(64, 64, 4, 3)),
}


def default_config(head_dim: int, block: int | None = None) -> KernelConfig:
    """Tiles for `head_dim`; `block` (the uniform block size, None for variable blocks) picks the
    tuned entry whose block divides it (block 256 takes block 128's tiles)."""
    if head_dim not in _DEFAULTS:
        raise ValueError(f"no default tile config for head_dim={head_dim}; have {sorted(_DEFAULTS)}")
    if block:
        for (d, b), cfg in sorted(_BY_BLOCK.items(), key=lambda kv: -kv[0][1]):
            if d == head_dim and block % b == 0:
                return cfg
    return _DEFAULTS[head_dim]


def parse_config(text: str, base: KernelConfig | None = None) -> KernelConfig:
    """'fwd=128,64,8,3;dkdv=32,128,4,3;dq=128,32,4,3[;fwd_kernel=tma]' (missing items keep those of
    `base`, default KernelConfig())."""
    parts: dict[str, TileConfig | str] = {}
    for item in filter(None, (s.strip() for s in text.split(";"))):
        name, _, vals = item.partition("=")
        if name == "fwd_kernel":
            parts[name] = vals.strip()
            continue
        nums = [int(x) for x in vals.split(",")]
        if name not in ("fwd", "dkdv", "dq") or len(nums) != 4:
            raise ValueError(
                f"bad config item {item!r}: want fwd|dkdv|dq=BLOCK_M,BLOCK_N,WARPS,STAGES "
                f"or fwd_kernel={'|'.join(FWD_KERNELS)}"
            )
        parts[name] = TileConfig(*nums)
    return replace(base or KernelConfig(), **parts)
