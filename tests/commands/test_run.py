"""`longca run --shard`: whole configurations per shard, every cell in exactly one shard."""

from longca.commands.run import _config_index
from longca.spec.cells import expand
from longca.spec.load import load_spec


def test_passes_of_one_configuration_share_a_shard_and_shards_cover_all():
    cells = [c for c in expand(load_spec("specs/h200.yaml")) if c.sweep == "dense" and c.seqlen == 4096]
    by_config = {}
    for c in cells:
        by_config.setdefault((c.kernel, c.mask_variant, c.mask, c.heads_q, c.heads_kv), set()).add(_config_index(c) % 2)
    assert all(len(shards) == 1 for shards in by_config.values())
    counts = [sum(1 for c in cells if _config_index(c) % 2 == i) for i in (0, 1)]
    assert sum(counts) == len(cells) and min(counts) > len(cells) / 4
