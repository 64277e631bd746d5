"""One input path for images, texts and class names (CLI, Learner and the HTTP server share it):
each kind of image decoded as documented, bad input refused with a one-line ValueError naming it."""

from __future__ import annotations

import contextlib
import csv
import io
import struct
import time
import unicodedata
import warnings
import zlib

import numpy as np
import pytest
import torch
from _image_fixtures import write_image_fixtures
from PIL import Image, ImageOps, PngImagePlugin

from gdacil.backbones import to_rgb
from gdacil.data import ImageFolder
from gdacil.data.images import ImageReadError, ImageTooLargeError, open_image
from gdacil.learner import Learner
from gdacil.learner.data import MAX_SIDE, load_image, load_images, load_texts, read_samples
from gdacil.learner.names import class_name

from _assets import needs_minilm, needs_transformers


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory):
    return {p.name: p for p in write_image_fixtures(tmp_path_factory.mktemp("images"))}


def pixels(image) -> np.ndarray:
    return np.asarray(image).astype(int)


def one_line(exc_info) -> str:
    message = str(exc_info.value)
    assert "\n" not in message
    return message


# ---------------------------------------------------------------------- image modes
def test_each_mode_is_decoded_as_documented(fixtures):
    gray16 = open_image(fixtures["gray16.png"])
    assert gray16.mode == "L"  # scaled, not clipped at white
    assert pixels(gray16)[0, [0, 8, 16]].tolist() == [0, 128, 255]
    cmyk = open_image(fixtures["cmyk.jpg"])
    assert cmyk.mode == "RGB"
    assert np.abs(pixels(cmyk)[8, 3] - [0, 255, 255]).max() <= 3  # pure cyan
    assert np.abs(pixels(cmyk)[8, 11] - [255, 0, 255]).max() <= 3  # pure magenta
    rotated = open_image(fixtures["exif_orientation6.jpg"])
    assert rotated.size == (16, 24)  # 24x16 stored, turned a quarter clockwise
    with Image.open(fixtures["exif_orientation6.jpg"]) as im:
        assert im.size == (24, 16)
        expected = ImageOps.exif_transpose(im)
    assert np.array_equal(pixels(rotated), pixels(expected))
    # ordinary 8-bit modes keep their mode and alpha (to_rgb composites it later)
    for name, mode in [("rgba_partial.png", "RGBA"), ("palette_transparency.png", "P"),
                       ("gray_alpha.png", "LA"), ("gray.png", "L"), ("bilevel.png", "1"),
                       ("rgb.jpg", "RGB")]:
        assert open_image(fixtures[name]).mode == mode, name
    assert open_image(fixtures["palette_transparency.png"]).info["transparency"] == 0


def test_deep_pil_images_and_arrays_share_the_file_rules():
    deep = np.full((4, 4), 32768, np.uint16)
    assert to_rgb(Image.fromarray(deep)).getpixel((0, 0)) == (128, 128, 128)
    assert to_rgb(deep).getpixel((0, 0)) == (128, 128, 128)
    assert to_rgb(torch.full((1, 4, 4), 0.5)).getpixel((0, 0)) == (128, 128, 128)
    cmyk = Image.frombytes("CMYK", (2, 2), bytes([255, 0, 0, 0] * 4))
    assert to_rgb(cmyk).getpixel((0, 0)) == (0, 255, 255)
    assert to_rgb(Image.new("F", (2, 2), 0.5)).getpixel((0, 0)) == (128, 128, 128)
    with pytest.raises(ValueError, match=r"must lie in \[0, 1\]; got values up to 200.0"):
        to_rgb(Image.new("F", (2, 2), 200.0))
    assert to_rgb(np.array([[True, False]])).getpixel((0, 0)) == (255, 255, 255)
    assert to_rgb(np.array([[7]], np.int64)).getpixel((0, 0)) == (7, 7, 7)


def ordinary_open(path, max_side):
    """How open_image read ordinary files before (benchmark features are cached from them)."""
    with Image.open(path) as im:
        if max(im.size) > max_side:
            im.thumbnail((max_side, max_side), resample=Image.Resampling.BICUBIC)
        else:
            im.load()
        return im.copy()


def test_ordinary_files_decode_as_before(fixtures, tmp_path):
    big = tmp_path / "big.jpg"
    Image.fromarray(np.tile(np.arange(256, dtype=np.uint8), (600, 3))).convert("RGB").save(big)
    names = ["rgba_partial.png", "palette_transparency.png", "gray_alpha.png", "gray.png",
             "bilevel.png", "rgb.jpg"] + [n for n in fixtures if n.startswith("openclipart_")]
    for path in [fixtures[n] for n in names] + [big]:
        for side in (MAX_SIDE, 8):
            new, old = open_image(path, max_side=side), ordinary_open(path, side)
            assert (new.mode, new.size) == (old.mode, old.size), path
            assert new.tobytes() == old.tobytes(), path


def test_transparency_is_composited_on_white_as_in_training(fixtures, tmp_path):
    folder = tmp_path / "folder" / "cls"
    folder.mkdir(parents=True)
    names = ["rgba_partial.png", "palette_transparency.png", "gray_alpha.png"] + [
        n for n in fixtures if n.startswith("openclipart_")]
    for name in names:
        (folder / name).write_bytes(fixtures[name].read_bytes())
    dataset = ImageFolder(tmp_path / "folder", max_side=MAX_SIDE)
    trained = dict(zip(dataset.index("all").ids, dataset.load(dataset.index("all").ids)))
    for name in names:
        training = to_rgb(trained[next(k for k in trained if k.endswith(name))])
        by_path = to_rgb(load_image(fixtures[name]))
        by_bytes = to_rgb(load_image(fixtures[name].read_bytes(), name="inputs[0]"))
        assert by_path.mode == by_bytes.mode == "RGB"
        assert np.array_equal(pixels(by_path), pixels(training)), name
        assert np.array_equal(pixels(by_bytes), pixels(training)), name
    rgba = pixels(Image.open(fixtures["rgba_partial.png"]))
    a = rgba[..., 3:] / 255
    expected = rgba[..., :3] * a + 255 * (1 - a)  # on white, not black
    assert np.abs(pixels(to_rgb(load_image(fixtures["rgba_partial.png"]))) - expected).max() <= 1


def test_load_images_names_and_passes_in_memory_images(fixtures):
    array = np.zeros((4, 4, 3), np.uint8)
    out = load_images([str(fixtures["rgb.jpg"]), array])
    assert out[0].mode == "RGB" and out[1] is array  # validated, passed through
    with pytest.raises(ValueError, match=r"^inputs\[1\]: float image arrays must lie in \[0, 1\]"):
        load_images([np.zeros((4, 4, 3), np.uint8), np.full((4, 4, 3), 255.0)])
    with pytest.raises(FileNotFoundError, match="no such image file: 'missing.png'"):
        load_image("missing.png")


# ---------------------------------------------------------------------- arrays refused
@pytest.mark.parametrize("raw, message", [
    (np.full((4, 4, 3), 255.0), r"float image arrays must lie in \[0, 1\]; got values up to "
                                r"255.0: divide by 255 or pass uint8"),
    (torch.full((3, 4, 4), 255.0), r"got values up to 255.0: divide by 255"),
    (np.array([[0.5, np.nan]]), "must be finite"),
    (np.array([[0.5, np.inf]], np.float32), "must be finite"),
    (np.full((2, 2), -0.5), r"got values down to -0.5"),
    (np.zeros((0, 0, 3), np.uint8), r"empty \(shape \(0, 0, 3\)\)"),
    (torch.zeros(3, 0, 5), "empty"),
    (Image.new("RGB", (0, 0)), r"no pixel \(0x0\)"),
    (np.full((2, 2), 300, np.int32), "must lie in 0..255.*from 300 to 300"),
    (np.full((2, 2), -1, np.int8), "from -1 to -1"),
    (np.zeros((2, 2), np.complex64), "got complex64"),
])
def test_bad_arrays_are_refused(raw, message):
    with pytest.raises(ValueError, match=message) as exc_info:
        to_rgb(raw)
    one_line(exc_info)
    with pytest.raises(ValueError, match=r"^inputs\[3\]: "):
        load_image(raw, name="inputs[3]")


# ---------------------------------------------------------------------- files refused
def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(
        ">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png_header_only(width: int, height: int) -> bytes:
    """A PNG that declares ``width x height`` (8-bit gray) with a few bytes of pixel data."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr)
            + png_chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + png_chunk(b"IEND", b""))


def test_truncated_and_foreign_files_name_the_input(fixtures, tmp_path):
    data = fixtures["rgba_partial.png"].read_bytes()
    cut = tmp_path / "cut.png"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(ImageReadError, match=r"cut\.png is not an image file that can be read "
                                             r"\(.*truncated") as exc_info:
        open_image(cut)
    one_line(exc_info)
    with pytest.raises(ValueError, match=r"^inputs\[3\] is not an image file"):
        load_image(data[: len(data) // 2], name="inputs[3]")
    with pytest.raises(ValueError, match=r"^inputs\[0\] is not an image file.*not a format"):
        load_image(b"plain text", name="inputs[0]")
    with pytest.raises(ValueError, match=r"header\.png is not an image file"):
        open_image(io.BytesIO(b"\x89PNG\r\n\x1a\n" + b"\x00" * 30), name="header.png")


@pytest.mark.parametrize("chunk", ["zTXt", "iCCP"])
def test_compressed_chunk_bombs_are_refused(tmp_path, chunk):
    big = b"a" * (PngImagePlugin.MAX_TEXT_CHUNK + 1024)
    path = tmp_path / f"{chunk}.png"
    if chunk == "zTXt":
        info = PngImagePlugin.PngInfo()
        info.add_text("comment", big.decode(), zip=True)
        Image.new("L", (4, 4)).save(path, pnginfo=info)
    else:
        Image.new("L", (4, 4)).save(path, icc_profile=big)
    assert path.stat().st_size < 100_000  # small on disk
    with pytest.raises(ValueError, match=rf"(?i){chunk}\.png is not an image file that can be "
                                         r"read \(Decompressed Data Too Large") as exc_info:
        open_image(path)
    one_line(exc_info)


def test_pixel_limit_is_checked_before_decoding(tmp_path):
    path = tmp_path / "huge.png"
    path.write_bytes(png_header_only(3000, 2000))  # decoding would fail (data missing)
    with pytest.raises(ImageReadError, match="truncated|broken|not enough"):
        open_image(path)
    with pytest.raises(ImageTooLargeError, match=r"huge\.png: the image is 3000x2000 pixels; "
                                                 r"at most 1000000 pixels"):
        open_image(path, max_pixels=1_000_000)
    with pytest.raises(ImageTooLargeError, match=r"^inputs\[2\]: the image is 3000x2000"):
        load_image(path.read_bytes(), max_pixels=1_000_000, name="inputs[2]")
    with pytest.raises(ImageTooLargeError, match=r"^inputs\[0\]: the image is 30x20 pixels"):
        load_image(np.zeros((20, 30, 3), np.uint8), max_pixels=100, name="inputs[0]")


def test_decompression_bombs_and_trusted_large_reads(tmp_path):
    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(png_header_only(20_000, 20_000))  # over twice Pillow's limit
    limit = Image.MAX_IMAGE_PIXELS
    with pytest.raises(ImageReadError, match=r"bomb\.png is not an image file.*decompression "
                                             r"bomb"):
        open_image(bomb)
    large = tmp_path / "large.png"
    large.write_bytes(png_header_only(10_000, 10_000))  # over Pillow's limit: a warning
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ImageReadError):
            open_image(large)
    assert any(issubclass(w.category, Image.DecompressionBombWarning) for w in caught)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ImageReadError, match="truncated|broken|not enough"):
            open_image(large, trusted_large=True, max_side=64)
        with pytest.raises(ImageReadError, match="truncated|broken|not enough"):
            open_image(bomb, trusted_large=True, max_side=64)
    assert caught == []
    assert limit == Image.MAX_IMAGE_PIXELS  # restored


# ---------------------------------------------------------------------- CSV / JSON files
def test_csv_rows_with_extra_or_missing_fields(tmp_path):
    extra = tmp_path / "extra.csv"
    extra.write_text("text,label\nfine,a\nI paid, then nothing,b\n")
    with pytest.raises(ValueError, match=r"extra\.csv, line 3: 3 fields where the header has 2; "
                                         r"put double quotes around a text that holds a comma"):
        read_samples(extra)
    short = tmp_path / "short.csv"
    short.write_text("text,label\nfine,a\nno label here\n")
    with pytest.raises(ValueError, match=r"short\.csv, line 3: 1 fields where the header has 2"):
        read_samples(short)
    tsv = tmp_path / "extra.tsv"
    tsv.write_text("text\tlabel\nx\ty\tz\n")
    with pytest.raises(ValueError, match=r"line 2: .*holds a tab"):
        read_samples(tsv)


def test_csv_long_fields_and_csv_errors(tmp_path, monkeypatch):
    long_text = "word " * 60_000  # 300,000 characters: over csv's default field limit
    path = tmp_path / "long.csv"
    path.write_text(f'text,label\n"{long_text}",a\nshort,b\n')
    limit = csv.field_size_limit()
    samples = read_samples(path)
    assert samples.labels == ("a", "b") and samples.load(["0"])[0] == long_text
    assert csv.field_size_limit() == limit  # restored
    import gdacil.learner.data as data  # any other csv.Error: here, a field over the limit

    monkeypatch.setattr(data, "_csv_field_limit", lambda: _field_limit(10))
    with pytest.raises(ValueError, match=r"long\.csv, line 2: not valid CSV \(field larger"):
        read_samples(path)


@contextlib.contextmanager
def _field_limit(n):
    old = csv.field_size_limit(n)
    try:
        yield
    finally:
        csv.field_size_limit(old)


def test_nested_json_and_non_utf8_files(tmp_path):
    nested = tmp_path / "nested.jsonl"
    nested.write_text('{"text": "x", "label": "a"}\n' + "[" * 100_000 + "\n")
    with pytest.raises(ValueError, match=r"nested\.jsonl, line 2: JSON nested too deeply"):
        read_samples(nested)
    listed = tmp_path / "nested.json"
    listed.write_text("[" * 100_000)
    with pytest.raises(ValueError, match=r"nested\.json: JSON nested too deeply"):
        read_samples(listed)
    latin = tmp_path / "latin.csv"
    latin.write_bytes("text,label\nfine,a\ncaf\xe9 au lait,b\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin\.csv, line 3: not UTF-8 text \(byte 0xe9"):
        read_samples(latin)
    jsonl = tmp_path / "latin.jsonl"
    jsonl.write_bytes(b'{"text": "x", "label": "\xff"}\n')
    with pytest.raises(ValueError, match=r"latin\.jsonl, line 1: not UTF-8"):
        read_samples(jsonl)


def test_labels_in_files_are_class_names(tmp_path):
    path = tmp_path / "labels.jsonl"
    path.write_text('{"text": "x", "label": " caf\\u0065\\u0301 "}\n{"text": "y", "label": 3}\n'
                    '{"text": "z", "label": 2.5}\n')
    with pytest.raises(ValueError, match=r"labels\.jsonl, line 3: a class name must be a string "
                                         r"or an integer; got float 2.5"):
        read_samples(path)
    path.write_text('{"text": "x", "label": " caf\\u0065\\u0301 "}\n{"text": "y", "label": 3}\n')
    assert read_samples(path).labels == ("caf\u00e9", "3")


# ---------------------------------------------------------------------- class names and texts
@pytest.mark.parametrize("value, message", [
    (None, "got NoneType None"), (float("nan"), "got float nan"), (1.0, "got float 1.0"),
    (b"a", "got bytes b'a'"), (True, "got bool True"), (np.bool_(True), "got bool"),
    ("\ud800", "lone surrogate"), ("a\x00b", "control character"), ("a\nb", "control"),
    ("   ", "empty label"), ("x" * 201, "201 characters long"), (["a"], "got list"),
])
def test_class_name_refuses(value, message):
    with pytest.raises(ValueError, match=rf"^labels\[3\]: .*{message}") as exc_info:
        class_name(value, "labels[3]")
    one_line(exc_info)


def test_class_name_accepts_and_normalises():
    nfd = unicodedata.normalize("NFD", "café")
    assert nfd != "café" and class_name(nfd, "x") == class_name(" café ", "x") == "café"
    assert class_name(1, "x") == class_name(np.int64(1), "x") == class_name(np.uint8(1), "x") == "1"
    assert class_name("x" * 200, "x") == "x" * 200
    with pytest.raises(ValueError, match=r"^labels\[1\]: .*got NoneType"):
        read_samples(["a", "b"], ["x", None])


def test_load_texts_names_the_index():
    assert load_texts(["a", "b"]) == ["a", "b"]
    with pytest.raises(ValueError, match=r"^inputs\[1\]: this model classifies texts; got a "
                                         r"bytes"):
        load_texts(["a", b"b"])


@needs_transformers
@needs_minilm
def test_minilm_one_class_per_spelling_and_the_text_bound():
    learner = Learner("minilm")
    nfc, nfd = "café", unicodedata.normalize("NFD", "café")
    report = learner.learn(["an espresso", "a latte", "a bus", "a tram"], [nfc, nfd, "bus", "bus"])
    assert set(report.new) == {"bus", "café"} and learner.class_counts() == {"bus": 2, "café": 2}
    assert learner.forget([nfd]) == ["café"] and set(learner.class_counts()) == {"bus"}
    backbone = learner.backbone
    assert backbone.max_chars == backbone.max_length * 100
    assert "max_chars" not in str(backbone.extraction_config())
    words = " ".join(f"word{i % 97} hello" for i in range(8000))  # ~90,000 characters
    assert len(words) > backbone.max_chars
    unclipped = backbone.tokenizer([words], truncation=True, max_length=backbone.max_length)
    assert backbone.preprocess([words])["input_ids"][0].tolist() == unclipped["input_ids"][0]
    huge = ("a few words of text " * (10 * 2**20 // 20 + 1))[: 10 * 2**20]  # 10 MiB
    start = time.perf_counter()
    backbone.preprocess([huge])
    assert time.perf_counter() - start < 1.0  # milliseconds in practice, not seconds
    features = learner._features([huge, huge[: backbone.max_chars]])
    assert torch.equal(features[0], features[1])
