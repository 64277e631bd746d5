"""``gdacil serve``: a real HTTP client against a running server (uvicorn in a thread).

Answers over HTTP equal :meth:`Learner.predict` in this process; 8 concurrent clients are all
answered correctly; every answer given while a learn runs is exactly one saved version's answer;
versions saved by other processes are swapped in; bad requests get 4xx with a message. The
learners are the tiny random ViT of tests/learner/test_learner.py; one test serves the real MiniLM.
"""

from __future__ import annotations

import base64
import io
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager

import numpy as np
import pytest

from gdacil.learner import Learner, rollback, versions
from gdacil.learner.serve import ModelService, RequestError, create_app

from _assets import needs_minilm, needs_serve, needs_transformers
from test_learner import colour_set, tiny_learner

pytestmark = [needs_serve, needs_transformers]
COLOURS = ["red", "green", "blue"]


def png_base64(pixels: np.ndarray) -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


@contextmanager
def running(service: ModelService, wrap=None):
    """``service`` behind uvicorn on a free local port (its application passed through
    ``wrap``, an ASGI middleware, when given); yields the base URL."""
    import uvicorn

    app = create_app(service) if wrap is None else wrap(create_app(service))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0,
                                           log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


def call(url: str, path: str, payload=None, *, raw: bytes | None = None) -> tuple[int, dict]:
    """``(status, JSON body)`` of a GET (no payload) or POST."""
    data = raw if raw is not None else (None if payload is None else json.dumps(payload).encode())
    request = urllib.request.Request(url + path, data=data,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def colour_model(tmp_path):
    """A tiny image model of three colours, saved as ``tmp_path/model`` (version v1)."""
    learner = tiny_learner()
    learner.learn(*colour_set(COLOURS, 8))
    learner.save(tmp_path / "model")
    return tmp_path / "model"


def calibrated_colour_model(path):
    """A tiny image model of three colours with 60 calibration records, so that its rejection
    works (yellow and purple are unknown to it), saved as ``path`` (version v1)."""
    learner = tiny_learner()
    learner.learn(*colour_set(COLOURS, 20))
    learner.save(path)
    return path


@pytest.fixture
def model_dir(tmp_path):
    return colour_model(tmp_path)


def queries(n: int, seed: int) -> list[np.ndarray]:
    return colour_set(COLOURS, n, seed=seed)[0]


def expected(model_dir, images, top_k: int, version=None) -> list[list[dict]]:
    learner = Learner.load(model_dir, version)
    return [p.to_list() for p in learner.predict(images, top_k=top_k)]


def assert_same(answer: list[list[dict]], reference: list[list[dict]]) -> None:
    """Same classes in the same order; scores and probabilities equal up to float32 round-off
    (a batch of another size may sum in another order)."""
    assert [[e["class"] for e in a] for a in answer] == [[e["class"] for e in r] for r in reference]
    for key in ("score", "probability"):
        got = np.array([[e[key] for e in a] for a in answer])
        want = np.array([[e[key] for e in r] for r in reference])
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------- answers
def test_predict_over_http_equals_the_learner(model_dir):
    images = queries(3, seed=5)
    reference = expected(model_dir, images, top_k=2)
    with running(ModelService(model_dir, poll=0)) as url:
        status, health = call(url, "/health")
        assert (status, health) == (200, {"status": "ok", "version": "v1", "classes": 3})
        status, answer = call(url, "/predict", {"inputs": [png_base64(x) for x in images],
                                                "top_k": 2})
        assert status == 200 and answer["version"] == "v1"
        assert_same(answer["predictions"], reference)
        data_url = "data:image/png;base64," + png_base64(images[0])
        status, one = call(url, "/predict", {"inputs": [data_url]})
        assert status == 200
        assert_same(one["predictions"], [reference[0][:1]])
        status, info = call(url, "/info")
        assert status == 200 and info["classes"] == {"red": 8, "green": 8, "blue": 8}
        assert info["server"]["allow_learn"] is False


def test_eight_concurrent_clients_are_all_answered_correctly(model_dir):
    requests = [queries(1 + c % 3, seed=10 + c) for c in range(8)]
    reference = [expected(model_dir, images, top_k=3) for images in requests]
    answers: dict[int, list] = {}
    errors = []

    def client(c: int) -> None:
        try:
            for _ in range(4):
                status, answer = call(url, "/predict", {
                    "inputs": [png_base64(x) for x in requests[c]], "top_k": 3})
                assert status == 200, answer
                answers.setdefault(c, []).append(answer["predictions"])
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    with running(ModelService(model_dir, poll=0, max_batch=16)) as url:
        threads = [threading.Thread(target=client, args=(c,)) for c in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert not errors, errors
    for c in range(8):
        assert len(answers[c]) == 4
        for answer in answers[c]:
            assert_same(answer, reference[c])


def test_a_request_failing_in_the_model_fails_alone(model_dir):
    """A request whose input fails in the backbone gets its own 400; others are answered."""
    from gdacil.learner.serve import PredictRequest

    service = ModelService(model_dir, poll=0).start()
    try:
        good = service.prepare({"inputs": [png_base64(x) for x in queries(1, seed=3)],
                                "top_k": 2})  # one image of each colour
        bad = PredictRequest([np.zeros((4, 4, 7), np.uint8)], [1.0], 1)
        futures = [service.submit(r) for r in (good, bad, good)]
        assert [len(p) for p in service.answer(good, futures[0].result(60))["predictions"]] \
            == [2, 2, 2]
        assert service.answer(good, futures[2].result(60))["version"] == "v1"
        with pytest.raises(ValueError, match="image arrays"):
            futures[1].result(60)
        assert service.health()["status"] == "ok"
    finally:
        service.close()


# ---------------------------------------------------------------------- learning and swaps
def test_predictions_during_a_learn_are_each_one_saved_version(model_dir):
    images = queries(2, seed=7)
    before = expected(model_dir, images, top_k=2)
    payload = {"inputs": [png_base64(x) for x in images], "top_k": 2}
    seen: list[dict] = []
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            status, answer = call(url, "/predict", payload)
            assert status == 200, answer
            seen.append(answer)

    new, labels = colour_set(["yellow", "purple"], 8, seed=2)
    with running(ModelService(model_dir, poll=0, allow_learn=True)) as url:
        readers = [threading.Thread(target=client) for _ in range(2)]
        for reader in readers:
            reader.start()
        status, learned = call(url, "/learn", {"inputs": [png_base64(x) for x in new],
                                               "labels": labels})
        time.sleep(0.5)
        stop.set()
        for reader in readers:
            reader.join()
        assert status == 200, learned
        assert (learned["version"], learned["new"], learned["classes"]) == \
            ("v2", ["yellow", "purple"], 5)
        assert call(url, "/health")[1]["version"] == "v2"
    after = expected(model_dir, images, top_k=2, version="v2")
    assert {a["version"] for a in seen} <= {"v1", "v2"} and seen[-1]["version"] == "v2"
    for answer in seen:
        assert_same(answer["predictions"], before if answer["version"] == "v1" else after)
    # the learned version is the one a fresh load predicts with: all five classes
    assert set(Learner.load(model_dir).classes) == {*COLOURS, "yellow", "purple"}


def test_versions_saved_by_other_processes_are_swapped_in(model_dir):
    with running(ModelService(model_dir, poll=0.05)) as url:
        other = Learner.load(model_dir)
        other.learn(*colour_set(["yellow"], 6, seed=4))
        other.save(model_dir)
        wait_for(lambda: call(url, "/health")[1] == {"status": "ok", "version": "v2",
                                                      "classes": 4})
        rollback(model_dir, "v1")
        wait_for(lambda: call(url, "/health")[1]["version"] == "v1")


def test_a_learn_racing_another_writer_is_refused_and_writes_nothing(model_dir):
    service = ModelService(model_dir, poll=0, allow_learn=True)
    other = Learner.load(model_dir)
    other.learn(*colour_set(["yellow"], 6, seed=4))
    other.save(model_dir)  # v2, written after the service loaded v1
    new, labels = colour_set(["purple"], 6, seed=2)
    with pytest.raises(RequestError) as err:
        service.learn({"inputs": [png_base64(x) for x in new], "labels": labels})
    assert err.value.status == 409
    assert [v.name for v in versions(model_dir)] == ["v1", "v2"]
    assert service.learner.version == "v1" and "purple" not in service.learner.classes


def wait_for(condition, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


# ---------------------------------------------------------------------- bad requests
def test_bad_requests_get_4xx_with_a_message(model_dir):
    from PIL import Image

    image = png_base64(queries(1, seed=1)[0])
    buffer = io.BytesIO()
    Image.new("RGB", (300, 300)).save(buffer, format="PNG")
    big = base64.b64encode(buffer.getvalue()).decode()
    cases = [
        ({"inputs": []}, 400, "non-empty list"),
        ({"inputs": "abc"}, 400, "non-empty list"),
        ({"inputs": [3]}, 400, "inputs[0] is a int"),
        ({"inputs": ["not base64!"]}, 400, "inputs[0] is not base64"),
        ({"inputs": [base64.b64encode(b"plain text").decode()]}, 400, "not an image"),
        ({"inputs": [image], "top_k": 0}, 400, "'top_k' must be a positive integer"),
        ({"inputs": [image], "topk": 2}, 400, "unknown fields: topk"),
        ({"inputs": [image] * 5}, 400, "5 inputs in one request; at most 4"),
        ({"inputs": [big]}, 400, "300x300 pixels; at most 10000"),
        ([1, 2], 400, "the body must be a JSON object"),
    ]
    service = ModelService(model_dir, poll=0, max_inputs=4, max_pixels=10_000, max_body=32768)
    with running(service) as url:
        for payload, status, message in cases:
            got, answer = call(url, "/predict", payload)
            assert (got, message in answer.get("error", "")) == (status, True), (payload, answer)
        got, answer = call(url, "/predict", raw=b"{not json")
        assert got == 400 and "bad request body" in answer["error"]
        got, answer = call(url, "/predict", {"inputs": ["x" * 40000]})
        assert got == 413 and "over 32768 bytes" in answer["error"]
        assert chunked_post(url, "/predict", [b'{"inputs": ["', b"x" * 40000, b'"]}']) == 413
        got, answer = call(url, "/learn", {"inputs": [image], "labels": ["red"]})
        assert got == 403 and "--allow-learn" in answer["error"]
        assert call(url, "/health")[0] == 200  # still serving


def test_rejection_and_conformal_sets_over_http(tmp_path):
    """``"reject": true`` adds "unknown", "novelty" and "threshold" (equal to the learner's),
    ``"sets"`` conformal sets; bad values and models without calibration get 400."""
    learner = tiny_learner()
    learner.learn(*colour_set(COLOURS, 20))  # every sample a record: 60
    learner.save(tmp_path / "model")
    plain = tiny_learner(calibration_share=0)
    plain.learn(*colour_set(COLOURS, 8))
    plain.save(tmp_path / "plain")
    images = [*queries(1, seed=5), *colour_set(["yellow", "purple"], 1, seed=5)[0]]
    inputs = [png_base64(x) for x in images]
    reference = learner.predict(images, top_k=2, reject=True, reject_rate=0.25, sets=0.2)
    with running(ModelService(tmp_path / "model", poll=0)) as url:
        status, answer = call(url, "/predict", {"inputs": inputs, "top_k": 2, "reject": True,
                                                "reject_rate": 0.25})
        assert status == 200, answer
        assert set(answer) == {"version", "predictions", "unknown", "novelty", "threshold"}
        assert answer["unknown"] == [p.unknown for p in reference]
        assert answer["unknown"][3:] == [True, True]  # yellow and purple
        np.testing.assert_allclose(answer["novelty"], [p.novelty for p in reference], rtol=1e-6)
        assert answer["threshold"] == learner.rejection_threshold(0.25)
        assert_same(answer["predictions"], [p.to_list() for p in reference])
        status, answer = call(url, "/predict", {"inputs": inputs, "sets": 0.2})
        assert status == 200 and set(answer) == {"version", "predictions", "sets"}
        assert answer["sets"] == [list(p.prediction_set) for p in reference]
        status, answer = call(url, "/info")
        assert answer["calibration"]["records"] == 60
        for payload, message in [
            ({"reject": "yes"}, "'reject' must be true or false; got 'yes'"),
            ({"reject": True, "reject_rate": 1.5}, "'reject_rate' (the target false-rejection "
                                                   "rate) must be a number strictly between 0 "
                                                   "and 1; got 1.5"),
            ({"reject": True, "reject_rate": True}, "'reject_rate' (the target"),
            ({"reject_rate": 0.1}, "'reject_rate' applies with \"reject\": true only"),
            ({"sets": 0}, "'sets' (the conformal sets' miscoverage alpha) must be a number"),
            ({"sets": "0.1"}, "'sets' (the conformal sets' miscoverage alpha) must be a number"),
            ({"reject": True, "reject_rate": 0.01}, "holds 60 records, too few for a "
                                                   "false-rejection rate of 0.01"),
            ({"sets": 0.1, "alpha": 0.1}, "unknown fields: alpha"),
        ]:
            got, answer = call(url, "/predict", {"inputs": inputs[:1], **payload})
            assert (got, message in answer.get("error", "")) == (400, True), (payload, answer)
    service = ModelService(tmp_path / "plain", poll=0).start()
    try:
        for payload in ({"reject": True}, {"sets": 0.1}):
            with pytest.raises(RequestError, match="needs a calibrated model, and this one has "
                                                   "no calibration: calibration_share is 0"):
                service.predict({"inputs": inputs[:1], **payload})
        assert "unknown" not in service.predict({"inputs": inputs[:1]})
    finally:
        service.close()


def test_requests_with_and_without_rejection_get_their_own_answers(tmp_path):
    learner = tiny_learner()
    learner.learn(*colour_set(COLOURS, 20))
    learner.save(tmp_path / "model")
    images = [png_base64(x) for x in queries(2, seed=6)]
    service = ModelService(tmp_path / "model", poll=0).start()
    try:
        asks = [{"inputs": images, "top_k": 2}, {"inputs": images, "reject": True,
                                                 "reject_rate": 0.3},
                {"inputs": images[:2], "sets": 0.3}, {"inputs": images[:3]}]
        requests = [service.prepare(ask) for ask in asks]
        futures = [service.submit(r) for r in requests for _ in range(3)]
        answers = [service.answer(r, f.result(60)) for r, f in zip(
            [r for r in requests for _ in range(3)], futures)]
    finally:
        service.close()
    for answer, ask in zip(answers, [a for a in asks for _ in range(3)]):
        assert ("unknown" in answer) == ("reject" in ask) and ("sets" in answer) == ("sets" in ask)
        assert len(answer["predictions"]) == len(ask["inputs"])
        assert len(answer.get("unknown", ask["inputs"])) == len(ask["inputs"])


def chunked_post(url: str, path: str, chunks: list[bytes]) -> int:
    """The status of a POST whose body streams in chunks, without a Content-Length."""
    import http.client

    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        connection.request("POST", path, body=iter(chunks), encode_chunked=True,
                           headers={"Content-Type": "application/json"})
        return connection.getresponse().status
    finally:
        connection.close()


def test_bad_learn_requests_change_nothing(model_dir):
    image = png_base64(queries(1, seed=1)[0])
    with running(ModelService(model_dir, poll=0, allow_learn=True)) as url:
        for payload, message in [
            ({"inputs": [image], "labels": []}, "one per input"),
            ({"inputs": [image], "labels": [""]}, "labels[0]: empty label"),
            ({"inputs": [image], "labels": ["red"], "top_k": 1}, "unknown fields: top_k"),
        ]:
            got, answer = call(url, "/learn", payload)
            assert got == 400 and message in answer["error"], answer
        assert call(url, "/health")[1]["version"] == "v1"
    assert [v.name for v in versions(model_dir)] == ["v1"]


# ---------------------------------------------------------------------- the command and text
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_serving(process: subprocess.Popen, url: str) -> None:
    """Wait until the ``gdacil serve`` in ``process`` answers ``/health`` at ``url``."""
    def up() -> bool:
        assert process.poll() is None, process.stdout.read()
        try:
            return call(url, "/health")[0] == 200
        except OSError:
            return False

    wait_for(up, seconds=120)


def readme_curl_answer(serve_line: str, curl: str) -> dict:
    """The JSON answer of the README's ``curl`` line against the server ``serve_line`` starts."""
    import shlex

    server, url = start_readme_server(serve_line)
    try:
        wait_until_serving(server, url)
        command = shlex.split(curl.replace("localhost:8000", url.removeprefix("http://")))
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)
    finally:
        server.terminate()
        server.communicate(timeout=60)


def start_readme_server(serve_line: str) -> tuple[subprocess.Popen, str]:
    """``gdacil serve`` as the README's ``serve_line`` starts it, on a free port: the process
    and its URL."""
    import shlex

    port = str(free_port())
    argv = [sys.executable, "-m", "gdacil", *shlex.split(serve_line)[1:]]
    argv[argv.index("--port") + 1] = port
    server = subprocess.Popen([*argv, "--log-level", "warning"], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    return server, f"http://127.0.0.1:{port}"


def test_gdacil_serve_command(model_dir):
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "gdacil", "serve", str(model_dir),
                                "--port", str(port), "--poll", "0", "--log-level", "warning"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(process, url)
        images = queries(1, seed=9)
        status, answer = call(url, "/predict", {"inputs": [png_base64(x) for x in images]})
        assert status == 200
        assert_same(answer["predictions"], expected(model_dir, images, top_k=1))
    finally:
        process.terminate()
        output = process.communicate(timeout=60)[0]
    assert f"serving {model_dir} (version v1, 3 classes) on http://127.0.0.1:{port}" in output


@needs_minilm
def test_text_model_under_concurrent_clients_while_learning(tmp_path):
    texts = {"billing": ["I was charged twice this month", "refund my last invoice please",
                         "my card payment failed"],
             "login": ["I cannot sign in to my account", "password reset link is broken",
                       "two-factor code never arrives"]}
    # answers compared across batchings: fp32, whose round-off does not depend on the batch
    # (bf16's does, within the bound test_learner_precision.py checks)
    learner = Learner("minilm", precision="fp32")
    learner.learn([t for ts in texts.values() for t in ts],
                  [c for c, ts in texts.items() for _ in ts])
    learner.save(tmp_path / "tickets")
    asks = [["the invoice amount is wrong"], ["locked out after too many attempts"],
            ["charged for a plan I cancelled", "my login page keeps reloading"]]
    reference = {tuple(a): [p.to_list() for p in learner.predict(a, top_k=2)] for a in asks}
    errors, seen = [], []

    def client(c: int) -> None:
        try:
            for k in range(3):
                ask = asks[(c + k) % len(asks)]
                status, answer = call(url, "/predict", {"inputs": ask, "top_k": 2})
                assert status == 200, answer
                seen.append((tuple(ask), answer))
        except BaseException as exc:
            errors.append(exc)

    with running(ModelService(tmp_path / "tickets", poll=0, allow_learn=True)) as url:
        threads = [threading.Thread(target=client, args=(c,)) for c in range(8)]
        for thread in threads:
            thread.start()
        status, learned = call(url, "/learn", {
            "inputs": ["where is my parcel", "the delivery is late", "tracking shows nothing"],
            "labels": ["shipping"] * 3})
        for thread in threads:
            thread.join()
    assert not errors, errors
    assert status == 200 and learned["new"] == ["shipping"]
    after = Learner.load(tmp_path / "tickets", "v2")
    for ask, answer in seen:
        want = reference[ask] if answer["version"] == "v1" else \
            [p.to_list() for p in after.predict(list(ask), top_k=2)]
        assert_same(answer["predictions"], want)


# ---------------------------------------------------------------------- the README's rejection
#: Support tickets of three queues, 40 each: every combination of one phrase per slot, every
#: 37th of them (each a calibration record: 120 in all)
TICKET_SLOTS = {
    "billing": (["I was charged", "My card was billed", "You took a payment",
                 "The invoice shows a charge", "My bank statement lists a fee",
                 "The receipt has a price", "I paid", "The renewal cost me"],
                ["twice", "the wrong amount", "an extra fee", "more than the advertised price",
                 "after I cancelled", "in the wrong currency", "without my consent",
                 "for a plan I never chose"],
                ["for my subscription", "this month", "on the last invoice", "for the annual plan",
                 "and I want a refund", "please explain", "on my credit card",
                 "for my company account"]),
    "bugs": (["The app crashes", "The page freezes", "The screen goes blank", "The upload fails",
              "The search box stops working", "Notifications stop", "The video player stutters",
              "Sync breaks"],
             ["when I open settings", "after I click save", "on startup",
              "after the latest update", "when I switch to dark mode", "whenever I log in",
              "when I attach a photo", "in the browser"],
             ["on my phone", "every time", "since yesterday", "with an error message",
              "on Android", "on my laptop", "and I lose my work", "for all my files"]),
    "account": (["How do I change", "I want to update", "Please reset", "I cannot find",
                 "Help me recover", "How can I remove", "I need to verify", "Where do I edit"],
                ["my email address", "my password", "my username", "my phone number",
                 "the name on my profile", "my two-factor settings", "my login details",
                 "my recovery email"],
                ["for my account", "please", "on the website", "as soon as possible",
                 "before my trip", "in the app", "for my team", "today"]),
}


def many_tickets() -> tuple[list[str], list[str]]:
    import itertools

    texts, labels = [], []
    for queue, slots in TICKET_SLOTS.items():
        combos = list(itertools.product(*slots))
        texts += [" ".join(combos[37 * i % len(combos)]) for i in range(40)]
        labels += [queue] * 40
    return texts, labels


def readme_rejection_lines() -> list[str]:
    """The ``gdacil serve`` and curl lines of the README's "I don't know" example."""
    import re

    from test_learner_cli import README

    blocks = re.findall(r"```sh\n(gdacil serve .*?)```", README.read_text(encoding="utf-8"),
                        re.S)
    found = [b for b in blocks if '"reject": true' in b]
    assert len(found) == 1, "the README's rejection example is missing"
    return [line for line in found[0].splitlines() if line.strip()]


@needs_minilm
def test_the_readme_rejection_example_works_against_a_live_server(tmp_path, monkeypatch):

    monkeypatch.chdir(tmp_path)
    serve_line, curl = readme_rejection_lines()
    assert serve_line.startswith("gdacil serve tickets-model")
    learner = Learner("minilm")
    learner.learn(*many_tickets())
    learner.save("tickets-model")
    assert learner.calibration.n_records == 120  # enough for the default rate of 5 %
    answer = readme_curl_answer(serve_line, curl)
    assert set(answer) == {"version", "predictions", "unknown", "novelty", "threshold"}
    assert answer["unknown"] == [False, True]  # what the README says
    assert answer["predictions"][0][0]["class"] == "billing"
    assert answer["threshold"] == learner.rejection_threshold()
    assert answer["novelty"][1] < answer["threshold"] < answer["novelty"][0]
