/*
 * Helpers shared by the core's translation units (never by the glue).
 */

#ifndef LLMGW_INTERNAL_H
#define LLMGW_INTERNAL_H

#include <jansson.h>

#include <memory>
#include <string>
#include <string_view>
#include <cstdio>

#include "llmgw.h"

namespace llmgw {

struct JsonDeleter {
    void operator()(json_t *j) const { json_decref(j); }
};

/* An owning reference to a jansson value. */
using Json = std::unique_ptr<json_t, JsonDeleter>;

inline Json
json_parse(const char *data, size_t len)
{
    json_error_t err;
    return Json(json_loadb(data, len, JSON_ALLOW_NUL, &err));
}

inline std::string_view
sv(llmgw_str_t s)
{
    return std::string_view(s.data ? s.data : "", s.len);
}

inline llmgw_str_t
str(std::string_view s)
{
    return llmgw_str_t { s.data(), s.size() };
}

/* Copies s into a malloc'ed llmgw_buf_t (data NULL on allocation failure). */
llmgw_buf_t make_buf(std::string_view s);

/* Compact JSON text of a value. */
std::string json_dump(const json_t *j);

/* A string member or "" (never NULL). */
std::string_view json_str(const json_t *obj, const char *key);

/* An integer member (or a real one truncated) or dflt. */
int64_t json_int(const json_t *obj, const char *key, int64_t dflt);

double json_num(const json_t *obj, const char *key, double dflt);

/* Appends s as a JSON string literal; invalid UTF-8 becomes U+FFFD. */
void append_json_string(std::string &out, std::string_view s);

/* At most max bytes of s, never splitting a UTF-8 sequence. */
std::string_view utf8_prefix(std::string_view s, size_t max);

/* The parsed client body of a request (request.cpp). */
const json_t *req_json(const llmgw_req_t *r);
llmgw_endpoint_e req_endpoint(const llmgw_req_t *r);

} /* namespace llmgw */

#endif /* LLMGW_INTERNAL_H */
