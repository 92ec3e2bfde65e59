/*
 * Ledger rows as llmgw_flush() takes them.
 */

#include <cstdlib>

#include "internal.h"

using namespace llmgw;


extern "C" llmgw_buf_t
llmgw_ledger_row_json(const llmgw_ledger_row_t *row)
{
    try {
        Json j(json_object());
        json_t *o = j.get();
        json_t *tried = json_array();

        for (size_t i = 0; i < row->ntried; i++) {
            json_array_append_new(tried, json_integer(row->tried[i]));
        }

        json_object_set_new(o, "request_id", json_string(row->request_id));
        json_object_set_new(o, "type", json_string(row->type));
        json_object_set_new(o, "user_id", json_integer(row->user_id));
        json_object_set_new(o, "token_id", json_integer(row->token_id));
        json_object_set_new(o, "channel_id",
                            row->channel_id ? json_integer(row->channel_id)
                                            : json_null());
        json_object_set_new(o, "model_name",
                            json_stringn(row->model.data, row->model.len));
        json_object_set_new(o, "upstream_model",
                            json_stringn(row->upstream_model.data,
                                         row->upstream_model.len));
        json_object_set_new(o, "endpoint",
                            json_stringn(row->endpoint.data,
                                         row->endpoint.len));
        json_object_set_new(o, "channels_tried", tried);
        json_object_set_new(o, "prompt_tokens",
                            json_integer(row->usage.prompt_tokens));
        json_object_set_new(o, "completion_tokens",
                            json_integer(row->usage.completion_tokens));
        json_object_set_new(o, "cache_read_tokens",
                            json_integer(row->usage.cache_read_tokens));
        json_object_set_new(o, "cache_creation_tokens",
                            json_integer(row->usage.cache_creation_tokens));
        json_object_set_new(o, "quota", json_integer(row->quota));
        json_object_set_new(o, "is_stream", json_boolean(row->is_stream));
        json_object_set_new(o, "status", json_integer(row->status));
        json_object_set_new(o, "latency_ms", json_integer(row->latency_ms));
        json_object_set_new(o, "created_at", json_real(row->created_at));

        return make_buf(json_dump(o));

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
