/*
 * c-probe: an HTTP probe plugin written in C (world `probe-plugin`).
 *
 * It sends `GET http://<pod-ip>:<port><path>` to the first of the request's
 * pod IPs and passes when the status is 200-399 and, if `expect` is set, the
 * body (its first 64 KiB) contains `expect`.
 *
 * Settings (the pod's `request.settings` first, then the node's `settings()`):
 *
 * | key      | default | meaning                                     |
 * | -------- | ------- | ------------------------------------------- |
 * | `port`   | `80`    | the container port, 1-65535                 |
 * | `path`   | `/`     | the request path (a leading `/` is added)   |
 * | `expect` | unset   | a substring the body must contain           |
 *
 * Ownership (see plugins/guides/c.md):
 * - the request belongs to the plugin: it is freed here with
 *   exports_wasmlet_plugin_probe_probe_request_free;
 * - a failure message must be heap memory: the generated post-return
 *   function free()s it after the host has copied it;
 * - what imports return belongs to the plugin too (the settings list, the
 *   response or the error string); what imports take is only borrowed.
 */
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "probe_plugin.h"

typedef probe_plugin_string_t string_t;
typedef wasmlet_plugin_types_pair_t pair_t;
typedef exports_wasmlet_plugin_probe_probe_request_t probe_request_t;
typedef exports_wasmlet_plugin_probe_probe_result_t probe_result_t;

/* A WIT string is UTF-8 bytes and a length, not NUL-terminated: print it
 * with "%.*s" and STR_ARGS(s). */
#define STR_ARGS(s) (int)(s).len, (const char *)(s).ptr

/* printf into a new malloc'd, NUL-terminated string. */
static char *vformat(const char *fmt, va_list args) {
  va_list again;
  va_copy(again, args);
  int len = vsnprintf(NULL, 0, fmt, args);
  char *text = len < 0 ? NULL : malloc((size_t)len + 1);
  if (text == NULL) {
    abort(); /* a trap: this call fails, the node carries on */
  }
  vsnprintf(text, (size_t)len + 1, fmt, again);
  va_end(again);
  return text;
}

__attribute__((__format__(printf, 1, 2)))
static char *strf(const char *fmt, ...) {
  va_list args;
  va_start(args, fmt);
  char *text = vformat(fmt, args);
  va_end(args);
  return text;
}

/* Sets `ret` to failure(message). The message is malloc'd: the post-return
 * function free()s it once the host has copied it out. */
__attribute__((__format__(printf, 2, 3)))
static void fail(probe_result_t *ret, const char *fmt, ...) {
  va_list args;
  va_start(args, fmt);
  char *message = vformat(fmt, args);
  va_end(args);
  ret->tag = EXPORTS_WASMLET_PLUGIN_PROBE_PROBE_RESULT_FAILURE;
  ret->val.failure.ptr = (uint8_t *)message;
  ret->val.failure.len = strlen(message);
}

static bool string_eq(const string_t *s, const char *c) {
  size_t len = strlen(c);
  return s->len == len && memcmp(s->ptr, c, len) == 0;
}

/* The first value of `key` in `pairs`, or NULL. */
static const string_t *find(const pair_t *pairs, size_t len, const char *key) {
  for (size_t i = 0; i < len; i++) {
    if (string_eq(&pairs[i].key, key)) {
      return &pairs[i].value;
    }
  }
  return NULL;
}

/* The pod's settings first, then the node's. */
struct settings {
  const exports_wasmlet_plugin_probe_list_pair_t *pod;
  const wasmlet_plugin_host_list_pair_t *node;
};

static const string_t *setting(const struct settings *s, const char *key) {
  const string_t *value = find(s->pod->ptr, s->pod->len, key);
  return value != NULL ? value : find(s->node->ptr, s->node->len, key);
}

static bool is_space(uint8_t c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* Parses a port: decimal digits, 1-65535, surrounding blanks allowed. A
 * number in a pod's settings annotation arrives as its JSON text ("8080"). */
static bool parse_port(const string_t *s, uint16_t *port) {
  size_t start = 0, end = s->len;
  while (start < end && is_space(s->ptr[start])) start++;
  while (end > start && is_space(s->ptr[end - 1])) end--;
  if (start == end || end - start > 5) {
    return false;
  }
  uint32_t value = 0;
  for (size_t i = start; i < end; i++) {
    if (s->ptr[i] < '0' || s->ptr[i] > '9') {
      return false;
    }
    value = value * 10 + (uint32_t)(s->ptr[i] - '0');
  }
  if (value == 0 || value > 65535) {
    return false;
  }
  *port = (uint16_t)value;
  return true;
}

static bool contains(const uint8_t *haystack, size_t len, const string_t *needle) {
  if (needle->len == 0) {
    return true;
  }
  for (size_t i = 0; i + needle->len <= len; i++) {
    if (memcmp(haystack + i, needle->ptr, needle->len) == 0) {
      return true;
    }
  }
  return false;
}

/* The check proper. Borrows `request` and `settings`; sets `ret`. */
static void probe(const probe_request_t *request, const struct settings *settings,
                  probe_result_t *ret) {
  uint16_t port = 80;
  const string_t *port_setting = setting(settings, "port");
  if (port_setting != NULL && !parse_port(port_setting, &port)) {
    fail(ret, "setting `port` = \"%.*s\" is invalid: not a port number (1-65535)",
         STR_ARGS(*port_setting));
    return;
  }
  const string_t *path_setting = setting(settings, "path");
  string_t given = path_setting != NULL ? *path_setting : (string_t){(uint8_t *)"/", 1};
  const string_t *expect = setting(settings, "expect");

  if (request->pod_ips.len == 0) {
    fail(ret, "the pod has no IP address yet");
    return;
  }
  const string_t *ip = &request->pod_ips.ptr[0];

  /* The path with a leading `/`, and the URL for messages (an IPv6 address
   * in brackets). Both ours: freed below. */
  bool slash = given.len == 0 || given.ptr[0] != '/';
  char *path = strf("%s%.*s", slash ? "/" : "", STR_ARGS(given));
  bool v6 = memchr(ip->ptr, ':', ip->len) != NULL;
  char *url = strf("http://%s%.*s%s:%u%s", v6 ? "[" : "", STR_ARGS(*ip), v6 ? "]" : "",
                   port, path);

  /* Arguments to an import are borrowed: `line` stays ours. */
  char *line = strf("GET %s for %.*s/%.*s (%.*s, %.*s)", url,
                    STR_ARGS(request->pod.namespace_), STR_ARGS(request->pod.name),
                    STR_ARGS(request->container), STR_ARGS(request->probe_type));
  string_t message;
  probe_plugin_string_set(&message, line);
  wasmlet_plugin_host_log(WASMLET_PLUGIN_HOST_LEVEL_DEBUG, &message);
  free(line);

  string_t path_arg;
  probe_plugin_string_set(&path_arg, path);
  wasmlet_plugin_pod_network_pair_t header = {
      .key = {(uint8_t *)"Accept", 6},
      .value = {(uint8_t *)"*/*", 3},
  };
  wasmlet_plugin_pod_network_list_pair_t headers = {&header, 1};

  /* What the import returns is ours: the response, or the error string. */
  wasmlet_plugin_pod_network_http_response_t response;
  string_t error;
  if (!wasmlet_plugin_pod_network_http_get((string_t *)ip, port, &path_arg, &headers,
                                           &response, &error)) {
    fail(ret, "GET %s: %.*s", url, STR_ARGS(error));
    probe_plugin_string_free(&error);
  } else if (response.status < 200 || response.status > 399) {
    fail(ret, "GET %s: HTTP status %u", url, response.status);
    wasmlet_plugin_pod_network_http_response_free(&response);
  } else if (expect != NULL && !contains(response.body.ptr, response.body.len, expect)) {
    fail(ret, "GET %s: HTTP status %u, but the body does not contain \"%.*s\"", url,
         response.status, STR_ARGS(*expect));
    wasmlet_plugin_pod_network_http_response_free(&response);
  } else {
    ret->tag = EXPORTS_WASMLET_PLUGIN_PROBE_PROBE_RESULT_SUCCESS;
    wasmlet_plugin_pod_network_http_response_free(&response);
  }
  free(url);
  free(path);
}

/* The export: `check: func(request: probe-request) -> probe-result`. */
void exports_wasmlet_plugin_probe_check(probe_request_t *request, probe_result_t *ret) {
  /* The node's settings: a list the import allocated for us. */
  wasmlet_plugin_host_list_pair_t node;
  wasmlet_plugin_host_settings(&node);
  struct settings settings = {.pod = &request->settings, .node = &node};

  probe(request, &settings, ret);

  wasmlet_plugin_host_list_pair_free(&node);
  exports_wasmlet_plugin_probe_probe_request_free(request);
}
