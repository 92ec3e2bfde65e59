/*
 * Answers of the SQL admin dispatcher and configuration notices.
 */

#include <cstring>

#include "internal.h"
#include "jsonview.h"

using namespace llmgw;


namespace {

constexpr size_t kMessageMax = 480;

/*
 * A 405's message is "method M is not allowed on P (allowed: GET, POST)",
 * whose end the glue sends as the Allow header.  A cut keeps that end, so
 * a long method or path (the client's text) neither drops it nor takes its
 * place where the glue reads it.
 */
std::string
cut_message(std::string_view msg, int64_t status)
{
    static constexpr std::string_view kAllowed = " (allowed: ";
    static constexpr size_t kAllowedMax = 64;

    size_t at = status == 405 ? msg.rfind(kAllowed) : std::string_view::npos;

    if (at == std::string_view::npos || msg.size() - at > kAllowedMax
        || msg.back() != ')')
    {
        return std::string(utf8_prefix(msg, kMessageMax));
    }

    std::string_view end = msg.substr(at);

    return std::string(utf8_prefix(msg.substr(0, at),
                                   kMessageMax - end.size()))
           + std::string(end);
}


/* path without its trailing slashes, as llmgw_api() reads it ("/" stays) */
std::string_view
trim_slashes(std::string_view path)
{
    while (path.size() > 1 && path.back() == '/') {
        path.remove_suffix(1);
    }

    return path;
}


/* {key} of /plugin/task/{key}/icon, or "" (a key holds no slash) */
std::string_view
icon_key(std::string_view path)
{
    static constexpr std::string_view kDir = "/plugin/task/";
    static constexpr std::string_view kIcon = "/icon";

    if (path.size() <= kDir.size() + kIcon.size()
        || path.substr(0, kDir.size()) != kDir
        || path.substr(path.size() - kIcon.size()) != kIcon)
    {
        return {};
    }

    std::string_view key = path.substr(kDir.size(), path.size() - kDir.size()
                                                    - kIcon.size());

    return key.find('/') == std::string_view::npos ? key
                                                   : std::string_view();
}

/*
 * The query parameters of a call the gateway answers itself: force on an
 * upload (a marketplace install is one), none elsewhere.  As llmgw_api()
 * does for the database's calls, a parameter not taken is refused: a
 * misspelt ?forse=1 would otherwise be dropped.
 */
bool
query_known(llmgw_admin_route_e route, std::string_view args,
    llmgw_verdict_t *v)
{
    bool force = route == LLMGW_ADMIN_UPLOAD
                 || route == LLMGW_ADMIN_MARKETPLACE;

    while (!args.empty()) {
        size_t amp = args.find('&');
        std::string_view part = args.substr(0, amp);

        args = amp == std::string_view::npos ? std::string_view()
                                             : args.substr(amp + 1);

        size_t eq = part.find('=');
        std::string_view name = part.substr(0, eq);

        if (part.empty()) {
            continue;
        }

        /* read as the database reads it (1 or true forces), and as
           strictly as "force" in the body */
        if (force && name == "force") {
            std::string_view value = eq == std::string_view::npos
                                     ? std::string_view()
                                     : part.substr(eq + 1);

            if (value == "1" || value == "true" || value == "0"
                || value == "false")
            {
                continue;
            }

            llmgw_verdict_set(v, 400, "gateway_error", "invalid_request",
                              "force: must be true or false (1 or 0)");
            return false;
        }

        name = utf8_prefix(name, 64);
        llmgw_verdict_set(v, 400, "gateway_error", "invalid_request",
                          "%.*s: unknown query parameter (%s)",
                          (int) name.size(), name.data(),
                          force ? "known: force" : "this call takes none");
        return false;
    }

    return true;
}

}  // namespace


extern "C" int
llmgw_admin_answer(const char *json, size_t len, llmgw_buf_t *body,
    llmgw_verdict_t *v)
{
    body->data = nullptr;
    body->len = 0;

    try {
        JsonView root = JsonView::parse(std::string_view(json, len));
        int64_t status = root.get("status").integer(500);

        if (!root.is_object() || status < 100 || status > 599) {
            llmgw_verdict_set(v, 500, "gateway_error", "internal_error",
                              "the admin answer could not be read");
            return 500;
        }

        if (status < 300) {
            /* the database's own text: numbers as it wrote them (0.075,
               not a double's 0.074999999999999997) */
            JsonView b = root.get("body");
            *body = make_buf(b ? std::string(b.raw()) : std::string("{}"));
            v->status = 0;
            return static_cast<int>(status);
        }

        std::string scratch;
        std::string_view msg = root.get("message").text(scratch);
        std::string code = root.get("code").string();

        /* the verdict keeps a static code: map the known ones */
        static const char *const codes[] = {
            "invalid_request", "invalid_json", "not_found",
            "method_not_allowed", "conflict", "internal_error"
        };
        const char *c = "admin_error";

        for (const char *k : codes) {
            if (code == k) {
                c = k;
            }
        }

        std::string text = cut_message(msg, status);
        llmgw_verdict_set(v, static_cast<int>(status), "gateway_error", c,
                          "%.*s", (int) text.size(), text.data());
        return static_cast<int>(status);

    } catch (...) {
        llmgw_verdict_set(v, 500, "gateway_error", "internal_error",
                          "the admin answer could not be read");
        return 500;
    }
}


extern "C" int
llmgw_admin_check(llmgw_admin_route_e route, llmgw_str_t path,
    llmgw_str_t args, llmgw_str_t body, int object, llmgw_verdict_t *v)
{
    if (!utf8_valid(sv(path)) || !utf8_valid(sv(args))) {
        llmgw_verdict_set(v, 400, "gateway_error", "invalid_request",
                          "the URL is not valid UTF-8");
        return -1;
    }

    if (route != LLMGW_ADMIN_DATABASE && !query_known(route, sv(args), v)) {
        return -1;
    }

    std::string_view text = sv(body);

    if (!object || text.find_first_not_of(" \t\r\n") == std::string::npos) {
        return 0;
    }

    /* integers beyond int64 are read as reals, so only what no double can
       hold is refused as a number: the gateway must be able to read back
       everything the database stores */
    json_error_t err;
    Json root(json_loadb(text.data(), text.size(), JSON_DECODE_INT_AS_REAL,
                         &err));

    if (!root) {
        llmgw_verdict_set(v, 400, "gateway_error", "invalid_json",
                          "request body is not valid JSON: %s (byte %d)",
                          err.text, err.position);
        return -1;
    }

    if (!json_is_object(root.get())) {
        llmgw_verdict_set(v, 400, "gateway_error", "invalid_json",
                          "request body must be a JSON object");
        return -1;
    }

    return 0;
}


extern "C" llmgw_admin_route_e
llmgw_admin_route(llmgw_str_t method, llmgw_str_t path, llmgw_str_t *key,
    llmgw_verdict_t *v)
{
    std::string_view m = sv(method);
    std::string_view p = trim_slashes(sv(path));
    std::string_view k = icon_key(p);
    llmgw_admin_route_e get;

    *key = llmgw_str_t { nullptr, 0 };

    if (m == "POST") {
        if (p == "/plugin/task") {
            return LLMGW_ADMIN_UPLOAD;
        }
        if (p == "/plugin/task/marketplace") {
            return LLMGW_ADMIN_MARKETPLACE;
        }
        if (p == "/plugin/task/dryrun") {
            return LLMGW_ADMIN_DRYRUN;
        }
    }

    if (p == "/plugin/task/runtime/status") {
        get = LLMGW_ADMIN_STATUS;

    } else if (!k.empty()) {
        get = LLMGW_ADMIN_ICON;

    } else {
        return LLMGW_ADMIN_DATABASE;
    }

    if (m == "GET") {
        *key = str(k);
        return get;
    }

    /* only the gateway answers these paths: the database knows no
       methods for them */
    std::string text = cut_message("method " + std::string(m)
                                   + " is not allowed on /api" + std::string(p)
                                   + " (allowed: GET)", 405);

    llmgw_verdict_set(v, 405, "gateway_error", "method_not_allowed", "%.*s",
                      (int) text.size(), text.data());
    return LLMGW_ADMIN_REFUSED;
}


extern "C" int
llmgw_notice_parse(const char *json, size_t len, llmgw_notice_t *n)
{
    std::memset(n, 0, sizeof(*n));

    try {
        Json root = json_parse(json, len);

        if (!json_is_object(root.get())) {
            return -1;
        }

        n->rev = json_int(root.get(), "rev", 0);
        n->id = json_int(root.get(), "id", 0);

        std::string_view kind = json_str(root.get(), "kind");
        std::snprintf(n->kind, sizeof(n->kind), "%.*s",
                      (int) kind.size(), kind.data());
        return 0;

    } catch (...) {
        return -1;
    }
}
