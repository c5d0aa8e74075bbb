from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from longca.report import gallery


def test_message_when_masks_offer_no_gallery(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gallery, "find", lambda: None)
    images, message = gallery.build(tmp_path)
    assert images == [] and "No gallery images were built" in message


def test_gallery_images_are_linked_relative_to_the_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fake(out: Path) -> dict[str, Path]:
        (out / "causal.svg").write_text("<svg xmlns='http://www.w3.org/2000/svg'/>")
        return {"causal": out / "causal.svg", "outside": Path("/nonexistent/elsewhere.svg")}

    monkeypatch.setattr(gallery, "find", lambda: fake)
    images, message = gallery.build(tmp_path)
    assert images == [("gallery/causal.svg", "causal")] and message == ""


def test_find_accepts_a_module_with_a_gallery_function(monkeypatch: pytest.MonkeyPatch) -> None:
    import longca.masks

    mod = types.ModuleType("longca.masks.gallery")
    mod.gallery = lambda out: []  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "longca.masks.gallery", mod)
    if hasattr(longca.masks, "gallery"):
        monkeypatch.delattr(longca.masks, "gallery")
    assert gallery.find() is mod.gallery


def test_own_gallery_is_drawn_once_per_user_and_copied_after(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # It depends on the mask code only, not on the rows: a second report copies the first's images.
    import json

    import longca.masks.draw

    calls = []

    def fake_draw(out_dir, seqlen=4096, **kwargs):
        calls.append(out_dir)
        index = [{"name": n, "file": f"{n}.png", "description": n} for n in ("full", "causal")]
        for e in index:
            (Path(out_dir) / e["file"]).write_bytes(b"png " + e["name"].encode())
        (Path(out_dir) / "index.json").write_text(json.dumps(index))
        return index

    monkeypatch.setattr(longca.masks.draw, "gallery", fake_draw)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    first = gallery.build(tmp_path / "a")
    second = gallery.build(tmp_path / "b")
    assert len(calls) == 1 and first == second
    assert [p for p, _ in second[0]] == ["gallery/full.png", "gallery/causal.png"]  # the gallery's order
    assert (tmp_path / "b" / "gallery" / "causal.png").read_bytes() == b"png causal"
    assert not list((tmp_path / "cache" / "longca").glob("*.tmp"))  # kept whole, no leftovers
