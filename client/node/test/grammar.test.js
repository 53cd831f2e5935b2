'use strict';
// The shared table of client inputs (tests/vectors/client_inputs.json), run through the Node
// client's grammar and through the page's own parseIdList (cut out of page.js and evaluated
// as it is, so the page cannot drift from the other tools).
const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const {
  IDS_FORM, SPELLINGS, TARGET_FORM, parseIds, enumName, oipName, embedRequest, inferRequest,
  isTarget,
} = require('../grammar');

const ROOT = path.resolve(__dirname, '..', '..', '..');
const VECTORS = JSON.parse(
  fs.readFileSync(path.join(ROOT, 'tests', 'vectors', 'client_inputs.json'), 'utf8'));
const entries = (list) => list.filter((v) => v._about === undefined);

function pageParser() {
  const source = fs.readFileSync(path.join(ROOT, 'service', 'rpc', 'http', 'page', 'page.js'), 'utf8');
  const start = source.indexOf('function parseIdList(');
  const end = source.indexOf('// end parseIdList');
  assert.ok(start >= 0 && end > start, 'page.js has no parseIdList ... // end parseIdList');
  // eslint-disable-next-line no-new-func
  return new Function(`${source.slice(start, end)}\nreturn parseIdList;`)();
}

function throwsWith(fn, substring) {
  assert.throws(fn, (err) => {
    assert.ok(err.message.includes(substring), `${JSON.stringify(err.message)} lacks ${JSON.stringify(substring)}`);
    return true;
  });
}

function checkIdLists(parse) {
  const cases = entries(VECTORS.id_lists);
  assert.ok(cases.length >= 20);
  for (const v of cases) {
    if (v.error !== undefined) throwsWith(() => parse(v.input), v.error);
    else assert.deepEqual(parse(v.input), v.ids, JSON.stringify(v.input));
  }
}

test('node client: every id-list vector', () => checkIdLists(parseIds));

test('page: every id-list vector', () => checkIdLists(pageParser()));

test('the page uses parseIdList for its ids', () => {
  const source = fs.readFileSync(path.join(ROOT, 'service', 'rpc', 'http', 'page', 'page.js'), 'utf8');
  assert.match(source, /= parseIdList\(/);
});

test('spellings: the same table as the vectors, each one accepted', () => {
  const { _about: _, ...table } = VECTORS.spellings;
  assert.deepEqual(SPELLINGS, table);
  assert.equal(IDS_FORM, VECTORS.id_form);
  for (const [field, names] of Object.entries(table)) {
    for (const [name, others] of Object.entries(names)) {
      for (const spelling of [name, ...others]) {
        assert.equal(enumName(field, spelling), name);
        assert.equal(embedRequest({ text: 'a', [field]: spelling })[field], name);
      }
      // The OIP face: compose/datatype/truncate in the spelling the OIP front reads.
      assert.equal(oipName(field, name), others[others.length - 1]);
    }
  }
});

test('bad spellings are refused, listing the accepted ones', () => {
  for (const v of VECTORS.bad_spellings) {
    throwsWith(() => enumName(v.field, v.input), v.error);
    throwsWith(() => embedRequest({ text: 'a', [v.field]: v.input }), v.error);
    const key = v.field === 'dtype' ? 'datatype' : v.field;
    throwsWith(() => inferRequest({ input_ids: [[1]], [key]: v.input }), v.error);
  }
});

test('request options: the expected fields, or the error', () => {
  for (const v of entries(VECTORS.requests)) {
    const build = () => embedRequest({ token_ids: { ids: [1, 2] }, ...v.options });
    if (v.error !== undefined) {
      throwsWith(build, v.error);
      continue;
    }
    const request = build();
    assert.deepEqual(request.token_ids, { ids: [1, 2] });
    for (const [key, want] of Object.entries(v.request)) {
      assert.equal(request[key], want, `${JSON.stringify(v.options)} -> ${key}`);
    }
  }
});

test('id arrays: the ids, or the error naming the element', () => {
  for (const v of entries(VECTORS.id_arrays)) {
    const build = () => embedRequest({ token_ids: { ids: v.input } });
    if (v.error !== undefined) throwsWith(build, v.error);
    else assert.deepEqual(build().token_ids.ids, v.ids);
  }
});

test('node-only shapes: text xor token_ids, infer keys', () => {
  throwsWith(() => embedRequest({}), 'give exactly one of text or token_ids');
  throwsWith(() => embedRequest({ text: 'a', token_ids: { ids: [1] } }),
    'give exactly one of text or token_ids');
  throwsWith(() => embedRequest({ token_ids: { id: [1] } }), "unknown option 'id'");
  throwsWith(() => inferRequest({ input_ids: [[1]], dtype: 'FP16' }),
    "unknown option 'dtype'; known options: compose, datatype, id, input_ids");
  assert.deepEqual(inferRequest({ input_ids: [[1, 2]], compose: 'token', datatype: 'float16',
    truncate: 'TRUNCATE_LEFT', start_position: 3 }), {
    model_name: '', model_version: '', id: '', start_position: 3, compose: 'token_only',
    truncate: 'left', datatype: 'FP16', input_ids: [[1, 2]] });
});

test('targets: every vector accepted or refused as the table says', () => {
  assert.equal(TARGET_FORM, VECTORS.target_form);
  const cases = entries(VECTORS.targets);
  assert.ok(cases.length >= 20);
  for (const v of cases) assert.equal(isTarget(v.input), v.ok, JSON.stringify(v.input));
});
