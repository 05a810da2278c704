"""Image input: every format and mode, orientation, polarity, MNIST normalization, and every kind of bad input."""

from __future__ import annotations

import gzip
import io
import struct
import warnings
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw

from service import imaging
from service.imaging import (
    SUPPORTED_FORMATS,
    ImageDecodeError,
    ImageLimits,
    array_from_pixels,
    array_to_png,
    decode_image,
    preprocess,
)

LIMITS = ImageLimits()
MNIST = (28, 28)  # the output size of a model whose card says [-1, 1, 28, 28]
EXPECTED = "PNG, JPEG, GIF, BMP or WebP expected"


def encode(img: Image.Image, fmt: str, **params: object) -> bytes:
    buffer = io.BytesIO()
    img.save(buffer, format=fmt, **params)
    return buffer.getvalue()


def seven(size: tuple[int, int] = (120, 160), ink: int = 255, paper: int = 0, width: int = 14) -> Image.Image:
    """A "7" drawn with thick strokes, mode L."""
    img = Image.new("L", size, paper)
    w, h = size
    draw = ImageDraw.Draw(img)
    draw.line([(0.2 * w, 0.2 * h), (0.8 * w, 0.2 * h), (0.4 * w, 0.85 * h)], fill=ink, width=width, joint="curve")
    return img


def reference() -> np.ndarray:
    """A 32×32 dark-on-white picture: white paper, a black bar and a black corner block."""
    picture = np.full((32, 32), 255, np.uint8)
    picture[4:28, 14:19] = 0
    picture[0:6, 0:6] = 0
    return picture


def centre_of_mass(array: np.ndarray) -> tuple[float, float]:
    rows, cols = np.indices(array.shape)
    total = array.sum()
    return float((rows * array).sum() / total), float((cols * array).sum() / total)


def ink_box(array: np.ndarray, threshold: float = 0.5) -> tuple[int, int, int, int]:
    """(top, bottom, left, right), inclusive, of the pixels above threshold."""
    rows, cols = np.nonzero(array > threshold)
    return int(rows.min()), int(rows.max()), int(cols.min()), int(cols.max())


def header_only_png(width: int, height: int) -> bytes:
    """A PNG whose IHDR declares width×height 8-bit gray but whose IDAT holds a few bytes: decoding would fail."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(bytes(64))) + chunk(b"IEND", b"")


def decode_error(data: bytes, limits: ImageLimits = LIMITS) -> ImageDecodeError:
    with pytest.raises(ImageDecodeError) as caught:
        decode_image(data, limits)
    return caught.value


# --- formats and modes ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fmt", "params", "tolerance"),
    [("PNG", {}, 0), ("JPEG", {"quality": 95}, 8), ("GIF", {}, 0), ("BMP", {}, 0), ("WEBP", {"lossless": True}, 0)],
)
def test_every_supported_format_decodes_to_grayscale(fmt: str, params: dict[str, object], tolerance: float) -> None:
    data = encode(Image.fromarray(reference()), fmt, **params)
    assert Image.open(io.BytesIO(data)).format == fmt
    img = decode_image(data, LIMITS)
    assert img.mode == "L" and img.size == (32, 32)
    assert np.abs(np.asarray(img, np.float64) - reference()).mean() <= tolerance


def test_supported_formats_are_png_jpeg_gif_bmp_and_webp() -> None:
    assert SUPPORTED_FORMATS == ("PNG", "JPEG", "GIF", "BMP", "WEBP")


def test_animated_gif_gives_its_first_frame() -> None:
    first, second = np.zeros((20, 20), np.uint8), np.zeros((20, 20), np.uint8)
    first[5:15, 2:8] = 255
    second[5:15, 12:18] = 255
    frames = [Image.fromarray(first), Image.fromarray(second)]
    data = encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    assert getattr(Image.open(io.BytesIO(data)), "n_frames", 1) == 2
    np.testing.assert_array_equal(np.asarray(decode_image(data, LIMITS)), first)


def _colour(picture: np.ndarray, paper: tuple[int, ...], ink: tuple[int, ...], mode: str) -> Image.Image:
    pixels = np.where(picture[..., None] > 127, np.array(paper, np.uint8), np.array(ink, np.uint8))
    return Image.fromarray(pixels.astype(np.uint8), mode)


# Each builder draws reference() in one Pillow mode; (format, mode Pillow opens it as, mean abs tolerance).
MODE_CASES: dict[str, tuple[Callable[[np.ndarray], Image.Image], str, str, float]] = {
    "1": (lambda p: Image.fromarray(p).convert("1"), "PNG", "1", 0),
    "1-bmp": (lambda p: Image.fromarray(p).convert("1"), "BMP", "1", 0),
    "L": (Image.fromarray, "PNG", "L", 0),
    "LA-opaque": (lambda p: Image.fromarray(p).convert("LA"), "PNG", "LA", 0),
    "RGB": (lambda p: _colour(p, (255, 255, 255), (0, 0, 0), "RGB"), "PNG", "RGB", 0),
    "RGBA-opaque": (lambda p: _colour(p, (255, 255, 255, 255), (0, 0, 0, 255), "RGBA"), "PNG", "RGBA", 0),
    "P": (lambda p: _colour(p, (255, 255, 255), (0, 0, 0), "RGB").convert("P"), "PNG", "P", 0),
    "I;16": (lambda p: Image.fromarray(p.astype(np.uint16) * 257), "PNG", "I;16", 0),
    "CMYK": (lambda p: _colour(p, (0, 0, 0, 0), (0, 0, 0, 255), "CMYK"), "JPEG", "CMYK", 8),
}


@pytest.mark.parametrize("case", list(MODE_CASES))
def test_every_mode_becomes_the_same_grayscale_picture(case: str) -> None:
    build, fmt, opened_mode, tolerance = MODE_CASES[case]
    data = encode(build(reference()), fmt)
    assert Image.open(io.BytesIO(data)).mode == opened_mode
    img = decode_image(data, LIMITS)
    assert img.mode == "L"
    assert np.abs(np.asarray(img, np.float64) - reference()).mean() <= tolerance


def test_colour_is_reduced_to_luma() -> None:
    data = encode(_colour(reference(), (250, 240, 230), (20, 30, 200), "RGB"), "PNG")
    pixels = np.asarray(decode_image(data, LIMITS))
    assert pixels[20, 16] == round(0.299 * 20 + 0.587 * 30 + 0.114 * 200)
    assert pixels[20, 30] == round(0.299 * 250 + 0.587 * 240 + 0.114 * 230)


@pytest.mark.parametrize("mode", ["LA", "RGBA"])
def test_dark_strokes_on_a_transparent_canvas_become_dark_on_white(mode: str) -> None:
    strokes = reference() == 0
    rgba = np.zeros((32, 32, 4), np.uint8)  # transparent black everywhere ...
    rgba[strokes] = (10, 10, 10, 255)  # ... but the opaque dark strokes
    data = encode(Image.fromarray(rgba, "RGBA").convert(mode), "PNG")
    pixels = np.asarray(decode_image(data, LIMITS))
    assert (pixels[strokes] == 10).all() and (pixels[~strokes] == 255).all()


def test_light_strokes_on_a_transparent_canvas_become_light_on_black() -> None:
    strokes = reference() == 0
    rgba = np.zeros((32, 32, 4), np.uint8)
    rgba[strokes] = (250, 250, 250, 255)
    pixels = np.asarray(decode_image(encode(Image.fromarray(rgba, "RGBA"), "PNG"), LIMITS))
    assert (pixels[strokes] == 250).all() and (pixels[~strokes] == 0).all()


def test_half_transparent_ink_is_blended_onto_the_paper() -> None:
    rgba = np.zeros((8, 8, 4), np.uint8)
    rgba[2:6, 2:6] = (0, 0, 0, 128)
    pixels = np.asarray(decode_image(encode(Image.fromarray(rgba, "RGBA"), "PNG"), LIMITS))
    assert pixels[3, 3] == 127 and pixels[0, 0] == 255


def test_palette_transparency_is_composited() -> None:
    palette_image = Image.fromarray(np.where(reference() == 0, 1, 0).astype(np.uint8), "P")
    palette_image.putpalette([0, 0, 0, 30, 30, 30] + [0, 0, 0] * 254)  # index 0 (paper): black but transparent
    data = encode(palette_image, "GIF", transparency=0)
    opened = Image.open(io.BytesIO(data))
    assert opened.mode == "P" and opened.info["transparency"] == 0
    pixels = np.asarray(decode_image(data, LIMITS))
    assert (pixels[reference() == 0] == 30).all() and (pixels[reference() == 255] == 255).all()


@pytest.mark.parametrize(
    ("mode", "values", "expected"),
    [
        ("I", np.array([[0, 65535], [32896, 257]]), [[0, 255], [128, 1]]),  # 16-bit range
        ("I", np.array([[0, 255], [128, 1]]), [[0, 255], [128, 1]]),  # nothing above 255: 8-bit range
        ("F", np.array([[0.0, 1.0], [0.5, 0.25]]), [[0, 255], [128, 64]]),  # [0, 1]
        ("F", np.array([[0.0, 255.0], [128.0, np.nan]]), [[0, 255], [128, 0]]),  # [0, 255]; NaN as 0
        ("I;16", np.array([[0, 65535], [32896, 257]]), [[0, 255], [128, 1]]),
    ],
)
def test_numeric_modes_are_scaled_to_8_bit(mode: str, values: np.ndarray, expected: list[list[int]]) -> None:
    dtype = {"I": np.int32, "F": np.float32, "I;16": np.uint16}[mode]
    canvas = np.zeros((28, 28), dtype)
    canvas[[0, 0, -1, -1], [0, -1, 0, -1]] = values.ravel()
    img = Image.fromarray(canvas)
    assert img.mode == mode
    result = preprocess(img, MNIST, invert=False, normalize=False)  # 28×28 stays in place: read the corners back
    corners = result.array[[0, 0, -1, -1], [0, -1, 0, -1]] * 255
    np.testing.assert_allclose(corners, np.array(expected).ravel(), atol=1e-3)


# --- orientation --------------------------------------------------------------------------------------------------


def test_exif_orientation_is_honoured() -> None:
    stored = np.zeros((40, 60), np.uint8)  # 60 wide, 40 high: a "1" lying on its side, and a mark in a corner
    stored[17:23, 5:55] = 255
    stored[0:8, 0:8] = 255
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90° clockwise to display
    data = encode(Image.fromarray(stored), "JPEG", quality=95, exif=exif.tobytes())
    img = decode_image(data, LIMITS)
    assert img.size == (40, 60)
    upright = np.rot90(stored, k=-1)
    assert np.abs(np.asarray(img, np.float64) - upright).mean() < 3
    assert np.asarray(img)[2, 36] > 200 and np.asarray(img)[2, 2] < 50  # the mark went to the top-right corner
    top, bottom, left, right = ink_box(preprocess(img, MNIST).array)
    assert bottom - top == 19 and right - left < 10  # the "1" stands upright


# --- polarity -----------------------------------------------------------------------------------------------------


def photo_of(img: Image.Image, paper: int = 200, ink: int = 60, noise: float = 8.0, seed: int = 0) -> Image.Image:
    """The white-on-black img as dark ink on light, noisy paper."""
    strokes = np.asarray(img, np.float64) / 255
    pixels = paper + (ink - paper) * strokes + np.random.default_rng(seed).normal(0, noise, strokes.shape)
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def test_dark_digit_on_light_paper_is_inverted_automatically() -> None:
    clean = preprocess(seven(), MNIST)
    photo = preprocess(photo_of(seven()), MNIST)
    assert photo.inverted and not clean.inverted
    assert np.abs(photo.array - clean.array).mean() < 0.03
    assert photo.array[0].max() == 0 and photo.array.max() == pytest.approx(1.0)


def test_faint_low_contrast_photo_is_stretched_to_full_range() -> None:
    result = preprocess(photo_of(seven(), paper=140, ink=100, noise=2.0), MNIST)
    assert result.inverted
    assert result.array.max() == pytest.approx(1.0)
    assert ink_box(result.array)[1] - ink_box(result.array)[0] >= 17


def test_mnist_like_image_is_not_inverted() -> None:
    mnist_like = preprocess(seven((28, 28), width=3), MNIST, normalize=False)
    assert not mnist_like.inverted


def test_digit_touching_the_border_does_not_flip_the_decision() -> None:
    img = Image.new("L", (40, 40), 0)
    ImageDraw.Draw(img).rectangle([18, 0, 22, 39], fill=255)  # a "1" from the top edge to the bottom edge
    assert not preprocess(img, MNIST).inverted
    assert preprocess(Image.eval(img, lambda v: 255 - v), MNIST).inverted


def test_inversion_can_be_forced_both_ways() -> None:
    mnist_like = seven((28, 28), width=3)
    pixels = np.asarray(mnist_like, np.float32) / 255
    forced_on = preprocess(mnist_like, MNIST, invert=True, normalize=False)
    assert forced_on.inverted
    np.testing.assert_allclose(forced_on.array, 1 - pixels, atol=1e-6)
    dark_on_light = photo_of(mnist_like, noise=0)
    forced_off = preprocess(dark_on_light, MNIST, invert=False, normalize=False)
    assert not forced_off.inverted
    np.testing.assert_allclose(forced_off.array, np.asarray(dark_on_light, np.float32) / 255, atol=1e-6)


# --- MNIST normalization ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("box", "expected_size"),
    [
        ((40, 60, 140, 110), (10, 20)),  # 100 wide × 50 high: 20 wide × 10 high
        ((120, 30, 150, 120), (20, 7)),  # 30 wide × 90 high: 7 wide × 20 high
        ((10, 10, 16, 14), (13, 20)),  # a tiny 6 wide × 4 high blob is scaled up
    ],
)
def test_bounding_box_is_fitted_into_20x20_keeping_aspect(
    box: tuple[int, int, int, int], expected_size: tuple[int, int]
) -> None:
    img = Image.new("L", (200, 160), 0)
    ImageDraw.Draw(img).rectangle([box[0], box[1], box[2] - 1, box[3] - 1], fill=255)
    result = preprocess(img, MNIST)
    assert result.normalized and result.array.shape == (28, 28) and result.array.dtype == np.float32
    top, bottom, left, right = ink_box(result.array)
    assert (bottom - top + 1, right - left + 1) == expected_size
    com_row, com_col = centre_of_mass(result.array)
    assert abs(com_row - 14) <= 0.5 + 1e-3 and abs(com_col - 14) <= 0.5 + 1e-3


@pytest.mark.parametrize(
    ("size", "box"),
    [((28, 28), (20, 20)), ((36, 36), (26, 26)), ((56, 56), (40, 40)), ((36, 28), (26, 20))],
)
def test_other_input_sizes_scale_mnist_box_and_centre(size: tuple[int, int], box: tuple[int, int]) -> None:
    img = Image.new("L", (200, 160), 0)
    ImageDraw.Draw(img).rectangle([40, 30, 139, 129], fill=255)  # a 100×100 square: fills the whole box
    result = preprocess(img, size)
    assert result.array.shape == size
    top, bottom, left, right = ink_box(result.array)
    side = min(box)  # a square keeps its aspect ratio: the box's shorter side limits it
    assert (bottom - top + 1, right - left + 1) == (side, side)
    com_row, com_col = centre_of_mass(result.array)
    assert abs(com_row - size[0] / 2) <= 0.5 + 1e-3 and abs(com_col - size[1] / 2) <= 0.5 + 1e-3


@pytest.mark.parametrize("normalize", [True, False])
def test_output_has_the_requested_size_without_ink(normalize: bool) -> None:
    assert preprocess(Image.new("L", (50, 40), 0), (36, 36), normalize=normalize).array.shape == (36, 36)


def test_without_normalize_an_image_of_the_requested_size_is_untouched() -> None:
    pixels = np.random.default_rng(0).integers(0, 255, (36, 36)).astype(np.uint8)
    result = preprocess(Image.fromarray(pixels), (36, 36), invert=False, normalize=False)
    np.testing.assert_allclose(result.array * 255, pixels, atol=1e-3)


def test_off_centre_digit_is_moved_to_centre_of_mass() -> None:
    img = Image.new("L", (300, 300), 0)
    img.paste(seven((60, 80), width=9), (230, 10))
    com_row, com_col = centre_of_mass(preprocess(img, MNIST).array)
    assert abs(com_row - 14) <= 0.5 and abs(com_col - 14) <= 0.5


def test_lopsided_digit_is_shifted_only_as_far_as_the_canvas_allows() -> None:
    img = Image.new("L", (100, 100), 0)
    draw = ImageDraw.Draw(img)
    draw.rectangle([0, 40, 29, 69], fill=255)  # heavy block on the left ...
    draw.rectangle([30, 54, 99, 55], fill=255)  # ... and a thin tail to the right
    _top, _bottom, left, right = ink_box(preprocess(img, MNIST).array, threshold=0.1)
    assert (left, right) == (8, 27)  # centring the mass would push the tail off the canvas


def test_faint_specks_do_not_widen_the_bounding_box() -> None:
    img = seven((120, 160)).copy()
    img.putpixel((2, 2), 40)
    img.putpixel((117, 157), 40)
    np.testing.assert_allclose(preprocess(img, MNIST).array, preprocess(seven((120, 160)), MNIST).array, atol=1e-6)


def test_large_photo_is_normalized() -> None:
    big = Image.new("L", (3000, 2000), 0)
    big.paste(seven((600, 800), width=70), (1200, 600))
    result = preprocess(photo_of(big), MNIST)
    assert result.inverted
    assert np.abs(result.array - preprocess(big, MNIST).array).mean() < 0.03


def test_without_normalize_a_28x28_image_is_untouched() -> None:
    pixels = np.random.default_rng(0).integers(0, 40, (28, 28)).astype(np.uint8)
    pixels[5:20, 12:15] = 255
    result = preprocess(Image.fromarray(pixels), MNIST, normalize=False)
    assert not result.normalized and not result.inverted
    np.testing.assert_array_equal(result.array, pixels.astype(np.float32) / 255)


def test_without_normalize_other_sizes_are_resized_to_28x28() -> None:
    mnist_like = seven((28, 28), width=3)
    result = preprocess(mnist_like.resize((84, 84), Image.Resampling.NEAREST), MNIST, normalize=False)
    assert result.array.shape == (28, 28) and not result.normalized
    np.testing.assert_allclose(result.array, np.asarray(mnist_like, np.float32) / 255, atol=1e-6)
    enlarged = preprocess(mnist_like.resize((14, 14), Image.Resampling.BOX), MNIST, normalize=False)
    assert enlarged.array.shape == (28, 28) and np.abs(enlarged.array - result.array).mean() < 0.1


@pytest.mark.parametrize("value", [0, 128, 255])
@pytest.mark.parametrize("size", [(1, 1), (28, 28), (64, 48)])
@pytest.mark.parametrize("normalize", [True, False])
def test_blank_image_gives_zeros(value: int, size: tuple[int, int], normalize: bool) -> None:
    result = preprocess(Image.new("L", size, value), MNIST, normalize=normalize)
    assert result.array.shape == (28, 28) and np.isfinite(result.array).all()
    if normalize or value != 128:  # without normalization uniform mid-gray stays mid-gray
        assert not result.array.any()


def test_faint_noise_alone_is_blank() -> None:
    noise = np.random.default_rng(0).normal(200, 3, (50, 50))
    result = preprocess(Image.fromarray(np.clip(noise, 0, 255).astype(np.uint8)), MNIST)
    assert not result.array.any()


# --- bad input ----------------------------------------------------------------------------------------------------


def test_zero_bytes() -> None:
    error = decode_error(b"")
    assert (error.status, str(error)) == (400, "image is empty (0 bytes)")


@pytest.mark.parametrize(
    "data",
    [
        np.random.default_rng(0).bytes(4096),
        b"hello, this is not an image",
        b'{"image": [[0, 1], [1, 0]]}',
        b"\x00",
    ],
)
def test_not_an_image(data: bytes) -> None:
    error = decode_error(data)
    assert (error.status, str(error)) == (400, f"not a recognised image ({EXPECTED})")


@pytest.mark.parametrize(("fmt", "params"), [("PNG", {}), ("JPEG", {"quality": 90})])
def test_truncated_image(fmt: str, params: dict[str, object]) -> None:
    noise = np.random.default_rng(0).integers(0, 256, (64, 64), dtype=np.uint8)
    data = encode(Image.fromarray(noise), fmt, **params)
    error = decode_error(data[: len(data) // 2])
    assert error.status == 400
    assert str(error).startswith("image is truncated or corrupt: ")


@pytest.mark.parametrize(("fmt", "cut"), [("PNG", 20), ("JPEG", 10), ("GIF", 8), ("BMP", 10), ("WEBP", 14)])
def test_truncated_header(fmt: str, cut: int) -> None:
    data = encode(Image.fromarray(reference()), fmt)
    error = decode_error(data[:cut])
    assert (error.status, str(error)) == (400, f"image is truncated or corrupt: its {fmt} header could not be read")


def test_corrupt_pixel_data() -> None:
    data = bytearray(encode(Image.fromarray(reference()), "PNG"))
    idat = data.index(b"IDAT")
    data[idat + 4 : idat + 12] = b"\xff" * 8  # the zlib stream, not the header
    error = decode_error(bytes(data))
    assert error.status == 400 and str(error).startswith("image is truncated or corrupt: ")


@pytest.mark.parametrize(("fmt", "name"), [("TIFF", "TIFF"), ("ICO", "ICO"), ("PPM", "PPM"), ("JPEG2000", "JPEG2000")])
def test_format_pillow_reads_but_we_do_not(fmt: str, name: str) -> None:
    try:
        data = encode(Image.fromarray(reference()).convert("RGB"), fmt)
    except OSError as e:
        pytest.skip(f"this Pillow cannot write {fmt}: {e}")
    error = decode_error(data)
    assert (error.status, str(error)) == (415, f"unsupported image format {name} ({EXPECTED})")


def test_too_many_bytes() -> None:
    data = encode(Image.fromarray(reference()), "PNG")
    error = decode_error(data, ImageLimits(max_bytes=len(data) - 1))
    assert (error.status, str(error)) == (413, f"image is {len(data)} bytes, more than the limit of {len(data) - 1}")
    assert decode_image(data, ImageLimits(max_bytes=len(data))).size == (32, 32)


@pytest.mark.parametrize(("width", "height"), [(10_000, 5_000), (10_000, 10_000), (30_000, 30_000)])
def test_decompression_bomb_is_refused_from_its_header(width: int, height: int) -> None:
    # 50 M: over our limit; 100 M: also in Pillow's warning zone; 900 M: Pillow's own error. Decoding the few
    # IDAT bytes would fail with 400, so a 413 shows the refusal came before any pixel was decoded.
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Pillow's DecompressionBombWarning must not escape either
        error = decode_error(header_only_png(width, height))
    assert (error.status, str(error)) == (413, f"image has {width * height} pixels, more than the limit of 40000000")


def test_compressed_bomb_under_a_small_limit() -> None:
    data = encode(Image.new("L", (3000, 3000), 0), "PNG")  # 9 M pixels in a few kB
    assert len(data) < 20_000
    error = decode_error(data, ImageLimits(max_pixels=1_000_000))
    assert (error.status, str(error)) == (413, "image has 9000000 pixels, more than the limit of 1000000")


def test_image_at_the_pixel_limit_is_accepted() -> None:
    data = encode(Image.new("L", (100, 50), 0), "PNG")
    assert decode_image(data, ImageLimits(max_pixels=5000)).size == (100, 50)
    assert decode_error(data, ImageLimits(max_pixels=4999)).status == 413


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_pixels"):
        ImageLimits(max_pixels=0)
    with pytest.raises(ValueError, match="max_bytes"):
        ImageLimits(max_bytes=0)


def test_decode_error_is_a_value_error_with_a_status() -> None:
    error = ImageDecodeError(415, "nope")
    assert isinstance(error, ValueError) and error.status == 415 and str(error) == "nope"


# --- raw pixels and PNG output ------------------------------------------------------------------------------------


def test_pixels_in_unit_range_are_kept() -> None:
    values = np.random.default_rng(0).random((28, 28))
    array = array_from_pixels(values.tolist(), MNIST)
    assert array.dtype == np.float32 and array.shape == (28, 28)
    np.testing.assert_allclose(array, values, rtol=1e-6)


def test_pixels_above_one_are_read_as_0_to_255() -> None:
    values = np.random.default_rng(0).integers(0, 256, (28, 28))
    values[0, 0] = 255
    np.testing.assert_allclose(array_from_pixels(values.tolist(), MNIST), values / 255, rtol=1e-6)
    np.testing.assert_allclose(array_from_pixels(values.astype(np.uint8), MNIST), values / 255, rtol=1e-6)


def _grid(value: object) -> list[list[object]]:
    rows: list[list[object]] = [[0.0] * 28 for _ in range(28)]
    rows[3][4] = value
    return rows


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ([[0.0] * 28] * 27, "pixels must be a 28×28 array, got shape [27, 28]"),
        ([0.0] * 784, "pixels must be a 28×28 array, got shape [784]"),
        ([[[0.0] * 28] * 28], "pixels must be a 28×28 array, got shape [1, 28, 28]"),
        ([[0.0] * 28] * 27 + [[0.0] * 27], "pixels must be a 28×28 array: rows have different lengths"),
        (3.0, "pixels must be a 28×28 array, got shape []"),
        (_grid("a"), "pixels must be numbers, got strings"),
        (_grid(None), "pixels must be numbers, got non-numeric values"),
        ([[True] * 28] * 28, "pixels must be numbers, got booleans"),
        (_grid(float("nan")), "pixels must be finite numbers, got NaN or infinity"),
        (_grid(float("inf")), "pixels must be finite numbers, got NaN or infinity"),
        (_grid(-0.5), "pixels must lie in [0, 1] or [0, 255], got values from -0.5 to 0"),
        (_grid(256), "pixels must lie in [0, 1] or [0, 255], got values from 0 to 256"),
    ],
)
def test_bad_pixels(values: object, message: str) -> None:
    with pytest.raises(ImageDecodeError) as caught:
        array_from_pixels(values, MNIST)
    assert (caught.value.status, str(caught.value)) == (400, message)


def test_pixels_are_checked_against_the_requested_size() -> None:
    assert array_from_pixels(np.zeros((36, 36)), (36, 36)).shape == (36, 36)
    with pytest.raises(ImageDecodeError) as caught:
        array_from_pixels(np.zeros((28, 28)), (36, 36))
    assert (caught.value.status, str(caught.value)) == (400, "pixels must be a 36×36 array, got shape [28, 28]")


def test_array_to_png_round_trip() -> None:
    levels = np.random.default_rng(0).integers(0, 256, (28, 40))
    data = array_to_png(levels / 255)
    assert data.startswith(b"\x89PNG")
    img = Image.open(io.BytesIO(data))
    assert (img.format, img.mode, img.size) == ("PNG", "L", (40, 28))
    np.testing.assert_array_equal(np.asarray(img), levels)


def test_array_to_png_clips_and_zeroes_nan() -> None:
    img = Image.open(io.BytesIO(array_to_png(np.array([[-0.5, 1.5, np.nan, 0.5]]))))
    np.testing.assert_array_equal(np.asarray(img), [[0, 255, 0, 128]])


def test_array_to_png_wants_2d() -> None:
    with pytest.raises(ValueError, match="2-D"):
        array_to_png(np.zeros((1, 28, 28)))


# --- real MNIST ---------------------------------------------------------------------------------------------------


def mnist_test_images(root: Path, count: int) -> np.ndarray:
    path = root / "t10k-images-idx3-ubyte"
    if path.exists():
        data = path.read_bytes()
    else:
        with gzip.open(path.with_suffix(".gz")) as f:
            data = f.read()
    return np.frombuffer(data, np.uint8, count=count * 784, offset=16).reshape(count, 28, 28)


@pytest.mark.mnist
def test_real_mnist_digits_survive_png_decode_and_normalization(real_mnist: Path) -> None:
    # MNIST digits are already fitted into 20×20 and centred by mass, so normalizing again changes little: at most
    # a one-pixel shift where the centre of mass falls halfway between two pixels.
    differences = []
    for digit in mnist_test_images(real_mnist, 300).astype(np.float32) / 255:
        result = preprocess(decode_image(array_to_png(digit), LIMITS), MNIST)
        assert not result.inverted
        differences.append(np.abs(result.array - digit).mean())
        shifted = min(
            np.abs(np.roll(result.array, (dy, dx), axis=(0, 1)) - digit).mean()
            for dy in (-1, 0, 1)
            for dx in (-1, 0, 1)
        )
        assert shifted < 0.01
        com_row, com_col = centre_of_mass(result.array)
        assert abs(com_row - 14) <= 0.55 and abs(com_col - 14) <= 0.55
        dark_on_light = preprocess(decode_image(array_to_png(1 - digit), LIMITS), MNIST)
        assert dark_on_light.inverted
        np.testing.assert_allclose(dark_on_light.array, result.array, atol=1e-6)
    assert float(np.mean(differences)) < 0.01


@pytest.mark.parametrize("size", [1, 2, 3, 4, 111, 112])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_fast_median_equals_numpys(size: int, dtype: type[np.floating]) -> None:
    rng = np.random.default_rng(size)
    for values in (rng.random(size), rng.integers(0, 4, size) / 3.0, np.full(size, 0.1)):
        values = values.astype(dtype)
        assert imaging._median(values) == float(np.median(values))


def test_a_digit_that_already_fits_its_box_is_not_resampled() -> None:
    """MNIST's own digits fill the 20-pixel box: the crop is used as is, exactly what Pillow's resize to the same
    size gives (a copy)."""
    from service.imaging import _fit_box

    crop = np.random.default_rng(0).random((20, 13), dtype=np.float32)
    image = Image.frombuffer("F", (13, 20), crop.tobytes(), "raw", "F", 0, 1)
    pillow = np.frombuffer(image.resize((13, 20), Image.Resampling.LANCZOS).tobytes(), np.float32).reshape(20, 13)
    assert _fit_box(crop, (20, 20)) is crop and np.array_equal(crop, pillow)
    assert _fit_box(crop, (10, 10)).shape == (10, 6)  # one that does not fit is still scaled


def png_variants() -> list[bytes]:
    """PNGs of every kind the plugin reads (modes, palettes with transparency, interlacing, 16 bits, EXIF
    orientation, text chunks), and truncated or damaged ones."""
    rng = np.random.default_rng(4)
    gray = rng.integers(0, 256, (9, 13), dtype=np.uint8)
    images = [Image.fromarray(gray), Image.fromarray(gray).convert("1"), Image.fromarray(gray).convert("P")]
    images += [Image.fromarray(np.dstack([gray, gray[::-1], gray, gray]), "RGBA")]
    images += [Image.fromarray(np.dstack([gray] * 3), "RGB"), Image.fromarray(gray.astype(np.uint16) * 257)]
    images += [Image.fromarray(np.dstack([gray, gray[::-1]]), "LA")]
    datas = [encode(im, "PNG") for im in images]
    palette = Image.fromarray(gray).convert("P")
    palette.info["transparency"] = 3
    datas.append(encode(palette, "PNG"))
    buffer = io.BytesIO()
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(gray).save(buffer, "PNG", exif=exif, interlace=1)
    datas.append(buffer.getvalue())
    damaged = [d[:n] for d in datas[:2] for n in (8, 16, 33, 40, len(d) - 12, len(d) - 1)]
    damaged += [datas[0][:20] + b"\x00" * 8 + datas[0][28:], datas[0][:12] + b"IHDX" + datas[0][16:]]
    return datas + damaged


def test_a_png_opened_directly_is_the_png_image_open_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    """PNGs skip Image.open's probing (imaging._open_png); the images and every error stay those of Image.open."""

    def outcome(data: bytes) -> tuple[object, ...]:
        try:
            img = decode_image(data, ImageLimits())
        except ImageDecodeError as e:
            return ("error", e.status, str(e))
        return ("image", img.mode, img.size, img.tobytes())

    variants = png_variants()
    direct = [outcome(d) for d in variants]
    monkeypatch.setattr(imaging, "_open_png", lambda data: None)
    assert direct == [outcome(d) for d in variants]
    assert sum(o[0] == "image" for o in direct) >= 9 and sum(o[0] == "error" for o in direct) >= 8
