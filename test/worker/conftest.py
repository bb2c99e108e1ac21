"""The real image encoders, for the kernel's format tests and the pool's hostile bodies."""

from __future__ import annotations

import time

import pytest

from test.harness.encoders import Encoders, NoEncoder, find_or_install_encoders
from test.harness.real_images import Hostile, hostile_bodies


@pytest.fixture(scope="session")
def encoders(tmp_path_factory: pytest.TempPathFactory) -> Encoders:
    """avifenc, img2webp, gif2webp and ImageMagick, installed with apt-get if missing;
    the files they make are kept for the session."""
    started = time.monotonic()
    try:
        found = find_or_install_encoders(tmp_path_factory.mktemp("encoded"))
    except NoEncoder as e:
        pytest.fail(f"the format tests need real encoders: {e}", pytrace=False)
    print(f"\nencoders: {found.executables} (in {time.monotonic() - started:.1f} s)")
    return found


@pytest.fixture(scope="session")
def hostile(encoders: Encoders) -> list[Hostile]:
    return hostile_bodies(encoders)
