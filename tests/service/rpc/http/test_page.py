"""The page at / in a real browser: headless Debian Chromium driven by Selenium loads it from
a real server, submits a request, and the rendered tokens, shape and canvases are checked
(pixels read back through JavaScript). Also: when the page is served at all."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from service.local import ServerHandle
from tests.service.rpc.http.conftest import request
from tests.service.rpc.http.page_browser import (
    INKED,
    fill,
    text_of,
    wait_state,
)
from tests.tiny_model import DIM, TRAINED_ROWS, start

TEXT = "The cat sat on the mat."
IDS = [464, 3797, 3332, 319, 262, 2603, 13]
TOKENS = ["The", " cat", " sat", " on", " the", " mat", "."]


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
        f"check: all {len(IDS) * DIM} values of the served rows equal float32(token + "
        f"position) bit for bit")
    assert browser.find_element(By.ID, "model-facts").text == (
        f"model tiny: family (trained here), position learned, rules none, tables in float32; "
        f"token rows {DIM} wide, served rows {DIM} wide")
    assert browser.find_element(By.ID, "recipe").text == (
        "default compose (token_plus_position) = token_table[ids] + position_table[s..s+T-1]")
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


def test_page_with_a_token(tiny_repo: Path, browser: webdriver.Chrome) -> None:
    """With --auth-token and --ui: the page loads, its /v2 calls need the typed token."""
    handle = start(tiny_repo, auth_token="t0ken", ui=True)
    try:
        browser.get(f"http://127.0.0.1:{handle.http_port}/")
        assert wait_state(browser, "ready", "error") == "error"
        assert browser.find_element(By.ID, "error").text.startswith(
            "HTTP 401 from /v2/repository/index: missing or invalid 'authorization: Bearer "
            "<token>'")
        browser.find_element(By.ID, "token").send_keys("t0ken")
        browser.find_element(By.ID, "input").click()  # leaving the field fires "change"
        assert wait_state(browser, "ready", "error") == "ready"
        browser.find_element(By.ID, "go").click()
        assert wait_state(browser, "done", "error") == "done"
        assert browser.find_element(By.ID, "shape").text.startswith(
            f"embeddings [1, {len(IDS)}, {DIM}] FP32")
    finally:
        handle.stop()


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


def test_page_on_a_model_without_positions(server: ServerHandle,
                                           browser: webdriver.Chrome) -> None:
    """"rope" (position none, no rules): its served rows are its token rows, checked so."""
    browser.get(f"http://127.0.0.1:{server.http_port}/")
    assert wait_state(browser, "ready", "error") == "ready"
    fill(browser, model="rope", text=TEXT, offset=3)
    browser.find_element(By.ID, "go").click()
    assert wait_state(browser, "done", "error") == "done", text_of(browser, "error")
    assert text_of(browser, "sumcheck") == (
        f"check: all {len(IDS) * DIM} values of the served rows equal the token rows (no "
        f"position rows) bit for bit")
    assert text_of(browser, "recipe") == "default compose (token_plus_position) = token_table[ids]"
    assert text_of(browser, "no-position") == (
        "model rope has no position table (position: none): its positions act inside "
        "attention (RoPE or ALiBi), and position_only is refused")
    assert not browser.find_element(By.ID, "heat-position").is_displayed()


@pytest.mark.parametrize(("truncate", "kept"), [("right", IDS[:4]), ("left", IDS[3:])])
def test_page_truncate_control(server: ServerHandle, browser: webdriver.Chrome,
                               truncate: str, kept: list[int]) -> None:
    """The server's "(or set truncate)" refers to a control the page has: 7 tokens at
    start_position 60 of max_seq_len 64 are refused, or cut to 4 from either end."""
    browser.get(f"http://127.0.0.1:{server.http_port}/")
    assert wait_state(browser, "ready", "error") == "ready"
    fill(browser, model="tiny", text=TEXT, offset=60, truncate="none")
    browser.find_element(By.ID, "go").click()
    assert wait_state(browser, "done", "error") == "error"
    assert text_of(browser, "error") == (
        "HTTP 400 from /v2/models/tiny/tokenize: text[0]: start_position (60) + T (7) = 67 "
        "exceeds max_seq_len 64 of model 'tiny' (or set truncate)")
    fill(browser, truncate=truncate)
    browser.find_element(By.ID, "go").click()
    assert wait_state(browser, "done", "error") == "done", text_of(browser, "error")
    rows = [[td.text for td in tr.find_elements(By.TAG_NAME, "td")]
            for tr in browser.find_elements(By.CSS_SELECTOR, "#tokens tbody tr")]
    assert [r[:3] for r in rows] == [[str(i), str(60 + i), str(id_)]
                                     for i, id_ in enumerate(kept)]
    assert text_of(browser, "shape").startswith(
        f"embeddings [1, 4, {DIM}] FP32 for compose token_plus_position")
    assert text_of(browser, "shape").endswith(" · 3 tokens truncated")
    assert text_of(browser, "sumcheck") == (
        f"check: all {4 * DIM} values of the served rows equal float32(token + position) "
        f"bit for bit")
