"""CP cells built by hand for the rank runner's tests (a spec would refuse some of them: the
runner must still end each as a row)."""

from __future__ import annotations

import json

from longca.spec.cells import Cell
from longca.spec.model import DEFAULTS


def cp_cell(**fields) -> Cell:
    """A CP cell on 2 gloo CPU processes; `repeat` and `check` entries override the defaults."""
    repeat = {"warmup": 1, "iters": 2, "min_iters": 1, "budget_s": 30.0, "l2_flush": False, **fields.pop("repeat", {})}
    check = {**DEFAULTS["check"], "max_seqlen": 256, **fields.pop("check", {})}
    base = dict(
        spec="t",
        sweep="cp",
        kernel="naive",
        mask="causal",
        mask_params=(),
        seqlen=64,
        heads_q=4,
        heads_kv=2,
        head_dim=8,
        dtype="float64",
        pass_="fwd_bwd",
        batch=2,
        device="cpu",
        seed=0,
        samples=1,
        timeout_s=120.0,
        world_size=2,
        cp_mechanism="ring_p2p",
        cp_degrees=(("ring", 2),),
        cp_balance="zigzag",
        cp_backend="gloo",
    )
    base.update(fields)
    base["mask_params"] = tuple(sorted(dict(base["mask_params"]).items()))
    return Cell(**base, repeat=tuple(sorted(repeat.items())), check=json.dumps(check, sort_keys=True))
