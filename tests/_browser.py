"""Headless Chromium (Debian's ``chromium`` and ``chromium-driver``) driven through Selenium,
for tests that need a real browser: its same-origin policy, forms and ``fetch``."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

#: Flags for a closed network: nothing in the background tries to reach the internet
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--disable-default-apps", "--window-size=1280,900")


@contextmanager
def chromium(resolve: Sequence[str] = ()) -> Iterator:
    """A Selenium driver of a fresh headless Chromium; host names in ``resolve`` resolve to
    127.0.0.1 (as a DNS-rebinding attacker's domain would)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    with tempfile.TemporaryDirectory(prefix="gdacil-chromium-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = "/usr/bin/chromium"
        for flag in (*FLAGS, f"--user-data-dir={profile}"):
            options.add_argument(flag)
        if resolve:
            rules = ", ".join(f"MAP {name} 127.0.0.1" for name in resolve)
            options.add_argument(f"--host-resolver-rules={rules}")
        driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
        driver.set_page_load_timeout(60)
        driver.set_script_timeout(60)
        try:
            yield driver
        finally:
            driver.quit()
