/*
 * The admin side of plugins: what the gateway sends v8_host to validate or
 * dry-run a source, and what it stores from the answer.
 */

#include <algorithm>
#include <cstring>
#include <string>

#include "internal.h"
#include "jsonview.h"

using namespace llmgw;

namespace {

/* Validation errors reach the caller whole, but within a readable size. */
constexpr size_t kMaxMessage = 480;

std::string
joined_errors(const json_t *errors)
{
    std::string out;
    size_t      i;
    json_t     *e;

    json_array_foreach(errors, i, e) {
        if (!json_is_string(e)) {
            continue;
        }
        if (!out.empty()) {
            out += "; ";
        }
        out.append(json_string_value(e), json_string_length(e));
    }

    return out;
}

} /* namespace */


bool
llmgw::plugin_admin_members(const json_t *root,
    std::initializer_list<const char *> known, llmgw_verdict_t *v)
{
    const char *key;
    json_t     *x;
    std::string first;

    json_object_foreach(const_cast<json_t *>(root), key, x) {
        bool ok = std::any_of(known.begin(), known.end(),
                              [key](const char *k) {
                                  return std::strcmp(k, key) == 0;
                              });
        if (!ok && (first.empty() || first > key)) {
            first = key;
        }
    }

    if (!first.empty()) {
        std::string list;
        for (const char *k : known) {
            list += list.empty() ? "" : ", ";
            list += k;
        }
        llmgw_verdict_set(v, 400, "gateway_error", "invalid_request",
                          "%.64s: unknown field (known: %s)", first.c_str(),
                          list.c_str());
        return false;
    }

    for (const char *k : { "enabled", "force" }) {
        x = json_object_get(root, k);
        if (x != nullptr && !json_is_boolean(x)) {
            llmgw_verdict_set(v, 400, "gateway_error", "invalid_request",
                              "%s: must be true or false", k);
            return false;
        }
    }

    x = json_object_get(root, "remark");
    if (x != nullptr && !json_is_string(x)) {
        llmgw_verdict_set(v, 400, "gateway_error", "invalid_request",
                          "remark: must be a string");
        return false;
    }

    return true;
}


extern "C" int
llmgw_plugin_load_request(const char *body, size_t len, int upload,
    llmgw_buf_t *frame, llmgw_verdict_t *v)
{
    try {
        Json root = json_parse(body, len);

        if (!json_is_object(root.get())) {
            llmgw_verdict_set(v, 400, "gateway_error", "invalid_json",
                              "invalid JSON request body");
            return -1;
        }

        if (upload
            && !plugin_admin_members(root.get(), { "source", "remark",
                                                   "enabled", "force" },
                                     v))
        {
            return -1;
        }

        json_t *src = json_object_get(root.get(), "source");

        if (!json_is_string(src) || json_string_length(src) == 0) {
            llmgw_verdict_set(v, 400, "gateway_error", "invalid_request",
                              "field source is required (the plugin's ES "
                              "module text)");
            return -1;
        }

        Json out(json_object());
        json_object_set(out.get(), "source", src);
        *frame = make_buf(json_dump(out.get()));

        return frame->data ? 0 : -1;

    } catch (...) {
        llmgw_verdict_set(v, 500, "gateway_error", "internal_error",
                          "the request could not be read");
        return -1;
    }
}


extern "C" int
llmgw_plugin_source_request(const char *source, size_t len,
    llmgw_buf_t *frame, llmgw_verdict_t *v)
{
    try {
        Json out(json_object());

        json_object_set_new(out.get(), "source", json_stringn(source, len));
        *frame = make_buf(json_dump(out.get()));

        return frame->data ? 0 : -1;

    } catch (...) {
        llmgw_verdict_set(v, 500, "gateway_error", "internal_error",
                          "the source could not be sent");
        return -1;
    }
}


extern "C" int
llmgw_plugin_load_reply(const char *reply, size_t len, char sha[65],
    llmgw_verdict_t *v)
{
    try {
        Json root = json_parse(reply, len);

        if (json_is_true(json_object_get(root.get(), "ok"))) {
            std::string_view s = json_str(root.get(), "sha");

            if (s.size() == 64) {
                std::memcpy(sha, s.data(), 64);
                sha[64] = '\0';
                return 0;
            }
        }

        const json_t *err = json_object_get(root.get(), "error");
        std::string_view kind = json_str(err, "kind");
        std::string msg = joined_errors(json_object_get(err, "errors"));

        if (msg.empty()) {
            msg = json_str(err, "message");
        }

        /* a source that loops or bloats at load is its author's fault */
        if (kind == "plugin" || kind == "timeout" || kind == "memory") {
            llmgw_verdict_set(v, 400, "gateway_error", "invalid_plugin",
                              "the plugin was refused: %.*s",
                              (int) std::min(msg.size(), kMaxMessage),
                              msg.data());
        } else {
            llmgw_verdict_set(v, 502, "gateway_error", "plugin_runtime_error",
                              "the plugin runtime failed: %.*s",
                              (int) std::min(msg.size(), kMaxMessage),
                              msg.data());
        }

        return -1;

    } catch (...) {
        llmgw_verdict_set(v, 502, "gateway_error", "plugin_runtime_error",
                          "the plugin runtime answered something unreadable");
        return -1;
    }
}


extern "C" llmgw_buf_t
llmgw_plugin_upload_arg(const char *body, size_t blen, const char *reply,
    size_t rlen, llmgw_str_t query)
{
    try {
        Json b = json_parse(body, blen);
        Json r = json_parse(reply, rlen);
        Json out(json_object());

        /* The stored manifest also lists the exports, so that the task
         * engine knows which optional hooks a plugin has. */
        Json manifest(json_deep_copy(json_object_get(r.get(), "manifest")));

        if (json_is_object(manifest.get())) {
            json_t *ex = json_object_get(r.get(), "exports");
            json_object_set_new(manifest.get(), "exports",
                                json_is_array(ex) ? json_incref(ex)
                                                  : json_array());
        }

        json_object_set(out.get(), "manifest", manifest.get());
        json_object_set(out.get(), "sha", json_object_get(r.get(), "sha"));
        json_object_set(out.get(), "source",
                        json_object_get(b.get(), "source"));

        for (const char *k : { "remark", "enabled", "force" }) {
            json_t *x = json_object_get(b.get(), k);
            if (x != nullptr) {
                json_object_set(out.get(), k, x);
            }
        }

        /* read by the database as it reads the query of PATCH and
           activate; a query that is not UTF-8 says nothing */
        if (query.len > 0) {
            json_t *q = json_stringn(query.data, query.len);
            if (q != nullptr) {
                json_object_set_new(out.get(), "query", q);
            }
        }

        return make_buf(json_dump(out.get()));

    } catch (...) {
        return llmgw_buf_t { nullptr, 0 };
    }
}


extern "C" int64_t
llmgw_plugin_call_deadline(int64_t wait_ms)
{
    /* the runtime's watchdog ends a worker 2 s after a deadline its hook
       ignored; the rest is for a queue and the frames' way */
    constexpr int64_t kMargin = 2500;
    constexpr int64_t kMaxDeadline = 600000;   /* --deadline-ms at most */

    int64_t d = std::max(wait_ms - kMargin, wait_ms / 2);

    return std::min(std::max<int64_t>(d, 1), kMaxDeadline);
}


extern "C" llmgw_buf_t
llmgw_plugin_call_body(const char *sha, const char *hook, const char *args,
    size_t args_len)
{
    try {
        Json a = json_parse(args, args_len);
        Json out(json_object());

        json_object_set_new(out.get(), "sha", json_string(sha));
        json_object_set_new(out.get(), "hook", json_string(hook));
        json_object_set(out.get(), "args",
                        json_is_array(a.get()) ? a.get() : json_array());

        return make_buf(json_dump(out.get()));

    } catch (...) {
        return llmgw_buf_t { nullptr, 0 };
    }
}


extern "C" int
llmgw_plugin_call_request(const char *body, size_t len, const char *sha,
    llmgw_buf_t *frame, llmgw_verdict_t *v)
{
    try {
        /* the hook and its arguments go on as the caller wrote them */
        JsonView root = JsonView::parse(std::string_view(body, len));
        JsonView hook = root.get("hook");
        JsonView args = root.get("args");

        /* the body is the caller's: what is not one object is theirs */
        if (!root.is_object()) {
            llmgw_verdict_set(v, 400, "gateway_error", "invalid_json",
                              root ? "request body must be a JSON object"
                                   : "invalid JSON request body");
            return -1;
        }

        if (!hook.is_string() || hook.string_length() == 0) {
            llmgw_verdict_set(v, 400, "gateway_error", "invalid_request",
                              "field hook is required (for example "
                              "\"buildSubmitRequest\" or \"native.decode\")");
            return -1;
        }

        if (args && !args.is_array()) {
            llmgw_verdict_set(v, 400, "gateway_error", "invalid_request",
                              "args: must be an array of the hook's "
                              "arguments");
            return -1;
        }

        std::string out;
        out.reserve(len + 96);
        out += "{\"sha\":";
        append_json_string(out, sha);
        out += ",\"hook\":";
        out += hook.raw();
        out += ",\"args\":";
        out += args ? args.raw() : std::string_view("[]");
        out += '}';

        *frame = make_buf(out);
        return frame->data ? 0 : -1;

    } catch (...) {
        llmgw_verdict_set(v, 500, "gateway_error", "internal_error",
                          "the request could not be read");
        return -1;
    }
}


extern "C" int
llmgw_plugin_body_key(const char *body, size_t len, char *key, size_t keylen,
    llmgw_verdict_t *v)
{
    try {
        JsonView root = JsonView::parse(std::string_view(body, len));
        JsonView k = root.get("key");

        /* a source makes it a source's dry run, whatever the key */
        if (!k || root.get("source")) {
            return 1;
        }

        if (!k.is_string()) {
            llmgw_verdict_set(v, 400, "gateway_error", "invalid_request",
                              "key must be a string (the key of an enabled "
                              "plugin)");
            return -1;
        }

        std::string scratch;
        std::string_view s = k.text(scratch);

        /* longer than any plugin's key: found nowhere, as "" is not */
        if (s.size() >= keylen) {
            s = std::string_view();
        }

        std::memcpy(key, s.data(), s.size());
        key[s.size()] = '\0';
        return 0;

    } catch (...) {
        return 1;
    }
}


extern "C" int
llmgw_plugin_not_loaded(const char *reply, size_t len)
{
    static constexpr std::string_view kind = "not_loaded";

    /* nearly every reply is a result: no need to read it */
    if (std::string_view(reply, len).find(kind) == std::string_view::npos) {
        return 0;
    }

    try {
        JsonView root = JsonView::parse(std::string_view(reply, len));

        return root.get("error").get("kind").string_equals(kind);

    } catch (...) {
        return 0;
    }
}


extern "C" llmgw_buf_t
llmgw_plugin_dryrun_body(const char *body, size_t len)
{
    try {
        Json root = json_parse(body, len);
        Json out(json_object());

        for (const char *k : { "source", "hook", "args" }) {
            json_t *x = json_object_get(root.get(), k);
            if (x != nullptr) {
                json_object_set(out.get(), k, x);
            }
        }

        if (json_object_get(out.get(), "args") == nullptr) {
            json_object_set_new(out.get(), "args", json_array());
        }

        return make_buf(json_dump(out.get()));

    } catch (...) {
        return llmgw_buf_t { nullptr, 0 };
    }
}


extern "C" llmgw_buf_t
llmgw_plugin_status_json(const char *helper, size_t hlen, const char *node,
    size_t nlen)
{
    try {
        Json h = json_parse(helper, hlen);
        Json n = node ? json_parse(node, nlen) : Json();
        Json out(json_object());

        json_object_set(out.get(), "helper", h ? h.get() : json_null());
        json_object_set(out.get(), "node", n ? n.get() : json_null());

        return make_buf(json_dump(out.get()));

    } catch (...) {
        return llmgw_buf_t { nullptr, 0 };
    }
}
