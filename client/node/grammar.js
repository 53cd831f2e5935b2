'use strict';
// What a user may type, the same in every tool: token-id lists, enum spellings, option names
// and values. The Python client (client/grammar.py), embedctl and the page accept exactly
// the same; tests/vectors/client_inputs.json is the one table every tool's tests read.
// Everything else is refused here, naming the bad item, before a request is sent.

const IDS_FORM = 'give integers separated by commas, e.g. 1,2,3';
const MAX_ID = Number.MAX_SAFE_INTEGER; // 2^53 - 1: larger ids do not survive a JS number
const UINT32_MAX = 4294967295;
const BLANK = /^[ \t\r\n]+|[ \t\r\n]+$/g; // what is ignored around an id-list item
const ITEM = /^-?[0-9]+$/;
// Where a tool connects; the same forms as client/grammar.py's TARGET_FORM.
const TARGET_FORM = 'host:port (port 1..65535), [IPv6]:port, dns:///host:port or unix:PATH';
const HOST_PORT = /^(?:dns:(?:\/\/\/)?)?(?:\[([0-9A-Fa-f:.]+(?:%[A-Za-z0-9._-]+)?)\]|([A-Za-z0-9._-]+)):([0-9]{1,5})$/;
const UNIX = /^unix:\S+$/;

// field -> .proto enum name -> its other spellings: short name first (embedctl's), then
// the Open Inference Protocol name. Case exactly as written.
const SPELLINGS = {
  compose: {
    COMPOSE_TOKEN_PLUS_POSITION: ['token+position', 'token_plus_position'],
    COMPOSE_TOKEN_ONLY: ['token', 'token_only'],
    COMPOSE_POSITION_ONLY: ['position', 'position_only'],
  },
  dtype: {
    DTYPE_FLOAT32: ['float32', 'FP32'],
    DTYPE_FLOAT16: ['float16', 'FP16'],
    DTYPE_BFLOAT16: ['bfloat16', 'BF16'],
  },
  truncate: {
    TRUNCATE_NONE: ['none'],
    TRUNCATE_RIGHT: ['right'],
    TRUNCATE_LEFT: ['left'],
  },
};

const DEFAULTS = {
  model: '', version: 0, start_position: 0, compose: 'COMPOSE_TOKEN_PLUS_POSITION',
  dtype: 'DTYPE_FLOAT32', truncate: 'TRUNCATE_NONE', allow_special_tokens: false,
  request_id: '',
};
// Every field of an EmbedRequest (embedding.proto); `output` is the shared-memory target.
const EMBED_KEYS = ['add_special_tokens', 'allow_special_tokens', 'compose', 'dtype', 'model',
  'output', 'request_id', 'start_position', 'text', 'token_ids', 'truncate', 'version'];
// The short form modelInfer() takes.
const INFER_KEYS = ['compose', 'datatype', 'id', 'input_ids', 'model_name', 'model_version',
  'start_position', 'text', 'truncate'];

function shown(value) {
  return typeof value === 'string' ? `'${value}'` : JSON.stringify(value);
}

/** A token-id list typed as text ("1,2,3") -> [1, 2, 3]; throws naming the bad item. */
function parseIds(text) {
  if (text.replace(BLANK, '') === '') throw new Error(`no token ids: ${IDS_FORM}`);
  return text.split(',').map((raw, i) => {
    const item = raw.replace(BLANK, '');
    if (item === '') throw new Error(`item ${i + 1} of the token ids is empty: ${IDS_FORM}`);
    if (!ITEM.test(item)) {
      throw new Error(`item ${i + 1} of the token ids, '${item}', is not an integer: ${IDS_FORM}`);
    }
    const value = Number(item);
    if (!Number.isSafeInteger(value)) {
      throw new Error(`item ${i + 1} of the token ids, '${item}', is beyond ±${MAX_ID}`);
    }
    return value;
  });
}

/**
 * Where `target` (one of TARGET_FORM's forms) connects: { host, port }, or { path } for
 * unix:PATH (unix:///abs is /abs, as grpc reads it); null for anything else.
 */
function splitTarget(target) {
  if (typeof target !== 'string') return null;
  const match = HOST_PORT.exec(target);
  if (match !== null) {
    const port = Number(match[3]);
    return port >= 1 && port <= 65535 ? { host: match[1] || match[2], port } : null;
  }
  return UNIX.test(target) ? { path: target.slice('unix:'.length).replace(/^\/\/(?=\/)/, '') } : null;
}

/** Whether `target` is one of TARGET_FORM's forms (a URL, a missing port or port 0 is not). */
function isTarget(target) {
  return splitTarget(target) !== null;
}

// A bearer token as gRPC metadata carries it (client/rules.py's TOKEN): visible ASCII, no
// spaces; a newline read from a file along with the token is the usual mistake.
const TOKEN_FORM = 'a token of visible ASCII characters, without spaces or line breaks';
const TOKEN = /^[\x21-\x7e]+$/;

/**
 * `token` if it can go in an `authorization: Bearer` header ('' = no token), else an Error
 * saying why. The message never repeats the token: it is a secret, and lands in logs.
 */
function checkToken(token) {
  if (typeof token !== 'string') {
    throw new Error(`must be ${TOKEN_FORM}, got a ${token === null ? 'null' : typeof token}`);
  }
  if (token === '' || TOKEN.test(token)) return token;
  const chars = [...token];
  const at = chars.findIndex((c) => !TOKEN.test(c));
  const c = chars[at];
  const what = c === '\n' || c === '\r' ? 'a line break'
    : c === ' ' || c === '\t' ? 'a space' : `the character U+${c.codePointAt(0).toString(16).toUpperCase().padStart(4, '0')}`;
  throw new Error(`must be ${TOKEN_FORM}; this one has ${what} at character ${at + 1} `
    + `of ${chars.length}`);
}

/** `value` if it is an integer in [low, high]; throws naming the option. */
function checkInt(name, value, low, high) {
  if (typeof value !== 'number' || !Number.isInteger(value) || value < low || value > high) {
    throw new Error(`${name} must be an integer in [${low}, ${high}], got ${shown(value)}`);
  }
  return value;
}

function checkString(name, value) {
  if (typeof value !== 'string') throw new Error(`${name} must be a string, got ${shown(value)}`);
  return value;
}

function checkBool(name, value) {
  if (typeof value !== 'boolean') {
    throw new Error(`${name} must be true or false, got ${shown(value)}`);
  }
  return value;
}

/** Any accepted spelling of a compose/dtype/truncate value -> its .proto enum name. */
function enumName(field, value) {
  const accepted = [];
  for (const [name, others] of Object.entries(SPELLINGS[field])) {
    if (value === name || others.includes(value)) return name;
    accepted.push(...others, name);
  }
  throw new Error(`${field} ${shown(value)}: expected one of ${accepted.join(', ')}`);
}

/** The name the Open Inference Protocol front uses for that value (token_only, FP16, left). */
function oipName(field, value) {
  const others = SPELLINGS[field][enumName(field, value)];
  return others[others.length - 1];
}

function checkKeys(object, known) {
  for (const key of Object.keys(object)) {
    if (!known.includes(key)) {
      throw new Error(`unknown option '${key}'; known options: ${known.join(', ')}`);
    }
  }
}

/** A request is an object of known keys only, with exactly one of its two inputs. */
function checkRequest(request, known, [input, other]) {
  if (request === null || typeof request !== 'object' || Array.isArray(request)) {
    throw new Error(`a request is an object, got ${shown(request)}`);
  }
  checkKeys(request, known);
  if ((request[input] === undefined) === (request[other] === undefined)) {
    throw new Error(`give exactly one of ${input} or ${other}`);
  }
}

function tokenIds(ids) {
  if (!Array.isArray(ids)) throw new Error(`ids must be an array of integers, got ${shown(ids)}`);
  return ids.map((id, i) => checkInt(`ids[${i}]`, id, -MAX_ID, MAX_ID));
}

/**
 * An EmbedRequest as a plain object, checked: unknown keys, spellings, types and ranges
 * throw; enums come back as their .proto names, unset options as their defaults.
 */
function embedRequest(request) {
  checkRequest(request, EMBED_KEYS, ['text', 'token_ids']);
  const r = { ...DEFAULTS, ...request };
  const out = {
    model: checkString('model', r.model),
    version: checkInt('version', r.version, 0, MAX_ID),
    start_position: checkInt('start_position', r.start_position, 0, UINT32_MAX),
    compose: enumName('compose', r.compose),
    dtype: enumName('dtype', r.dtype),
    truncate: enumName('truncate', r.truncate),
    allow_special_tokens: checkBool('allow_special_tokens', r.allow_special_tokens),
    request_id: checkString('request_id', r.request_id),
  };
  if (r.add_special_tokens !== undefined) {
    out.add_special_tokens = checkBool('add_special_tokens', r.add_special_tokens);
  }
  if (r.output !== undefined) out.output = r.output;
  if (r.text !== undefined) {
    out.text = checkString('text', r.text);
  } else {
    const given = r.token_ids;
    if (given === null || typeof given !== 'object' || Array.isArray(given)) {
      throw new Error(`token_ids is { ids: [...] }, got ${shown(given)}`);
    }
    checkKeys(given, ['ids']);
    out.token_ids = { ids: tokenIds(given.ids === undefined ? [] : given.ids) };
  }
  return out;
}

/** modelInfer()'s short form, checked the same way; spellings become the OIP names. */
function inferRequest(request) {
  checkRequest(request, INFER_KEYS, ['text', 'input_ids']);
  const out = {
    model_name: checkString('model_name', request.model_name ?? ''),
    model_version: checkString('model_version', request.model_version ?? ''),
    id: checkString('id', request.id ?? ''),
  };
  if (request.start_position !== undefined) {
    out.start_position = checkInt('start_position', request.start_position, 0, UINT32_MAX);
  }
  if (request.compose !== undefined) out.compose = oipName('compose', request.compose);
  if (request.truncate !== undefined) out.truncate = oipName('truncate', request.truncate);
  if (request.datatype !== undefined) out.datatype = oipName('dtype', request.datatype);
  if (request.text !== undefined) {
    if (!Array.isArray(request.text)) throw new Error('text must be an array of strings');
    out.text = request.text.map((t, i) => checkString(`text[${i}]`, t));
  } else {
    if (!Array.isArray(request.input_ids)) {
      throw new Error('input_ids must be an array of rows of ids');
    }
    out.input_ids = request.input_ids.map((row) => tokenIds(row));
  }
  return out;
}

/** Every request of a stream checked, none sent if one is bad: "request i: ..." names it. */
function embedRequests(requests) {
  if (!Array.isArray(requests)) throw new Error(`requests are an array, got ${shown(requests)}`);
  return requests.map((request, i) => {
    try {
      return embedRequest(request);
    } catch (err) {
      throw new Error(`request ${i}: ${err.message}`);
    }
  });
}

module.exports = {
  IDS_FORM, MAX_ID, SPELLINGS, TARGET_FORM, TOKEN_FORM, EMBED_KEYS, INFER_KEYS, parseIds,
  enumName, oipName, isTarget, splitTarget, checkToken, embedRequest, embedRequests,
  inferRequest, shown,
};
