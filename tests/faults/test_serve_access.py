"""Who may change a served model: with a token, no route that changes state (``/learn``,
``/rollback``, ``/inbox/{id}/label``, ``/inbox/{id}/discard``, ``/inbox/learn``) nor the
console's data (``/inbox``, ``/versions``) answers without ``Authorization: Bearer <token>``
(not in a cookie, a query or another scheme, nor from a page of another origin even with
it); without a token, only ``--allow-learn`` opens them. The inbox keeps nothing without
``--inbox``, and loses no labelled item across a restart or a learn that fails."""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit

import pytest
from test_learner_serve import COLOURS, calibrated_colour_model, png_base64, running
from test_serve_guards import unwritable

from gdacil.learner import Learner, versions
from gdacil.learner.inbox import Inbox
from gdacil.learner.serve import ModelService

from _assets import needs_serve, needs_transformers
from test_learner import colour_set

pytestmark = [needs_serve, needs_transformers]
TOKEN = "s3cret-token-for-tests-0123456789"
JSON = {"Content-Type": "application/json"}
GRANT = {**JSON, "Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def calibrated_model(tmp_path_factory):
    """A colour model whose rejection works, saved once for the module's tests."""
    return calibrated_colour_model(tmp_path_factory.mktemp("calibrated") / "model")


@pytest.fixture
def model_dir(calibrated_model, tmp_path):
    import shutil

    return shutil.copytree(calibrated_model, tmp_path / "model")


def send(url: str, method: str, path: str, payload=None, headers: dict | None = None,
         raw: bytes | None = None) -> tuple[int, dict, object]:
    """``(status, headers, JSON body)`` of one request with exactly ``headers``."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
    body = raw if raw is not None else (None if payload is None else json.dumps(payload).encode())
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), json.loads(response.read())
    finally:
        connection.close()


def unknown_inputs(n: int, seed: int = 5) -> list[str]:
    """``n`` images of colours the model does not know (it answers them unknown)."""
    return [png_base64(x) for x in colour_set(["yellow", "purple"], n, seed=seed)[0]]


def ask(url: str, inputs: list[str]) -> dict:
    status, _, answer = send(url, "POST", "/predict", {"inputs": inputs, "reject": True}, JSON)
    assert status == 200, answer
    return answer


def inbox_of(url: str, headers=GRANT) -> dict:
    status, _, listing = send(url, "GET", "/inbox", headers=headers)
    assert status == 200, listing
    return listing


def names(model_dir) -> list[str]:
    return [v.name for v in versions(model_dir)]


def changes(item: str, other: str) -> list[tuple[str, str, object]]:
    """Every state-changing request: method, path and body (``item`` and ``other``: inbox
    items)."""
    return [("POST", "/learn", {"inputs": unknown_inputs(1)[:1], "labels": ["planted"]}),
            ("POST", "/rollback", {"version": "v1"}),
            ("POST", f"/inbox/{item}/label", {"label": "planted"}),
            ("POST", f"/inbox/{other}/discard", {}),
            ("POST", "/inbox/learn", {})]


READS = [("GET", "/inbox", None), ("GET", "/versions", None)]


def test_with_a_token_nothing_changes_or_is_read_without_it(model_dir, tmp_path):
    service = ModelService(model_dir, poll=0, token=TOKEN, inbox=Inbox(tmp_path / "inbox"))
    with running(service) as url:
        answer = ask(url, unknown_inputs(2))
        assert answer["unknown"] == [True, True, True, True]
        listing = inbox_of(url)
        assert listing["total"] == 4 and listing["labelled"] == 0
        item, other = (i["id"] for i in listing["items"][:2])
        port = urlsplit(url).port
        refused = [({}, 401), ({"Authorization": f"Bearer {TOKEN[:-1]}"}, 401),
                   ({"Authorization": f"Bearer {TOKEN}x"}, 401),
                   ({"Authorization": f"Basic {TOKEN}"}, 401), ({"Authorization": "Bearer"}, 401),
                   ({"Authorization": TOKEN}, 401), ({"Cookie": f"token={TOKEN}"}, 401),
                   ({"Cookie": f"Authorization=Bearer {TOKEN}"}, 401)]
        for method, path, payload in changes(item, other) + READS:
            for extra, status in refused:
                got, headers, body = send(url, method, path, payload, {**JSON, **extra})
                assert got == status, (path, extra, body)
                assert headers["www-authenticate"].startswith("Bearer"), (path, headers)
                assert "token" in body["error"], body
            got, _, _ = send(url, method, path + f"?token={TOKEN}", payload, JSON)
            assert got == 401, path
            if method == "POST":  # a page of another origin, even one that knows the token
                for forged, status in [({"Origin": "http://evil.example"}, 403),
                                       ({"Origin": f"http://localhost:{port}"}, 403),
                                       ({"Sec-Fetch-Site": "cross-site"}, 403),
                                       ({"Content-Type": "text/plain"}, 415),
                                       ({"Content-Type": "application/x-www-form-urlencoded"},
                                        415)]:
                    got, _, body = send(url, method, path, payload, {**GRANT, **forged})
                    assert got == status, (path, forged, body)
        assert names(model_dir) == ["v1"]
        assert inbox_of(url)["items"] == listing["items"]  # no label, no discard
        # the same requests with the token, from a program or the server's own page
        own = {**GRANT, "Origin": f"http://127.0.0.1:{port}", "Sec-Fetch-Site": "same-origin"}
        results = {path: send(url, method, path, payload, own if n % 2 else GRANT)
                   for n, (method, path, payload) in enumerate(changes(item, other) + READS)}
        assert {path: r[0] for path, r in results.items()} == dict.fromkeys(results, 200), results
        assert results["/learn"][2]["version"] == "v2"
        assert results["/rollback"][2] == {"version": "v1", "classes": 3}
        assert results[f"/inbox/{item}/label"][2]["label"] == "planted"
        assert results["/inbox/learn"][2]["version"] == "v3"
        assert results["/inbox/learn"][2]["learned"] == [item]
        assert [i["id"] for i in results["/inbox"][2]["items"]] == [
            i["id"] for i in listing["items"][2:]]
        assert [v["version"] for v in results["/versions"][2]["versions"]] == ["v1", "v2", "v3"]
        # what anyone may still do: predict, health, info, metrics
        for path in ("/health", "/info"):
            assert send(url, "GET", path)[0] == 200
        assert send(url, "POST", "/predict", {"inputs": unknown_inputs(1)}, JSON)[0] == 200
    assert names(model_dir) == ["v1", "v2", "v3"]


def test_without_a_token_changes_need_allow_learn(model_dir, tmp_path):
    for allow in (False, True):
        inbox = Inbox(tmp_path / f"inbox-{allow}")
        with running(ModelService(model_dir, poll=0, allow_learn=allow, inbox=inbox)) as url:
            ask(url, unknown_inputs(1))
            listing = inbox_of(url, JSON)  # readable: no token to ask for
            item, other = (i["id"] for i in listing["items"])
            for method, path, payload in changes(item, other):
                got, _, body = send(url, method, path, payload, JSON)
                if allow:
                    assert got == 200, (path, body)
                else:
                    assert got == 403 and "--allow-learn" in body["error"], (path, body)
            assert send(url, "GET", "/versions", headers=JSON)[0] == 200
            _, _, info = send(url, "GET", "/info")
            assert info["server"]["allow_learn"] is allow and info["server"]["token"] is False
        assert names(model_dir) == (["v1", "v2", "v3"] if allow else ["v1"])


def test_rollback_serves_the_version_and_refuses_bad_bodies(model_dir):
    service = ModelService(model_dir, poll=0, token=TOKEN)
    with running(service) as url:
        image = unknown_inputs(1)[:1]
        status, _, learned = send(url, "POST", "/learn", {"inputs": image, "labels": ["yellow"]},
                                  GRANT)
        assert status == 200 and learned["version"] == "v2"
        assert ask(url, image)["predictions"][0][0]["class"] == "yellow"
        for payload, status, message in [
                ({}, 400, 'rollback takes {"version": "v2"}'),
                ({"version": "v1", "force": True}, 400, "rollback takes"),
                ([], 400, "rollback takes"), ({"version": None}, 400, "must be a version name"),
                ({"version": True}, 400, "must be a version name"),
                ({"version": "v9"}, 404, "has no version v9 (versions: v1, v2)"),
                ({"version": "../v1"}, 404, "is not a version name")]:
            got, _, body = send(url, "POST", "/rollback", payload, GRANT)
            assert (got, message in body["error"]) == (status, True), (payload, body)
        status, _, body = send(url, "POST", "/rollback", {"version": 1}, GRANT)
        assert (status, body) == (200, {"version": "v1", "classes": 3})
        answer = ask(url, image)
        assert answer["version"] == "v1" and answer["unknown"] == [True]
        status, _, listed = send(url, "GET", "/versions", headers=GRANT)
        assert listed["serving"] == "v1"
        assert [(v["version"], v["current"]) for v in listed["versions"]] == [("v1", True),
                                                                               ("v2", False)]
        status, _, learned = send(url, "POST", "/learn", {"inputs": image, "labels": ["gold"]},
                                  GRANT)
        assert learned["version"] == "v3" and learned["classes"] == 4
    assert sorted(Learner.load(model_dir).classes) == sorted([*COLOURS, "gold"])


def test_no_labelled_item_is_lost_across_a_restart_or_a_failed_learn(model_dir, tmp_path):
    """Label items, stop the server, start another on the same inbox: the labels are there. A
    learn the disk refuses keeps them too; the next one learns them all in one version,
    decoded in chunks of ``max_inputs``, and removes them."""
    inbox_dir = tmp_path / "inbox"
    with running(ModelService(model_dir, poll=0, token=TOKEN, max_inputs=4,
                              inbox=Inbox(inbox_dir))) as url:
        ask(url, unknown_inputs(2))
        ask(url, unknown_inputs(2, seed=6))
        items = inbox_of(url)["items"]
        assert len(items) == 8
        for n, item in enumerate(items[:6]):
            status, _, body = send(url, "POST", f"/inbox/{item['id']}/label",
                                   {"label": "yellow" if n < 2 else "purple"}, GRANT)
            assert status == 200 and body["label"] in ("yellow", "purple"), body
    # a new process: a new service and a new inbox over the same folders
    with running(ModelService(model_dir, poll=0, token=TOKEN, max_inputs=4,
                              inbox=Inbox(inbox_dir))) as url:
        listing = inbox_of(url)
        assert [(i["id"], i["label"]) for i in listing["items"]] == [
            (i["id"], ["yellow", "yellow", "purple", "purple", "purple", "purple", None, None][n])
            for n, i in enumerate(items)]
        assert listing["labelled"] == 6
        with unwritable(model_dir):
            status, _, body = send(url, "POST", "/inbox/learn", {}, GRANT)
            assert status == 503 and "the model is unchanged" in body["error"], body
        assert inbox_of(url)["labelled"] == 6
        status, _, body = send(url, "POST", "/inbox/learn", {}, GRANT)
        assert status == 200 and body["version"] == "v2", body
        assert sorted(body["new"]) == ["purple", "yellow"] and len(body["learned"]) == 6
        assert [i["id"] for i in inbox_of(url)["items"]] == [i["id"] for i in items[6:]]
        status, _, body = send(url, "POST", "/inbox/learn", {}, GRANT)
        assert status == 400 and body["error"] == "no labelled inbox items to learn"
    assert Learner.load(model_dir).class_counts() == {**dict.fromkeys(COLOURS, 20),
                                                      "yellow": 2, "purple": 4}


def test_concurrent_inbox_learns_learn_each_item_once(model_dir, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    with running(ModelService(model_dir, poll=0, token=TOKEN,
                              inbox=Inbox(tmp_path / "inbox"))) as url:
        ask(url, unknown_inputs(1))
        for item in inbox_of(url)["items"]:
            assert send(url, "POST", f"/inbox/{item['id']}/label", {"label": "new"},
                        GRANT)[0] == 200
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda _: send(url, "POST", "/inbox/learn", {}, GRANT),
                                    range(4)))
        assert sorted(a[0] for a in answers) == [200, 400, 400, 400], answers
    assert names(model_dir) == ["v1", "v2"]
    assert Learner.load(model_dir).class_counts()["new"] == 2


def test_the_inbox_keeps_nothing_without_the_flag(model_dir, tmp_path):
    before = sorted(tmp_path.rglob("*"))
    with running(ModelService(model_dir, poll=0, allow_learn=True)) as url:
        assert ask(url, unknown_inputs(2))["unknown"] == [True] * 4
        for method, path in [("GET", "/inbox"), ("POST", "/inbox/learn"),
                             ("POST", "/inbox/000000000001/label")]:
            status, _, body = send(url, method, path, {"label": "x"}, JSON)
            assert status == 404 and "keeps no inbox" in body["error"], (path, body)
    assert sorted(tmp_path.rglob("*")) == before


def test_bad_inbox_requests_are_refused(model_dir, tmp_path):
    with running(ModelService(model_dir, poll=0, token=TOKEN,
                              inbox=Inbox(tmp_path / "inbox"))) as url:
        ask(url, unknown_inputs(1))
        item, second = (i["id"] for i in inbox_of(url)["items"])
        for path, payload, status, message in [
                (f"/inbox/{item}/label", {}, 400, 'labelling takes {"label": "class name"}'),
                (f"/inbox/{item}/label", {"label": ""}, 400, "empty label"),
                (f"/inbox/{item}/label", {"label": "ca\u200bt"}, 400, "invisible character"),
                (f"/inbox/{item}/label", {"label": 1.5}, 400, "must be a string or an integer"),
                ("/inbox/000000000042/label", {"label": "x"}, 404, "no inbox item"),
                ("/inbox/abc/label", {"label": "x"}, 404, "no inbox item 'abc'"),
                (f"/inbox/{item}/discard", {"now": True}, 400, "empty JSON object"),
                ("/inbox/000000000042/discard", {}, 404, "no inbox item")]:
            got, _, body = send(url, "POST", path, payload, GRANT)
            assert (got, message in body["error"]) == (status, True), (path, payload, body)
        for query in ("?limit=0", "?limit=5000", "?offset=-1", "?limit=x"):
            got, _, body = send(url, "GET", "/inbox" + query, headers=GRANT)
            assert got == 400 and "'limit'" in body["error"], (query, body)
        got, _, body = send(url, "GET", "/inbox?offset=1&limit=1", headers=GRANT)
        assert got == 200 and [i["id"] for i in body["items"]] == [second] and body["total"] == 2
        status, _, label = send(url, "POST", f"/inbox/{item}/label", {"label": " Cafe\u0301 "},
                                GRANT)
        assert status == 200 and label["label"] == "Caf\u00e9"  # as every class name is spelt
        status, _, taken = send(url, "POST", f"/inbox/{item}/label", {"label": None}, GRANT)
        assert status == 200 and taken["label"] is None
        status, _, body = send(url, "POST", f"/inbox/{item}/discard", raw=b"", headers=GRANT)
        assert status == 200 and body == {"discarded": item}
        assert inbox_of(url)["total"] == 1


def test_gdacil_serve_with_a_token_file_and_an_inbox(model_dir, tmp_path):
    import subprocess
    import sys

    from test_learner_serve import free_port, wait_until_serving

    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [sys.executable, "-m", "gdacil", "serve", str(model_dir), "--port", str(port),
         "--poll", "0", "--log-level", "warning", "--token-file", str(token_file),
         "--inbox", str(tmp_path / "inbox"), "--inbox-max-items", "3", "--inbox-below", "0.5"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until_serving(process, url)
        ask(url, unknown_inputs(2))
        listing = inbox_of(url)
        assert (listing["total"], listing["max_items"], listing["dropped"]) == (3, 3, 1)
        assert send(url, "GET", "/inbox", headers=JSON)[0] == 401
        image = unknown_inputs(1)[:1]
        assert send(url, "POST", "/learn", {"inputs": image, "labels": ["x"]}, JSON)[0] == 401
        status, _, answer = send(url, "POST", "/learn", {"inputs": image, "labels": ["x"]}, GRANT)
        assert status == 200 and answer["version"] == "v2"
        _, _, info = send(url, "GET", "/info")
        assert info["server"]["token"] is True and info["server"]["inbox"]["below"] == 0.5
    finally:
        process.terminate()
        output = process.communicate(timeout=60)[0]
    assert "changes need the token" in output and "keeping unknown inputs in" in output
    assert TOKEN not in output  # the token is never printed


def test_bad_token_and_inbox_options_are_one_line_errors(model_dir, tmp_path, capsys,
                                                         monkeypatch):
    from gdacil.cli import main

    short = tmp_path / "short"
    short.write_text("abc\n")
    spaced = tmp_path / "spaced"
    spaced.write_text("a token with spaces in it\n")
    for argv, environ, message in [
            (["--token-file", str(short)], None, "the token has 3 characters; at least 16"),
            (["--token-file", str(spaced)], None, "the token holds ' '"),
            (["--token-file", str(tmp_path / "none")], None, "No such file or directory"),
            ([], "short", "environment variable GDACIL_TOKEN: the token has 5 characters"),
            (["--inbox-below", "0.5"], None, "--inbox-below applies with --inbox DIR only")]:
        if environ is None:
            monkeypatch.delenv("GDACIL_TOKEN", raising=False)
        else:
            monkeypatch.setenv("GDACIL_TOKEN", environ)
        assert main(["serve", str(model_dir), *argv]) == 2, argv
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    for option in (["--inbox-below", "0"], ["--inbox-below", "1.5"],
                   ["--inbox-max-items", "0"], ["--inbox-max-mb", "0"]):
        with pytest.raises(SystemExit) as raised:
            main(["serve", str(model_dir), "--inbox", str(tmp_path / "inbox"), *option])
        assert raised.value.code == 2 and f"argument {option[0]}" in capsys.readouterr().err
    assert not (tmp_path / "inbox").exists()
