"""Headless Chromium through Selenium and Debian's ``chromium-driver``, for dashboard tests.

Every call blocks: run them in a worker thread (``trio.to_thread.run_sync``). Tests skip without
the browser unless ``RELAXTRIO_REQUIRE_BROWSER=1`` (CI, ``.ci/run``); ``scripts/install_browser.sh``
installs it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")

needs_browser = pytest.mark.skipif(
    (CHROMIUM is None or CHROMEDRIVER is None) and os.environ.get("RELAXTRIO_REQUIRE_BROWSER") != "1",
    reason="needs Debian's chromium and chromium-driver (scripts/install_browser.sh)")
"""Skips a test without the browser, except where CI requires it."""


class Browser:
    """One headless Chromium window (1400 x 1400)."""

    def __init__(self) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service

        assert CHROMIUM and CHROMEDRIVER, "chromium and chromedriver must be on PATH (scripts/install_browser.sh)"
        options = Options()
        options.binary_location = CHROMIUM
        for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--window-size=1400,1400", "--disable-extensions", "--no-first-run"):
            options.add_argument(arg)
        self.driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))

    def wait_for(self, url: str | None, script: str, ready: Callable[[Any], bool],
                 timeout_s: float = 30) -> Any:
        """Loads ``url`` (unless None), then runs ``script`` until ``ready`` holds for its value.

        Raises:
            AssertionError: not ready within ``timeout_s`` (the last value is in the message).
        """
        from selenium.webdriver.support.ui import WebDriverWait

        if url is not None:
            self.driver.get(url)
        seen: list[Any] = []

        def check(driver: Any) -> bool:
            seen.append(driver.execute_script(script))
            return ready(seen[-1])

        try:
            WebDriverWait(self.driver, timeout_s, poll_frequency=0.2).until(check)
        except Exception as exc:
            raise AssertionError(f"page never got ready; last state {seen[-1:]}") from exc
        return seen[-1]

    def screenshot_of(self, element_id: str, path: Path) -> Path:
        """Saves a PNG of the element's parent section (heading included); returns ``path``."""
        from selenium.webdriver.common.by import By

        section = self.driver.find_element(By.ID, element_id).find_element(By.XPATH, "..")
        self.driver.execute_script("arguments[0].scrollIntoView()", section)
        assert section.screenshot(str(path))
        return path

    def quit(self) -> None:
        self.driver.quit()
