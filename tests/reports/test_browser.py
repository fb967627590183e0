"""The report opened in headless Chromium (Debian ``chromium`` + ``chromium-driver``, installed by .ci/run).

Every image must load, the console must hold no error, and a full-page screenshot is
taken (kept under the test's tmp_path) and must be a non-blank PNG.
"""

from __future__ import annotations

import base64
import io
import os
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from reports.report import load_sources, write_report
from tests.devices.conftest import require_tool
from tests.reports.fixtures import build_store

#: Flags that keep Chromium off the network and quiet on a machine without a display or GPU.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,900",
)


def _selenium() -> Any:
    try:
        import selenium.webdriver as webdriver
    except ImportError:
        message = "selenium is not installed (pip install 'fleetbench[test]')"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return webdriver


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    webdriver = _selenium()
    from selenium.webdriver.chrome.service import Service

    chromium = require_tool("chromium")
    driver_path = require_tool("chromedriver")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def test_report_renders_in_chromium(browser: Any, tmp_path: Path) -> None:
    from PIL import Image

    db = build_store(tmp_path / "fleetbench.db")
    page, _ = write_report(load_sources(db), tmp_path / "report", now=datetime(2026, 11, 22, tzinfo=timezone.utc))
    browser.get(page.resolve().as_uri())
    assert browser.execute_script("return document.readyState") == "complete"
    sizes = browser.execute_script(
        "return Array.from(document.images).map(i => [i.complete, i.naturalWidth, i.naturalHeight])"
    )
    assert len(sizes) == 9  # 6 profile figures + 3 for the FL run
    assert all(complete and width > 0 and height > 0 for complete, width, height in sizes), sizes
    height = int(browser.execute_script("return document.documentElement.scrollHeight"))
    shot = browser.execute_cdp_cmd(
        "Page.captureScreenshot",
        {
            "format": "png",
            "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": 1280, "height": height, "scale": 1},
        },
    )
    png = base64.b64decode(shot["data"])
    (tmp_path / "report.png").write_bytes(png)
    image = Image.open(io.BytesIO(png)).convert("L")
    assert image.size[0] == 1280 and image.size[1] > 3000
    low, high = image.getextrema()
    assert isinstance(low, int) and isinstance(high, int) and high - low > 100, "the screenshot is blank"
    grey_levels = sum(1 for count in image.resize((64, 256)).histogram() if count)
    assert grey_levels > 20, "the screenshot has almost no content"
    errors = [entry for entry in browser.get_log("browser") if entry.get("level") == "SEVERE"]
    assert errors == []


def test_an_empty_report_renders_too(browser: Any, tmp_path: Path) -> None:
    from harness.store import ProfileStore

    ProfileStore(tmp_path / "empty.db").close()
    page, _ = write_report(load_sources(tmp_path / "empty.db"), tmp_path / "report")
    browser.get(page.resolve().as_uri())
    assert "holds no measured cells yet" in browser.find_element("tag name", "body").text
    assert browser.execute_script("return document.images.length") == 0
    assert [e for e in browser.get_log("browser") if e.get("level") == "SEVERE"] == []
