"""Non-digit image sets for the "not a digit" score, generated here (no downloads), seeded.

Every image is drawn on its own canvas and then passed through the service's preprocessing
(`service.imaging.preprocess`: grayscale, polarity, stretch, crop, fit, centre of mass), exactly
as an upload would be, so the sets measure what users of the service get.
`NONDIGIT_SETS` (DejaVu fonts of `fonts-dejavu-core`) are the fitting outliers; `VALIDATION_SETS`
(Liberation fonts, another seed) choose the detector; `TEST_SETS` (FreeFont, Humor Sans, Comic Neue,
other generators) are reported once; `CONFIRMATION_SETS` (URW base 35 and six handwriting fonts) confirm
a served calibration later, on typefaces no fitting, choice or test saw (`capsnet-ood --confirm`). Letters that
are glyph twins of digits (O, I, l, S, Z, B, G, o, s, z, b, g, q; Greek theta, ...) are left out of the
Latin letters and of the test scripts; the fitting scripts (`OTHER_SCRIPTS_FIT`) hold a few (ι, ϑ, б, ч).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

from service.contract import preprocess

FONT_DIR = Path("/usr/share/fonts/truetype/dejavu")
FONT_FILES = ("DejaVuSans.ttf", "DejaVuSerif.ttf", "DejaVuSans-Bold.ttf")
FONT_PACKAGE = "fonts-dejavu-core"
VARIED_FONT_FILES = (  # and fonts-dejavu-extra: the other faces of the same family, for fitting only
    *FONT_FILES,
    "DejaVuSans-Oblique.ttf", "DejaVuSans-BoldOblique.ttf", "DejaVuSans-ExtraLight.ttf", "DejaVuSansCondensed.ttf",
    "DejaVuSansCondensed-Bold.ttf", "DejaVuSansMono.ttf", "DejaVuSansMono-Bold.ttf", "DejaVuSerif-Italic.ttf",
    "DejaVuSerif-Bold.ttf", "DejaVuSerifCondensed.ttf", "DejaVuSerifCondensed-BoldItalic.ttf",
)  # fmt: skip
VARIED_FONT_PACKAGE = "fonts-dejavu-extra"
LETTERS = "ACDEFHJKLMNPQRTUVWXYacdefhijkmnprtuvwxy"  # no glyph twins of digits
SYMBOLS = "+−×÷=%#@&*?<>~^"  # no bars, slashes or brackets: after cropping they are ones
# Greek and Cyrillic letters the test sets do not hold; unlike those, a few (ι, б, ч) look like a digit
OTHER_SCRIPTS_FIT = "ξζηικνρστυϑБГИЙКУЦЧЭбгийкучэ"
OTHER_SCRIPTS = "αβγλμπφχψωΓΔΛΞΠΣΦΨΩжфшщыюяЖФШЩЫЮЯдлпцשאמצם"  # Greek, Cyrillic, Hebrew; no digit twins
FONT_ROOT = Path("/usr/share/fonts")
VALIDATION_FONTS = (  # fonts-liberation
    "truetype/liberation/LiberationSans-Regular.ttf",
    "truetype/liberation/LiberationSerif-Regular.ttf",
    "truetype/liberation/LiberationMono-Regular.ttf",
    "truetype/liberation/LiberationSans-Bold.ttf",
)
TEST_FONTS = (  # fonts-freefont-ttf, fonts-humor-sans, fonts-comic-neue
    "truetype/freefont/FreeSans.ttf",
    "truetype/freefont/FreeSerif.ttf",
    "truetype/freefont/FreeMono.ttf",
    "truetype/freefont/FreeSansBold.ttf",
    "truetype/freefont/FreeSerifItalic.ttf",
    "truetype/humor-sans/Humor-Sans.ttf",
    "opentype/comic-neue/ComicNeue-Regular.otf",
    "opentype/comic-neue/ComicNeue-Bold.otf",
)
CONFIRMATION_FONTS = (  # fonts-urw-base35: typefaces no other role uses
    "opentype/urw-base35/NimbusSans-Regular.otf",
    "opentype/urw-base35/NimbusRoman-Regular.otf",
    "opentype/urw-base35/NimbusMonoPS-Regular.otf",
    "opentype/urw-base35/NimbusSans-Bold.otf",
    "opentype/urw-base35/URWGothic-Book.otf",
    "opentype/urw-base35/URWBookman-Light.otf",
    "opentype/urw-base35/C059-Roman.otf",
    "opentype/urw-base35/P052-Italic.otf",
)
HANDWRITING_FONTS = (  # fonts-breip, fonts-dkg-handwriting, fonts-femkeklaver, fonts-rufscript, fonts-tomsontalks
    "truetype/breip/Breip.ttf",
    "truetype/fifthhorseman/dkg.ttf",
    "truetype/femkeklaver/femkeklaver.ttf",
    "truetype/rufscript/Rufscript010.ttf",
    "truetype/tomsontalks/TomsonTalks.ttf",
    "opentype/urw-base35/Z003-MediumItalic.otf",
)
CONFIRMATION_PACKAGES = (
    "fonts-urw-base35 fonts-breip fonts-dkg-handwriting fonts-femkeklaver fonts-rufscript fonts-tomsontalks"
)
SCRIPT_FONTS = TEST_FONTS[:5]  # FreeFont has the Greek, Cyrillic and Hebrew letters
HELD_OUT_PACKAGES = "fonts-liberation fonts-freefont-ttf fonts-humor-sans fonts-comic-neue"
CANVAS = 112  # side of the drawing canvas for strokes and letters
FIELD = 64  # side of the blank, near-blank and texture canvases


class FontMissing(FileNotFoundError):
    """The DejaVu fonts are not installed."""


def font_paths() -> list[Path]:
    paths = [FONT_DIR / name for name in FONT_FILES]
    missing = [p for p in paths if not p.is_file()]
    if missing:
        raise FontMissing(f"letters need the DejaVu fonts ({FONT_PACKAGE}); missing {', '.join(map(str, missing))}")
    return paths


def held_out_fonts(names: tuple[str, ...]) -> list[Path]:
    paths = [FONT_ROOT / name for name in names]
    missing = [p for p in paths if not p.is_file()]
    if missing:
        packages = (
            CONFIRMATION_PACKAGES if set(names) <= {*CONFIRMATION_FONTS, *HANDWRITING_FONTS} else HELD_OUT_PACKAGES
        )
        raise FontMissing(f"held-out sets need Debian's {packages}; missing {', '.join(map(str, missing))}")
    return paths


def _glyph(rng: np.random.Generator, chars: str, paths: list[Path]) -> np.ndarray:
    """One character of `chars` in one of the fonts, 80 px on a 112 canvas, turned by up to 10 degrees."""
    char = chars[rng.integers(len(chars))]
    font = ImageFont.truetype(str(paths[rng.integers(len(paths))]), 80)
    canvas = Image.new("L", (CANVAS, CANVAS), 0)
    ImageDraw.Draw(canvas).text((CANVAS // 2, CANVAS // 2), char, fill=255, font=font, anchor="mm")
    return np.asarray(canvas.rotate(float(rng.uniform(-10, 10)), resample=Image.Resampling.BILINEAR)) / 255.0


def _uniform(rng: np.random.Generator) -> np.ndarray:
    return rng.uniform(0, 1, (28, 28))


def _gaussian(rng: np.random.Generator) -> np.ndarray:
    return np.clip(rng.normal(0.5, 0.2, (28, 28)), 0, 1)


def _blank(rng: np.random.Generator) -> np.ndarray:
    return np.full((FIELD, FIELD), rng.uniform(0, 1))


def _near_blank(rng: np.random.Generator) -> np.ndarray:
    """A blank page with one to three specks of 1-2 pixels."""
    field = np.zeros((FIELD, FIELD))
    for _ in range(rng.integers(1, 4)):
        r, c = rng.integers(0, FIELD, 2)
        field[r : r + rng.integers(1, 3), c : c + rng.integers(1, 3)] = rng.uniform(0.3, 1)
    return field


def _strokes(rng: np.random.Generator) -> np.ndarray:
    """Two to five random polylines, 6-11 pixels wide on a 112 canvas."""
    canvas = Image.new("L", (CANVAS, CANVAS), 0)
    draw = ImageDraw.Draw(canvas)
    for _ in range(rng.integers(2, 6)):
        points = [tuple(int(v) for v in rng.integers(0, CANVAS, 2)) for _ in range(rng.integers(2, 5))]
        draw.line(points, fill=255, width=int(rng.integers(6, 12)))
    return np.asarray(canvas) / 255.0


def _letter(rng: np.random.Generator) -> np.ndarray:
    paths = font_paths()
    char = LETTERS[rng.integers(len(LETTERS))]
    font = ImageFont.truetype(str(paths[rng.integers(len(paths))]), 80)
    canvas = Image.new("L", (CANVAS, CANVAS), 0)
    ImageDraw.Draw(canvas).text((CANVAS // 2, CANVAS // 2), char, fill=255, font=font, anchor="mm")
    return np.asarray(canvas) / 255.0


def _varied(rng: np.random.Generator, chars: str) -> np.ndarray:
    """A character in any of the DejaVu faces, then sheared by up to 0.3, turned by up to 15 degrees and
    thickened or thinned: the fitting letters vary as handwriting and other typefaces do."""
    paths = [FONT_DIR / name for name in VARIED_FONT_FILES]
    missing = [p for p in paths if not p.is_file()]
    if missing:
        raise FontMissing(f"varied letters need {FONT_PACKAGE} and {VARIED_FONT_PACKAGE}; missing {missing[0]}")
    char = chars[rng.integers(len(chars))]
    font = ImageFont.truetype(str(paths[rng.integers(len(paths))]), int(rng.integers(60, 90)))
    canvas = Image.new("L", (CANVAS, CANVAS), 0)
    ImageDraw.Draw(canvas).text((CANVAS // 2, CANVAS // 2), char, fill=255, font=font, anchor="mm")
    shear = float(rng.uniform(-0.3, 0.3))
    canvas = canvas.transform(canvas.size, Image.Transform.AFFINE, (1, shear, -shear * CANVAS / 2, 0, 1, 0),
                              resample=Image.Resampling.BILINEAR)  # fmt: skip
    canvas = canvas.rotate(float(rng.uniform(-15, 15)), resample=Image.Resampling.BILINEAR)
    size = int(rng.choice([0, 0, 3, 5, -3]))
    if size > 0:
        canvas = canvas.filter(ImageFilter.MaxFilter(size))
    elif size < 0:
        canvas = canvas.filter(ImageFilter.MinFilter(-size))
    return np.asarray(canvas) / 255.0


def _varied_letter(rng: np.random.Generator) -> np.ndarray:
    return _varied(rng, LETTERS)


def elastic(picture: np.ndarray, rng: np.random.Generator, shift: float = 9.0, knots: int = 5) -> np.ndarray:
    """`picture` (H, W) bent by a smooth random displacement (up to about `shift` pixels), as handwriting bends
    type: a `knots` x `knots` grid of random shifts, upsampled bilinearly, each pixel read from where it points."""
    h, w = picture.shape
    field = []
    for _ in range(2):
        coarse = Image.fromarray(rng.uniform(-shift, shift, (knots, knots)).astype(np.float32), mode="F")
        field.append(np.asarray(coarse.resize((w, h), Image.Resampling.BILINEAR)))
    rows, columns = np.mgrid[0:h, 0:w]
    r = np.clip(np.rint(rows + field[0]), 0, h - 1).astype(int)
    c = np.clip(np.rint(columns + field[1]), 0, w - 1).astype(int)
    return picture[r, c]


def _handwritten_letter(rng: np.random.Generator) -> np.ndarray:
    """A varied letter bent elastically: letters as a hand might draw them."""
    return elastic(_varied(rng, LETTERS), rng)


def _varied_symbol(rng: np.random.Generator) -> np.ndarray:
    return _varied(rng, SYMBOLS + OTHER_SCRIPTS_FIT)


def _symbol(rng: np.random.Generator) -> np.ndarray:
    return _glyph(rng, SYMBOLS, font_paths())


def _scribble(rng: np.random.Generator) -> np.ndarray:
    """One to three smooth random curves (cubic Bezier chains), 5-12 pixels wide on a 112 canvas."""
    canvas = Image.new("L", (CANVAS, CANVAS), 0)
    draw = ImageDraw.Draw(canvas)
    t = np.linspace(0, 1, 24)[:, None]
    for _ in range(rng.integers(1, 4)):
        points = rng.uniform(8, CANVAS - 8, (3 * int(rng.integers(1, 4)) + 1, 2))
        curve = []
        for i in range(0, len(points) - 1, 3):
            p0, p1, p2, p3 = points[i : i + 4]
            curve += (((1 - t) ** 3) * p0 + 3 * (1 - t) ** 2 * t * p1 + 3 * (1 - t) * t**2 * p2 + t**3 * p3).tolist()
        draw.line([tuple(p) for p in curve], fill=255, width=int(rng.integers(5, 13)), joint="curve")
    return np.asarray(canvas) / 255.0


def _grating(rng: np.random.Generator) -> np.ndarray:
    """A texture of another kind than 1/f noise: a sum of two or three sinusoidal gratings, or a checkerboard."""
    y, x = np.mgrid[0:FIELD, 0:FIELD] / FIELD
    if rng.random() < 0.3:
        k = int(rng.integers(3, 12))
        return ((np.floor(x * k) + np.floor(y * k)) % 2).astype(np.float64)
    field = sum(
        np.sin(2 * np.pi * rng.uniform(2, 12) * (np.cos(a) * x + np.sin(a) * y) + rng.uniform(0, 2 * np.pi))
        for a in rng.uniform(0, np.pi, rng.integers(2, 4))
    )
    field = np.asarray(field, np.float64)
    return (field - field.min()) / (field.max() - field.min())


def _noise(rng: np.random.Generator) -> np.ndarray:
    """Uniform, Gaussian or salt-and-pepper noise, on a 28 or 64 canvas."""
    side = int(rng.choice([28, FIELD]))
    kind = rng.integers(3)
    if kind == 0:
        return rng.uniform(0, 1, (side, side))
    if kind == 1:
        return np.clip(rng.normal(0.5, rng.uniform(0.1, 0.3), (side, side)), 0, 1)
    return (rng.random((side, side)) < rng.uniform(0.05, 0.5)).astype(np.float64)


def _fonts_set(chars: str, fonts: tuple[str, ...]) -> Callable[[np.random.Generator], np.ndarray]:
    def draw(rng: np.random.Generator) -> np.ndarray:
        return _glyph(rng, chars, held_out_fonts(fonts))

    return draw


def _bent_fonts_set(chars: str, fonts: tuple[str, ...]) -> Callable[[np.random.Generator], np.ndarray]:
    def draw(rng: np.random.Generator) -> np.ndarray:
        return elastic(_glyph(rng, chars, held_out_fonts(fonts)), rng)

    return draw


def _texture(rng: np.random.Generator) -> np.ndarray:
    """Natural-image-like 1/f^a noise (a in [1.5, 2.5] in power), rescaled to [0, 1]."""
    freq = np.fft.fftfreq(FIELD)[:, None] ** 2 + np.fft.fftfreq(FIELD)[None, :] ** 2
    noise = rng.normal(size=(FIELD, FIELD)) + 1j * rng.normal(size=(FIELD, FIELD))
    field = np.real(np.fft.ifft2(noise / np.maximum(freq, 1e-4) ** rng.uniform(0.75, 1.25)))
    return (field - field.min()) / (field.max() - field.min())


NONDIGIT_SETS: dict[str, Callable[[np.random.Generator], np.ndarray]] = {
    "uniform": _uniform,
    "gaussian": _gaussian,
    "blank": _blank,
    "near_blank": _near_blank,
    "strokes": _strokes,
    "letters": _letter,
    "textures": _texture,
    "symbols": _symbol,
    "varied_letters": _varied_letter,
    "varied_symbols": _varied_symbol,
    "handwritten_letters": _handwritten_letter,
}
VALIDATION_SETS: dict[str, Callable[[np.random.Generator], np.ndarray]] = {  # another seed, other fonts
    "letters": _fonts_set(LETTERS, VALIDATION_FONTS),
    "symbols": _fonts_set(SYMBOLS, VALIDATION_FONTS),
    "strokes": _strokes,
    "near_blank": _near_blank,
    "textures": _texture,
    "bent_letters": _bent_fonts_set(LETTERS, VALIDATION_FONTS),  # as a hand might draw them
}
TEST_SETS: dict[str, Callable[[np.random.Generator], np.ndarray]] = {  # fonts and generators used for nothing else
    "letters": _fonts_set(LETTERS, TEST_FONTS),
    "other_scripts": _fonts_set(OTHER_SCRIPTS, SCRIPT_FONTS),
    "symbols": _fonts_set(SYMBOLS, TEST_FONTS),
    "strokes": _strokes,
    "scribbles": _scribble,
    "textures": _grating,
    "noise": _noise,
    "blank": _blank,
    "near_blank": _near_blank,
}
CONFIRMATION_SETS: dict[str, Callable[[np.random.Generator], np.ndarray]] = {  # fonts used by nothing else
    "letters": _fonts_set(LETTERS, CONFIRMATION_FONTS),
    "handwritten_letters": _fonts_set(LETTERS, HANDWRITING_FONTS),
    "symbols": _fonts_set(SYMBOLS, CONFIRMATION_FONTS),
}
ROLES = {
    "fit": (NONDIGIT_SETS, 0),
    "validation": (VALIDATION_SETS, 1),
    "test": (TEST_SETS, 2),
    "confirmation": (CONFIRMATION_SETS, 3),
}


def to_model_input(picture: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """A picture (H, W) in [0, 1] as the service would feed it to a model of input `shape` (C, H, W)."""
    image = Image.fromarray((np.clip(picture, 0, 1) * 255).astype(np.uint8))
    return preprocess(image, (shape[-2], shape[-1])).array.reshape(shape).astype(np.float32)


def make_set(name: str, n: int, seed: int, shape: tuple[int, ...] = (1, 28, 28), role: str = "fit") -> np.ndarray:
    """n preprocessed images (n, *shape) of one set of a role (fit, validation, test); the same (name, n, seed,
    role) always gives the same images, and each role draws from its own random stream."""
    sets, stream = ROLES[role]
    if name not in sets:
        raise ValueError(f"unknown {role} non-digit set {name!r}; choose one of {sorted(sets)}")
    draw = sets[name]
    key = [seed, list(sets).index(name)] if role == "fit" else [seed, list(sets).index(name), stream]
    rng = np.random.default_rng(key)
    return np.stack([to_model_input(draw(rng), shape) for _ in range(n)])


def rotated_digits(images: np.ndarray, labels: np.ndarray, quarter_turns: int) -> np.ndarray:
    """Digits (N, 1, H, W) turned by 90 degrees times `quarter_turns`, leaving out those that stay digits when turned:
    0, 1 and 8, and at 180 degrees also 6 and 9 (each other's turn)."""
    symmetric = {0, 1, 8} | ({6, 9} if quarter_turns % 4 == 2 else set())
    keep = ~np.isin(labels, list(symmetric))
    return np.ascontiguousarray(np.rot90(images[keep], quarter_turns, axes=(-2, -1)))
