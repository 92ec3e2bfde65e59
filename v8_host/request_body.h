/*
 * Reading LOAD and CALL bodies.  A small strict JSON reader instead of a
 * general parser: the envelope fields are decoded, and CALL's "args" is
 * only delimited and handed to V8's JSON.parse as text, so arguments are
 * parsed once, by V8, in the plugin's context (no tree built and
 * re-encoded on the way).
 */

#ifndef V8HOST_REQUEST_BODY_H
#define V8HOST_REQUEST_BODY_H

#include <string>
#include <string_view>

#include "runtime.h"

namespace v8host {

/* {"source": string}.  false with a reason in err. */
bool read_load_body(std::string_view body, std::string *source,
    std::string *err);

/* {"sha" | "source", "hook", "args"?, "deadline_ms"?, "capabilities"?}.
   Other members are ignored. */
bool read_call_body(std::string_view body, CallRequest *req,
    std::string *err);

}  // namespace v8host

#endif
