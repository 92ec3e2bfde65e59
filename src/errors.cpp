/*
 * The error contract: every refusal, ours or the upstream's, reaches the
 * client as {"error":{"message":..,"type":..,"code":..}} with the request id
 * at the end of the message, so a user can quote it when reporting.
 */

#include <cstdio>
#include <string>
#include <string_view>

#include "internal.h"
#include "convert.h"

namespace {

using llmgw::Json;
using llmgw::json_str;

/* Raw upstream text is cut here so a huge HTML error page stays readable. */
constexpr size_t kRawMessageMax = 512;

/*
 * jansson refuses strings that are not UTF-8; upstream bodies and request
 * ids are not guaranteed to be, and an error must never fail to render.
 */
std::string
valid_utf8(std::string_view s)
{
    std::string out;
    const auto *p = reinterpret_cast<const unsigned char *>(s.data());
    size_t i = 0;

    out.reserve(s.size());

    while (i < s.size()) {
        i += llmgw::append_utf8_char(out, p + i, s.size() - i);
    }

    return out;
}





json_t *
json_text(std::string_view s)
{
    std::string v = valid_utf8(s);
    return json_stringn(v.data(), v.size());
}


llmgw_buf_t
render_error(std::string_view message, std::string_view type,
    std::string_view code, std::string_view request_id)
{
    std::string text(message);

    text += " (request id: ";
    text += request_id;
    text += ")";

    Json inner(json_object());
    Json root(json_object());

    if (!inner || !root
        || json_object_set_new(inner.get(), "message", json_text(text)) != 0
        || json_object_set_new(inner.get(), "type", json_text(type)) != 0
        || json_object_set_new(inner.get(), "code", json_text(code)) != 0
        || json_object_set(root.get(), "error", inner.get()) != 0)
    {
        return { nullptr, 0 };
    }

    std::string out = llmgw::json_dump(root.get());

    if (out.empty()) {
        return { nullptr, 0 };
    }

    return llmgw::make_buf(out);
}


/*
 * Where the common vendors put their message (OpenAI and Anthropic
 * error.message, some proxies message or error, FastAPI detail).  json_str()
 * gives "" for a missing member, and an empty message explains nothing, so
 * both fall through to the next place.  Vendors quote the key they were
 * given ("Incorrect API key provided: ..."): it goes before the raw text is
 * cut, or a key across the cut would leave its prefix.
 */
std::string
upstream_message(const json_t *root, std::string_view raw, int status,
    std::string_view credential)
{
    const json_t *err = json_object_get(root, "error");
    std::string_view m = json_str(err, "message");

    if (m.empty()) {
        m = json_str(root, "message");
    }

    if (m.empty()) {
        m = json_str(root, "error");
    }

    if (m.empty()) {
        m = json_str(root, "detail");
    }

    if (!m.empty()) {
        return llmgw::redact(m, credential);
    }

    std::string text = llmgw::redact(llmgw::trim(raw, " \t\r\n\f\v"), credential);
    m = llmgw::utf8_prefix(text, kRawMessageMax);

    if (m.empty()) {
        return "upstream returned HTTP " + std::to_string(status);
    }

    return std::string(m);
}


/* Vendors send codes as strings ("rate_limit_exceeded") or numbers (429). */
std::string
code_text(const json_t *obj, const char *key)
{
    const json_t *v = json_object_get(obj, key);
    char num[64];

    if (json_is_string(v)) {
        return std::string(json_string_value(v), json_string_length(v));
    }

    if (json_is_integer(v)) {
        std::snprintf(num, sizeof(num), "%" JSON_INTEGER_FORMAT,
                      json_integer_value(v));
        return num;
    }

    if (json_is_real(v)) {
        std::snprintf(num, sizeof(num), "%.15g", json_real_value(v));
        return num;
    }

    return {};
}


std::string
upstream_code(const json_t *root, std::string_view credential)
{
    const json_t *err = json_object_get(root, "error");
    std::string code = code_text(err, "code");

    if (code.empty()) {
        code = code_text(root, "code");
    }

    if (code.empty()) {
        code = std::string(json_str(err, "type"));
    }

    if (code.empty()) {
        code = "bad_response_status_code";
    }

    return llmgw::redact(code, credential);
}


/* An upstream error body read for the client, the try's credential out. */
struct UpstreamError {
    Json         root;
    std::string  message;
    std::string  code;

    UpstreamError(int status, const char *body, size_t len,
        llmgw_str_t credential)
    {
        std::string_view raw(body ? body : "", body ? len : 0);
        std::string_view cred = llmgw::sv(credential);

        if (raw.size() >= LLMGW_ERROR_BODY_MAX) {
            raw = llmgw::without_cut_credential(raw, cred);
        }

        /* json_object_get() of a non-object is NULL: no special case */
        root = llmgw::json_parse(raw.data(), raw.size());
        message = upstream_message(root.get(), raw, status, cred);
        code = upstream_code(root.get(), cred);
    }

    /* The message as the client reads it: ending with the request id. */
    std::string message_with(llmgw_str_t request_id) const
    {
        return message + " (request id: " + std::string(llmgw::sv(request_id))
               + ")";
    }
};

/* Google's canonical status name for an HTTP status. */
const char *
google_status(int status)
{
    switch (status) {
    case 400: return "INVALID_ARGUMENT";
    case 401: return "UNAUTHENTICATED";
    case 403: return "PERMISSION_DENIED";
    case 404: return "NOT_FOUND";
    case 409: return "ABORTED";
    case 429: return "RESOURCE_EXHAUSTED";
    case 499: return "CANCELLED";
    case 500: return "INTERNAL";
    case 501: return "UNIMPLEMENTED";
    case 503: return "UNAVAILABLE";
    case 504: return "DEADLINE_EXCEEDED";
    default:  return status >= 500 ? "INTERNAL" : "FAILED_PRECONDITION";
    }
}


/*
 * An upstream error for a Gemini client, in Gemini's own shape: the HTTP
 * status as the number "code", Google's "status" name (the upstream's own,
 * else the one of the HTTP status), the message with the request id, and
 * "type": "upstream_error" as in the contract.
 */
llmgw_buf_t
gemini_error(int status, const char *body, size_t len,
    llmgw_str_t credential, llmgw_str_t request_id)
{
    try {
        UpstreamError e(status, body, len, credential);
        std::string message = e.message_with(request_id);

        std::string_view own = llmgw::json_str(
            json_object_get(e.root.get(), "error"), "status");
        std::string name = google_status(status);

        if (!own.empty() && own.size() < 64
            && own.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZ_")
               == std::string_view::npos)
        {
            name = std::string(own);
        }

        llmgw::Json root(json_object());
        json_t *inner = json_object();
        std::string text = valid_utf8(message);

        json_object_set_new(inner, "code", json_integer(status));
        json_object_set_new(inner, "message",
                            json_stringn(text.data(), text.size()));
        json_object_set_new(inner, "status", json_string(name.c_str()));
        json_object_set_new(inner, "type", json_string("upstream_error"));
        json_object_set_new(root.get(), "error", inner);

        return llmgw::make_buf(llmgw::json_dump(root.get()));

    } catch (...) {
        return { nullptr, 0 };
    }
}

} // namespace


extern "C" llmgw_buf_t
llmgw_error_json(llmgw_str_t message, llmgw_str_t type, llmgw_str_t code,
    llmgw_str_t request_id)
{
    try {
        return render_error(llmgw::sv(message), llmgw::sv(type),
                            llmgw::sv(code), llmgw::sv(request_id));

    } catch (...) {
        return { nullptr, 0 };
    }
}


extern "C" llmgw_buf_t
llmgw_upstream_error_json(int status, const char *body, size_t len,
    llmgw_str_t credential, llmgw_str_t request_id)
{
    try {
        UpstreamError e(status, body, len, credential);

        return render_error(e.message, "upstream_error", e.code,
                            llmgw::sv(request_id));

    } catch (...) {
        return { nullptr, 0 };
    }
}


extern "C" llmgw_buf_t
llmgw_upstream_error_for(int client_ep, int status, const char *body,
    size_t len, llmgw_str_t credential, llmgw_str_t request_id)
{
    if (client_ep == LLMGW_EP_GEMINI) {
        return gemini_error(status, body, len, credential, request_id);
    }

    if (client_ep != LLMGW_EP_MESSAGES) {
        return llmgw_upstream_error_json(status, body, len, credential,
                                         request_id);
    }

    try {
        UpstreamError e(status, body, len, credential);
        std::string message = e.message_with(request_id);

        /* an Anthropic upstream's own error type (overloaded_error, ...)
           is kept: that format's own style */
        std::string type = "upstream_error";
        const json_t *err = json_object_get(e.root.get(), "error");
        std::string_view own = llmgw::json_str(err, "type");

        if (llmgw::json_str(e.root.get(), "type") == "error"
            && own.size() > 6 && own.size() < 64
            && own.substr(own.size() - 6) == "_error"
            && own.find_first_not_of("abcdefghijklmnopqrstuvwxyz_")
               == std::string_view::npos)
        {
            type = llmgw::redact(own, llmgw::sv(credential));
        }

        return llmgw::make_buf(llmgw::convert_error(
            LLMGW_EP_MESSAGES, status, valid_utf8(message), type, e.code));

    } catch (...) {
        return { nullptr, 0 };
    }
}
