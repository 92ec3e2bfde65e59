/*
 * The global `utils` object plugins get, implemented in C++ (OpenSSL):
 * unixNow, uuid, hmacSHA256, jwtSignHS256, base64, base64URL,
 * base64URLDecode, volcSignV4, hasCapability and json.clone.
 */

#ifndef V8HOST_HOST_UTILS_H
#define V8HOST_HOST_UTILS_H

#include <string_view>

#include <v8.h>

namespace v8host {

/* Versioned capabilities this host supports (exact names). */
bool host_has_capability(std::string_view name);

/* Defines a frozen, read-only `utils` on the context's global.  Must run
   before any plugin code in the context. */
bool install_utils(v8::Local<v8::Context> ctx);

}  // namespace v8host

#endif
