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
