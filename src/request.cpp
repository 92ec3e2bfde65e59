/*
 * Client request bodies: parsed once, validated per endpoint, and rewritten
 * for the channel that serves them.
 */

#include <string>

#include "internal.h"
#include "convert.h"
#include "jsonview.h"

using namespace llmgw;

struct llmgw_req_s {
    llmgw_endpoint_e  ep = LLMGW_EP_NONE;
    std::string_view  raw;          /* the caller's body, kept by it */
    JsonView          view;         /* of raw */
    mutable Json      root;         /* a tree of raw, built when needed */
    std::string       model;
    bool              stream = false;
    int64_t           max_tokens = -1;
    int64_t           prompt_estimate = 0;

    /* the tree: only conversions and rerank need one */
    const json_t *tree() const
    {
        if (!root) {
            root = json_parse(raw.data(), raw.size());
        }
        return root.get();
    }
};

namespace {

/* Text bytes of every string below v (a rough token count is bytes / 4). */
size_t
text_bytes(const JsonView &v, int depth)
{
    if (depth > 32) {
        return 0;
    }

    if (v.is_string()) {
        return v.string_length();
    }

    size_t n = 0;

    if (v.is_array()) {
        v.each_element([&](const JsonView &e) { n += text_bytes(e, depth + 1); });

    } else if (v.is_object()) {
        v.each_member([&](const JsonView &k, const JsonView &e) {
            /* inline media is not prompt text */
            if (!k.string_equals("data") && !k.string_equals("image_url")) {
                n += text_bytes(e, depth + 1);
            }
        });
    }

    return n;
}

const char *
required_field(llmgw_endpoint_e ep, const JsonView &body)
{
    switch (ep) {
    case LLMGW_EP_CHAT:
    case LLMGW_EP_MESSAGES:
        return body.get("messages").is_array() ? nullptr : "messages";
    case LLMGW_EP_GEMINI:
        return body.get("contents").is_array() ? nullptr : "contents";
    case LLMGW_EP_RERANK:
        if (!body.get("query").is_string()) {
            return "query";
        }
        return body.get("documents").is_array() ? nullptr : "documents";
    default:
        return nullptr;
    }
}

int64_t
max_tokens_of(llmgw_endpoint_e ep, const JsonView &body)
{
    switch (ep) {
    case LLMGW_EP_CHAT: {
        int64_t n = body.get("max_completion_tokens").integer(-1);
        return n >= 0 ? n : body.get("max_tokens").integer(-1);
    }
    case LLMGW_EP_MESSAGES:
        return body.get("max_tokens").integer(-1);
    case LLMGW_EP_GEMINI:
        return body.get("generationConfig").get("maxOutputTokens").integer(-1);
    default:
        return -1;
    }
}

} /* namespace */


extern "C" llmgw_req_t *
llmgw_req_parse(llmgw_endpoint_e ep, llmgw_str_t path_model, const char *body,
    size_t len, llmgw_verdict_t *v)
{
    try {
        auto r = std::make_unique<llmgw_req_s>();
        r->ep = ep;
        r->raw = std::string_view(body, len);
        r->view = JsonView::parse(r->raw);

        if (!r->view.is_object()) {
            llmgw_verdict_set(v, 400, "gateway_error", "invalid_json",
                              "invalid JSON request body");
            return nullptr;
        }

        const JsonView &j = r->view;

        if (ep == LLMGW_EP_GEMINI) {
            r->model = sv(path_model);
        } else {
            r->model = j.get("model").string();
        }

        if (r->model.empty()) {
            llmgw_verdict_set(v, 400, "gateway_error", "model_not_specified",
                              "Model name not specified");
            return nullptr;
        }

        if (const char *f = required_field(ep, j)) {
            llmgw_verdict_set(v, 400, "gateway_error", "invalid_request",
                              "field %s is required", f);
            return nullptr;
        }

        if (ep == LLMGW_EP_RERANK) {
            /* the checks do not depend on the channel: any rerank type */
            Json probe;
            std::string err;

            if (!rerank_request(34, r->tree(), r->model, probe, err)) {
                llmgw_verdict_set(v, 400, "gateway_error", "invalid_request",
                                  "%s", err.c_str());
                return nullptr;
            }
        }

        r->stream = j.get("stream").is_true();
        r->max_tokens = max_tokens_of(ep, j);
        r->prompt_estimate = static_cast<int64_t>(text_bytes(j, 0) / 4) + 4;

        return r.release();

    } catch (...) {
        llmgw_verdict_set(v, 500, "gateway_error", "internal_error",
                          "the request could not be read");
        return nullptr;
    }
}


extern "C" void
llmgw_req_free(llmgw_req_t *r)
{
    delete r;
}


extern "C" llmgw_str_t
llmgw_req_model(const llmgw_req_t *r)
{
    return str(r->model);
}


extern "C" int
llmgw_req_stream(const llmgw_req_t *r)
{
    return r->stream;
}


extern "C" int64_t
llmgw_req_max_tokens(const llmgw_req_t *r)
{
    return r->max_tokens;
}


extern "C" int64_t
llmgw_req_prompt_estimate(const llmgw_req_t *r)
{
    return r->prompt_estimate;
}


extern "C" llmgw_buf_t
llmgw_req_upstream_body(const llmgw_req_t *r, const llmgw_channel_t *c,
    llmgw_str_t upstream_model, int *usage_injected)
{
    *usage_injected = 0;

    try {
        std::string err;
        Json out;

        if (r->ep == LLMGW_EP_RERANK) {
            if (!rerank_request(c->type, r->tree(), sv(upstream_model),
                                out, err))
            {
                return llmgw_buf_t { nullptr, 0 };
            }
            return make_buf(json_dump(out.get()));
        }

        if (can_convert(r->ep, c->type)) {
            if (!convert_request(r->ep, c->type, r->tree(),
                                 sv(upstream_model), out, err))
            {
                return llmgw_buf_t { nullptr, 0 };
            }
            return make_buf(json_dump(out.get()));
        }

        bool same_model = r->ep == LLMGW_EP_GEMINI
                          || sv(upstream_model) == r->model;
        bool add_usage = r->ep == LLMGW_EP_CHAT && c->type == 1 && r->stream
                         && !r->view.get("stream_options")
                                     .get("include_usage").is_true();

        /* the common case sends the client's bytes as they came */
        if (same_model && !add_usage) {
            return make_buf(r->raw);
        }

        Json body(json_deep_copy(r->tree()));

        if (r->ep != LLMGW_EP_GEMINI) {
            json_object_set_new(body.get(), "model",
                                json_stringn(upstream_model.data,
                                             upstream_model.len));
        }

        /* OpenAI streams carry usage only when asked for */
        if (r->ep == LLMGW_EP_CHAT && c->type == 1 && r->stream) {
            json_t *so = json_object_get(body.get(), "stream_options");

            if (!json_is_object(so)) {
                so = json_object();
                json_object_set_new(body.get(), "stream_options", so);
            }

            if (!json_is_true(json_object_get(so, "include_usage"))) {
                json_object_set_new(so, "include_usage", json_true());
                *usage_injected = 1;
            }
        }

        return make_buf(json_dump(body.get()));

    } catch (...) {
        return llmgw_buf_t { nullptr, 0 };
    }
}


extern "C" int
llmgw_req_check(const llmgw_req_t *r, int channel_type, llmgw_verdict_t *v)
{
    try {
        std::string err;
        Json out;

        if (!can_convert(r->ep, channel_type)) {
            return 0;
        }

        if (convert_request(r->ep, channel_type, r->tree(), r->model, out,
                            err))
        {
            return 0;
        }

        llmgw_verdict_set(v, 400, "gateway_error", "invalid_request", "%s",
                          err.c_str());
        return -1;

    } catch (...) {
        llmgw_verdict_set(v, 500, "gateway_error", "convert_request_failed",
                          "the request could not be converted");
        return -1;
    }
}


namespace llmgw {

const json_t *
req_json(const llmgw_req_t *r)
{
    return r->tree();
}


llmgw_endpoint_e
req_endpoint(const llmgw_req_t *r)
{
    return r->ep;
}

} /* namespace llmgw */
