'use strict';
// cli.js's options, each checked when parsed: the walk goes over the CLI's own table
// (OPTIONS), so an option added there without cases here (a refused and an accepted value)
// fails. Run as a process too: a refusal is one line and exit status 2, before any
// connection (the target has nothing listening).
const test = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');
const { spawnSync } = require('node:child_process');
const { OPTIONS, UsageError, parseArgs, usage } = require('../cli');

const CLI = path.join(__dirname, '..', 'cli.js');
const FORM = 'host:port (port 1..65535), [IPv6]:port, dns:///host:port or unix:PATH';
const TEXT = '{"text": "a"}';
// Complete command lines but for the option under test.
const BASE = {
  embed: { target: ['--target', 'h:1'], request: ['--request', TEXT], timeout: [], token: [] },
  stream: { target: ['--target', 'h:1'], requests: ['--requests', `[${TEXT}]`], timeout: [],
    token: [] },
  infer: { target: ['--target', 'h:1'], request: ['--request', '{"input_ids": [[1]]}'],
    timeout: [], token: [] },
};
const TOKEN_FORM = 'a token of visible ASCII characters, without spaces or line breaks';
// command -> option -> [[value, message of the refusal, or null when accepted], ...]
const CASES = {
  embed: {
    target: [['http://h:1', `--target: must be ${FORM}, got 'http://h:1'`],
      ['h', `--target: must be ${FORM}, got 'h'`], ['[::1]:50051', null]],
    // V8 words its own JSON errors differently from release to release: matched, not equal.
    request: [['{"text": "a",}', /^--request: not valid JSON \(.*position 13.*\)$/],
      ['{"text": "a", "dtype": "half"}', "--request: dtype 'half': expected one of float32, FP32, DTYPE_FLOAT32, float16, FP16, DTYPE_FLOAT16, bfloat16, BF16, DTYPE_BFLOAT16"],
      ['[]', '--request: a request is an object, got []'],
      ['{"token_ids": {"ids": [1, 2]}, "compose": "token"}', null]],
    timeout: [['0', "--timeout: must be a number of seconds > 0, got '0'"],
      ['Infinity', "--timeout: must be a number of seconds > 0, got 'Infinity'"],
      ['0x10', "--timeout: must be a number of seconds > 0, got '0x10'"], ['2.5', null]],
    // A token is a secret: the refusal says where it is wrong, never what it is.
    token: [['s3cret\n', `--token: must be ${TOKEN_FORM}; this one has a line break at character 7 of 7`],
      ['Bearer x', `--token: must be ${TOKEN_FORM}; this one has a space at character 7 of 8`],
      ['s3cret', null], ['', null]],
  },
  stream: {
    target: [['h:65536', `--target: must be ${FORM}, got 'h:65536'`], ['unix:/run/e.sock', null]],
    requests: [[TEXT, '--requests: requests are an array, got {"text":"a"}'],
      [`[${TEXT}, {"text": "b", "compose": "tokens"}]`, "--requests: request 1: compose 'tokens': expected one of token+position, token_plus_position, COMPOSE_TOKEN_PLUS_POSITION, token, token_only, COMPOSE_TOKEN_ONLY, position, position_only, COMPOSE_POSITION_ONLY"],
      ['[]', null]],
    timeout: [['-1', "--timeout: must be a number of seconds > 0, got '-1'"], ['1e1', null]],
    token: [['tøken', `--token: must be ${TOKEN_FORM}; this one has the character U+00F8 at character 2 of 5`],
      ['a.b-c_d~', null]],
  },
  infer: {
    target: [['', `--target: must be ${FORM}, got ''`], ['dns:///svc:443', null]],
    request: [['{"input_ids": [[1]], "dtype": "FP16"}', "--request: unknown option 'dtype'; known options: compose, datatype, id, input_ids, model_name, model_version, start_position, text, truncate"],
      ['{"text": ["a"], "datatype": "BF16"}', null]],
    timeout: [['soon', "--timeout: must be a number of seconds > 0, got 'soon'"], ['30', null]],
    token: [['a\tb', `--token: must be ${TOKEN_FORM}; this one has a space at character 2 of 3`],
      ['x', null]],
  },
};

function argvFor(command, name, value) {
  const argv = [command];
  for (const [other, given] of Object.entries(BASE[command])) {
    if (other !== name) argv.push(...given);
  }
  argv.push(`--${name}`, value);
  return argv;
}

function refusal(argv, env = {}) {
  try {
    parseArgs(argv, env);
  } catch (err) {
    assert.ok(err instanceof UsageError, err.stack);
    return err.message;
  }
  return null;
}

test('every option of every command: a refused and an accepted value, as written', () => {
  for (const [command, options] of Object.entries(OPTIONS)) {
    assert.ok(CASES[command] !== undefined, `${command}: no cases`);
    for (const name of Object.keys(options)) {
      const cases = CASES[command][name];
      assert.ok(cases !== undefined, `${command} --${name}: no cases`);
      assert.ok(cases.some(([, m]) => m === null), `${command} --${name}: no accepted case`);
      assert.ok(cases.some(([, m]) => m !== null), `${command} --${name}: no refused case`);
      for (const [value, message] of cases) {
        const got = refusal(argvFor(command, name, value));
        const where = `${command} --${name} ${value}`;
        if (message instanceof RegExp) assert.match(got, message, where);
        else assert.equal(got, message, where);
      }
    }
    assert.deepEqual(Object.keys(CASES[command]).sort(), Object.keys(options).sort());
  }
  assert.deepEqual(Object.keys(CASES).sort(), Object.keys(OPTIONS).sort());
});

test('the command line itself: commands, unknown, repeated, missing and bare options', () => {
  const known = '--target, --request, --timeout, --token';
  const cases = [
    [[], 'give a command: embed, stream, infer'],
    [['embd'], "COMMAND: must be one of embed, stream, infer, got 'embd'"],
    [['embed', '--request', TEXT], `--target: required, ${FORM}`],
    [['embed', '--target', 'h:1'], '--request: required, an EmbedRequest as JSON, e.g. {"text": "hello"}'],
    [['embed', '--target', 'h:1', '--target', 'h:2', '--request', TEXT], '--target: given twice'],
    [['embed', '--target', 'h:1', '--requests', TEXT], `unknown option --requests; options of embed: ${known}`],
    [['embed', '--target', 'h:1', 'extra'], `'extra': not an option; options of embed: ${known}`],
    [['embed', '--request', TEXT, '--target'], `--target: needs a value, ${FORM}`],
    [['embed', `--target=h:1`, `--request=${TEXT}`], null],
  ];
  for (const [argv, message] of cases) assert.equal(refusal(argv), message, argv.join(' '));
  assert.deepEqual(parseArgs(['infer', '--help']), { help: true });
  assert.deepEqual(parseArgs(['embed', '--target', 'h:1', '--request', TEXT, '--timeout', '3'], {}),
    { command: 'embed', values: { target: 'h:1', request: { text: 'a' }, timeout: 3 } });
  assert.match(usage(), /^usage: node client\/node\/cli\.js COMMAND --option VALUE \.\.\.\n/);
});

test('$EMBED_TOKEN: read when --token is not given, checked by the same rule', () => {
  const argv = ['embed', '--target', 'h:1', '--request', TEXT];
  assert.equal(parseArgs(argv, { EMBED_TOKEN: 'from-env' }).values.token, 'from-env');
  assert.equal(parseArgs([...argv, '--token', 'given'], { EMBED_TOKEN: 'from-env' }).values.token,
    'given');
  assert.equal(parseArgs(argv, { EMBED_TOKEN: '' }).values.token, undefined); // '' = none
  assert.equal(parseArgs([...argv, '--token', ''], { EMBED_TOKEN: 'x' }).values.token, undefined);
  assert.equal(refusal(argv, { EMBED_TOKEN: 'abc\r\n' }),
    `EMBED_TOKEN: must be ${TOKEN_FORM}; this one has a line break at character 4 of 5`);
});

test('as a process: --help exits 0; a refusal is one line, exit status 2, nothing sent', () => {
  const help = spawnSync(process.execPath, [CLI, '--help'], { encoding: 'utf8' });
  assert.equal(help.status, 0);
  assert.equal(help.stdout, usage());
  const bad = spawnSync(process.execPath, [CLI, 'embed', '--target', '127.0.0.1:1', '--request',
    '{"text": "a", "start_positon": 1}'], { encoding: 'utf8' });
  assert.equal(bad.status, 2);
  assert.equal(bad.stdout, '');
  assert.equal(bad.stderr, "error: --request: unknown option 'start_positon'; known options: add_special_tokens, allow_special_tokens, compose, dtype, model, output, request_id, start_position, text, token_ids, truncate, version (see --help)\n");
  const newline = spawnSync(process.execPath, [CLI, 'embed', '--target', 'h:1', '--request',
    '{"text": "a\n'], { encoding: 'utf8' });
  assert.equal(newline.status, 2);
  assert.equal(newline.stderr.split('\n').length, 2, newline.stderr);
});
