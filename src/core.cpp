/*
 * Small pieces every part of the core uses: owned buffers, verdicts and
 * JSON accessors.
 */

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "internal.h"

namespace llmgw {

llmgw_buf_t
make_buf(std::string_view s)
{
    llmgw_buf_t b { static_cast<char *>(std::malloc(s.size() + 1)), 0 };

    if (b.data != nullptr) {
        std::memcpy(b.data, s.data(), s.size());
        b.data[s.size()] = '\0';
        b.len = s.size();
    }

    return b;
}

std::string
json_dump(const json_t *j)
{
    size_t n = json_dumpb(j, nullptr, 0, JSON_COMPACT);
    std::string out(n, '\0');

    if (n > 0) {
        json_dumpb(j, out.data(), n, JSON_COMPACT);
    }

    return out;
}

std::string_view
json_str(const json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);

    if (!json_is_string(v)) {
        return {};
    }

    return std::string_view(json_string_value(v), json_string_length(v));
}

int64_t
json_int(const json_t *obj, const char *key, int64_t dflt)
{
    json_t *v = json_object_get(obj, key);

    if (json_is_integer(v)) {
        return json_integer_value(v);
    }

    if (json_is_real(v)) {
        return static_cast<int64_t>(json_real_value(v));
    }

    return dflt;
}

double
json_num(const json_t *obj, const char *key, double dflt)
{
    json_t *v = json_object_get(obj, key);

    return json_is_number(v) ? json_number_value(v) : dflt;
}

std::string_view
utf8_prefix(std::string_view s, size_t max)
{
    if (s.size() <= max) {
        return s;
    }

    size_t n = max;

    /* step back over continuation bytes to the start of a character */
    while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xc0) == 0x80) {
        n--;
    }

    return s.substr(0, n);
}

} /* namespace llmgw */


extern "C" void
llmgw_buf_free(llmgw_buf_t *b)
{
    if (b != nullptr) {
        std::free(b->data);
        b->data = nullptr;
        b->len = 0;
    }
}


extern "C" void
llmgw_verdict_set(llmgw_verdict_t *v, int status, const char *type,
    const char *code, const char *fmt, ...)
{
    va_list  ap;

    v->status = status;
    v->type = type;
    v->code = code;

    va_start(ap, fmt);
    std::vsnprintf(v->message, sizeof(v->message), fmt, ap);
    va_end(ap);
}
