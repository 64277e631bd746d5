"""``GET /metrics``: the Prometheus text format, parsed by prometheus-client's own parser, with
counters equal to the requests a test sent, unknown answers counted, the version served named,
and two servers in one process counting apart."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from test_learner_serve import COLOURS, calibrated_colour_model, call, png_base64, running

from gdacil.learner.inbox import Inbox
from gdacil.learner.serve import ModelService

from _assets import needs_serve, needs_transformers
from test_learner import colour_set

pytestmark = [needs_serve, needs_transformers]


@pytest.fixture(scope="module")
def calibrated_model(tmp_path_factory):
    return calibrated_colour_model(tmp_path_factory.mktemp("metrics") / "model")


def scrape(url: str) -> dict:
    """``{(sample name, labels as a sorted tuple): value}`` of ``url/metrics``, parsed by the
    Prometheus text-format parser."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url + "/metrics", timeout=60) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=")
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def requests(samples: dict, endpoint: str, method: str, status: int) -> float:
    key = ("gdacil_requests_total", (("endpoint", endpoint), ("method", method),
                                      ("status", str(status))))
    return samples.get(key, 0.0)


def test_metrics_count_the_requests_sent(calibrated_model, tmp_path):
    known = [png_base64(x) for x in colour_set(COLOURS, 1, seed=7)[0]]
    unknown = [png_base64(x) for x in colour_set(["yellow", "purple"], 1, seed=7)[0]]
    service = ModelService(calibrated_model, poll=0, allow_learn=True,
                           inbox=Inbox(tmp_path / "inbox"))
    other = ModelService(calibrated_model, poll=0)
    with running(service) as url, running(other) as other_url:
        for _ in range(3):
            assert call(url, "/health")[0] == 200
        answers = [call(url, "/predict", {"inputs": known + unknown, "reject": True})[1]
                   for _ in range(4)]
        assert call(url, "/predict", {"inputs": known})[0] == 200  # no rejection asked
        assert call(url, "/predict", {"inputs": []})[0] == 400
        assert call(url, "/predict", {"inputs": known, "top_k": 0})[0] == 400
        assert call(url, "/nowhere")[0] == 404
        assert call(url, "/inbox")[0] == 200
        request = urllib.request.Request(url + "/predict", data=b"{}",
                                         headers={"Content-Type": "text/plain"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request)
        assert refused.value.code == 415
        item = call(url, "/inbox")[1]["items"][0]["id"]
        assert call(url, f"/inbox/{item}/label", {"label": "yellow"})[0] == 200
        samples = scrape(url)
        assert call(other_url, "/health")[0] == 200
        other_samples = scrape(other_url)

    assert requests(samples, "/health", "GET", 200) == 3
    assert requests(samples, "/predict", "POST", 200) == 5
    assert requests(samples, "/predict", "POST", 400) == 2
    assert requests(samples, "/predict", "POST", 415) == 1  # refused in front of the routes
    assert requests(samples, "other", "GET", 404) == 1
    assert requests(samples, "/inbox", "GET", 200) == 2
    assert requests(samples, "/inbox/{item}/label", "POST", 200) == 1
    counted = sum(v for (name, _), v in samples.items() if name == "gdacil_requests_total")
    assert counted == 3 + 5 + 2 + 1 + 1 + 2 + 1  # every request, and no other
    histogram = ("gdacil_request_duration_seconds_count", (("endpoint", "/predict"),))
    assert samples[histogram] == 8
    assert samples[("gdacil_request_duration_seconds_bucket",
                    (("endpoint", "/predict"), ("le", "+Inf")))] == 8
    unknowns = sum(sum(a["unknown"]) for a in answers)
    assert unknowns >= 8  # the yellow and purple images, at least
    assert samples[("gdacil_inputs_total", ())] == 4 * 5 + 3
    assert samples[("gdacil_reject_inputs_total", ())] == 4 * 5
    assert samples[("gdacil_unknown_inputs_total", ())] == unknowns
    assert samples[("gdacil_model_info", (("version", "v1"),))] == 1
    assert samples[("gdacil_model_version", ())] == 1
    assert 0 <= samples[("gdacil_model_age_seconds", ())] < 3600
    assert samples[("gdacil_queue_inputs", ())] == 0
    assert samples[("gdacil_batches_total", ())] >= 5
    # each input answered unknown kept once, though asked four times
    assert samples[("gdacil_inbox_items", ())] == sum(answers[0]["unknown"])
    # the other server counted only its own request, and keeps no inbox
    assert requests(other_samples, "/health", "GET", 200) == 1
    assert requests(other_samples, "/predict", "POST", 200) == 0
    assert ("gdacil_inbox_items", ()) not in other_samples
