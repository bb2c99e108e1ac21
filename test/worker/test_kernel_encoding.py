"""The kernel's encodings (issue 52): img2dataset's resize modes, formats and filters."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from image_crawler.config import ConfigError
from image_crawler.contract import Encoding
from worker.images.kernel import (
    ImageFailure,
    ImageLimits,
    Plan,
    ProcessedImage,
    plan_of,
    process_image,
)
from worker.settings import WorkerSettings


@pytest.mark.parametrize(
    ("size", "encoding", "plan"),
    [
        # border: the larger side to 256, then centred on a white square.
        ((1000, 600), Encoding(), Plan((256, 154), (256, 256), (0, 51))),
        # keep_ratio_largest: the same without the square; 153.6 -> 154.
        ((1000, 600), Encoding(resize_mode="keep_ratio_largest"), Plan((256, 154), (256, 154))),
        # keep_ratio: the smaller side to 256; 426.67 -> 427.
        ((600, 1000), Encoding(resize_mode="keep_ratio"), Plan((256, 427), (256, 427))),
        # center_crop: keep_ratio, then the square from (427 - 256) // 2.
        ((1000, 600), Encoding(resize_mode="center_crop"), Plan((427, 256), (256, 256), (-85, 0))),
        ((600, 1000), Encoding(resize_mode="center_crop"), Plan((256, 427), (256, 256), (0, -85))),
        # Rounding half to even, as albumentations' round(): 602 / 4 = 150.5 -> 150.
        ((1024, 602), Encoding(resize_mode="keep_ratio_largest"), Plan((256, 150), (256, 150))),
        ((1024, 602), Encoding(), Plan((256, 150), (256, 256), (0, 53))),
        # Enlarged unless resize_only_if_bigger, which leaves it as it is, crop included.
        ((100, 50), Encoding(resize_mode="keep_ratio_largest"), Plan((256, 128), (256, 128))),
        (
            (200, 100),
            Encoding(resize_mode="center_crop", resize_only_if_bigger=True),
            Plan((200, 100), (200, 100)),
        ),
        ((200, 100), Encoding(resize_only_if_bigger=True), Plan((200, 100), (200, 100))),
        ((300, 100), Encoding(resize_mode="no"), Plan((300, 100), (300, 100))),
        # Never below a pixel.
        ((5000, 1), Encoding(resize_mode="keep_ratio_largest"), Plan((256, 1), (256, 1))),
    ],
)
def test_a_plan_is_what_img2dataset_makes(size, encoding, plan) -> None:
    assert plan_of(*size, encoding) == plan


def _body(im: Image.Image, fmt: str) -> bytes:
    out = io.BytesIO()
    im.save(out, fmt, quality=95) if fmt == "JPEG" else im.save(out, fmt)
    return out.getvalue()


def _thirds(size: tuple[int, int] = (300, 100), mode: str = "RGB") -> Image.Image:
    """Red, green and blue thirds, left to right (grey levels for mode L)."""
    im = Image.new(mode, size)
    colours = [(255, 0, 0), (0, 255, 0), (0, 0, 255)] if mode == "RGB" else [40, 128, 220]
    third = size[0] // 3
    for i, colour in enumerate(colours):
        im.paste(colour, (i * third, 0, (i + 1) * third, size[1]))
    return im


def _made(body: bytes, encoding: Encoding | None) -> tuple[ProcessedImage, Image.Image]:
    result = process_image(body, encoding=encoding)
    assert isinstance(result, ProcessedImage), result
    im = Image.open(io.BytesIO(result.thumbnail))
    im.load()
    assert im.size == result.thumbnail_size
    return result, im


def _close(
    pixel: tuple[int, ...] | int, expected: tuple[int, ...] | int, tolerance: int = 24
) -> bool:
    pixel = pixel if isinstance(pixel, tuple) else (pixel,)
    expected = expected if isinstance(expected, tuple) else (expected,)
    return all(abs(a - b) <= tolerance for a, b in zip(pixel, expected, strict=True))


# JPEG bodies take libjpeg-turbo's road, PNG ones Pillow's; grey JPEGs a road of their own.
BODIES = {
    "jpeg": _body(_thirds(), "JPEG"),
    "png": _body(_thirds(), "PNG"),
    "grey jpeg": _body(_thirds(mode="L"), "JPEG"),
}


@pytest.mark.parametrize("road", BODIES)
@pytest.mark.parametrize(
    ("fmt", "pillow_format"), [("jpg", "JPEG"), ("png", "PNG"), ("webp", "WEBP")]
)
def test_a_center_crop_keeps_the_middle_in_the_asked_format(road, fmt, pillow_format) -> None:
    quality = 6 if fmt == "png" else 90
    encoding = Encoding(
        image_size=64, resize_mode="center_crop", encode_format=fmt, encode_quality=quality
    )
    _, im = _made(BODIES[road], encoding)
    assert (im.format, im.size) == (pillow_format, (64, 64))
    middle = 128 if road == "grey jpeg" else (0, 255, 0)
    rgb = im.convert("L" if road == "grey jpeg" else "RGB")
    for xy in [(2, 2), (32, 32), (61, 61)]:
        assert _close(rgb.getpixel(xy), middle), (xy, rgb.getpixel(xy))


@pytest.mark.parametrize("road", BODIES)
def test_a_border_pads_with_white_around_the_whole_image(road) -> None:
    _, im = _made(BODIES[road], Encoding(image_size=90))
    assert im.size == (90, 90)
    grey = road == "grey jpeg"
    rgb = im.convert("L" if grey else "RGB")
    white = 255 if grey else (255, 255, 255)
    # 300 x 100 -> 90 x 30, from row 30 to row 59.
    assert _close(rgb.getpixel((45, 5)), white) and _close(rgb.getpixel((45, 85)), white)
    assert _close(rgb.getpixel((5, 45)), 40 if grey else (255, 0, 0))
    assert _close(rgb.getpixel((85, 45)), 220 if grey else (0, 0, 255))


@pytest.mark.parametrize("road", BODIES)
def test_an_image_is_enlarged_unless_only_if_bigger(road) -> None:
    _, im = _made(BODIES[road], Encoding(image_size=600, resize_mode="keep_ratio_largest"))
    assert im.size == (600, 200)
    only = Encoding(image_size=600, resize_mode="keep_ratio_largest", resize_only_if_bigger=True)
    assert _made(BODIES[road], only)[1].size == (300, 100)


def test_the_hash_is_of_the_whole_image_not_of_its_crop() -> None:
    body = BODIES["jpeg"]
    cropped, _ = _made(body, Encoding(resize_mode="center_crop"))
    whole, _ = _made(body, Encoding(resize_mode="keep_ratio"))
    assert cropped.phash == whole.phash


def test_without_an_encoding_it_is_the_original_thumbnail() -> None:
    body = _body(_thirds((1300, 100)), "JPEG")
    result, im = _made(body, None)
    assert (im.format, im.size, result.thumbnail_size) == ("JPEG", (640, 49), (640, 49))


@pytest.mark.parametrize(
    ("encoding", "status", "detail"),
    [
        (
            Encoding(min_image_size=101),
            "ImageTooSmall",
            "300x100: the smaller side is under 101 px",
        ),
        (Encoding(max_image_area=29_999), "ImageAreaTooLarge", "300x100 is over 29999 pixels"),
        (Encoding(max_aspect_ratio=2.5), "AspectRatioTooLarge", "an aspect ratio of 3, over 2.5"),
    ],
)
def test_the_filters_refuse_before_anything_is_decoded(encoding, status, detail) -> None:
    result = process_image(BODIES["png"], encoding=encoding)
    assert isinstance(result, ImageFailure)
    assert result.status == status and detail in result.detail


def test_the_filters_let_through_what_is_at_their_limit() -> None:
    at_limits = Encoding(min_image_size=100, max_image_area=30_000, max_aspect_ratio=3)
    assert isinstance(process_image(BODIES["png"], encoding=at_limits), ProcessedImage)


def test_an_enlargement_past_the_pixel_limit_is_refused() -> None:
    body = _body(Image.new("RGB", (2000, 2), "red"), "PNG")
    result = process_image(
        body, ImageLimits(max_pixels=100_000), Encoding(resize_mode="center_crop")
    )
    assert isinstance(result, ImageFailure)
    assert result.status == "DecompressionBombError"
    assert "resized to 256000x256" in result.detail


# --- The worker's own encoding (its environment) ------------------------------------------


def test_without_encoding_variables_a_worker_makes_the_thumbnail() -> None:
    assert WorkerSettings.from_env({}).encoding is None


def test_the_encoding_variables_give_img2dataset_s_defaults_for_the_rest() -> None:
    env = {"IMAGE_SIZE": "384", "RESIZE_MODE": "Center_Crop", "RESIZE_ONLY_IF_BIGGER": "yes"}
    assert WorkerSettings.from_env(env).encoding == Encoding(
        image_size=384, resize_mode="center_crop", resize_only_if_bigger=True
    )
    env = {"ENCODE_FORMAT": "png", "ENCODE_QUALITY": "9", "MAX_ASPECT_RATIO": "3.5"}
    assert WorkerSettings.from_env(env).encoding == Encoding(
        encode_format="png", encode_quality=9, max_aspect_ratio=3.5
    )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"ENCODE_FORMAT": "png"}, "ENCODE_FORMAT: encode_quality of png must be an integer 0-9"),
        ({"IMAGE_SIZE": "big"}, "IMAGE_SIZE must be an integer"),
        ({"IMAGE_SIZE": "0"}, "IMAGE_SIZE: image_size must be an integer 1-16384"),
        ({"RESIZE_ONLY_IF_BIGGER": "maybe"}, "RESIZE_ONLY_IF_BIGGER must be true or false"),
        ({"MAX_ASPECT_RATIO": "0.5"}, "MAX_ASPECT_RATIO must be at least 1.0"),
    ],
)
def test_a_bad_encoding_variable_is_a_clear_error_at_start(env, message) -> None:
    with pytest.raises(ConfigError, match=message):
        WorkerSettings.from_env(env)
