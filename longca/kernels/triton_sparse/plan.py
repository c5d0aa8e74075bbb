"""The index tables the block-sparse kernels read, built once per (mask, tile config).

A BlockLayout says which (query block, key block) pairs each KV head attends. Kernels run tiles of
BLOCK_M queries x BLOCK_N keys that never straddle a block boundary, so:
- a query tile table (start, end, block) cuts each query block into BLOCK_M-row tiles (the last
  tile of a block may be ragged, masked in the kernel);
- CSR rows per (kv head, query block) list the kept key blocks (forward, dQ);
- the transposed CSR per (kv head, key block) lists the kept query blocks (dK/dV);
- a key tile table cuts key blocks into tiles for the dK/dV grid.
When every block is the same multiple of the tile size (the uniform fast path) the kernels skip
the ragged-edge masks and walk tiles with constant strides.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import torch

from longca.masks.blocks import BlockLayout


@dataclass(frozen=True)
class TileConfig:
    """One kernel's tile shape and launch parameters."""

    block_m: int  # query rows per tile
    block_n: int  # key rows per tile
    num_warps: int = 4
    num_stages: int = 2


# Forward kernel variants: "ptr" pointer loads (default; runs every layout); "tma" tensor-descriptor
# (TMA on sm90+) loads of Q/K/V and store of O; "tma_ws" the same with Triton's automatic warp
# specialization of the key loop. The TMA variants cover uniform blocks with whole query tiles and
# fall back to "ptr" elsewhere (forward.uses_tma). Check every "tma_ws" tile config before timing
# it: on the H200 Triton 3.6 gave inf outputs for fwd=128,64,4,3 (128,128,4,2 was correct).
FWD_KERNELS = ("ptr", "tma", "tma_ws")


@dataclass(frozen=True)
class KernelConfig:
    """Tile configs of the three passes (forward, dK/dV, dQ) and the forward kernel variant."""

    fwd: TileConfig = TileConfig(128, 64, 4, 2)
    dkdv: TileConfig = TileConfig(32, 64, 4, 2)  # block_m: query rows iterated; block_n: key rows held
    dq: TileConfig = TileConfig(64, 32, 4, 2)
    fwd_kernel: str = "ptr"

    def __post_init__(self) -> None:
        if self.fwd_kernel not in FWD_KERNELS:
            raise ValueError(f"fwd_kernel must be one of {FWD_KERNELS}, got {self.fwd_kernel!r}")

    def as_dict(self) -> dict[str, list[int]]:
        return {
            name: [c.block_m, c.block_n, c.num_warps, c.num_stages]
            for name, c in (("fwd", self.fwd), ("dkdv", self.dkdv), ("dq", self.dq))
        }

    def as_text(self) -> str:
        """'fwd=128,64,8,3;dkdv=32,64,4,3;dq=64,32,4,3[;fwd_kernel=tma]': the form configs.parse_config
        reads (the default pointer kernel is left out, so rows measured before the variants read alike)."""
        text = ";".join(f"{name}={','.join(map(str, vals))}" for name, vals in self.as_dict().items())
        return text if self.fwd_kernel == "ptr" else f"{text};fwd_kernel={self.fwd_kernel}"


@dataclass
class Tiles:
    """Tiles of one axis: rows [start, end) of block `block`. `even` when every tile is full."""

    start: torch.Tensor  # (n_tiles,) int32
    end: torch.Tensor
    block: torch.Tensor
    size: int
    even: bool

    @property
    def count(self) -> int:
        return int(self.start.shape[0])


@dataclass
class Csr:
    """Row r's column list is idx[ptr[r]:ptr[r + 1]], rows ordered (kv head, block)."""

    ptr: torch.Tensor  # (heads_kv * n_rows + 1,) int32
    idx: torch.Tensor  # (nnz,) int32, sorted within a row


@dataclass
class SparsePlan:
    """Everything the kernels need for one BlockLayout and KernelConfig, on one device."""

    seqlen_q: int
    seqlen_k: int
    heads_kv: int
    n_q_blocks: int
    n_k_blocks: int
    q_bounds: torch.Tensor  # (n_q_blocks + 1,) int32
    k_bounds: torch.Tensor  # (n_k_blocks + 1,) int32
    uniform_q: int  # block size when query blocks are uniform and the tiles divide them, else 0
    uniform_k: int
    rows: Csr  # per (kv head, query block): kept key blocks
    cols: Csr  # per (kv head, key block): kept query blocks
    config: KernelConfig
    fwd_q: Tiles = field(repr=False)
    dq_q: Tiles = field(repr=False)
    dkdv_k: Tiles = field(repr=False)
    area_per_kv_head: np.ndarray = field(repr=False)  # exact attended pairs, int64

    @property
    def fast_path(self) -> bool:
        """True when every pass walks whole tiles with no ragged-edge masks."""
        c = self.config
        return bool(
            self.uniform_q
            and self.uniform_k
            and all(self.uniform_q % t.block_m == 0 and self.uniform_k % t.block_n == 0 for t in (c.fwd, c.dkdv, c.dq))
        )


def _pow2_divisor(block: int, cap: int) -> int:
    """Largest power of two <= cap dividing block (>= 16), or 0 if none."""
    t = cap
    while t >= 16:
        if block % t == 0:
            return t
        t //= 2
    return 0


def _uniform(bounds: np.ndarray) -> int:
    """Block size if bounds are 0, b, 2b, ..., n*b exactly (last block full), else 0."""
    sizes = np.diff(bounds)
    if len(sizes) and np.all(sizes == sizes[0]):
        return int(sizes[0])
    return 0


def tile_sizes(layout: BlockLayout, config: TileConfig) -> tuple[int, int]:
    """Effective tile sizes: on uniform blocks, shrunk to a power of two dividing the block."""
    bm, bn = config.block_m, config.block_n
    uq, uk = _uniform(layout.q_bounds), _uniform(layout.k_bounds)
    if uq:
        bm = _pow2_divisor(uq, bm) or bm
    if uk:
        bn = _pow2_divisor(uk, bn) or bn
    return bm, bn


def make_tiles(bounds: np.ndarray, size: int, device: torch.device) -> Tiles:
    bounds = np.asarray(bounds, dtype=np.int64)
    lens = np.diff(bounds)
    per_block = -(-lens // size)  # ceil
    block = np.repeat(np.arange(len(lens)), per_block)
    first = np.repeat(np.cumsum(per_block) - per_block, per_block)
    start = bounds[block] + (np.arange(len(block)) - first) * size
    end = np.minimum(start + size, bounds[block + 1])
    even = bool(np.all(lens % size == 0))
    as_t = lambda a: torch.as_tensor(a.astype(np.int32), device=device)  # noqa: E731
    return Tiles(as_t(start), as_t(end), as_t(block), size, even)


def make_csr(kept: np.ndarray, device: torch.device) -> Csr:
    """CSR of a (heads, rows, cols) boolean array, built head by head to bound host memory."""
    counts = kept.sum(axis=2, dtype=np.int64).ravel()
    total = int(counts.sum())
    if total >= 2**31:
        raise ValueError(f"{total} kept blocks overflow int32 indices")
    ptr = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    idx = np.empty(total, dtype=np.int32)
    pos = 0
    for h in range(kept.shape[0]):
        _, j = np.nonzero(kept[h])  # row-major: sorted by row, then column
        idx[pos : pos + len(j)] = j
        pos += len(j)
    return Csr(torch.as_tensor(ptr.astype(np.int32), device=device), torch.as_tensor(idx, device=device))


def build_plan(layout: BlockLayout, device: torch.device | str, config: KernelConfig | None = None) -> SparsePlan:
    """Index tables for `layout` under `config` (default KernelConfig()) on `device`."""
    config = config or KernelConfig()
    device = torch.device(device)
    for c in (config.fwd, config.dkdv, config.dq):
        for t in (c.block_m, c.block_n):
            if t < 16 or t & (t - 1):
                raise ValueError(f"tile sizes must be powers of two >= 16, got {c}")
    qb = np.asarray(layout.q_bounds, dtype=np.int64)
    kb = np.asarray(layout.k_bounds, dtype=np.int64)
    kept = np.asarray(layout.kept, dtype=bool)
    if kept.shape[1:] != (len(qb) - 1, len(kb) - 1):
        raise ValueError(f"kept {kept.shape} does not match {len(qb) - 1} x {len(kb) - 1} blocks")
    if qb[-1] >= 2**31 or kb[-1] >= 2**31:
        raise ValueError("sequence too long for int32 offsets")
    # Tile sizes per pass: shrunk on uniform blocks so that tiles divide blocks.
    fwd_m, fwd_n = tile_sizes(layout, config.fwd)
    dkdv_m, dkdv_n = tile_sizes(layout, config.dkdv)
    dq_m, dq_n = tile_sizes(layout, config.dq)
    config = replace(
        config,
        fwd=TileConfig(fwd_m, fwd_n, config.fwd.num_warps, config.fwd.num_stages),
        dkdv=TileConfig(dkdv_m, dkdv_n, config.dkdv.num_warps, config.dkdv.num_stages),
        dq=TileConfig(dq_m, dq_n, config.dq.num_warps, config.dq.num_stages),
    )
    uq, uk = _uniform(qb), _uniform(kb)
    as_t = lambda a: torch.as_tensor(a.astype(np.int32), device=device)  # noqa: E731
    return SparsePlan(
        seqlen_q=int(qb[-1]),
        seqlen_k=int(kb[-1]),
        heads_kv=int(kept.shape[0]),
        n_q_blocks=len(qb) - 1,
        n_k_blocks=len(kb) - 1,
        q_bounds=as_t(qb),
        k_bounds=as_t(kb),
        uniform_q=uq,
        uniform_k=uk,
        rows=make_csr(kept, device),
        cols=make_csr(kept.transpose(0, 2, 1), device),
        config=config,
        fwd_q=make_tiles(qb, fwd_m, device),
        dq_q=make_tiles(qb, dq_m, device),
        dkdv_k=make_tiles(kb, dkdv_n, device),
        area_per_kv_head=layout.area_per_head(),
    )
