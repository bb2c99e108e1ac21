"""The real encoders' finder: what it takes for ImageMagick, and what it says when it
cannot install a missing encoder."""

from __future__ import annotations

from pathlib import Path

import pytest

from test.harness import apt, encoders


def test_a_missing_encoder_that_cannot_be_installed_is_named(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(encoders, "_find", lambda name: None)
    monkeypatch.setattr(apt.os, "geteuid", lambda: 1000)
    with pytest.raises(encoders.NoEncoder) as raised:
        encoders.find_or_install_encoders(tmp_path)
    message = str(raised.value)
    assert "needs root and apt-get" in message
    assert "apt-get install imagemagick libavif-bin webp" in message


def test_a_convert_that_is_not_imagemagick_is_not_taken(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name, says in (("convert", "convert: a stand-in"), ("magick", "Version: ImageMagick 7")):
        folder = tmp_path / name
        folder.mkdir()
        script = folder / name
        script.write_text(f"#!/bin/sh\necho '{says}'\n")
        script.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path / "convert"))
    assert encoders._imagemagick() is None
    monkeypatch.setenv("PATH", f"{tmp_path / 'convert'}:{tmp_path / 'magick'}")
    assert encoders._imagemagick() == str(tmp_path / "magick" / "magick")
