"""Vectors models: ``Learner("vectors")`` and ``gdacil learn/predict/calibrate/forget`` on Parquet,
``.npz``, CSV and JSONL files of vectors, checked against ``gdacil.sklearn.LRRGDAClassifier``;
every bad input's one-line error (file, row, column) and that a refused learn changes nothing;
``POST /predict`` with vectors on a real server; statistics in and out (two sites merged equal
one place); the README's vectors lines."""

from __future__ import annotations

import json
import re
import shlex

import numpy as np
import pytest
import torch
from test_learner_cli import README, fails, ok

from gdacil.learner import Learner, versions
from gdacil.sklearn import LRRGDAClassifier

from _assets import needs_serve

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

DIM = 12


def blobs(classes, n: int, seed: int, dim: int = DIM, spread: float = 1.6):
    """``n`` vectors of each class (class ``c`` centred on ``spread * e_c``, overlapping),
    float64, and their labels ``"k<c>"``."""
    rng = np.random.default_rng(seed)
    X = np.concatenate([rng.normal(size=(n, dim)) + spread * np.eye(dim)[c] for c in classes])
    return X, [f"k{c}" for c in classes for _ in range(n)]


def write_parquet(path, X, y, *, fixed: bool = False, column: str = "vector"):
    values = (pa.FixedSizeListArray.from_arrays(pa.array(X.ravel()), X.shape[1]) if fixed
              else pa.array([list(r) for r in X], type=pa.list_(pa.float64())))
    pq.write_table(pa.table({column: values, "label": y}), path)
    return path


def write_records(path, X, y):
    if path.suffix == ".csv":
        lines = ["vector,label"] + [f'"{json.dumps(list(r))}",{c}' for r, c in zip(X, y)]
    else:
        lines = [json.dumps({"vector": list(r), "label": c}) for r, c in zip(X, y)]
    path.write_text("\n".join(lines) + "\n")
    return path


def predicted(capsys, model, data) -> list[str]:
    out = json.loads(ok(capsys, "predict", model, "--data", data))
    return [p["predictions"][0]["class"] for p in out]


def test_learns_over_several_commands_predict_what_lrrgda_classifier_predicts(tmp_path, capsys):
    tasks = [blobs([0, 1, 2], 30, seed=1), blobs([3, 4], 30, seed=2), blobs([1, 5, 6], 25, 3)]
    files = [write_parquet(tmp_path / "a.parquet", *tasks[0]),
             tmp_path / "b.npz", write_records(tmp_path / "c.csv", *tasks[2])]
    np.savez(files[1], vector=tasks[1][0], label=np.array(tasks[1][1]))
    clf = LRRGDAClassifier()
    for path, (X, y) in zip(files, tasks):
        ok(capsys, "learn", tmp_path / "model", "--data", path)
        clf.partial_fit(X, y)
    test, truth = blobs(range(7), 40, seed=9)
    query = write_parquet(tmp_path / "query.parquet", test, truth)
    mine = predicted(capsys, tmp_path / "model", query)
    assert mine == clf.predict(test).tolist()
    assert 0.4 < np.mean(np.array(mine) == truth) < 0.9  # classes overlap: the head matters
    learner = Learner.load(tmp_path / "model")
    assert learner.info()["backbone"] == {"name": "vectors", "options": {"dim": DIM},
                                          "modality": "vector", "dim": DIM}
    assert learner.class_counts()["k1"] == 55
    scores = [p.scores[0] for p in learner.predict(test)]
    reference = clf.decision_function(test).max(axis=1)
    np.testing.assert_allclose(scores, reference, rtol=1e-9, atol=1e-9)


def test_every_format_gives_the_same_statistics(tmp_path):
    X, y = blobs([0, 1, 2], 20, seed=4)
    np.savez(tmp_path / "v.npz", vector=X, label=np.array(y))
    files = [write_parquet(tmp_path / "list.parquet", X, y),
             write_parquet(tmp_path / "fixed.parquet", X, y, fixed=True), tmp_path / "v.npz",
             write_records(tmp_path / "v.csv", X, y), write_records(tmp_path / "v.jsonl", X, y)]
    reference = Learner("vectors")
    reference.learn(X, y)
    for path in files:
        learner = Learner("vectors")
        learner.learn(path)
        assert learner.classes == reference.classes, path
        torch.testing.assert_close(learner.statistics.scatters, reference.statistics.scatters,
                                   rtol=1e-12, atol=1e-12)
        assert learner.calibration.n_records == reference.calibration.n_records == 60


def test_a_table_larger_than_a_chunk_streams_to_the_same_model(tmp_path, monkeypatch):
    from gdacil.learner import vectors

    X, y = blobs([0, 1, 2, 3], 50, seed=5)
    path = write_parquet(tmp_path / "v.parquet", X, y)
    whole = Learner("vectors")
    whole.learn(path)
    monkeypatch.setattr(vectors, "CHUNK_ROWS", 7)  # many chunks, classes spread over them
    monkeypatch.setattr(vectors.VectorTable.chunks, "__defaults__", (0, None, 7))
    chunked = Learner("vectors")
    chunked.learn(path)
    assert chunked.classes == whole.classes
    torch.testing.assert_close(chunked.statistics.scatters, whole.statistics.scatters,
                               rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(chunked.calibration.novelty_, whole.calibration.novelty_,
                               rtol=1e-9, atol=1e-9)


def bad_files(tmp_path):
    """``(name, write(path), the error's expected part)`` of each bad vectors file."""
    X, y = blobs([0, 1], 5, seed=6)

    def parquet(table):
        return lambda p: pq.write_table(pa.table(table), p)

    nan = X.copy()
    nan[3, 2] = np.nan
    inf = X.copy()
    inf[7, 0] = np.inf
    ragged = [list(r) for r in X]
    ragged[4] = ragged[4][:-1]
    return [
        ("dim.parquet", lambda p: write_parquet(p, np.ones((4, DIM + 1)), ["k0"] * 4),
         "dim.parquet: vectors of 13 numbers (column 'vector'), but this model takes 12-d"),
        ("nan.parquet", lambda p: write_parquet(p, nan, y),
         "nan.parquet, row 4, column 'vector': element 2 is nan"),
        ("inf.npz", lambda p: np.savez(p, vector=inf, label=np.array(y)),
         "inf.npz, row 8, column 'vector': element 0 is inf"),
        ("ragged.parquet", parquet({"vector": pa.array(ragged), "label": y}),
         "ragged.parquet, row 5, column 'vector': 11 numbers where row 1 has 12"),
        ("strings.parquet", parquet({"vector": pa.array([[str(v) for v in r] for r in X]),
                                     "label": y}),
         "strings.parquet, column 'vector': holds lists of strings, not numbers"),
        ("text.csv", lambda p: p.write_text('vector,label\n"[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, '
                                            '12]",k0\n"[1, 2, ""x"", 4]",k0\n'),
         "text.csv, line 3, column 'vector': element 2 is str 'x', not a number"),
        ("nocolumn.parquet", parquet({"embedding": pa.array([list(r) for r in X]), "label": y}),
         "nocolumn.parquet has no column 'vector' (its columns: 'embedding', 'label'); name "
         "the vector column with --vector-column"),
        ("nolabel.parquet", parquet({"vector": pa.array([list(r) for r in X]),
                                     "label": ["k0"] * 3 + [None] + ["k1"] * 6}),
         "nolabel.parquet, row 4, column 'label': no label"),
        ("float.npz", lambda p: np.savez(p, vector=X, label=np.arange(10) / 2),
         "float.npz, row 1, column 'label': a class name must be a string or an integer"),
    ]


def test_bad_vectors_are_refused_in_one_line_naming_file_row_and_column(tmp_path, capsys):
    model = tmp_path / "model"
    ok(capsys, "learn", model, "--data", write_parquet(tmp_path / "good.parquet",
                                                        *blobs([0, 1], 10, seed=7)))
    before = sorted(p.name for p in model.rglob("*"))
    for name, write, expected in bad_files(tmp_path):
        write(tmp_path / name)
        line = fails(capsys, "learn", model, "--data", tmp_path / name)
        assert expected in line, (name, line)
        assert str(tmp_path / name).split(name)[0] in line  # the file's full path
    assert sorted(p.name for p in model.rglob("*")) == before  # nothing was written
    assert [v.name for v in versions(model)] == ["v1"]
    learner = Learner.load(model)
    assert learner.class_counts() == {"k0": 10, "k1": 10}


def test_bad_in_memory_vectors_name_the_input():
    learner = Learner("vectors")
    learner.learn(*blobs([0, 1], 10, seed=8))
    before = learner.statistics.copy()
    for inputs, expected in [([[1.0] * DIM, [1.0] * 3], "inputs[1]: 3 numbers where inputs[0]"),
                             ([[1.0] * (DIM - 1) + [float("nan")]], "inputs[0]: element 11 is nan"),
                             ([["a"] * DIM], "inputs[0]: element 0 is str 'a', not a number"),
                             ([[1.0] * 5], "inputs[0]: a vector of 5 numbers, but this model "
                                           "takes 12-d vectors")]:
        with pytest.raises(ValueError) as info:
            learner.predict(inputs)
        assert str(info.value).startswith(expected), info.value
    with pytest.raises(ValueError, match="inputs given: vectors of 3 numbers, but this model"):
        learner.learn(np.ones((4, 3)), ["k2"] * 4)
    torch.testing.assert_close(learner.statistics.scatters, before.scatters, rtol=0, atol=0)
    assert learner.predict([1.0] * DIM)[0].label in ("k0", "k1")  # one vector: one answer


def test_calibrate_forget_versions_and_rollback_of_a_vectors_model(tmp_path, capsys):
    model = tmp_path / "model"
    ok(capsys, "learn", model, "--data", write_parquet(tmp_path / "a.parquet",
                                                        *blobs([0, 1, 2], 30, seed=10)))
    ok(capsys, "forget", model, "--class", "k2")
    assert Learner.load(model).calibration is None  # every record was scored with k2 held
    held_out = write_parquet(tmp_path / "held.parquet", *blobs([0, 1], 20, seed=11))
    assert "calibrated on 40 samples" in ok(capsys, "calibrate", model, "--data", held_out)
    learner = Learner.load(model)
    assert learner.classes == ["k0", "k1"] and learner.calibration.n_records == 40
    answer = json.loads(ok(capsys, "predict", model, "[1.6, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]",
                           "--reject", "--sets", "0.2"))
    assert answer[0]["predictions"][0]["class"] == "k0" and "unknown" in answer[0]
    assert answer[0]["threshold"] == learner.rejection_threshold()
    assert [v.name for v in versions(model)] == ["v1", "v2", "v3"]
    ok(capsys, "rollback", model, "v1")
    assert Learner.load(model).classes == ["k0", "k1", "k2"]
    text = tmp_path / "texts.csv"
    text.write_text("text,label\nhello,a\n")
    assert "'vector'" in fails(capsys, "calibrate", model, "--data", text)


def test_a_text_model_refuses_vectors_files(tmp_path, capsys):
    path = write_parquet(tmp_path / "v.parquet", *blobs([0], 3, seed=1))
    learner = Learner("minilm")
    with pytest.raises(ValueError, match="holds vectors, but this model's backbone 'minilm' "
                                         "takes texts"):
        learner.learn(path)


# ---------------------------------------------------------------------- statistics in and out
def test_two_sites_statistics_merged_equal_learning_all_their_samples_in_one_place(tmp_path):
    site_a, site_b = blobs([0, 1, 2], 40, seed=12), blobs([1, 2, 3], 35, seed=13)
    here = Learner("vectors")
    here.learn(np.concatenate([site_a[0], site_b[0]]), site_a[1] + site_b[1])
    merged = Learner("vectors")
    for k, (X, y) in enumerate((site_a, site_b)):
        site = Learner("vectors")
        site.learn(X, y)
        site.export_statistics(tmp_path / f"site{k}.safetensors")
        report = merged.learn_statistics(tmp_path / f"site{k}.safetensors")
        assert report.samples == len(y)
    assert merged.classes == here.classes and merged.class_counts() == here.class_counts()
    a, b = merged.statistics, here.statistics
    for x, z in ((a.counts, b.counts), (a.means, b.means), (a.scatters, b.scatters)):
        assert x.dtype == torch.float64
        assert float((x - z).abs().max() / z.abs().max()) < 1e-10
    test = blobs(range(4), 20, seed=14)[0]
    D, E = (m.head.decision_function(torch.from_numpy(test)) for m in (merged, here))
    assert float((D - E).abs().max() / E.abs().max()) < 1e-10
    assert [p.label for p in merged.predict(test)] == [p.label for p in here.predict(test)]
    assert merged.calibration is None  # statistics carry no samples to calibrate on


def test_statistics_through_the_commands_and_what_is_refused(tmp_path, capsys):
    X, y = blobs([0, 1], 20, seed=15)
    ok(capsys, "learn", tmp_path / "site", "--data", write_parquet(tmp_path / "a.parquet", X, y))
    out = ok(capsys, "export-statistics", tmp_path / "site", tmp_path / "s.safetensors")
    assert "the statistics of 2 classes (40 samples)" in out
    ok(capsys, "learn", tmp_path / "hub", "--data",
       write_parquet(tmp_path / "b.parquet", *blobs([2, 3], 20, seed=16)))
    out = ok(capsys, "learn", tmp_path / "hub", "--statistics", tmp_path / "s.safetensors")
    assert "learned 40 samples of 2 classes (2 new, 0 updated)" in out
    hub = Learner.load(tmp_path / "hub")
    assert hub.classes == ["k2", "k3", "k0", "k1"]
    assert hub.calibration is not None  # the learn of b.parquet's calibration stays
    assert versions(tmp_path / "hub")[-1].summary["events"][0]["statistics"] is True
    from gdacil import ClassGaussians

    other = ClassGaussians(DIM + 1).update(torch.randn(6, DIM + 1), torch.tensor([0] * 6))
    other.save(tmp_path / "wide.safetensors")
    line = fails(capsys, "learn", tmp_path / "hub", "--statistics", tmp_path / "wide.safetensors")
    assert "wide.safetensors: statistics of 13-d features, but this model's are 12-d" in line
    ClassGaussians(DIM, ddof=1).update(torch.randn(6, DIM), torch.tensor([0] * 6)).save(
        tmp_path / "ddof.safetensors")
    assert "ddof=1, but this model keeps ddof=0" in fails(
        capsys, "learn", tmp_path / "hub", "--statistics", tmp_path / "ddof.safetensors")
    assert [v.name for v in versions(tmp_path / "hub")] == ["v1", "v2"]
    plain = Learner("vectors")
    plain.learn_statistics(ClassGaussians(DIM).update(torch.randn(6, DIM), torch.tensor([7] * 6)))
    assert plain.classes == ["7"]


# ---------------------------------------------------------------------- over HTTP
@needs_serve
def test_predict_vectors_over_http_equals_the_learner(tmp_path):
    from test_learner_serve import call, running

    from gdacil.learner.serve import ModelService

    learner = Learner("vectors")
    learner.learn(*blobs([0, 1, 2], 30, seed=17))
    learner.save(tmp_path / "model")
    test = blobs([0, 1, 2], 3, seed=18)[0].tolist()
    with ModelService(tmp_path / "model", poll=0, allow_learn=True) as service, \
            running(service) as url:
        status, answer = call(url, "/predict", {"inputs": test, "top_k": 2, "reject": True,
                                                "sets": 0.2})
        assert status == 200
        mine = learner.predict(test, top_k=2, reject=True, sets=0.2)
        assert answer["predictions"] == [p.to_list() for p in mine]
        assert answer["unknown"] == [p.unknown for p in mine]
        assert answer["sets"] == [list(p.prediction_set) for p in mine]
        for inputs, expected in [([[1.0] * 5], "inputs[0]: a vector of 5 numbers"),
                                 ([[1.0] * DIM, "abc"], "inputs[1]: a vector must be a list"),
                                 ([[1.0] * (DIM - 1) + [None]], "inputs[0]: element 11 is "
                                                                "NoneType None, not a number"),
                                 ([[1.0] * DIM, [1.0] * (DIM + 1)], "inputs[1]: 13 numbers")]:
            status, error = call(url, "/predict", {"inputs": inputs})
            assert status == 400 and error["error"].startswith(expected), error
        status, done = call(url, "/learn", {"inputs": [[0.0] * (DIM - 1) + [5.0]] * 4,
                                            "labels": ["k11"] * 4})
        assert status == 200 and done["new"] == ["k11"]


def readme_vectors_lines() -> list[str]:
    blocks = re.findall(r"```sh\n(gdacil learn embeddings-model .*?)```",
                        README.read_text(encoding="utf-8"), re.S)
    assert len(blocks) == 1, "the README's vectors example is missing"
    return [line for line in blocks[0].splitlines() if line.strip()]


@needs_serve
def test_the_readme_vectors_lines_work(tmp_path, monkeypatch, capsys):
    from test_learner_serve import readme_curl_answer

    monkeypatch.chdir(tmp_path)
    learn, serve, curl = readme_vectors_lines()
    X, y = blobs([0, 1, 2], 40, seed=19, dim=4, spread=3.0)
    write_parquet(tmp_path / "embeddings.parquet", X, y)
    ok(capsys, *shlex.split(learn)[1:])
    answer = readme_curl_answer(serve, curl)
    assert answer["unknown"] == [False, True]  # what the README says
    assert answer["predictions"][0][0]["class"] == "k0"
