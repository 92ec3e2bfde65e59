/*
 * The global `utils` object plugins get, implemented in C++ (OpenSSL):
 * unixNow, uuid, hmacSHA256, jwtSignHS256, base64, base64URL,
 * base64URLDecode, volcSignV4, hasCapability, and json.clone with the
 * json-clone@1 capability.
 */

#ifndef V8HOST_HOST_UTILS_H
#define V8HOST_HOST_UTILS_H

#include <string_view>

#include <v8.h>

namespace v8host {

/* Versioned capabilities this host supports (exact names). */
bool host_has_capability(std::string_view name);

/* The capability that brings utils.json.clone. */
constexpr std::string_view kJsonCloneCapability = "json-clone@1";

/* Defines a frozen, read-only `utils` on the context's global, with
   `json.clone` only for a plugin that declares json-clone@1.  Must run
   before any plugin code in the context. */
bool install_utils(v8::Local<v8::Context> ctx, bool json_clone);

}  // namespace v8host

#endif
