#!/usr/bin/env node
'use strict';
// Command line over embed.js that prints JSON, so scripts and tests in any language can
// drive the Node client:
//
//   node client/node/cli.js embed  --target HOST:PORT --request  '{"text": "hello world"}'
//   node client/node/cli.js stream --target HOST:PORT --requests '[{...}, {...}]'
//   node client/node/cli.js infer  --target HOST:PORT --request  '{"input_ids": [[1, 2]]}'
//
// Requests are the .proto messages as JSON (field names as in the .proto; enums by name);
// `infer` takes the short form modelInfer() documents. Decoded values are printed as
// base64 of little-endian float32 bytes (`values_b64`), not as JSON numbers: JSON has no
// NaN, Inf or -0, and the point is to hand the values on bit for bit.
// On an RPC error: one line "error: CODE: details" on stderr, exit status 1.
const { embed, embedStream, modelInfer, grpc } = require('./embed');
const { float32ToLittleEndian } = require('./decode');

const USAGE = 'usage: cli.js embed|stream|infer --target HOST:PORT --request(s) JSON';

function parseArgs(argv) {
  const [command, ...rest] = argv;
  const flags = {};
  for (let i = 0; i < rest.length; i += 2) {
    if (!rest[i].startsWith('--') || i + 1 >= rest.length) throw new Error(USAGE);
    flags[rest[i].slice(2)] = rest[i + 1];
  }
  if (!command || !flags.target) throw new Error(USAGE);
  return { command, flags };
}

/** One EmbedResponse as JSON-safe fields (int64 strings become numbers: all are < 2^53). */
function embedJson(r) {
  return {
    shape: r.shape,
    dtype: r.dtype,
    values_b64: float32ToLittleEndian(r.values).toString('base64'),
    token_ids: r.token_ids.map(Number),
    start_position: r.start_position,
    model: r.model,
    version: Number(r.version),
    checkpoint_id: r.checkpoint_id,
    truncated_tokens: r.truncated_tokens,
    untrained_token_indices: r.untrained_token_indices,
    request_id: r.request_id,
  };
}

function inferJson(r) {
  return {
    model_name: r.model_name,
    model_version: r.model_version,
    id: r.id,
    parameters: r.parameters,
    // Float outputs as bytes (see above); INT64 outputs (sequence_lengths) as numbers.
    outputs: r.outputs.map((o) => (o.values instanceof Float32Array
      ? { name: o.name, datatype: o.datatype, shape: o.shape,
        values_b64: float32ToLittleEndian(o.values).toString('base64') }
      : { name: o.name, datatype: o.datatype, shape: o.shape, values: o.values })),
  };
}

async function main(argv) {
  const { command, flags } = parseArgs(argv);
  const target = flags.target;
  if (command === 'embed') return embedJson(await embed(target, JSON.parse(flags.request)));
  if (command === 'stream') {
    return (await embedStream(target, JSON.parse(flags.requests))).map(embedJson);
  }
  if (command === 'infer') {
    return inferJson(await modelInfer(target, JSON.parse(flags.request)));
  }
  throw new Error(USAGE);
}

main(process.argv.slice(2)).then(
  (out) => process.stdout.write(`${JSON.stringify(out)}\n`),
  (err) => {
    // gRPC errors carry a numeric code; name it like every other gRPC tool does.
    const code = typeof err.code === 'number' ? `${grpc.status[err.code]}: ` : '';
    process.stderr.write(`error: ${code}${err.details || err.message}\n`);
    process.exitCode = 1;
  });
