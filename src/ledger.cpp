/*
 * Ledger rows as llmgw_flush() takes them.
 */

#include <cstdio>
#include <cstdlib>

#include "internal.h"

using namespace llmgw;


namespace {

void
field(std::string &out, const char *name)
{
    out += out.size() > 1 ? ",\"" : "\"";
    out += name;
    out += "\":";
}

void
num(std::string &out, const char *name, int64_t v)
{
    char buf[24];

    field(out, name);
    out.append(buf, static_cast<size_t>(
                   std::snprintf(buf, sizeof(buf), "%lld", (long long) v)));
}

void
text(std::string &out, const char *name, std::string_view v)
{
    field(out, name);
    append_json_string(out, v);
}

} /* namespace */


/*
 * Written by hand rather than through a JSON tree: one row per request is
 * on the hot path.
 */
extern "C" llmgw_buf_t
llmgw_ledger_row_json(const llmgw_ledger_row_t *row)
{
    try {
        std::string out;
        char buf[32];

        out.reserve(512);
        out += "{";

        text(out, "request_id", row->request_id);
        text(out, "type", row->type);
        num(out, "user_id", row->user_id);
        num(out, "token_id", row->token_id);

        if (row->channel_id) {
            num(out, "channel_id", row->channel_id);
        } else {
            field(out, "channel_id");
            out += "null";
        }

        text(out, "model_name", sv(row->model));
        text(out, "upstream_model", sv(row->upstream_model));
        text(out, "endpoint", sv(row->endpoint));

        field(out, "channels_tried");
        out += "[";
        for (size_t i = 0; i < row->ntried; i++) {
            if (i) {
                out += ",";
            }
            out.append(buf, static_cast<size_t>(std::snprintf(
                           buf, sizeof(buf), "%lld",
                           (long long) row->tried[i])));
        }
        out += "]";

        num(out, "prompt_tokens", row->usage.prompt_tokens);
        num(out, "completion_tokens", row->usage.completion_tokens);
        num(out, "cache_read_tokens", row->usage.cache_read_tokens);
        num(out, "cache_creation_tokens", row->usage.cache_creation_tokens);
        num(out, "quota", row->quota);

        field(out, "is_stream");
        out += row->is_stream ? "true" : "false";

        num(out, "status", row->status);
        num(out, "latency_ms", row->latency_ms);

        /* milliseconds are all the ledger keeps */
        field(out, "created_at");
        out.append(buf, static_cast<size_t>(std::snprintf(
                       buf, sizeof(buf), "%.3f", row->created_at)));

        out += "}";

        return make_buf(out);

    } catch (...) {
        return llmgw_buf_t { nullptr, 0 };
    }
}


extern "C" int
llmgw_flush_answer(const char *json, size_t len, llmgw_balance_cb cb,
    void *arg)
{
    try {
        Json root = json_parse(json, len);

        if (!json_is_object(root.get())) {
            return -1;
        }

        const char *const kinds[] = { "tokens", "users" };

        for (int is_user = 0; is_user < 2; is_user++) {
            const char  *k;
            json_t      *v;

            json_object_foreach(json_object_get(root.get(), kinds[is_user]),
                                k, v)
            {
                if (json_is_integer(v)) {
                    cb(arg, is_user, std::strtoll(k, nullptr, 10),
                       json_integer_value(v));
                }
            }
        }

        return 0;

    } catch (...) {
        return -1;
    }
}
