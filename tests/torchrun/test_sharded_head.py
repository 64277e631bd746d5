"""Class-sharded heads: each shard fitted with the whole model's terms builds the rows one process
would, and two gloo processes under torchrun give the top-k lists, probabilities and predictions
of one process holding every class."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _sharded_worker import DIM, FIRST, LATER, data, heads, stats_of
from test_distributed import torchrun

from gdacil.errors import NotFittedError
from gdacil.heads import LDA, LRRGDA, ModelTerms, SGDHead, ShardedHead
from gdacil.io import load_tensors

WORKER = str(Path(__file__).parents[1] / "_sharded_worker.py")


def test_a_shard_fitted_with_the_model_terms_builds_the_rows_of_the_whole_model():
    X, y, queries = data()
    whole = stats_of(range(16), X, y)
    terms = ModelTerms.of(whole)
    part = [1, 4, 5, 11, 15]
    for name, head in heads().items():
        reference = type(head)(**head.get_params()).fit(whole).decision_function(queries)
        shard = head.fit(stats_of(part, X, y), model_terms=terms)
        torch.testing.assert_close(shard.decision_function(queries), reference[:, part],
                                   rtol=1e-10, atol=1e-10, msg=name)
        plain = type(head)(**head.get_params()).fit(stats_of(part, X, y))
        assert not torch.allclose(plain.decision_function(queries), reference[:, part]), name


def test_model_terms_take_only_uniform_or_empirical_priors():
    X, y, _ = data()
    stats = stats_of(range(4), X, y)
    with pytest.raises(ValueError, match="priors None or 'empirical'"):
        LDA(priors=[0.25] * 4).fit(stats, model_terms=ModelTerms.of(stats))


def test_one_shard_is_the_head():
    X, y, queries = data()
    stats = stats_of(range(16), X, y)
    reference = LRRGDA(rank=3).fit(stats)
    sharded = ShardedHead(LRRGDA(rank=3)).fit(stats)
    scores, labels, proba = sharded.top_k(queries, 5, proba=True)
    dense = reference.decision_function(queries)
    best, where = dense.topk(5, dim=1)
    assert torch.equal(labels, reference.classes_[where])
    torch.testing.assert_close(scores, best, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(proba, torch.softmax(dense, 1).gather(1, where), rtol=1e-10,
                               atol=1e-12)
    assert torch.equal(sharded.predict(queries), reference.predict(queries))
    assert sharded.assign([3, 20, 21]) == [0, 0, 0]
    assert sharded.memory_report() == reference.memory_report()


def test_unfitted_and_unshardable_heads_are_refused():
    with pytest.raises(NotFittedError):
        ShardedHead(LDA()).predict(torch.zeros(2, DIM))
    X, y, _ = data()
    with pytest.raises(TypeError, match="ShardedHead takes one of NCM, LDA, QDA, RGDA, LRRGDA"):
        ShardedHead(SGDHead()).fit(stats_of(range(3), X, y))


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[tuple[dict, dict]]:
    out = tmp_path_factory.mktemp("sharded")
    torchrun(WORKER, str(out), cwd=out)
    return [load_tensors(out / f"rank{r}.safetensors") for r in range(2)]


def reference(head, classes, queries, k):
    X, y, _ = data()
    fitted = type(head)(**head.get_params()).fit(stats_of(classes, X, y))
    dense = fitted.decision_function(queries)
    best, where = dense.topk(k, dim=1)
    return best, fitted.classes_[where], torch.softmax(dense, 1).gather(1, where), fitted


@pytest.mark.parametrize("name", list(heads()))
def test_two_gloo_ranks_answer_as_one_process(ranks, name):
    _, _, queries = data()
    head = heads()[name]
    (t0, _), (t1, _) = ranks
    for stage, classes, k in (("first", FIRST, 3), ("later", [*FIRST, *LATER], 4)):
        best, labels, proba, fitted = reference(head, classes, queries, k)
        for tensors in (t0, t1):  # every rank gets the same answer
            assert torch.equal(tensors[f"{name}/{stage}/labels"], labels), (name, stage)
            torch.testing.assert_close(tensors[f"{name}/{stage}/scores"], best, rtol=1e-9,
                                       atol=1e-9)
            torch.testing.assert_close(tensors[f"{name}/{stage}/proba"], proba, rtol=1e-9,
                                       atol=1e-12)
        if stage == "first":
            for tensors in (t0, t1):
                assert torch.equal(tensors[f"{name}/first/predict"], fitted.predict(queries))
    # rank 0 held 7 classes and rank 1 held 3: new classes fill rank 1 up first
    assert t0[f"{name}/owners"].tolist() == t1[f"{name}/owners"].tolist() == [1, 1, 1, 1, 0, 1]
    assert sorted(t0[f"{name}/classes"].tolist()) == list(range(16))


def test_two_gloo_ranks_refuse_bad_fits_on_every_rank(ranks):
    for _, errors in ranks:
        assert "classes held by more than one rank: [3]" in errors["duplicate"]
        assert errors["sgd"].startswith("TypeError: ShardedHead takes one of")
        assert "priors None or 'empirical'" in errors["priors"]


def test_bench_sharded_quick_reports_memory_per_rank_and_equal_answers(tmp_path, capsys):
    import json

    from gdacil.bench.sharded import main

    assert main(["--quick", "--out", str(tmp_path)]) == 0
    cells = json.loads((tmp_path / "sharded.json").read_text())["cells"]
    assert [(c["classes"], c["world"]) for c in cells] == [(40, 1), (40, 2)]
    assert all(c["same_top_k_as_first"] for c in cells)
    one, two = (c["ranks"] for c in cells)
    assert [r["classes"] for r in one] == [40] and [r["classes"] for r in two] == [20, 20]
    assert max(r["stats_bytes"] for r in two) < one[0]["stats_bytes"]
    assert "| 40 | 2 |" in (tmp_path / "sharded.md").read_text()
    capsys.readouterr()
