/*
 * Client request bodies: parsed once, validated per endpoint, and rewritten
 * for the channel that serves them.
 */

#include <algorithm>
#include <cctype>
#include <iterator>
#include <string>
#include <utility>

#include "internal.h"
#include "convert.h"
#include "jsonview.h"

using namespace llmgw;

namespace {

/* The top-level members a request is read by, found in one pass. */
enum Field {
    F_MODEL, F_STREAM, F_STREAM_OPTIONS, F_MAX_TOKENS,
    F_MAX_COMPLETION_TOKENS, F_MESSAGES, F_CONTENTS, F_GENERATION_CONFIG,
    F_GENERATION_CONFIG_SNAKE, F_QUERY, F_DOCUMENTS, F_N, F_TOP_N,
    F_RETURN_DOCUMENTS, F_COUNT
};

constexpr std::string_view kFieldNames[F_COUNT] = {
    "model", "stream", "stream_options", "max_tokens",
    "max_completion_tokens", "messages", "contents", "generationConfig",
    "generation_config", "query", "documents", "n", "top_n",
    "return_documents"
};

/* The most answers one request is reserved for (OpenAI's n allows 128). */
constexpr int64_t kMaxChoices = 128;


} /* namespace */

struct llmgw_req_s {
    llmgw_endpoint_e  ep = LLMGW_EP_NONE;
    std::string_view  raw;          /* the caller's body, kept by it */
    JsonView          field[F_COUNT];   /* views into raw */
    int               seen[F_COUNT] = {};   /* how often each came */
    mutable Json      root;         /* a tree of raw, built when needed */
    std::string       model;
    bool              stream = false;
    int64_t           max_tokens = -1;
    int64_t           choices = 1;
    /* upstream bodies built ahead (llmgw_req_prepare): a body depends on
       the channel's type and the model sent, nothing else */
    struct Prepared {
        int          type;
        std::string  model;
        std::string  body;
        int          usage_injected;
    };
    mutable std::vector<Prepared>  prepared;
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

/*
 * Whether a string is base64 alone, as inline media is (an image, audio or
 * PDF under Gemini's inlineData.data, Anthropic's source.data, OpenAI's
 * input_audio.data or file.file_data): long, in base64's alphabet, with
 * upper and lower case letters and digits (a run of one letter, or hex, is
 * text).
 */
bool
base64_run(std::string_view t)
{
    if (t.size() < 256) {
        return false;
    }

    bool upper = false, lower = false, digit = false;

    for (unsigned char c : t) {
        upper = upper || std::isupper(c);
        lower = lower || std::islower(c);
        digit = digit || std::isdigit(c);

        if (!(std::isalnum(c) || c == '+' || c == '/' || c == '='
              || c == '-' || c == '_'))
        {
            return false;
        }
    }

    return upper && lower && digit;
}

/*
 * Bytes of prompt text: the decoded string values, not inline media (data
 * URLs, base64 under a "data" or "file_data" member, anything under an
 * "image_url" member).  A rough token count is bytes / 4.
 */
class PromptText : public JsonVisitor {
public:
    size_t bytes = 0;

    void open(bool) override
    {
        if (image_next_) {
            skip_at_ = depth_;
        }
        image_next_ = false;
        media_next_ = false;
        depth_++;
    }

    void close() override
    {
        depth_--;
        if (skip_at_ == depth_) {
            skip_at_ = -1;
        }
    }

    void key(const JsonView &name) override
    {
        std::string scratch;
        std::string_view n = name.text(scratch);

        image_next_ = skip_at_ < 0 && n == "image_url";
        media_next_ = n == "data" || n == "file_data";
    }

    void value(const JsonView &v) override
    {
        if (skip_at_ < 0 && !image_next_ && v.is_string()) {
            std::string scratch;
            std::string_view t = v.text(scratch);
            bool media = (t.substr(0, 5) == "data:"
                          && t.find(";base64,") != std::string_view::npos)
                         || (media_next_ && base64_run(t));

            if (!media) {
                bytes += t.size();
            }
        }
        image_next_ = false;
        media_next_ = false;
    }

private:
    int   depth_ = 0;
    int   skip_at_ = -1;        /* the depth an image_url's value opened */
    bool  image_next_ = false;
    bool  media_next_ = false;
};

/*
 * A member name as Go's encoding/json matches it to a field: letters
 * without case (Unicode simple folding: ASCII, and U+017F "long s" and
 * U+212A "Kelvin sign", which fold to s and k).
 */
std::string
fold_name(std::string_view n)
{
    std::string out;

    out.reserve(n.size());

    for (size_t i = 0; i < n.size(); i++) {
        if (n.compare(i, 2, "\xC5\xBF") == 0) {
            out += 's';
            i += 1;
        } else if (n.compare(i, 3, "\xE2\x84\xAA") == 0) {
            out += 'k';
            i += 2;
        } else {
            out += static_cast<char>(
                std::tolower(static_cast<unsigned char>(n[i])));
        }
    }

    return out;
}

/*
 * Whether a member name is not one of names but matches one without letter
 * case ("Model"): an upstream written in Go reads it as that field (the
 * last one wins there), so what the gateway checked and billed would not
 * be what ran.
 */
bool
lookalike_of(std::string_view name, const std::string_view *names, size_t n)
{
    if (name.size() > 64 || std::find(names, names + n, name) != names + n) {
        return false;
    }

    std::string folded = fold_name(name);

    return std::any_of(names, names + n, [&](std::string_view f) {
        return folded == fold_name(f);
    });
}

/*
 * One pass over the body's members: the fields, the last of a name as a
 * tree keeps it.  The first member that is a look-alike of one of them
 * (lookalike_of) is put in lookalike.
 */
void
read_fields(const JsonView &body, JsonView field[F_COUNT], int seen[F_COUNT],
    std::string &lookalike)
{
    body.each_member([&](const JsonView &k, const JsonView &v) {
        std::string scratch;
        std::string_view name = k.text(scratch);

        for (int i = 0; i < F_COUNT; i++) {
            if (name == kFieldNames[i]) {
                field[i] = v;
                seen[i]++;
                return;
            }
        }

        if (lookalike.empty() && lookalike_of(name, kFieldNames, F_COUNT)) {
            lookalike = std::string(name);
        }
    });
}

/*
 * The members of the fields' own objects that the gateway reads or writes
 * (stream_options.include_usage, which it adds; the generation config's
 * output limit and answer count, which it reserves for), checked as
 * read_fields checks the top level: the first look-alike, as
 * "object.Member", in lookalike.
 */
void
nested_lookalike(const JsonView field[F_COUNT], std::string &lookalike)
{
    static constexpr std::string_view kStreamOptions[] = { "include_usage" };
    static constexpr std::string_view kGenerationConfig[] = {
        "maxOutputTokens", "max_output_tokens", "candidateCount",
        "candidate_count"
    };
    struct Nested {
        Field                    field;
        const std::string_view  *names;
        size_t                   count;
    };
    static constexpr Nested kNested[] = {
        { F_STREAM_OPTIONS, kStreamOptions, std::size(kStreamOptions) },
        { F_GENERATION_CONFIG, kGenerationConfig,
          std::size(kGenerationConfig) },
        { F_GENERATION_CONFIG_SNAKE, kGenerationConfig,
          std::size(kGenerationConfig) },
    };

    for (const Nested &n : kNested) {
        field[n.field].each_member([&](const JsonView &k, const JsonView &) {
            std::string scratch;
            std::string_view name = k.text(scratch);

            if (lookalike.empty() && lookalike_of(name, n.names, n.count)) {
                lookalike = std::string(kFieldNames[n.field]) + "."
                            + std::string(name);
            }
        });
    }
}

/*
 * A speech model, which the Gemini path serves as the spec's audio
 * generation: a name with "tts" as one of its dash-separated parts, as
 * Google names them (gemini-2.5-flash-preview-tts).
 */
bool
speech_model(std::string_view model)
{
    for (size_t at = 0; at <= model.size(); ) {
        size_t end = std::min(model.find('-', at), model.size());

        if (end - at == 3 && fold_name(model.substr(at, 3)) == "tts") {
            return true;
        }

        at = end + 1;
    }

    return false;
}

const char *
required_field(llmgw_endpoint_e ep, std::string_view model,
    const JsonView field[F_COUNT])
{
    switch (ep) {
    case LLMGW_EP_CHAT:
    case LLMGW_EP_MESSAGES:
        return field[F_MESSAGES].is_array() ? nullptr : "messages";
    case LLMGW_EP_GEMINI:
        if (!field[F_CONTENTS].is_array()) {
            return "contents";
        }
        /* an audio generation request requires it (the spec); a text
           generation without it is what the official SDKs send */
        return !speech_model(model)
               || field[F_GENERATION_CONFIG].is_object()
               || field[F_GENERATION_CONFIG_SNAKE].is_object()
               ? nullptr : "generationConfig";
    default:
        /* a rerank's are checked by rerank_request, which says what is
           wrong with one that is given ("query must be a non-empty
           string") */
        return nullptr;
    }
}

/* A count given as a number above 0 (bounded), else -1. */
int64_t
positive(const JsonView &v)
{
    int64_t n = v.integer(-1);

    return n > 0 ? std::min<int64_t>(n, int64_t(1) << 40) : -1;
}

/* The larger of a Gemini generation config member in either spelling
   (Google reads protobuf JSON: camelCase and snake_case alike), in both
   spellings of the config. */
int64_t
gemini_config(const JsonView field[F_COUNT], std::string_view camel,
    std::string_view snake)
{
    int64_t n = -1;

    for (int f : { F_GENERATION_CONFIG, F_GENERATION_CONFIG_SNAKE }) {
        n = std::max({ n, positive(field[f].get(camel)),
                       positive(field[f].get(snake)) });
    }

    return n;
}

/*
 * The most output tokens the client allowed one answer, or -1: the larger
 * of max_completion_tokens and max_tokens when both are given (upstreams
 * differ in which one wins, and many read 0 as not given).  A rerank
 * writes no output that is billed: 0, whatever its body says.
 */
int64_t
max_tokens_of(llmgw_endpoint_e ep, const JsonView field[F_COUNT])
{
    switch (ep) {
    case LLMGW_EP_RERANK:
        return 0;
    case LLMGW_EP_CHAT:
        return std::max(positive(field[F_MAX_COMPLETION_TOKENS]),
                        positive(field[F_MAX_TOKENS]));
    case LLMGW_EP_MESSAGES:
        return positive(field[F_MAX_TOKENS]);
    case LLMGW_EP_GEMINI:
        return gemini_config(field, "maxOutputTokens", "max_output_tokens");
    default:
        return -1;
    }
}

/* How many answers the request asks for: OpenAI's n, Gemini's
   candidateCount. */
int64_t
choices_of(llmgw_endpoint_e ep, const JsonView field[F_COUNT])
{
    int64_t n = -1;

    if (ep == LLMGW_EP_CHAT) {
        n = positive(field[F_N]);
    } else if (ep == LLMGW_EP_GEMINI) {
        n = gemini_config(field, "candidateCount", "candidate_count");
    }

    return std::clamp<int64_t>(n, 1, kMaxChoices);
}

/*
 * The body with the model replaced and (or) usage asked for, edited in the
 * client's text: false when that cannot be done plainly (a member given
 * twice, stream_options that is not an object or already names
 * include_usage), and the tree must do it.
 */
bool
edit_body(const llmgw_req_s &r, const std::string_view *model, bool add_usage,
    std::string &out)
{
    struct Edit {
        size_t       at;
        size_t       len;
        std::string  text;
    };

    Edit edits[2];
    size_t n = 0;
    auto offset = [&](const JsonView &v) {
        return static_cast<size_t>(v.raw().data() - r.raw.data());
    };

    if (r.seen[F_MODEL] > 1 || r.seen[F_STREAM_OPTIONS] > 1) {
        return false;
    }

    if (model != nullptr) {
        const JsonView &m = r.field[F_MODEL];

        if (!m.is_string()) {
            return false;
        }
        edits[n].at = offset(m);
        edits[n].len = m.raw().size();
        append_json_string(edits[n].text, *model);
        n++;
    }

    if (add_usage) {
        const JsonView &so = r.field[F_STREAM_OPTIONS];

        if (!so) {
            /* a new last member: the object has members (model at least) */
            edits[n].at = r.raw.rfind('}');
            edits[n].len = 0;
            edits[n].text = ",\"stream_options\":{\"include_usage\":true}";

        } else if (so.is_object() && !so.get("include_usage")) {
            bool empty = true;

            so.each_member([&](const JsonView &, const JsonView &) {
                empty = false;
            });
            edits[n].at = offset(so) + 1;
            edits[n].len = 0;
            edits[n].text = empty ? "\"include_usage\":true"
                                  : "\"include_usage\":true,";
        } else {
            return false;
        }
        n++;
    }

    if (n == 2 && edits[1].at < edits[0].at) {
        std::swap(edits[0], edits[1]);
    }

    size_t from = 0;

    out.reserve(r.raw.size() + 64);
    for (size_t i = 0; i < n; i++) {
        out.append(r.raw.substr(from, edits[i].at - from));
        out.append(edits[i].text);
        from = edits[i].at + edits[i].len;
    }
    out.append(r.raw.substr(from));

    return true;
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
        JsonView root = JsonView::parse(r->raw);

        if (!root.is_object()) {
            llmgw_verdict_set(v, 400, "gateway_error", "invalid_json",
                              "invalid JSON request body");
            return nullptr;
        }

        PromptText text;

        std::string lookalike;

        read_fields(root, r->field, r->seen, lookalike);

        if (lookalike.empty()) {
            nested_lookalike(r->field, lookalike);
        }

        if (!lookalike.empty()) {
            llmgw_verdict_set(v, 400, "gateway_error", "invalid_request",
                              "member \"%.*s\" differs from a field of "
                              "the request only by letter case; upstreams "
                              "that ignore case would read it as that field",
                              (int) std::min<size_t>(lookalike.size(), 96),
                              lookalike.data());
            return nullptr;
        }

        root.visit(text);

        if (ep == LLMGW_EP_GEMINI) {
            r->model = sv(path_model);

        } else {
            const JsonView &m = r->field[F_MODEL];

            /* as on the task endpoints: absent or null names no model,
               a number or an object is no name */
            if (m && !m.is_string() && m.kind() != JsonView::Kind::null) {
                llmgw_verdict_set(v, 400, "gateway_error", "invalid_request",
                                  "model must be a string");
                return nullptr;
            }
            r->model = m.string();
        }

        if (r->model.empty()) {
            llmgw_verdict_set(v, 400, "gateway_error", "model_not_specified",
                              "Model name not specified");
            return nullptr;
        }

        /* it goes into the ledger, the logs and the shared zone */
        if (r->model.size() > kMaxModelName) {
            llmgw_verdict_set(v, 400, "gateway_error", "invalid_request",
                              "model: a model name has at most %zu bytes",
                              kMaxModelName);
            return nullptr;
        }

        if (const char *f = required_field(ep, r->model, r->field)) {
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

        /* "true" or 1 would be read as no stream here and as a stream by
           a lenient upstream: the answer would be refused as no JSON
           answer, on every channel, each generation unpaid */
        const JsonView &stream = r->field[F_STREAM];
        if ((ep == LLMGW_EP_CHAT || ep == LLMGW_EP_MESSAGES) && stream
            && stream.kind() != JsonView::Kind::yes
            && stream.kind() != JsonView::Kind::no
            && stream.kind() != JsonView::Kind::null)
        {
            llmgw_verdict_set(v, 400, "gateway_error", "invalid_request",
                              "stream must be a boolean");
            return nullptr;
        }

        /* the other endpoints have no such member (Gemini streams by its
           path) */
        r->stream = (ep == LLMGW_EP_CHAT || ep == LLMGW_EP_MESSAGES)
                    && stream.is_true();
        r->max_tokens = max_tokens_of(ep, r->field);
        r->choices = choices_of(ep, r->field);
        r->prompt_estimate = static_cast<int64_t>(text.bytes / 4) + 4;

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


extern "C" llmgw_str_t
llmgw_req_model_in(const char *body, size_t len)
{
    try {
        std::string scratch;
        JsonView    m = JsonView::parse(std::string_view(body, len))
                            .get("model");
        std::string_view v = m.text(scratch);

        /* a view into the body only: a name with escapes is left out */
        if (!scratch.empty() || v.empty() || v.size() > 1024) {
            return llmgw_str_t { nullptr, 0 };
        }

        return str(v);

    } catch (...) {
        return llmgw_str_t { nullptr, 0 };
    }
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
llmgw_req_choices(const llmgw_req_t *r)
{
    return r->choices;
}


extern "C" int64_t
llmgw_req_prompt_estimate(const llmgw_req_t *r)
{
    return r->prompt_estimate;
}


namespace {

llmgw_buf_t
build_upstream_body(const llmgw_req_t *r, const llmgw_channel_t *c,
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
                         && !r->field[F_STREAM_OPTIONS]
                                     .get("include_usage").is_true();

        /* the common case sends the client's bytes as they came */
        if (same_model && !add_usage) {
            return make_buf(r->raw);
        }

        std::string edited;
        std::string_view to = sv(upstream_model);

        if (edit_body(*r, r->ep != LLMGW_EP_GEMINI && !same_model ? &to
                                                                  : nullptr,
                      add_usage, edited))
        {
            *usage_injected = add_usage;
            return make_buf(edited);
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

}   // namespace


extern "C" llmgw_buf_t
llmgw_req_upstream_body(const llmgw_req_t *r, const llmgw_channel_t *c,
    llmgw_str_t upstream_model, int *usage_injected)
{
    return build_upstream_body(r, c, upstream_model, usage_injected);
}


extern "C" void
llmgw_req_prepare(const llmgw_req_t *r, const llmgw_channel_t *c,
    llmgw_str_t upstream_model)
{
    try {
        for (const auto &p : r->prepared) {
            if (p.type == c->type && p.model == sv(upstream_model)) {
                return;
            }
        }

        int usage = 0;
        llmgw_buf_t b = build_upstream_body(r, c, upstream_model, &usage);

        if (b.data == nullptr) {
            return;
        }

        r->prepared.push_back({ c->type, std::string(sv(upstream_model)),
                                std::string(b.data, b.len), usage });
        llmgw_buf_free(&b);

    } catch (...) {
        /* built again when needed */
    }
}


extern "C" int
llmgw_req_prepared_body(const llmgw_req_t *r, const llmgw_channel_t *c,
    llmgw_str_t upstream_model, llmgw_str_t *body, int *usage_injected)
{
    for (const auto &p : r->prepared) {
        if (p.type == c->type && p.model == sv(upstream_model)) {
            *body = str(p.body);
            *usage_injected = p.usage_injected;
            return 0;
        }
    }

    return -1;
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
