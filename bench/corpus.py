"""The benchmark's corpus: real photographs re-encoded as JPEGs of 1024-2048 px.

The photographs come from three Debian packages of desktop wallpapers (see ``PHOTOS`` and
bench/README.md for authors and licences), fetched with ``apt-get download`` and unpacked
with ``dpkg-deb``; nothing is committed. Each photograph gives several files: a crop, a
long side, a JPEG quality and chroma subsampling chosen by a seeded random generator, so
the same command builds the same corpus. Two kinds of file:

- ``large``: long side 1800-2048 px, quality 92-95. These wallpapers were denoised and
  are smooth, so a plain re-encode is mostly under 1 MB; where it is, gaussian grain
  (sigma 2, 4, 6 or 8 levels of 255, the noise an unretouched camera JPEG carries) is
  added, after 4:4:4 chroma, until the file is at least 1 MB. These are the 1-3 MB
  bodies the memory target is about.
- ``mixed``: long side 1024-2048 px, quality 75-95, no grain, whatever size that gives.

Half of the files carry EXIF: the photograph's own camera EXIF where it has some, else
a camera-like block (Make, Model, exposure, Artist, Copyright, GPS on some).

The files and a ``manifest.json`` are cached in ``bench/corpus/`` (gitignored).
"""

from __future__ import annotations

import dataclasses
import io
import json
import random
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

from PIL import Image, ImageChops

# Bump when the recipe changes: a cached corpus of another version is rebuilt.
RECIPE_VERSION: Final = 1
DEFAULT_DIR: Final = Path(__file__).resolve().parent / "corpus"
MEGABYTE: Final = 1_000_000
GRAIN_SIGMAS: Final = (2.0, 4.0, 6.0, 8.0)


@dataclasses.dataclass(frozen=True, slots=True)
class Photo:
    """One photograph inside a Debian package, with its credit line."""

    package: str
    path: str  # inside the package's file system
    author: str
    licence: str

    @property
    def name(self) -> str:
        return Path(self.path).stem


_LOMIRI = "./usr/share/backgrounds/"
_MATE = "./usr/share/backgrounds/mate/"
_GPL = "GPL-2+"
PHOTOS: Final = (
    Photo("lomiri-wallpapers-16.04", _LOMIRI + "Bridge_by_Sander_Klootwijk.jpg",
          "Sander Klootwijk", "CC-BY-SA-4.0"),
    Photo("lomiri-wallpapers-16.04", _LOMIRI + "Dragonfly_by_Bolly.jpg", "Bolly", "CC-BY-SA-4.0"),
    Photo("lomiri-wallpapers-16.04", _LOMIRI + "Picture_0B_by_freespace.jpg",
          'Trevor "Freespace"', "CC-BY-4.0"),
    Photo("lomiri-wallpapers-16.04", _LOMIRI + "Picture_1A_by_freespace.jpg",
          'Trevor "Freespace"', "CC-BY-4.0"),
    Photo("lomiri-wallpapers-16.04", _LOMIRI + "Wine_by_Jakkub_Mede.jpg", "Jakub Mede",
          "CC-BY-4.0"),
    Photo("lomiri-wallpapers-16.04", _LOMIRI + "aitzgorri_by_Aitzol_Berasategi.jpg",
          "Aitzol Berasategi", "CC-BY-4.0"),
    Photo("lomiri-wallpapers-16.04", _LOMIRI + "analogpattern_by_Peter_Nerlich.jpg",
          "Peter Nerlich", "CC-BY-SA-4.0"),
    Photo("lomiri-wallpapers-16.04", _LOMIRI + "free_by_Peter_Nerlich.jpg", "Peter Nerlich",
          "CC-BY-SA-4.0"),
    Photo("lomiri-wallpapers-16.04", _LOMIRI + "friends_by_Aitzol_Berasategi.jpg",
          "Aitzol Berasategi", "CC-BY-4.0"),
    Photo("lomiri-wallpapers-16.04", _LOMIRI + "greentock_by_Peter_Nerlich.jpg",
          "Peter Nerlich", "CC-BY-SA-4.0"),
    Photo("lomiri-wallpapers-16.04", _LOMIRI + "life_by_Aitzol_Berasategi.jpg",
          "Aitzol Berasategi", "CC-BY-4.0"),
    Photo("lomiri-wallpapers-16.04", _LOMIRI + "picosdeeuropa_by_Aitzol_Berasategi.jpg",
          "Aitzol Berasategi", "CC-BY-4.0"),
    Photo("lomiri-wallpapers-16.04", _LOMIRI + "seeding_by_Clements_Engelhardt.jpg",
          "Clemens Engelhardt", "CC0-1.0"),
    Photo("lomiri-wallpapers-16.04", _LOMIRI + "sunset_by_Aitzol_Berasategi.jpg",
          "Aitzol Berasategi", "CC-BY-4.0"),
    Photo("lomiri-wallpapers-20.04", _LOMIRI + "Kleiber_by_Lukas_Baubkus.jpg",
          "Lukas Baubkus", "CC-BY-SA-3.0"),
    Photo("mate-backgrounds", _MATE + "abstract/Elephants_5640x3172.jpg",
          "Wyng Stancikaite", _GPL),
    Photo("mate-backgrounds", _MATE + "nature/Aqua.jpg", "Charles Barbin", _GPL),
    Photo("mate-backgrounds", _MATE + "nature/Blinds.jpg",
          "Lennart Poettering, Andrea Cimitan", _GPL),
    Photo("mate-backgrounds", _MATE + "nature/Dune.jpg", "Marco Cogoni, Hylke Bons", _GPL),
    Photo("mate-backgrounds", _MATE + "nature/FreshFlower.jpg", "Jens Ansorg", _GPL),
    Photo("mate-backgrounds", _MATE + "nature/Garden.jpg", "Charles Barbin", _GPL),
    Photo("mate-backgrounds", _MATE + "nature/GreenMeadow.jpg",
          "Timothy Schellhase, Lapo Calamandrei", _GPL),
    Photo("mate-backgrounds", _MATE + "nature/LadyBird.jpg", "Charles Barbin", _GPL),
    Photo("mate-backgrounds", _MATE + "nature/RainDrops.jpg", '"blackcombwhistler07"', _GPL),
    Photo("mate-backgrounds", _MATE + "nature/Storm.jpg", "Sergey Nazarov", _GPL),
    Photo("mate-backgrounds", _MATE + "nature/TwoWings.jpg", "Charles Barbin, Hylke Bons",
          _GPL),
    Photo("mate-backgrounds", _MATE + "nature/Wood.jpg", "Jean-François Fortin Tam", _GPL),
    Photo("mate-backgrounds", _MATE + "nature/YellowFlower.jpg", "Charles Barbin", _GPL),
)  # fmt: skip


class CorpusError(RuntimeError):
    """The photographs could not be obtained."""


@dataclasses.dataclass(frozen=True, slots=True)
class CorpusFile:
    """One file of the corpus and how it was made."""

    name: str
    photo: str
    kind: str  # "large" or "mixed"
    width: int
    height: int
    quality: int
    subsampling: str  # "4:2:0" or "4:4:4"
    grain_sigma: float
    exif: str  # "camera" (the photograph's own), "synthetic" or "none"
    size_bytes: int


@dataclasses.dataclass(frozen=True, slots=True)
class Corpus:
    directory: Path
    files: tuple[CorpusFile, ...]

    def of_kind(self, kind: str) -> Corpus:
        """The files of one kind ("large" or "mixed"), in manifest order: what
        ``bench.origin --kind`` serves."""
        return Corpus(self.directory, tuple(f for f in self.files if f.kind == kind))

    def bodies(self) -> list[bytes]:
        """Every file's bytes, in manifest order (a few hundred MB)."""
        return [(self.directory / f.name).read_bytes() for f in self.files]

    def summary(self) -> dict[str, Any]:
        sizes = sorted(f.size_bytes for f in self.files)
        n = len(sizes)
        return {
            "files": n,
            "photographs": len({f.photo for f in self.files}),
            "size_bytes": {
                "min": sizes[0],
                "median": sizes[n // 2],
                "mean": round(sum(sizes) / n),
                "max": sizes[-1],
            },
            "share_1_to_3_mb": round(sum(MEGABYTE <= s <= 3 * MEGABYTE for s in sizes) / n, 3),
            "with_exif": sum(f.exif != "none" for f in self.files),
            "with_grain": sum(f.grain_sigma > 0 for f in self.files),
            "long_side_px": [
                min(max(f.width, f.height) for f in self.files),
                max(max(f.width, f.height) for f in self.files),
            ],
            "quality": [min(f.quality for f in self.files), max(f.quality for f in self.files)],
            "recipe_version": RECIPE_VERSION,
        }


def ensure_corpus(
    directory: Path = DEFAULT_DIR, files: int = 300, photos_dir: Path | None = None
) -> Corpus:
    """The cached corpus in ``directory``, built first when missing or of another recipe.

    ``photos_dir`` (optional) holds the photographs already unpacked (file names as in
    ``PHOTOS``); otherwise they are fetched with ``apt-get download``.
    """
    manifest = directory / "manifest.json"
    if manifest.is_file():
        data = json.loads(manifest.read_text())
        if data.get("recipe_version") == RECIPE_VERSION and data.get("requested") == files:
            return Corpus(directory, tuple(CorpusFile(**f) for f in data["files"]))
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("*.jpg"):
        old.unlink()
    source_dir = photos_dir or _fetch_photos(directory / "photos")
    built = build(source_dir, directory, files)
    manifest.write_text(
        json.dumps(
            {
                "recipe_version": RECIPE_VERSION,
                "requested": files,
                "files": [dataclasses.asdict(f) for f in built],
            },
            indent=1,
        )
    )
    return Corpus(directory, tuple(built))


def _fetch_photos(target: Path) -> Path:
    """Download the packages of ``PHOTOS`` and unpack only those files into ``target``."""
    if all((target / Path(p.path).name).is_file() for p in PHOTOS):
        return target
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        raise CorpusError(
            "apt-get and dpkg-deb are needed to fetch the photographs (Debian packages "
            f"{sorted({p.package for p in PHOTOS})}); or pass --photos DIR"
        )
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-debs-") as tmp:
        packages = sorted({p.package for p in PHOTOS})
        result = subprocess.run(
            ["apt-get", "download", *packages], cwd=tmp, capture_output=True, text=True
        )
        if result.returncode != 0:
            raise CorpusError(
                f"apt-get download {' '.join(packages)} failed (run apt-get update first?):\n"
                + result.stderr[-2000:]
            )
        for package in packages:
            (deb,) = Path(tmp).glob(f"{package}_*.deb")
            wanted = {p.path for p in PHOTOS if p.package == package}
            _extract(deb, wanted, target)
    missing = [p.path for p in PHOTOS if not (target / Path(p.path).name).is_file()]
    if missing:
        raise CorpusError(f"not found in the packages: {missing}")
    return target


def _extract(deb: Path, members: Iterable[str], target: Path) -> None:
    wanted = set(members)
    with subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE) as p:
        assert p.stdout is not None
        with tarfile.open(fileobj=p.stdout, mode="r|") as tar:
            for member in tar:
                if member.name in wanted and member.isfile():
                    data = tar.extractfile(member)
                    assert data is not None
                    (target / Path(member.name).name).write_bytes(data.read())


def build(source_dir: Path, directory: Path, files: int) -> list[CorpusFile]:
    """Write ``files`` JPEGs into ``directory`` from the photographs in ``source_dir``."""
    rng = random.Random(f"bench-corpus-{RECIPE_VERSION}")
    built: list[CorpusFile] = []
    base, extra = divmod(files, len(PHOTOS))
    number = 0
    for index, photo in enumerate(PHOTOS):
        variants = base + (1 if index < extra else 0)
        if not variants:
            continue
        with Image.open(source_dir / Path(photo.path).name) as original:
            camera_exif = original.info.get("exif") if 0x010F in original.getexif() else None
            original.draft("RGB", (4096, 4096))  # the big ones decode at 1/2 scale
            rgb = original.convert("RGB")
        for _ in range(variants):
            # Two of three files are "large" (1-3 MB), one "mixed".
            kind = "mixed" if number % 3 == 2 else "large"
            with_exif = rng.random() < 0.5
            exif_kind = "none"
            exif: bytes | None = None
            if with_exif:
                exif_kind = "camera" if camera_exif else "synthetic"
                exif = camera_exif or _synthetic_exif(rng, photo, gps=rng.random() < 0.5)
            name = f"{number:04d}-{photo.name}-{kind}.jpg"
            built.append(_variant(rgb, rng, kind, directory / name, photo, exif, exif_kind))
            number += 1
    return built


def _variant(
    rgb: Image.Image,
    rng: random.Random,
    kind: str,
    path: Path,
    photo: Photo,
    exif: bytes | None,
    exif_kind: str,
) -> CorpusFile:
    low, high = (1800, 2048) if kind == "large" else (1024, 2048)
    long_side = rng.randint(low, high)
    quality = rng.randint(92, 95) if kind == "large" else rng.randint(75, 95)
    subsampling = rng.choice((0, 2))  # 4:4:4 or 4:2:0
    crop = _crop(rgb, rng, long_side)
    crop.thumbnail((long_side, long_side), Image.Resampling.LANCZOS)
    sigma = 0.0
    body = _jpeg(crop, quality, subsampling, exif)
    if kind == "large":
        if len(body) < MEGABYTE and subsampling:
            subsampling = 0
            body = _jpeg(crop, quality, subsampling, exif)
        for candidate in GRAIN_SIGMAS:
            if len(body) >= MEGABYTE:
                break
            sigma = candidate
            body = _jpeg(_grain(crop, sigma, rng), quality, subsampling, exif)
        while len(body) > 3 * MEGABYTE and quality > 75:
            quality -= 3
            body = _jpeg(_grain(crop, sigma, rng) if sigma else crop, quality, subsampling, exif)
    path.write_bytes(body)
    return CorpusFile(
        name=path.name,
        photo=photo.name,
        kind=kind,
        width=crop.width,
        height=crop.height,
        quality=quality,
        subsampling="4:4:4" if subsampling == 0 else "4:2:0",
        grain_sigma=sigma,
        exif=exif_kind,
        size_bytes=len(body),
    )


def _crop(rgb: Image.Image, rng: random.Random, long_side: int) -> Image.Image:
    """A window of 60-100 % of the photograph (at least ``long_side`` on its long side
    where the photograph allows), at a random place."""
    width, height = rgb.size
    smallest = min(1.0, long_side / max(width, height))
    scale = rng.uniform(max(0.6, smallest), 1.0)
    cw, ch = max(1, round(width * scale)), max(1, round(height * scale))
    left, top = rng.randint(0, width - cw), rng.randint(0, height - ch)
    return rgb.crop((left, top, left + cw, top + ch))


def _grain(im: Image.Image, sigma: float, rng: random.Random) -> Image.Image:
    # Luminance-like grain: one gaussian field (centred on 128) added to every band.
    noise = Image.effect_noise(im.size, sigma)
    # effect_noise uses its own generator; offset the field so variants differ anyway.
    shift = rng.randint(0, 7)
    noise = ImageChops.offset(noise, shift, shift)
    return ImageChops.add(im, Image.merge("RGB", (noise, noise, noise)), 1.0, -128)


def _jpeg(im: Image.Image, quality: int, subsampling: int, exif: bytes | None) -> bytes:
    out = io.BytesIO()
    params: dict[str, Any] = {"quality": quality, "subsampling": subsampling}
    if exif:
        params["exif"] = exif
    im.save(out, "JPEG", **params)
    return out.getvalue()


_CAMERAS: Final = (
    ("Canon", "Canon EOS 5D Mark III"),
    ("NIKON CORPORATION", "NIKON D750"),
    ("SONY", "ILCE-7M3"),
    ("FUJIFILM", "X-T3"),
    ("Apple", "iPhone 12"),
)


def _synthetic_exif(rng: random.Random, photo: Photo, *, gps: bool) -> bytes:
    from PIL.TiffImagePlugin import IFDRational

    exif = Image.Exif()
    make, model = rng.choice(_CAMERAS)
    exif[0x010F] = make
    exif[0x0110] = model
    exif[0x010E] = f"{photo.name} (benchmark corpus)"
    exif[0x013B] = photo.author
    exif[0x8298] = f"{photo.author}, {photo.licence}"
    exif[0x0131] = "bench/corpus.py"
    exif[0x0132] = f"2019:0{rng.randint(1, 9)}:1{rng.randint(0, 9)} 1{rng.randint(0, 9)}:30:00"
    exif[0x0112] = 1
    sub = exif.get_ifd(0x8769)
    sub[0x829A] = IFDRational(1, rng.choice((60, 125, 250, 500, 1000)))
    sub[0x829D] = IFDRational(rng.choice((18, 28, 40, 56, 80)), 10)
    sub[0x8827] = rng.choice((100, 200, 400, 800, 1600))
    sub[0x920A] = IFDRational(rng.choice((24, 35, 50, 85, 135)), 1)
    sub[0x9003] = exif[0x0132]
    if gps:
        gps_ifd = exif.get_ifd(0x8825)
        gps_ifd[1] = "N"
        gps_ifd[2] = (IFDRational(rng.randint(0, 60), 1), IFDRational(rng.randint(0, 59), 1),
                      IFDRational(0, 1))  # fmt: skip
        gps_ifd[3] = "E"
        gps_ifd[4] = (IFDRational(rng.randint(0, 30), 1), IFDRational(rng.randint(0, 59), 1),
                      IFDRational(0, 1))  # fmt: skip
    return exif.tobytes()
