// A wasmlet probe plugin in JavaScript (world `probe-plugin` of
// plugins/wit/plugin.wit), built with jco componentize: see build.sh and
// plugins/guides/javascript.md.
//
// Settings (strings; the pod's `request.settings` over the node's `settings()`):
//   port    the port to GET, 1-65535; surrounding blanks ignored [80]
//   path    the path to GET; a leading / is added [/]
//   expect  a substring the body must contain [unset: any body]
//
// Passes on status 200-399 (and `expect` in the body, when set).

import { log, settings as nodeSettings } from 'wasmlet:plugin/host@0.1.0';
import { httpGet } from 'wasmlet:plugin/pod-network@0.1.0';

const decoder = new TextDecoder();

/** `list<pair>` layers: the first list that has `key` wins. */
function lookup(key, ...layers) {
  for (const pairs of layers) {
    const pair = pairs.find((p) => p.key === key);
    if (pair !== undefined) return pair.value;
  }
  return undefined;
}

/** `variant probe-result`: `{ tag: 'failure', val: message }`. */
function failure(message) {
  return { tag: 'failure', val: message };
}

function check(request) {
  const node = nodeSettings();
  const get = (key) => lookup(key, request.settings, node);

  const portText = (get('port') ?? '80').trim();
  const port = Number(portText);
  if (!/^[0-9]+$/.test(portText) || port < 1 || port > 65535) {
    return failure(`setting \`port\` = ${JSON.stringify(portText)} is invalid: not a port (1-65535)`);
  }
  let path = get('path') ?? '/';
  if (!path.startsWith('/')) path = `/${path}`;
  const expect = get('expect');
  const ip = request.podIps[0];
  if (ip === undefined) {
    return failure('the pod has no IP yet');
  }
  const url = `http://${ip}:${port}${path}`;
  log('debug', `GET ${url} for ${request.pod.namespace}/${request.pod.name} (${request.probeType} of ${request.container})`);

  let response;
  try {
    // `result<http-response, string>`: the `ok` value is returned, the `err`
    // string is thrown (as `e.payload`).
    response = httpGet(ip, port, path, [{ key: 'Accept', value: '*/*' }]);
  } catch (e) {
    return failure(`GET ${url}: ${e?.payload ?? e}`);
  }
  const { status, body } = response; // body: Uint8Array, its first 64 KiB
  if (status < 200 || status > 399) {
    return failure(`GET ${url}: status ${status}`);
  }
  if (expect !== undefined && !decoder.decode(body).includes(expect)) {
    return failure(`GET ${url}: status ${status}, but the body does not contain ${JSON.stringify(expect)}`);
  }
  return { tag: 'success' };
}

// The world's export `wasmlet:plugin/probe@0.1.0`, by its interface name.
export const probe = { check };
