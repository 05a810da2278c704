"""Image input: decode untrusted uploads safely and turn them into MNIST-style arrays of the model's input size."""

from __future__ import annotations

import io
import logging
import math
import re
import warnings
from dataclasses import dataclass

import numpy as np
from PIL import ExifTags, Image, ImageChops, ImageOps, ImageStat, PngImagePlugin

logger = logging.getLogger(__name__)

SUPPORTED_FORMATS = ("PNG", "JPEG", "GIF", "BMP", "WEBP")
_EXPECTED = "PNG, JPEG, GIF, BMP or WebP expected"
# Leading bytes of each supported format: data that starts like one but that Pillow cannot open is corrupt.
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_SIGNATURES = {
    PNG_SIGNATURE: "PNG",
    b"\xff\xd8\xff": "JPEG",
    b"GIF87a": "GIF",
    b"GIF89a": "GIF",
    b"BM": "BMP",
}

# MNIST fits the digit's bounding box into 20×20 of its 28×28 canvas and puts the centre of mass at the canvas
# centre (14, 14) in index coordinates (the MNIST test set averages 13.99, 14.01); other sizes keep these proportions.
BOX_FRACTION = (20, 28)
WORK_SIDE = 1024  # larger images are box-reduced to about this before normalization
MIN_CONTRAST = 0.1  # ink must stand this far above the background (in [0, 1]) or the image is blank
NOISE_FLOOR = 0.1  # after stretching, anything fainter than this is background
BBOX_THRESHOLD = 0.25  # pixels brighter than this (relative to the peak) decide the bounding box
TURNED = range(2, 9)  # the EXIF orientations that `ImageOps.exif_transpose` turns (1 is upright)
# Each 8-bit level as float32 in [0, 1] (`level / 255` in float32), and pixel indices for centres of mass: looked up
# and sliced rather than computed per image (each numpy call a lone request makes runs from cold caches).
UNIT_LEVELS = np.arange(256, dtype=np.float32) / np.float32(255.0)
INDICES = np.arange(2 * WORK_SIDE + 1)
UNIT_LEVELS.flags.writeable = INDICES.flags.writeable = False


@dataclass(frozen=True)
class ImageLimits:
    """Limits applied before any pixel is decoded.

    Pillow's own guard (``Image.MAX_IMAGE_PIXELS``; a hard error above twice that, about 179 M pixels) still
    applies on top of ``max_pixels``; its warning zone is left to ``max_pixels``.
    """

    max_pixels: int = 40_000_000
    max_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.max_pixels <= 0:
            raise ValueError(f"max_pixels must be positive, got {self.max_pixels}")
        if self.max_bytes is not None and self.max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive or None, got {self.max_bytes}")


class ImageDecodeError(ValueError):
    """Bad image input; ``status`` is the HTTP status it deserves (400, 413 or 415) and str() names the problem.

    ``limit`` names the ``ImageLimits`` field a 413 went over (``"max_bytes"`` or ``"max_pixels"``), else None.
    """

    def __init__(self, status: int, message: str, limit: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.limit = limit


@dataclass
class PreprocessResult:
    """A model-ready image: ``array`` is float32 (H, W) in [0, 1], white digit on black (the MNIST convention)."""

    array: np.ndarray
    inverted: bool
    normalized: bool


def decode_image(data: bytes, limits: ImageLimits) -> Image.Image:
    """Decode an uploaded PNG, JPEG, GIF (first frame), BMP or WebP into an upright grayscale ("L") image.

    The byte and pixel limits are checked before any pixel is decoded (the pixel count comes from the header).
    Transparent pixels are composited onto white, or onto black when the visible content is light, so that a
    drawing on a transparent canvas keeps its strokes visible.

    Raises:
        ImageDecodeError: 400 for empty, unrecognised, truncated or corrupt data; 413 for too many bytes or
            pixels; 415 for an image format Pillow knows but this service does not accept.
    """
    return load_image(open_image(data, limits))


def open_image(data: bytes, limits: ImageLimits) -> Image.Image:
    """The image with only its header read (cheap: no pixel is decoded), its byte and pixel limits checked.

    Raises:
        ImageDecodeError: as ``decode_image``, for everything the header tells.
    """
    if not data:
        raise ImageDecodeError(400, "image is empty (0 bytes)")
    if limits.max_bytes is not None and len(data) > limits.max_bytes:
        raise ImageDecodeError(
            413, f"image is {len(data)} bytes, more than the limit of {limits.max_bytes}", "max_bytes"
        )
    img = _open_png(data) or _open_header(data, SUPPORTED_FORMATS, limits)
    if img is None:
        raise _unreadable(data, limits)
    width, height = img.size
    if width * height > limits.max_pixels:
        raise ImageDecodeError(413, _too_many_pixels(width * height, limits.max_pixels), "max_pixels")
    return img


def load_image(img: Image.Image) -> Image.Image:
    """Decode the pixels of an image from ``open_image``: upright and grayscale, as ``decode_image`` says.

    Raises:
        ImageDecodeError: 400 for truncated or corrupt data.
    """
    try:
        img.load()  # the first frame of an animation; truncated data fails here
    except Exception as e:  # any decoder failure on untrusted bytes is the client's problem, not a 500
        raise ImageDecodeError(400, f"image is truncated or corrupt: {e}") from e
    return _to_grayscale(_upright(img))


def _open_png(data: bytes) -> Image.Image | None:
    """A PNG opened by Pillow's PNG plugin itself, as ``Image.open`` opens it but without its format probing, warning
    filters and size check (a lone request pays each from cold caches); None for anything else: not a PNG, a header
    the plugin refuses, or a size in Pillow's own warning zone. ``Image.open`` then opens it, with all its checks."""
    if not data.startswith(PNG_SIGNATURE):
        return None
    try:
        img = PngImagePlugin.PngImageFile(io.BytesIO(data))
    except Exception:  # the full path gives the error its message
        return None
    width, height = img.size
    return img if Image.MAX_IMAGE_PIXELS is None or width * height <= Image.MAX_IMAGE_PIXELS else None


def _open_header(data: bytes, formats: tuple[str, ...] | None, limits: ImageLimits) -> Image.Image | None:
    """Image.open (reads the header only), or None when none of ``formats`` recognises the data."""
    with warnings.catch_warnings():
        # Pillow warns above MAX_IMAGE_PIXELS; ``limits.max_pixels`` is the limit that decides, checked by the caller.
        # Filters are process-wide before Python 3.14: concurrent decodes may at worst leave this one filter behind.
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            return Image.open(io.BytesIO(data), formats=formats)
        except Image.DecompressionBombError as e:
            raise ImageDecodeError(413, _pillow_bomb_message(e, limits), "max_pixels") from e
        except Exception:  # UnidentifiedImageError, or a plugin choking on a malformed header
            return None


def _unreadable(data: bytes, limits: ImageLimits) -> ImageDecodeError:
    """The error for data that no supported format could open: corrupt, unsupported (415) or not an image."""
    for signature, name in _SIGNATURES.items():
        if data.startswith(signature):
            return ImageDecodeError(400, f"image is truncated or corrupt: its {name} header could not be read")
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return ImageDecodeError(400, "image is truncated or corrupt: its WEBP header could not be read")
    Image.init()
    # Only formats with a signature check: the others (TGA, ...) would claim any bytes at all.
    known = tuple(name for name, (_, accept) in Image.OPEN.items() if accept is not None)
    other = _open_header(data, known, limits)
    if other is not None:
        return ImageDecodeError(415, f"unsupported image format {other.format} ({_EXPECTED})")
    return ImageDecodeError(400, f"not a recognised image ({_EXPECTED})")


def _too_many_pixels(pixels: int, limit: int) -> str:
    return f"image has {pixels} pixels, more than the limit of {limit}"


def _pillow_bomb_message(error: Image.DecompressionBombError, limits: ImageLimits) -> str:
    limit = min(limits.max_pixels, 2 * (Image.MAX_IMAGE_PIXELS or limits.max_pixels))
    found = re.search(r"\((\d+) pixels\)", str(error))
    if found is None:
        return f"image has more than {limit} pixels"
    return _too_many_pixels(int(found.group(1)), limit)


def _upright(img: Image.Image) -> Image.Image:
    """The image turned as its EXIF Orientation tag says (the image itself when upright: nothing here changes it in
    place, so no copy); a broken EXIF block is ignored rather than fatal."""
    try:
        if img.getexif().get(ExifTags.Base.Orientation, 1) not in TURNED:
            return img
        return ImageOps.exif_transpose(img)
    except Exception as e:
        logger.warning("ignoring unreadable EXIF orientation: %s", e)
        return img


def _to_grayscale(img: Image.Image) -> Image.Image:
    """Any Pillow mode as "L" (8-bit luma)."""
    if img.mode == "L" and "transparency" not in img.info:
        return img
    if img.mode in ("I;16", "I;16L", "I;16B", "I;16N", "I", "F"):
        return _numeric_to_grayscale(img)
    if img.mode in ("LA", "La", "PA", "RGBA", "RGBa") or "transparency" in img.info:
        return _flatten_alpha(img)
    if img.mode in ("1", "P", "RGB"):
        return img.convert("L")
    return img.convert("RGB").convert("L")  # CMYK, YCbCr, LAB, HSV


def _numeric_to_grayscale(img: Image.Image) -> Image.Image:
    """16-bit (I;16*) images span 0–65535; "I" too unless all values are ≤ 255; "F" spans [0, 1] or [0, 255]."""
    values = np.nan_to_num(np.asarray(img, dtype=np.float32))
    peak = float(values.max(initial=0.0))
    if img.mode == "F":
        full_scale = 1.0 if peak <= 1.0 else 255.0
    elif img.mode == "I":
        full_scale = 255.0 if peak <= 255.0 else 65535.0
    else:
        full_scale = 65535.0
    return _grayscale_from_unit(values / full_scale)


def _flatten_alpha(img: Image.Image) -> Image.Image:
    """Composite onto white (dark strokes on a transparent canvas stay dark-on-white), or onto black when the
    visible (alpha-weighted) content is light, so white strokes on a transparent canvas stay visible too."""
    luma, alpha = img.convert("RGBA").convert("LA").split()  # in Pillow, uint8: cheap even at the pixel limit
    weight = ImageStat.Stat(alpha).sum[0]
    weighted_luma = ImageStat.Stat(ImageChops.multiply(luma, alpha)).sum[0]  # sum of luma × alpha / 255
    content_is_light = weight > 0 and weighted_luma / weight > 0.5
    flat = Image.new("L", img.size, 0 if content_is_light else 255)
    flat.paste(luma, mask=alpha)  # luma × alpha + background × (1 − alpha)
    return flat


def _grayscale_from_unit(values: np.ndarray) -> Image.Image:
    return Image.fromarray(np.round(np.clip(values, 0.0, 1.0) * 255.0).astype(np.uint8))


def preprocess(
    img: Image.Image, size: tuple[int, int], invert: bool | None = None, normalize: bool = True
) -> PreprocessResult:
    """Turn an image (any mode, any size) into the model's input: white digit on black, ``size``, in [0, 1].

    Args:
        img: the picture, e.g. from ``decode_image``.
        size: the output's (height, width): the model card's input shape without batch and channel.
        invert: True or False forces the polarity; None detects it. The background is what touches the border:
            the image is inverted when the median of its outermost ring of pixels is brighter than the midpoint
            between its darkest and brightest pixel (for a uniform image: brighter than mid-gray). Photos and
            drawings of dark digits on light paper are inverted; MNIST-like images are not.
        normalize: True applies MNIST's normalization (see ``_normalize``); False only resizes to ``size`` (an
            image that already has that size is left untouched), for images that are already MNIST-like.
    """
    height, width = size
    if height < 1 or width < 1:
        raise ValueError(f"size must be positive, got {size}")
    gray = _to_grayscale(img)
    if normalize and max(gray.size) > WORK_SIDE:
        gray = gray.reduce(math.ceil(max(gray.size) / WORK_SIDE))
    elif not normalize and gray.size != (width, height):
        gray = _resize(gray, (width, height))
    pixels = _unit_pixels(gray)
    levels = _Levels.of(pixels)
    inverted = levels.dark_on_light if invert is None else invert
    if inverted:
        pixels = 1.0 - pixels
        levels = _Levels.of(pixels)
    array = _normalize(pixels, (height, width), levels) if normalize else pixels
    return PreprocessResult(array=array.astype(np.float32, copy=False), inverted=bool(inverted), normalized=normalize)


def _unit_pixels(gray: Image.Image) -> np.ndarray:
    """An "L" image as float32 (H, W) in [0, 1] (``np.asarray(gray, np.float32) / 255``, without Pillow's array
    interface on the way)."""
    width, height = gray.size
    return UNIT_LEVELS[np.frombuffer(gray.tobytes(), dtype=np.uint8).reshape(height, width)]


@dataclass(frozen=True)
class _Levels:
    """An image's background level (the median of its outermost ring of pixels), darkest and brightest pixel."""

    background: float
    low: float
    high: float

    @classmethod
    def of(cls, pixels: np.ndarray) -> _Levels:
        return cls(_median(_border(pixels)), float(pixels.min()), float(pixels.max()))

    @property
    def dark_on_light(self) -> bool:
        """The background is brighter than the midpoint between darkest and brightest (uniform: than mid-gray)."""
        if self.high > self.low:
            return self.background > (self.low + self.high) / 2
        return self.background > 0.5


def digit_box(size: tuple[int, int]) -> tuple[int, int]:
    """The (height, width) the digit's bounding box is fitted into: MNIST's 20 of 28, scaled to ``size``."""
    box, side = BOX_FRACTION
    return max(1, round(size[0] * box / side)), max(1, round(size[1] * box / side))


def _border(pixels: np.ndarray) -> np.ndarray:
    return np.concatenate([pixels[0], pixels[-1], pixels[:, 0], pixels[:, -1]])


def _median(values: np.ndarray) -> float:
    """``float(np.median(values))`` of a 1-D array without NaN, in a fifth of the time (one partition, no
    wrappers): the middle value, or the mean of the middle two computed in the array's dtype, as numpy does."""
    k = values.size // 2
    if values.size % 2:
        return float(np.partition(values, k)[k])
    low, high = np.partition(values, (k - 1, k))[k - 1 : k + 1]
    return float((low + high) / 2)


def _normalize(pixels: np.ndarray, size: tuple[int, int], levels: _Levels) -> np.ndarray:
    """MNIST's normalization of a white-on-black image (LeCun et al., the MNIST database), given its `levels`:

    1. stretch: the background level (median of the border) goes to 0 and the brightest pixel to 1; what is
       fainter than NOISE_FLOOR is cleared. No ink (less than MIN_CONTRAST above the background) gives zeros.
    2. crop to the bounding box of the pixels brighter than BBOX_THRESHOLD (faint specks do not widen it);
    3. scale (antialiased: area average to shrink, Lanczos to enlarge) to fit ``digit_box(size)`` (20×20 for
       28×28), keeping the aspect ratio;
    4. place on a ``size`` canvas so that the centre of mass lands on its centre ((14, 14) for 28×28),
       shifting by whole pixels and never pushing the box off the canvas.
    """
    background, peak = levels.background, levels.high
    if peak - background < MIN_CONTRAST:
        return np.zeros(size, dtype=np.float32)
    stretched = np.clip((pixels - background) / (peak - background), 0.0, 1.0)
    stretched[stretched < NOISE_FLOOR] = 0.0
    inked = stretched > BBOX_THRESHOLD
    rows, cols = np.flatnonzero(inked.any(axis=1)), np.flatnonzero(inked.any(axis=0))
    crop = stretched[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1]
    digit = _fit_box(crop, digit_box(size))
    peak_after = digit.max()
    if peak_after <= 0:  # a sliver that resampling erased
        return np.zeros(size, dtype=np.float32)
    return _centre_of_mass_placed(digit / peak_after, size)


def _fit_box(crop: np.ndarray, box: tuple[int, int]) -> np.ndarray:
    """Scale to the largest size that fits in ``box`` (height, width), keeping the aspect ratio."""
    height, width = crop.shape
    scale = min(box[0] / height, box[1] / width)
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    if size == (width, height):  # already fits (MNIST's own digits): Pillow would return a copy, values unchanged
        return crop
    image = Image.frombuffer("F", (width, height), np.ascontiguousarray(crop, dtype=np.float32), "raw", "F", 0, 1)
    resized = _resize(image, size)
    array = np.frombuffer(resized.tobytes(), dtype=np.float32).reshape(size[1], size[0])
    return np.clip(array, 0.0, 1.0)  # Lanczos rings slightly outside [0, 1]


def _resize(img: Image.Image, size: tuple[int, int]) -> Image.Image:
    """Shrink by area averaging (MNIST's antialiasing, no ringing); enlarge with Lanczos."""
    shrinking = size[0] * size[1] < img.size[0] * img.size[1]
    return img.resize(size, Image.Resampling.BOX if shrinking else Image.Resampling.LANCZOS)


def _centre_of_mass_placed(digit: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    height, width = digit.shape
    total = digit.sum()
    com_row = digit.sum(axis=1) @ index_range(height) / total
    com_col = digit.sum(axis=0) @ index_range(width) / total
    top = min(max(round(size[0] / 2 - com_row), 0), size[0] - height)
    left = min(max(round(size[1] / 2 - com_col), 0), size[1] - width)
    canvas = np.zeros(size, dtype=np.float32)
    canvas[top : top + height, left : left + width] = digit
    return canvas


def index_range(n: int) -> np.ndarray:
    """``np.arange(n)``: a slice of INDICES when it is long enough."""
    return INDICES[:n] if n <= len(INDICES) else np.arange(n)


def array_to_png(array: np.ndarray) -> bytes:
    """A float (H, W) array in [0, 1] (clipped; NaN as 0) as an 8-bit grayscale PNG."""
    if array.ndim != 2:
        raise ValueError(f"expected a 2-D (H, W) array, got shape {array.shape}")
    buffer = io.BytesIO()
    _grayscale_from_unit(np.nan_to_num(np.asarray(array, dtype=np.float64))).save(buffer, format="PNG")
    return buffer.getvalue()


def array_from_pixels(values: object, size: tuple[int, int]) -> np.ndarray:
    """Validate raw pixels (a nested list or an array) as a float32 array of ``size`` (height, width) in [0, 1].

    Values must be finite numbers in [0, 255]. If any value is above 1 the array is read on the 0–255 scale and
    divided by 255; otherwise it is already in [0, 1] (so a 0–255 image whose brightest pixel is 1 reads as
    [0, 1]). Orientation is taken as given: white digit on black.

    Raises:
        ImageDecodeError: 400, naming the problem (shape, non-numeric, NaN or infinite, out of range).
    """
    expected = f"pixels must be a {size[0]}×{size[1]} array"
    try:
        array = np.asarray(values)
    except ValueError as e:  # ragged nesting
        raise ImageDecodeError(400, f"{expected}: rows have different lengths") from e
    if array.shape != tuple(size):
        raise ImageDecodeError(400, f"{expected}, got shape {list(array.shape)}")
    if array.dtype.kind not in "iuf":
        raise ImageDecodeError(400, f"pixels must be numbers, got {_kind_name(array)}")
    array = array.astype(np.float64)
    if not np.isfinite(array).all():
        raise ImageDecodeError(400, "pixels must be finite numbers, got NaN or infinity")
    low, high = float(array.min()), float(array.max())
    if low < 0 or high > 255:
        raise ImageDecodeError(400, f"pixels must lie in [0, 1] or [0, 255], got values from {low:g} to {high:g}")
    if high > 1:
        array = array / 255.0
    return array.astype(np.float32)


def _kind_name(array: np.ndarray) -> str:
    if array.dtype.kind == "b":
        return "booleans"
    if array.dtype.kind in "US":
        return "strings"
    return "non-numeric values"
