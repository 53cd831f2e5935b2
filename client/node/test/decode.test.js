'use strict';
// Pure decode tests: `node --test test/` (no server, no network).
const test = require('node:test');
const assert = require('node:assert/strict');
const {
  halfBitsToFloatBits, bfloat16BitsToFloatBits, float16ToNumber, bfloat16ToNumber,
  decodeTensor, float32ToLittleEndian, encodeInt64LE,
} = require('../decode');

// Object.is tells -0 from +0 and NaN from everything else, unlike ===.
const same = (got, want, what) => assert.ok(Object.is(got, want), `${what}: got ${got}, want ${want}`);

test('float16 normals, limits and zeros', () => {
  same(float16ToNumber(0x3c00), 1, '1');
  same(float16ToNumber(0xbc00), -1, '-1');
  same(float16ToNumber(0x3555), 0.333251953125, 'nearest half to 1/3');
  same(float16ToNumber(0x7bff), 65504, 'max half');
  same(float16ToNumber(0x0400), 2 ** -14, 'min normal');
  same(float16ToNumber(0x0000), 0, '+0');
  same(float16ToNumber(0x8000), -0, '-0');
  assert.equal(halfBitsToFloatBits(0x8000), 0x80000000);
});

test('float16 subnormals', () => {
  same(float16ToNumber(0x0001), 2 ** -24, 'smallest subnormal');
  same(float16ToNumber(0x8001), -(2 ** -24), 'negative smallest subnormal');
  same(float16ToNumber(0x03ff), 1023 * 2 ** -24, 'largest subnormal');
  same(float16ToNumber(0x0200), 2 ** -15, 'top-bit subnormal');
  same(float16ToNumber(0x0155), 0x155 * 2 ** -24, 'mixed-bit subnormal');
  // Every subnormal, against the arithmetic definition frac * 2^-24.
  for (let f = 1; f < 0x400; f++) same(float16ToNumber(f), f * 2 ** -24, `0x${f.toString(16)}`);
});

test('float16 inf and nan', () => {
  same(float16ToNumber(0x7c00), Infinity, '+inf');
  same(float16ToNumber(0xfc00), -Infinity, '-inf');
  assert.ok(Number.isNaN(float16ToNumber(0x7e00)), 'quiet nan');
  assert.ok(Number.isNaN(float16ToNumber(0x7c01)), 'signalling nan');
  // Payload and sign are kept in the bits, not collapsed to a canonical NaN.
  assert.equal(halfBitsToFloatBits(0x7e00), 0x7fc00000);
  assert.equal(halfBitsToFloatBits(0xfc01), 0xff802000);
});

test('every finite float16 matches its arithmetic value', () => {
  for (let h = 0; h < 0x10000; h++) {
    const exp = (h >>> 10) & 0x1f;
    if (exp === 0x1f) continue;
    const frac = h & 0x3ff;
    const mag = exp === 0 ? frac * 2 ** -24 : (1 + frac / 1024) * 2 ** (exp - 15);
    same(float16ToNumber(h), h & 0x8000 ? -mag : mag, `0x${h.toString(16)}`);
  }
});

test('bfloat16 values, subnormals, inf, nan, -0', () => {
  same(bfloat16ToNumber(0x3f80), 1, '1');
  same(bfloat16ToNumber(0xc049), -3.140625, '-pi in bf16');
  same(bfloat16ToNumber(0x7f7f), 3.3895313892515355e38, 'max bf16');
  same(bfloat16ToNumber(0x0001), 2 ** -133, 'smallest subnormal');
  same(bfloat16ToNumber(0x007f), 127 * 2 ** -133, 'largest subnormal');
  same(bfloat16ToNumber(0x8000), -0, '-0');
  same(bfloat16ToNumber(0x7f80), Infinity, '+inf');
  same(bfloat16ToNumber(0xff80), -Infinity, '-inf');
  assert.ok(Number.isNaN(bfloat16ToNumber(0x7fc0)), 'nan');
  assert.equal(bfloat16BitsToFloatBits(0xffc1), 0xffc10000);
});

test('decodeTensor reads little-endian bytes at an unaligned offset', () => {
  // One spare byte in front: gRPC hands out slices of a larger buffer.
  const raw = Buffer.from([0xaa, 0x00, 0x3c, 0x00, 0x80, 0x00, 0x7c, 0x01, 0x00]);
  const f16 = decodeTensor(raw.subarray(1, 9), 'DTYPE_FLOAT16');
  assert.deepEqual(Array.from(f16), [1, -0, Infinity, 2 ** -24]);
  same(f16[1], -0, 'f16 -0 in a tensor');
  const bf16 = decodeTensor(raw.subarray(1, 5), 'BF16');
  same(bf16[0], 2 ** -7, 'bf16 0x3c00');
  same(bf16[1], -0, 'bf16 -0 in a tensor');
  assert.equal(bf16.length, 2);
  const f32raw = Buffer.alloc(13);
  f32raw.writeFloatLE(1.5, 1);
  f32raw.writeUInt32LE(0x7fc00001, 5);  // a NaN with a payload
  f32raw.writeUInt32LE(0x80000000, 9);  // -0
  const f32 = decodeTensor(f32raw.subarray(1), 'FP32');
  same(f32[0], 1.5, 'fp32 1.5');
  same(f32[2], -0, 'fp32 -0');
  assert.equal(new Uint32Array(f32.buffer)[1], 0x7fc00001, 'NaN payload kept');
  // And back out to bytes, bit for bit.
  assert.deepEqual(float32ToLittleEndian(f32), f32raw.subarray(1));
});

test('decodeTensor rejects ragged bytes and unknown dtypes', () => {
  assert.throws(() => decodeTensor(Buffer.alloc(3), 'DTYPE_FLOAT16'), /not a whole number/);
  assert.throws(() => decodeTensor(Buffer.alloc(4), 'INT8'), /unknown dtype INT8/);
});

test('encodeInt64LE writes signed little-endian int64', () => {
  assert.deepEqual(encodeInt64LE([1, 50256, -1]), Buffer.from([
    1, 0, 0, 0, 0, 0, 0, 0,
    0x50, 0xc4, 0, 0, 0, 0, 0, 0,
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]));
});
