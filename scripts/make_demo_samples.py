"""Rebuild ``crawlctl/samples/``, the sample images that ``image-crawler demo`` serves.

Run from the repository root with scikit-image installed (the ``test`` extra):
``python scripts/make_demo_samples.py``. The photographs come from scikit-image's data
folder (read as files; licences in ``crawlctl/samples/README.md``); each is cropped
and/or scaled to a long side of 400-800 px and re-encoded as JPEG (quality 75-90, some
with EXIF naming the photographer and licence), plus two PNGs. ``broken.jpg`` is not an
image at all: the demo shows it failing.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "crawlctl" / "samples"

# skimage file -> (credit, licence) as scikit-image's data documentation gives them.
CREDITS = {
    "astronaut.png": ("NASA (Eileen Collins)", "public domain"),
    "chelsea.png": ("Stefan van der Walt", "CC0 1.0"),
    "coffee.png": ("Rachel Michetti", "CC0 1.0"),
    "camera.png": ("Lav Varshney", "CC0 1.0"),
    "rocket.jpg": ("SpaceX", "public domain"),
    "hubble_deep_field.jpg": ("NASA", "public domain"),
    "retina.jpg": ("Mikael Haggstrom", "CC0 1.0"),
    "brick.png": ("CC0Textures", "CC0 1.0"),
    "grass.png": ("linolafett", "CC0 1.0"),
    "gravel.png": ("CC0Textures", "CC0 1.0"),
}

# (output name, skimage file, crop box as fractions (left, top, right, bottom), long side,
#  JPEG quality or None for PNG, with EXIF)
SAMPLES = [
    ("astronaut.jpg", "astronaut.png", (0, 0, 1, 1), 512, 85, True),
    ("astronaut-face.jpg", "astronaut.png", (0.3, 0.05, 0.75, 0.55), 460, 80, False),
    ("astronaut-flag.jpg", "astronaut.png", (0.0, 0.0, 0.45, 0.6), 400, 75, True),
    ("chelsea.jpg", "chelsea.png", (0, 0, 1, 1), 451, 90, True),
    ("chelsea-eyes.jpg", "chelsea.png", (0.2, 0.15, 0.7, 0.6), 420, 80, False),
    ("chelsea-whiskers.png", "chelsea.png", (0.45, 0.45, 0.95, 0.95), 224, None, False),
    ("coffee.jpg", "coffee.png", (0, 0, 1, 1), 600, 85, True),
    ("coffee-cup.jpg", "coffee.png", (0.15, 0.05, 0.75, 0.9), 480, 75, False),
    ("coffee-spoon.jpg", "coffee.png", (0.55, 0.35, 1.0, 1.0), 400, 90, False),
    ("camera.jpg", "camera.png", (0, 0, 1, 1), 512, 85, True),
    ("camera-tripod.jpg", "camera.png", (0.1, 0.3, 0.7, 1.0), 420, 80, False),
    ("rocket.jpg", "rocket.png", (0, 0, 1, 1), 640, 80, True),
    ("rocket-launch.jpg", "rocket.png", (0.3, 0.0, 0.7, 1.0), 427, 75, False),
    ("hubble.jpg", "hubble_deep_field.jpg", (0, 0, 1, 1), 800, 80, True),
    ("hubble-corner.jpg", "hubble_deep_field.jpg", (0.0, 0.0, 0.5, 0.5), 500, 85, False),
    ("hubble-galaxies.png", "hubble_deep_field.jpg", (0.6, 0.6, 0.85, 0.85), 250, None, False),
    ("retina.jpg", "retina.jpg", (0, 0, 1, 1), 700, 80, True),
    ("retina-disc.jpg", "retina.jpg", (0.45, 0.3, 0.85, 0.7), 450, 85, False),
    ("brick.jpg", "brick.png", (0, 0, 1, 1), 512, 80, False),
    ("grass.jpg", "grass.png", (0, 0, 1, 1), 512, 75, True),
    ("gravel.jpg", "gravel.png", (0, 0, 1, 1), 512, 80, False),
    ("gravel-wide.jpg", "gravel.png", (0.0, 0.25, 1.0, 0.65), 600, 90, False),
]

BROKEN = b"This file is named broken.jpg but holds no image: the demo shows it failing.\n"


def data_dir() -> Path:
    spec = importlib.util.find_spec("skimage")
    if spec is None or spec.origin is None:
        raise SystemExit("scikit-image is not installed: pip install -e '.[test]'")
    return Path(spec.origin).parent / "data"


def main() -> None:
    src = data_dir()
    OUT.mkdir(parents=True, exist_ok=True)
    for old in OUT.glob("*"):
        if old.suffix in (".jpg", ".png"):
            old.unlink()
    for name, file, (left, top, right, bottom), long_side, quality, with_exif in SAMPLES:
        file = "rocket.jpg" if file == "rocket.png" else file
        with Image.open(src / file) as original:
            im = original.convert("RGB") if original.mode not in ("L", "RGB") else original.copy()
        w, h = im.size
        im = im.crop((round(left * w), round(top * h), round(right * w), round(bottom * h)))
        scale = long_side / max(im.size)
        if scale < 1:
            im = im.resize(
                (max(1, round(im.width * scale)), max(1, round(im.height * scale))),
                Image.Resampling.LANCZOS,
            )
        target = OUT / name
        if quality is None:
            im.save(target, "PNG", optimize=True)
            continue
        params: dict[str, object] = {"quality": quality, "optimize": True}
        if with_exif:
            credit, licence = CREDITS[file]
            exif = Image.Exif()
            exif[0x010E] = f"{name}: demo sample derived from scikit-image's {file}"
            exif[0x013B] = credit
            exif[0x8298] = licence
            exif[0x0131] = "image-crawler demo samples"
            params["exif"] = exif.tobytes()
        im.save(target, "JPEG", **params)
    (OUT / "broken.jpg").write_bytes(BROKEN)
    total = sum(p.stat().st_size for p in OUT.iterdir() if p.suffix in (".jpg", ".png"))
    print(f"{len(SAMPLES) + 1} files, {total / 1024:.0f} KiB in {OUT}")


if __name__ == "__main__":
    main()
