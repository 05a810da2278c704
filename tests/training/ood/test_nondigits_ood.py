"""Non-digit sets (seeded, deterministic), the OOD calibration and its report, on a tiny model and synthetic data."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from service.api.inputs import prepare_image
from service.api.routes.inference import DEFAULT_OPTIONS
from service.imaging import ImageLimits, open_image
from service.runtime.ood import FEATURE_TAILS, FeatureReference, OODCalibration
from tests.conftest import write_mnist_dir
from training.ood import calibrate as ood
from training.ood import fitted as ood_fitted
from training.ood import nondigits, pictures, shapes, surfaces, unseen
from training.ood.nondigits import FONT_PACKAGE, NONDIGIT_SETS, FontMissing, font_paths, make_set
from training.ood.shapes import CANVAS


def fonts_present() -> bool:
    try:
        font_paths()
    except FontMissing:
        return False
    return True


needs_fonts = pytest.mark.skipif(
    not fonts_present(), reason=f"the letters set needs the DejaVu fonts of Debian's {FONT_PACKAGE} package"
)


@pytest.mark.parametrize("name", NONDIGIT_SETS)
def test_sets_are_seeded_and_deterministic(name: str) -> None:
    try:
        a = make_set(name, 6, seed=3)
    except FontMissing as missing:
        pytest.skip(str(missing))
    assert a.shape == (6, 1, 28, 28) and a.dtype == np.float32
    assert a.min() >= 0.0 and a.max() <= 1.0
    np.testing.assert_array_equal(a, make_set(name, 6, seed=3))
    if name not in ("blank", "pages", "lit_pages", "vignettes", "paper", "fills"):  # blank pages become zeros
        assert not np.array_equal(a, make_set(name, 6, seed=4))


def test_blank_pages_become_all_zeros_through_the_service_preprocessing() -> None:
    assert not make_set("blank", 5, seed=0).any()


def test_unknown_set_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown fit non-digit set 'cats'; choose one of"):
        make_set("cats", 1, seed=0)


def test_missing_fonts_name_the_package(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr("training.ood.nondigits.FONT_DIR", tmp_path)
    with pytest.raises(FontMissing, match=f"letters need the DejaVu fonts \\({FONT_PACKAGE}\\)"):
        make_set("letters", 1, seed=0)


def test_quantile_levels_reach_one_over_n_in_both_tails() -> None:
    levels = ood.quantile_levels(5000)
    assert levels[0] == 0.0 and levels[-1] == 1.0 and np.all(np.diff(levels) > 0)
    assert levels[1] == pytest.approx(1 / 5000) and levels[-2] == pytest.approx(1 - 1 / 5000)


def test_auroc() -> None:
    assert ood.auroc(np.array([3.0, 4.0]), np.array([1.0, 2.0])) == 1.0
    assert ood.auroc(np.array([1.0, 2.0]), np.array([3.0, 4.0])) == 0.0
    assert ood.auroc(np.array([1.0, 1.0]), np.array([1.0])) == 0.5
    assert ood.auroc(np.array([2.0, 0.0]), np.array([1.0])) == 0.5


def test_feature_tails() -> None:
    levels, values = np.array([0.0, 0.5, 1.0]), np.array([0.0, 1.0, 2.0])
    upper = FeatureReference("distance", "upper", levels, values, floor=0.01)
    lower = FeatureReference("ink", "lower", levels, values, floor=0.01)
    both = FeatureReference("ink", "both", levels, values, floor=0.01)
    x = np.array([0.5, 1.0, 5.0])
    np.testing.assert_allclose(upper.surprise(x), -np.log([0.75, 0.5, 0.01]))
    np.testing.assert_allclose(lower.surprise(x), -np.log([0.25, 0.5, 1.0]))
    np.testing.assert_allclose(both.surprise(x), -np.log([0.25, 0.5, 0.01]))


def test_calibration_accepts_its_percentile_of_the_reference() -> None:
    rng = np.random.default_rng(0)
    features = {name: rng.normal(size=2000) for name in ood_fitted.CANDIDATES["DARCCC features"]}
    card = ood.calibrate(features, 95.0, "test", 0.99)
    assert json.loads(json.dumps(card)) == card  # the card's object is plain JSON
    calibration = OODCalibration.from_card(card)
    accepted = calibration.score(features) <= calibration.threshold
    assert accepted.mean() == pytest.approx(0.95, abs=0.01)
    assert {f.name: f.tail for f in calibration.features} == {n: FEATURE_TAILS[n] for n in features}


@needs_fonts
def test_cli_calibrates_writes_the_card_and_reports_every_set(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = write_mnist_dir(tmp_path / "mnist", n_train=64, n_test=32)
    report_file = tmp_path / "ood.json"
    args = ["--model", str(tiny_model), "--data-dir", str(data), "--method", "darccc", "--reference", "48"]
    args += ["--per-set", "4"]
    assert ood.main([*args, "--percentile", "90", "--write-card", "--json", str(report_file)]) == 0
    report = json.loads(report_file.read_text())
    assert set(report["sets"]) == set(NONDIGIT_SETS)
    assert all(0.0 <= row["auroc"] <= 1.0 and row["n"] == 4 for row in report["sets"].values())
    assert report["mnist_test"]["n"] == 32
    uploads = report["mnist_test_uploads"]  # the same digits through the service's PNG decoding and preprocessing
    assert uploads["n"] == 32 and 0.0 <= uploads["accepted"] <= 1.0
    card = json.loads((tiny_model / "model.json").read_text())
    assert card["ood"]["reference"] == {"images": "MNIST training images 16-63", "n": 48}
    assert card["ood"]["threshold"] == report["threshold"]
    printed = capsys.readouterr().out
    assert "| letters | 4 |" in printed and "MNIST test digits accepted:" in printed
    assert "The same 32 test digits sent as PNG uploads through the service's decoding" in printed


def test_cli_refuses_a_reference_larger_than_the_training_set(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = write_mnist_dir(tmp_path / "mnist", n_train=64, n_test=32)
    assert (
        ood.main(["--model", str(tiny_model), "--data-dir", str(data), "--method", "darccc", "--reference", "100"]) == 2
    )
    assert "capsnet-ood: error: --reference 100 must be between 1 and 64" in capsys.readouterr().err


def test_uploads_are_what_the_service_feeds_the_model() -> None:
    """A digit sent as a PNG reaches the model as the service's preprocessing makes it: MNIST-like already."""
    rng = np.random.default_rng(0)
    digits = np.zeros((3, 1, 28, 28), np.uint8)
    digits[:, 0, 6:22, 10:18] = rng.integers(128, 256, (3, 16, 8))
    got = ood.as_uploads(digits, (1, 28, 28))
    assert got.shape == (3, 1, 28, 28) and got.dtype == np.float32
    for picture, fed in zip(digits, got, strict=True):  # what the v1 routes make of the same PNG without options
        png = io.BytesIO()
        Image.fromarray(picture[0]).save(png, format="PNG")
        expected, _, _ = prepare_image(open_image(png.getvalue(), ImageLimits()), (28, 28), DEFAULT_OPTIONS)
        np.testing.assert_array_equal(fed[0], expected)


def test_acceptance_of_nothing_has_no_accuracy() -> None:
    report = {
        "model": "m", "version": "1", "threshold": 1.0, "threshold_rule": "r", "reference": "ref", "sets": {},
        "mnist_test": {"n": 2, "accepted": 0.0, "accuracy_all": 0.5, "accuracy_accepted": None},
    }  # fmt: skip
    assert "accuracy on the accepted — (none accepted) (on all: 50.00%)" in ood.markdown(report)


def test_a_font_without_a_glyph_is_not_drawn_with_it() -> None:
    if not fonts_present():
        pytest.skip(f"needs the DejaVu fonts of Debian's {FONT_PACKAGE} package")
    sans = font_paths()[0]
    assert nondigits.has_glyph(sans, "A") and nondigits.has_glyph(sans, "ж")
    assert not nondigits.has_glyph(sans, "\u0378")  # unassigned: the missing-glyph box
    with pytest.raises(FontMissing, match="has a glyph of '\\\\u0378'"):
        nondigits._pick(np.random.default_rng(0), "\u0378", [sans])


def test_the_reported_sets_share_no_font_character_or_generator_with_any_other_role() -> None:
    """The test sets are held out by construction: another role using one of their fonts or generators fails here."""
    others = {*nondigits.FIT_FONTS, *nondigits.SCRIPT_FIT_FONTS, *nondigits.WORLD_FONTS, *nondigits.VALIDATION_FONTS,
              *nondigits.VALIDATION_HANDWRITING, *nondigits.CONFIRMATION_FONTS,
              *nondigits.CONFIRMATION_HANDWRITING}  # fmt: skip
    assert not (set(nondigits.TEST_FONTS) | set(nondigits.SCRIPT_FONTS)) & others
    assert not set(nondigits.CONFIRMATION_FONTS + nondigits.CONFIRMATION_HANDWRITING) & (
        set(nondigits.FIT_FONTS) | set(nondigits.VALIDATION_FONTS) | set(nondigits.VALIDATION_HANDWRITING)
    )
    assert not set(nondigits.SCRIPTS) & set(nondigits.SCRIPTS_FIT + nondigits.SCRIPTS_MORE + nondigits.SCRIPTS_WORLD)
    shape_sets = [v for v in nondigits.TEST_SETS.values() if getattr(v, "__module__", "") == unseen.__name__]
    assert len(shape_sets) == 6
    for role in ("fit", "validation", "confirmation"):
        assert not set(shape_sets) & set(nondigits.ROLES[role][0].values()), role


def test_no_set_holds_a_glyph_twin_of_a_digit() -> None:
    twins = set(
        "OIlSZBGosbgqzιϑθбчЧБвоОзЗוןlιรวงอฮธลจዐገረरटठडढदاوهمعغرزدذ"
        "ইঈউঊঋএঐওঔঙঠডঢণতবর" "கஉஊஙசஎஏஒஓர" "ខចទនរវ" "一二三十"  # Bengali, Tamil, Khmer, CJK
        "ԳԶԾՁՅՉՋՏՑՕՖգզլծձճշչջցւօֆ" "ბგვზმნპშწჰ" "ઉઊઘઙચટઠડઢપયરવ"  # Armenian, Georgian, Gujarati
        "ఎఒ" "ᎦᎧᎴᎶᎺᎼᎾᏀᏃᏄᏆᏋᏎᏏᏓᏕᏚᏜᏧᏩᏫᏭᏮᏰᏳᏴ" "ཅཉཏཐདཞཤཧ"  # Telugu, Cherokee, Tibetan
        "ꀦꀹꈔꈧꉠꉍꊙꋒꍗꏉᱚᱛᱜᱝᱟᱠᱣᱧᱨᱩᱪᱭᱮᱯᱰᱱᱲᱳᱵᱷꯔꯕꯖ"  # Yi, Ol Chiki, Meetei Mayek
        "ခစဇဉဌဍထဒဓနရဝဠ" "ᰁᰅᰆᰈᰊᰌᰍᰎᰏᰒᰓᰚᰛᰟᰡᰣ" "ꪅꪆꪇꪉꪋꪑꪖꪤꪥꪫꪮꪯ"  # Myanmar, Lepcha, Tai Viet
        "ಇಌಎಏಒಓಔಖಗಟಠಡತದರಱಲಳ" "ߊߋߏߐߑߒߕߖߗߛߝߞߟߢߣߤߥߦߧߨߩ"  # Kannada, N'Ko
        "𞤀𞤁𞤃𞤉𞤍𞤎𞤐𞤑𞤒𞤖𞤗𞤘𞤙𞤛𞤠𞤢𞤣𞤤𞤥𞤨𞤩𞤫𞤯𞤰𞤲𞤳𞤴𞤸𞤹𞤺𞤻𞤽𞥀𞥂"  # Adlam
        "ހބޅއވމފލގސޑޒޓޕޖޗޙޚޛޜޢޣޤޥޱ"  # Thaana
        "ᠡᠣᠤᠥᠦᠨᠪᠫᠬᠭᠮᠯᠰᠱᠲᠳᠴᠵᠶᠷᠸᠹᠺᠻᠼᠽᠿᡀᡁᡂᡃᡆᡇᡈᡉᡊᡋᡌᡏᡐᡑᡒᡓᡔᡕᡖᡗᡘᡚᡛᡜᡝᡞᡟᡠᡡᡣᡦᡧᡨᡩᡪᡬᡭᡮᡯᡰᡱᡲᡴᡵᡷ"  # Mongolian
        "අඌඑචථදඵවෆ" "ഋഒടഠദറ" "ຂຈດຣລອຮ" "ਓਕਙਡਤਪਲੜ" "ଓଠ" "ᐊᑫᑲᒉᒣᔦᔭᕋᕗ" "ⴰⵏⵔⵖⵚⵛⵢ" "ܕܙܝܨܪ" "ꔇꔎꔏꔒꔓꔡꔢ"
    )  # fmt: skip
    digits = set(
        "٠١٢٣٤٥٦٧٨٩۰۱۲۳۴۵۶۷۸۹๐๑๒๓๔๕๖๗๘๙०१२३४५६७८९፩፪፫፬፭፮፯፰፱"  # Arabic, Persian, Thai, Devanagari, Ethiopic
        "০১২৩৪৫৬৭৮৯௦௧௨௩௪௫௬௭௮௯០១២៣៤៥៦៧៨៩૦૧૨૩૪૫૬૭૮૯"  # Bengali, Tamil, Khmer, Gujarati
        "౦౧౨౩౪౫౬౭౮౯༠༡༢༣༤༥༦༧༨༩൦൧൨൩൪൫൬൭൮൯໐໑໒໓໔໕໖໗໘໙੦੧੨੩੪੫੬੭੮੯୦୧୨୩୪୫୬୭୮୯꧐꧑꧒꧓꧔꧕꧖꧗꧘꧙꘠꘡꘢꘣꘤꘥꘦꘧꘨꘩"
        "᱐᱑᱒᱓᱔᱕᱖᱗᱘᱙꯰꯱꯲꯳꯴꯵꯶꯷꯸꯹"  # Ol Chiki, Meetei Mayek
        "၀၁၂၃၄၅၆၇၈၉႐႑႒႓႔႕႖႗႘႙᱀᱁᱂᱃᱄᱅᱆᱇᱈᱉"  # Myanmar, Shan, Lepcha
        "೦೧೨೩೪೫೬೭೮೯߀߁߂߃߄߅߆߇߈߉𞥐𞥑𞥒𞥓𞥔𞥕𞥖𞥗𞥘𞥙"  # Kannada, N'Ko, Adlam
        "᠐᠑᠒᠓᠔᠕᠖᠗᠘᠙"  # Mongolian (Thaana writes Arabic digits)
    )  # fmt: skip
    drawn = (
        nondigits.LETTERS
        + nondigits.SCRIPTS
        + nondigits.SCRIPTS_FIT
        + nondigits.SCRIPTS_MORE
        + nondigits.SCRIPTS_WORLD
        + nondigits.SYMBOLS
    )
    assert not (twins | digits) & set(drawn)


@pytest.mark.parametrize(
    "draw",
    [shapes.pen_strokes, shapes.doodles, shapes.cells, shapes.field_noise, shapes.dust, shapes.brush_strokes,
     shapes.spirographs, shapes.masonry, shapes.block_noise, shapes.sensor_noise, shapes.nib_strokes, shapes.knots,
     shapes.weaves, shapes.scan_noise, shapes.stains, shapes.marks, shapes.sketches, shapes.tilings, shapes.codec_noise,
     shapes.notebook, pictures.signatures, pictures.figures, pictures.halftones, pictures.glitches, pictures.fills,
     pictures.show_through, pictures.zigzags, pictures.hatching, pictures.plaids, pictures.dithers,
     pictures.checkerboards, pictures.wiped_boards, pictures.waves, pictures.staves, pictures.terrazzo,
     pictures.fax_noise, pictures.empty_windows, pictures.stamps, pictures.solid_bars, pictures.heartbeats,
     pictures.crayons, pictures.knits, pictures.tv_snow, pictures.folded_sheets, pictures.crumpled,
     pictures.solid_shapes, surfaces.seismograms, surfaces.pen_tests, surfaces.wood_grain, surfaces.thermal_prints,
     surfaces.envelopes, surfaces.pencil_ticks, unseen.circuit_traces, unseen.seams, unseen.raindrops,
     unseen.brushed_metal, unseen.blind_shadows, unseen.eraser_crumbs],
)  # fmt: skip
def test_the_generators_draw_something_in_range(draw: Callable[[np.random.Generator], np.ndarray]) -> None:
    for seed in range(20):
        picture = draw(np.random.default_rng(seed))
        assert picture.ndim == 2 and picture.min() >= 0 and picture.max() <= 1 and picture.max() > 0


def test_blank_pages_of_any_size_become_all_zeros() -> None:
    assert not make_set("pages", 8, seed=0, role="fit").any()
    sizes = {shapes.pages(np.random.default_rng(s)).shape for s in range(8)}
    assert len(sizes) > 1 and all(16 <= side <= 200 for size in sizes for side in size)


@pytest.mark.parametrize(("draw", "name", "role"), [(shapes.lit_pages, "lit_pages", "fit"),
                                                    (shapes.vignettes, "vignettes", "fit"),
                                                    (shapes.paper, "paper", "fit")])  # fmt: skip
def test_unevenly_lit_blank_pages_become_all_zeros(
    draw: Callable[[np.random.Generator], np.ndarray], name: str, role: str
) -> None:
    """A drift or a vignette of up to 3 gray levels is below the service's contrast floor: the model sees an empty
    page."""
    assert not make_set(name, 8, seed=0, role=role).any()
    pages = [draw(np.random.default_rng(s)) for s in range(8)]
    assert all(p.max() - p.min() <= 3 / 255 + 1e-9 for p in pages) and any(p.max() > p.min() for p in pages)
    assert len({p.shape for p in pages}) > 1


def test_flat_fills_of_any_aspect_ratio_become_all_zeros() -> None:
    assert not make_set("fills", 8, seed=0, role="fit").any()
    fills = [pictures.fills(np.random.default_rng(s)) for s in range(20)]
    assert all(f.min() == f.max() and min(f.shape) >= 8 and max(f.shape) <= 200 for f in fills)
    assert max(max(f.shape) / min(f.shape) for f in fills) > 3


def some_come_out_blank(names: tuple[str, ...], role: str) -> None:
    """Of 20 images of each set as the model gets them, some are an empty page and some are not."""
    for name in names:
        images = make_set(name, 20, seed=0, role=role)
        assert 0 < sum(bool(i.any()) for i in images) < 20, name


def test_show_through_is_faint() -> None:
    """The back of a page shows through at no more than a quarter of full contrast, often below the contrast floor."""
    pages = [pictures.show_through(np.random.default_rng(s)) for s in range(20)]
    assert all(0 < p.max() <= 0.25 for p in pages)
    some_come_out_blank(("show_through",), "fit")


def test_checkerboards_and_wiped_boards_are_light_or_faint() -> None:
    """An editor's transparency squares differ by at most a fifth of full contrast; a wiped board's ghost is at most a
    fifth as dark as ink: some of each reach the model as an empty page, the others as faint marks."""
    boards = [pictures.checkerboards(np.random.default_rng(s)) for s in range(20)]
    assert all(0.03 - 1e-9 <= b.max() - b.min() <= 0.2 + 1e-9 and b.min() >= 0.6 for b in boards)
    assert len({b.shape for b in boards}) > 1
    ghosts = [pictures.wiped_boards(np.random.default_rng(s)) for s in range(20)]
    assert all(0 < g.max() <= 0.2 for g in ghosts)
    some_come_out_blank(("checkerboards", "wiped_boards"), "fit")


def test_empty_windows_and_stamps_are_light_or_faint() -> None:
    """A blank dialog's border and title bar differ from its pane by at most 15% of full contrast, a stamp's imprint
    is at most a fifth as dark as ink: some of each reach the model as an empty page, the others as faint marks."""
    windows = [pictures.empty_windows(np.random.default_rng(s)) for s in range(20)]
    assert all(0.02 - 1e-9 <= w.max() - w.min() <= 0.15 + 1e-9 and w.min() >= 0.65 for w in windows)
    assert len({w.shape for w in windows}) > 1
    imprints = [pictures.stamps(np.random.default_rng(s)) for s in range(20)]
    assert all(0 < s.max() <= 0.2 for s in imprints)
    some_come_out_blank(("empty_windows", "stamps"), "fit")


def test_folded_sheets_and_crumpled_pages_are_light_and_faint() -> None:
    """A folded sheet's two faces differ by at most 15% of full contrast, a crumpled page's facets by at most a
    quarter: some of each reach the model as an empty page, the others as a faint face or facets, never a bar."""
    sheets = [pictures.folded_sheets(np.random.default_rng(s)) for s in range(20)]
    assert all(0.02 - 1e-9 <= p.max() - p.min() <= 0.15 + 3 / 255 + 1e-9 and p.min() >= 0.55 for p in sheets)
    assert all(0.74 <= p.shape[0] / p.shape[1] <= 1.34 for p in sheets) and len({p.shape for p in sheets}) > 1
    for sheet in sheets:  # two faces: the pixels fall into two levels, each covering a sixth of the sheet or more
        low = sheet < (sheet.min() + sheet.max()) / 2
        assert 1 / 6 < low.mean() < 5 / 6
    pages = [pictures.crumpled(np.random.default_rng(s)) for s in range(20)]
    assert all(0 < p.max() - p.min() <= 0.24 + 1e-9 and p.min() >= 0.45 for p in pages)
    assert all(len(np.unique(np.round(p, 3))) > 20 for p in pages)  # facets in many shades, not a flat page
    some_come_out_blank(("folded_sheets", "crumpled"), "fit")


def test_heartbeats_are_wide_traces_with_spikes_and_crayons_fill_a_patch_with_gaps() -> None:
    for seed in range(10):
        trace = pictures.heartbeats(np.random.default_rng(seed))
        rows, cols = np.nonzero(trace > 0.5)
        assert np.ptp(cols) > 1.3 * np.ptp(rows)  # lying down, wider than high: never an upright stroke
        ink_per_column = (trace > 0.5).sum(axis=0)
        assert ink_per_column.max() > 3 * np.median(ink_per_column[ink_per_column > 0])  # the spikes
        patch = pictures.crayons(np.random.default_rng(seed))
        inked = patch > 0.5
        assert 0.03 < inked.mean() < 0.8
        ys, xs = np.nonzero(inked)
        box = patch[ys.min() : ys.max() + 1, xs.min() : xs.max() + 1]
        assert 0.15 < (box > 0.5).mean() < 0.85  # back-and-forth strokes broken by the grain, not a solid fill


def test_knits_repeat_their_stitches_and_tv_snow_is_smeared_along_rows() -> None:
    for seed in range(10):
        cloth = pictures.knits(np.random.default_rng(seed))
        assert cloth.shape == (64, 64) and 0 <= cloth.min() < cloth.max() <= 1
        assert (cloth > 0.3).mean() > 0.3  # yarn over most of the field, not a few marks
        snow = pictures.tv_snow(np.random.default_rng(seed))
        assert min(snow.shape) >= 48 and max(snow.shape) <= 128 and snow.std() > 0.05
        across = np.corrcoef(snow[:, :-1].ravel(), snow[:, 1:].ravel())[0, 1]  # neighbours along a row
        down = np.corrcoef((snow[:-1] - snow[:-1].mean(1, keepdims=True)).ravel(),
                           (snow[1:] - snow[1:].mean(1, keepdims=True)).ravel())[0, 1]  # fmt: skip
        assert across > 0.3 and abs(down) < 0.2  # streaks along the rows, independent from row to row


def test_solid_shapes_are_stout_and_some_fill_a_corner() -> None:
    """Each shape is one solid region, no sliver; some are right triangles with the right angle in a canvas corner (a
    folded sheet's lit face), some touch an edge; the pictures are two shades under mild noise, never flat."""
    masks = [pictures._solid_shape(np.random.default_rng(s), 90, 120) for s in range(40)]
    assert all(set(np.unique(m)) <= {0, 255} and pictures._stout(m) for m in masks)
    corners = [m for m in masks if m[0, 0] or m[0, -1] or m[-1, 0] or m[-1, -1]]
    edges = [m for m in masks if m[0].any() or m[-1].any() or m[:, 0].any() or m[:, -1].any()]
    assert len(corners) >= 5 and len(edges) > len(corners) and len(edges) < 40
    sliver = np.zeros((90, 120), np.uint8)
    sliver[10:80, 50:56] = 255  # a bar as thin as a one is refused
    assert not pictures._stout(sliver)
    pictures_ = [pictures.solid_shapes(np.random.default_rng(s)) for s in range(20)]
    assert all(min(p.shape) >= 40 and max(p.shape) <= 180 and p.max() - p.min() >= 0.04 for p in pictures_)
    assert len({p.shape for p in pictures_}) > 1
    assert sum(bool(i.any()) for i in make_set("solid_shapes", 20, seed=0, role="fit")) > 10


def test_seismograms_run_across_and_pen_tests_lie_in_a_row() -> None:
    for seed in range(10):
        trace = surfaces.seismograms(np.random.default_rng(seed))
        rows, cols = np.nonzero(trace > 0.5)
        assert np.ptp(cols) >= 90 and np.ptp(cols) > 1.3 * np.ptp(rows)  # level traces across the canvas
        spirals = surfaces.pen_tests(np.random.default_rng(seed))
        rows, cols = np.nonzero(spirals > 0.5)
        assert np.ptp(cols) > 1.3 * np.ptp(rows)  # a row of spirals, wider than high
        assert 0.01 < (spirals > 0.5).mean() < 0.2


def test_wood_grain_is_a_field_and_thermal_prints_fade_with_dead_columns() -> None:
    for seed in range(10):
        wood = surfaces.wood_grain(np.random.default_rng(seed))
        assert wood.shape == (64, 64) and len(np.unique(wood)) > 20 and wood.std() > 0.03
        dots = surfaces.thermal_prints(np.random.default_rng(seed))
        assert set(np.unique(dots)) <= {0.0, 1.0} and min(dots.shape) >= 48 and max(dots.shape) <= 128
        third = dots.shape[0] // 3
        assert dots[:third].mean() > 2 * dots[-third:].mean()  # printed dark at one end, faded at the other
        assert not dots.any(axis=0).all()  # at least one dead heating element


def test_envelopes_are_faint_and_pencil_ticks_are_faint_small_marks() -> None:
    """A blank envelope's flap and shadow stay within a quarter of full contrast: most come out as an empty page, some
    (over the service's contrast floor) as the flap's V or the shadow's edge. A tick or a staple's holes cover under
    2% of their page."""
    envelopes = [surfaces.envelopes(np.random.default_rng(s)) for s in range(20)]
    assert all(p.max() - p.min() <= 0.24 + 1e-9 and p.shape[1] / p.shape[0] >= 1.4 - 0.1 for p in envelopes)
    some_come_out_blank(("envelopes",), "fit")
    marks = [surfaces.pencil_ticks(np.random.default_rng(s)) for s in range(20)]
    assert all(0 < m.max() <= 0.8 and (m > 0.02).mean() < 0.02 for m in marks)
    assert sum(bool(i.any()) for i in make_set("pencil_ticks", 20, seed=0, role="fit")) > 15  # the faintest: blank


def test_circuit_traces_fan_out_and_seams_run_level() -> None:
    for seed in range(10):
        copper = unseen.circuit_traces(np.random.default_rng(seed))
        rows, cols = np.nonzero(copper > 0.5)
        assert min(np.ptp(rows), np.ptp(cols)) >= 40 and 0.02 < (copper > 0.5).mean() < 0.25  # a fan, never one stroke
        assert min(rows.min(), cols.min()) >= 4 and max(rows.max(), cols.max()) < CANVAS - 4  # fitted, none cut off
        stitches = unseen.seams(np.random.default_rng(seed))
        rows, cols = np.nonzero(stitches > 0.5)
        assert np.ptp(cols) >= 60 and np.ptp(cols) > 1.5 * np.ptp(rows)  # along a level seam, not an upright stroke


def test_raindrops_are_a_field_and_brushed_metal_is_streaked() -> None:
    def agreement(picture: np.ndarray, dy: int, dx: int) -> float:
        """How far each pixel agrees with its neighbour (dy, dx) away: the correlation of the two."""
        h, w = picture.shape
        a, b = picture[: h - dy, max(0, -dx) : w - max(0, dx)], picture[dy:, max(0, dx) : w - max(0, -dx)]
        return float(np.corrcoef(a.ravel(), b.ravel())[0, 1])

    for seed in range(10):
        glass = unseen.raindrops(np.random.default_rng(seed))
        assert glass.shape == (64, 64) and len(np.unique(glass)) > 20 and (glass == 1).sum() >= 10  # the glints
        metal = unseen.brushed_metal(np.random.default_rng(seed))
        assert min(metal.shape) >= 48 and max(metal.shape) <= 128 and 0.02 < metal.std() < 0.15
        agreements = [agreement(metal, dy, dx) for dy, dx in ((0, 1), (1, 0), (1, 1), (1, -1))]
        assert max(agreements) > 2 * min(agreements) + 0.05  # scratches: alike along them, not across


def test_blind_shadows_are_faint_bands_and_eraser_crumbs_small_marks() -> None:
    """A sheet's shadow bands are at most 18% of full contrast darker: about three in five come out as an empty page,
    the others (over the service's contrast floor) as soft stripes. Eraser crumbs cover under 5% of their page and
    all come through."""
    sheets = [unseen.blind_shadows(np.random.default_rng(s)) for s in range(20)]
    assert all(0.02 - 1e-9 <= p.max() - p.min() <= 0.18 + 3 / 255 + 1e-9 and p.min() >= 0.5 for p in sheets)
    for sheet in sheets:  # bands and gaps: each level covers a sixth of the sheet or more
        assert 1 / 6 < (sheet < (sheet.min() + sheet.max()) / 2).mean() < 5 / 6
    through = sum(bool(i.any()) for i in make_set("blank", 20, seed=0, role="test"))
    assert 5 <= through < 20  # a fair share over the contrast floor, the others an empty page
    crumbs = [unseen.eraser_crumbs(np.random.default_rng(s)) for s in range(20)]
    assert all(0.1 <= m.max() <= 0.6 and (m > 0.05).mean() < 0.05 for m in crumbs)
    assert all(bool(i.any()) for i in make_set("near_blank", 8, seed=0, role="test"))


def test_fax_noise_is_one_bit_in_runs_and_terrazzo_is_a_field_of_chips() -> None:
    for seed in range(10):
        fax = pictures.fax_noise(np.random.default_rng(seed))
        assert set(np.unique(fax)) <= {0.0, 1.0} and 0 < fax.mean() < 1
        assert min(fax.shape) >= 40 and max(fax.shape) <= 120
        changes = np.count_nonzero(np.diff(fax, axis=1))
        assert changes < fax.size / 2 + 1  # runs, not pixel noise: on average at least 2 pixels long
        stone = pictures.terrazzo(np.random.default_rng(seed))
        assert stone.shape == (64, 64) and len(np.unique(stone)) > 10


def test_dithers_are_one_bit_and_plaids_repeat_their_bands() -> None:
    for seed in range(10):
        dots = pictures.dithers(np.random.default_rng(seed))
        assert set(np.unique(dots)) <= {0.0, 1.0} and 0 < dots.mean() < 1
        cloth = pictures.plaids(np.random.default_rng(seed))
        assert cloth.shape == (64, 64)
        assert np.allclose(cloth, cloth.T)  # the same bands across and down (the twill's diagonals too)
        assert 0 <= cloth.min() < cloth.max() <= 1


def test_every_font_of_every_role_names_its_debian_package() -> None:
    fonts = [*nondigits.FIT_FONTS, *nondigits.WORLD_FONTS, *nondigits.VALIDATION_FONTS,
             *nondigits.VALIDATION_HANDWRITING, *nondigits.TEST_FONTS, *nondigits.SCRIPT_FONTS,
             *nondigits.SCRIPT_FIT_FONTS, *nondigits.CONFIRMATION_FONTS,
             *nondigits.CONFIRMATION_HANDWRITING]  # fmt: skip
    assert [f for f in fonts if nondigits.package_of(f) == "?"] == []
    assert nondigits.package_of("truetype/tlwg/Loma.ttf") == "fonts-tlwg-loma-ttf"


def test_ci_installs_every_font_package_the_sets_name() -> None:
    ci = (Path(__file__).parents[3] / ".ci" / "run").read_text()
    for package in [*nondigits.ALL_FONT_PACKAGES.split(), FONT_PACKAGE, nondigits.VARIED_FONT_PACKAGE]:
        assert package in ci, package
