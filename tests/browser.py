"""A real headless Chromium, driven by Selenium, for the web console's tests.

Debian's `chromium` and `chromium-driver` (`make test` installs them, tests/prerequisites.py
names them): both are found on PATH and handed to Selenium, and SE_OFFLINE keeps Selenium
Manager from fetching a browser or a driver of its own. A missing browser fails the test
naming the packages: the console's test must run wherever `make test` runs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

PACKAGES = "chromium chromium-driver"


class Browser:
    """One headless Chromium whose profile lives in `workdir` (so a browser left behind
    would name the test's temporary directory); `quit` ends it and its children."""

    def __init__(self, workdir: Path) -> None:
        chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
        if chromium is None or driver is None:
            pytest.fail(
                f"the console's browser test needs {PACKAGES} (Debian packages; `make test` "
                f"installs them: apt-get install {PACKAGES})",
                pytrace=False,
            )
        os.environ["SE_OFFLINE"] = "true"  # never download a browser or a driver
        options = webdriver.ChromeOptions()
        options.binary_location = chromium
        for arg in (
            "--headless=new",
            "--no-sandbox",
            "--disable-dev-shm-usage",
            "--window-size=1400,1100",
            f"--user-data-dir={workdir / 'chromium-profile'}",
        ):
            options.add_argument(arg)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        self.driver = webdriver.Chrome(service=Service(executable_path=driver), options=options)

    def open(self, url: str) -> None:
        self.driver.get(url)

    # Read in one script: the page redraws its tables every poll, so elements found one by
    # one may be gone (stale) before they are read.
    def text(self, css: str) -> str:
        """The text of the first element `css` selects ("" if none)."""
        script = "const e = document.querySelector(arguments[0]); return e ? e.textContent : ''"
        return self.driver.execute_script(script, css)

    def rows(self, table: str) -> list[list[str]]:
        """The cells' text of every body row of the table `table` (a CSS selector)."""
        script = (
            "return Array.from(document.querySelectorAll(arguments[0] + ' tbody tr'),"
            " (tr) => Array.from(tr.cells, (td) => td.textContent))"
        )
        return self.driver.execute_script(script, table)

    def search(self, group: str) -> None:
        """Type `group` into the group map's search and submit it."""
        field = self.driver.find_element(By.ID, "group")
        field.clear()
        field.send_keys(group)
        self.driver.find_element(By.CSS_SELECTOR, "#search button").click()

    def errors(self) -> list[dict]:
        """The browser log's SEVERE entries since the last call (JavaScript errors, failed
        loads)."""
        return [e for e in self.driver.get_log("browser") if e["level"] == "SEVERE"]

    def screenshot(self, path: Path) -> None:
        self.driver.save_screenshot(str(path))
        print(f"console screenshot: {path}")

    def quit(self) -> None:
        with contextlib.suppress(WebDriverException):  # the browser is gone already
            self.driver.quit()


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Browser]:
    """A headless Chromium for the test, ended after it."""
    opened = Browser(tmp_path)
    yield opened
    opened.quit()
