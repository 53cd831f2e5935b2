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

// The infer body's parameters, shared by /tokenize and /infer so that both read the same
// sequence (the same truncation).
function parameters() {
  return { start_position: Number($("offset").value || 0), truncate: $("truncate").value };
}

function request(compose) {
  return {
    inputs: [inputTensor()],
    parameters: { ...parameters(), compose: compose },
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

const fmt = (x) => Number(x.toPrecision(7)).toString();

// What the model's default compose is, from its facts (the /tokenize reply: family, rules,
// dim, width, position, dtype), in the order the server applies it (service/engine/rules.py):
//   x = token_table[ids] (x embed_scale)  -- token_only stops here, [T, dim]
//   x = project_in(x)                      -- OPT-350m: [T, dim] -> [T, width]
//   x = x + token_type_table[0]            -- BERT
//   x = x + position_table[s+offset ..]    -- learned or sinusoidal positions
//   x = LayerNorm(x)                       -- BLOOM, BERT
// and which check the page can make from the rows it is sent: "sum" (served =
// float32(token + position)), "token" (served = token rows), or none, with the steps it
// cannot recompute (they need weights the page is not sent).
function recipe(f) {
  const r = f.rules || {};
  const hasPositions = f.position !== "none";
  const computes = r.embed_scale !== undefined || r.project_in || r.token_type || r.layernorm;
  let token = "token_table[ids]";
  if (r.embed_scale !== undefined) {
    token += ` \u00d7 ${fmt(r.embed_scale)}` + (f.dtype === "float32" ? "" : ` (in ${f.dtype})`);
  }
  const offset = r.position_offset || 0;
  const from = offset ? `s+${offset}` : "s";
  const to = offset ? `s+T+${offset - 1}` : "s+T-1";
  const position = f.position === "sinusoidal" ? "sinusoid(s..s+T-1)"
    : `position_table[${from}..${to}]`;
  let x = r.project_in ? `project_in(${token})` : token;
  if (r.token_type) x += " + token_type_table[0]";
  if (hasPositions) x += " + " + position;
  if (r.layernorm) x = `LayerNorm(${x})`;
  const unchecked = [];
  if (r.project_in) unchecked.push(`project_in (a [${f.width} \u00d7 ${f.dim}] matmul)`);
  if (r.token_type) unchecked.push("the token-type row");
  if (r.layernorm) unchecked.push(`LayerNorm (eps ${r.layernorm.eps}, with its weight and bias)`);
  // A plain lookup adds in fp32 and rounds once to float32 (Math.fround of the exact
  // double sum of two floats is float32 addition); the rules' path adds in the tables' dtype,
  // as the reference does, which the page does not redo for a 16-bit model.
  if (computes && hasPositions && f.dtype !== "float32") {
    unchecked.push(`the addition rounded in ${f.dtype}`);
  }
  const check = unchecked.length ? null : hasPositions ? "sum" : "token";
  return { token, position, served: x, hasPositions, check, unchecked };
}

// Each compose's rows must come back [1, T, its width]: token_only the table's width (dim),
// the others the model's (width; they differ with OPT's project_in).
function checkShape(name, got, T, C) {
  const [b, t, c] = got.shape;
  if (b !== 1 || t !== T || c !== C) {
    throw new Error(`${name} came back [${got.shape}], expected [1, ${T}, ${C}] for this model`);
  }
}

function compare(served, want, round) {
  let differ = 0, first = -1;
  for (let k = 0; k < served.length; k++) {
    if (!Object.is(served[k], round(want(k)))) { differ++; if (first < 0) first = k; }
  }
  return { differ, first };
}

function renderCheck(how, rows, T, C, name) {
  const el = $("sumcheck");
  if (how.check === null) {
    el.className = "note";
    el.textContent = `not checked here: the served rows of ${name} go through ` +
      `${how.unchecked.join(", ")}, which the page cannot recompute from the rows it is ` +
      "sent; it shows them as the server returns them";
    return;
  }
  const sum = how.check === "sum";
  const { differ, first } = sum
    ? compare(rows.token_plus_position.rows,
      (k) => rows.token_only.rows[k] + rows.position_only.rows[k], Math.fround)
    : compare(rows.token_plus_position.rows, (k) => rows.token_only.rows[k], (v) => v);
  const what = sum ? "float32(token + position)" : "the token rows (no position rows)";
  const n = T * C;
  if (!differ) {
    el.className = "note ok";
    el.textContent = `check: all ${n} values of the served rows equal ${what} bit for bit`;
  } else {
    const t = Math.floor(first / C), c = first % C;
    el.className = "note bad";
    el.textContent = `check FAILED: ${differ} of ${n} values differ from ${what} ` +
      `(first: token ${t}, feature ${c}: served ${rows.token_plus_position.rows[first]})`;
  }
}

function renderModel(f, how, name) {
  const rules = Object.keys(f.rules || {});
  $("model-facts").textContent = `model ${name}: family ${f.family || "(trained here)"}, ` +
    `position ${f.position}, rules ${rules.length ? rules.join(", ") : "none"}, ` +
    `tables in ${f.dtype}; token rows ${f.dim} wide, served rows ${f.width} wide`;
  $("recipe").textContent = `default compose (token_plus_position) = ${how.served}`;
  $("cap-token").textContent = `token rows ${how.token} [T\u00a0\u00d7\u00a0${f.dim}]`;
  $("cap-position").textContent = how.hasPositions
    ? `position rows ${how.position} [T\u00a0\u00d7\u00a0${f.width}]` : "position rows: none";
  $("cap-served").textContent = `served rows (token_plus_position) = ${how.served} ` +
    `[T\u00a0\u00d7\u00a0${f.width}]`;
}

async function run(event) {
  if (event) event.preventDefault();
  document.body.dataset.state = "busy";
  $("error").hidden = true;
  try {
    const compose = $("compose").value;
    const info = await (await call(modelPath() + "/tokenize", {
      inputs: [inputTensor()], parameters: parameters(),
    })).json();
    const how = recipe(info);
    // Every compose the page draws, each asked for once (the picked one among them, even
    // position_only on a model without positions: the server's refusal is then shown).
    const wanted = ["token_only", "token_plus_position"];
    if (how.hasPositions) wanted.push("position_only");
    if (!wanted.includes(compose)) wanted.push(compose);
    const got = await Promise.all(wanted.map((c) => infer(c)));
    const rows = Object.fromEntries(wanted.map((c, i) => [c, got[i]]));
    const T = info.sequences[0].ids.length;
    const C = info.width;
    checkShape("token_only", rows.token_only, T, info.dim);
    checkShape("token_plus_position", rows.token_plus_position, T, C);
    if (how.hasPositions) checkShape("position_only", rows.position_only, T, C);
    const picked = rows[compose];
    const h = picked.header;
    const truncated = h.parameters.truncated_tokens;
    $("shape").innerHTML = `<code>embeddings [${picked.shape.join(", ")}] ${picked.datatype}</code> ` +
      `for compose <code>${compose}</code> &middot; model ${h.model_name} version ${h.model_version}` +
      ` &middot; checkpoint <code>${h.parameters.checkpoint_id.slice(0, 12)}</code>` +
      (truncated ? ` &middot; ${truncated} tokens truncated` : "");
    renderModel(info, how, h.model_name);
    renderTokens(info);
    heatmap($("heat-token"), rows.token_only.rows, T, info.dim);
    heatmap($("heat-sum"), rows.token_plus_position.rows, T, C);
    $("heat-position").hidden = !how.hasPositions;
    $("similarity").hidden = !how.hasPositions;
    $("no-position").hidden = $("no-similarity").hidden = how.hasPositions;
    if (how.hasPositions) {
      heatmap($("heat-position"), rows.position_only.rows, T, C);
      heatmap($("similarity"), similarity(rows.position_only.rows, T, C), T, T, 1, true);
    } else {
      const family = info.family ? ` (family ${info.family})` : "";
      $("no-position").textContent = $("no-similarity").textContent =
        `model ${h.model_name}${family} has no position table (position: none): its ` +
        "positions act inside attention (RoPE or ALiBi), and position_only is refused";
    }
    renderCheck(how, rows, T, C, h.model_name);
    $("result").hidden = false;
    document.body.dataset.state = "done";
  } catch (e) {
    $("error").textContent = e.message;
    $("error").hidden = false;
    document.body.dataset.state = "error";
  }
}

function start() {
  document.body.dataset.state = "loading";  // not the last try's "error" while this one runs
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
