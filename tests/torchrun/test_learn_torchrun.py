"""``gdacil learn`` under torchrun (2 gloo CPU processes): each process reads (or extracts) its
share of the samples, the statistics are merged exactly, rank 0 writes one version, and the model
equals a one-process learn of the same files."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from test_distributed import relative_error, torchrun

from gdacil.learner import Learner, versions

from _assets import TINY_VIT, needs_transformers

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def vectors_file(path, classes, n: int, seed: int, dim: int = 10):
    rng = np.random.default_rng(seed)
    X = np.concatenate([rng.normal(size=(n, dim)) + 1.5 * np.eye(dim)[c] for c in classes])
    order = rng.permutation(len(X))  # classes spread over both processes' shares
    labels = [f"k{c}" for c in classes for _ in range(n)]
    pq.write_table(pa.table({"vector": pa.array([list(r) for r in X[order]]),
                             "label": [labels[i] for i in order]}), path)
    return path, X[order]


def assert_same_model(two: Learner, one: Learner, tolerance: float) -> None:
    assert two.classes == one.classes and two.class_counts() == one.class_counts()
    a, b = two.statistics, one.statistics
    for x, z in ((a.means, b.means), (a.scatters, b.scatters)):
        assert relative_error(x, z) < tolerance
    assert two.calibration.n_records == one.calibration.n_records
    torch.testing.assert_close(two.calibration.novelty_, one.calibration.novelty_,
                               rtol=tolerance * 10, atol=tolerance * 10)


def test_torchrun_learn_of_vectors_equals_one_process(tmp_path):
    first, _ = vectors_file(tmp_path / "a.parquet", [0, 1, 2, 3], 37, seed=1)
    second, X = vectors_file(tmp_path / "b.parquet", [2, 4, 5], 31, seed=2)
    for path in (first, second):
        output = torchrun("-m", "gdacil", "learn", str(tmp_path / "two"), "--data", str(path),
                          cwd=tmp_path)
        assert output.count("learned ") == 1, output  # only rank 0 saves and prints
        one = Learner("vectors") if path == first else Learner.load(tmp_path / "one")
        one.learn(path)
        one.save(tmp_path / "one")
    assert [v.name for v in versions(tmp_path / "two")] == ["v1", "v2"]
    two, one = Learner.load(tmp_path / "two"), Learner.load(tmp_path / "one")
    assert_same_model(two, one, 1e-10)
    assert [p.label for p in two.predict(X)] == [p.label for p in one.predict(X)]


@needs_transformers
def test_torchrun_learn_of_images_shards_extraction_like_gdacil_run(tmp_path):
    from test_learner import image_folder

    image_folder(tmp_path / "images", ["red", "green", "blue"], 5)
    tiny = ["--backbone", "vit", "--backbone-option", f"config={json.dumps(TINY_VIT)}",
            "--head-param", "rank=8"]
    torchrun("-m", "gdacil", "learn", str(tmp_path / "two"), "--data",
             str(tmp_path / "images"), *tiny, cwd=tmp_path)
    from gdacil.cli import main

    assert main(["learn", str(tmp_path / "one"), "--data", str(tmp_path / "images"),
                 *tiny]) == 0
    two, one = Learner.load(tmp_path / "two"), Learner.load(tmp_path / "one")
    assert_same_model(two, one, 1e-5)  # float32 features of batches cut elsewhere
