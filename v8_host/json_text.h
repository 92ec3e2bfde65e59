/*
 * Building reply bodies as text.  Results and manifests arrive already
 * serialized (JSON.stringify in the isolate, the manifest validator), so
 * replies are assembled around them instead of being parsed again.
 */

#ifndef V8HOST_JSON_TEXT_H
#define V8HOST_JSON_TEXT_H

#include <string>
#include <string_view>

#include "llmgw.h"

namespace llmgw {
std::string_view utf8_prefix(std::string_view s, size_t max);
void append_json_string(std::string &out, std::string_view s);
}

namespace v8host {

/* The core's: appends s as a JSON string literal (bad UTF-8 → U+FFFD). */
using llmgw::append_json_string;

std::string json_string(std::string_view s);

/* The core's: the longest prefix of at most max bytes ending on a
   character. */
using llmgw::utf8_prefix;

/* A path segment: ".name" for identifier-like keys, "[\"odd key\"]"
   otherwise. */
std::string path_key(std::string_view key);

/* {"ok":false,"error":{"kind":..,"message":..}} */
std::string error_reply(std::string_view kind, std::string_view message);

/* The reply frame to req (header and body), for the supervisor and the
   workers alike. */
std::string reply_frame(const llmgw_frame_t &req, std::string_view body);

}  // namespace v8host

#endif
