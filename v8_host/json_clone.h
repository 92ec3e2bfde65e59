/*
 * utils.json.clone (capability json-clone@1): an independent, mutable
 * copy of a JSON value.  Plain objects, arrays, null, booleans, finite
 * numbers and strings only; `__proto__` stays an ordinary own key.
 * Limits: 32 levels below the root, 32,768 nodes, 1 MiB encoded.
 */

#ifndef V8HOST_JSON_CLONE_H
#define V8HOST_JSON_CLONE_H

#include <cstddef>

#include <v8.h>

namespace v8host {

constexpr int    kCloneMaxDepth = 32;
constexpr size_t kCloneMaxNodes = 32768;
constexpr size_t kCloneMaxBytes = 1048576;

/* The utils.json.clone callback.  Its data is an array holding the
   context's pristine Object.prototype and Array.prototype. */
void json_clone_callback(const v8::FunctionCallbackInfo<v8::Value> &info);

}  // namespace v8host

#endif
