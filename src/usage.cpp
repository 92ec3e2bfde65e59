/*
 * Reading usage from what an upstream answers, as it streams: OpenAI usage
 * (JSON or the final stream chunk), Anthropic usage (message_start and
 * message_delta), Gemini usageMetadata, rerank billed units.
 */

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <cctype>
#include <string>

#include "internal.h"
#include "convert.h"
#include "jsonview.h"

using namespace llmgw;

namespace {

/* A JSON body, or one stream event, is kept for usage up to this size;
 * beyond it usage is estimated from the delivered bytes. */
constexpr size_t kMaxJsonBody = 16 * 1024 * 1024;

/* The shortest channel key masked in 2xx answers and streams. */
constexpr size_t kSecretInAnswersMinBytes = 16;

/*
 * One member of a JSON answer's root object, taken as its text from the
 * answer's bytes as they pass: for an answer too large to hold, whose usage
 * is still what the upstream says.  Strings and nesting are followed so that
 * a member of that name deeper down, or text inside a string, is not taken;
 * a value that is not an object, or one over 64 KiB, is not taken either.
 * Names are compared as written (a name spelt with \u escapes is not it);
 * of two members of the name, the last whole object wins.
 */
class RootMember {
public:
    explicit RootMember(std::string name) : name_(std::move(name)) {}

    void feed(std::string_view bytes)
    {
        const char *p = bytes.data();
        const char *end = p + bytes.size();
        /* the next quote and backslash from here (looked for once each,
           not again until passed: megabytes of one string cost two
           memchr, not a step per byte) */
        const char *quote = nullptr;
        const char *slash = nullptr;

        while (p < end) {
            if (bytes_.in_string() && !bytes_.escaped() && !capturing_
                && !reading_name_)
            {
                if (quote == nullptr || quote < p) {
                    quote = find(p, end, '"');
                }
                if (slash == nullptr || slash < p) {
                    slash = find(p, end, '\\');
                }
                /* the bytes before either change nothing */
                p = std::min(quote, slash);
                if (p == end) {
                    break;
                }
            }

            step(*p++);
        }
    }

    /* the last whole value of the member ("" when none) */
    const std::string &value() const { return done_; }

private:
    static constexpr size_t kMaxValue = 64 * 1024;
    static constexpr size_t kMaxName = 64;

    static const char *find(const char *p, const char *end, char c)
    {
        const void *at = std::memchr(p, c, static_cast<size_t>(end - p));
        return at != nullptr ? static_cast<const char *>(at) : end;
    }

    void step(char c)
    {
        int64_t              before = bytes_.depth();
        llmgw::JsonBytes::Kind kind = bytes_.step(c);

        if (capturing_) {
            if (value_.size() >= kMaxValue) {
                capturing_ = false;      /* too large: not this one */
                value_.clear();
            } else {
                value_ += c;
            }
        }

        switch (kind) {
        case llmgw::JsonBytes::Kind::string:
            if (!reading_name_) {
                return;
            }
            if (!bytes_.in_string()) {
                /* the name's closing quote */
                reading_name_ = false;
                matched_ = name_ok_ && name_buf_ == name_;
            } else if (name_buf_.size() < kMaxName) {
                name_buf_ += c;
            } else {
                name_ok_ = false;
            }
            return;

        case llmgw::JsonBytes::Kind::string_start:
            if (before == 1 && expect_name_) {
                expect_name_ = false;
                reading_name_ = true;
                name_ok_ = true;
                name_buf_.clear();
            }
            return;

        case llmgw::JsonBytes::Kind::open:
            if (before == 1 && matched_ && c == '{' && !capturing_) {
                capturing_ = true;
                value_.assign(1, c);
            }
            matched_ = false;
            if (before == 0) {
                expect_name_ = c == '{';
            }
            return;

        case llmgw::JsonBytes::Kind::close:
            if (bytes_.depth() == 1 && capturing_) {
                capturing_ = false;
                done_ = std::move(value_);
                value_.clear();
            }
            return;

        case llmgw::JsonBytes::Kind::other:
            if (before != 1) {
                return;
            }
            if (c == ',') {
                expect_name_ = true;
                matched_ = false;
            } else if (c != ':' && c != ' ' && c != '\t' && c != '\r'
                       && c != '\n')
            {
                /* a number, true, false or null */
                matched_ = false;
            }
            return;
        }
    }

    llmgw::JsonBytes  bytes_;
    std::string       name_;
    std::string       name_buf_;
    std::string       value_;
    std::string       done_;
    bool              expect_name_ = false;
    bool              reading_name_ = false;
    bool              name_ok_ = false;
    bool              matched_ = false;
    bool              capturing_ = false;
};

/*
 * Gemini's counts as the stream has stated them so far: a chunk's
 * usageMetadata may leave out one an earlier chunk gave (the prompt), which
 * then stands.
 */
struct GeminiCounts {
    int64_t  prompt = 0;
    int64_t  tool_use_prompt = 0;
    int64_t  candidates = 0;
    int64_t  thoughts = 0;
    int64_t  cached = 0;
};

} /* namespace */

struct llmgw_resp_s {
    llmgw_endpoint_e  ep = LLMGW_EP_NONE;
    int               type = 0;
    bool              stream = false;
    bool              usage_injected = false;
    bool              overflow = false;
    /* past the hold limit: the usage member, taken as the bytes pass */
    std::unique_ptr<RootMember>  overflow_usage;
    std::string       body;             /* JSON responses */
    llmgw_sse_t      *sse = nullptr;
    std::string       out;              /* re-framed SSE when filtering */
    size_t            text_bytes = 0;   /* delivered completion text */
    llmgw_usage_t     usage {};
    GeminiCounts      gemini;
    /* a stream's final usage came (OpenAI's usage chunk, Anthropic's
       message_delta, Gemini's chunk with a finishReason): before that, a
       reported count is partial */
    bool              final_usage = false;
    /* the upstream's error event came before any text was delivered */
    bool              error_first = false;
    /* a stream's events with data (not counting [DONE]) */
    size_t            events = 0;
    /* a stream's end was said: [DONE], a finish reason, Anthropic's
       message_delta or message_stop; a stream that ends cleanly without
       one was cut short */
    bool              end_said = false;

    /* the client's format when it is not the channel's */
    llmgw_endpoint_e                  client = LLMGW_EP_NONE;
    std::string                       client_model;
    const json_t                     *client_req = nullptr;
    /* the request's prompt estimate (llmgw_req_prompt_estimate) */
    int64_t                           prompt_estimate = 0;
    /* a JSON answer is held whole: checked, billed and converted (when
       convert_json) before any of it goes out */
    bool                              hold_json = false;
    bool                              convert_json = false;
    bool                              valid = false;
    bool                              finished = false;
    /* the client asked for a stream, the upstream answered whole */
    bool                              whole_for_stream = false;
    /* a Gemini stream asked for without alt=sse: the events' answers go
       out as one JSON array, written as they come; array_open once its
       "[" went out */
    bool                              array = false;
    bool                              array_open = false;
    /* an array whose stream had an event too large to read: it cannot be
       whole, nothing more goes out and it is not closed */
    bool                              array_broken = false;
    std::unique_ptr<StreamConverter>  conv;

    /* the try's channel credential, taken out of everything the client
       gets (an upstream error event can quote it); the end of the last
       output when it may be the start of one, held for the next */
    std::string_view                  secret;
    const std::vector<std::string>   *secret_forms = &own_forms;
    std::string                       secret_tail;
    std::string_view                  request_id;
    /* a credential given by value (llmgw_resp_secret) and its spellings;
       a channel's are the snapshot's (llmgw_resp_secret_channel) */
    std::string                       own_secret;
    std::vector<std::string>          own_forms;
    std::string                       own_request_id;
    /* a filtered stream's bytes since its last complete event */
    std::string                       raw_tail;

    ~llmgw_resp_s() { llmgw_sse_free(sse); }
};

namespace {

/* The usage dialect of what a channel answers to a client's endpoint. */
enum class Wire { openai, anthropic, gemini };

Wire
wire_of(llmgw_endpoint_e ep, int type)
{
    switch (type) {
    case 1:
        return Wire::openai;
    case 14:
        return Wire::anthropic;
    case 24:
        return Wire::gemini;
    default:
        /* a peer gateway (or another kind) speaks the client's endpoint */
        return ep == LLMGW_EP_GEMINI ? Wire::gemini
               : ep == LLMGW_EP_MESSAGES ? Wire::anthropic : Wire::openai;
    }
}

/*
 * A token count as an upstream reports it: a whole number from 0 to 2^40
 * (a real without a fraction too).  Absent or null: 0, and true; anything
 * else (negative, fractional, past 2^40, a string, an object): false, and
 * the usage it belongs to counts as not reported (billed by estimate
 * rather than, say, as 0).
 */
bool
token_count(const JsonView &v, int64_t &out)
{
    static constexpr int64_t kMaxTokens = int64_t(1) << 40;

    out = 0;

    switch (v.kind()) {
    case JsonView::Kind::none:
    case JsonView::Kind::null:
        return true;

    case JsonView::Kind::integer:
        out = v.integer(-1);
        return out >= 0 && out <= kMaxTokens;

    case JsonView::Kind::real: {
        std::string text(v.raw());
        double d = std::strtod(text.c_str(), nullptr);

        if (!(d >= 0 && d <= static_cast<double>(kMaxTokens))
            || d != std::floor(d))
        {
            return false;
        }

        out = static_cast<int64_t>(d);
        return true;
    }

    default:
        return false;
    }
}

/*
 * The named counts of u (fields[i].name into *fields[i].to, in order): 1.
 * Nothing set when one is not a count (-1) or none is a number (0).  With
 * keep, an absent or null one leaves its value as it was.
 */
struct CountField { const char *name; int64_t *to; };

template <size_t N>
int
take_counts(const JsonView &u, const CountField (&fields)[N], bool keep)
{
    int64_t got[N];
    bool any = false;

    for (size_t i = 0; i < N; i++) {
        JsonView v = u.get(fields[i].name);

        if (!token_count(v, got[i])) {
            return -1;
        }
        any = any || v.is_number();
    }

    if (!any) {
        return 0;
    }

    for (size_t i = 0; i < N; i++) {
        JsonView v = u.get(fields[i].name);

        if (!keep || v.is_number()) {
            *fields[i].to = got[i];
        }
    }

    return 1;
}

/* Counts taken (rc 1), or none (0), or one that is no count (-1): then
   what was reported before counts for nothing either, as a cut stream's
   usage would not (billed by estimate). */
bool
counts_taken(int rc, llmgw_usage_t &out)
{
    if (rc < 0) {
        out.known = 0;
    }
    return rc > 0;
}

void
take_openai(const JsonView &u, llmgw_usage_t &out)
{
    if (!u.is_object()) {
        return;
    }

    llmgw_usage_t t = out;
    int64_t cached = 0;
    const CountField fields[] = {
        { "prompt_tokens", &t.prompt_tokens },
        { "completion_tokens", &t.completion_tokens },
    };

    int rc = take_counts(u, fields, false);

    if (rc > 0
        && !token_count(u.get("prompt_tokens_details").get("cached_tokens"),
                        cached))
    {
        rc = -1;
    }

    if (!counts_taken(rc, out)) {
        return;
    }

    out.prompt_tokens = t.prompt_tokens;
    out.completion_tokens = t.completion_tokens;
    /* the cached part is part of the prompt */
    out.cache_read_tokens = std::min(cached, t.prompt_tokens);
    out.cache_in_prompt = 1;
    out.known = 1;
}

void
take_anthropic(const JsonView &u, llmgw_usage_t &out)
{
    if (!u.is_object()) {
        return;
    }

    /*
     * message_delta carries cumulative output and, sometimes, input; a
     * field that is absent or null keeps what message_start said.
     */
    llmgw_usage_t t = out;
    const CountField fields[] = {
        { "input_tokens", &t.prompt_tokens },
        { "output_tokens", &t.completion_tokens },
        { "cache_read_input_tokens", &t.cache_read_tokens },
        { "cache_creation_input_tokens", &t.cache_creation_tokens },
    };

    if (!counts_taken(take_counts(u, fields, true), out)) {
        return;
    }

    out.prompt_tokens = t.prompt_tokens;
    out.completion_tokens = t.completion_tokens;
    out.cache_read_tokens = t.cache_read_tokens;
    out.cache_creation_tokens = t.cache_creation_tokens;
    out.cache_in_prompt = 0;

    out.known = 1;
}

/*
 * Gemini's usageMetadata: its promptTokenCount leaves out the prompt of
 * tool use (toolUsePromptTokenCount, the results of a code execution or a
 * search the model made), which is billed as prompt too; thinking is
 * billed as output.  A count a later chunk leaves out keeps what an
 * earlier one said (counts, which holds them, starts at 0).
 */
void
take_gemini(const JsonView &u, GeminiCounts &counts, llmgw_usage_t &out)
{
    if (!u.is_object()) {
        return;
    }

    GeminiCounts t = counts;
    const CountField fields[] = {
        { "promptTokenCount", &t.prompt },
        { "toolUsePromptTokenCount", &t.tool_use_prompt },
        { "candidatesTokenCount", &t.candidates },
        { "thoughtsTokenCount", &t.thoughts },
        { "cachedContentTokenCount", &t.cached },
    };

    if (!counts_taken(take_counts(u, fields, true), out)) {
        return;
    }

    counts = t;
    out.prompt_tokens = t.prompt + t.tool_use_prompt;
    out.completion_tokens = t.candidates + t.thoughts;
    out.cache_read_tokens = std::min(t.cached, t.prompt);
    out.cache_in_prompt = 1;
    out.known = 1;
}

/* The usage of an answer (a JSON body, or a stream event) in its dialect,
   into r's. */
void
take_usage(Wire w, const JsonView &body, llmgw_resp_s &r)
{
    switch (w) {
    case Wire::gemini:
        take_gemini(body.get("usageMetadata"), r.gemini, r.usage);
        break;
    case Wire::anthropic:
        take_anthropic(body.get("usage"), r.usage);
        break;
    default:
        take_openai(body.get("usage"), r.usage);
    }
}

/* The name of the member that carries usage in a wire's answers. */
const char *
usage_member(Wire w)
{
    return w == Wire::gemini ? "usageMetadata" : "usage";
}

void
take_rerank(const JsonView &body, llmgw_usage_t &out)
{
    RerankCount c;

    if (rerank_count(body, c)) {
        out.prompt_tokens = c.count;
        out.known = 1;
    }
}

/* Bytes of a string member of o ("" when absent or not a string). */
size_t
text_of(const JsonView &o, std::string_view name)
{
    return o.get(name).string_length();
}

/*
 * Completion text, for estimates: the same members whether a stream's
 * chunk or a whole JSON answer carries them.  An OpenAI message or delta:
 * content, reasoning, tool arguments.
 */
size_t
openai_text_bytes(const JsonView &m)
{
    size_t n = text_of(m, "content") + text_of(m, "reasoning_content");

    m.get("tool_calls").each_element([&](const JsonView &t) {
        n += text_of(t.get("function"), "arguments");
    });
    return n;
}

/* An Anthropic content block or delta: text, thinking, a tool's input (as
   JSON text, whole or in pieces). */
size_t
anthropic_text_bytes(const JsonView &b)
{
    return text_of(b, "text") + text_of(b, "partial_json")
           + text_of(b, "thinking") + b.get("input").raw().size();
}

/* Gemini's candidates: text parts and function calls (their JSON). */
size_t
gemini_text_bytes(const JsonView &j)
{
    size_t n = 0;

    j.get("candidates").each_element([&](const JsonView &c) {
        c.get("content").get("parts").each_element([&](const JsonView &p) {
            n += text_of(p, "text") + p.get("functionCall").raw().size();
        });
    });
    return n;
}

/* Completion text carried by one streamed chunk. */
size_t
chunk_text(const JsonView &j)
{
    size_t n = 0;

    j.get("choices").each_element([&](const JsonView &c) {
        n += openai_text_bytes(c.get("delta"));
    });

    return n + anthropic_text_bytes(j.get("delta")) + gemini_text_bytes(j);
}

/* The usage-only chunk an injected include_usage produces. */
bool
is_usage_only(const JsonView &j)
{
    JsonView choices = j.get("choices");
    bool empty = choices.is_array();

    choices.each_element([&](const JsonView &) { empty = false; });
    return j.get("usage").is_object() && empty;
}

/*
 * The bytes of the string values of text-carrying members ("content",
 * "text", "reasoning_content", tool arguments, thinking) in a chunk, found
 * without parsing it: a stream is billed by them only when no usage (or
 * only a partial one) arrives.  JSON whitespace may stand around the colon
 * ("content": "..." as Python writes it), and an escape counts as the bytes
 * it stands for (\u00e9 is 2, \n is 1).
 */
size_t
scan_text(std::string_view data)
{
    static const std::string_view keys[] = {
        "\"content\"", "\"text\"", "\"reasoning_content\"",
        "\"arguments\"", "\"partial_json\"", "\"thinking\""
    };

    auto space = [&](size_t i) {
        while (i < data.size()
               && (data[i] == ' ' || data[i] == '\t' || data[i] == '\r'
                   || data[i] == '\n'))
        {
            i++;
        }
        return i;
    };

    size_t n = 0;

    for (std::string_view key : keys) {
        for (size_t at = data.find(key); at != std::string_view::npos;
             at = data.find(key, at + 1))
        {
            size_t i = space(at + key.size());

            if (i >= data.size() || data[i] != ':') {
                continue;
            }

            size_t open = space(i + 1);

            if (open >= data.size() || data[open] != '"') {
                continue;
            }

            i = open + 1;
            while (i < data.size() && data[i] != '"') {
                i += data[i] == '\\' ? 2 : 1;
            }

            if (i >= data.size()) {
                /* unterminated: its bytes as they are */
                n += data.size() - open - 1;
                continue;
            }

            std::string_view value = data.substr(open, i - open + 1);

            if (value.find('\\') == std::string_view::npos) {
                n += value.size() - 2;
                continue;
            }

            /* decoded as JsonView decodes any string (a document is an
               object or an array) */
            std::string one = "[" + std::string(value) + "]";
            JsonView v = JsonView::parse(one);
            size_t len = value.size() - 2;

            v.each_element([&](const JsonView &e) { len = e.string_length(); });
            n += len;
        }
    }

    return n;
}


/* Whether a chunk gives a finish reason ("finish_reason" or Gemini's
   "finishReason" as a string: OpenAI's chunks carry "finish_reason":null
   until the last), found without parsing it. */
bool
says_finish(std::string_view data, std::string_view key)
{
    for (size_t at = data.find(key); at != std::string_view::npos;
         at = data.find(key, at + 1))
    {
        size_t i = at + key.size();

        while (i < data.size()
               && (data[i] == ':' || data[i] == ' ' || data[i] == '\t'
                   || data[i] == '\r' || data[i] == '\n'))
        {
            i++;
        }

        if (i < data.size() && data[i] == '"') {
            return true;
        }
    }

    return false;
}


void
on_event(void *arg, const llmgw_sse_event_t *ev)
{
    auto *r = static_cast<llmgw_resp_s *>(arg);
    std::string_view data = sv(ev->data);
    JsonView j;

    /* only a chunk that carries usage is worth a parse */
    bool usage = data.find("\"usage") != std::string_view::npos;

    if (usage) {
        j = JsonView::parse(data);
    }

    bool drop = false;

    if (data == "[DONE]") {
        r->end_said = true;

    } else if (!data.empty()) {
        r->events++;
    }

    /* an error event (Anthropic's event: error; OpenAI's and Gemini's
       {"error": ...}) before any text: the stream failed, nothing to bill */
    if (r->text_bytes == 0 && !r->error_first
        && (sv(ev->event) == "error"
            || data.find("\"error\"") != std::string_view::npos))
    {
        JsonView e = j ? j : JsonView::parse(data);

        r->error_first = e.get("error").is_object()
                         || e.get("type").string_equals("error");
    }

    r->text_bytes += j ? chunk_text(j) : scan_text(data);

    if (j) {
        Wire w = wire_of(r->ep, r->type);

        if (w == Wire::openai) {
            take_usage(w, j, *r);
            r->final_usage = r->final_usage || j.get("usage").is_object();
            drop = r->usage_injected && is_usage_only(j);

        } else if (w == Wire::gemini) {
            take_usage(w, j, *r);
            j.get("candidates").each_element([&](const JsonView &c) {
                r->final_usage = r->final_usage
                                 || c.get("finishReason").string_length() > 0;
            });

        } else if (j.get("type").string_equals("message_start")) {
            take_anthropic(j.get("message").get("usage"), r->usage);

        } else if (j.get("type").string_equals("message_delta")) {
            take_anthropic(j.get("usage"), r->usage);
            r->final_usage = true;
        }
    }

    if (!r->end_said) {
        switch (wire_of(r->ep, r->type)) {
        case Wire::openai:
            r->end_said = says_finish(data, "\"finish_reason\"");
            break;
        case Wire::gemini:
            /* a finish reason, or the prompt's block reason (no candidate
               follows) */
            r->end_said = says_finish(data, "\"finishReason\"")
                          || says_finish(data, "\"blockReason\"");
            break;
        case Wire::anthropic:
            r->end_said = sv(ev->event) == "message_stop"
                          || sv(ev->event) == "message_delta"
                          || data.find("\"type\":\"message_stop\"")
                             != std::string_view::npos
                          || data.find("\"type\":\"message_delta\"")
                             != std::string_view::npos;
            break;
        }
    }

    if (r->conv) {
        (void) r->conv->event(sv(ev->event), data, r->out);
        return;
    }

    if (r->array) {
        std::string_view d = trim(data);

        if (!r->array_broken && !d.empty() && d != "[DONE]") {
            r->out.append(r->array_open ? ",\r\n" : "[").append(d);
            r->array_open = true;
        }
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
 * An error object under a 2xx and nothing else: OpenAI's and Gemini's
 * {"error": {...}}, Anthropic's {"type":"error"}, without the parts of an
 * answer (choices, candidates, content).  It is no answer: the next
 * channel, uncharged.  An answer with "error": null is one.
 */
bool
error_only(const JsonView &b)
{
    return (b.get("error").is_object() || b.get("type").string_equals("error"))
           && !b.get("choices") && !b.get("candidates") && !b.get("content")
           && !b.get("results");
}

void
finish_json(llmgw_resp_s &r)
{
    if (r.overflow) {
        /* too large to hold: the usage member taken on the way, if any */
        if (r.overflow_usage && !r.overflow_usage->value().empty()) {
            Wire w = wire_of(r.ep, r.type);
            std::string one = std::string("{\"") + usage_member(w) + "\":"
                              + r.overflow_usage->value() + "}";
            take_usage(w, JsonView::parse(one), r);
        }
        return;
    }

    JsonView b = JsonView::parse(r.body);

    r.valid = b.is_object() && !error_only(b);

    if (!b) {
        r.text_bytes = r.body.size();
        return;
    }

    if (r.ep == LLMGW_EP_RERANK) {
        /* without usage the query and documents are billed by the
           request's estimate; scores and echoed documents are no text
           the upstream wrote */
        take_rerank(b, r.usage);
        return;
    }

    take_usage(wire_of(r.ep, r.type), b, r);

    if (r.usage.known) {
        return;
    }

    /* the text a stream of it would have carried */
    b.get("choices").each_element([&](const JsonView &c) {
        r.text_bytes += openai_text_bytes(c.get("message"));
    });

    b.get("content").each_element([&](const JsonView &c) {
        r.text_bytes += anthropic_text_bytes(c);
    });

    r.text_bytes += gemini_text_bytes(b);
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
            /* an event as large as a JSON answer may be (inline audio or
               images): its usage is read like any other's */
            r->sse = llmgw_sse_new(kMaxJsonBody);
            if (r->sse == nullptr) {
                return nullptr;
            }
        } else {
            r->hold_json = true;
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


namespace {

/* The body (what was held of it) goes on unheld from here. */
void
overflow_begin(llmgw_resp_s &r)
{
    r.overflow = true;
    r.text_bytes += r.body.size();

    if (r.ep != LLMGW_EP_RERANK && !r.stream) {
        r.overflow_usage = std::make_unique<RootMember>(
            usage_member(wire_of(r.ep, r.type)));
        r.overflow_usage->feed(r.body);
    }
}

int
feed(llmgw_resp_t *r, const char *data, size_t len, llmgw_buf_t *out)
{
    out->data = nullptr;
    out->len = 0;

    try {
        if (!r->stream) {
            if (r->overflow) {
                /* past the JSON limit: passed on, billed by its usage
                   member, else by its size */
                r->text_bytes += len;
                if (r->overflow_usage) {
                    r->overflow_usage->feed(std::string_view(data, len));
                }
                return 0;
            }

            if (r->body.size() + len > kMaxJsonBody && r->hold_json
                && (r->convert_json || r->whole_for_stream))
            {
                /* too large to put in the client's shape, and its head is
                   out (only an answer its closing ends is held here): cut
                   short, no answer, nothing charged */
                r->hold_json = false;
                r->valid = false;
                r->body.clear();
                r->body.shrink_to_fit();
                return -1;
            }

            if (r->body.size() + len > kMaxJsonBody && r->hold_json) {
                /* too large to hold: what was held and the rest go out as
                   they came */
                r->hold_json = false;
                r->body.append(data, len);
                overflow_begin(*r);
                *out = make_buf(r->body);
                r->body.clear();
                r->body.shrink_to_fit();
                return out->data ? 0 : -1;
            }

            if (r->body.size() + len > kMaxJsonBody) {
                r->body.append(data, len);
                overflow_begin(*r);
                r->body.clear();
                r->body.shrink_to_fit();
            } else {
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

        bool filtering = r->usage_injected && r->conv == nullptr;
        bool failed = llmgw_sse_feed(r->sse, data, len, on_event, r) != 0;
        size_t b = llmgw_sse_boundary(r->sse);
        std::string_view in(data, len);

        if (failed && r->conv == nullptr) {
            /*
             * An oversized event.  Filtered (the events re-framed, the
             * usage chunk hidden), what was taken of it goes out as it
             * came, and from here every byte does, the usage chunk too.
             * A new parser reads what follows for the usage (it skips the
             * rest of the oversized event as lines it does not know).
             */
            if (filtering) {
                if (b == SIZE_MAX) {
                    r->out.append(r->raw_tail).append(in);
                } else {
                    r->out.append(in.substr(b));
                }
                r->usage_injected = false;
                *out = make_buf(r->out);
                if (out->data == nullptr) {
                    return -1;
                }
            }

            r->raw_tail.clear();
            r->raw_tail.shrink_to_fit();

            /* the new parser starts where the oversized event did in this
               read (its events may follow in the same read) */
            std::string_view rest = b == SIZE_MAX ? in : in.substr(b);

            /* it went out (or, in an array, was lost): an event, whose
               contents are not estimated (such events carry inline media,
               not text) */
            r->events++;
            r->array_broken = r->array_broken || r->array;

            for (int again = 0; again < 2; again++) {
                llmgw_sse_free(r->sse);
                r->sse = llmgw_sse_new(kMaxJsonBody);
                if (r->sse == nullptr) {
                    return -1;
                }
                if (again == 0) {
                    r->out.clear();
                    if (llmgw_sse_feed(r->sse, rest.data(), rest.size(),
                                       on_event, r) == 0)
                    {
                        break;
                    }
                }
            }

            if (r->array) {
                /* none of the events' bytes go out as they came */
                *out = make_buf("");
                return out->data ? 0 : -1;
            }
            return 0;
        }

        if (filtering) {
            /* the raw bytes of the event under way, should it grow too
               large to be re-framed */
            if (b == SIZE_MAX) {
                r->raw_tail.append(in);
            } else {
                r->raw_tail.assign(in.substr(b));
            }
        }

        if (r->usage_injected || r->conv || r->array) {
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


/*
 * The held JSON answer in the client's format (or as it came).  An answer
 * that cannot be put in the client's format (an error object under a 2xx,
 * say) is no answer: it is marked invalid, and goes to the next channel
 * uncharged like any 2xx that holds no answer.
 */
/* What the ledger row will say: the usage as llmgw_resp_usage() reads it,
   the prompt the request's estimate when no usage came. */
llmgw_usage_t
billed(const llmgw_resp_s &r)
{
    llmgw_usage_t u;

    llmgw_resp_usage(&r, &u);

    if (!u.known) {
        u.prompt_tokens = r.prompt_estimate;
    }

    return u;
}

/*
 * Whether a JSON body in the client's own format is an answer a stream can
 * be made of: an error object (OpenAI's and Gemini's {"error": ...},
 * Anthropic's {"type":"error"}) is none, nor is a body without the parts
 * the converted path requires (a chat answer's choices[0].message, a
 * Messages answer's content).
 */
bool
is_answer(llmgw_endpoint_e client, const json_t *a)
{
    if (!json_is_object(a) || json_is_object(json_object_get(a, "error"))
        || json_str(a, "type") == "error")
    {
        return false;
    }

    switch (client) {
    case LLMGW_EP_CHAT:
        return json_is_object(json_object_get(
                   json_array_get(json_object_get(a, "choices"), 0),
                   "message"));
    case LLMGW_EP_MESSAGES:
        return json_is_array(json_object_get(a, "content"));
    default:
        return true;
    }
}

std::string
converted_json(llmgw_resp_s &r)
{
    if (!r.convert_json && !r.whole_for_stream) {
        return r.body;
    }

    Json in = json_parse(r.body.data(), r.body.size());
    Json out;
    std::string err;

    if (in && r.whole_for_stream) {
        bool same = !can_convert(r.client, r.type);
        if (same ? is_answer(r.client, in.get())
                 : convert_response(r.type, r.client, in.get(),
                                    r.client_model, out, err))
        {
            json_t *a = same ? in.get() : out.get();
            bool    with_usage = json_is_true(json_object_get(
                                     json_object_get(r.client_req,
                                                     "stream_options"),
                                     "include_usage"));

            if (!same || !json_is_object(json_object_get(a, "usage"))) {
                /* converted, or none came: it says what is billed */
                show_billed_usage(r.client, a, billed(r));
            }

            if (r.array) {
                return "[" + json_dump(a) + "]";
            }

            return stream_of_answer(r.client, a, with_usage);
        }
        r.valid = false;
        return std::string();
    }

    if (in) {
        bool ok = r.client == LLMGW_EP_RERANK
                  ? rerank_response(r.type, in.get(), r.client_req, out, err)
                  : convert_response(r.type, r.client, in.get(),
                                     r.client_model, out, err);
        if (ok) {
            show_billed_usage(r.client, out.get(), billed(r));
            return json_dump(out.get());
        }
    }

    r.valid = false;
    return std::string();
}


int
finish(llmgw_resp_t *r, llmgw_buf_t *out)
{
    out->data = nullptr;
    out->len = 0;

    try {
        r->finished = true;

        if (!r->stream) {
            finish_json(*r);

            if (r->hold_json) {
                *out = make_buf(converted_json(*r));
            }

        } else if (r->conv) {
            std::string tail;
            r->conv->finish(tail);
            *out = make_buf(tail);

        } else if (r->array && r->array_open && !llmgw_resp_cut(r)) {
            /* one cut short (or of no answer at all) stays unclosed: a
               reader sees it is not whole */
            *out = make_buf("]");
        }

        return 0;

    } catch (...) {
        return -1;
    }
}



/*
 * What the client gets for `produced` (the bytes fed or what they became),
 * with the credential taken out.  The end of the text that may begin a
 * copy split over two reads waits for the next; `last` hands it out.
 */
int
masked(llmgw_resp_t *r, const char *data, size_t len, llmgw_buf_t *out,
    bool last)
{
    if (r->secret_forms->empty()) {
        return 0;
    }

    std::string_view produced = out->data ? std::string_view(out->data,
                                                             out->len)
                                          : std::string_view(data, len);
    std::string joined;
    std::string_view text = produced;

    if (!r->secret_tail.empty()) {
        joined = r->secret_tail + std::string(produced);
        text = joined;
    }

    bool found = false;

    for (const std::string &f : *r->secret_forms) {
        found = found || text.find(f) != std::string_view::npos;
    }

    std::string clean;
    if (found) {
        clean = redact(text, r->secret);
        text = clean;
    }

    /* the longest end of the text that begins the credential (or one of
       its spellings) waits for the next bytes */
    size_t hold = 0;

    if (!last) {
        for (const std::string &f : *r->secret_forms) {
            size_t from = text.size() >= f.size() ? text.size() - f.size() + 1
                                                  : 0;
            for (size_t at = from; at < text.size(); at++) {
                if (f.compare(0, text.size() - at, text.substr(at)) == 0) {
                    hold = std::max(hold, text.size() - at);
                    break;
                }
            }
        }
    }

    if (!found && hold == 0 && r->secret_tail.empty()) {
        return 0;
    }

    std::string send(text.substr(0, text.size() - hold));
    r->secret_tail.assign(text.substr(text.size() - hold));

    llmgw_buf_free(out);
    *out = make_buf(send);
    return out->data ? 0 : -1;
}

} /* namespace */


extern "C" int
llmgw_resp_feed(llmgw_resp_t *r, const char *data, size_t len,
    llmgw_buf_t *out)
{
    try {
        return feed(r, data, len, out) == 0
               ? masked(r, data, len, out, false) : -1;

    } catch (...) {
        return -1;
    }
}


extern "C" int
llmgw_resp_finish(llmgw_resp_t *r, llmgw_buf_t *out)
{
    try {
        if (finish(r, out) != 0) {
            return -1;
        }

        if (out->data == nullptr && r->secret_tail.empty()) {
            return 0;
        }

        if (out->data == nullptr) {
            *out = make_buf("");
            if (out->data == nullptr) {
                return -1;
            }
        }

        return masked(r, nullptr, 0, out, true);

    } catch (...) {
        return -1;
    }
}


extern "C" void
llmgw_resp_secret(llmgw_resp_t *r, const char *key, size_t len,
    const char *request_id, size_t id_len)
{
    try {
        r->own_request_id.assign(request_id, id_len);
        r->request_id = r->own_request_id;
        r->own_secret.assign(key, len);
        r->secret = r->own_secret;
        r->secret_forms = &r->own_forms;
        /* in answers a short key may be a word of the text ("lm-studio",
           a placeholder of local servers): only a long one is masked */
        if (len >= kSecretInAnswersMinBytes) {
            r->own_forms = credential_forms(r->secret);
        }

    } catch (...) {
        r->own_forms.clear();
    }
}


extern "C" void
llmgw_resp_secret_channel(llmgw_resp_t *r, const llmgw_channel_t *ch,
    const char *request_id, size_t id_len)
{
    /* the channel and the id outlive the response (see llmgw.h) */
    r->request_id = std::string_view(request_id, id_len);
    r->secret = ch->key != nullptr ? std::string_view(ch->key)
                                   : std::string_view();
    r->secret_forms = &r->own_forms;

    if (r->secret.size() >= kSecretInAnswersMinBytes
        && ch->key_forms != nullptr)
    {
        r->secret_forms = static_cast<const std::vector<std::string> *>(
                              ch->key_forms);
    }
}


extern "C" int
llmgw_resp_convert(llmgw_resp_t *r, const llmgw_req_t *req)
{
    try {
        llmgw_endpoint_e client = req_endpoint(req);

        r->client = client;

        if (client != LLMGW_EP_RERANK && !can_convert(client, r->type)
            && !r->whole_for_stream)
        {
            return 0;
        }

        /* answers passed through unchanged never need the request's tree */
        const json_t *body = req_json(req);

        r->client_req = body;
        r->client_model = json_str(body, "model");
        r->prompt_estimate = llmgw_req_prompt_estimate(req);

        if (r->whole_for_stream) {
            r->hold_json = true;
            return 0;
        }

        if (!r->stream) {
            r->convert_json = true;
            return 0;
        }

        if (client == LLMGW_EP_RERANK) {
            return 0;
        }

        r->conv = std::make_unique<StreamConverter>(r->type, client,
                                                    r->client_model);
        if (!r->conv->usable()) {
            r->conv.reset();
            return -1;
        }

        r->conv->request_id(std::string(r->request_id));
        r->conv->billed_usage([r] { return billed(*r); });
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
llmgw_resp_valid(const llmgw_resp_t *r)
{
    return r->stream || r->overflow || r->valid;
}


extern "C" int
llmgw_resp_holds(const llmgw_resp_t *r)
{
    return r->hold_json;
}


extern "C" int
llmgw_resp_cut(const llmgw_resp_t *r)
{
    if (r->conv != nullptr) {
        return r->conv->cut();
    }

    /* passed on as it came: events went out, and the upstream ended the
       stream without saying it was done (also after an error event that
       came after text; one that came first makes the answer a failure) */
    return r->array_broken
           || (r->stream && r->events > 0 && !r->error_first
               && !r->end_said);
}


extern "C" int
llmgw_resp_reshapes(const llmgw_resp_t *r)
{
    return r->convert_json || r->whole_for_stream;
}


extern "C" size_t
llmgw_resp_held(const llmgw_resp_t *r)
{
    return r->hold_json ? r->body.size() : 0;
}


extern "C" int
llmgw_resp_release(llmgw_resp_t *r, llmgw_buf_t *out)
{
    try {
        /* the same as a feed past kMaxJsonBody, before it */
        *out = make_buf(r->body);
        if (out->data == nullptr || masked(r, nullptr, 0, out, false) != 0) {
            return -1;
        }

        r->hold_json = false;
        r->convert_json = false;
        overflow_begin(*r);
        r->body.clear();
        r->body.shrink_to_fit();
        return 0;

    } catch (...) {
        return -1;
    }
}


extern "C" size_t
llmgw_resp_hold_max(void)
{
    return kMaxJsonBody;
}


extern "C" void
llmgw_resp_whole_for_stream(llmgw_resp_t *r)
{
    r->whole_for_stream = true;
}


extern "C" void
llmgw_resp_array(llmgw_resp_t *r)
{
    r->array = r->ep == LLMGW_EP_GEMINI;
}


extern "C" int
llmgw_resp_rewrites(const llmgw_resp_t *r)
{
    return r->hold_json || r->conv != nullptr || r->usage_injected
           || r->array
           || !r->secret_forms->empty();
}


extern "C" int
llmgw_resp_failed(const llmgw_resp_t *r, int client_gone)
{
    if (!r->stream) {
        /* only an answer the upstream's closing ended gets here unread
           (the others were checked whole before their head) */
        return r->finished && !client_gone && !llmgw_resp_valid(r);
    }

    if (r->text_bytes > 0) {
        return 0;
    }

    /* its error came first; or the upstream ended it without one event
       (a reader who left first still pays for the prompt) */
    return r->error_first || (r->events == 0 && !client_gone);
}


extern "C" void
llmgw_resp_usage(const llmgw_resp_t *r, llmgw_usage_t *u)
{
    /* what an upstream says is bounded: never below 0 (a credit), never
       past 2^40 tokens (where the quota arithmetic would overflow) */
    static constexpr int64_t kMaxTokens = int64_t(1) << 40;
    auto bound = [](int64_t v) { return std::clamp<int64_t>(v, 0, kMaxTokens); };

    *u = r->usage;

    int64_t estimate = static_cast<int64_t>(r->text_bytes / 4);

    if (!u->known) {
        u->completion_tokens = estimate;

    } else if (r->stream && !r->final_usage) {
        /* cut before the final count: what was reported so far (Anthropic's
           message_start says 1) or what was delivered, whichever is more */
        u->completion_tokens = std::max(u->completion_tokens, estimate);
    }

    u->prompt_tokens = bound(u->prompt_tokens);
    u->completion_tokens = bound(u->completion_tokens);
    u->cache_read_tokens = bound(u->cache_read_tokens);
    u->cache_creation_tokens = bound(u->cache_creation_tokens);
}


namespace llmgw {

bool
rerank_count(const JsonView &upstream, RerankCount &c)
{
    JsonView billed = upstream.get("meta").get("billed_units");
    JsonView u = upstream.get("usage");

    /* billed units that hold no count ({}) leave the usage to read */
    if (billed.is_object()) {
        int64_t units = 0, input = 0;
        const CountField fields[] = {
            { "search_units", &units },
            { "input_tokens", &input },
        };

        if (take_counts(billed, fields, false) > 0) {
            bool by_units = units != 0
                            || !billed.get("input_tokens").is_number();

            c.billed_units = true;
            c.name = by_units ? "search_units" : "input_tokens";
            c.count = by_units ? units : input;
            return true;
        }
    }

    if (u.is_object()) {
        int64_t total = 0, prompt = 0;
        const CountField fields[] = {
            { "total_tokens", &total },
            { "prompt_tokens", &prompt },
        };

        if (take_counts(u, fields, false) > 0) {
            c.billed_units = false;
            c.name = "input_tokens";
            c.count = u.get("total_tokens").is_number() ? total : prompt;
            return true;
        }
    }

    return false;
}

} /* namespace llmgw */
