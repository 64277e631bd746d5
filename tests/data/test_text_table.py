"""Text tables: labelled texts in .tsv files, their presets, and scripts/text_tables.py."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from gdacil.data import DATASETS, TEXT_TABLE_PRESETS, DataNotFoundError, TextTable, build_dataset
from gdacil.hashing import sha256_sample

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "text_tables.py"


def _script():
    spec = importlib.util.spec_from_file_location("text_tables_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _table(path: Path, rows, header: str = "label\ttext") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{line}\n" for line in [header, *rows]), encoding="utf-8")
    return path


def _split_tables(root: Path) -> Path:
    _table(root / "train.tsv", ["greet\thello there", "bye\tsee you", "greet\thi"])
    _table(root / "test.tsv", ["bye\tgood night", "thanks\tthank you"])
    return root


# ---------------------------------------------------------------- the dataset


def test_train_and_test_tables_give_the_official_split(tmp_path):
    ds = TextTable(_split_tables(tmp_path))
    assert (ds.name, ds.modality, ds.splits) == ("text-table", "text", ("train", "test"))
    assert ds.classes == ("bye", "greet", "thanks")  # sorted, across both files
    train, test = ds.index("train"), ds.index("test")
    assert train.ids == ("train:2", "train:3", "train:4")  # line numbers: the header is line 1
    assert train.labels.tolist() == [1, 0, 1]
    assert (test.ids, test.labels.tolist()) == (("test:2", "test:3"), [0, 2])
    assert ds.load(["test:3", "train:2"]) == ["thank you", "hello there"]
    assert ds.config() == {}
    with pytest.raises(ValueError, match="splits train, test; got 'all'"):
        ds.index("all")


def test_all_table_alone_gives_one_split_and_ids_round_trip(tmp_path):
    _table(tmp_path / "all.tsv", ["b\tsecond class", "a\tfirst class", "b\tmore of b"])
    ds = TextTable(tmp_path)
    assert ds.splits == ("all",) and ds.classes == ("a", "b")
    index = ds.index("all")
    texts = ds.load(index.ids)
    assert texts == ["second class", "first class", "more of b"]
    assert [ds.classes[label] for label in index.labels] == ["b", "a", "b"]
    with pytest.raises(KeyError, match=r"not a text-table sample id: 'all:1' \(expected"):
        ds.load(["all:1"])  # the header line


def test_content_hashes_are_the_sha256_of_each_text(tmp_path):
    ds = TextTable(_split_tables(tmp_path))
    ids = [*ds.index("test").ids, *ds.index("train").ids]
    assert ds.content_hashes(ids) == [sha256_sample(text) for text in ds.load(ids)]
    assert ds.content_hashes(["train:3"]) == [sha256_sample("see you")]


def test_the_identity_follows_the_listing(tmp_path):
    first = TextTable(_split_tables(tmp_path)).identity()
    _table(tmp_path / "test.tsv", ["bye\tgood night", "greet\tthank you"])
    assert TextTable(tmp_path).identity()["listing_sha256"] != first["listing_sha256"]


@pytest.mark.parametrize("files, found", [
    ((), r"found none\. Write them"),
    (("train.tsv",), r"found train\.tsv\. Write them"),
    (("all.tsv", "test.tsv"), r"found all\.tsv, test\.tsv\. Write"),
    (("all.tsv", "test.tsv", "train.tsv"), r"found all\.tsv, test\.tsv, train\.tsv\."),
])
def test_missing_or_mixed_tables_name_the_files_and_the_fix(tmp_path, files, found):
    for name in files:
        _table(tmp_path / name, ["a\tsome text"])
    with pytest.raises(DataNotFoundError, match=found) as err:
        TextTable(tmp_path)
    message = str(err.value)
    for name in ("train.tsv", "test.tsv", "all.tsv"):
        assert str(tmp_path / name) in message
    assert "Write them (see gdacil.data.text_table) or pass root=" in message


def test_a_missing_preset_says_how_to_build_it(tmp_path):
    with pytest.raises(DataNotFoundError) as err:
        TextTable(tmp_path / "b77", name="banking77")
    message = str(err.value)
    assert "banking77 not found" in message and "BANKING77 (Casanueva et al., 2020" in message
    assert f"python scripts/text_tables.py banking77 SOURCE {tmp_path / 'b77'}" in message


@pytest.mark.parametrize("lines, line, problem", [
    (["bye\tok", "no tab here"], 3, "no tab between label and text"),
    (["bye\tok", "a\tb\tc"], 3, "more than one tab"),
    (["\tan orphan text"], 2, "an empty label"),
    (["bye\t  "], 2, "an empty text"),
    (["bye\tok", "label\ttext"], 3, r"the header again \(two files joined\?\)"),
    (["bye\tok", ""], 3, "no tab between label and text"),  # a blank line
])
def test_malformed_rows_name_file_and_line(tmp_path, lines, line, problem):
    path = _table(tmp_path / "all.tsv", lines)
    with pytest.raises(ValueError, match=f"{path}:{line}: {problem}"):
        TextTable(tmp_path)


@pytest.mark.parametrize("header", ["text\tlabel", "label,text", "bye\tok"])
def test_a_wrong_or_missing_header_names_file_and_line(tmp_path, header):
    path = _table(tmp_path / "all.tsv", ["bye\tok"], header=header)
    with pytest.raises(ValueError, match=f"{path}:1: expected the header 'label<TAB>text'"):
        TextTable(tmp_path)


def test_other_unreadable_tables(tmp_path):
    path = _table(tmp_path / "all.tsv", [])
    with pytest.raises(ValueError, match=f"{path} has a header but no samples"):
        TextTable(tmp_path)
    path.write_bytes(b"label\ttext\nbye\tok\nbye\tcaf\xe9\n")  # Latin-1, not UTF-8
    with pytest.raises(ValueError, match=f"{path}:3: not UTF-8"):
        TextTable(tmp_path)
    path.write_bytes(b"label\ttext\r\nbye\tok\r\n")  # Windows line ends are read as well
    assert TextTable(tmp_path).load(["all:2"]) == ["ok"]


def test_presets_are_registered_and_find_their_root_through_gdacil_data(tmp_path, monkeypatch):
    assert {"text-table", *TEXT_TABLE_PRESETS} <= set(DATASETS)
    assert set(TEXT_TABLE_PRESETS) == {"banking77", "clinc150", "hwu64", "stackoverflow20"}
    assert all(p["source"] and "\n" not in p["source"] for p in TEXT_TABLE_PRESETS.values())
    monkeypatch.setenv("GDACIL_DATA", str(tmp_path))
    _split_tables(tmp_path / "clinc150")
    with pytest.warns(UserWarning, match="clinc150: found 3 classes in .*, expected 150"):
        ds = build_dataset("clinc150")
    assert isinstance(ds, TextTable)
    assert (ds.name, ds.root, ds.classes) == ("clinc150", tmp_path / "clinc150",
                                              ("bye", "greet", "thanks"))
    assert ds.identity()["name"] == "clinc150"
    _split_tables(tmp_path / "text-table")
    assert TextTable().root == tmp_path / "text-table"  # what build_dataset("text-table") calls
    assert build_dataset("text-table").classes == ("bye", "greet", "thanks")
    with pytest.raises(DataNotFoundError, match=str(tmp_path / "hwu64" / "all.tsv")):
        build_dataset("hwu64")


# ---------------------------------------------------------------- scripts/text_tables.py


def _convert(preset: str, source: Path, out: Path) -> TextTable:
    lines = _script().convert(preset, source, out)
    assert lines and all("samples" in line for line in lines if "share" not in line)
    with pytest.warns(UserWarning, match="classes"):  # a tiny source has too few classes
        return TextTable(out, name=preset)


def _texts(ds: TextTable, split: str) -> list[tuple[str, str]]:
    index = ds.index(split)
    return [(ds.classes[label], text) for label, text in zip(index.labels, ds.load(index.ids))]


def test_every_preset_has_a_converter():
    assert set(_script().CONVERTERS) == set(TEXT_TABLE_PRESETS)


def test_banking77_conversion(tmp_path):
    data = tmp_path / "src" / "banking_data"
    data.mkdir(parents=True)
    (data / "train.csv").write_text(
        'text,category\nI am still waiting on my card?,card_arrival\n'
        '"Where is\tmy  card,\nplease?",card_arrival\nI am still waiting on my card?,card_arrival\n'
        '"   ",card_arrival\nMy card was stolen,lost_or_stolen_card\n', encoding="utf-8")
    (data / "test.csv").write_text("text,category\nwhen will my card come?,card_arrival\n",
                                   encoding="utf-8")
    ds = _convert("banking77", tmp_path / "src", tmp_path / "out")
    assert ds.splits == ("train", "test")
    assert _texts(ds, "train") == [  # whitespace collapsed; the repeat and the empty text gone
        ("card_arrival", "I am still waiting on my card?"),
        ("card_arrival", "Where is my card, please?"),
        ("lost_or_stolen_card", "My card was stolen"),
    ]
    assert _texts(ds, "test") == [("card_arrival", "when will my card come?")]


def test_clinc150_conversion_merges_val_into_train_and_drops_out_of_scope(tmp_path):
    source = tmp_path / "data_full.json"
    source.write_text(json.dumps({
        "train": [["what is my balance", "balance"], ["book a  flight", "book_flight"],
                  ["what is my balance", "balance"], ["tell me a joke", "oos"]],
        "val": [["how much money do i have", "balance"]],
        "test": [["fly me to rome", "book_flight"]],
        "oos_train": [["who won the game", "oos"]],
        "oos_val": [], "oos_test": [["a show on broadway", "oos"]],
    }), encoding="utf-8")
    ds = _convert("clinc150", source, tmp_path / "out")
    assert ds.classes == ("balance", "book_flight")
    assert _texts(ds, "train") == [("balance", "what is my balance"),
                                   ("book_flight", "book a flight"),
                                   ("balance", "how much money do i have")]
    assert _texts(ds, "test") == [("book_flight", "fly me to rome")]


def _hwu_fold(root: Path, fold: int, rows: list[str], name: str = "alarm_set.csv") -> None:
    folder = root / "CrossValidation" / "auto" / f"KFold_{fold}" / "testset" / "csv"
    folder.mkdir(parents=True, exist_ok=True)
    header = "answerid;scenario;intent;answer_annotation;answer_from_anno;answer_from_user"
    (folder / name).write_text("".join(f"{r}\n" for r in [header, *rows]), encoding="utf-8")


def test_hwu64_conversion_reads_the_ten_folds(tmp_path):
    for fold in range(1, 11):
        _hwu_fold(tmp_path / "src", fold, [f'{fold};alarm;set;"wake me at [time : {fold}]";'
                                           f'"wake me at  {fold}";"Wake me <at> {fold}"'])
    _hwu_fold(tmp_path / "src", 2, ['1;alarm;set;"x";"wake me at 1";"x"',  # a repeat
                                    '2;iot;hue_lightoff;"lights off";"lights; off";"x"'], "iot.csv")
    ds = _convert("hwu64", tmp_path / "src", tmp_path / "out")
    assert ds.splits == ("all",) and ds.classes == ("alarm_set", "iot_hue_lightoff")
    assert _texts(ds, "all") == [  # folds in numeric order, the plain utterance
        ("alarm_set", "wake me at 1"), ("alarm_set", "wake me at 2"),
        ("iot_hue_lightoff", "lights; off"),
        *(("alarm_set", f"wake me at {fold}") for fold in range(3, 11)),
    ]


def test_stackoverflow20_conversion_names_labels_by_tag(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    (source / "title_StackOverflow.txt").write_text(
        "How do I page with LINQ?\nBest  SVN client\nHow do I page with LINQ?\nbash \x0cloops\n",
        encoding="utf-8")  # a form feed is whitespace inside a title, not a line break
    (source / "label_StackOverflow.txt").write_text("18\n3\n18\n10\n", encoding="utf-8")
    ds = _convert("stackoverflow20", source, tmp_path / "out")
    assert _texts(ds, "all") == [("linq", "How do I page with LINQ?"), ("svn", "Best SVN client"),
                                 ("bash", "bash loops")]
    script = _script()
    assert len(script.STACKOVERFLOW_TAGS) == 20 and script.STACKOVERFLOW_TAGS[19] == "magento"
    (source / "label_StackOverflow.txt").write_text("18\n3\n21\n10\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"label_StackOverflow.txt:3: expected a label 1..20"):
        script.convert("stackoverflow20", source, tmp_path / "out")


@pytest.mark.parametrize("preset, source, missing", [
    ("banking77", "", "banking_data/train.csv does not exist"),
    ("clinc150", "data_full.json", "data_full.json does not exist"),
    ("hwu64", "", "expected KFold_1 .. KFold_10/testset/csv/.*found no such files"),
    ("stackoverflow20", "", "title_StackOverflow.txt does not exist"),
])
def test_the_script_refuses_a_source_without_the_expected_files(tmp_path, preset, source,
                                                               missing):
    script = _script()
    with pytest.raises(DataNotFoundError, match=missing) as err:
        script.convert(preset, tmp_path / source, tmp_path / "out")
    assert "Expected as SOURCE:" in str(err.value)
    assert not (tmp_path / "out").exists()


def test_the_script_refuses_incomplete_hwu64_folds(tmp_path):
    for fold in (1, 2):
        _hwu_fold(tmp_path, fold, ['1;alarm;set;"x";"wake me";"x"'])
    with pytest.raises(DataNotFoundError, match=r"found folds \[1, 2\]"):
        _script().convert("hwu64", tmp_path, tmp_path / "out")


def test_the_script_command_line(tmp_path, capsys):
    source = tmp_path / "src"
    source.mkdir()
    (source / "title_StackOverflow.txt").write_text("a\nb\nc\n", encoding="utf-8")
    (source / "label_StackOverflow.txt").write_text("1\n1\n2\n", encoding="utf-8")
    script = _script()
    assert script.main(["stackoverflow20", str(source), str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "all: 3 samples, 2 classes, per class min 1 / median 1.5 / max 2; dropped none" in out
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["all.tsv"]  # no temp files
    assert script.main(["banking77", str(tmp_path), str(tmp_path / "out")]) == 1
    assert "error: banking77 source file not found" in capsys.readouterr().err


def test_the_script_refuses_to_mix_layouts(tmp_path):
    script = _script()
    _table(tmp_path / "out" / "all.tsv", ["a\tb"])
    with pytest.raises(FileExistsError, match="out holds all.tsv of another layout; remove it"):
        script.write_tables({"train": [("a", "b")], "test": [("a", "c")]}, tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["all.tsv"]
    script.write_tables({"all": [("a", "c")]}, tmp_path / "out")  # the same layout: replaced
    assert (tmp_path / "out" / "all.tsv").read_text(encoding="utf-8") == "label\ttext\na\tc\n"
