// The page: calls this server's /v2 REST endpoints (Open Inference Protocol) and draws
// what comes back. No framework, no build step, nothing fetched from anywhere else.
"use strict";

const $ = (id) => document.getElementById(id);

function headers() {
  const h = { "Content-Type": "application/json" };
  const token = $("token").value.trim();
  if (token) h.Authorization = "Bearer " + token;
  return h;
}

async function call(path, body) {
  const response = await fetch(path, { method: "POST", headers: headers(), body: JSON.stringify(body) });
  if (!response.ok) {
    let message = response.statusText;
    try { message = (await response.json()).error; } catch (e) { /* not JSON */ }
    throw new Error(`HTTP ${response.status} from ${path}: ${message}`);
  }
  return response;
}

function modelPath() {
  const model = encodeURIComponent($("model").value);
  const version = $("version").value;
  return `/v2/models/${model}` + (version ? `/versions/${version}` : "");
}

// parseIdList: the id-list grammar of every client tool (client/grammar.py,
// client/node/grammar.js; tests/vectors/client_inputs.json is the shared table, and
// client/node/test/grammar.test.js runs this very function against it). Integers separated
// by commas; spaces, tabs and line breaks around an item are ignored; anything else throws,
// naming the item.
function parseIdList(text) {
  const form = "give integers separated by commas, e.g. 1,2,3";
  const blank = /^[ \t\r\n]+|[ \t\r\n]+$/g;
  if (text.replace(blank, "") === "") throw new Error(`no token ids: ${form}`);
  return text.split(",").map((raw, i) => {
    const item = raw.replace(blank, "");
    if (item === "") throw new Error(`item ${i + 1} of the token ids is empty: ${form}`);
    if (!/^-?[0-9]+$/.test(item)) {
      throw new Error(`item ${i + 1} of the token ids, '${item}', is not an integer: ${form}`);
    }
    const value = Number(item);
    if (!Number.isSafeInteger(value)) {
      throw new Error(`item ${i + 1} of the token ids, '${item}', is beyond ±${Number.MAX_SAFE_INTEGER}`);
    }
    return value;
  });
}
// end parseIdList

function inputTensor() {
  const raw = $("input").value;
  if ($("mode").value === "text") {
    return { name: "text", datatype: "BYTES", shape: [1], data: [raw] };
  }
  const ids = parseIdList(raw);
  return { name: "input_ids", datatype: "INT64", shape: [1, ids.length], data: ids };
}

function request(compose) {
  return {
    inputs: [inputTensor()],
    parameters: { start_position: Number($("offset").value || 0), compose: compose },
    // Binary output: the rows arrive as little-endian float32 after the JSON header.
    outputs: [{ name: "embeddings", parameters: { binary_data: true } }],
  };
}

async function infer(compose) {
  const response = await call(modelPath() + "/infer", request(compose));
  const length = Number(response.headers.get("Inference-Header-Content-Length"));
  const buffer = await response.arrayBuffer();
  const header = JSON.parse(new TextDecoder().decode(buffer.slice(0, length)));
  const out = header.outputs.find((o) => o.name === "embeddings");
  const size = out.parameters.binary_data_size;
  const rows = new Float32Array(buffer.slice(length, length + size));
  return { header, shape: out.shape, datatype: out.datatype, rows };
}

async function loadModels() {
  const index = await (await call("/v2/repository/index", { ready: true })).json();
  const versions = {};
  for (const row of index) (versions[row.name] = versions[row.name] || []).push(row.version);
  const model = $("model");
  model.innerHTML = "";
  for (const name of Object.keys(versions).sort()) model.add(new Option(name, name));
  const fill = () => {
    const v = $("version");
    v.innerHTML = "";
    v.add(new Option("newest", ""));
    for (const version of versions[model.value] || []) v.add(new Option(version, version));
  };
  model.onchange = fill;
  fill();
}

// Diverging blue-white-red, symmetric around 0, per panel.
function color(value, scale) {
  const t = Math.max(-1, Math.min(1, value / (scale || 1)));
  const fade = Math.round(255 * (1 - Math.abs(t)));
  return t >= 0 ? [255, fade, fade] : [fade, fade, 255];
}

function heatmap(canvas, rows, T, C, scale, square) {
  let cellW = Math.max(1, Math.min(24, Math.floor(360 / C)));
  let cellH = Math.max(2, Math.min(22, Math.floor(300 / T)));
  if (square) cellW = cellH = Math.min(cellW, cellH);
  canvas.width = C * cellW;
  canvas.height = T * cellH;
  const ctx = canvas.getContext("2d");
  const image = ctx.createImageData(canvas.width, canvas.height);
  if (scale === undefined) scale = rows.reduce((m, v) => Math.max(m, Math.abs(v)), 0);
  for (let y = 0; y < canvas.height; y++) {
    const t = Math.floor(y / cellH);
    for (let x = 0; x < canvas.width; x++) {
      const [r, g, b] = color(rows[t * C + Math.floor(x / cellW)], scale);
      const at = 4 * (y * canvas.width + x);
      image.data[at] = r; image.data[at + 1] = g; image.data[at + 2] = b; image.data[at + 3] = 255;
    }
  }
  ctx.putImageData(image, 0, 0);
}

function similarity(rows, T, C) {
  const norms = [];
  for (let i = 0; i < T; i++) {
    let s = 0;
    for (let c = 0; c < C; c++) s += rows[i * C + c] ** 2;
    norms.push(Math.sqrt(s) || 1);
  }
  const sim = new Float32Array(T * T);
  for (let i = 0; i < T; i++) {
    for (let j = 0; j < T; j++) {
      let dot = 0;
      for (let c = 0; c < C; c++) dot += rows[i * C + c] * rows[j * C + c];
      sim[i * T + j] = dot / (norms[i] * norms[j]);
    }
  }
  return sim;
}

function renderTokens(info) {
  const body = $("tokens").tBodies[0];
  body.innerHTML = "";
  const seq = info.sequences[0];
  seq.ids.forEach((id, i) => {
    const tr = body.insertRow();
    tr.className = "token";
    const token = seq.tokens ? JSON.stringify(seq.tokens[i]).slice(1, -1) : "";
    const untrained = seq.untrained ? seq.untrained[i] : null;
    const cells = [i, seq.start_position + i, id, token,
                   untrained === null ? "n/a" : untrained ? "untrained" : ""];
    cells.forEach((value, k) => {
      const td = tr.insertCell();
      td.textContent = String(value);
      if (k === 3) td.className = "tok";
      if (k === 4 && untrained) td.className = "flag";
    });
  });
}

async function run(event) {
  if (event) event.preventDefault();
  document.body.dataset.state = "busy";
  $("error").hidden = true;
  try {
    const compose = $("compose").value;
    const info = await (await call(modelPath() + "/tokenize", {
      inputs: [inputTensor()],
      parameters: { start_position: Number($("offset").value || 0) },
    })).json();
    const hasPositions = info.position !== "none";
    const [picked, tokens, positions, sum] = await Promise.all([
      infer(compose), infer("token_only"),
      hasPositions ? infer("position_only") : Promise.resolve(null), infer("token_plus_position")]);
    const [B, T, C] = picked.shape;
    const h = picked.header;
    const truncated = h.parameters.truncated_tokens;
    $("shape").innerHTML = `<code>embeddings [${B}, ${T}, ${C}] ${picked.datatype}</code> ` +
      `for compose <code>${compose}</code> &middot; model ${h.model_name} version ${h.model_version}` +
      ` &middot; checkpoint <code>${h.parameters.checkpoint_id.slice(0, 12)}</code>` +
      (truncated ? ` &middot; ${truncated} tokens truncated` : "");
    renderTokens(info);
    heatmap($("heat-token"), tokens.rows, T, C);
    heatmap($("heat-sum"), sum.rows, T, C);
    $("heat-position").hidden = !hasPositions;
    $("similarity").hidden = !hasPositions;
    $("no-position").hidden = $("no-similarity").hidden = hasPositions;
    if (hasPositions) {
      heatmap($("heat-position"), positions.rows, T, C);
      heatmap($("similarity"), similarity(positions.rows, T, C), T, T, 1, true);
      // The served sum against float32(token + position) here: a double add of two floats,
      // rounded once to float32 (Math.fround), is exactly float32 addition.
      let same = 0;
      for (let k = 0; k < sum.rows.length; k++) {
        same += Object.is(sum.rows[k], Math.fround(tokens.rows[k] + positions.rows[k])) ? 1 : 0;
      }
      $("sumcheck").innerHTML = same === sum.rows.length
        ? `<span class="ok">sum check: all ${same} values of the served sum equal float32(token + position) bit for bit</span>`
        : `sum check: ${sum.rows.length - same} of ${sum.rows.length} values differ`;
    } else {
      const note = `model ${h.model_name} has no position table (position: none, e.g. RoPE): ` +
        "its sum is the token rows, and position_only is refused";
      $("no-position").textContent = $("no-similarity").textContent = note;
      $("sumcheck").textContent = "";
    }
    $("result").hidden = false;
    document.body.dataset.state = "done";
  } catch (e) {
    $("error").textContent = e.message;
    $("error").hidden = false;
    document.body.dataset.state = "error";
  }
}

function start() {
  $("error").hidden = true;
  loadModels().then(() => { document.body.dataset.state = "ready"; }).catch((e) => {
    $("error").textContent = e.message + " (with --auth-token: type the token above)";
    $("error").hidden = false;
    document.body.dataset.state = "error";
  });
}

$("form").addEventListener("submit", run);
$("token").addEventListener("change", start);  // a token typed in: list the models again
start();
