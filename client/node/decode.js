'use strict';
// Raw tensor bytes <-> typed arrays. The service sends row-major, little-endian tensors as
// bytes (never `repeated float`); this module widens them to Float32Array.
//
// Every decoder works on bit patterns (DataView reads, writes through a Uint32Array view of
// the output) rather than on JS numbers: a float32 NaN that passes through a double can
// lose its payload, and we want the decoded array to be bit-for-bit what the server meant.

/** Element size in bytes of each wire dtype (native enum names and OIP datatype names). */
const ELEMENT_SIZE = {
  DTYPE_FLOAT32: 4, DTYPE_FLOAT16: 2, DTYPE_BFLOAT16: 2,
  FP32: 4, FP16: 2, BF16: 2,
};

/**
 * float16 bits (0..0xffff) -> float32 bits. Exact: every half value is a float32 value.
 * @param {number} h
 * @returns {number} uint32 bit pattern
 */
function halfBitsToFloatBits(h) {
  const sign = (h & 0x8000) << 16;
  const exp = (h >>> 10) & 0x1f;
  let frac = h & 0x3ff;
  if (exp === 0x1f) {
    // Inf keeps a zero fraction; NaN keeps its payload (shifted into the top bits).
    return (sign | 0x7f800000 | (frac << 13)) >>> 0;
  }
  if (exp !== 0) {
    // Normal: rebias the exponent from 15 to 127.
    return (sign | ((exp + 112) << 23) | (frac << 13)) >>> 0;
  }
  if (frac === 0) return sign >>> 0;  // +0 / -0
  // Subnormal half (frac * 2^-24) is a normal float32: shift until the implicit bit shows.
  let e = 113;  // 127 - 14: the exponent of 2^-14, the subnormal scale
  while ((frac & 0x400) === 0) {
    frac <<= 1;
    e -= 1;
  }
  return (sign | (e << 23) | ((frac & 0x3ff) << 13)) >>> 0;
}

/**
 * bfloat16 bits -> float32 bits: bfloat16 is the top half of a float32.
 * @param {number} b
 * @returns {number}
 */
function bfloat16BitsToFloatBits(b) {
  return ((b & 0xffff) << 16) >>> 0;
}

/** Scalar helpers (tests, debugging): bits in, JS number out. */
function bitsToFloat32(bits) {
  const u = new Uint32Array([bits]);
  return new Float32Array(u.buffer)[0];
}
function float16ToNumber(h) { return bitsToFloat32(halfBitsToFloatBits(h)); }
function bfloat16ToNumber(b) { return bitsToFloat32(bfloat16BitsToFloatBits(b)); }

/**
 * Decode raw little-endian tensor bytes to a Float32Array.
 * @param {Uint8Array} bytes  the Tensor.data / raw_output_contents bytes (any byteOffset)
 * @param {string} dtype  DTYPE_FLOAT32|DTYPE_FLOAT16|DTYPE_BFLOAT16 or FP32|FP16|BF16
 * @returns {Float32Array}
 */
function decodeTensor(bytes, dtype) {
  const size = ELEMENT_SIZE[dtype];
  if (size === undefined) throw new Error(`unknown dtype ${dtype}`);
  if (bytes.byteLength % size !== 0) {
    throw new Error(`${bytes.byteLength} bytes is not a whole number of ${dtype} elements`);
  }
  const n = bytes.byteLength / size;
  // DataView: gRPC buffers are slices of a larger buffer at arbitrary (unaligned) offsets,
  // which typed-array views cannot start at; DataView also fixes the byte order to LE.
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const out = new Float32Array(n);
  const bits = new Uint32Array(out.buffer);  // same buffer, host order on both views
  if (size === 4) {
    for (let i = 0; i < n; i++) bits[i] = view.getUint32(4 * i, true);
  } else if (dtype === 'DTYPE_FLOAT16' || dtype === 'FP16') {
    for (let i = 0; i < n; i++) bits[i] = halfBitsToFloatBits(view.getUint16(2 * i, true));
  } else {
    for (let i = 0; i < n; i++) bits[i] = bfloat16BitsToFloatBits(view.getUint16(2 * i, true));
  }
  return out;
}

/**
 * A Float32Array as little-endian float32 bytes (for handing values on bit-exactly, e.g.
 * as base64 in the CLI's JSON, where NaN and -0 would not survive as numbers).
 * @param {Float32Array} values
 * @returns {Buffer}
 */
function float32ToLittleEndian(values) {
  const out = Buffer.alloc(values.length * 4);
  const bits = new Uint32Array(values.buffer, values.byteOffset, values.length);
  for (let i = 0; i < values.length; i++) out.writeUInt32LE(bits[i], 4 * i);
  return out;
}

/**
 * Integers -> little-endian int64 bytes (OIP raw_input_contents for INT64 inputs).
 * @param {Array<number|bigint|string>} ints
 * @returns {Buffer}
 */
function encodeInt64LE(ints) {
  const out = Buffer.alloc(ints.length * 8);
  ints.forEach((v, i) => out.writeBigInt64LE(BigInt(v), 8 * i));
  return out;
}

module.exports = {
  ELEMENT_SIZE,
  halfBitsToFloatBits,
  bfloat16BitsToFloatBits,
  float16ToNumber,
  bfloat16ToNumber,
  decodeTensor,
  float32ToLittleEndian,
  encodeInt64LE,
};
