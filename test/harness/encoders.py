"""Real encoders for the kernel's format tests: files as the web's own tools write them.

``find_or_install_encoders()`` takes ``avifenc`` (Debian's ``libavif-bin``), ``img2webp``
and ``gif2webp`` (``webp``) and ImageMagick (``imagemagick``) from PATH, or installs the
missing packages with apt-get (as root, as CI runs), the way
``dashboard_browser.find_or_install_chromium`` installs Chromium. ``Encoders`` then turns
Pillow images into AVIF, animated WebP, ICO and animated GIF files through those tools:
each source is written as a PNG in the file's own folder, encoded there, and the bytes
are kept for the session.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from PIL import Image

from test.harness.apt import AptUnavailable, apt_install

ENCODE_TIMEOUT_S = 120

# Executable -> the Debian package that ships it.
PACKAGES = {
    "avifenc": "libavif-bin",
    "img2webp": "webp",
    "gif2webp": "webp",
    "imagemagick": "imagemagick",
}
# ImageMagick 7 names its command ``magick``, Debian's ImageMagick 6 ``convert-im6.q16``
# (and ``convert``). A ``convert`` on PATH may be something else (another tool's
# stand-in), so each candidate must say it is ImageMagick.
_MAGICK_COMMANDS = ("magick", "convert-im6.q16", "convert")


class NoEncoder(Exception):
    """An encoder is not here and could not be installed; the message says which and why."""


def _imagemagick() -> str | None:
    for name in _MAGICK_COMMANDS:
        found = shutil.which(name)
        if found is None:
            continue
        try:
            version = subprocess.run(
                [found, "-version"], capture_output=True, text=True, timeout=30, check=False
            )
        except OSError:
            continue
        if "ImageMagick" in version.stdout.split("\n", 1)[0]:
            return found
    return None


def _find(executable: str) -> str | None:
    return _imagemagick() if executable == "imagemagick" else shutil.which(executable)


def find_or_install_encoders(root: Path) -> Encoders:
    """The encoders, from PATH, else their Debian packages installed with apt-get; the
    files they make go in folders under ``root``."""
    missing = sorted({PACKAGES[name] for name in PACKAGES if _find(name) is None})
    if missing:
        _install(missing)
    found = {name: _find(name) for name in PACKAGES}
    absent = sorted(name for name, path in found.items() if path is None)
    if absent:
        raise NoEncoder(f"{', '.join(absent)} still missing after installing {missing}")
    return Encoders({name: str(path) for name, path in found.items()}, root)


def _install(packages: Sequence[str]) -> None:
    wanted = " ".join(packages)
    try:
        apt_install(packages)
    except AptUnavailable as e:
        raise NoEncoder(
            f"the encoders of {wanted} are not on PATH and {e}: apt-get install {wanted}, "
            "or put them on PATH"
        ) from None


class Encoders:
    """The encoders' executables, and the files they made, kept for the session.

    Each method takes a ``name``: the file's folder under ``root`` (the encoder's inputs
    and output stay there to look at) and its key in the cache. A name means one file:
    asking again returns the bytes made the first time.
    """

    def __init__(self, executables: dict[str, str], root: Path) -> None:
        self.executables = executables
        self.root = root
        self._made: dict[str, bytes] = {}
        self._avifenc_help: str | None = None

    def avif(
        self,
        name: str,
        frames: Sequence[Image.Image],
        *,
        depth: int = 8,
        yuv: str = "420",
        quality: int = 80,
        exif: bytes | None = None,
    ) -> bytes:
        """An AVIF of ``frames`` (RGB or RGBA; more than one makes an image sequence) at
        ``depth`` bits with ``yuv`` chroma subsampling ("420", "422", "444"), carrying
        ``exif`` (a TIFF structure, with or without the "Exif\\0\\0" header) if given."""

        def encode(work: Path) -> list[str]:
            inputs = [str(_png(work, f"frame{i}", frame)) for i, frame in enumerate(frames)]
            metadata = []
            if exif is not None:
                (work / "exif.bin").write_bytes(exif)
                metadata = ["--exif", str(work / "exif.bin")]
            return [
                self.executables["avifenc"],
                *("--depth", str(depth), "--yuv", yuv, *self._avif_quality(quality), *metadata),
                *("--speed", "10", "--jobs", "1", *inputs, str(work / "out.avif")),
            ]

        return self._make(name, "out.avif", encode)

    def _avif_quality(self, quality: int) -> list[str]:
        if self._avifenc_help is None:
            help_run = subprocess.run(
                [self.executables["avifenc"], "--help"],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
            self._avifenc_help = help_run.stdout + help_run.stderr
        if "--qcolor" in self._avifenc_help:  # libavif 1.0 and later
            return ["--qcolor", str(quality), "--qalpha", str(quality)]
        # avifenc 0.11 (Debian 12) sets quality through quantizers (0 best .. 63 worst).
        # Its default rate control (libaom's CBR) fails an assertion on longer image
        # sequences; constant quality does not.
        quantizer = str(round((100 - quality) * 63 / 100))
        constant_quality = ["-a", "end-usage=q", "-a", f"cq-level={quantizer}"]
        return ["--min", quantizer, "--max", quantizer, *constant_quality]

    def animated_webp(self, name: str, frames: Sequence[Image.Image], *, lossy: bool) -> bytes:
        """An animated WebP of ``frames``, 100 ms each, through img2webp."""

        def encode(work: Path) -> list[str]:
            mode = ["-lossy", "-q", "80"] if lossy else ["-lossless"]
            args = [self.executables["img2webp"], "-loop", "0"]
            for i, frame in enumerate(frames):
                args += ["-d", "100", *mode, str(_png(work, f"frame{i}", frame))]
            return [*args, "-o", str(work / "out.webp")]

        return self._make(name, "out.webp", encode)

    def gif(self, name: str, frames: Sequence[Image.Image]) -> bytes:
        """An animated GIF of ``frames`` (ImageMagick quantises each to 256 colours)."""

        def encode(work: Path) -> list[str]:
            inputs = [str(_png(work, f"frame{i}", frame)) for i, frame in enumerate(frames)]
            out = str(work / "out.gif")
            return [self.executables["imagemagick"], "-delay", "10", *inputs, "-loop", "0", out]

        return self._make(name, "out.gif", encode)

    def webp_from_gif(self, name: str, gif: bytes) -> bytes:
        """``gif`` re-encoded by gif2webp, the usual road of an animated WebP on the web."""

        def encode(work: Path) -> list[str]:
            source = work / "in.gif"
            source.write_bytes(gif)
            out = str(work / "out.webp")
            return [self.executables["gif2webp"], "-q", "80", str(source), "-o", out]

        return self._make(name, "out.webp", encode)

    def ico(self, name: str, entries: Sequence[Image.Image]) -> bytes:
        """An ICO holding ``entries`` (at most 256 px a side) in that order. ImageMagick 6
        stores an entry of 256 px as PNG and smaller ones as BMP (DIB), 32 bits a pixel."""

        def encode(work: Path) -> list[str]:
            inputs = [str(_png(work, f"entry{i}", entry)) for i, entry in enumerate(entries)]
            return [self.executables["imagemagick"], *inputs, str(work / "out.ico")]

        return self._make(name, "out.ico", encode)

    def _make(self, name: str, output: str, command: Callable[[Path], list[str]]) -> bytes:
        if name not in self._made:
            work = self.root / name
            work.mkdir(parents=True)
            _run(command(work))
            self._made[name] = (work / output).read_bytes()
        return self._made[name]


def _png(work: Path, name: str, im: Image.Image) -> Path:
    path = work / f"{name}.png"
    im.save(path, "PNG", compress_level=1)
    return path


def _run(args: Sequence[str]) -> None:
    result = subprocess.run(
        list(args), capture_output=True, text=True, timeout=ENCODE_TIMEOUT_S, check=False
    )
    if result.returncode != 0:
        output = (result.stderr or result.stdout).strip()
        command = " ".join(args[:12]) + (f" ... ({len(args)} arguments)" if len(args) > 12 else "")
        raise RuntimeError(f"{command} exited {result.returncode}: {output[-2000:]}")
