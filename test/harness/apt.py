"""Debian packages the tests need, installed with apt-get when missing (as root, as CI
runs): Chromium for the dashboard's page, the image encoders for the kernel's formats."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from test.harness.parallel import flocked

APT_TIMEOUT_S = 600
# One install at a time on the machine, whichever test process asks: the suite's workers
# run side by side, and apt-get's own lock gives up after DPkg::Lock::Timeout while
# another install (ImageMagick's libraries, a first `apt-get update`) can take longer.
LOCK_FILE = Path(tempfile.gettempdir()) / "image-crawler-tests-apt.lock"


class AptUnavailable(Exception):
    """The packages could not be installed; the message says why, in a clause."""


def _apt_get(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["apt-get", "-q", "-o", "DPkg::Lock::Timeout=120", *args],
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        capture_output=True,
        text=True,
        timeout=APT_TIMEOUT_S,
        check=False,
    )


def apt_install(packages: Sequence[str]) -> None:
    """Install ``packages`` without their recommends (desktop integration, more
    delegates: what the tests use comes without)."""
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        raise AptUnavailable("cannot be installed here (needs root and apt-get)")
    install = ("install", "-y", "--no-install-recommends", *packages)
    with flocked(LOCK_FILE, fcntl.LOCK_EX):
        result = _apt_get(*install)  # installs nothing if the one before us did
        if result.returncode != 0:
            # A fresh machine may have no package lists yet: fetch them once, try again.
            _apt_get("update")
            result = _apt_get(*install)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise AptUnavailable(f"`apt-get install {' '.join(packages)}` failed: {last}")
