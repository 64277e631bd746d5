"""``gdacil bench openset`` on a tiny synthetic feature set: the JSON schema, numbers in range,
stored seeds reused, the report rendered (features given to the run directly; nothing patched)."""

import json
import math

import numpy as np
import pytest
import torch

from gdacil import ClassGaussians
from gdacil.bench import BENCHMARKS, openset
from gdacil.heads import LRRGDA, NCM, FeCAM, RanPAC
from gdacil.novelty import DEFAULT_SCORE, NOVELTY_SCORES


def blobs(seed=0, n_classes=12, per_class=40, d=12):
    g = torch.Generator().manual_seed(seed)
    y = np.repeat(np.arange(n_classes), per_class)
    X = torch.randn(len(y), d, generator=g, dtype=torch.float64) + 2.5 * torch.randn(
        n_classes, d, generator=g, dtype=torch.float64)[torch.from_numpy(y)]
    return X, y


SMALL_ANCHORS = {
    "ranpac_msp": openset.Anchor(lambda: RanPAC(dim_out=64), openset._ranpac_msp),
    "fecam_mahalanobis": openset.Anchor(lambda: FeCAM.preset("vit"), openset._fecam_mahalanobis),
}


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    X, y = blobs()
    cell = openset.evaluate_cell(X, y, features="tiny", scaling="raw", n_tasks=3,
                                 test_fraction=0.3, seeds=[0, 1], anchors=SMALL_ANCHORS,
                                 runs_dir=runs, log=lambda _: None)
    return cell, runs, (X, y)


def test_split_holds_out_a_quarter_of_the_classes_as_unknown():
    _, y = blobs()
    sp = openset.make_split(y, 3, 0.3, seed=5)
    assert len(sp.unknown) == 3 and len(sp.known) == 9
    assert sorted(np.concatenate(sp.tasks).tolist()) == sp.known.tolist()
    assert not np.isin(y[sp.train], sp.unknown).any()
    assert set(y[sp.unknown_test]) == set(sp.unknown.tolist())
    assert set(y[sp.known_test]) == set(sp.known.tolist())
    assert not set(sp.train) & set(sp.known_test)


def test_fpr_at_tpr_and_auroc():
    known = torch.arange(100, dtype=torch.float64)      # 95% kept: scores >= 5
    unknown = torch.tensor([0.0, 4.0, 5.0, 50.0])
    assert openset.fpr_at_tpr(known, unknown) == pytest.approx(50.0)
    assert openset.auroc(known + 1000, unknown) == pytest.approx(100.0)


def test_cell_schema_and_ranges(measured):
    cell, _, _ = measured
    assert set(cell["seeds"]) == {"0", "1"}
    names = [*NOVELTY_SCORES, openset.MAHALANOBIS_PP, *SMALL_ANCHORS]
    assert list(cell["scores"]) == names
    for record in (cell, *cell["seeds"].values()):
        for score in record["scores"].values():
            assert 0.0 <= score["auroc"] <= 100.0 and 0.0 <= score["fpr95"] <= 100.0
        r = record["rejection"]
        assert r["target"] == 5.0
        for key in ("false_rejection", "known_accuracy", "known_accuracy_no_rejection",
                    "unknown_rejected"):
            assert 0.0 <= r[key] <= 100.0
        assert r["known_accuracy"] <= r["known_accuracy_no_rejection"]
        assert 0.0 <= record["ece"]["before"] <= 1.0 and 0.0 <= record["ece"]["after"] <= 1.0
        assert record["temperature"] > 0
        c = record["conformal"]
        assert c["alpha"] == 0.1 and 0.0 <= c["coverage"] <= 100.0 and c["set_size"] >= 0.0
    # well-separated blobs: known classes are learned, unknown ones stand out
    assert cell["rejection"]["known_accuracy_no_rejection"] > 90.0
    assert cell["scores"][DEFAULT_SCORE]["auroc"] > 90.0
    mean = np.mean([s["scores"]["msp"]["auroc"] for s in cell["seeds"].values()])
    assert cell["scores"]["msp"]["auroc"] == pytest.approx(mean)
    assert len(cell["seeds"]["0"]["tasks"]) == 3


def test_payload_schema_and_report(measured):
    cell, _, _ = measured
    payload = openset.payload([cell], [0, 1], tasks={"tiny": 3}, anchors=list(SMALL_ANCHORS))
    doc = json.loads(json.dumps(payload))  # what write_report stores
    assert doc["default_score"] == DEFAULT_SCORE and doc["seeds"] == [0, 1]
    assert doc["unknown_fraction"] == 0.25 and "machine" in doc
    (c,) = doc["cells"]
    assert {"features", "scaling", "scores", "ece", "conformal", "rejection", "temperature",
            "seeds"} <= set(c)
    assert set(c["ece"]) >= {"before", "after"}
    assert set(c["conformal"]) >= {"alpha", "coverage", "set_size"}
    assert set(c["rejection"]) >= {"target", "false_rejection", "known_accuracy",
                                   "known_accuracy_no_rejection"}
    assert all(math.isfinite(v) for s in c["scores"].values() for v in s.values())
    md = openset.render(doc)
    for heading in ("## AUROC", "## FPR at 95% TPR", "## Rejection", "## Expected calibration",
                    "## Split-conformal", "**mean**", "ECE as a fraction"):
        assert heading in md
    assert ":mod:" not in md


def test_stored_seeds_are_reused(measured):
    cell, runs, (X, y) = measured
    stored = json.loads((runs / "tiny-raw-1.json").read_text())
    assert set(stored) == {"gdacil", *SMALL_ANCHORS}
    again = openset.run_seed(X, y, n_tasks=3, test_fraction=0.3, seed=1, anchors=SMALL_ANCHORS,
                             store=runs / "tiny-raw-1.json")
    assert again == cell["seeds"]["1"]  # seconds included: read back, not remeasured


def test_mahalanobis_pp_equals_the_default_heads_score():
    """The run takes Mahalanobis++ from an NCM: the distance scores are the statistics'."""
    X, y = blobs(d=8)
    X = torch.nn.functional.normalize(X, dim=1)
    stats = ClassGaussians(8).update(X, torch.from_numpy(y))
    a = NCM().fit(stats).score_samples(X, "mahalanobis")
    b = LRRGDA().fit(stats).score_samples(X, "mahalanobis")
    torch.testing.assert_close(a, b)


def test_registered_and_refuses_to_overwrite(tmp_path, capsys):
    assert BENCHMARKS["openset"] == "gdacil.bench.openset"
    (tmp_path / "openset.json").write_text("{}")
    with pytest.raises(SystemExit):
        openset.main(["--out", str(tmp_path)])
    assert "--overwrite" in capsys.readouterr().err
