/*
 * Reading usage from what an upstream answers, as it streams: OpenAI usage
 * (JSON or the final stream chunk), Anthropic usage (message_start and
 * message_delta), Gemini usageMetadata, rerank billed units.
 */

#include <algorithm>
#include <cctype>
#include <string>

#include "internal.h"
#include "convert.h"

using namespace llmgw;

namespace {

/* A JSON body is kept for usage up to this size; beyond it usage is
 * estimated from the delivered bytes. */
constexpr size_t kMaxJsonBody = 16 * 1024 * 1024;

} /* namespace */

struct llmgw_resp_s {
    llmgw_endpoint_e  ep = LLMGW_EP_NONE;
    int               type = 0;
    bool              stream = false;
    bool              usage_injected = false;
    bool              overflow = false;
    std::string       body;             /* JSON responses */
    llmgw_sse_t      *sse = nullptr;
    std::string       out;              /* re-framed SSE when filtering */
    size_t            text_bytes = 0;   /* delivered completion text */
    llmgw_usage_t     usage {};

    /* the client's format when it is not the channel's */
    llmgw_endpoint_e                  client = LLMGW_EP_NONE;
    std::string                       client_model;
    const json_t                     *client_req = nullptr;
    bool                              hold_json = false;
    std::unique_ptr<StreamConverter>  conv;

    ~llmgw_resp_s() { llmgw_sse_free(sse); }
};

namespace {

void
take_openai(const json_t *u, llmgw_usage_t &out)
{
    if (!json_is_object(u)) {
        return;
    }

    out.prompt_tokens = json_int(u, "prompt_tokens", 0);
    out.completion_tokens = json_int(u, "completion_tokens", 0);
    out.cache_read_tokens = json_int(json_object_get(u,
                                         "prompt_tokens_details"),
                                     "cached_tokens", 0);
    out.cache_in_prompt = 1;
    out.known = 1;
}

void
take_anthropic(const json_t *u, llmgw_usage_t &out)
{
    if (!json_is_object(u)) {
        return;
    }

    /*
     * message_delta carries cumulative output and, sometimes, input; a
     * field that is absent or null keeps what message_start said.
     */
    struct { const char *name; int64_t *to; } fields[] = {
        { "input_tokens", &out.prompt_tokens },
        { "output_tokens", &out.completion_tokens },
        { "cache_read_input_tokens", &out.cache_read_tokens },
        { "cache_creation_input_tokens", &out.cache_creation_tokens },
    };

    for (const auto &f : fields) {
        if (json_is_number(json_object_get(u, f.name))) {
            *f.to = json_int(u, f.name, 0);
        }
    }

    out.cache_in_prompt = 0;

    out.known = 1;
}

void
take_gemini(const json_t *u, llmgw_usage_t &out)
{
    if (!json_is_object(u)) {
        return;
    }

    out.prompt_tokens = json_int(u, "promptTokenCount", 0);
    /* thinking tokens are billed as output */
    out.completion_tokens = json_int(u, "candidatesTokenCount", 0)
                            + json_int(u, "thoughtsTokenCount", 0);
    out.cache_read_tokens = json_int(u, "cachedContentTokenCount", 0);
    out.cache_in_prompt = 1;
    out.known = 1;
}

void
take_rerank(const json_t *body, llmgw_usage_t &out)
{
    const json_t *billed = json_object_get(json_object_get(body, "meta"),
                                           "billed_units");

    if (json_is_object(billed)) {
        out.prompt_tokens = json_int(billed, "search_units", 0);
        if (out.prompt_tokens == 0) {
            out.prompt_tokens = json_int(billed, "input_tokens", 0);
        }
        out.known = 1;
        return;
    }

    const json_t *u = json_object_get(body, "usage");

    if (json_is_object(u)) {
        out.prompt_tokens = json_int(u, "total_tokens",
                                     json_int(u, "prompt_tokens", 0));
        out.known = 1;
    }
}

/* Completion text carried by one streamed chunk, for estimates. */
size_t
chunk_text(const json_t *j)
{
    size_t   n = 0, i;
    json_t  *v;

    json_array_foreach(json_object_get(j, "choices"), i, v) {
        const json_t *delta = json_object_get(v, "delta");
        n += json_str(delta, "content").size()
             + json_str(delta, "reasoning_content").size();
    }

    n += json_str(json_object_get(j, "delta"), "text").size();

    json_array_foreach(json_object_get(j, "candidates"), i, v) {
        size_t   k;
        json_t  *part;

        json_array_foreach(json_object_get(json_object_get(v, "content"),
                                           "parts"), k, part) {
            n += json_str(part, "text").size();
        }
    }

    return n;
}

/* The usage-only chunk an injected include_usage produces. */
bool
is_usage_only(const json_t *j)
{
    const json_t *choices = json_object_get(j, "choices");

    return json_is_object(json_object_get(j, "usage"))
           && json_is_array(choices) && json_array_size(choices) == 0;
}

/*
 * The bytes of the string values of text-carrying members ("content",
 * "text", "reasoning_content") in a chunk, found without parsing it: a
 * stream is billed by them only when no usage arrives.
 */
size_t
scan_text(std::string_view data)
{
    static const std::string_view keys[] = {
        "\"content\":\"", "\"text\":\"", "\"reasoning_content\":\""
    };

    size_t n = 0;

    for (std::string_view key : keys) {
        for (size_t at = data.find(key); at != std::string_view::npos;
             at = data.find(key, at + 1))
        {
            size_t i = at + key.size();

            while (i < data.size() && data[i] != '"') {
                i += data[i] == '\\' ? 2 : 1;
            }

            n += std::min(i, data.size()) - (at + key.size());
        }
    }

    return n;
}


void
on_event(void *arg, const llmgw_sse_event_t *ev)
{
    auto *r = static_cast<llmgw_resp_s *>(arg);
    std::string_view data = sv(ev->data);
    Json j;

    /* only a chunk that carries usage is worth a parse */
    bool usage = data.find("\"usage") != std::string_view::npos;

    if (usage) {
        j = json_parse(ev->data.data, ev->data.len);
    }

    bool drop = false;

    r->text_bytes += j ? chunk_text(j.get()) : scan_text(data);

    if (j) {

        switch (r->type) {
        case 14: {
            std::string_view type = json_str(j.get(), "type");
            if (type == "message_start") {
                take_anthropic(json_object_get(json_object_get(j.get(),
                                                   "message"), "usage"),
                               r->usage);
            } else if (type == "message_delta") {
                take_anthropic(json_object_get(j.get(), "usage"), r->usage);
            }
            break;
        }
        case 24:
            take_gemini(json_object_get(j.get(), "usageMetadata"), r->usage);
            break;
        default:
            take_openai(json_object_get(j.get(), "usage"), r->usage);
            drop = r->usage_injected && is_usage_only(j.get());
            break;
        }
    }

    if (r->conv) {
        (void) r->conv->event(sv(ev->event), data, r->out);
        return;
    }

    if (!r->usage_injected || drop) {
        return;
    }

    std::string_view name = sv(ev->event);

    if (!name.empty() && name != "message") {
        r->out.append("event: ").append(name).append("\n");
    }

    /* re-frame line by line: data may hold newlines */
    size_t start = 0;

    for (;;) {
        size_t nl = data.find('\n', start);
        r->out.append("data: ").append(data.substr(start, nl - start))
              .append("\n");
        if (nl == std::string_view::npos) {
            break;
        }
        start = nl + 1;
    }

    r->out.append("\n");
}

/*
 * The top-level usage object of a JSON answer, found without parsing the
 * whole answer: the last `"<name>": {` not inside a string (an escaped
 * quote precedes a quoted name inside one), up to its matching brace.
 */
Json
find_member_object(std::string_view body, std::string_view name)
{
    std::string key = "\"" + std::string(name) + "\"";

    for (size_t at = body.rfind(key); at != std::string_view::npos;
         at = at ? body.rfind(key, at - 1) : std::string_view::npos)
    {
        if (at > 0 && body[at - 1] == '\\') {
            continue;
        }

        size_t i = at + key.size();

        while (i < body.size() && std::isspace((unsigned char) body[i])) {
            i++;
        }

        if (i >= body.size() || body[i] != ':') {
            continue;
        }

        i++;

        while (i < body.size() && std::isspace((unsigned char) body[i])) {
            i++;
        }

        if (i >= body.size() || body[i] != '{') {
            continue;
        }

        size_t start = i;
        int depth = 0;
        bool in_str = false;

        for (; i < body.size(); i++) {
            char c = body[i];

            if (in_str) {
                if (c == '\\') {
                    i++;
                } else if (c == '"') {
                    in_str = false;
                }
            } else if (c == '"') {
                in_str = true;
            } else if (c == '{') {
                depth++;
            } else if (c == '}' && --depth == 0) {
                return json_parse(body.data() + start, i - start + 1);
            }
        }

        return Json();
    }

    return Json();
}


/* The usage of a JSON answer from its usage object alone, when it has one. */
bool
quick_usage(llmgw_resp_s &r)
{
    if (r.ep == LLMGW_EP_RERANK || r.hold_json) {
        return false;
    }

    bool gemini = r.ep == LLMGW_EP_GEMINI || r.type == 24;
    Json u = find_member_object(r.body, gemini ? "usageMetadata" : "usage");

    if (!u) {
        return false;
    }

    if (gemini) {
        take_gemini(u.get(), r.usage);
    } else if (r.type == 14) {
        take_anthropic(u.get(), r.usage);
    } else {
        take_openai(u.get(), r.usage);
    }

    return r.usage.known;
}


void
finish_json(llmgw_resp_s &r)
{
    if (r.overflow || quick_usage(r)) {
        return;
    }

    Json j = json_parse(r.body.data(), r.body.size());

    if (!j) {
        r.text_bytes = r.body.size();
        return;
    }

    const json_t *b = j.get();

    switch (r.ep) {
    case LLMGW_EP_RERANK:
        take_rerank(b, r.usage);
        return;
    case LLMGW_EP_GEMINI:
        take_gemini(json_object_get(b, "usageMetadata"), r.usage);
        break;
    default:
        if (r.type == 14) {
            take_anthropic(json_object_get(b, "usage"), r.usage);
        } else {
            take_openai(json_object_get(b, "usage"), r.usage);
        }
    }

    size_t   i;
    json_t  *v;

    json_array_foreach(json_object_get(b, "choices"), i, v) {
        r.text_bytes += json_str(json_object_get(v, "message"),
                                 "content").size();
    }

    json_array_foreach(json_object_get(b, "content"), i, v) {
        r.text_bytes += json_str(v, "text").size();
    }

    json_array_foreach(json_object_get(b, "candidates"), i, v) {
        size_t   k;
        json_t  *part;

        json_array_foreach(json_object_get(json_object_get(v, "content"),
                                           "parts"), k, part) {
            r.text_bytes += json_str(part, "text").size();
        }
    }
}

} /* namespace */


extern "C" llmgw_resp_t *
llmgw_resp_new(llmgw_endpoint_e ep, int channel_type, int stream,
    int usage_injected)
{
    try {
        auto r = std::make_unique<llmgw_resp_s>();

        r->ep = ep;
        r->type = channel_type;
        r->stream = stream != 0;
        r->usage_injected = usage_injected != 0;

        if (r->stream) {
            r->sse = llmgw_sse_new(0);
            if (r->sse == nullptr) {
                return nullptr;
            }
        }

        return r.release();

    } catch (...) {
        return nullptr;
    }
}


extern "C" void
llmgw_resp_free(llmgw_resp_t *r)
{
    delete r;
}


extern "C" int
llmgw_resp_feed(llmgw_resp_t *r, const char *data, size_t len,
    llmgw_buf_t *out)
{
    out->data = nullptr;
    out->len = 0;

    try {
        if (!r->stream) {
            if (r->body.size() + len > kMaxJsonBody && !r->hold_json) {
                r->overflow = true;
                r->text_bytes += len;
                r->body.clear();
            } else if (!r->overflow) {
                r->body.append(data, len);
            }

            if (r->hold_json) {
                /* nothing goes out before the whole answer is converted */
                *out = make_buf("");
                return out->data ? 0 : -1;
            }

            return 0;
        }

        r->out.clear();

        if (llmgw_sse_feed(r->sse, data, len, on_event, r) != 0
            && r->conv == nullptr)
        {
            /* an oversized event: stop filtering, keep passing bytes */
            r->usage_injected = false;
        }

        if (r->usage_injected || r->conv) {
            *out = make_buf(r->out);
            if (out->data == nullptr) {
                return -1;
            }
        }

        return 0;

    } catch (...) {
        return -1;
    }
}


/* The held JSON answer in the client's format (or as it came). */
std::string
converted_json(llmgw_resp_s &r)
{
    Json in = json_parse(r.body.data(), r.body.size());
    Json out;
    std::string err;

    if (in) {
        bool ok = r.client == LLMGW_EP_RERANK
                  ? rerank_response(r.type, in.get(), r.client_req, out, err)
                  : convert_response(r.type, r.client, in.get(),
                                     r.client_model, out, err);
        if (ok) {
            return json_dump(out.get());
        }
    }

    return r.body;
}


extern "C" int
llmgw_resp_finish(llmgw_resp_t *r, llmgw_buf_t *out)
{
    out->data = nullptr;
    out->len = 0;

    try {
        if (!r->stream) {
            finish_json(*r);

            if (r->hold_json) {
                *out = make_buf(converted_json(*r));
            }

        } else if (r->conv) {
            std::string tail;
            r->conv->finish(tail);
            *out = make_buf(tail);
        }

        return 0;

    } catch (...) {
        return -1;
    }
}


extern "C" int
llmgw_resp_convert(llmgw_resp_t *r, const llmgw_req_t *req)
{
    try {
        llmgw_endpoint_e client = req_endpoint(req);
        const json_t *body = req_json(req);

        r->client = client;
        r->client_req = body;
        r->client_model = json_str(body, "model");

        if (client == LLMGW_EP_RERANK) {
            r->hold_json = !r->stream;
            return 0;
        }

        if (!can_convert(client, r->type)) {
            return 0;
        }

        if (!r->stream) {
            r->hold_json = true;
            return 0;
        }

        r->conv = std::make_unique<StreamConverter>(r->type, client,
                                                    r->client_model);
        if (!r->conv->usable()) {
            r->conv.reset();
            return -1;
        }

        r->conv->include_usage(json_is_true(json_object_get(
            json_object_get(body, "stream_options"), "include_usage")));

        /* the converter reframes every event itself */
        r->usage_injected = false;
        return 0;

    } catch (...) {
        return -1;
    }
}


extern "C" int
llmgw_resp_rewrites(const llmgw_resp_t *r)
{
    return r->hold_json || r->conv != nullptr || r->usage_injected;
}


extern "C" void
llmgw_resp_usage(const llmgw_resp_t *r, llmgw_usage_t *u)
{
    *u = r->usage;

    if (!u->known) {
        u->completion_tokens = static_cast<int64_t>(r->text_bytes / 4);
    }
}
