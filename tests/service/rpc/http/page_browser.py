"""Headless Debian Chromium driven by Selenium, for the page's tests: the ``browser`` fixture
(``tests/service/rpc/http/conftest.py`` imports it for the directory), waiting for the page's state,
filling its form, and reading back what it drew."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

__all__ = ["CHROMEDRIVER", "CHROMIUM", "INKED", "browser", "canvas_width", "fill", "text_of",
           "wait_state"]

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
# Drawn pixels: any that is not the canvas's white.
INKED = """const c = document.getElementById(arguments[0]);
const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
let n = 0; for (let i = 0; i < d.length; i += 4) if (d[i] + d[i+1] + d[i+2] < 750) n++;
return [c.width, c.height, n];"""


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    """One headless Chromium per test module; Selenium never downloads anything."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if shutil.which(path) is None:
            pytest.fail(f"{path} missing: run scripts/install_chromium.sh (make test does)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM  # with the driver's path: Selenium Manager never runs
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1200,1500", "--no-proxy-server", "--no-first-run",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--disable-default-apps", "--dns-prefetch-disable"):
        options.add_argument(arg)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SE_OFFLINE", "true")
        driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(20)
    yield driver
    driver.quit()


def wait_state(driver: webdriver.Chrome, *states: str) -> str:
    """Wait until the page's ``body[data-state]`` is one of ``states``; return it."""
    WebDriverWait(driver, 20).until(
        lambda d: d.execute_script("return document.body.dataset.state") in states)
    state: str = driver.execute_script("return document.body.dataset.state")
    return state


def fill(driver: webdriver.Chrome, *, model: str | None = None, mode: str | None = None,
         text: str | None = None, offset: int | None = None, compose: str | None = None,
         truncate: str | None = None) -> None:
    """Set the form's fields that are given (the others keep their values)."""
    for field, value in (("model", model), ("mode", mode), ("compose", compose),
                         ("truncate", truncate)):
        if value is not None:
            Select(driver.find_element(By.ID, field)).select_by_value(value)
    for field, value in (("input", text), ("offset", offset)):
        if value is not None:
            element = driver.find_element(By.ID, field)
            element.clear()
            element.send_keys(str(value))


def text_of(driver: webdriver.Chrome, element_id: str) -> str:
    """An element's text as laid out (Selenium's ``.text``: trimmed, hidden text empty)."""
    return str(driver.find_element(By.ID, element_id).text)


def canvas_width(columns: int) -> int:
    """The width page.js's ``heatmap`` gives a canvas of ``columns`` features."""
    return columns * max(1, min(24, 360 // columns))
