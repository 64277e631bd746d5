"""``gdacil bench serve --quick``: the two files, every scenario answered without errors, and
sane figures."""

import json
import math

from gdacil.bench import BENCHMARKS
from gdacil.bench.serve import SCENARIOS, main

from _assets import needs_serve, needs_transformers


@needs_serve
@needs_transformers
def test_quick_run_writes_results_for_every_scenario(tmp_path, capsys):
    assert BENCHMARKS["serve"] == "gdacil.bench.serve"
    assert main(["--quick", "--out", str(tmp_path)]) == 0
    payload = json.loads((tmp_path / "serve.json").read_text())
    (model,) = payload["models"].values()
    assert model["classes"] == 4 and model["learned"] == 16
    predict = model["predict"]
    assert predict["batch"] == 8 and predict["bare_s"] > 0 and predict["predict_s"] > 0
    assert predict["preprocess_and_bare_s"] > 0 and predict["fraction_with_preprocessing"] > 0
    assert [r["scenario"] for r in model["serve"]] == [s[0] for s in SCENARIOS]
    for row, (_, clients, size) in zip(model["serve"], SCENARIOS):
        assert row["errors"] == 0 and row["clients"] == clients
        assert row["inputs_per_request"] == (size or 8)
        assert row["requests"] == clients * 6
        assert 0 < row["p50_ms"] <= row["p99_ms"] and math.isfinite(row["requests_per_s"])
        assert math.isclose(row["inputs_per_s"], row["requests_per_s"] * row["inputs_per_request"])
    heavy = model["heavy"]
    assert [r["heavy"] for r in heavy] == ["none", "one 2-megapixel image", "256 images",
                                           "reject_rate 1e-06", "reject_rate 1e-300",
                                           "2**18 separators of nested lists"]
    for row in heavy:
        assert row["light_errors"] == 0 and row["light_clients"] == 3
        assert 0 < row["light_p50_ms"] <= row["light_p99_ms"] <= row["light_max_ms"]
        assert row["heavy_requests"] >= (row["heavy"] != "none")
        # the hostile bodies are refused, each at once; the others are answered
        hostile = row["heavy"].startswith(("reject_rate", "2**18"))
        assert row["heavy_errors"] == ([400] if hostile else [])
    # the default model (auto) and every other precision, on the same inputs
    from gdacil.backbones.base import resolve_precision

    default = resolve_precision("auto", None)
    assert model["default_precision"] == default
    assert set(model["precisions"]) == {"fp32", "bf16"}
    assert model["precisions"][default]["serve"] == model["serve"]
    for precision, found in model["precisions"].items():
        assert found["runs"] == precision and found["predict"]["predict_s"] > 0
        assert [r["scenario"] for r in found["serve"]] == [s[0] for s in SCENARIOS]
        assert all(r["errors"] == 0 for r in found["serve"])
        assert 0 <= found["accuracy"] <= 1
    assert model["precisions"]["fp32"]["top1_agreement_with_fp32"] == 1.0
    assert 0 <= model["precisions"]["bf16"]["top1_agreement_with_fp32"] <= 1
    text = (tmp_path / "serve.md").read_text()
    assert "## fp32 and bf16 on the same inputs" in text
    assert "| tiny-vit | single | " in text.split("## fp32 and bf16")[1]
    assert "## A heavy client beside 3 light ones (2 s each)" in text
    assert "| tiny-vit | 256 images |" in text
    assert "| tiny-vit | single x8 clients | 8 | 1 |" in text
    assert "## predict against the bare model" in text
    capsys.readouterr()
