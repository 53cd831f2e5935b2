"""The page at / in a real browser: headless Debian Chromium driven by Selenium loads it from
a real server, submits a request, and the rendered tokens, shape and canvases are checked
(pixels read back through JavaScript). Also: when the page is served at all."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

from service.server import ServerHandle
from tests.http.conftest import request
from tests.tiny_model import DIM, TRAINED_ROWS, start

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
TEXT = "The cat sat on the mat."
IDS = [464, 3797, 3332, 319, 262, 2603, 13]
TOKENS = ["The", " cat", " sat", " on", " the", " mat", "."]
# Drawn pixels: any that is not the canvas's white.
INKED = """const c = document.getElementById(arguments[0]);
const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
let n = 0; for (let i = 0; i < d.length; i += 4) if (d[i] + d[i+1] + d[i+2] < 750) n++;
return [c.width, c.height, n];"""


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
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
    WebDriverWait(driver, 20).until(
        lambda d: d.execute_script("return document.body.dataset.state") in states)
    state: str = driver.execute_script("return document.body.dataset.state")
    return state


def test_page_renders_tokens_shape_and_heatmaps(server: ServerHandle,
                                                browser: webdriver.Chrome) -> None:
    browser.get(f"http://127.0.0.1:{server.http_port}/")
    assert wait_state(browser, "ready", "error") == "ready"
    assert [o.text for o in Select(browser.find_element(By.ID, "model")).options] == [
        "rope", "tiny"]
    Select(browser.find_element(By.ID, "model")).select_by_value("tiny")
    text = browser.find_element(By.ID, "input")
    text.clear()
    text.send_keys(TEXT)
    offset = browser.find_element(By.ID, "offset")
    offset.clear()
    offset.send_keys("3")
    Select(browser.find_element(By.ID, "compose")).select_by_value("token_only")
    browser.find_element(By.ID, "go").click()
    assert wait_state(browser, "done", "error") == "done", \
        browser.find_element(By.ID, "error").text
    rows = [[td.text for td in tr.find_elements(By.TAG_NAME, "td")]
            for tr in browser.find_elements(By.CSS_SELECTOR, "#tokens tbody tr")]
    # Selenium's .text trims; the token column keeps its leading space in the DOM.
    tokens = browser.execute_script(
        "return [...document.querySelectorAll('#tokens td.tok')].map(td => td.textContent)")
    assert tokens == TOKENS
    assert [r[:3] for r in rows] == [[str(i), str(3 + i), str(id_)]
                                     for i, id_ in enumerate(IDS)]
    assert [r[4] for r in rows] == ["untrained" if i >= TRAINED_ROWS else "" for i in IDS]
    shape = browser.find_element(By.ID, "shape").text
    assert shape.startswith(f"embeddings [1, {len(IDS)}, {DIM}] FP32 for compose token_only")
    for canvas in ("heat-token", "heat-position", "heat-sum"):
        width, height, inked = browser.execute_script(INKED, canvas)
        assert (width % DIM, height % len(IDS)) == (0, 0)
        assert inked > width * height // 2, canvas  # random rows: nearly every cell coloured
    width, height, inked = browser.execute_script(INKED, "similarity")
    assert (width, height) == (height, height)
    assert inked > 0
    assert browser.find_element(By.ID, "sumcheck").text == (
        f"sum check: all {len(IDS) * DIM} values of the served sum equal float32(token + "
        f"position) bit for bit")
    shot = os.environ.get("EMBED_PAGE_SCREENSHOT")  # docs/http-page.png is made this way
    if shot:
        assert browser.save_screenshot(shot)


def test_page_shows_the_servers_refusal(server: ServerHandle,
                                        browser: webdriver.Chrome) -> None:
    browser.get(f"http://127.0.0.1:{server.http_port}/")
    assert wait_state(browser, "ready", "error") == "ready"
    Select(browser.find_element(By.ID, "mode")).select_by_value("ids")
    text = browser.find_element(By.ID, "input")
    text.clear()
    text.send_keys("1, 2, 50257")
    browser.find_element(By.ID, "go").click()
    assert wait_state(browser, "done", "error") == "error"
    assert browser.find_element(By.ID, "error").text == (
        "HTTP 400 from /v2/models/rope/tokenize: input_ids[0][2]=50257 is out of range "
        "[0, 50257) for model 'rope'")


@pytest.mark.parametrize(("settings", "served"), [
    ({}, True), ({"ui": False}, False), ({"auth_token": "t"}, False),
    ({"auth_token": "t", "ui": True}, True)])
def test_when_the_page_is_served(tiny_repo: Path, settings: dict[str, object],
                                 served: bool) -> None:
    handle = start(tiny_repo, **settings)
    try:
        for path in ("/", "/page.js", "/page.css"):
            reply = request(handle.http_port, "GET", path)
            assert reply.status == (200 if served else 404), path
        if served:
            assert b"<script src=\"page.js\">" in request(handle.http_port, "GET", "/").body
        # The page's files are open; the data behind them keeps the token.
        assert request(handle.http_port, "POST", "/v2/repository/index").status == (
            401 if "auth_token" in settings else 200)
    finally:
        handle.stop()


def test_ui_and_http_port_flags() -> None:
    from service.config import parse_config

    assert (parse_config([]).http_port, parse_config([]).ui) == (8000, None)
    assert parse_config(["--no-ui"]).ui is False
    assert parse_config(["--ui"]).ui is True
    assert parse_config([], {"EMBED_UI": "0"}).ui is False
    assert parse_config([], {"EMBED_UI": "true"}).ui is True
    assert parse_config(["--no-ui"], {"EMBED_UI": "1"}).ui is False  # the flag wins
    assert parse_config([], {"EMBED_HTTP_PORT": "-1"}).http_port == -1
    with pytest.raises(SystemExit):
        parse_config([], {"EMBED_UI": "maybe"})
