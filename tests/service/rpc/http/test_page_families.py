"""The page on imported models of every rule (headless Chromium, as test_http_page.py): it
reads each model's family, rules and widths, draws the token rows at the table's width and
the served rows at the model's, names the steps of the default compose, and checks bit for
bit only what it can recompute: no "differ" for a correct model (BERT, OPT's project_in,
BLOOM, Gemma, Llama, GPT-2, OPT, and bf16 ones), every drawn cell has the colour of the
value transformers computes (hidden_states[0], get_input_embeddings()), and a served value one
ulp off, or rows of the wrong width, are still caught."""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from selenium import webdriver
from selenium.webdriver.common.by import By

from service.local import ServerHandle
from tests.hf_models import (
    HIDDEN,
    one_thread,  # noqa: F401  (autouse: the reference on the server's one thread)
    reference,
    served_models,
)
from tests.service.rpc.http.page_browser import (
    INKED,
    canvas_width,
    fill,
    text_of,
    wait_state,
)

IDS = [5, 17, 0, 95, 42, 42, 7, 63, 1, 88, 30]  # T=11, as tests/training/importers/test_families.py
T = len(IDS)
START = 3
N = T * HIDDEN
# model -> (family, dtype); every one is imported by the real importer from a tiny random
# transformers checkpoint (tests/hf_models.py).
MODELS = {"llama": ("llama", torch.float32), "bert": ("bert", torch.float32),
          "opt-proj": ("opt-proj", torch.float32), "bloom": ("bloom", torch.float32),
          "gemma": ("gemma", torch.float32), "gpt2": ("gpt2", torch.float32),
          "opt": ("opt", torch.float32), "gemma-bf16": ("gemma", torch.bfloat16),
          "gpt2-bf16": ("gpt2", torch.bfloat16)}
SUM = f"check: all {N} values of the served rows equal float32(token + position) bit for bit"
TOKEN = f"check: all {N} values of the served rows equal the token rows (no position rows) " \
        f"bit for bit"


def unchecked(name: str, steps: str) -> str:
    return (f"not checked here: the served rows of {name} go through {steps}, which the page "
            f"cannot recompute from the rows it is sent; it shows them as the server returns "
            f"them")


# model -> (model-facts line after "model <name>: ", recipe after "= ", token rows' width,
# whether it has position rows, the check line). Written out from the families' rules
# (service/format/rules.py), not read back from the page.
EXPECTED = {
    "llama": ("family llama, position none, rules none, tables in float32",
              "token_table[ids]", HIDDEN, False, TOKEN),
    "gemma": ("family gemma, position none, rules embed_scale, tables in float32",
              f"token_table[ids] × {HIDDEN ** 0.5:.7g}", HIDDEN, False, TOKEN),
    "gemma-bf16": ("family gemma, position none, rules embed_scale, tables in bfloat16",
                   f"token_table[ids] × {HIDDEN ** 0.5:.7g} (in bfloat16)", HIDDEN, False,
                   TOKEN),
    "bloom": ("family bloom, position none, rules layernorm, tables in float32",
              "LayerNorm(token_table[ids])", HIDDEN, False,
              unchecked("bloom", "LayerNorm (eps 0.00001, with its weight and bias)")),
    "bert": ("family bert, position learned, rules token_type, layernorm, tables in float32",
             "LayerNorm(token_table[ids] + token_type_table[0] + position_table[s..s+T-1])",
             HIDDEN, True, unchecked("bert", "the token-type row, LayerNorm (eps 1e-12, with "
                                             "its weight and bias)")),
    "opt-proj": ("family opt, position learned, rules position_offset, project_in, tables in "
                 "float32", "project_in(token_table[ids]) + position_table[s+2..s+T+1]", 8,
                 True, unchecked("opt-proj", f"project_in (a [{HIDDEN} × 8] matmul)")),
    "opt": ("family opt, position learned, rules position_offset, tables in float32",
            "token_table[ids] + position_table[s+2..s+T+1]", HIDDEN, True, SUM),
    "gpt2": ("family gpt2, position learned, rules none, tables in float32",
             "token_table[ids] + position_table[s..s+T-1]", HIDDEN, True, SUM),
    "gpt2-bf16": ("family gpt2, position learned, rules none, tables in bfloat16",
                  "token_table[ids] + position_table[s..s+T-1]", HIDDEN, True, SUM),
}

# Installed in the page after it loads: every /infer reply for compose arguments[0] is
# changed as arguments[1] says: "ulp" flips the lowest bit of row value 5 (one float32 ulp),
# "as" answers it with compose arguments[2]'s rows instead (rows of another width).
TAMPER = """const [compose, how, other] = arguments;
const real = window.fetch;
window.fetch = async (path, init) => {
  const body = init && init.body ? JSON.parse(init.body) : null;
  if (!String(path).endsWith('/infer') || body.parameters.compose !== compose) {
    return real(path, init);
  }
  if (how === 'as') {
    body.parameters.compose = other;
    return real(path, {...init, body: JSON.stringify(body)});
  }
  const reply = await real(path, init);
  const buffer = await reply.arrayBuffer();
  const at = Number(reply.headers.get('Inference-Header-Content-Length')) + 4 * 5;
  const view = new DataView(buffer);
  view.setUint32(at, view.getUint32(at, true) ^ 1, true);
  return new Response(buffer, {status: reply.status, headers: reply.headers});
};"""


# The colour of each cell of a heatmap canvas, read at the cell's top-left pixel.
CELLS = """const [id, T, C] = arguments;
const canvas = document.getElementById(id);
const w = canvas.width / C, h = canvas.height / T;
const d = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
const out = [];
for (let t = 0; t < T; t++) for (let c = 0; c < C; c++) {
  const at = 4 * (t * h * canvas.width + c * w);
  out.push([d[at], d[at + 1], d[at + 2]]);
}
return out;"""


def colours(rows: torch.Tensor) -> list[list[int]]:
    """page.js's ``color`` of every value of ``rows`` (T, C) on the panel's own scale, in
    the same double arithmetic (``Math.round``: halves up)."""
    values = rows.float().numpy().astype(np.float64).ravel()
    scale = float(np.abs(values).max()) or 1.0
    out = []
    for v in values:
        t = max(-1.0, min(1.0, v / scale))
        x = 255 * (1 - abs(t))
        fade = math.floor(x) + (1 if x - math.floor(x) >= 0.5 else 0)
        out.append([255, fade, fade] if t >= 0 else [fade, fade, 255])
    return out


@pytest.fixture(scope="module")
def families(tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[tuple[ServerHandle, dict[str, Any]]]:
    """One server over the imported models of MODELS, and the transformers models."""
    with served_models(tmp_path_factory.mktemp("page-hf"), MODELS, "llama") as served:
        yield served


def embed(driver: webdriver.Chrome, handle: ServerHandle, name: str,
          compose: str = "token_plus_position", tamper: tuple[str, ...] = ()) -> str:
    """Load the page, submit IDS at START for ``name``; the state it ends in."""
    driver.get(f"http://127.0.0.1:{handle.http_port}/")
    assert wait_state(driver, "ready", "error") == "ready", text_of(driver, "error")
    if tamper:
        driver.execute_script(TAMPER, *tamper)
    fill(driver, model=name, mode="ids", text=",".join(map(str, IDS)), offset=START,
         compose=compose)
    driver.find_element(By.ID, "go").click()
    return wait_state(driver, "done", "error")


@pytest.mark.parametrize("name", list(EXPECTED))
def test_page_shows_and_checks_each_family(families: tuple[ServerHandle, dict[str, Any]],
                                           browser: webdriver.Chrome, name: str) -> None:
    handle, models = families
    facts, recipe, dim, positions, check = EXPECTED[name]
    assert embed(browser, handle, name) == "done", text_of(browser, "error")
    assert text_of(browser, "shape").startswith(
        f"embeddings [1, {T}, {HIDDEN}] FP32 for compose token_plus_position · model {name} "
        f"version 1")
    assert text_of(browser, "model-facts") == (
        f"model {name}: {facts}; token rows {dim} wide, served rows {HIDDEN} wide")
    assert text_of(browser, "recipe") == f"default compose (token_plus_position) = {recipe}"
    assert text_of(browser, "sumcheck") == check
    body = browser.find_element(By.TAG_NAME, "body").text
    assert "differ" not in body
    assert "FAILED" not in body
    # Each panel at its own width: the token rows dim wide, the served rows HIDDEN wide.
    panels = {"heat-token": dim, "heat-sum": HIDDEN} | (
        {"heat-position": HIDDEN} if positions else {})
    for canvas, columns in panels.items():
        width, height, inked = browser.execute_script(INKED, canvas)
        assert (width, height % T) == (canvas_width(columns), 0), canvas
        assert inked > width * height // 2, canvas
    assert browser.find_element(By.ID, "heat-position").is_displayed() == positions
    assert browser.find_element(By.ID, "no-position").is_displayed() == (not positions)
    # What is drawn is what transformers computes: every cell of the served panel has the
    # colour of hidden_states[0], every cell of the token panel that of
    # get_input_embeddings()(ids) (the service equals them bit for bit).
    model = models[name]
    if name == "gpt2-bf16":
        # A plain lookup adds its bf16 rows in fp32 and the page asks for FP32: the rows of
        # the model run in fp32, not transformers' bf16 sum (that is the bfloat16 output).
        model = copy.deepcopy(model).float()
    hidden, token = reference(model, MODELS[name][0], IDS, START)  # (T, C), (T, dim)
    assert browser.execute_script(CELLS, "heat-sum", T, HIDDEN) == colours(hidden)
    assert browser.execute_script(CELLS, "heat-token", T, dim) == colours(token)


def test_page_opt_token_only_is_the_tables_width(families: tuple[ServerHandle, dict[str, Any]],
                                                 browser: webdriver.Chrome) -> None:
    """OPT-350m's shape: compose token_only returns [1, T, 8], the served rows [1, T, 24]."""
    assert embed(browser, families[0], "opt-proj", compose="token_only") == "done"
    assert text_of(browser, "shape").startswith(
        f"embeddings [1, {T}, 8] FP32 for compose token_only")
    assert text_of(browser, "sumcheck") == EXPECTED["opt-proj"][4]


@pytest.mark.parametrize(("name", "what"), [
    ("gpt2", "float32(token + position)"), ("opt", "float32(token + position)"),
    ("gpt2-bf16", "float32(token + position)"),
    ("llama", "the token rows (no position rows)"),
    ("gemma", "the token rows (no position rows)")])
def test_page_catches_one_ulp(families: tuple[ServerHandle, dict[str, Any]],
                              browser: webdriver.Chrome, name: str, what: str) -> None:
    """Where the page claims a check, one served value one ulp off fails it."""
    assert embed(browser, families[0], name, tamper=("token_plus_position", "ulp")) == "done"
    assert text_of(browser, "sumcheck").startswith(
        f"check FAILED: 1 of {N} values differ from {what} (first: token 0, feature 5: "
        f"served ")


@pytest.mark.parametrize(("name", "compose", "other", "shape"), [
    ("opt-proj", "token_only", "token_plus_position", f"[1,{T},{HIDDEN}], expected [1, {T}, 8]"),
    ("opt-proj", "token_plus_position", "token_only", f"[1,{T},8], expected [1, {T}, {HIDDEN}]"),
    ("opt-proj", "position_only", "token_only", f"[1,{T},8], expected [1, {T}, {HIDDEN}]")])
def test_page_catches_rows_of_the_wrong_width(families: tuple[ServerHandle, dict[str, Any]],
                                              browser: webdriver.Chrome, name: str,
                                              compose: str, other: str, shape: str) -> None:
    """Token rows drawn at the served width (or the reverse) are refused, not drawn."""
    assert embed(browser, families[0], name, tamper=(compose, "as", other)) == "error"
    assert text_of(browser, "error") == f"{compose} came back {shape} for this model"
