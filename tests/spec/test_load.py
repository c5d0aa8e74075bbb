"""Spec validation: every malformed spec fails before measurement, naming field and allowed values."""

import textwrap

import pytest

from longca.spec.load import SpecError, load_spec, parse_seqlen

GOOD = """
name: t
device: cpu
kernels: [naive]
masks: [full, causal]
seqlens: [256]
heads: ["4:2"]
head_dims: [32]
dtypes: [float32]
passes: [fwd]
sweeps:
  - name: dense
"""


def spec_with(**changes):
    import yaml

    raw = yaml.safe_load(GOOD)
    for key, value in changes.items():
        if key.startswith("sweep_"):
            raw["sweeps"][0][key[6:]] = value
        elif value is None:
            raw.pop(key, None)
        else:
            raw[key] = value
    return yaml.safe_dump(raw)


def test_good_spec_loads():
    spec = load_spec(text=GOOD)
    assert spec.sweeps[0].seqlens == (256,)
    assert spec.gpu_model is None
    assert load_spec(text=spec_with(device="cuda", gpu_model="H200")).gpu_model == "H200"
    assert spec.sweeps[0].heads == ((4, 2),)


def test_seqlen_units():
    assert parse_seqlen("32K", "x") == 32768
    assert parse_seqlen("1M", "x") == 1048576
    assert parse_seqlen(300, "x") == 300


# (spec text, field named in the error, words the message must contain)
BAD = [
    (spec_with(kernels=["flashy"]), "sweeps.0.kernels.0", ["flashy", "allowed", "naive"]),
    (spec_with(masks=["casual"]), "sweeps.0.masks.0", ["casual", "allowed", "causal"]),
    (spec_with(masks=[{"name": "sliding_window", "windw": 3}]), "sweeps.0.masks.0.windw", ["windw", "window"]),
    (spec_with(masks=[{"name": "sliding_window", "window": "big"}]), "sweeps.0.masks.0.window", ["big", "integer"]),
    (spec_with(masks=[{"name": "sliding_window", "window": -4}]), "sweeps.0.masks.0.window", ["-4", "allowed", ">= 0"]),
    (
        spec_with(masks=[{"name": "full_document", "distribution": "zipf"}]),
        "sweeps.0.masks.0.distribution",
        ["zipf", "allowed"],
    ),
    (spec_with(seqlens=[-5]), "seqlens.0", ["-5"]),
    (spec_with(seqlens=["12Q"]), "seqlens.0", ["12Q"]),
    (spec_with(seqlens=[]), "seqlens", ["non-empty", ""]),
    (spec_with(kernels=[]), "kernels", [""]),
    (spec_with(heads=["4:3"]), "sweeps.0.heads.0", ["4:3", "multiple"]),
    (spec_with(heads=["4-2"]), "heads.0", ["4-2"]),
    (spec_with(heads=["0:0"]), "sweeps.0.heads.0", ["at least 1"]),
    (spec_with(head_dims=[33]), "sweeps.0.head_dims.0", ["33", "multiples of 8"]),
    (spec_with(head_dims=["128"]), "head_dims.0", ["128"]),
    (spec_with(dtypes=["float8"]), "dtypes.0", ["float8", "allowed", "bfloat16", "float8_e4m3fn"]),
    (
        spec_with(dtypes=["fp8"], sweep_cp={"mechanisms": ["ring_p2p"], "world_sizes": [2]}),
        "sweeps.0.dtypes.0",
        ["float8_e4m3fn", "context-parallel", "allowed", "bfloat16"],
    ),
    (spec_with(passes=["forward"]), "passes.0", ["forward", "allowed", "fwd"]),
    (spec_with(device="tpu"), "device", ["tpu", "allowed", "cuda"]),
    (spec_with(batch=[0]), "batch.0", ["0"]),
    (spec_with(name=None), "(top level)", ["name"]),
    (spec_with(sweeps=[]), "sweeps", [""]),
    (spec_with(colour="blue"), "(top level)", ["colour", "allowed keys"]),
    (spec_with(repeat={"warmup": 1, "iters": 2, "min_iters": 5}), "sweeps.0.repeat.min_iters", ["min_iters"]),
    (spec_with(repeat={"iters": 0}), "repeat.iters", ["0"]),
    (spec_with(repeat={"warmup_s": 0}), "repeat.warmup_s", ["0", "minimum"]),
    (spec_with(repeat={"warmup_s": "1s"}), "repeat.warmup_s", ["1s", "number"]),
    (spec_with(repeat={"warmup_s": float("nan")}), "sweeps.0.repeat.warmup_s", ["nan", "positive, finite"]),
    (spec_with(repeat={"cooldown_s": -1}), "repeat.cooldown_s", ["-1", "minimum"]),
    (spec_with(repeat={"cooldown_s": "2s"}), "repeat.cooldown_s", ["2s", "number"]),
    (spec_with(repeat={"backward": "retain"}), "repeat.backward", ["retain", "allowed", "retained_graph"]),
    (
        spec_with(repeat={"backward": "fresh_forward"}, sweep_cp={"mechanisms": ["ring_p2p"], "world_sizes": [2]}),
        "sweeps.0.repeat.backward",
        ["fresh_forward", "retained_graph"],
    ),
    (spec_with(sweep_exclude=[{"kernel": "nave"}]), "sweeps.0.exclude.0.kernel", ["nave", "allowed", "naive"]),
    (spec_with(sweep_exclude=[{"colour": "red"}]), "sweeps.0.exclude.0", ["colour"]),
    (
        spec_with(sweep_cp={"mechanisms": ["ring"], "world_sizes": [2]}),
        "sweeps.0.cp.mechanisms.0",
        ["ring", "allowed", "ring_p2p"],
    ),
    (spec_with(sweep_cp={"mechanisms": ["ring_p2p"], "world_sizes": [1]}), "sweeps.0.cp.world_sizes.0", ["at least 2"]),
    (
        spec_with(sweep_cp={"mechanisms": ["ring_p2p"], "world_sizes": [2], "backend": "nccl"}),
        "sweeps.0.cp.backend",
        ["nccl", "cuda"],
    ),
    (
        spec_with(seqlens=[250], sweep_cp={"mechanisms": ["ulysses"], "world_sizes": [4]}),
        "sweeps.0.seqlens.0",
        ["250", "divisible"],
    ),
    (
        spec_with(sweep_cp={"mechanisms": ["usp"], "world_sizes": [2], "ulysses_degrees": [3]}),
        "sweeps.0.cp.ulysses_degrees.0",
        ["3"],
    ),
    # context parallelism: what can only fail is refused before any process starts (one case per rule)
    (
        spec_with(seqlens=[384], heads=["4:2"], sweep_cp={"mechanisms": ["ulysses"], "world_sizes": [3]}),
        "sweeps.0.heads.0",
        ["'4:2'", "ulysses", "world_size 3", "not divisible by the Ulysses degree 3", "allowed"],
    ),
    (
        spec_with(seqlens=[512], heads=["12:6"], sweep_cp={"mechanisms": ["ulysses"], "world_sizes": [4]}),
        "sweeps.0.heads.0",
        ["'12:6'", "heads_kv=6 is not divisible by the Ulysses degree 4", "allowed"],
    ),
    (
        spec_with(kernels=["fla_gla"], sweep_cp={"mechanisms": ["ring_p2p"], "world_sizes": [2]}),
        "sweeps.0.kernels.0",
        ["fla_gla", "per-rank kernel", "allowed", "flex", "naive", "sdpa_cudnn"],
    ),
    (
        spec_with(seqlens=[258], masks=["causal"], sweep_cp={"mechanisms": ["ring_p2p"], "world_sizes": [2]}),
        "sweeps.0.seqlens.0",
        ["258", "divisible by 4", "zigzag", "allowed: multiples of 4"],
    ),
    (
        spec_with(sweep_cp={"mechanisms": ["usp"], "world_sizes": [2, 3], "ulysses_degrees": [2]}),
        "sweeps.0.cp.world_sizes.1",
        ["3", "usp", "no degree split", "allowed"],
    ),
    (
        spec_with(
            masks=[{"name": "block_sparse", "block": 64, "score": "importance"}],
            sweep_cp={"mechanisms": ["ring_p2p"], "world_sizes": [2]},
        ),
        "sweeps.0.masks.0.score",
        ["importance", "allowed: 'random'"],
    ),
    (
        spec_with(
            masks=[{"name": "block_sparse", "block": 64}],
            sweep_cp={"mechanisms": ["ring_p2p"], "world_sizes": [2], "balance": "document"},
        ),
        "sweeps.0.cp.balance",
        ["document", "block_sparse", "allowed"],
    ),
    # a length-valued mask parameter past the sequence cannot mean what it says
    (
        spec_with(masks=[{"name": "sliding_window", "window": 100000}]),
        "sweeps.0.masks.0.window",
        ["100000", "exceeds the sweep's length 256", "allowed: at most the sequence length"],
    ),
    (spec_with(masks=[{"name": "block_sparse", "block": 512}]), "sweeps.0.masks.0.block", ["512", "256"]),
    (
        spec_with(masks=[{"name": "variable_block_sparse", "density": 0.5}]),
        "sweeps.0.masks.0.mean_block",
        ["512 (its default) exceeds the sweep's length 256"],
    ),
    # a density below half a key block per row keeps one block, not what was asked
    (
        spec_with(masks=[{"name": "block_sparse", "block": 128, "density": 0.2}]),
        "sweeps.0.masks.0.density",
        ["0.2 keeps no key block at length 256", "2 blocks of 128", "at least 0.25"],
    ),
    (spec_with(kernels=["naive", "naive"]), "sweeps.0.kernels", ["twice"]),
    (spec_with(sweeps=[{"name": "a"}, {"name": "a"}]), "sweeps.1.name", ["duplicate"]),
    (spec_with(sweeps=[{"name": "bad name!"}]), "sweeps.0.name", ["bad name!"]),
    (spec_with(check={"max_seqlen": 4}), "check.max_seqlen", ["16"]),
    (spec_with(gpu_model="H200"), "gpu_model", ["'H200' names a GPU model", "device is 'cpu'", "device: cuda"]),
    (spec_with(device="cuda", gpu_model=""), "gpu_model", ["should be non-empty"]),
    ("name: t\nsweeps: [\n  - {name: a", "(yaml)", ["not valid YAML", "line"]),
    ("- just\n- a list\n", "(top level)", ["mapping"]),
    ("name: t\nsweeps:\n  - name: a\n", "sweeps.0.kernels", ["missing", "kernels"]),
]


@pytest.mark.parametrize("text,field,words", BAD, ids=[f"{i}-{b[1]}" for i, b in enumerate(BAD)])
def test_malformed_spec_fails_naming_field(text, field, words):
    with pytest.raises(SpecError) as info:
        load_spec(text=text)
    msg = str(info.value)
    assert info.value.field.endswith(field) or field in info.value.field, msg
    for word in words:
        assert word in msg, f"{word!r} not in {msg!r}"


def test_at_least_25_malformed_specs():
    assert len(BAD) >= 25


def test_cp_rules_honour_excludes():
    # the ulysses cells a heads rule refuses are excluded: no cell can fail, so the spec is valid
    text = spec_with(
        seqlens=[384],
        heads=["4:2", "6:3"],
        sweep_cp={"mechanisms": ["ulysses", "ring_p2p"], "world_sizes": [3]},
        sweep_exclude=[{"cp_mechanism": "ulysses", "heads": "4:2"}],
    )
    assert load_spec(text=text).sweeps[0].cp["world_sizes"] == [3]


def test_validate_command_names_field_and_allowed_values(tmp_path, capsys):
    from longca.cli import main

    path = tmp_path / "bad.yaml"
    path.write_text(spec_with(seqlens=[384], sweep_cp={"mechanisms": ["ulysses"], "world_sizes": [3]}))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "sweeps.0.heads.0" in err and "'4:2'" in err and "allowed" in err
    path.write_text(spec_with(kernels=["fla_linear_attn"], sweep_cp={"mechanisms": ["ring_p2p"], "world_sizes": [2]}))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "sweeps.0.kernels.0" in err and "fla_linear_attn" in err and "allowed: ['flex'" in err


def test_spec_file_missing(tmp_path):
    with pytest.raises(SpecError, match="does not exist"):
        load_spec(tmp_path / "nope.yaml")


def test_yaml_is_loaded_safely():
    text = textwrap.dedent(GOOD) + "description: !!python/object/apply:os.system ['echo hacked']\n"
    with pytest.raises(SpecError, match="YAML"):
        load_spec(text=text)


def test_warmup_budget_is_optional_and_inherited():
    # neither is defaulted: a default would change every existing cell's digest
    assert "warmup_s" not in load_spec(text=GOOD).sweeps[0].repeat
    assert "cooldown_s" not in load_spec(text=GOOD).sweeps[0].repeat
    spec = load_spec(text=spec_with(repeat={"warmup": 10, "warmup_s": 0.25}))
    assert spec.sweeps[0].repeat["warmup_s"] == 0.25 and spec.sweeps[0].repeat["warmup"] == 10


SPECS = sorted((__import__("pathlib").Path(__file__).resolve().parents[2] / "specs").glob("*.yaml"))


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.name)
def test_shipped_specs_load_and_expand(path):
    from longca.spec.cells import expand

    spec = load_spec(path)
    assert spec.name == path.stem and expand(spec)


@pytest.mark.parametrize("value", ["1T", "1000000M", "0", "-5", "32 K"])
def test_a_length_out_of_range_or_not_a_length_says_what_is_allowed(value):
    text = (
        f"name: x\ndevice: cpu\nkernels: [naive]\nmasks: [full]\nseqlens: [{value!r}]\nheads: ['2:2']\n"
        "head_dims: [16]\ndtypes: [float32]\npasses: [fwd]\nsweeps: [{name: s}]\n"
    )
    with pytest.raises(SpecError) as err:
        load_spec(text=text)
    assert "seqlens.0" in err.value.field
    assert "a number with K or M (32K, 1M), from 1 up to 16M" in str(err.value)


def test_a_sweep_whose_exclude_removes_every_cell_is_an_error_naming_the_rules():
    text = (
        "name: x\ndevice: cpu\nkernels: [naive, sdpa_math]\nmasks: [full]\nseqlens: [64]\nheads: ['2:2']\n"
        "head_dims: [16]\ndtypes: [float32]\npasses: [fwd]\n"
        "sweeps: [{name: s, exclude: [{kernel: naive}, {kernel: sdpa_math}]}]\n"
    )
    with pytest.raises(SpecError) as err:
        load_spec(text=text)
    assert err.value.field == "sweeps.0.exclude" and "remove every cell of sweep 's'" in str(err.value)
    assert "'kernel': 'sdpa_math'" in str(err.value)
    load_spec(text=text.replace(", {kernel: sdpa_math}", ""))  # one rule leaves sdpa_math's cell
