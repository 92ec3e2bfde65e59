/*
 * Answers of the SQL admin dispatcher and configuration notices.
 */

#include <cstring>

#include "internal.h"

using namespace llmgw;


extern "C" int
llmgw_admin_answer(const char *json, size_t len, llmgw_buf_t *body,
    llmgw_verdict_t *v)
{
    body->data = nullptr;
    body->len = 0;

    try {
        Json root = json_parse(json, len);
        int status = static_cast<int>(json_int(root.get(), "status", 500));

        if (!json_is_object(root.get()) || status < 100 || status > 599) {
            llmgw_verdict_set(v, 500, "gateway_error", "internal_error",
                              "the admin answer could not be read");
            return 500;
        }

        if (status < 300) {
            json_t *b = json_object_get(root.get(), "body");
            *body = make_buf(b ? json_dump(b) : std::string("{}"));
            v->status = 0;
            return status;
        }

        std::string_view msg = json_str(root.get(), "message");
        std::string_view code = json_str(root.get(), "code");

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

        llmgw_verdict_set(v, status, "gateway_error", c, "%.*s",
                          (int) (msg.size() > 480 ? 480 : msg.size()),
                          msg.data());
        return status;

    } catch (...) {
        llmgw_verdict_set(v, 500, "gateway_error", "internal_error",
                          "the admin answer could not be read");
        return 500;
    }
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
