"""gdacil's class statistics as a Ray Data aggregation, on a real local Ray cluster (2 CPUs):
over the whole dataset and per group, from Parquet blocks and from a ``map_batches``
extraction, each equal to one process's statistics of the same rows to round-off, and learned
by a model exactly as its samples would be."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gdacil import ClassGaussians
from gdacil.learner import Learner

from _assets import TINY_VIT, needs_transformers

ray = pytest.importorskip("ray")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield
    ray.shutdown()


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def vectors(tmp_path, n: int = 3000, dim: int = 16, classes: int = 6):
    rng = np.random.default_rng(0)
    y = rng.integers(classes, size=n)
    X = rng.normal(size=(n, dim)) * (1 + y[:, None]) + 10 * np.eye(dim)[y]
    names = [f"c{k}" for k in y]
    path = tmp_path / "vectors.parquet"
    pq.write_table(pa.table({"vector": pa.array([list(r) for r in X]), "label": names}), path,
                   row_group_size=400)
    return path, X, names


def reference(X, names) -> tuple[ClassGaussians, list[str]]:
    order = list(dict.fromkeys(names))
    y = torch.tensor([order.index(n) for n in names])
    return ClassGaussians(X.shape[1]).update(torch.from_numpy(X), y), order


def assert_equal(found: tuple[ClassGaussians, list[str]], expected) -> None:
    (a, names), (b, theirs) = found, expected
    at = [names.index(n) for n in theirs]
    assert sorted(names) == sorted(theirs)
    assert torch.equal(a.counts[at], b.counts)
    assert relative(a.means[at], b.means) < 1e-10
    assert relative(a.scatters[at], b.scatters) < 1e-10


def test_aggregation_over_blocks_equals_one_process_and_is_learned_exactly(cluster, tmp_path):
    from gdacil.ray_data import ClassStatisticsAggregation, class_statistics, grouped_statistics

    path, X, names = vectors(tmp_path)
    ds = ray.data.read_parquet(str(path), override_num_blocks=6)
    found = class_statistics(ds)
    assert_equal(found, reference(X, names))
    groups = ds.groupby("label").aggregate(ClassStatisticsAggregation("vector", None)).take_all()
    assert len(groups) == 6
    assert_equal(grouped_statistics(groups), reference(X, names))
    learned, here = Learner("vectors"), Learner("vectors")
    learned.learn_statistics(*found)
    here.learn(path)
    assert learned.class_counts() == here.class_counts()
    order = [learned.classes.index(c) for c in here.classes]
    assert relative(learned.statistics.scatters[order], here.statistics.scatters) < 1e-10
    test = torch.from_numpy(X[:200])
    assert relative(learned.head.decision_function(test)[:, order],
                    here.head.decision_function(test)) < 1e-10


def test_bad_rows_are_refused_naming_the_column(cluster):
    from gdacil.ray_data import class_statistics

    ds = ray.data.from_items([{"vector": [1.0, float("nan")], "label": "a"}])
    with pytest.raises(Exception, match=r"column 'vector': element 1 is nan"):
        class_statistics(ds)
    with pytest.raises(Exception, match="has no column 'label'"):
        class_statistics(ray.data.from_items([{"vector": [1.0, 2.0], "y": "a"}]))


@needs_transformers
def test_map_batches_extraction_feeds_the_aggregation(cluster):
    from gdacil.backbones import build_backbone
    from gdacil.ray_data import Extract, class_statistics

    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, size=(24, 32, 32, 3), dtype=np.uint8)
    labels = [f"k{i % 3}" for i in range(24)]
    ds = ray.data.from_items([{"image": im, "label": c} for im, c in zip(images, labels)],
                             override_num_blocks=4)
    options = {"backbone": "vit", "column": "image", "config": TINY_VIT}
    found = class_statistics(ds.map_batches(Extract, fn_constructor_kwargs=options,
                                            concurrency=2, batch_size=6))
    backbone = build_backbone("vit", config=TINY_VIT)
    X = backbone.extract(list(images)).double().numpy()
    (a, names), (b, theirs) = found, reference(X, labels)
    at = [names.index(n) for n in theirs]
    assert relative(a.means[at], b.means) < 1e-5  # float32 features of other batches
    assert relative(a.scatters[at], b.scatters) < 1e-5
