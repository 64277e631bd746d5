import itertools
import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gdacil import ClassGaussians
from gdacil.io import load_tensors


def make_data(seed=0, n=300, d=6, n_classes=5, offset=1e3):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g, dtype=torch.float64) * 3 + offset
    y = torch.randint(0, n_classes, (n,), generator=g)
    return X, y


def dense_moments(X, y, ddof=0):
    labels = sorted(set(y.tolist()))
    means = torch.stack([X[y == c].mean(0) for c in labels])
    covs = torch.stack([torch.cov(X[y == c].T, correction=ddof) for c in labels])
    return labels, means, covs


def rel_err(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


@pytest.mark.parametrize("ddof", [0, 1])
def test_update_matches_dense_moments(ddof):
    X, y = make_data()
    stats = ClassGaussians(X.shape[1], ddof=ddof)
    for chunk in torch.split(torch.arange(len(y)), 37):
        stats.update(X[chunk], y[chunk])
    labels, means, covs = dense_moments(X, y, ddof)
    pos = stats.positions(labels)
    assert rel_err(stats.means[pos], means) < 1e-12
    assert rel_err(stats.covariances(labels), covs) < 1e-10
    assert stats.counts[pos].tolist() == [float((y == c).sum()) for c in labels]


def test_centred_accumulation_survives_large_offsets():
    # raw sums of squares lose every digit here: values ~1e8 with unit variance
    X, y = make_data(offset=1e8)
    X = (X - 1e8) / 3 + 1e8
    stats = ClassGaussians(X.shape[1])
    for chunk in torch.split(torch.arange(len(y)), 11):
        stats.update(X[chunk], y[chunk])
    labels, _, covs = dense_moments(X - 1e8, y)
    assert rel_err(stats.covariances(labels), covs) < 1e-6


@settings(max_examples=25, deadline=None)
@given(
    cuts=st.lists(st.integers(1, 299), min_size=1, max_size=6, unique=True),
    order_seed=st.integers(0, 10_000),
    ddof=st.sampled_from([0, 1]),
)
def test_merging_shards_in_any_order_equals_the_whole(cuts, order_seed, ddof):
    X, y = make_data(seed=3)
    whole = ClassGaussians(X.shape[1], ddof=ddof).update(X, y)
    bounds = [0, *sorted(cuts), len(y)]
    shards = [
        ClassGaussians(X.shape[1], ddof=ddof).update(X[a:b], y[a:b])
        for a, b in itertools.pairwise(bounds)
    ]
    order = np.random.default_rng(order_seed).permutation(len(shards))
    merged = ClassGaussians(X.shape[1], ddof=ddof)
    for i in order:
        merged.merge(shards[i])
    pos = merged.positions(whole.classes)
    assert rel_err(merged.counts[pos], whole.counts) == 0
    assert rel_err(merged.means[pos], whole.means) < 1e-10
    assert rel_err(merged.scatters[pos], whole.scatters) < 1e-10


def test_from_moments_round_trip_and_merge_weights_by_counts():
    X, y = make_data(seed=1)
    labels, means, covs = dense_moments(X, y, ddof=1)
    counts = [int((y == c).sum()) for c in labels]
    built = ClassGaussians.from_moments(labels, means, covs, counts, ddof=1)
    assert rel_err(built.covariances(labels), covs) < 1e-12
    # merging two copies of the same class: mean unchanged, scatter doubles
    twice = built.copy().merge(built)
    assert rel_err(twice.means, built.means) < 1e-14
    assert rel_err(twice.scatters, 2 * built.scatters) < 1e-12


def test_add_remove_subset_and_revisions():
    X, y = make_data()
    stats = ClassGaussians(X.shape[1]).update(X, y)
    rev = {c: stats.revision(c) for c in stats.classes}
    stats.update(X[y == 2][:3], y[y == 2][:3])
    assert stats.revision(2) != rev[2] and stats.revision(1) == rev[1]
    sub = stats.subset([4, 0])
    assert sub.classes == [4, 0]
    assert torch.equal(sub.means[0], stats.means[stats.positions([4])[0]])
    stats.remove_classes([0, 3])
    assert stats.classes == [1, 2, 4] and 0 not in stats
    with pytest.raises(KeyError, match="unknown class 0"):
        stats.covariance(0)
    stats.add_classes([7], torch.zeros(1, 6), torch.eye(6)[None], [10])
    assert stats.classes[-1] == 7
    with pytest.raises(ValueError, match="already present"):
        stats.add_classes([7], torch.zeros(1, 6), torch.eye(6)[None], [10])


def test_single_sample_class_has_zero_covariance_with_ddof1():
    stats = ClassGaussians(3, ddof=1).update(torch.ones(1, 3), [5])
    assert torch.equal(stats.covariance(5), torch.zeros(3, 3))


@pytest.mark.parametrize(
    "X, y, match",
    [
        (torch.tensor([[1.0, float("nan"), 0.0]]), [0], "NaN or inf"),
        (torch.tensor([[1.0, float("inf"), 0.0]]), [0], "NaN or inf"),
        (torch.zeros(2, 4), [0, 1], "dimension 4, expected 3"),
        (torch.zeros(0, 3), [], "empty batch"),
        (torch.zeros(3), [0], "2-D"),
        (torch.zeros(2, 3), [0], "length 1 but there are 2"),
        (torch.zeros(2, 3), [0.5, 1.0], "integers"),
    ],
)
def test_bad_input_is_refused_and_state_untouched(X, y, match):
    stats = ClassGaussians(3).update(torch.randn(4, 3, generator=torch.Generator().manual_seed(0)),
                                     [0, 0, 1, 1])
    before = stats.scatters.clone()
    with pytest.raises(ValueError, match=match):
        stats.update(X, y)
    assert torch.equal(stats.scatters, before)


def test_sampling_is_seeded_and_has_the_right_moments():
    X, y = make_data(seed=2, d=4, n_classes=2)
    stats = ClassGaussians(4).update(X, y)
    a, la = stats.sample(20000, generator=torch.Generator().manual_seed(5))
    b, _ = stats.sample(20000, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a, b)
    for c in stats.classes:
        Xc = a[la == c]
        assert (Xc.mean(0) - stats.means[stats.positions([c])[0]]).abs().max() < 0.1  # se ~0.03
        assert rel_err(torch.cov(Xc.T, correction=0), stats.covariance(c)) < 0.05
    with pytest.raises(TypeError, match="Generator"):
        stats.sample(3, generator=None)


def test_shared_noise_gives_common_random_numbers():
    pts = torch.tensor([[0.0, 0], [2, 0], [0, 1]])
    stats = ClassGaussians(2).update(torch.cat([pts, pts + 10]), [0, 0, 0, 1, 1, 1])
    E = torch.randn(5, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    Xs, ys = stats.sample(5, generator=torch.Generator(), noise=E)
    # identical covariances, so shared noise gives samples that differ exactly by the mean shift
    assert torch.allclose(Xs[ys == 1] - Xs[ys == 0], torch.tensor([10.0, 10.0], dtype=torch.float64))


def test_save_load_round_trip_is_exact_and_atomic(tmp_path):
    X, y = make_data()
    stats = ClassGaussians(X.shape[1], ddof=1).update(X, y)
    path = tmp_path / "stats.safetensors"
    stats.save(path)
    loaded = ClassGaussians.load(path)
    assert loaded.classes == stats.classes and loaded.ddof == 1
    assert torch.equal(loaded.scatters, stats.scatters) and torch.equal(loaded.means, stats.means)
    assert [p.name for p in tmp_path.iterdir()] == ["stats.safetensors"]
    _, meta = load_tensors(path)
    assert json.loads(json.dumps(meta))["format"].startswith("gdacil.ClassGaussians")
    with pytest.raises(FileNotFoundError, match="no such file"):
        ClassGaussians.load(tmp_path / "missing.safetensors")


def test_failed_save_leaves_previous_file_intact(tmp_path, monkeypatch):
    stats = ClassGaussians(2).update(torch.eye(2), [0, 1])
    path = tmp_path / "s.safetensors"
    stats.save(path)
    original = path.read_bytes()

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr("gdacil.io.os.replace", boom)
    with pytest.raises(OSError, match="disk full"):
        stats.update(torch.ones(1, 2), [3]).save(path)
    assert path.read_bytes() == original
    assert [p.name for p in tmp_path.iterdir()] == ["s.safetensors"]


def test_memory_report_counts_bytes():
    stats = ClassGaussians(8).update(torch.randn(16, 8, generator=torch.Generator()), torch.arange(16) % 8)
    report = stats.memory_report()
    assert report["scatters"] >= 8 * 8 * 8 * 8
    assert report["total"] == report["counts"] + report["means"] + report["scatters"]


def test_average_covariance_is_unweighted_and_streamed():
    X, y = make_data(n=400)
    stats = ClassGaussians(X.shape[1]).update(X, y)
    labels, _, covs = dense_moments(X, y)
    assert sorted(stats.classes) == labels
    for batch in (1, 2, 64):
        assert rel_err(stats.average_covariance(batch), covs.mean(0)) < 1e-12
