"""``gdacil serve`` as a security boundary: no page of another origin may change a model, in a
real headless Chromium and over raw HTTP; a foreign ``Host`` (DNS rebinding) is refused; only
JSON bodies change state; no ``reject_rate`` makes a request's cost grow; a learn the disk
refuses, a client that hangs up, a trailing slash are answered as the client's events."""

from __future__ import annotations

import http.client
import json
import logging
import math
import os
import socket
import subprocess
import threading
import time
from contextlib import contextmanager
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_learner_serve import COLOURS, colour_model, png_base64, queries, running

from gdacil.calibration import least_rate, lower_quantile, records_for_rate
from gdacil.learner import Learner, versions
from gdacil.learner.guards import allowed_hosts
from gdacil.learner.serve import MIN_REJECT_RATE, ModelService, create_app

from _assets import needs_chromium, needs_serve, needs_transformers
from test_learner import colour_set, tiny_learner

pytestmark = [needs_serve, needs_transformers]


@pytest.fixture
def model_dir(tmp_path):
    return colour_model(tmp_path)


def request(url: str, method: str, path: str, body: bytes | None = None,
            headers: dict | None = None) -> tuple[int, dict]:
    """``(status, JSON body)`` of one raw HTTP request, with exactly ``headers`` (``Host``
    included when given: http.client then sends no other)."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    headers = dict(headers or {})
    try:
        connection.putrequest(method, path, skip_host="Host" in headers,
                              skip_accept_encoding=True)
        for name, value in headers.items():
            connection.putheader(name, value)
        if body is not None:
            connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body)
        response = connection.getresponse()
        return response.status, json.loads(response.read() or b"null")
    finally:
        connection.close()


def names(model_dir) -> list[str]:
    """The model's version names."""
    return [v.name for v in versions(model_dir)]


def learn_body(label: str = "planted") -> bytes:
    image = png_base64(queries(1, seed=3)[0])
    return json.dumps({"inputs": [image], "labels": [label]}).encode()


# ---------------------------------------------------------------------- Host
def test_a_foreign_host_is_refused_before_anything_is_read(model_dir):
    """DNS rebinding: a page of evil.example whose name resolves to this machine sends its own
    name as Host. It reads nothing and changes nothing; the server's own names work."""
    with running(ModelService(model_dir, poll=0, allow_learn=True)) as url:
        port = urlsplit(url).port
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost", "LOCALHOST."):
            status, answer = request(url, "GET", "/info", headers={"Host": host})
            assert status == 200 and answer["classes"], (host, answer)
        for host in (f"evil.example:{port}", "evil.example", f"[::1]:{port}", "10.0.0.7",
                     f"127.0.0.1.evil.example:{port}", "a:b:c", f"localhost:{port}x", ""):
            for method, path, body in (("GET", "/info", None), ("GET", "/health", None),
                                       ("POST", "/learn", learn_body())):
                headers = {"Host": host, "Content-Type": "application/json"}
                status, answer = request(url, method, path, body, headers)
                assert status == 400 and "is not a name this server answers to" in \
                    answer["error"] and "--allowed-host" in answer["error"], (host, answer)
                assert "classes" not in answer
    assert names(model_dir) == ["v1"]


def test_allowed_hosts_name_more_and_a_wildcard_bind_answers_any_address(model_dir):
    hosts = allowed_hosts("0.0.0.0", ["API.example.com", "*.corp.example"])
    assert hosts == ("0.0.0.0", "localhost", "127.0.0.1", "::1", "api.example.com",
                     "*.corp.example")
    assert allowed_hosts("127.0.0.1") == ("127.0.0.1", "localhost")
    for bad in ("*evil", "a.*.b", "**.x", " "):
        with pytest.raises(ValueError, match="--allowed-host"):
            allowed_hosts("127.0.0.1", [bad])
    service = ModelService(model_dir, poll=0)
    wrap = partial(_swap_app, create_app(service, allowed_hosts=hosts, any_address=True))
    with running(service, wrap=wrap) as url:
        for host, want in (("10.1.2.3:80", 200), ("[fe80::1]:8000", 200), ("[::1]", 200),
                           ("api.example.com", 200), ("x.corp.example", 200),
                           ("a.b.corp.example:9", 200), ("corp.example", 400),
                           ("evil.example", 400), ("api.example.com.evil", 400),
                           ("10.1.2.3.nip.example", 400)):
            status, answer = request(url, "GET", "/health", headers={"Host": host})
            assert status == want, (host, answer)


def _swap_app(app, _ignored):
    """A ``running(wrap=...)`` that serves ``app`` instead of the default application."""
    return app


# ---------------------------------------------------------------------- Origin, Content-Type
def test_state_changes_take_only_json_bodies(model_dir):
    """The bodies a browser may send to another origin without asking: text/plain (a form
    whose field name is a JSON prefix), url-encoded, multipart; and none at all."""
    with running(ModelService(model_dir, poll=0, allow_learn=True)) as url:
        body = learn_body()
        for content_type in ("text/plain", "text/plain;charset=UTF-8",
                             "application/x-www-form-urlencoded",
                             "multipart/form-data; boundary=x", "application/jsonp",
                             "application/json-seq", None):
            headers = {"Content-Type": content_type} if content_type else {}
            for path in ("/learn", "/predict"):
                status, answer = request(url, "POST", path, body, headers)
                assert status == 415 and "Content-Type: application/json" in answer["error"], \
                    (content_type, path, answer)
        predict = json.dumps({"inputs": json.loads(body)["inputs"]}).encode()
        for content_type in ("application/json; charset=utf-8", "Application/JSON",
                             "application/problem+json"):
            status, answer = request(url, "POST", "/predict", predict,
                                     {"Content-Type": content_type})
            assert status == 200 and answer["version"] == "v1", (content_type, answer)
    assert names(model_dir) == ["v1"]


def test_only_the_servers_own_origin_may_change_the_model(model_dir):
    with running(ModelService(model_dir, poll=0, allow_learn=True)) as url:
        port = urlsplit(url).port
        json_type = {"Content-Type": "application/json"}
        refused = [{"Origin": "http://evil.example"}, {"Origin": "null"},
                   {"Origin": f"http://127.0.0.1:{port + 1}"},
                   {"Origin": f"http://localhost:{port}"},  # another name is another origin
                   {"Origin": "http://127.0.0.1"}, {"Origin": "file://"},
                   {"Origin": f"ftp://127.0.0.1:{port}"}, {"Origin": "http://[bad"},
                   {"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"},
                   {"Origin": f"http://127.0.0.1:{port}", "Sec-Fetch-Site": "cross-site"}]
        for extra in refused:
            for path in ("/learn", "/predict"):
                status, answer = request(url, "POST", path, learn_body(), {**json_type, **extra})
                assert status == 403 and ("refused" in answer["error"]
                                          or "cannot change" in answer["error"]), \
                    (extra, path, answer)
        assert names(model_dir) == ["v1"]
        for n, extra in enumerate([{"Origin": f"http://127.0.0.1:{port}"},
                                   {"Origin": f"http://127.0.0.1:{port}",
                                    "Sec-Fetch-Site": "same-origin"},
                                   {"Sec-Fetch-Site": "none"}, {}]):
            status, answer = request(url, "POST", "/learn", learn_body(f"own-{n}"),
                                     {**json_type, **extra})
            assert status == 200 and answer["version"] == f"v{n + 2}", (extra, answer)


class Recorder:
    """ASGI middleware: every request's method, path and answer status, in order."""

    def __init__(self, app):
        self.app, self.seen = app, []

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def recording_send(message):
            if message["type"] == "http.response.start":
                self.seen.append((scope["method"], scope["path"], message["status"]))
            await send(message)

        await self.app(scope, receive, recording_send)


ATTACK_PAGE = """<!doctype html><title>loading</title>
<iframe name="sink"></iframe>
<form id="plain" method="post" enctype="text/plain" target="sink" action="{target}/learn">
  <input name='{plain_name}' value='"]}}'></form>
<form id="urlencoded" method="post" target="sink" action="{target}/learn">
  <input name="inputs" value="{image}"><input name="labels" value="planted-form"></form>
<script>
const target = "{target}";
const json = '{json}';
const done = [];
function settle(p) {{ done.push(p.then(() => "sent", e => "error: " + e)); }}
settle(fetch(target + "/learn", {{method: "POST", mode: "no-cors", body: json}}));
settle(fetch(target + "/learn", {{method: "POST", mode: "no-cors",
  headers: {{"Content-Type": "text/plain"}}, body: json}}));
settle(fetch(target + "/learn", {{method: "POST", mode: "no-cors",
  body: new URLSearchParams({{[json]: ""}})}}));
const form = new FormData(); form.append("inputs", "{image}"); form.append("labels", "x");
settle(fetch(target + "/learn", {{method: "POST", mode: "no-cors", body: form}}));
settle(fetch(target + "/learn", {{method: "POST", headers: {{"Content-Type": "application/json"}},
  body: json}}));
settle(Promise.resolve(navigator.sendBeacon(target + "/learn",
  new Blob([json], {{type: "text/plain"}}))));
const xhr = new XMLHttpRequest(); xhr.open("POST", target + "/learn");
xhr.setRequestHeader("Content-Type", "text/plain"); xhr.send(json);
let forms = 0;
document.querySelector("iframe").onload = () => {{
  forms += 1;
  if (forms === 1) document.getElementById("urlencoded").submit();
  if (forms === 2) Promise.all(done).then(r => {{ window.results = r; document.title = "done"; }});
}};
document.getElementById("plain").submit();
</script>"""


@contextmanager
def attack_site(page: str):
    """A second web server on loopback (another origin) serving ``page`` at ``/``."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            data = page.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@needs_chromium
def test_a_page_of_another_origin_cannot_teach_the_model_in_chromium(model_dir):
    """A page the operator merely opens, on another site, posts to ``/learn`` of a served
    ``--allow-learn`` model every way a browser allows: a text/plain form whose field name is a
    JSON prefix (no script at all), a url-encoded form, no-cors fetches of text, url-encoded and
    multipart bodies, a JSON fetch (preflighted), a beacon, an XHR. The requests arrive, each
    is refused, and the model has still one version. Then a DNS-rebinding page (its domain
    resolving to 127.0.0.1) reads neither /info nor /predict and cannot learn either."""
    from _browser import chromium

    image = png_base64(queries(1, seed=3)[0])
    payload = {"inputs": [image], "labels": ["planted"]}
    service = ModelService(model_dir, poll=0, allow_learn=True)
    holder: dict = {}

    def recorded(app):
        holder["recorder"] = Recorder(app)
        return holder["recorder"]

    with running(service, wrap=recorded) as url, chromium(["attacker.test", "rebind.test"]) \
            as browser:
        port = urlsplit(url).port
        for target in (url, f"http://localhost:{port}"):
            page = ATTACK_PAGE.format(
                target=target, image=image, json=json.dumps(payload),
                plain_name=json.dumps(payload)[: -len('"]}')].replace("'", "&#39;"))
            with attack_site(page) as attacker_port:
                browser.get(f"http://attacker.test:{attacker_port}/")
                deadline = time.monotonic() + 60
                while browser.title != "done":
                    assert time.monotonic() < deadline, "the attack page did not finish"
                    time.sleep(0.1)
        learns = [s for m, p, s in holder["recorder"].seen if (m, p) == ("POST", "/learn")]
        # two forms, four no-cors fetches, a beacon and an XHR per target reach the server
        # (the JSON fetch stops at its preflight, an OPTIONS that is never granted)
        assert len(learns) == 16, holder["recorder"].seen
        assert all(s in (403, 415) for s in learns), holder["recorder"].seen
        preflights = [s for m, p, s in holder["recorder"].seen if m == "OPTIONS"]
        assert preflights and all(s >= 400 for s in preflights)

        browser.get(f"http://rebind.test:{port}/info")
        assert "is not a name this server answers to" in browser.page_source
        assert "green" not in browser.page_source
        result = browser.execute_async_script(
            """const done = arguments[arguments.length - 1];
            const post = (path, body) => fetch(path, {method: "POST",
              headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)})
              .then(r => r.text().then(t => [r.status, t]));
            Promise.all([fetch("/info").then(r => r.status),
                         post("/predict", {inputs: arguments[0].inputs}),
                         post("/learn", arguments[0])]).then(done, e => done(String(e)));""",
            payload)
        assert result[0] == 400 and result[1][0] == 400 and result[2][0] == 400, result
        assert "green" not in result[1][1]
    assert names(model_dir) == ["v1"]
    assert sorted(Learner.load(model_dir).classes) == sorted(COLOURS)


# ---------------------------------------------------------------------- reject_rate
def test_the_records_a_rate_needs_are_computed_in_closed_form():
    """As the defining inequality says, for rates of every size (the count was found by
    counting up, one record at a time: 1e-300 never ended)."""
    for rate in (0.05, 0.1, 1 / 3, 0.01, 1e-3, 1e-7, 1e-17, 1e-300):
        n = records_for_rate(rate)
        assert math.floor(rate * (n + 1)) >= 1
        if n < 2**52:  # beyond, neighbouring counts are the same float
            assert n == 0 or math.floor(rate * n) < 1
    assert records_for_rate(5e-324) is None and records_for_rate(1e-310) is None
    assert records_for_rate(0.05) == 19  # the README's "5 % needs at least 19 records"
    assert least_rate(19) == 0.05 and least_rate(99) == 0.01 and least_rate(10**6) == 0.001


@settings(max_examples=300, deadline=None)
@given(st.floats(min_value=1e-4, max_value=1.0, exclude_max=True))
def test_records_for_rate_equals_the_count_it_replaces(rate):
    import torch

    n = records_for_rate(rate)
    assert lower_quantile(torch.arange(float(n)), rate) >= 0  # finite: a record's score
    assert lower_quantile(torch.arange(float(n - 1)), rate) == -math.inf


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    path = tmp_path_factory.mktemp("calibrated") / "model"
    learner = tiny_learner()
    learner.learn(*colour_set(COLOURS, 20))  # every sample a record: 60
    learner.save(path)
    return path


@settings(max_examples=60, deadline=None)
@given(st.floats(min_value=0, max_value=1, exclude_min=True, exclude_max=True))
def test_any_reject_rate_is_answered_at_once(calibrated, rate):
    """Every rate gets a threshold or a one-line error saying how many records it needs, in
    bounded time (the property the scheduler's fairness rests on)."""
    learner = Learner.load(calibrated)
    started = time.perf_counter()
    try:
        threshold = learner.rejection_threshold(rate)
    except ValueError as exc:
        assert "too few for a false-rejection rate" in str(exc) and "\n" not in str(exc)
        assert len(str(exc)) < 600
    else:
        assert math.isfinite(threshold) and rate >= 1 / 61
    assert time.perf_counter() - started < 1.0


def test_a_tiny_reject_rate_over_http_is_refused_at_once(calibrated):
    image = png_base64(queries(1, seed=1)[0])
    with running(ModelService(calibrated, poll=0)) as url:
        for rate in (1e-300, 5e-324, MIN_REJECT_RATE / 2):
            started = time.perf_counter()
            status, answer = request(url, "POST", "/predict", json.dumps(
                {"inputs": [image], "reject": True, "reject_rate": rate}).encode(),
                {"Content-Type": "application/json"})
            assert status == 400 and f"at least {MIN_REJECT_RATE:g}" in answer["error"]
            assert time.perf_counter() - started < 5
        status, answer = request(url, "POST", "/predict", json.dumps(
            {"inputs": [image], "reject": True, "reject_rate": MIN_REJECT_RATE}).encode(),
            {"Content-Type": "application/json"})
        assert status == 400 and "60 records, too few" in answer["error"] \
            and "at least 999999" in answer["error"], answer


# ---------------------------------------------------------------------- the client's events
def test_a_learn_with_a_trailing_slash_is_a_json_404(model_dir):
    with running(ModelService(model_dir, poll=0, allow_learn=True)) as url:
        for path in ("/learn/", "/predict/", "/info/"):
            method = "GET" if path == "/info/" else "POST"
            status, answer = request(url, method, path, learn_body() if method == "POST" else None,
                                     {"Content-Type": "application/json"})
            assert status == 404 and answer == {"error": "Not Found"}, (path, answer)
    assert names(model_dir) == ["v1"]


def test_clients_that_hang_up_mid_body_are_not_server_failures(model_dir, caplog):
    with running(ModelService(model_dir, poll=0)) as url:
        parts = urlsplit(url)
        with caplog.at_level(logging.DEBUG):
            for _ in range(10):
                with socket.create_connection((parts.hostname, parts.port)) as client:
                    client.sendall(
                        f"POST /predict HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: "
                        "application/json\r\nContent-Length: 100000\r\n\r\n{\"inputs\": [".encode())
                time.sleep(0.05)
            time.sleep(0.5)
            status, answer = request(url, "POST", "/predict", json.dumps(
                {"inputs": [png_base64(queries(1, seed=1)[0])]}).encode(),
                {"Content-Type": "application/json"})
    assert status == 200 and answer["version"] == "v1"
    failures = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not failures, [r.getMessage() for r in failures]
    assert sum("disconnected before its body arrived" in r.getMessage()
               for r in caplog.records) == 10


@contextmanager
def unwritable(path: Path):
    """``path`` read-only, for real: a read-only bind mount when running as root (who may
    write through any permission bits), else the permission bits."""
    if os.geteuid() == 0:
        subprocess.run(["mount", "--bind", str(path), str(path)], check=True)
        try:
            subprocess.run(["mount", "-o", "remount,bind,ro", str(path)], check=True)
            yield
        finally:
            subprocess.run(["umount", str(path)], check=True)
    else:
        modes = {p: p.stat().st_mode for p in [path, *path.rglob("*")] if p.is_dir()}
        for p in modes:
            p.chmod(0o555)
        try:
            yield
        finally:
            for p, mode in modes.items():
                p.chmod(mode)


def test_a_learn_the_disk_refuses_is_a_json_503_naming_the_file(model_dir):
    before = sorted(p.relative_to(model_dir) for p in model_dir.rglob("*"))
    with running(ModelService(model_dir, poll=0, allow_learn=True)) as url:
        with unwritable(model_dir):
            status, answer = request(url, "POST", "/learn", learn_body(),
                                     {"Content-Type": "application/json"})
            assert status == 503 and str(model_dir) in answer["error"] \
                and "the model is unchanged" in answer["error"], answer
            status, health = request(url, "GET", "/health")
            assert status == 200 and health["version"] == "v1"
            assert sorted(p.relative_to(model_dir) for p in model_dir.rglob("*")) == before
        status, answer = request(url, "POST", "/learn", learn_body(),
                                 {"Content-Type": "application/json"})
        assert status == 200 and answer["version"] == "v2"
    assert names(model_dir) == ["v1", "v2"]


def test_class_names_with_invisible_characters_are_refused(model_dir):
    with running(ModelService(model_dir, poll=0, allow_learn=True)) as url:
        for label in ("ca\u200bt", "\ufeffcat", "c\u2028at", "\u202egreen", "gr\u2066een",
                      "ca\u200dt", "so\u00adft"):
            status, answer = request(url, "POST", "/learn", learn_body(label),
                                     {"Content-Type": "application/json"})
            assert status == 400 and "invisible character" in answer["error"], (label, answer)
        assert names(model_dir) == ["v1"]
        for label in ("\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645",  # Persian, ZWNJ
                      "\u0915\u094d\u200d\u0937",  # Devanagari conjunct, ZWJ after a virama
                      "\U0001F468\u200d\U0001F469"):  # an emoji sequence
            status, answer = request(url, "POST", "/learn", learn_body(label),
                                     {"Content-Type": "application/json"})
            assert status == 200 and answer["new"] == [label], (label, answer)


def test_a_body_of_too_many_json_values_is_refused_unparsed(model_dir):
    """Parsing holds the interpreter for every client: 30 MB of nested lists took 3.6 s."""
    from gdacil.learner.serve import MAX_JSON_SEPARATORS

    nested = b'{"inputs": [' + b",".join([b"[[1],[2]]"] * (MAX_JSON_SEPARATORS // 5 + 1)) + b"]}"
    with running(ModelService(model_dir, poll=0)) as url:
        status, answer = request(url, "POST", "/predict", nested,
                                 {"Content-Type": "application/json"})
        assert status == 413 and f"at most {MAX_JSON_SEPARATORS:,}" in answer["error"], answer
        texts = json.dumps({"inputs": ["a, [b], {c}" * 1000] * 30}).encode()  # 120,000: parsed
        status, answer = request(url, "POST", "/predict", texts,
                                 {"Content-Type": "application/json"})
        assert status == 400 and "not base64" in answer["error"], answer


def test_gdacil_serve_answers_allowed_hosts_and_caps_connections(model_dir):
    """``--allowed-host`` adds a name; ``--max-connections`` is a documented limit: idle
    connections count, the ones beyond are answered 503 until those close (put a proxy that
    times out idle clients in front: docs/learner.md, "Deploying it")."""
    import sys

    from test_learner_serve import free_port, wait_until_serving

    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "gdacil", "serve", str(model_dir), "--port", str(port),
         "--poll", "0", "--max-connections", "4", "--allowed-host", "api.example",
         "--allowed-host", "*.corp.example", "--log-level", "error"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(process, url)
        for host, want in (("api.example", 200), ("a.corp.example:1", 200), ("evil", 400)):
            assert request(url, "GET", "/health", headers={"Host": host})[0] == want, host
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
        time.sleep(0.3)
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        connection.request("GET", "/health")
        assert connection.getresponse().status == 503
        connection.close()
        for client in idle:
            client.close()
        time.sleep(0.3)
        assert request(url, "GET", "/health")[0] == 200
    finally:
        process.terminate()
        output = process.communicate(timeout=60)[0]
    assert "answering Host 127.0.0.1, localhost, api.example, *.corp.example" in output


def test_parsing_pauses_the_garbage_collector_and_restores_it():
    """Concurrent parses, good and bad bodies: the collector is off while any parse runs and
    on again after the last, as it was before."""
    import gc
    from concurrent.futures import ThreadPoolExecutor

    from gdacil.learner.serve import RequestError, _json_body

    seen = []

    def parse(body: bytes):
        seen.append(gc.isenabled())
        try:
            return _json_body(body)
        except RequestError as exc:
            return exc.status

    bodies = [b'{"inputs": [' + b",".join([b"[1]"] * 50_000) + b"]}", b"{bad", b"\xff"] * 8
    assert gc.isenabled()
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(parse, bodies))
    assert gc.isenabled() and answers[1::3] == [400] * 8 and answers[2::3] == [400] * 8
    assert all(len(a["inputs"]) == 50_000 for a in answers[::3])
    gc.disable()
    try:
        _json_body(b"{}")
        assert not gc.isenabled()  # a collector the process turned off stays off
    finally:
        gc.enable()
