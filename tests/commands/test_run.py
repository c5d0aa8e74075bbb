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


# `longca run --sweep/--only`: a selection that matches nothing is a typo, stopped before any cell runs.

import pytest  # noqa: E402

from longca.cli import main  # noqa: E402


@pytest.mark.parametrize("args, message", [
    (["--sweep", "dens"], "--sweep 'dens': no such sweep in 'default'; allowed: cp, dense, sparse"),
    (["--only", "kernel=cudnn"], "--only kernel=cudnn: no cell of the selected sweeps has it; allowed: "),
    (["--sweep", "dense", "--only", "seqlen=1K"], "--only seqlen=1024: no cell of the selected sweeps has it; allowed: 256, 512"),
    (["--only", "colour=red"], "--only: unknown key 'colour'; allowed: kernel, mask, seqlen"),
])
def test_selection_matching_no_cell_is_an_error_naming_the_allowed_values(tmp_path, capsys, args, message):
    assert main(["run", "--spec", "specs/default.yaml", "--results", str(tmp_path), *args]) == 2
    assert message in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing ran


def test_selection_limited_to_the_chosen_sweeps(tmp_path, capsys):
    # sparse's kernel exists in the spec, but not in the dense sweep
    assert main(["run", "--spec", "specs/default.yaml", "--results", str(tmp_path), "--sweep", "dense",
                 "--only", "kernel=triton_block_sparse"]) == 2
    assert "--only kernel=triton_block_sparse: no cell of the selected sweeps has it" in capsys.readouterr().err
