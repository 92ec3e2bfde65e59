/*
 * JSON text helpers for replies.
 */

#include <cstdint>
#include <cstdio>

#include "json_text.h"

namespace v8host {

/* Length of the valid UTF-8 sequence at p (1..4), or 0 when invalid. */
static size_t
utf8_seq(const unsigned char *p, size_t avail)
{
    unsigned char c = p[0];
    size_t n;
    uint32_t cp;

    if (c < 0x80) {
        return 1;
    }

    if (c >= 0xc2 && c <= 0xdf) {
        n = 2; cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
        n = 3; cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4; cp = c & 0x07;
    } else {
        return 0;
    }

    if (avail < n) {
        return 0;
    }

    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xc0) != 0x80) {
            return 0;
        }
        cp = (cp << 6) | (p[i] & 0x3f);
    }

    if ((n == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff)))
        || (n == 4 && (cp < 0x10000 || cp > 0x10ffff)))
    {
        return 0;
    }

    return n;
}

void
append_json_string(std::string &out, std::string_view s)
{
    const unsigned char *p = reinterpret_cast<const unsigned char *>(s.data());
    size_t len = s.size();

    out.push_back('"');

    for (size_t i = 0; i < len; ) {
        unsigned char c = p[i];

        if (c == '"' || c == '\\') {
            out.push_back('\\');
            out.push_back(static_cast<char>(c));
            i++;
        } else if (c < 0x20) {
            char esc[8];
            switch (c) {
            case '\n': out += "\\n"; break;
            case '\r': out += "\\r"; break;
            case '\t': out += "\\t"; break;
            default:
                std::snprintf(esc, sizeof(esc), "\\u%04x", c);
                out += esc;
            }
            i++;
        } else if (c < 0x80) {
            out.push_back(static_cast<char>(c));
            i++;
        } else {
            size_t n = utf8_seq(p + i, len - i);
            if (n == 0) {
                out += "\xef\xbf\xbd";
                i++;
            } else {
                out.append(s.data() + i, n);
                i += n;
            }
        }
    }

    out.push_back('"');
}

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

}  // namespace v8host
