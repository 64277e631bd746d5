"""The console at ``/``: its files ship in the package and are served with a policy that loads
nothing from elsewhere and forbids framing; in a real headless Chromium an operator enters the
token, tries an image the model calls unknown, labels it as a new class from the keyboard,
learns it, sees the next answer name that class, and rolls back. Screenshots are saved."""

from __future__ import annotations

import os
import shutil
import time
import urllib.error
import urllib.request
from importlib.resources import files

import pytest
from test_learner_serve import COLOURS, calibrated_colour_model, running

from gdacil.learner import Learner, versions
from gdacil.learner.inbox import Inbox
from gdacil.learner.serve import CONSOLE_FILES, ModelService

from _assets import needs_chromium, needs_serve, needs_transformers
from test_learner import colour_set

pytestmark = [needs_serve, needs_transformers]
TOKEN = "console-test-token-0123456789abcdef"


@pytest.fixture
def model_dir(tmp_path):
    return calibrated_colour_model(tmp_path / "model")


def test_the_console_ships_in_the_package_and_is_served_locked_down(model_dir):
    import fnmatch
    from pathlib import Path

    import gdacil

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: pytest depends on tomli there
        import tomli as tomllib
    project = tomllib.loads((Path(gdacil.__file__).parents[2] / "pyproject.toml").read_text())
    shipped = project["tool"]["setuptools"]["package-data"]["gdacil"]
    folder = files("gdacil.learner").joinpath("console")
    assert sorted(p.name for p in folder.iterdir()) == sorted(CONSOLE_FILES)
    for name in CONSOLE_FILES:  # in the package, and in a wheel
        assert folder.joinpath(name).is_file(), name
        assert any(fnmatch.fnmatch(f"learner/console/{name}", p) for p in shipped), name
    with running(ModelService(model_dir, poll=0)) as url:
        for path, media in [("/", "text/html"), ("/console/index.html", "text/html"),
                            ("/console/console.js", "text/javascript"),
                            ("/console/console.css", "text/css")]:
            with urllib.request.urlopen(url + path) as response:
                page = response.read().decode()
                assert response.headers["Content-Type"].startswith(media), path
                policy = response.headers["Content-Security-Policy"]
                assert "default-src 'self'" in policy and "frame-ancestors 'none'" in policy
                assert response.headers["X-Frame-Options"] == "DENY"
            assert "http://" not in page and "https://" not in page, path  # nothing fetched
        for path in ("/console/../serve.py", "/console/nothing.js", "/console/__init__.py"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(url + path)
            assert refused.value.code == 404, path
    page = folder.joinpath("index.html").read_text()
    script = folder.joinpath("console.js").read_text()
    assert "<script>" not in page and "innerHTML" not in script and "document.cookie" not in script
    # every control of the page has its label
    for control in ("token", "remember", "try-text", "try-file", "try-top-k", "try-reject",
                    "try-sets"):
        assert f'<label for="{control}">' in page, control


def wait_for(browser, condition, what: str, seconds: float = 30):
    deadline = time.monotonic() + seconds
    while True:
        try:
            value = condition()
            if value:
                return value
        except Exception:  # an element not rendered yet
            pass
        if time.monotonic() > deadline:
            status = browser.find_element("id", "status").text
            raise AssertionError(f"{what}: not seen within {seconds} s (status: {status!r})")
        time.sleep(0.05)


def text_of(browser, element_id: str) -> str:
    return browser.find_element("id", element_id).text


def screenshot(browser, path) -> None:
    """A screenshot of the whole page at ``path``."""
    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.set_window_size(1280, max(900, height + 200))
    browser.execute_script("window.scrollTo(0, 0)")
    browser.save_screenshot(str(path))
    assert path.stat().st_size > 10_000


@needs_chromium
def test_the_operator_teaches_the_model_a_new_class_in_chromium(model_dir, tmp_path):
    from _browser import chromium
    from PIL import Image
    from selenium.webdriver.common.keys import Keys

    yellow = tmp_path / "yellow.png"
    Image.fromarray(colour_set(["yellow"], 1, seed=5)[0][0]).save(yellow)
    shots = tmp_path / "screenshots"
    shots.mkdir()
    service = ModelService(model_dir, poll=0, token=TOKEN, inbox=Inbox(tmp_path / "inbox"))
    with running(service) as url, chromium() as browser:
        browser.get(url + "/")
        wait_for(browser, lambda: text_of(browser, "status") == "Ready.", "the page loaded")
        assert "Enter the server's token" in text_of(browser, "inbox-state")
        assert "red" in text_of(browser, "classes") and "20" in text_of(browser, "classes")
        browser.find_element("id", "token").send_keys(TOKEN)
        browser.find_element("id", "remember").click()
        browser.find_element("id", "use-token").click()
        wait_for(browser, lambda: "Done: using the token" in text_of(browser, "status"),
                 "the token taken")
        assert "v1" in text_of(browser, "versions")

        # an image of a colour the model does not know
        browser.find_element("id", "try-file").send_keys(str(yellow))
        browser.find_element("id", "try-submit").click()
        wait_for(browser, lambda: "UNKNOWN" in text_of(browser, "answer"), "an unknown answer")
        item = wait_for(browser, lambda: browser.find_element(
            "css selector", "#inbox-items > li").get_attribute("data-id"), "the inbox item")
        assert len(Inbox(tmp_path / "inbox").items()) == 1

        # label it as a new class, from the keyboard: type, then Enter submits
        field = browser.find_element("id", f"label-{item}")
        field.send_keys("yellow", Keys.ENTER)
        wait_for(browser, lambda: text_of(browser, f"label-state-{item}") == "Label: yellow",
                 "the label saved")
        assert Inbox(tmp_path / "inbox").get(item).label == "yellow"
        screenshot(browser, shots / "labelled.png")
        browser.set_window_size(1280, 900)

        browser.find_element("id", "learn-labelled").click()
        wait_for(browser, lambda: "version v2 serves 4 classes" in text_of(browser, "status"),
                 "the learn")
        assert "yellow" in text_of(browser, "classes")
        assert not browser.find_elements("css selector", "#inbox-items > li")

        # the same image again: the new version names its class
        browser.find_element("id", "try-submit").click()
        wait_for(browser, lambda: "Answer of version v2" in text_of(browser, "answer"),
                 "the next answer")
        assert "Answer: yellow (known)" in text_of(browser, "answer")
        screenshot(browser, shots / "learned.png")
        browser.set_window_size(1280, 900)

        browser.find_element("id", "rollback-v1").click()
        wait_for(browser, lambda: "version v1 serves 3 classes" in text_of(browser, "status"),
                 "the rollback")
        browser.find_element("id", "try-submit").click()
        wait_for(browser, lambda: "Answer of version v1" in text_of(browser, "answer"),
                 "the answer after the rollback")
        assert "UNKNOWN" in text_of(browser, "answer")
        screenshot(browser, shots / "rolled-back.png")
        assert browser.get_cookies() == []  # the token never travels as a cookie
        assert browser.execute_script(
            "return sessionStorage.getItem('gdacil-token')") == TOKEN
    assert [v.name for v in versions(model_dir)] == ["v1", "v2"]
    assert sorted(Learner.load(model_dir).classes) == sorted(COLOURS)
    keep = os.environ.get("GDACIL_CONSOLE_SCREENSHOTS")
    if keep:  # how docs/images/console.png is made
        shutil.copytree(shots, keep, dirs_exist_ok=True)
