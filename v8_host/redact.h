/*
 * Plugin error messages reach API clients and logs: they are cut to 2 KiB
 * and anything that looks like a credential is replaced by "[redacted]".
 */

#ifndef V8HOST_REDACT_H
#define V8HOST_REDACT_H

#include <string>
#include <string_view>

namespace v8host {

constexpr size_t kMaxPluginMessage = 2048;

/* Bearer tokens, sk-... keys, AWS access key ids, long key-like runs of
   letters and digits, and the values of secret-named fields. */
std::string redact_secrets(std::string_view s);

/* redact_secrets, then at most kMaxPluginMessage bytes of UTF-8. */
std::string clean_plugin_message(std::string_view raw);

}  // namespace v8host

#endif
