#!/usr/bin/env node
'use strict';
// Command line over embed.js that prints JSON, so scripts and tests in any language can
// drive the Node client:
//
//   node client/node/cli.js embed  --target HOST:PORT --request  '{"text": "hello world"}'
//   node client/node/cli.js stream --target HOST:PORT --requests '[{...}, {...}]'
//   node client/node/cli.js infer  --target HOST:PORT --request  '{"input_ids": [[1, 2]]}'
//
// Against a server that wants a bearer token: --token TOKEN, or $EMBED_TOKEN (as embedctl).
//
// Requests are the .proto messages as JSON (field names as in the .proto; enums by name);
// `infer` takes the short form modelInfer() documents. Decoded values are printed as
// base64 of little-endian float32 bytes (`values_b64`), not as JSON numbers: JSON has no
// NaN, Inf or -0, and the point is to hand the values on bit for bit.
//
// Every option of every command is checked by its rule in OPTIONS when it is parsed, the
// request against grammar.js too: a mistake is one line, "error: --flag: ... (see --help)",
// and exit status 2, before any connection. An RPC error is one line, "error: CODE: details",
// exit status 1 (no connection at all: what is at --target and what to try, the words
// embedctl uses); a bug one line naming the file that holds its stack, exit status 70.
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const {
  TARGET_FORM, TOKEN_FORM, checkToken, embedRequest, embedRequests, inferRequest, isTarget,
  shown,
} = require('./grammar');
const { float32ToLittleEndian } = require('./decode');

// As the user runs it (the docs' form), in --help and in the internal-error line.
const PROG = 'node client/node/cli.js';
const TOKEN_ENV = 'EMBED_TOKEN';

/** A mistake in the command line: exit status 2, the message as the one line. */
class UsageError extends Error {}

// A rule: what the option accepts (`accepts`, for --help), `parse` of its text (throws a
// plain Error whose message follows "--flag: "), and whether the command needs it.
const TARGET = {
  accepts: TARGET_FORM,
  required: true,
  parse(raw) {
    if (!isTarget(raw)) throw new Error(`must be ${TARGET_FORM}, got ${shown(raw)}`);
    return raw;
  },
};

const TIMEOUT = {
  accepts: 'a number of seconds > 0 (default 30)',
  required: false,
  parse(raw) {
    const value = /^[0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?$/i.test(raw) ? Number(raw) : NaN;
    if (!(Number.isFinite(value) && value > 0)) {
      throw new Error(`must be a number of seconds > 0, got ${shown(raw)}`);
    }
    return value;
  },
};

const TOKEN = {
  accepts: `bearer token for a server started with --auth-token(s): ${TOKEN_FORM} `
    + `('' = none; default $${TOKEN_ENV})`,
  required: false,
  parse(raw) {
    return checkToken(raw);
  },
};

/** JSON text, then checked by `check` (a grammar.js function that throws naming the item). */
function jsonRule(accepts, check) {
  return {
    accepts,
    required: true,
    parse(raw) {
      let value;
      try {
        value = JSON.parse(raw);
      } catch (err) {
        throw new Error(`not valid JSON (${err.message})`);
      }
      check(value);
      return value;
    },
  };
}

// command -> option name -> rule. The walk in test/cli.test.js goes over this table.
const OPTIONS = {
  embed: {
    target: TARGET,
    request: jsonRule('an EmbedRequest as JSON, e.g. {"text": "hello"}', embedRequest),
    timeout: TIMEOUT,
    token: TOKEN,
  },
  stream: {
    target: TARGET,
    requests: jsonRule('a JSON array of EmbedRequests', embedRequests),
    timeout: TIMEOUT,
    token: TOKEN,
  },
  infer: {
    target: TARGET,
    request: jsonRule('modelInfer()\'s request as JSON, e.g. {"input_ids": [[1, 2]]}',
      inferRequest),
    timeout: TIMEOUT,
    token: TOKEN,
  },
};

function usage() {
  const lines = [`usage: ${PROG} COMMAND --option VALUE ...`, '',
    'Embed through the Node.js client and print the answer as JSON. A mistake in the',
    'options is one line and exit status 2; a failed call one line and exit status 1.'];
  for (const [command, options] of Object.entries(OPTIONS)) {
    lines.push('', `${command}:`);
    for (const [name, rule] of Object.entries(options)) {
      lines.push(`  --${name}${rule.required ? '' : ' (optional)'}: ${rule.accepts}`);
    }
  }
  return `${lines.join('\n')}\n`;
}

/**
 * argv (after `node cli.js`) -> { command, values } with every option checked, or
 * { help: true }; throws UsageError naming the option and what it accepts. `env`: where
 * $EMBED_TOKEN is read when --token is not given.
 */
function parseArgs(argv, env = process.env) {
  if (argv.length === 0) throw new UsageError(`give a command: ${Object.keys(OPTIONS).join(', ')}`);
  const [command, ...rest] = argv;
  if (command === '--help' || command === '-h' || rest.includes('--help') || rest.includes('-h')) {
    return { help: true };
  }
  const options = Object.hasOwn(OPTIONS, command) ? OPTIONS[command] : undefined;
  if (options === undefined) {
    throw new UsageError(`COMMAND: must be one of ${Object.keys(OPTIONS).join(', ')}, got `
      + `${shown(command)}`);
  }
  const known = Object.keys(options).map((name) => `--${name}`).join(', ');
  const values = {};
  for (let i = 0; i < rest.length; i += 1) {
    const arg = rest[i];
    if (!arg.startsWith('--')) {
      throw new UsageError(`${shown(arg)}: not an option; options of ${command}: ${known}`);
    }
    const eq = arg.indexOf('=');
    const name = arg.slice(2, eq < 0 ? undefined : eq);
    if (!Object.hasOwn(options, name)) {
      throw new UsageError(`unknown option --${name}; options of ${command}: ${known}`);
    }
    if (Object.hasOwn(values, name)) throw new UsageError(`--${name}: given twice`);
    let raw;
    if (eq >= 0) {
      raw = arg.slice(eq + 1);
    } else {
      if (i + 1 >= rest.length) throw new UsageError(`--${name}: needs a value, ${options[name].accepts}`);
      i += 1;
      raw = rest[i];
    }
    try {
      values[name] = options[name].parse(raw);
    } catch (err) {
      throw new UsageError(`--${name}: ${err.message}`);
    }
  }
  for (const [name, rule] of Object.entries(options)) {
    if (rule.required && !Object.hasOwn(values, name)) {
      throw new UsageError(`--${name}: required, ${rule.accepts}`);
    }
  }
  if (!Object.hasOwn(values, 'token') && env[TOKEN_ENV] !== undefined) {
    try {
      values.token = checkToken(env[TOKEN_ENV]);
    } catch (err) {
      throw new UsageError(`${TOKEN_ENV}: ${err.message}`);
    }
  }
  if (values.token === '') delete values.token;
  return { command, values };
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

async function run({ command, values }) {
  // Loaded only now: --help and a refused command line never load grpc-js.
  const { embed, embedStream, modelInfer } = require('./embed');
  const options = {};
  if (values.timeout !== undefined) options.timeoutSeconds = values.timeout;
  if (values.token !== undefined) options.token = values.token;
  if (command === 'embed') return embedJson(await embed(values.target, values.request, options));
  if (command === 'stream') {
    return (await embedStream(values.target, values.requests, options)).map(embedJson);
  }
  return inferJson(await modelInfer(values.target, values.request, options));
}

/** A bug: its stack to a file, one line naming it (exit status 70). */
function internalError(err) {
  const detail = `${PROG} ${process.argv.slice(2).join(' ')}\n${err && err.stack ? err.stack : String(err)}\n`;
  const name = (err && err.constructor && err.constructor.name) || 'Error';
  try {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'cli.js-internal-error-'));
    const file = path.join(dir, 'error.log');
    fs.writeFileSync(file, detail);
    process.stderr.write(`${PROG}: internal error (${name}); please report it with the log ${file}\n`);
  } catch {
    process.stderr.write(`${PROG}: internal error (${name}); please report it:\n${detail}`);
  }
  process.exitCode = 70;
}

function main(argv) {
  let parsed;
  try {
    parsed = parseArgs(argv);
  } catch (err) {
    if (!(err instanceof UsageError)) throw err;
    // One line whatever the user typed: a JSON parser's message may quote it.
    const line = err.message.replace(/\r/g, '\\r').replace(/\n/g, '\\n');
    process.stderr.write(`error: ${line} (see --help)\n`);
    process.exitCode = 2;
    return;
  }
  if (parsed.help) {
    process.stdout.write(usage());
    return;
  }
  run(parsed).then(
    (out) => process.stdout.write(`${JSON.stringify(out)}\n`),
    (err) => {
      if (typeof err.code !== 'number') {
        internalError(err);
        return;
      }
      failure(err, parsed.values).then((line) => {
        process.stderr.write(`error: ${line.replace(/\r/g, '\\r').replace(/\n/g, '\\n')}\n`);
        process.exitCode = 1;
      }, internalError);
    });
}

/** The one line for a failed call: the server's answer, or why there was none. */
async function failure(err, values) {
  const { grpc } = require('./embed');
  const { explain, probe, unreachable } = require('./diagnose');
  const details = err.details || err.message;
  if (unreachable(err)) {
    // grpc-js's wording does not tell these apart reliably: look at the listener itself.
    return explain(values.target, await probe(values.target), details);
  }
  // gRPC errors carry a numeric code; name it like every other gRPC tool does.
  const line = `${grpc.status[err.code]}: ${details}`;
  if (err.code === grpc.status.UNAUTHENTICATED) {
    return line + (values.token !== undefined
      ? `: the server refused this token; check --token (or $${TOKEN_ENV})`
      : `: the server wants a bearer token; pass it with --token (or $${TOKEN_ENV})`);
  }
  if (err.code === grpc.status.DEADLINE_EXCEEDED) {
    return `${line}: no answer within ${values.timeout === undefined ? 30 : values.timeout} s; `
      + "raise --timeout, or check that --target is the service's gRPC port";
  }
  return line;
}

if (require.main === module) {
  try {
    main(process.argv.slice(2));
  } catch (err) {
    internalError(err);
  }
}

module.exports = { OPTIONS, UsageError, parseArgs, usage };
