"""``gdacil serve`` attacked as its users would: one input path for HTTP, the CLI and Python,
labels that are no class names, a poller that meets any failure, a full queue, missed deadlines,
bodies of every shape (property-based), and the README's curl lines against a live server."""

from __future__ import annotations

import base64
import json
import re
import shlex
import subprocess
import time
import unicodedata
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from _image_fixtures import write_image_fixtures
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_learner_cli import README, TICKETS
from test_learner_serve import (
    COLOURS,
    assert_same,
    call,
    colour_model,
    png_base64,
    queries,
    running,
    start_readme_server,
    wait_for,
    wait_until_serving,
)

from gdacil.cli import main
from gdacil.learner import Learner, versions
from gdacil.learner import serve as serve_module
from gdacil.learner.serve import ModelService

from _assets import needs_minilm, needs_serve, needs_transformers
from test_learner import colour_set

pytestmark = [needs_serve, needs_transformers]


def post(url: str, path: str, body: bytes, content_type: str | None = "application/json"):
    """``(status, JSON body, headers)`` of a POST of raw ``body`` (headers: case-insensitive)."""
    headers = {"Content-Type": content_type} if content_type else {}
    request = urllib.request.Request(url + path, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read()), response.headers
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read()), err.headers


@pytest.fixture
def model_dir(tmp_path):
    return colour_model(tmp_path)


def b64_file(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


# ---------------------------------------------------------------------- one input path
def test_http_cli_and_python_answer_alike_on_every_kind_of_image(model_dir, tmp_path, capsys):
    """RGBA, palette, LA, 16-bit, CMYK, EXIF-rotated, 1-bit and openclipart images: the
    server, ``gdacil predict`` and ``Learner.predict`` give the same classes and scores."""
    files = write_image_fixtures(tmp_path / "fixture")
    assert len(files) >= 8
    python = [p.to_list() for p in Learner.load(model_dir).predict(files, top_k=3)]
    assert main(["predict", str(model_dir), *map(str, files), "--top-k", "3"]) == 0
    cli = [entry["predictions"] for entry in json.loads(capsys.readouterr().out)]
    with running(ModelService(model_dir, poll=0)) as url:
        status, answer = call(url, "/predict", {"inputs": [b64_file(f) for f in files],
                                                "top_k": 3})
    assert status == 200, answer
    assert_same(cli, python)
    assert_same(answer["predictions"], python)


@needs_minilm
def test_http_cli_and_python_answer_alike_on_texts(tmp_path, capsys):
    texts = ["I was charged twice", "Cafe\u0301 login fails \U0001f600", "  spaced   out  ",
             "refund " * 5000, "x" * 60_000, "\t".join(["tabs"] * 50)]
    # answers compared across batchings: fp32, whose round-off does not depend on the batch
    # (bf16's does, within the bound test_learner_precision.py checks)
    learner = Learner("minilm", precision="fp32")
    learner.learn(*zip(*TICKETS))
    learner.save(tmp_path / "tickets")
    python = [p.to_list() for p in learner.predict(texts, top_k=2)]
    assert main(["predict", str(tmp_path / "tickets"), *texts, "--top-k", "2"]) == 0
    cli = [entry["predictions"] for entry in json.loads(capsys.readouterr().out)]
    with running(ModelService(tmp_path / "tickets", poll=0)) as url:
        status, answer = call(url, "/predict", {"inputs": texts, "top_k": 2})
        huge = "refund my payment " * (10 * 2**20 // 18)  # a 10 MiB text
        status_huge, answer_huge = call(url, "/predict", {"inputs": [huge], "top_k": 2})
        status_info, info = call(url, "/info")
    assert status == 200 and status_huge == 200 and status_info == 200
    assert_same(cli, python)
    assert_same(answer["predictions"], python)
    bound = info["server"]["max_text_chars"]
    assert bound == learner.backbone.max_chars < len(huge)
    assert_same(answer_huge["predictions"], [learner.predict(huge[:bound], top_k=2)[0].to_list()])


def test_texts_are_scored_in_groups_of_similar_length():
    """A forward never pads a short text to a long one's length (the scheduler's costs hold)."""
    from gdacil.learner.serve import _similar_costs

    assert _similar_costs([10, 300, 12, 25, 250, 11]) == [[0, 5, 2], [3], [4, 1]]
    assert _similar_costs([1.0] * 4) == [[0, 1, 2, 3]] and _similar_costs([]) == []


# ---------------------------------------------------------------------- labels and learns
def test_labels_that_are_no_class_names_are_refused_and_write_nothing(model_dir):
    image = png_base64(queries(1, seed=1)[0])
    with running(ModelService(model_dir, poll=0, allow_learn=True)) as url:
        for label in ["\ud800", None, 3.5, "a\x00b", "", "   ", True, ["red"], "x" * 500]:
            status, answer = call(url, "/learn", {"inputs": [image], "labels": [label]})
            assert status == 400 and "labels[0]" in answer["error"], (label, answer)
        assert call(url, "/info")[0] == 200 and call(url, "/health")[1]["version"] == "v1"
        assert [v.name for v in versions(model_dir)] == ["v1"]
        # NFD and NFC spellings are one class; the answer says the NFC one
        status, learned = call(url, "/learn", {"inputs": [image], "labels": ["cafe\u0301"]})
        assert status == 200 and learned["new"] == ["caf\u00e9"], learned
        status, again = call(url, "/learn", {"inputs": [image], "labels": ["caf\u00e9"]})
        assert status == 200 and again["new"] == [] and again["updated"] == ["caf\u00e9"]
        status, info = call(url, "/info")
        assert status == 200 and info["classes"]["caf\u00e9"] == 2


def test_surrogates_in_inputs_are_refused(model_dir):
    with running(ModelService(model_dir, poll=0)) as url:
        status, answer, _ = post(url, "/predict", b'{"inputs": ["\\ud800"]}')
    assert status == 400 and "inputs[0] is not valid Unicode" in answer["error"]


# ---------------------------------------------------------------------- every answer is JSON
def test_every_failure_is_json_with_a_message(model_dir, monkeypatch):
    image = png_base64(queries(1, seed=1)[0])
    body = json.dumps({"inputs": [image]}).encode()
    service = ModelService(model_dir, poll=0)
    with running(service) as url:
        # only a JSON body is read (what a browser sends to another origin unasked is not)
        for content_type in (None, "application/x-www-form-urlencoded", "text/plain"):
            status, answer, _ = post(url, "/predict", body, content_type)
            assert status == 415 and "application/json" in answer["error"], (content_type,
                                                                               answer)
        status, answer, _ = post(url, "/predict", body, "application/json; charset=utf-8")
        assert status == 200 and answer["version"] == "v1", answer
        cases = [
            (b"\xff\xfe not utf-8", 400, "not UTF-8"),
            (b"[" * 50_000 + b"]" * 50_000, 400, "nested too deeply"),
            (b"{not json", 400, "not JSON"),
            (b'"a string"', 400, "must be a JSON object"),
        ]
        for raw, want, message in cases:
            status, answer, _ = post(url, "/predict", raw)
            assert status == want and message in answer["error"], (raw[:20], answer)
        for raw_image, message in image_bombs():  # Pillow's errors are JSON 400s too
            status, answer = call(url, "/predict", {"inputs": [raw_image]})
            assert status == 400 and answer["error"].startswith("inputs[0]") \
                and message in answer["error"].lower(), answer
        status, answer, _ = post(url, "/nowhere", b"{}")
        assert status == 404 and answer == {"error": "Not Found"}
        status, answer = call(url, "/predict")  # a GET
        assert status == 405 and "error" in answer

        def broken():
            raise RuntimeError("the disk caught fire")

        monkeypatch.setattr(service, "info", broken)
        status, answer = call(url, "/info")
        assert status == 500 and "RuntimeError: the disk caught fire" in answer["error"]
        assert call(url, "/health")[0] == 200


def image_bombs() -> list[tuple[str, str]]:
    """Base64 images Pillow refuses, and what the refusal says: a PNG whose zTXt chunk
    expands past Pillow's limit, and a truncated PNG."""
    import io

    from PIL import Image, PngImagePlugin

    info = PngImagePlugin.PngInfo()
    info.add_text("comment", "a" * (PngImagePlugin.MAX_TEXT_CHUNK + 1024), zip=True)
    bomb, whole = io.BytesIO(), io.BytesIO()
    Image.new("L", (4, 4)).save(bomb, format="PNG", pnginfo=info)
    Image.fromarray(queries(1, seed=2)[0]).save(whole, format="PNG")
    return [(base64.b64encode(bomb.getvalue()).decode(), "decompressed data too large"),
            (base64.b64encode(whole.getvalue()[:60]).decode(), "not an image file")]


def test_a_full_queue_and_a_missed_deadline_answer_503_and_the_server_goes_on(model_dir):
    """The scheduler's clock is the test's, so the deadline passes exactly when the test says,
    however loaded the machine."""
    import threading

    service = ModelService(model_dir, poll=0, max_inputs=4, max_pending=4, timeout=30)
    now = [0.0]
    service._scheduler.clock = lambda: now[0]
    service._scheduler.batch_seconds = 1e9  # the first forward takes all 4 inputs, however slow
    entered, release = threading.Event(), threading.Event()
    answer_batch = service._scheduler.run

    def slow(model, items, top_k):
        entered.set()
        release.wait(60)
        return answer_batch(model, items, top_k)

    service._scheduler.run = slow
    four = json.dumps({"inputs": [png_base64(x) for x in queries(2, seed=2)[:4]]}).encode()
    one = json.dumps({"inputs": [png_base64(queries(1, seed=3)[0])]}).encode()
    results: dict[str, tuple] = {}

    def client(name: str) -> threading.Thread:
        thread = threading.Thread(target=lambda: results.update({name: post(url, "/predict",
                                                                             four)}))
        thread.start()
        return thread

    with running(service) as url:
        first = client("first")
        assert entered.wait(60)  # its forward is in flight, held
        second = client("second")
        wait_for(lambda: service._scheduler.pending == 4)
        status, answer, headers = post(url, "/predict", one)  # the queue is full
        assert status == 503 and "busy" in answer["error"] and headers["Retry-After"] == "1"
        now[0] += 100  # every deadline passes
        release.set()
        first.join(60)
        second.join(60)
        assert results["first"][0] == 200  # the forward in flight is answered
        status, answer, _ = results["second"]  # the queued request is dropped
        assert status == 503 and "not answered within" in answer["error"], answer
        status, answer, _ = post(url, "/predict", one)
        assert status == 200 and answer["version"] == "v1"


# ---------------------------------------------------------------------- the poller
def test_the_poller_survives_any_failure_and_health_says_why(model_dir, monkeypatch):
    monkeypatch.setattr(serve_module, "RETRY_FAILED_LOAD", 0.2)
    real_load = Learner.load.__func__

    def load(cls, directory, version=None, **kwargs):
        if version == "v2":
            raise RuntimeError("a bug while loading v2")
        return real_load(cls, directory, version, **kwargs)

    image = png_base64(queries(1, seed=4)[0])
    service = ModelService(model_dir, poll=0.05)
    with running(service) as url:
        monkeypatch.setattr(Learner, "load", classmethod(load))
        other = Learner.load(model_dir)
        other.learn(*colour_set(["yellow"], 6, seed=4))
        other.save(model_dir)  # v2, which the server cannot load
        wait_for(lambda: call(url, "/health")[0] == 503)
        status, health = call(url, "/health")
        assert (status, health["status"], health["version"]) == (503, "stale", "v1")
        assert "version v2 cannot be loaded: RuntimeError: a bug while loading v2" \
            in health["reason"]
        assert call(url, "/predict", {"inputs": [image]})[1]["version"] == "v1"  # still serving
        # an unexpected failure of the poll itself
        monkeypatch.setattr("gdacil.learner.bundle.current_version",
                            lambda directory: {}["no such key"])
        wait_for(lambda: "checking for new versions failed: KeyError"
                 in call(url, "/health")[1].get("reason", ""))
        assert service._watcher.is_alive()
        monkeypatch.undo()  # the cause goes: v2 is loaded
        wait_for(lambda: call(url, "/health") == (200, {"status": "ok", "version": "v2",
                                                        "classes": 4}))


# ---------------------------------------------------------------------- property-based
def texts(max_size: int):
    """Any text, lone surrogates and control characters included (what JSON can carry)."""
    return st.lists(st.characters(exclude_categories=[]) | st.sampled_from(
        ["\ud800", "\udfff", "\x00", "\u0301", " "]), max_size=max_size).map("".join)


def json_values():
    scalars = (st.none() | st.booleans() | st.integers(-10, 10**12) | texts(8)
               | st.floats(allow_nan=False, allow_infinity=False))
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(texts(6), inner, max_size=3), max_leaves=8)


def predict_bodies(image: str):
    inputs = st.lists(st.sampled_from([image, "not base64!", "", "data:image/png;base64,"
                                       + image, base64.b64encode(b"GIF89a junk").decode()])
                      | json_values(), max_size=5)
    rates = (st.floats(min_value=0, max_value=1) | st.sampled_from([5e-324, 1e-300, 1e-7, 1e-6])
             | json_values())
    fields = st.fixed_dictionaries({"inputs": inputs | json_values()},
                                   optional={"top_k": st.integers(-2, 5) | json_values(),
                                             "reject": st.booleans() | json_values(),
                                             "reject_rate": rates, "sets": rates,
                                             "extra": json_values()})
    return fields | json_values()


#: Seconds within which any request to the tiny test model is answered
ANSWER_BOUND = 10.0


def check_answer(status: int, answer) -> None:
    assert status in (200, 400, 403, 409, 413, 503), (status, answer)
    assert isinstance(answer, dict)
    if status != 200:
        assert set(answer) == {"error"} and isinstance(answer["error"], str) and answer["error"]


def test_any_predict_body_gets_a_json_answer_and_changes_nothing(model_dir):
    image = png_base64(queries(1, seed=6)[0])
    with running(ModelService(model_dir, poll=0, max_inputs=4)) as url:
        @settings(max_examples=120, deadline=None, derandomize=True,
                  suppress_health_check=[HealthCheck.too_slow])
        @given(predict_bodies(image))
        def check(body):
            started = time.perf_counter()
            status, answer = call(url, "/predict", raw=json.dumps(body).encode())
            # a hang, not a speed: "reject_rate": 1e-300 once never returned
            assert time.perf_counter() - started < ANSWER_BOUND, body
            check_answer(status, answer)
            if status == 200:
                assert len(answer["predictions"]) == len(body["inputs"])
                k = body.get("top_k", 1)
                assert all(len(p) == min(k, 3) for p in answer["predictions"])
                assert all(p[0]["class"] in COLOURS for p in answer["predictions"])

        check()
        assert call(url, "/health") == (200, {"status": "ok", "version": "v1", "classes": 3})
    assert [v.name for v in versions(model_dir)] == ["v1"]


def test_any_learn_body_either_saves_one_version_or_nothing(model_dir):
    image = png_base64(queries(1, seed=6)[0])
    label = (texts(6) | st.sampled_from(["red", "cafe\u0301", "caf\u00e9", " new "])
             | st.integers(-3, 3) | st.none() | st.floats(allow_nan=True)
             | st.binary(max_size=3).map(repr))
    one_label_each = st.integers(1, 3).flatmap(lambda n: st.fixed_dictionaries(
        {"inputs": st.just([image] * n), "labels": st.lists(label, min_size=n, max_size=n)}))
    bodies = one_label_each | one_label_each | predict_bodies(image)
    with running(ModelService(model_dir, poll=0, allow_learn=True, max_inputs=4)) as url:
        saved = [1]

        @settings(max_examples=40, deadline=None, derandomize=True,
                  suppress_health_check=[HealthCheck.too_slow])
        @given(bodies)
        def check(body):
            status, answer = call(url, "/learn", raw=json.dumps(body).encode())
            check_answer(status, answer)
            if status == 200:
                saved[0] += 1
                assert answer["version"] == f"v{saved[0]}"
            assert [v.name for v in versions(model_dir)] == [f"v{i}"
                                                             for i in range(1, saved[0] + 1)]
            assert call(url, "/info")[0] == 200

        check()
    names = Learner.load(model_dir).classes
    for name in names:  # stripped, NFC, no control character or surrogate
        assert name and name == name.strip() == unicodedata.normalize("NFC", name), name
        assert not any(unicodedata.category(c) in ("Cc", "Cs") for c in name), name


# ---------------------------------------------------------------------- the README
def readme_serve_lines() -> tuple[str, list[str]]:
    text = README.read_text(encoding="utf-8")
    block = re.search(r"```sh\n(gdacil serve .*?)```", text, re.S)
    assert block, "the README's serving example is missing"
    lines = [line for line in block.group(1).splitlines() if line.strip()]
    return lines[0], lines[1:]


@needs_minilm
def test_the_readme_curl_lines_work_against_a_live_server(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    serve_line, curls = readme_serve_lines()
    assert serve_line.startswith("gdacil serve tickets-model") and len(curls) == 2
    learner = Learner("minilm")
    learner.learn(*zip(*TICKETS))
    learner.save("tickets-model")
    server, url = start_readme_server(serve_line)
    try:
        wait_until_serving(server, url)
        answers = []
        for line in curls:
            command = shlex.split(line.replace("localhost:8000", url.removeprefix("http://")))
            done = subprocess.run(command, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr
            answers.append(json.loads(done.stdout))
    finally:
        server.terminate()
        server.communicate(timeout=60)
    predicted, learned = answers
    assert predicted["version"] == "v1" and len(predicted["predictions"][0]) == 2
    assert predicted["predictions"][0][0]["class"] == "billing"
    assert (learned["version"], learned["new"]) == ("v2", ["shipping"])
