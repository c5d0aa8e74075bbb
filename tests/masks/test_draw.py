"""Mask pictures: exact per-cell fractions, and a gallery of all 14 patterns."""

import json

import numpy as np
import pytest

from longca.masks.draw import block_fractions, gallery
from longca.masks.registry import build_mask


def test_fractions_are_exact_per_cell():
    m = build_mask("causal", 100)
    frac, block = block_fractions(m, cells=10)
    assert block == 10
    assert np.allclose(np.diag(frac), 55 / 100)  # a 10 x 10 diagonal block keeps 55 pairs
    assert (frac[np.triu_indices(10, 1)] == 0).all() and (frac[np.tril_indices(10, -1)] == 1).all()


def test_gallery_draws_every_pattern_with_an_index(tmp_path):
    index = gallery(tmp_path, 512, fmt="json", cells=16)
    assert len(index) == 14
    on_disk = json.loads((tmp_path / "index.json").read_text())
    assert [e["name"] for e in on_disk] == [e["name"] for e in index]
    for e in index:
        spec = json.loads((tmp_path / e["file"]).read_text())
        assert spec["mark"]["type"] == "rect"
        assert 0 < e["density"] <= 1


def test_bad_suffix_is_refused(tmp_path):
    from longca.masks.draw import draw

    with pytest.raises(ValueError, match="allowed: .png, .svg, .html, .json"):
        draw(build_mask("full", 8), tmp_path / "x.gif")


def test_package_gallery_returns_name_to_image_paths(tmp_path):
    import longca.masks

    images = longca.masks.gallery(tmp_path, 256, fmt="json", cells=8)
    assert len(images) == 14 and all(p.exists() for p in images.values())
