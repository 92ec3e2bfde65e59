/*
 * JSON text helpers for replies.
 */

#include <cstdint>
#include <cstdio>

#include "json_text.h"

namespace v8host {

std::string
json_string(std::string_view s)
{
    std::string out;
    append_json_string(out, s);
    return out;
}

std::string
error_reply(std::string_view kind, std::string_view message)
{
    std::string out = "{\"ok\":false,\"error\":{\"kind\":";
    append_json_string(out, kind);
    out += ",\"message\":";
    append_json_string(out, message);
    out += "}}";
    return out;
}

std::string
path_key(std::string_view key)
{
    bool ident = !key.empty() && !(key[0] >= '0' && key[0] <= '9');

    for (char c : key) {
        ident = ident && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
                          || (c >= '0' && c <= '9') || c == '_' || c == '$');
    }

    return ident ? "." + std::string(key) : "[" + json_string(key) + "]";
}

std::string
reply_frame(const llmgw_frame_t &req, std::string_view body)
{
    llmgw_frame_t rf { LLMGW_FRAME_VERSION,
                       static_cast<uint8_t>(LLMGW_FRAME_REPLY | req.type),
                       req.request_id, static_cast<uint32_t>(body.size()) };
    uint8_t hdr[LLMGW_FRAME_HEADER_LEN];
    llmgw_frame_encode(&rf, hdr);

    std::string out(reinterpret_cast<char *>(hdr), sizeof(hdr));
    out += body;
    return out;
}

}  // namespace v8host
