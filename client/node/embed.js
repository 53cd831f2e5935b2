'use strict';
// A small Node.js client for the embedding service. The stubs come from the project's own
// .proto files, loaded at runtime (no generated code, no copies): the same contract the
// Python client and server are built from.
const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const { decodeTensor, encodeInt64LE } = require('./decode');
const { checkToken, embedRequest, inferRequest, parseIds } = require('./grammar');

const PROTO_ROOT = path.resolve(__dirname, '..', '..', 'proto');

// keepCase: field names as in the .proto (token_ids, start_position), like every other
// language's docs; longs as strings so int64 never silently rounds; enums by name.
const LOAD_OPTIONS = { keepCase: true, longs: String, enums: String, defaults: true, oneofs: true };

let packages = null;
function stubs() {
  // Loaded once, on first use, so `require` alone never touches the file system.
  if (packages === null) {
    const definition = protoLoader.loadSync(
      ['embedding/v1/embedding.proto', 'inference/v2/grpc_service.proto'],
      { ...LOAD_OPTIONS, includeDirs: [PROTO_ROOT] });
    const loaded = grpc.loadPackageDefinition(definition);
    packages = {
      EmbeddingService: loaded.embedding.v1.EmbeddingService,
      GRPCInferenceService: loaded.inference.GRPCInferenceService,
    };
  }
  return packages;
}

/**
 * A client for one service. `options.credentials` defaults to plaintext (local servers);
 * pass grpc.credentials.createSsl(...) for TLS. `options.channelOptions` go to grpc-js.
 * (Every call also takes `options.timeoutSeconds`, default 30, and `options.token`, sent
 * as `authorization: Bearer <token>` metadata on each call, over plaintext or TLS.)
 */
function connect(service, target, options = {}) {
  const Service = stubs()[service];
  // No client-side cap on response size (grpc-js defaults to 4 MiB): the server already
  // refuses, with RESOURCE_EXHAUSTED, a response over its own --max-message-bytes.
  const channelOptions = { 'grpc.max_receive_message_length': -1, ...options.channelOptions };
  return new Service(target, options.credentials || grpc.credentials.createInsecure(),
    channelOptions);
}

function deadline(options) {
  return new Date(Date.now() + 1000 * (options.timeoutSeconds || 30));
}

/**
 * Per-call metadata: `authorization: Bearer <options.token>` when a token is given (the
 * server's --auth-token / --auth-tokens). Metadata, not call credentials: grpc-js sends
 * call credentials only over TLS, and a local server is often plaintext. Throws a plain
 * Error (no `code`) for a token no header can carry.
 */
function callMetadata(options) {
  const metadata = new grpc.Metadata();
  if (options.token !== undefined && options.token !== null) {
    try {
      checkToken(options.token);
    } catch (err) {
      throw new Error(`options.token: ${err.message}`);
    }
    if (options.token !== '') metadata.set('authorization', `Bearer ${options.token}`);
  }
  return metadata;
}

/** The response with its tensor widened: `values` Float32Array [T*C], `shape` as numbers. */
function withValues(response) {
  const tensor = response.embeddings;
  return {
    ...response,
    shape: tensor.shape.map(Number),
    dtype: tensor.dtype,
    values: decodeTensor(tensor.data, tensor.dtype),
  };
}

/**
 * Embed one sequence.
 * @param {string} target  host:port
 * @param {object} request  an EmbedRequest as a plain object, field names as in the .proto,
 *   e.g. { token_ids: { ids: [31373, 995] }, dtype: 'DTYPE_FLOAT16' } or { text: 'hi' }
 * @returns {Promise<object>} the EmbedResponse plus shape, dtype, values (Float32Array)
 */
function embed(target, request, options = {}) {
  let message;
  let metadata;
  try {
    message = embedRequest(request); // refused here, before anything is sent
    metadata = callMetadata(options);
  } catch (err) {
    return Promise.reject(err);
  }
  const client = connect('EmbeddingService', target, options);
  return new Promise((resolve, reject) => {
    client.Embed(message, metadata, { deadline: deadline(options) }, (err, response) => {
      client.close();
      if (err) reject(err);
      else resolve(withValues(response));
    });
  });
}

/**
 * Embed many sequences over one bidirectional stream. The server answers in request
 * order, so responses[i] belongs to requests[i]; the first error ends the stream.
 * @param {string} target
 * @param {object[]} requests
 * @returns {Promise<object[]>}
 */
function embedStream(target, requests, options = {}) {
  let messages;
  let metadata;
  try {
    // Every request is checked before the stream opens: none is sent if one is bad.
    messages = requests.map((request, i) => {
      try {
        return embedRequest(request);
      } catch (err) {
        throw new Error(`request ${i}: ${err.message}`);
      }
    });
    metadata = callMetadata(options);
  } catch (err) {
    return Promise.reject(err);
  }
  const client = connect('EmbeddingService', target, options);
  return new Promise((resolve, reject) => {
    const responses = [];
    const call = client.EmbedStream(metadata, { deadline: deadline(options) });
    let failed = false;
    call.on('data', (response) => responses.push(withValues(response)));
    call.on('error', (err) => {
      failed = true;
      client.close();
      reject(err);
    });
    call.on('end', () => {
      client.close();
      if (failed) return;
      if (responses.length !== requests.length) {
        reject(new Error(`stream ended after ${responses.length} of ${requests.length} responses`));
      } else {
        resolve(responses);
      }
    });
    for (const message of messages) call.write(message);
    call.end();
  });
}

// -- Open Inference Protocol (KServe v2 / Triton), docs/interop.md --------------------------

/** Triton's raw BYTES layout: each string as a 4-byte little-endian length, then its bytes. */
function encodeBytesTensor(strings) {
  return Buffer.concat(strings.map((text) => {
    const data = Buffer.from(text, 'utf8');
    const length = Buffer.alloc(4);
    length.writeUInt32LE(data.length, 0);
    return Buffer.concat([length, data]);
  }));
}

/** An InferParameter (a oneof) as its plain value; int64 values come back as numbers. */
function parameterValue(p) {
  const value = p[p.parameter_choice];
  return p.parameter_choice === 'int64_param' || p.parameter_choice === 'uint64_param'
    ? Number(value) : value;
}

/**
 * ModelInfer on the service's OIP face (inference.GRPCInferenceService).
 * @param {string} target  host:port
 * @param {object} request  the short form: { model_name, model_version ('' = newest), id,
 *   input_ids: [[...], ...] (B rows of equal length T, sent as INT64 [B, T]) or
 *   text: ['...', ...] (BYTES [B]), start_position, compose ('token_plus_position' |
 *   'token_only' | 'position_only', or any spelling grammar.js accepts), datatype ('FP32' |
 *   'FP16' | 'BF16', or 'float16', 'DTYPE_FLOAT16', ...), truncate
 *   ('none' | 'right' | 'left') }
 * @returns {Promise<object>} { model_name, model_version, id, parameters (plain values),
 *   outputs: [{ name, datatype, shape, values }] } where `embeddings` values are a
 *   Float32Array [B*T*C] and `sequence_lengths` values are numbers
 */
function modelInfer(target, given, options = {}) {
  let request;
  let metadata;
  try {
    request = inferRequest(given); // unknown keys, spellings and types refused here
    metadata = callMetadata(options);
  } catch (err) {
    return Promise.reject(err);
  }
  let input;
  let raw;
  if (request.input_ids !== undefined) {
    const rows = request.input_ids;
    const T = rows.length ? rows[0].length : 0;
    if (rows.some((row) => row.length !== T)) {
      return Promise.reject(
        new Error('input_ids rows must all have the same length (a [B, T] tensor)'));
    }
    input = { name: 'input_ids', datatype: 'INT64', shape: [rows.length, T] };
    raw = encodeInt64LE(rows.flat());
  } else {
    input = { name: 'text', datatype: 'BYTES', shape: [request.text.length] };
    raw = encodeBytesTensor(request.text);
  }
  const parameters = {};
  if (request.start_position !== undefined) {
    parameters.start_position = { int64_param: request.start_position };
  }
  for (const name of ['compose', 'truncate']) {
    if (request[name] !== undefined) parameters[name] = { string_param: request[name] };
  }
  // The dtype is a parameter of the requested output (the OIP way to ask one output for a
  // representation), not of the request as a whole.
  const embeddings = { name: 'embeddings', parameters: {} };
  if (request.datatype !== undefined) {
    embeddings.parameters.datatype = { string_param: request.datatype };
  }
  const message = {
    model_name: request.model_name,
    model_version: request.model_version,
    id: request.id,
    parameters,
    inputs: [input],
    outputs: [embeddings, { name: 'sequence_lengths' }],
    raw_input_contents: [raw],
  };
  const client = connect('GRPCInferenceService', target, options);
  return new Promise((resolve, reject) => {
    client.ModelInfer(message, metadata, { deadline: deadline(options) }, (err, response) => {
      client.close();
      if (err) {
        reject(err);
        return;
      }
      try {
        resolve(inferResult(response));
      } catch (e) {
        reject(e);
      }
    });
  });
}

function inferResult(response) {
  const parameters = {};
  for (const [name, p] of Object.entries(response.parameters)) {
    parameters[name] = parameterValue(p);
  }
  // raw_output_contents[i] holds outputs[i] (the server answers only in raw form).
  const outputs = response.outputs.map((o, i) => {
    const bytes = response.raw_output_contents[i];
    if (bytes === undefined) throw new Error(`output ${o.name} has no raw_output_contents`);
    let values;
    if (o.datatype === 'INT64') {
      const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
      values = Array.from({ length: bytes.byteLength / 8 },
        (_, k) => Number(view.getBigInt64(8 * k, true)));
    } else {
      values = decodeTensor(bytes, o.datatype);
    }
    return { name: o.name, datatype: o.datatype, shape: o.shape.map(Number), values };
  });
  return {
    model_name: response.model_name,
    model_version: response.model_version,
    id: response.id,
    parameters,
    outputs,
  };
}

module.exports = {
  PROTO_ROOT, stubs, connect, embed, embedStream, modelInfer, encodeBytesTensor, grpc,
  parseIds, // "1,2,3" -> [1, 2, 3], the id-list grammar every tool shares
};
