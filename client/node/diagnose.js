'use strict';
// Why a connection to a target failed, told apart by looking at what listens there: the
// same checks and the same words as client/diagnose.py, which embedctl uses.
//
// grpc-js reports a failed connection as UNAVAILABLE with text that varies by release and
// can end in an empty "Resolution note: ". `probe` asks the listener itself, with at most
// three short connections: does anything accept one, does it complete a TLS handshake, and
// what does it answer to an HTTP/2 preface (a SETTINGS frame: a gRPC server; "HTTP/1.1 400
// ...": a web server). `explain` turns that into one line saying what to try.
const net = require('node:net');
const tls = require('node:tls');
const { splitTarget } = require('./grammar');

// The client connection preface of HTTP/2 (RFC 9113 §3.4) and an empty SETTINGS frame.
const H2_PREFACE = Buffer.concat([Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n', 'latin1'),
  Buffer.from([0, 0, 0, 4, 0, 0, 0, 0, 0])]);
const SETTINGS = 0x4;
// grpc-js's own words for "no connection was made" (as opposed to a server's UNAVAILABLE:
// no model loaded yet, draining).
const UNREACHABLE = /No connection established|Name resolution failed|Connection dropped|Socket closed|Failed to connect|ECONNREFUSED|ENOENT/i;

/** Whether a grpc-js error means no connection to the server could be made at all. */
function unreachable(err) {
  return err.code === 14 && UNREACHABLE.test(`${err.details || ''} ${err.message || ''}`);
}

function where(target) {
  const at = splitTarget(target);
  if (at === null) return null;
  return at.path !== undefined ? { path: at.path } : { host: at.host, port: at.port };
}

/** A socket from `make`, settled once: 'ok' with the socket, or the error / 'timeout'. */
function attempt(make, event, timeoutMs) {
  return new Promise((resolve) => {
    let done = false;
    const socket = make();
    const finish = (result) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      resolve(result);
    };
    const timer = setTimeout(() => {
      socket.destroy();
      finish({ timeout: true });
    }, timeoutMs);
    socket.once(event, () => finish({ socket }));
    socket.once('error', (error) => {
      socket.destroy();
      finish({ error });
    });
  });
}

/** The first bytes `socket` answers to `bytes` (empty when it hangs up or stays silent). */
function answer(socket, bytes, timeoutMs) {
  return new Promise((resolve) => {
    const timer = setTimeout(() => {
      socket.destroy();
      resolve(Buffer.alloc(0));
    }, timeoutMs);
    const done = (data) => {
      clearTimeout(timer);
      socket.destroy();
      resolve(data);
    };
    socket.once('data', done);
    socket.once('end', () => done(Buffer.alloc(0)));
    socket.once('error', () => done(Buffer.alloc(0)));
    socket.write(bytes);
  });
}

/**
 * What listens at `target`: { kind, detail }, kind one of refused | nosocket | unresolved
 * | timeout | error | tls | grpc | http1 | other. Never rejects.
 */
async function probe(target, timeoutMs = 3000) {
  const at = where(target);
  if (at === null) return { kind: 'error', detail: 'not a target' };
  const first = await attempt(() => net.connect(at), 'connect', timeoutMs);
  if (first.timeout) return { kind: 'timeout' };
  if (first.error) {
    const { code } = first.error;
    if (code === 'ECONNREFUSED') return { kind: 'refused' };
    if (code === 'ENOENT' && at.path !== undefined) return { kind: 'nosocket' };
    if (code === 'ENOTFOUND' || code === 'EAI_AGAIN' || code === 'EAI_NONAME') {
      return { kind: 'unresolved', detail: code === 'EAI_AGAIN' ? 'temporary failure in name resolution' : 'no such host' };
    }
    return { kind: 'error', detail: code || first.error.message };
  }
  first.socket.destroy();
  // Only: does it speak TLS at all? (trust is grpc's job, not this check's.)
  const secure = await attempt(() => tls.connect({
    ...at, rejectUnauthorized: false, servername: at.host && !net.isIP(at.host) ? at.host : undefined,
  }), 'secureConnect', timeoutMs);
  if (secure.socket) {
    secure.socket.destroy();
    return { kind: 'tls' };
  }
  const plain = await attempt(() => net.connect(at), 'connect', timeoutMs);
  if (!plain.socket) return { kind: 'other', detail: 'closed the connection' };
  const bytes = await answer(plain.socket, H2_PREFACE, timeoutMs);
  if (bytes.subarray(0, 5).toString('latin1') === 'HTTP/') {
    return { kind: 'http1', detail: bytes.toString('latin1').split('\r\n', 1)[0] };
  }
  if (bytes.length >= 9 && bytes[3] === SETTINGS) return { kind: 'grpc' };
  return { kind: 'other',
    detail: bytes.length === 0 ? 'closed the connection'
      : 'answered bytes that are neither HTTP/2 nor HTTP/1.x' };
}

/** One line: what is at `target` and what to try (`details`: grpc-js's own text). */
function explain(target, listener, details) {
  switch (listener.kind) {
    case 'refused':
      return `nothing is listening at ${target} (connection refused): start the server, or `
        + 'point --target at its gRPC port';
    case 'nosocket':
      return `nothing is listening at ${target} (no such socket file): start the server, or `
        + 'point --target at its socket';
    case 'unresolved':
      return `cannot resolve the host of ${target} (${listener.detail}): check --target`;
    case 'timeout':
      return `no TCP answer from ${target} (connection timed out): check the host and port `
        + 'in --target, and any firewall on the way';
    case 'error':
      return `cannot connect to ${target} (${listener.detail}): check --target`;
    case 'http1':
      return `${target} is an HTTP/1.x server, not gRPC (it answered '${listener.detail}'): `
        + "point --target at the gRPC port; the service's REST API and page are on another port";
    case 'tls':
      return `${target} speaks TLS, and this CLI connects in plaintext only: point --target `
        + 'at a plaintext port, or call embed.js with { credentials: '
        + 'grpc.credentials.createSsl(...) }';
    case 'other':
      return `${target} accepted the connection but does not speak gRPC (${listener.detail}): `
        + 'check the port in --target';
    default:
      return `server not reachable at ${target}: ${String(details).replace(/\s*Resolution note:\s*$/, '')}`;
  }
}

module.exports = { explain, probe, unreachable };
