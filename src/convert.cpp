/*
 * Format conversion between client formats and channel formats.  The
 * shapes are the vendors' documented ones; where one format has something
 * the other lacks, the comment at that spot says what happens to it.
 */

#include <openssl/rand.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstring>
#include <ctime>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "convert.h"
#include "jsonview.h"

namespace llmgw {

namespace {

/* Anthropic refuses a request without max_tokens; OpenAI clients often
 * leave it out. */
constexpr int64_t kDefaultMaxTokens = LLMGW_CONVERTED_MAX_TOKENS;

/* Gemini 3 refuses replayed function calls that lack the signature it
 * made; history written by another vendor has none, and Google documents
 * this value for exactly that case. */
constexpr std::string_view kGeminiNoSignature =
    "skip_thought_signature_validator";

/* Schema keys Gemini's OpenAPI subset knows; it refuses any other key
 * ("additionalProperties", "$schema", ...) with a 400. */
const char *const kGeminiSchemaKeys[] = {
    "type", "format", "title", "description", "nullable", "enum",
    "maxItems", "minItems", "required", "minProperties", "maxProperties",
    "minLength", "maxLength", "pattern", "example", "propertyOrdering",
    "default", "minimum", "maximum",
};

constexpr int kMaxSchemaDepth = 32;

/* Putting $refs in place can make a small schema huge (a chain of
   definitions each using the next twice): past this many schemas, it is
   refused. */
constexpr size_t kMaxSchemaNodes = 4096;

const char kHex[] = "0123456789abcdef";


/* ---- small JSON and text helpers ---- */

json_t *
jstr(std::string_view s)
{
    json_t *j = json_stringn(s.empty() ? "" : s.data(), s.size());

    if (j != nullptr) {
        return j;
    }

    /* only text from outside jansson (model names) can be invalid UTF-8 */
    std::string ascii(s);

    for (char &c : ascii) {
        if (static_cast<unsigned char>(c) >= 0x80) {
            c = '?';
        }
    }

    return json_stringn(ascii.data(), ascii.size());
}


void
put(json_t *obj, const char *key, json_t *v)
{
    json_object_set_new(obj, key, v);
}


void
put(json_t *obj, const char *key, std::string_view s)
{
    json_object_set_new(obj, key, jstr(s));
}


void
put_int(json_t *obj, const char *key, int64_t n)
{
    json_object_set_new(obj, key, json_integer(n));
}


/* A deep copy, so that the output never shares nodes with the input. */
void
put_copy(json_t *obj, const char *key, const json_t *v)
{
    if (v != nullptr) {
        json_object_set_new(obj, key, json_deep_copy(v));
    }
}


void
copy_number(json_t *dst, const char *dkey, const json_t *src,
    const char *skey)
{
    const json_t *v = json_object_get(src, skey);

    if (json_is_number(v)) {
        put_copy(dst, dkey, v);
    }
}


void
append(json_t *array, json_t *v)
{
    json_array_append_new(array, v);
}


json_t *
text_block(std::string_view text)
{
    json_t *b = json_object();

    put(b, "type", "text");
    put(b, "text", text);

    return b;
}


json_t *
object_schema()
{
    json_t *s = json_object();

    put(s, "type", "object");
    put(s, "properties", json_object());

    return s;
}


std::string
random_hex(size_t bytes)
{
    static std::atomic<uint64_t> counter { 0 };
    unsigned char buf[32];

    bytes = std::min(bytes, sizeof(buf));

    if (RAND_bytes(buf, static_cast<int>(bytes)) != 1) {
        /* ids must be unique, not secret */
        uint64_t v = static_cast<uint64_t>(std::time(nullptr)) * 1000003u
                     + counter++;
        for (size_t i = 0; i < bytes; i++) {
            buf[i] = static_cast<unsigned char>(v >> (8 * (i % 8)));
        }
    }

    std::string out;

    for (size_t i = 0; i < bytes; i++) {
        out.push_back(kHex[buf[i] >> 4]);
        out.push_back(kHex[buf[i] & 0x0f]);
    }

    return out;
}


std::string
at(std::string_view base, size_t i)
{
    std::string s(base);

    s += '[';
    s += std::to_string(i);
    s += ']';

    return s;
}


void
append_line(std::string &s, std::string_view t)
{
    if (t.empty()) {
        return;
    }

    if (!s.empty()) {
        s += '\n';
    }

    s += t;
}


/* A string, or the type member of an object ({"type":"auto"}). */
std::string_view
mode_of(const json_t *v)
{
    if (json_is_string(v)) {
        return std::string_view(json_string_value(v), json_string_length(v));
    }

    return json_str(v, "type");
}


/* Text of an OpenAI content value: a string, or its text parts. */
std::string
openai_text(const json_t *content)
{
    if (json_is_string(content)) {
        return std::string(json_string_value(content),
                           json_string_length(content));
    }

    std::string out;
    size_t      i;
    json_t     *part;

    json_array_foreach(content, i, part) {
        std::string_view type = json_str(part, "type");

        if (type == "text" || type.empty()) {
            append_line(out, json_str(part, "text"));
        } else if (type == "refusal") {
            append_line(out, json_str(part, "refusal"));
        }
    }

    return out;
}


/* Text of an Anthropic content value: a string, or its text blocks. */
std::string
anthropic_text(const json_t *content)
{
    return openai_text(content);
}


/* Tool arguments as an object: OpenAI sends a JSON string, which may be
 * cut or empty; the other vendors need an object. */
json_t *
arguments_object(const json_t *args)
{
    if (json_is_object(args)) {
        return json_deep_copy(args);
    }

    if (json_is_string(args)) {
        Json j = json_parse(json_string_value(args),
                            json_string_length(args));
        if (json_is_object(j.get())) {
            return j.release();
        }
    }

    return json_object();
}


std::string
arguments_text(const json_t *input)
{
    if (!json_is_object(input)) {
        return "{}";
    }

    std::string s = json_dump(input);

    return s.empty() ? "{}" : s;
}


/* Anthropic tool ids must match ^[a-zA-Z0-9_-]+$; other vendors' ids
 * ("functions.get:0") are mapped the same way wherever they appear. */
std::string
anthropic_id(std::string_view id)
{
    std::string out(id);

    for (char &c : out) {
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
                  || (c >= '0' && c <= '9') || c == '_' || c == '-';
        if (!ok) {
            c = '_';
        }
    }

    return out;
}


bool
is_http_url(std::string_view url)
{
    return url.substr(0, 7) == "http://" || url.substr(0, 8) == "https://";
}


struct DataUrl {
    std::string_view  mime;
    std::string_view  data;
};


/* data:<mime>[;param]*;base64,<data>; only base64 payloads are media. */
bool
parse_data_url(std::string_view url, DataUrl &d)
{
    constexpr std::string_view b64 = ";base64";

    if (url.substr(0, 5) != "data:") {
        return false;
    }

    size_t comma = url.find(',');

    if (comma == std::string_view::npos) {
        return false;
    }

    std::string_view meta = url.substr(5, comma - 5);

    if (meta.size() < b64.size()
        || meta.substr(meta.size() - b64.size()) != b64)
    {
        return false;
    }

    d.mime = meta.substr(0, meta.find(';'));
    d.data = url.substr(comma + 1);

    return !d.mime.empty() && !d.data.empty();
}


/* The URL of an OpenAI image part: {"image_url":{"url"}} or a string. */
std::string_view
openai_image_url(const json_t *part)
{
    const json_t *iu = json_object_get(part, "image_url");

    if (json_is_string(iu)) {
        return std::string_view(json_string_value(iu),
                                json_string_length(iu));
    }

    return json_str(iu, "url");
}


/* The stop value of OpenAI (string or array) as a list, or nullptr. */
json_t *
stop_list(const json_t *stop)
{
    Json list(json_array());
    size_t i;
    json_t *s;

    if (json_is_string(stop) && json_string_length(stop) > 0) {
        json_array_append(list.get(), const_cast<json_t *>(stop));
    }

    json_array_foreach(stop, i, s) {
        if (json_is_string(s) && json_string_length(s) > 0) {
            json_array_append(list.get(), s);
        }
    }

    return json_array_size(list.get()) > 0 ? list.release() : nullptr;
}


int64_t
openai_max_tokens(const json_t *in)
{
    int64_t n = json_int(in, "max_completion_tokens", -1);

    return n > 0 ? n : json_int(in, "max_tokens", -1);
}


/*
 * Adds content to a conversation, merged into the last turn when the role
 * repeats: Anthropic and Gemini both want turns to alternate.
 */
void
append_turn(json_t *turns, std::string_view role, const char *items_key,
    Json items)
{
    if (json_array_size(items.get()) == 0) {
        return;
    }

    size_t  n = json_array_size(turns);
    json_t *last = n > 0 ? json_array_get(turns, n - 1) : nullptr;

    if (last != nullptr && json_str(last, "role") == role) {
        json_array_extend(json_object_get(last, items_key), items.get());
        return;
    }

    json_t *turn = json_object();

    put(turn, "role", role);
    json_object_set(turn, items_key, items.get());
    append(turns, turn);
}


/* ---- OpenAI chat -> Anthropic messages ---- */

struct AnthropicBuild {
    json_t       *messages;
    json_t       *system;       /* text blocks */
    bool          tool_history = false;
};


/* An image or document block from an http(s) or base64 data URL. */
json_t *
anthropic_media(const char *type, std::string_view url)
{
    DataUrl d;
    Json source(json_object());

    if (parse_data_url(url, d)) {
        put(source.get(), "type", "base64");
        /* a common misspelling that Anthropic refuses */
        put(source.get(), "media_type",
            d.mime == "image/jpg" ? std::string_view("image/jpeg") : d.mime);
        put(source.get(), "data", d.data);
    } else if (is_http_url(url)) {
        put(source.get(), "type", "url");
        put(source.get(), "url", url);
    } else {
        return nullptr;
    }

    json_t *b = json_object();

    put(b, "type", type);
    put(b, "source", source.release());

    return b;
}


/* One OpenAI content part as an Anthropic block; nullptr + err if not. */
json_t *
anthropic_part(const json_t *part, const std::string &where,
    std::string &err)
{
    std::string_view type = json_str(part, "type");
    json_t *b = nullptr;

    if (type == "text" || type == "refusal" || type.empty()) {
        b = text_block(json_str(part, type == "refusal" ? "refusal"
                                                        : "text"));
        /* prompt-caching hints some clients put on OpenAI parts */
        put_copy(b, "cache_control", json_object_get(part, "cache_control"));
        return b;
    }

    if (type == "image_url") {
        b = anthropic_media("image", openai_image_url(part));
    } else if (type == "file") {
        b = anthropic_media("document",
                            json_str(json_object_get(part, "file"),
                                     "file_data"));
    } else {
        err = where + ": part type \"" + std::string(type)
              + "\" cannot be sent to this channel";
        return nullptr;
    }

    if (b == nullptr) {
        err = where + ": only http(s) URLs and base64 data URLs can be sent";
    }

    return b;
}


/*
 * An OpenAI content value as Anthropic blocks.  text_only: the turn holds
 * text alone (system, assistant), other parts are left out.
 */
bool
anthropic_parts(const json_t *content, const std::string &where,
    json_t *blocks, bool text_only, std::string &err)
{
    if (json_is_string(content)) {
        if (json_string_length(content) > 0) {
            append(blocks, text_block(json_string_value(content)));
        }
        return true;
    }

    if (content == nullptr || json_is_null(content)) {
        return true;
    }

    if (!json_is_array(content)) {
        err = where + ".content must be a string or an array";
        return false;
    }

    size_t  i;
    json_t *part;

    json_array_foreach(content, i, part) {
        std::string_view type = json_str(part, "type");
        bool text = type == "text" || type == "refusal" || type.empty();

        /* Anthropic refuses empty text blocks */
        if ((text && json_str(part, type == "refusal" ? "refusal"
                                                      : "text").empty())
            || (!text && text_only))
        {
            continue;
        }

        json_t *b = anthropic_part(part, at(where + ".content", i), err);

        if (b == nullptr) {
            return false;
        }

        append(blocks, b);
    }

    return true;
}


/*
 * Blocks that are text and nothing else (no other block, no cache_control
 * hint) as one text, joined as openai_text() joins parts: such content
 * goes in the shape it always had; false when a block says more.
 */
bool
plain_text(const json_t *blocks, std::string &text)
{
    size_t  i;
    json_t *b;

    json_array_foreach(blocks, i, b) {
        if (json_str(b, "type") != "text" || json_object_size(b) != 2) {
            return false;
        }
        append_line(text, json_str(b, "text"));
    }

    return true;
}


bool
anthropic_tool_use(const json_t *tc, const std::string &where,
    json_t *blocks, std::string &err)
{
    const json_t *fn = json_object_get(tc, "function");
    std::string_view id = json_str(tc, "id");
    std::string_view name = json_str(fn, "name");

    if (id.empty()) {
        err = where + ".id is required";
        return false;
    }

    if (name.empty()) {
        err = where + ".function.name is required";
        return false;
    }

    json_t *b = json_object();

    put(b, "type", "tool_use");
    put(b, "id", anthropic_id(id));
    put(b, "name", name);
    put(b, "input", arguments_object(json_object_get(fn, "arguments")));
    append(blocks, b);

    return true;
}


bool
anthropic_assistant(const json_t *m, const std::string &where,
    AnthropicBuild &b, std::string &err)
{
    Json blocks(json_array());
    std::string text;
    size_t  i;
    json_t *tc;

    if (!anthropic_parts(json_object_get(m, "content"), where, blocks.get(),
                         true, err))
    {
        return false;
    }

    if (plain_text(blocks.get(), text)) {
        json_array_clear(blocks.get());
        if (!text.empty()) {
            append(blocks.get(), text_block(text));
        }
    }

    json_array_foreach(json_object_get(m, "tool_calls"), i, tc) {
        if (!anthropic_tool_use(tc, at(where + ".tool_calls", i),
                                blocks.get(), err))
        {
            return false;
        }
        b.tool_history = true;
    }

    append_turn(b.messages, "assistant", "content", std::move(blocks));
    return true;
}


bool
anthropic_tool_result(const json_t *m, const std::string &where,
    AnthropicBuild &b, std::string &err)
{
    std::string_view id = json_str(m, "tool_call_id");

    if (id.empty()) {
        err = where + ".tool_call_id is required";
        return false;
    }

    Json blocks(json_array());
    Json content(json_array());
    json_t *r = json_object();
    std::string text;

    /* a result's images and documents are blocks of its content */
    if (!anthropic_parts(json_object_get(m, "content"), where, content.get(),
                         false, err))
    {
        return false;
    }

    put(r, "type", "tool_result");
    put(r, "tool_use_id", anthropic_id(id));
    if (plain_text(content.get(), text)) {
        if (!text.empty()) {
            put(r, "content", text);
        }
    } else {
        put(r, "content", content.release());
    }
    append(blocks.get(), r);

    b.tool_history = true;
    append_turn(b.messages, "user", "content", std::move(blocks));
    return true;
}


bool
anthropic_message(const json_t *m, size_t i, AnthropicBuild &b,
    std::string &err)
{
    std::string where = at("messages", i);
    std::string_view role = json_str(m, "role");

    if (role == "system" || role == "developer") {
        return anthropic_parts(json_object_get(m, "content"), where,
                               b.system, true, err);
    }

    if (role == "user") {
        Json blocks(json_array());

        if (!anthropic_parts(json_object_get(m, "content"), where,
                             blocks.get(), false, err))
        {
            return false;
        }

        append_turn(b.messages, "user", "content", std::move(blocks));
        return true;
    }

    if (role == "assistant") {
        return anthropic_assistant(m, where, b, err);
    }

    if (role == "tool") {
        return anthropic_tool_result(m, where, b, err);
    }

    err = where + ".role \"" + std::string(role)
          + "\" cannot be sent to this channel";
    return false;
}


/*
 * Anthropic wants a user turn to open with its tool_result blocks, and
 * Gemini its functionResponse parts (as many as the calls before them):
 * what else the turn holds (a result's images, the user's text) follows.
 */
void
results_first(json_t *turns, const char *items_key,
    bool (*is_result)(const json_t *item))
{
    size_t  i;
    json_t *m;

    json_array_foreach(turns, i, m) {
        json_t *items = json_object_get(m, items_key);
        Json sorted(json_array());

        for (bool results : { true, false }) {
            size_t  k;
            json_t *item;

            json_array_foreach(items, k, item) {
                if (is_result(item) == results) {
                    json_array_append(sorted.get(), item);
                }
            }
        }

        json_object_set(m, items_key, sorted.get());
    }
}


bool
is_tool_result(const json_t *block)
{
    return json_str(block, "type") == "tool_result";
}


/*
 * A conversation that ends with the client's turn must end so once
 * converted: an empty last message left out would leave the assistant's
 * turn last (Anthropic continues it as a prefill instead of answering) or
 * no turn at all (Gemini refuses that), so it is refused, named.
 */
bool
ends_with_client(const json_t *msgs, const json_t *turns,
    std::string_view user_role, std::string &err)
{
    size_t n = json_array_size(turns);

    for (size_t k = json_array_size(msgs); k-- > 0;) {
        std::string_view role = json_str(json_array_get(msgs, k), "role");

        if (role == "system" || role == "developer") {
            continue;
        }

        if ((role == "user" || role == "tool")
            && (n == 0
                || json_str(json_array_get(turns, n - 1), "role")
                   != user_role))
        {
            err = at("messages", k) + ": an empty message cannot end the "
                  "conversation on this channel";
            return false;
        }
        break;
    }

    if (n == 0) {
        err = "messages: a conversation without a message that has content "
              "cannot be sent to this channel";
        return false;
    }

    return true;
}


bool
anthropic_tools(const json_t *tools, json_t *body, std::string &err)
{
    Json    out(json_array());
    size_t  i;
    json_t *t;

    json_array_foreach(tools, i, t) {
        std::string_view type = json_str(t, "type");
        const json_t *fn = json_object_get(t, "function");
        const json_t *params = json_object_get(fn, "parameters");

        if (!type.empty() && type != "function") {
            err = at("tools", i) + ": tool type \"" + std::string(type)
                  + "\" cannot be sent to this channel";
            return false;
        }

        if (json_str(fn, "name").empty()) {
            err = at("tools", i) + ".function.name is required";
            return false;
        }

        json_t *o = json_object();

        put(o, "name", json_str(fn, "name"));
        if (!json_str(fn, "description").empty()) {
            put(o, "description", json_str(fn, "description"));
        }
        put(o, "input_schema", json_is_object(params)
                               ? json_deep_copy(params) : object_schema());
        append(out.get(), o);
    }

    if (json_array_size(out.get()) > 0) {
        put(body, "tools", out.release());
    }

    return true;
}


bool
anthropic_tool_choice(const json_t *in, json_t *body, bool tool_history,
    std::string &err)
{
    const json_t *choice = json_object_get(in, "tool_choice");
    std::string_view mode = mode_of(choice);
    bool serial = json_is_false(json_object_get(in, "parallel_tool_calls"));
    Json tc(json_object());

    if (json_object_get(body, "tools") == nullptr) {
        return true;
    }

    if (mode == "none") {
        /*
         * Dropping the tools is what every Anthropic-compatible server
         * understands; but a history with tool blocks needs the tools
         * declared, so then they stay and the choice says none.
         */
        if (!tool_history) {
            json_object_del(body, "tools");
            return true;
        }
        put(tc.get(), "type", "none");

    } else if (mode == "required") {
        put(tc.get(), "type", "any");

    } else if (mode == "function") {
        std::string_view name = json_str(json_object_get(choice, "function"),
                                         "name");
        if (name.empty()) {
            err = "tool_choice.function.name is required";
            return false;
        }
        put(tc.get(), "type", "tool");
        put(tc.get(), "name", name);

    } else if (mode.empty() || mode == "auto") {
        if (!serial) {
            return true;
        }
        put(tc.get(), "type", "auto");

    } else {
        err = "tool_choice \"" + std::string(mode) + "\" is not supported";
        return false;
    }

    if (serial && mode != "none") {
        put(tc.get(), "disable_parallel_tool_use", json_true());
    }

    put(body, "tool_choice", tc.release());
    return true;
}


void
anthropic_params(const json_t *in, json_t *body)
{
    int64_t max = openai_max_tokens(in);
    const json_t *t = json_object_get(in, "temperature");

    put_int(body, "max_tokens", max > 0 ? max : kDefaultMaxTokens);

    /* OpenAI allows 0..2, Anthropic 0..1: clamp rather than fail */
    if (json_is_number(t)) {
        put(body, "temperature",
            json_real(std::clamp(json_number_value(t), 0.0, 1.0)));
    }

    /* top_p 1 samples from everything, as if it were not given; newer
       Claude models refuse a request with both it and a temperature */
    const json_t *top_p = json_object_get(in, "top_p");
    if (json_is_number(top_p) && json_number_value(top_p) < 1.0) {
        copy_number(body, "top_p", in, "top_p");
    }

    if (json_t *stop = stop_list(json_object_get(in, "stop"))) {
        put(body, "stop_sequences", stop);
    }

    if (json_is_true(json_object_get(in, "stream"))) {
        put(body, "stream", json_true());
    }

    if (!json_str(in, "user").empty()) {
        json_t *meta = json_object();
        put(meta, "user_id", json_str(in, "user"));
        put(body, "metadata", meta);
    }
}


/*
 * What a chat request can ask for that neither an Anthropic nor a Gemini
 * answer, as converted, gives: several choices and log probabilities.
 * Refused rather than dropped, as the client would read an answer that
 * looks like what it asked for; routing then leaves such a channel out of
 * the tries.
 */
bool
one_plain_choice(const json_t *in, std::string &err)
{
    const json_t *n = json_object_get(in, "n");

    if (json_is_integer(n) && json_integer_value(n) > 1) {
        err = "n: more than one choice cannot be sent to this channel";
        return false;
    }

    const json_t *top = json_object_get(in, "top_logprobs");

    if (json_is_true(json_object_get(in, "logprobs"))
        || (json_is_integer(top) && json_integer_value(top) > 0))
    {
        err = "logprobs: log probabilities cannot be sent to this channel";
        return false;
    }

    return true;
}


/* The same for Anthropic, which has no JSON mode either. */
bool
anthropic_can_answer(const json_t *in, std::string &err)
{
    const json_t *format = json_object_get(in, "response_format");
    std::string_view type = json_str(format, "type");

    if (!one_plain_choice(in, err)) {
        return false;
    }

    if (type == "json_schema" || type == "json_object") {
        err = "response_format \"" + std::string(type)
              + "\" cannot be sent to this channel";
        return false;
    }

    /* Anthropic refuses a stop sequence of whitespace alone ("\n") */
    Json stop(stop_list(json_object_get(in, "stop")));
    size_t  i;
    json_t *e;

    json_array_foreach(stop.get(), i, e) {
        std::string_view v(json_string_value(e), json_string_length(e));

        if (v.find_first_not_of(" \t\r\n\f\v") == std::string_view::npos) {
            err = "stop: a stop sequence of whitespace alone cannot be sent "
                  "to this channel";
            return false;
        }
    }

    return true;
}


bool
chat_to_anthropic(const json_t *in, std::string_view model, Json &out,
    std::string &err)
{
    const json_t *msgs = json_object_get(in, "messages");
    Json body(json_object());
    Json messages(json_array());
    Json system(json_array());
    AnthropicBuild b { messages.get(), system.get(), false };
    size_t  i;
    json_t *m;

    if (!json_is_array(msgs)) {
        err = "field messages is required";
        return false;
    }

    if (!anthropic_can_answer(in, err)) {
        return false;
    }

    json_array_foreach(msgs, i, m) {
        if (!anthropic_message(m, i, b, err)) {
            return false;
        }
    }

    if (!ends_with_client(msgs, messages.get(), "user", err)) {
        return false;
    }

    results_first(messages.get(), "content", is_tool_result);

    put(body.get(), "model", model);

    /* one text, unless a block carries a cache_control hint */
    std::string text;

    if (!plain_text(system.get(), text)) {
        put(body.get(), "system", system.release());
    } else if (!text.empty()) {
        put(body.get(), "system", text);
    }

    put(body.get(), "messages", messages.release());

    if (!anthropic_tools(json_object_get(in, "tools"), body.get(), err)
        || !anthropic_tool_choice(in, body.get(), b.tool_history, err))
    {
        return false;
    }

    anthropic_params(in, body.get());

    out = std::move(body);
    return true;
}


/* ---- OpenAI chat -> Gemini generateContent ---- */

struct GeminiBuild {
    json_t                              *contents;
    std::string                          system;
    std::map<std::string, std::string>   call_names;   /* id -> function */
};


/* Gemini wants a mimeType with fileData; guess it from the extension. */
const char *
mime_from_url(std::string_view url)
{
    static const std::pair<const char *, const char *> types[] = {
        { "png", "image/png" }, { "jpg", "image/jpeg" },
        { "jpeg", "image/jpeg" }, { "webp", "image/webp" },
        { "gif", "image/gif" }, { "heic", "image/heic" },
        { "heif", "image/heif" }, { "pdf", "application/pdf" },
        { "mp3", "audio/mp3" }, { "wav", "audio/wav" },
        { "mp4", "video/mp4" },
    };

    url = url.substr(0, url.find_first_of("?#"));

    size_t dot = url.rfind('.');
    size_t slash = url.rfind('/');

    if (dot == std::string_view::npos
        || (slash != std::string_view::npos && dot < slash))
    {
        return nullptr;
    }

    std::string ext(url.substr(dot + 1));

    for (char &c : ext) {
        c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    }

    for (const auto &t : types) {
        if (ext == t.first) {
            return t.second;
        }
    }

    return nullptr;
}


json_t *
gemini_media(std::string_view url)
{
    DataUrl d;
    json_t *part, *media;

    if (parse_data_url(url, d)) {
        media = json_object();
        put(media, "mimeType", d.mime);
        put(media, "data", d.data);
        part = json_object();
        put(part, "inlineData", media);
        return part;
    }

    if (!is_http_url(url)) {
        return nullptr;
    }

    media = json_object();
    put(media, "fileUri", url);
    if (const char *mime = mime_from_url(url)) {
        put(media, "mimeType", mime);
    }
    part = json_object();
    put(part, "fileData", media);

    return part;
}


json_t *
gemini_text(std::string_view text)
{
    json_t *p = json_object();

    put(p, "text", text);

    return p;
}


/* One OpenAI content part as a Gemini part; nullptr + err if not. */
json_t *
gemini_part(const json_t *part, const std::string &where, std::string &err)
{
    std::string_view type = json_str(part, "type");
    json_t *p = nullptr;

    if (type == "text") {
        return gemini_text(json_str(part, "text"));
    }

    if (type == "image_url") {
        p = gemini_media(openai_image_url(part));
    } else if (type == "file") {
        p = gemini_media(json_str(json_object_get(part, "file"),
                                  "file_data"));
    } else if (type == "input_audio") {
        const json_t *audio = json_object_get(part, "input_audio");
        std::string url = "data:audio/" + std::string(json_str(audio,
                                                               "format"))
                          + ";base64," + std::string(json_str(audio, "data"));
        p = gemini_media(url);
    } else {
        err = where + ": part type \"" + std::string(type)
              + "\" cannot be sent to this channel";
        return nullptr;
    }

    if (p == nullptr) {
        err = where + ": only http(s) URLs and base64 data URLs can be sent";
    }

    return p;
}


bool
gemini_parts(const json_t *content, const std::string &where, json_t *parts,
    std::string &err)
{
    if (json_is_string(content)) {
        if (json_string_length(content) > 0) {
            append(parts, gemini_text(json_string_value(content)));
        }
        return true;
    }

    if (content == nullptr || json_is_null(content)) {
        return true;
    }

    if (!json_is_array(content)) {
        err = where + ".content must be a string or an array";
        return false;
    }

    size_t  i;
    json_t *part;

    json_array_foreach(content, i, part) {
        /* Gemini refuses an empty text part; a message left with no part
           at all is then left out (append_turn), as for Anthropic */
        if (json_str(part, "type") == "text"
            && json_str(part, "text").empty())
        {
            continue;
        }

        json_t *p = gemini_part(part, at(where + ".content", i), err);

        if (p == nullptr) {
            return false;
        }

        append(parts, p);
    }

    return true;
}


bool
gemini_assistant(const json_t *m, const std::string &where, GeminiBuild &b,
    std::string &err)
{
    Json parts(json_array());
    std::string text = openai_text(json_object_get(m, "content"));
    size_t  i;
    json_t *tc;

    if (!text.empty()) {
        append(parts.get(), gemini_text(text));
    }

    json_array_foreach(json_object_get(m, "tool_calls"), i, tc) {
        const json_t *fn = json_object_get(tc, "function");
        std::string_view name = json_str(fn, "name");

        if (name.empty()) {
            err = at(where + ".tool_calls", i) + ".function.name is required";
            return false;
        }

        b.call_names[std::string(json_str(tc, "id"))] = std::string(name);

        json_t *call = json_object();
        json_t *p = json_object();

        put(call, "name", name);
        put(call, "args", arguments_object(json_object_get(fn, "arguments")));
        put(p, "functionCall", call);
        put(p, "thoughtSignature", kGeminiNoSignature);
        append(parts.get(), p);
    }

    append_turn(b.contents, "model", "parts", std::move(parts));
    return true;
}


bool
gemini_tool_result(const json_t *m, const std::string &where,
    GeminiBuild &b, std::string &err)
{
    std::string name(json_str(m, "name"));

    if (name.empty()) {
        auto it = b.call_names.find(std::string(json_str(m,
                                                         "tool_call_id")));
        if (it == b.call_names.end()) {
            err = where + ".tool_call_id matches no earlier tool call";
            return false;
        }
        name = it->second;
    }

    Json parts(json_array());
    const json_t *content = json_object_get(m, "content");
    json_t *response = json_object();
    json_t *fr = json_object();
    json_t *p = json_object();
    size_t  k;
    json_t *part;

    put(response, "content", openai_text(content));
    put(fr, "name", name);
    put(fr, "response", response);
    put(p, "functionResponse", fr);
    append(parts.get(), p);

    /* a response holds text only: the result's images and files follow
       it in the same turn */
    json_array_foreach(content, k, part) {
        std::string_view type = json_str(part, "type");

        if (type == "text" || type == "refusal" || type.empty()) {
            continue;
        }

        json_t *media = gemini_part(part, at(where + ".content", k), err);

        if (media == nullptr) {
            return false;
        }
        append(parts.get(), media);
    }

    append_turn(b.contents, "user", "parts", std::move(parts));
    return true;
}


bool
is_function_response(const json_t *part)
{
    return json_object_get(part, "functionResponse") != nullptr;
}


bool
gemini_message(const json_t *m, size_t i, GeminiBuild &b, std::string &err)
{
    std::string where = at("messages", i);
    std::string_view role = json_str(m, "role");

    if (role == "system" || role == "developer") {
        append_line(b.system, openai_text(json_object_get(m, "content")));
        return true;
    }

    if (role == "user") {
        Json parts(json_array());

        if (!gemini_parts(json_object_get(m, "content"), where, parts.get(),
                          err))
        {
            return false;
        }

        append_turn(b.contents, "user", "parts", std::move(parts));
        return true;
    }

    if (role == "assistant") {
        return gemini_assistant(m, where, b, err);
    }

    if (role == "tool") {
        return gemini_tool_result(m, where, b, err);
    }

    err = where + ".role \"" + std::string(role)
          + "\" cannot be sent to this channel";
    return false;
}


/*
 * One JSON schema on its way to Gemini's Schema, which has neither $ref nor
 * allOf: local references are put in place and allOf parts merged, so that
 * what they say reaches the model.  refs holds the references being put in
 * place on the way down from the root, to refuse a recursive one, which no
 * finite Schema can say; err says what was refused and where.
 */
struct SchemaBuild {
    const json_t              *root;
    std::vector<std::string>   refs;
    size_t                     nodes = 0;
    std::string                err;

    bool refuse(const std::string &where, const std::string &what) {
        err = where + ": " + what;
        return false;
    }
};


json_t *
gemini_schema(const json_t *s, SchemaBuild &sb, const std::string &where,
    int depth);


bool
json_str_eq_null(const json_t *t)
{
    return std::string_view(json_string_value(t), json_string_length(t))
           == "null";
}


/* What a local $ref ("#/$defs/X", "#/definitions/X", any JSON pointer
   into the root) points at, or nullptr. */
const json_t *
schema_ref_target(const json_t *root, std::string_view ref)
{
    const json_t *node = root;

    if (ref.substr(0, 1) != "#") {
        return nullptr;
    }

    ref.remove_prefix(1);

    while (!ref.empty() && node != nullptr) {
        if (ref[0] != '/') {
            return nullptr;
        }

        size_t end = ref.find('/', 1);
        std::string_view raw = ref.substr(1, end == ref.npos ? ref.npos
                                                             : end - 1);
        std::string token;

        /* RFC 6901: ~1 is '/', ~0 is '~' */
        for (size_t i = 0; i < raw.size(); i++) {
            if (raw[i] == '~' && i + 1 < raw.size()
                && (raw[i + 1] == '0' || raw[i + 1] == '1'))
            {
                token += raw[++i] == '0' ? '~' : '/';
            } else {
                token += raw[i];
            }
        }

        node = json_object_get(node, token.c_str());
        ref.remove_prefix(raw.size() + 1);
    }

    return json_is_object(node) ? node : nullptr;
}


/* Annotations a schema keeps over those of an allOf part or $ref target:
   the words on a field are about that field, the part's about its type. */
bool
schema_annotation(std::string_view key)
{
    return key == "title" || key == "description" || key == "default"
           || key == "example" || key == "examples";
}


/*
 * Merges one allOf part into the schema: properties and required are
 * united, the schema's own annotations stay, and any other key both have
 * must say the same, or the part is refused.
 */
bool
schema_merge(json_t *into, const json_t *part, SchemaBuild &sb,
    const std::string &where)
{
    const char *key;
    json_t     *v;

    json_object_foreach(const_cast<json_t *>(part), key, v) {
        std::string_view k(key);
        json_t *have = json_object_get(into, key);

        if (have == nullptr) {
            json_object_set(into, key, v);

        } else if (k == "properties" && json_is_object(have)
                   && json_is_object(v))
        {
            Json props(json_copy(have));
            const char *name;
            json_t     *p;

            json_object_foreach(v, name, p) {
                json_t *h = json_object_get(props.get(), name);

                if (h != nullptr && !json_equal(h, p)) {
                    return sb.refuse(where, "allOf parts that disagree on "
                                     "property \"" + std::string(name)
                                     + "\" cannot be sent to this channel");
                }
                json_object_set(props.get(), name, p);
            }
            json_object_set(into, key, props.get());

        } else if (k == "required" && json_is_array(have)
                   && json_is_array(v))
        {
            Json required(json_copy(have));
            size_t  i;
            json_t *r;

            json_array_foreach(v, i, r) {
                if (json_is_string(r)
                    && !json_has_string(required.get(),
                                        json_string_value(r)))
                {
                    json_array_append(required.get(), r);
                }
            }
            json_object_set(into, key, required.get());

        } else if (!schema_annotation(k) && !json_equal(have, v)) {
            return sb.refuse(where, "allOf parts that disagree on \""
                             + std::string(k)
                             + "\" cannot be sent to this channel");
        }
    }

    return true;
}


/*
 * s with its $ref put in place and its allOf parts merged into it, at this
 * level only: the schemas under properties, items and anyOf get theirs when
 * converted.  Keys beside a $ref win over the target's.  The references
 * taken are left on sb.refs for the caller to drop once the schemas under
 * this one are converted.
 */
bool
schema_flat(const json_t *s, SchemaBuild &sb, const std::string &where,
    Json &flat)
{
    Json cur(json_is_object(s) ? json_copy(const_cast<json_t *>(s))
                               : json_object());
    const json_t *ref;

    if (++sb.nodes > kMaxSchemaNodes) {
        return sb.refuse(where, "a schema this large once its $refs are "
                         "put in place cannot be sent to this channel");
    }

    while ((ref = json_object_get(cur.get(), "$ref")) != nullptr) {
        std::string name(json_str(cur.get(), "$ref"));
        const json_t *target = schema_ref_target(sb.root, name);

        if (std::find(sb.refs.begin(), sb.refs.end(), name)
            != sb.refs.end())
        {
            return sb.refuse(where, "the recursive $ref \"" + name
                             + "\" cannot be sent to this channel");
        }

        if (target == nullptr) {
            return sb.refuse(where, "$ref \"" + name + "\" points at no "
                             "schema in this one (only local references "
                             "can be sent to this channel)");
        }

        Json next(json_copy(const_cast<json_t *>(target)));
        const char *key;
        json_t     *v;

        json_object_foreach(cur.get(), key, v) {
            if (std::string_view(key) != "$ref") {
                json_object_set(next.get(), key, v);
            }
        }

        sb.refs.push_back(std::move(name));
        cur = std::move(next);
    }

    const json_t *all = json_object_get(cur.get(), "allOf");

    if (all != nullptr) {
        Json parts(json_incref(const_cast<json_t *>(all)));
        size_t  i;
        json_t *part;

        if (!json_is_array(all)) {
            return sb.refuse(where, "allOf must be an array");
        }

        json_object_del(cur.get(), "allOf");

        json_array_foreach(parts.get(), i, part) {
            std::string at_part = at(where + ".allOf", i);
            Json p;

            if (!schema_flat(part, sb, at_part, p)
                || !schema_merge(cur.get(), p.get(), sb, at_part))
            {
                return false;
            }
        }
    }

    flat = std::move(cur);
    return true;
}


bool
gemini_schema_map(const json_t *props, SchemaBuild &sb,
    const std::string &where, int depth, json_t *out)
{
    const char *key;
    json_t     *v;

    json_object_foreach(const_cast<json_t *>(props), key, v) {
        json_t *p = gemini_schema(v, sb, where + "." + key, depth + 1);

        if (p == nullptr) {
            return false;
        }
        put(out, key, p);
    }

    return true;
}


/* JSON Schema's ["string","null"] is Gemini's type + nullable. */
void
gemini_schema_type(const json_t *type, json_t *out)
{
    size_t  i;
    json_t *t;

    json_object_del(out, "type");

    json_array_foreach(type, i, t) {
        if (json_is_string(t) && json_str_eq_null(t)) {
            put(out, "nullable", json_true());
        } else if (json_is_string(t) && !json_object_get(out, "type")) {
            put_copy(out, "type", t);
        }
    }
}


/* Adds words to a schema's description: "<description> (<note>)". */
void
schema_note(json_t *out, const std::string &note)
{
    if (!note.empty()) {
        std::string d(json_str(out, "description"));
        put(out, "description", d.empty() ? note : d + " (" + note + ")");
    }
}


/*
 * What Gemini's Schema refuses, made into what it takes: a format other
 * than its own for the type (string: enum, date-time; number: float,
 * double; integer: int32, int64) is dropped; an enum of other than
 * strings, and a const, become words of the description ("one of: 1, 2"),
 * except a string const, which is a one-value enum.
 */
void
gemini_schema_values(const json_t *s, json_t *out)
{
    std::string_view type = json_str(out, "type");
    std::string_view format = json_str(out, "format");

    if (!format.empty()) {
        bool ok = (type == "string" && (format == "enum"
                                        || format == "date-time"))
                  || (type == "number" && (format == "float"
                                           || format == "double"))
                  || (type == "integer" && (format == "int32"
                                            || format == "int64"));
        if (!ok) {
            json_object_del(out, "format");
        }
    }

    const json_t *values = json_object_get(s, "enum");
    const json_t *konst = json_object_get(s, "const");
    std::string note;
    auto text = [](const json_t *x) {
        char b[64];
        size_t n = json_dumpb(x, b, sizeof(b), JSON_COMPACT | JSON_ENCODE_ANY);
        return n <= sizeof(b) ? std::string(b, n) : std::string("...");
    };
    size_t  i;
    json_t *v;

    if (json_is_array(values)) {
        bool strings = true;
        json_array_foreach(values, i, v) {
            strings = strings && json_is_string(v);
        }
        if (!strings) {
            json_object_del(out, "enum");
            json_array_foreach(values, i, v) {
                note += (i ? ", " : "") + text(v);
            }
            note = "one of: " + note;
        }
    }

    if (konst != nullptr) {
        if (json_is_string(konst)) {
            json_t *one = json_array();
            append(one, json_incref(const_cast<json_t *>(konst)));
            put(out, "enum", one);
            if (type.empty()) {
                put(out, "type", "string");
            }
        } else {
            note = "always " + text(konst);
        }
    }

    schema_note(out, note);
}



/* The type of a value in an enum or const; "" for null, arrays, objects. */
std::string_view
value_type(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_STRING:
        return "string";
    case JSON_INTEGER:
        return "integer";
    case JSON_REAL:
        return "number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "boolean";
    default:
        return "";
    }
}


/* The one type of a schema's const or enum values, "" if they mix. */
std::string_view
values_type(const json_t *s)
{
    const json_t *konst = json_object_get(s, "const");
    std::string_view type;
    size_t  i;
    json_t *v;

    if (konst != nullptr) {
        return value_type(konst);
    }

    json_array_foreach(json_object_get(s, "enum"), i, v) {
        std::string_view t = value_type(v);

        if (i > 0 && t != type) {
            bool numbers = (t == "integer" || t == "number")
                           && (type == "integer" || type == "number");
            if (!numbers) {
                return "";
            }
            t = "number";
        }
        type = t;
    }

    return type;
}


/*
 * Gemini wants a type on every schema but one of alternatives (anyOf).  A
 * missing one is taken from what the schema says: its enum or const
 * values, its properties, items or bounds.  A schema that says nothing of
 * its value (pydantic's Any, a bare {"description": ...}) is a string:
 * Gemini's Schema has no type for any value, and object needs properties,
 * while a string can hold any value written out, and the description still
 * tells the model what to put there.
 */
void
gemini_schema_infer_type(const json_t *s, json_t *out)
{
    if (json_object_get(out, "type") != nullptr
        || json_object_get(out, "anyOf") != nullptr)
    {
        return;
    }

    std::string_view type = values_type(s);

    if (!type.empty()) {
        /* as written */
    } else if (json_object_get(out, "properties") != nullptr) {
        type = "object";
    } else if (json_object_get(out, "items") != nullptr
               || json_object_get(s, "minItems") != nullptr
               || json_object_get(s, "maxItems") != nullptr)
    {
        type = "array";
    } else if (json_object_get(s, "minimum") != nullptr
               || json_object_get(s, "maximum") != nullptr)
    {
        type = "number";
    } else {
        type = "string";
    }

    put(out, "type", type);
}


/* Gemini refuses a required name that is not among the properties. */
void
gemini_schema_required(json_t *out)
{
    const json_t *props = json_object_get(out, "properties");
    Json kept(json_array());
    size_t  i;
    json_t *r;

    json_array_foreach(json_object_get(out, "required"), i, r) {
        if (json_is_string(r)
            && json_object_get(props, json_string_value(r)) != nullptr
            && !json_has_string(kept.get(), json_string_value(r)))
        {
            json_array_append(kept.get(), r);
        }
    }

    if (json_array_size(kept.get()) > 0) {
        put(out, "required", kept.release());
    } else {
        json_object_del(out, "required");
    }
}


/*
 * Gemini refuses an array without items and an object without properties
 * (a map, a free-form object), at any depth.  An array of anything holds
 * what a schema of anything does (gemini_schema_infer_type); an object
 * whose members no schema names is asked for as JSON text, which a string
 * can hold and its description says.
 */
bool
gemini_schema_open(json_t *out, SchemaBuild &sb, const std::string &where,
    int depth)
{
    std::string_view type = json_str(out, "type");

    if (type == "array" && json_object_get(out, "items") == nullptr) {
        Json any(json_object());
        json_t *p = gemini_schema(any.get(), sb, where + ".items", depth + 1);

        if (p == nullptr) {
            return false;
        }
        put(out, "items", p);

    } else if (type == "object"
               && json_object_size(json_object_get(out, "properties")) == 0)
    {
        put(out, "type", "string");
        for (const char *k : { "properties", "required", "minProperties",
                               "maxProperties" })
        {
            json_object_del(out, k);
        }
        schema_note(out, "a JSON object, written as text");
    }

    return true;
}


/* The Schema of s, made flat (schema_flat), into out. */
bool
gemini_schema_fill(const json_t *s, SchemaBuild &sb, const std::string &where,
    int depth, json_t *out)
{
    for (const char *key : kGeminiSchemaKeys) {
        put_copy(out, key, json_object_get(s, key));
    }

    const json_t *type = json_object_get(s, "type");

    if (json_is_array(type)) {
        gemini_schema_type(type, out);
    }

    const json_t *props = json_object_get(s, "properties");

    if (json_is_object(props)) {
        json_t *map = json_object();

        put(out, "properties", map);
        if (!gemini_schema_map(props, sb, where + ".properties", depth,
                               map))
        {
            return false;
        }
    }

    const json_t *items = json_object_get(s, "items");

    if (json_is_object(items)) {
        json_t *p = gemini_schema(items, sb, where + ".items", depth + 1);

        if (p == nullptr) {
            return false;
        }
        put(out, "items", p);
    }

    size_t  i;
    json_t *v;
    Json any(json_array());

    /* Gemini has anyOf only: oneOf's alternatives are taken as anyOf's */
    for (const char *alt : { "anyOf", "oneOf" }) {
        json_array_foreach(json_object_get(s, alt), i, v) {
            json_t *p = gemini_schema(v, sb, at(where + "." + alt, i),
                                      depth + 1);
            if (p == nullptr) {
                return false;
            }
            append(any.get(), p);
        }
    }

    if (json_array_size(any.get()) > 0) {
        put(out, "anyOf", any.release());
    }

    gemini_schema_infer_type(s, out);

    if (!gemini_schema_open(out, sb, where, depth)) {
        return false;
    }

    gemini_schema_values(s, out);
    gemini_schema_required(out);

    return true;
}


/*
 * Gemini's Schema of a JSON schema, or nullptr and sb.err when it cannot
 * say what the schema says.  where names the schema in the request.
 */
json_t *
gemini_schema(const json_t *s, SchemaBuild &sb, const std::string &where,
    int depth)
{
    size_t refs = sb.refs.size();
    Json flat;
    Json out(json_object());
    bool ok;

    if (depth > kMaxSchemaDepth) {
        sb.refuse(where, "a schema nested more than "
                  + std::to_string(kMaxSchemaDepth)
                  + " deep cannot be sent to this channel");
        return nullptr;
    }

    ok = schema_flat(s, sb, where, flat)
         && gemini_schema_fill(flat.get(), sb, where, depth, out.get());

    /* a reference is recursive only within what it holds */
    sb.refs.resize(refs);

    return ok ? out.release() : nullptr;
}


bool
gemini_tools(const json_t *tools, json_t *body, std::string &err)
{
    Json    decls(json_array());
    size_t  i;
    json_t *t;

    json_array_foreach(tools, i, t) {
        std::string_view type = json_str(t, "type");
        const json_t *fn = json_object_get(t, "function");

        if (!type.empty() && type != "function") {
            err = at("tools", i) + ": tool type \"" + std::string(type)
                  + "\" cannot be sent to this channel";
            return false;
        }

        if (json_str(fn, "name").empty()) {
            err = at("tools", i) + ".function.name is required";
            return false;
        }

        const json_t *schema = json_object_get(fn, "parameters");
        SchemaBuild sb { schema, {}, 0, {} };
        Json params(json_is_object(schema)
                        ? gemini_schema(schema, sb, "parameters", 0)
                        : json_object());

        /* refused here, it is refused before any channel is tried */
        if (params == nullptr) {
            err = at("tools", i) + " (\"" + std::string(json_str(fn, "name"))
                  + "\"): " + sb.err;
            return false;
        }

        json_t *d = json_object();

        put(d, "name", json_str(fn, "name"));
        if (!json_str(fn, "description").empty()) {
            put(d, "description", json_str(fn, "description"));
        }
        /* Gemini refuses an object schema without properties */
        if (json_object_size(json_object_get(params.get(), "properties")) > 0)
        {
            put(d, "parameters", params.release());
        }
        append(decls.get(), d);
    }

    if (json_array_size(decls.get()) > 0) {
        json_t *tool = json_object();
        json_t *list = json_array();

        put(tool, "functionDeclarations", decls.release());
        append(list, tool);
        put(body, "tools", list);
    }

    return true;
}


bool
gemini_tool_config(const json_t *choice, json_t *body, std::string &err)
{
    std::string_view mode = mode_of(choice);
    Json cfg(json_object());

    if (mode.empty() || mode == "auto") {
        return true;
    }

    if (mode == "none") {
        put(cfg.get(), "mode", "NONE");
    } else if (mode == "required") {
        put(cfg.get(), "mode", "ANY");
    } else if (mode == "function") {
        std::string_view name = json_str(json_object_get(choice, "function"),
                                         "name");
        if (name.empty()) {
            err = "tool_choice.function.name is required";
            return false;
        }
        json_t *names = json_array();
        append(names, jstr(name));
        put(cfg.get(), "mode", "ANY");
        put(cfg.get(), "allowedFunctionNames", names);
    } else {
        err = "tool_choice \"" + std::string(mode) + "\" is not supported";
        return false;
    }

    json_t *tc = json_object();

    put(tc, "functionCallingConfig", cfg.release());
    put(body, "toolConfig", tc);

    return true;
}


/*
 * Whether Gemini's Schema can say what a JSON schema says: no references
 * ($ref, $defs), no object without properties (a free-form object or a
 * map, which Gemini refuses) and no array without items (which it would
 * take as an array of strings, see gemini_schema_open).  When not, JSON
 * mode alone is asked for.
 */
bool
gemini_schema_expressible(const json_t *s, int depth)
{
    if (!json_is_object(s) || depth > kMaxSchemaDepth) {
        return false;
    }

    const char *k;
    json_t *v;

    json_object_foreach(const_cast<json_t *>(s), k, v) {
        std::string_view key(k);
        if (key == "$ref" || key == "$defs" || key == "definitions") {
            return false;
        }
    }

    if (json_str(s, "type") == "object"
        && json_object_size(json_object_get(s, "properties")) == 0)
    {
        return false;
    }

    if (json_str(s, "type") == "array"
        && !json_is_object(json_object_get(s, "items")))
    {
        return false;
    }

    json_object_foreach(json_object_get(s, "properties"), k, v) {
        if (!gemini_schema_expressible(v, depth + 1)) {
            return false;
        }
    }

    size_t i;
    if (json_is_object(json_object_get(s, "items"))
        && !gemini_schema_expressible(json_object_get(s, "items"), depth + 1))
    {
        return false;
    }
    for (const char *alt : { "anyOf", "oneOf" }) {
        json_array_foreach(json_object_get(s, alt), i, v) {
            if (!gemini_schema_expressible(v, depth + 1)) {
                return false;
            }
        }
    }

    return true;
}


void
gemini_generation_config(const json_t *in, json_t *body)
{
    Json gc(json_object());
    int64_t max = openai_max_tokens(in);
    std::string_view format = json_str(json_object_get(in,
                                                       "response_format"),
                                       "type");

    if (max > 0) {
        put_int(gc.get(), "maxOutputTokens", max);
    }

    copy_number(gc.get(), "temperature", in, "temperature");
    copy_number(gc.get(), "topP", in, "top_p");
    copy_number(gc.get(), "seed", in, "seed");
    copy_number(gc.get(), "presencePenalty", in, "presence_penalty");
    copy_number(gc.get(), "frequencyPenalty", in, "frequency_penalty");

    if (json_t *stop = stop_list(json_object_get(in, "stop"))) {
        put(gc.get(), "stopSequences", stop);
    }

    if (format == "json_object" || format == "json_schema") {
        put(gc.get(), "responseMimeType", "application/json");
    }

    const json_t *schema = json_object_get(
        json_object_get(json_object_get(in, "response_format"), "json_schema"),
        "schema");

    if (format == "json_schema" && json_is_object(schema)
        && gemini_schema_expressible(schema, 0))
    {
        SchemaBuild sb { schema, {}, 0, {} };

        /* what cannot be said asks for JSON mode alone, as above */
        if (json_t *rs = gemini_schema(schema, sb, "schema", 0)) {
            put(gc.get(), "responseSchema", rs);
        }
    }

    if (json_object_size(gc.get()) > 0) {
        put(body, "generationConfig", gc.release());
    }
}


bool
chat_to_gemini(const json_t *in, Json &out, std::string &err)
{
    const json_t *msgs = json_object_get(in, "messages");
    Json body(json_object());
    Json contents(json_array());
    GeminiBuild b { contents.get(), {}, {} };
    size_t  i;
    json_t *m;

    if (!json_is_array(msgs)) {
        err = "field messages is required";
        return false;
    }

    if (!one_plain_choice(in, err)) {
        return false;
    }

    json_array_foreach(msgs, i, m) {
        if (!gemini_message(m, i, b, err)) {
            return false;
        }
    }

    if (!ends_with_client(msgs, contents.get(), "user", err)) {
        return false;
    }

    results_first(contents.get(), "parts", is_function_response);

    if (!b.system.empty()) {
        json_t *si = json_object();
        json_t *parts = json_array();

        append(parts, gemini_text(b.system));
        put(si, "parts", parts);
        put(body.get(), "systemInstruction", si);
    }

    put(body.get(), "contents", contents.release());

    if (!gemini_tools(json_object_get(in, "tools"), body.get(), err)
        || !gemini_tool_config(json_object_get(in, "tool_choice"),
                               body.get(), err))
    {
        return false;
    }

    gemini_generation_config(in, body.get());

    out = std::move(body);
    return true;
}


/* ---- Anthropic messages -> OpenAI chat ---- */

/* An Anthropic media source as a URL (base64 becomes a data URL). */
std::string
source_url(const json_t *source)
{
    std::string_view type = json_str(source, "type");

    if (type == "base64") {
        return "data:" + std::string(json_str(source, "media_type"))
               + ";base64," + std::string(json_str(source, "data"));
    }

    if (type == "url") {
        return std::string(json_str(source, "url"));
    }

    return {};
}


json_t *
chat_image_part(std::string_view url)
{
    json_t *iu = json_object();
    json_t *p = json_object();

    put(iu, "url", url);
    put(p, "type", "image_url");
    put(p, "image_url", iu);

    return p;
}


json_t *
chat_document_part(const json_t *block)
{
    const json_t *source = json_object_get(block, "source");
    std::string_view type = json_str(source, "type");

    if (type == "text") {
        return text_block(json_str(source, "data"));
    }

    if (type != "base64") {
        return nullptr;
    }

    json_t *file = json_object();
    json_t *p = json_object();

    /* OpenAI requires a filename with file_data; Anthropic's title is
       optional */
    std::string_view title = json_str(block, "title");
    std::string_view media = json_str(source, "media_type");

    put(file, "file_data", source_url(source));
    put(file, "filename", !title.empty() ? std::string(title)
                          : media == "application/pdf" ? "document.pdf"
                          : media == "text/plain" ? "document.txt"
                          : "document");
    put(p, "type", "file");
    put(p, "file", file);

    return p;
}


json_t *
chat_message(const char *role, json_t *content)
{
    json_t *m = json_object();

    put(m, "role", role);
    put(m, "content", content);

    return m;
}


/* One user block as an OpenAI part; tool results go out as messages. */
bool
chat_user_block(const json_t *block, const std::string &where,
    json_t *messages, json_t *parts, std::string &err)
{
    std::string_view type = json_str(block, "type");
    json_t *p = nullptr;

    if (type == "tool_result") {
        std::string_view id = json_str(block, "tool_use_id");
        if (id.empty()) {
            err = where + ".tool_use_id is required";
            return false;
        }
        /* OpenAI tool messages carry text only: a result's images and
           documents go in the user message that follows the tool messages;
           a failed tool says so in its text, as is_error has no place */
        const json_t *content = json_object_get(block, "content");
        std::string text = anthropic_text(content);

        if (json_is_true(json_object_get(block, "is_error"))) {
            text = "Error: " + text;
        }

        json_t *m = chat_message("tool", jstr(text));
        put(m, "tool_call_id", id);
        append(messages, m);

        size_t  k;
        json_t *inner;

        json_array_foreach(content, k, inner) {
            std::string_view inner_type = json_str(inner, "type");
            json_t *part = nullptr;

            if (inner_type == "image") {
                std::string url = source_url(json_object_get(inner,
                                                             "source"));
                part = url.empty() ? nullptr : chat_image_part(url);

            } else if (inner_type == "document") {
                part = chat_document_part(inner);

            } else {
                continue;
            }

            if (part == nullptr) {
                err = at(where + ".content", k)
                      + ": its source type cannot be sent to this channel";
                return false;
            }

            append(parts, part);
        }

        return true;
    }

    if (type == "text") {
        p = text_block(json_str(block, "text"));
    } else if (type == "image") {
        std::string url = source_url(json_object_get(block, "source"));
        p = url.empty() ? nullptr : chat_image_part(url);
    } else if (type == "document") {
        p = chat_document_part(block);
    } else {
        err = where + ": block type \"" + std::string(type)
              + "\" cannot be sent to this channel";
        return false;
    }

    if (p == nullptr) {
        err = where + ": its source type cannot be sent to this channel";
        return false;
    }

    append(parts, p);
    return true;
}


bool
chat_user(const json_t *content, const std::string &where, json_t *messages,
    std::string &err)
{
    if (json_is_string(content)) {
        append(messages, chat_message("user", json_deep_copy(content)));
        return true;
    }

    if (!json_is_array(content)) {
        err = where + ".content must be a string or an array";
        return false;
    }

    Json    parts(json_array());
    size_t  i;
    json_t *block;

    json_array_foreach(content, i, block) {
        if (!chat_user_block(block, at(where + ".content", i), messages,
                             parts.get(), err))
        {
            return false;
        }
    }

    size_t n = json_array_size(parts.get());
    const json_t *first = json_array_get(parts.get(), 0);

    /* a lone text goes as a string: every compatible server reads that */
    if (n == 1 && json_str(first, "type") == "text") {
        append(messages, chat_message("user", jstr(json_str(first, "text"))));
    } else if (n > 0) {
        append(messages, chat_message("user", parts.release()));
    }

    return true;
}


json_t *
chat_tool_call(const json_t *block)
{
    json_t *fn = json_object();
    json_t *tc = json_object();

    put(fn, "name", json_str(block, "name"));
    put(fn, "arguments", arguments_text(json_object_get(block, "input")));
    put(tc, "id", json_str(block, "id"));
    put(tc, "type", "function");
    put(tc, "function", fn);

    return tc;
}


void
chat_assistant(const json_t *content, json_t *messages)
{
    if (json_is_string(content)) {
        append(messages, chat_message("assistant", json_deep_copy(content)));
        return;
    }

    std::string text;
    Json calls(json_array());
    size_t  i;
    json_t *block;

    /*
     * thinking, redacted_thinking and server-tool blocks are Anthropic's
     * own state and mean nothing to another vendor: they are left out.
     */
    json_array_foreach(content, i, block) {
        std::string_view type = json_str(block, "type");

        if (type == "text") {
            text += json_str(block, "text");
        } else if (type == "tool_use") {
            append(calls.get(), chat_tool_call(block));
        }
    }

    if (text.empty() && json_array_size(calls.get()) == 0) {
        return;
    }

    json_t *m = chat_message("assistant",
                             text.empty() ? json_null() : jstr(text));

    if (json_array_size(calls.get()) > 0) {
        put(m, "tool_calls", calls.release());
    }

    append(messages, m);
}


bool
chat_tools(const json_t *tools, json_t *body, std::string &err)
{
    Json    out(json_array());
    size_t  i;
    json_t *t;

    json_array_foreach(tools, i, t) {
        std::string_view type = json_str(t, "type");
        const json_t *schema = json_object_get(t, "input_schema");

        if (!type.empty() && type != "custom") {
            err = at("tools", i) + ": tool type \"" + std::string(type)
                  + "\" is Anthropic's own and cannot be sent to this channel";
            return false;
        }

        if (json_str(t, "name").empty()) {
            err = at("tools", i) + ".name is required";
            return false;
        }

        json_t *fn = json_object();
        json_t *o = json_object();

        put(fn, "name", json_str(t, "name"));
        if (!json_str(t, "description").empty()) {
            put(fn, "description", json_str(t, "description"));
        }
        put(fn, "parameters", json_is_object(schema)
                              ? json_deep_copy(schema) : object_schema());
        put(o, "type", "function");
        put(o, "function", fn);
        append(out.get(), o);
    }

    if (json_array_size(out.get()) > 0) {
        put(body, "tools", out.release());
    }

    return true;
}


bool
chat_tool_choice(const json_t *choice, json_t *body, std::string &err)
{
    std::string_view mode = json_str(choice, "type");

    if (json_object_get(body, "tools") == nullptr || choice == nullptr) {
        return true;
    }

    if (mode == "auto" || mode == "none") {
        put(body, "tool_choice", mode);
    } else if (mode == "any") {
        put(body, "tool_choice", "required");
    } else if (mode == "tool") {
        json_t *fn = json_object();
        json_t *tc = json_object();

        put(fn, "name", json_str(choice, "name"));
        put(tc, "type", "function");
        put(tc, "function", fn);
        put(body, "tool_choice", tc);
    } else {
        err = "tool_choice type \"" + std::string(mode)
              + "\" is not supported";
        return false;
    }

    if (json_is_true(json_object_get(choice, "disable_parallel_tool_use"))) {
        put(body, "parallel_tool_calls", json_false());
    }

    return true;
}


/* OpenAI's reasoning models (o1, o3, o4-mini, gpt-5, ...) refuse
   max_tokens and take max_completion_tokens; compatible servers mostly know
   only max_tokens. A provider prefix ("openai/o3") is looked through. */
bool
takes_max_completion_tokens(std::string_view model)
{
    size_t slash = model.rfind('/');

    if (slash != std::string_view::npos) {
        model.remove_prefix(slash + 1);
    }

    return (model.size() >= 2 && model[0] == 'o'
            && model[1] >= '1' && model[1] <= '9')
           || model.substr(0, 5) == "gpt-5";
}


/*
 * Some OpenAI-compatible servers refuse a "user" longer than 64
 * characters, and Claude Code's metadata.user_id
 * ("user_<64 hex>_account_<uuid>_session_<uuid>") has about 160.  An id
 * of more than 64 bytes goes as its lowercase hex SHA-256: 64 characters
 * that still tell one end user from another.
 */
void
put_user(json_t *body, std::string_view user)
{
    std::string hashed;

    if (user.size() > 64) {
        hashed = sha256_hex(user);
        user = hashed;
    }

    if (!user.empty()) {
        put(body, "user", user);
    }
}


void
chat_params(const json_t *in, std::string_view model, json_t *body)
{
    const json_t *stop = json_object_get(in, "stop_sequences");

    copy_number(body,
                takes_max_completion_tokens(model) ? "max_completion_tokens"
                                                   : "max_tokens",
                in, "max_tokens");
    copy_number(body, "temperature", in, "temperature");
    copy_number(body, "top_p", in, "top_p");

    if (json_is_array(stop) && json_array_size(stop) > 0) {
        put_copy(body, "stop", stop);
    }

    if (json_is_true(json_object_get(in, "stream"))) {
        json_t *so = json_object();

        /* the stream converter needs usage to fill message_delta */
        put(so, "include_usage", json_true());
        put(body, "stream", json_true());
        put(body, "stream_options", so);
    }

    put_user(body, json_str(json_object_get(in, "metadata"), "user_id"));
}


bool
messages_to_chat(const json_t *in, std::string_view model, Json &out,
    std::string &err)
{
    const json_t *msgs = json_object_get(in, "messages");
    Json body(json_object());
    Json messages(json_array());
    std::string system = anthropic_text(json_object_get(in, "system"));
    size_t  i;
    json_t *m;

    if (!json_is_array(msgs)) {
        err = "field messages is required";
        return false;
    }

    if (!system.empty()) {
        append(messages.get(), chat_message("system", jstr(system)));
    }

    json_array_foreach(msgs, i, m) {
        std::string_view role = json_str(m, "role");
        const json_t *content = json_object_get(m, "content");

        if (role == "user") {
            if (!chat_user(content, at("messages", i), messages.get(), err)) {
                return false;
            }
        } else if (role == "assistant") {
            chat_assistant(content, messages.get());
        } else {
            err = at("messages", i) + ".role \"" + std::string(role)
                  + "\" is not user or assistant";
            return false;
        }
    }

    put(body.get(), "model", model);
    put(body.get(), "messages", messages.release());

    if (!chat_tools(json_object_get(in, "tools"), body.get(), err)
        || !chat_tool_choice(json_object_get(in, "tool_choice"), body.get(),
                             err))
    {
        return false;
    }

    chat_params(in, model, body.get());

    out = std::move(body);
    return true;
}


/* ---- answers ---- */

const char *
chat_finish_from_anthropic(std::string_view reason)
{
    if (reason == "max_tokens" || reason == "model_context_window_exceeded") {
        return "length";
    }

    if (reason == "tool_use") {
        return "tool_calls";
    }

    if (reason == "refusal") {
        return "content_filter";
    }

    /* end_turn, stop_sequence, pause_turn */
    return "stop";
}


const char *
chat_finish_from_gemini(std::string_view reason, bool tool_calls)
{
    static const char *const filtered[] = {
        "SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII",
        "IMAGE_SAFETY",
    };

    if (reason == "MAX_TOKENS") {
        return "length";
    }

    for (const char *f : filtered) {
        if (reason == f) {
            return "content_filter";
        }
    }

    /* the model failed: said in its own words, which clients tell apart
       from a finished answer (the SDKs read an unknown reason as "other") */
    static const std::pair<const char *, const char *> failed[] = {
        { "MALFORMED_FUNCTION_CALL", "malformed_function_call" },
        { "UNEXPECTED_TOOL_CALL", "unexpected_tool_call" },
        { "TOO_MANY_TOOL_CALLS", "too_many_tool_calls" },
        { "OTHER", "other" },
    };

    for (const auto &f : failed) {
        if (reason == f.first) {
            return f.second;
        }
    }

    /* Gemini ends a function call turn with STOP */
    return tool_calls ? "tool_calls" : "stop";
}


/* tool_calls: the answer has some, which an upstream may end with "stop"
   (or with no reason): the client must still run them */
const char *
anthropic_stop_from_chat(std::string_view reason, bool tool_calls)
{
    if (tool_calls && (reason == "stop" || reason.empty())) {
        return "tool_use";
    }

    if (reason == "length") {
        return "max_tokens";
    }

    if (reason == "tool_calls" || reason == "function_call") {
        return "tool_use";
    }

    if (reason == "content_filter") {
        return "refusal";
    }

    /* stop */
    return "end_turn";
}


struct AnthropicUsage {
    int64_t  input = 0;
    int64_t  output = 0;
    int64_t  cache_read = 0;
    int64_t  cache_creation = 0;

    /* message_delta repeats only what changed: take what is present */
    void take(const json_t *u)
    {
        input = json_int(u, "input_tokens", input);
        output = json_int(u, "output_tokens", output);
        cache_read = json_int(u, "cache_read_input_tokens", cache_read);
        cache_creation = json_int(u, "cache_creation_input_tokens",
                                  cache_creation);
    }

    /* OpenAI's prompt count includes the cached part */
    int64_t prompt() const { return input + cache_read + cache_creation; }
};


struct ChatUsage {
    int64_t  prompt = 0;
    int64_t  completion = 0;
    int64_t  cached = 0;
    int64_t  reasoning = 0;

    json_t *to_json() const
    {
        json_t *u = json_object();
        json_t *details = json_object();

        put_int(u, "prompt_tokens", prompt);
        put_int(u, "completion_tokens", completion);
        put_int(u, "total_tokens", prompt + completion);
        put_int(details, "cached_tokens", cached);
        put(u, "prompt_tokens_details", details);

        if (reasoning > 0) {
            json_t *cd = json_object();
            put_int(cd, "reasoning_tokens", reasoning);
            put(u, "completion_tokens_details", cd);
        }

        return u;
    }
};


ChatUsage
chat_usage(const AnthropicUsage &a)
{
    ChatUsage u;

    u.prompt = a.prompt();
    u.completion = a.output;
    u.cached = a.cache_read;

    return u;
}


/* Counts as the ledger keeps them (either cache convention) as chat
   usage; the reasoning detail is the upstream's. */
ChatUsage
chat_usage_of(const llmgw_usage_t &b, int64_t reasoning)
{
    ChatUsage u;

    u.prompt = b.cache_in_prompt
               ? b.prompt_tokens
               : b.prompt_tokens + b.cache_read_tokens
                 + b.cache_creation_tokens;
    u.completion = b.completion_tokens;
    u.cached = b.cache_read_tokens;
    u.reasoning = reasoning;

    return u;
}


/* The same as Messages usage: the cached part of the prompt is not
   input_tokens but cache_read / cache_creation_input_tokens. */
json_t *
anthropic_usage_of(const llmgw_usage_t &b)
{
    json_t *u = json_object();
    int64_t read = std::max<int64_t>(0, b.cache_read_tokens);
    int64_t creation = std::max<int64_t>(0, b.cache_creation_tokens);
    int64_t input = b.prompt_tokens;

    if (b.cache_in_prompt) {
        read = std::min(read, std::max<int64_t>(0, input));
        creation = std::min(creation, std::max<int64_t>(0, input - read));
        input -= read + creation;
    }

    put_int(u, "input_tokens", input);
    put_int(u, "cache_creation_input_tokens", creation);
    put_int(u, "cache_read_input_tokens", read);
    put_int(u, "output_tokens", b.completion_tokens);
    return u;
}


ChatUsage
gemini_usage(const json_t *meta)
{
    ChatUsage u;

    /* the prompt of tool use is counted apart from it (usage.cpp) */
    u.prompt = json_int(meta, "promptTokenCount", 0)
               + json_int(meta, "toolUsePromptTokenCount", 0);
    u.reasoning = json_int(meta, "thoughtsTokenCount", 0);
    /* thinking is billed as output */
    u.completion = json_int(meta, "candidatesTokenCount", 0) + u.reasoning;
    u.cached = json_int(meta, "cachedContentTokenCount", 0);

    return u;
}


json_t *
chat_completion(std::string_view id, std::string_view model, json_t *message,
    const char *finish, json_t *usage)
{
    json_t *choice = json_object();
    json_t *choices = json_array();
    json_t *c = json_object();

    put_int(choice, "index", 0);
    put(choice, "message", message);
    put(choice, "finish_reason", finish ? jstr(finish) : json_null());
    append(choices, choice);

    put(c, "id", id);
    put(c, "object", "chat.completion");
    put_int(c, "created", static_cast<int64_t>(std::time(nullptr)));
    put(c, "model", model);
    put(c, "choices", choices);
    if (usage != nullptr) {
        put(c, "usage", usage);
    }

    return c;
}


json_t *
chat_function_call(std::string_view id, std::string_view name,
    std::string_view args)
{
    json_t *fn = json_object();
    json_t *tc = json_object();

    put(fn, "name", name);
    put(fn, "arguments", args);
    put(tc, "id", id);
    put(tc, "type", "function");
    put(tc, "function", fn);

    return tc;
}


json_t *
assistant_message(const std::string &text, const std::string &reasoning,
    Json calls)
{
    json_t *m = json_object();

    put(m, "role", "assistant");
    /* null only beside tool calls, as OpenAI answers: an answer cut short
       while thinking has "" (a client may read its length) */
    put(m, "content", text.empty() && json_array_size(calls.get()) > 0
                      ? json_null() : jstr(text));

    if (!reasoning.empty()) {
        put(m, "reasoning_content", reasoning);
    }

    if (json_array_size(calls.get()) > 0) {
        put(m, "tool_calls", calls.release());
    }

    return m;
}


bool
anthropic_to_chat_answer(const json_t *in, std::string_view model, Json &out,
    std::string &err)
{
    const json_t *content = json_object_get(in, "content");
    std::string text, reasoning;
    Json calls(json_array());
    AnthropicUsage usage;
    size_t  i;
    json_t *block;

    if (!json_is_array(content)) {
        err = "the upstream answer is not an Anthropic message";
        return false;
    }

    json_array_foreach(content, i, block) {
        std::string_view type = json_str(block, "type");

        if (type == "text") {
            /* citations split one text into several blocks: no separator */
            text += json_str(block, "text");
        } else if (type == "thinking") {
            reasoning += json_str(block, "thinking");
        } else if (type == "tool_use") {
            append(calls.get(), chat_tool_call(block));
        }
    }

    usage.take(json_object_get(in, "usage"));

    std::string_view id = json_str(in, "id");
    json_t *message = assistant_message(text, reasoning, std::move(calls));
    const char *finish = chat_finish_from_anthropic(json_str(in,
                                                             "stop_reason"));

    out.reset(chat_completion(id.empty() ? "chatcmpl-" + random_hex(12)
                                         : std::string(id),
                              model, message, finish,
                              chat_usage(usage).to_json()));
    return true;
}


/* A Gemini part's inline image as an entry of a chat message's "images"
   (the shape OpenRouter and others give generated images), or nullptr. */
json_t *
chat_image_of(const json_t *part)
{
    const json_t *inline_data = json_object_get(part, "inlineData");
    std::string_view mime = json_str(inline_data, "mimeType");

    if (!json_is_object(inline_data) || mime.substr(0, 6) != "image/") {
        return nullptr;
    }

    json_t *url = json_object();
    json_t *image = json_object();

    put(url, "url", "data:" + std::string(mime) + ";base64,"
                    + std::string(json_str(inline_data, "data")));
    put(image, "type", "image_url");
    put(image, "image_url", url);

    return image;
}


bool
gemini_to_chat_answer(const json_t *in, std::string_view model, Json &out,
    std::string &err)
{
    const json_t *cand = json_array_get(json_object_get(in, "candidates"), 0);
    std::string text, reasoning;
    Json calls(json_array());
    Json images(json_array());
    size_t  i;
    json_t *part;

    if (cand == nullptr && !json_is_object(json_object_get(in,
                                                           "promptFeedback")))
    {
        err = "the upstream answer has no candidates";
        return false;
    }

    json_array_foreach(json_object_get(json_object_get(cand, "content"),
                                       "parts"), i, part) {
        const json_t *fc = json_object_get(part, "functionCall");

        if (json_is_object(fc)) {
            append(calls.get(), chat_function_call(
                       "call_" + random_hex(12), json_str(fc, "name"),
                       arguments_text(json_object_get(fc, "args"))));
        } else if (json_t *image = chat_image_of(part)) {
            append(images.get(), image);
        } else if (json_is_true(json_object_get(part, "thought"))) {
            reasoning += json_str(part, "text");
        } else {
            text += json_str(part, "text");
        }
    }

    bool tools = json_array_size(calls.get()) > 0;
    /* no candidate at all: the prompt itself was blocked */
    const char *finish = cand == nullptr
        ? "content_filter"
        : chat_finish_from_gemini(json_str(cand, "finishReason"), tools);
    std::string_view id = json_str(in, "responseId");
    const json_t *meta = json_object_get(in, "usageMetadata");

    json_t *message = assistant_message(text, reasoning, std::move(calls));

    if (json_array_size(images.get()) > 0) {
        put(message, "images", images.release());
    }

    out.reset(chat_completion(id.empty() ? "chatcmpl-" + random_hex(12)
                                         : std::string(id),
                              model, message,
                              finish,
                              json_is_object(meta)
                              ? gemini_usage(meta).to_json() : nullptr));
    return true;
}


json_t *
tool_use_block(std::string_view id, std::string_view name, json_t *input)
{
    json_t *b = json_object();

    put(b, "type", "tool_use");
    put(b, "id", id.empty() ? "toolu_" + random_hex(12) : anthropic_id(id));
    put(b, "name", name);
    put(b, "input", input);

    return b;
}


/* A chat message's (or delta's) reasoning text: reasoning_content as
   DeepSeek and vLLM send it, or reasoning as others do. */
std::string_view
chat_reasoning(const json_t *m)
{
    std::string_view r = json_str(m, "reasoning_content");

    return r.empty() ? json_str(m, "reasoning") : r;
}


/* Messages usage from chat usage. */
json_t *
anthropic_usage_from_chat(const json_t *usage)
{
    llmgw_usage_t u {};

    u.prompt_tokens = json_int(usage, "prompt_tokens", 0);
    u.completion_tokens = json_int(usage, "completion_tokens", 0);
    u.cache_read_tokens = json_int(json_object_get(usage,
                                                   "prompt_tokens_details"),
                                   "cached_tokens", 0);
    u.cache_in_prompt = 1;

    return anthropic_usage_of(u);
}


bool
chat_to_anthropic_answer(const json_t *in, std::string_view model, Json &out,
    std::string &err)
{
    const json_t *choice = json_array_get(json_object_get(in, "choices"), 0);
    const json_t *message = json_object_get(choice, "message");
    const json_t *usage = json_object_get(in, "usage");
    std::string text = openai_text(json_object_get(message, "content"));
    Json content(json_array());
    size_t  i;
    json_t *tc;

    if (!json_is_object(message)) {
        err = "the upstream answer has no choices[0].message";
        return false;
    }

    std::string_view reasoning = chat_reasoning(message);
    std::string_view refusal = json_str(message, "refusal");

    if (!reasoning.empty()) {
        json_t *b = json_object();
        put(b, "type", "thinking");
        put(b, "thinking", reasoning);
        put(b, "signature", "");
        append(content.get(), b);
    }

    if (!text.empty()) {
        append(content.get(), text_block(text));
    }

    if (!refusal.empty()) {
        append(content.get(), text_block(std::string(refusal)));
    }

    json_array_foreach(json_object_get(message, "tool_calls"), i, tc) {
        const json_t *fn = json_object_get(tc, "function");

        append(content.get(),
               tool_use_block(json_str(tc, "id"), json_str(fn, "name"),
                              arguments_object(json_object_get(fn,
                                                               "arguments"))));
    }

    Json m(json_object());
    json_t *u = anthropic_usage_from_chat(usage);
    std::string_view id = json_str(in, "id");

    put(m.get(), "id", id.empty() ? "msg_" + random_hex(12)
                                  : std::string(id));
    put(m.get(), "type", "message");
    put(m.get(), "role", "assistant");
    put(m.get(), "model", model);
    put(m.get(), "content", content.release());
    put(m.get(), "stop_reason",
        refusal.empty()
        ? anthropic_stop_from_chat(json_str(choice, "finish_reason"),
                                   json_array_size(json_object_get(
                                       message, "tool_calls")) > 0)
        : std::string("refusal"));
    put(m.get(), "stop_sequence", json_null());
    put(m.get(), "usage", u);

    out = std::move(m);
    return true;
}


const char *
format_name(llmgw_endpoint_e ep)
{
    switch (ep) {
    case LLMGW_EP_CHAT:
        return "chat";
    case LLMGW_EP_MESSAGES:
        return "messages";
    case LLMGW_EP_GEMINI:
        return "gemini";
    case LLMGW_EP_RERANK:
        return "rerank";
    case LLMGW_EP_MODELS:
        return "models";
    default:
        return "unknown";
    }
}


std::string
no_conversion(llmgw_endpoint_e ep, int type)
{
    return std::string("no conversion from ") + format_name(ep)
           + " to channel type " + std::to_string(type);
}

} /* namespace */


/* ---- requests and answers: entry points ---- */

bool
can_convert(llmgw_endpoint_e from, int to_type)
{
    return (from == LLMGW_EP_CHAT && (to_type == 14 || to_type == 24))
           || (from == LLMGW_EP_MESSAGES && to_type == 1);
}


bool
convert_request(llmgw_endpoint_e from, int to_type, const json_t *in,
    std::string_view upstream_model, Json &out, std::string &err)
{
    try {
        if (!can_convert(from, to_type)) {
            err = no_conversion(from, to_type);
            return false;
        }

        if (!json_is_object(in)) {
            err = "the request body is not a JSON object";
            return false;
        }

        if (from == LLMGW_EP_MESSAGES) {
            return messages_to_chat(in, upstream_model, out, err);
        }

        if (to_type == 14) {
            return chat_to_anthropic(in, upstream_model, out, err);
        }

        return chat_to_gemini(in, out, err);

    } catch (...) {
        err = "the request could not be converted (out of memory)";
        return false;
    }
}


bool
convert_response(int from_type, llmgw_endpoint_e to, const json_t *in,
    std::string_view client_model, Json &out, std::string &err)
{
    try {
        if (!json_is_object(in)) {
            err = "the upstream answer is not a JSON object";
            return false;
        }

        if (to == LLMGW_EP_CHAT && from_type == 14) {
            return anthropic_to_chat_answer(in, client_model, out, err);
        }

        if (to == LLMGW_EP_CHAT && from_type == 24) {
            return gemini_to_chat_answer(in, client_model, out, err);
        }

        if (to == LLMGW_EP_MESSAGES && from_type == 1) {
            return chat_to_anthropic_answer(in, client_model, out, err);
        }

        err = "no conversion from channel type " + std::to_string(from_type)
              + " to " + format_name(to);
        return false;

    } catch (...) {
        err = "the answer could not be converted (out of memory)";
        return false;
    }
}


void
show_billed_usage(llmgw_endpoint_e client, json_t *answer,
    const llmgw_usage_t &billed)
{
    if (client == LLMGW_EP_CHAT) {
        int64_t reasoning = json_int(
            json_object_get(json_object_get(answer, "usage"),
                            "completion_tokens_details"),
            "reasoning_tokens", 0);

        put(answer, "usage", chat_usage_of(billed, reasoning).to_json());

    } else if (client == LLMGW_EP_MESSAGES) {
        put(answer, "usage", anthropic_usage_of(billed));
    }
}


/* ---- streams ---- */

class StreamImpl {
public:
    virtual ~StreamImpl() = default;

    /* An upstream event whose data is a JSON object. */
    virtual void on_json(std::string_view name, const json_t *j,
                         std::string &out) = 0;
    /* The upstream's "data: [DONE]". */
    virtual void on_done(std::string &out) = 0;
    /* The upstream body ended. */
    virtual void finish(std::string &out) = 0;

    /* An error the converter writes ends with the request id. */
    std::string with_id(std::string_view message) const
    {
        std::string m(message);
        if (!request_id.empty()) {
            m += " (request id: " + request_id + ")";
        }
        return m;
    }

    bool usage = true;
    std::string request_id;
    /* the stream ended before the upstream said why (finish() said so) */
    bool cut = false;
    /* the counts the gateway bills (StreamConverter::billed_usage) */
    std::function<llmgw_usage_t()> billed;
};


namespace {

void
emit_data(std::string &out, const json_t *j)
{
    out += "data: ";
    out += json_dump(j);
    out += "\n\n";
}


void
emit_event(std::string &out, std::string_view type, const json_t *j)
{
    out += "event: ";
    out += type;
    out += "\ndata: ";
    out += json_dump(j);
    out += "\n\n";
}


/* What the chat-format streams (Anthropic -> chat, Gemini -> chat) share. */
class ChatStream : public StreamImpl {
public:
    void on_done(std::string &out) override { end(out); }
    void finish(std::string &out) override
    {
        if (!finished_ && !done_ && !errored_) {
            /* the upstream's stream ended before it said why: cut short,
               which a [DONE] would hide from the client */
            done_ = true;
            cut = true;
            send_error(out, "the upstream stream ended before its finish "
                            "reason", "upstream_error", "bad_response_body");
            return;
        }

        end(out);
    }

protected:
    explicit ChatStream(std::string model)
        : model_(std::move(model)),
          created_(static_cast<int64_t>(std::time(nullptr)))
    {}

    /* The usage chunk's counts: what is billed, when that is known here
       (the reasoning detail stays the upstream's), else what was reported. */
    ChatUsage final_usage(const ChatUsage &reported) const
    {
        if (!billed) {
            return reported;
        }

        return chat_usage_of(billed(), reported.reasoning);
    }

    /* Every stream opens with the assistant role, as OpenAI's does. */
    void start(std::string &out, std::string_view id)
    {
        if (started_) {
            return;
        }

        started_ = true;
        id_ = id.empty() ? "chatcmpl-" + random_hex(12) : std::string(id);

        json_t *delta = json_object();

        put(delta, "role", "assistant");
        put(delta, "content", "");
        send_delta(out, delta, nullptr);
    }

    void send_delta(std::string &out, json_t *delta, const char *finish)
    {
        Json c = chunk();
        json_t *choice = json_object();
        json_t *choices = json_array();

        put_int(choice, "index", 0);
        put(choice, "delta", delta);
        put(choice, "finish_reason", finish ? jstr(finish) : json_null());
        append(choices, choice);
        put(c.get(), "choices", choices);
        emit_data(out, c.get());
    }

    void send_text(std::string &out, const char *key, std::string_view text)
    {
        if (text.empty()) {
            return;
        }

        json_t *delta = json_object();

        put(delta, key, text);
        send_delta(out, delta, nullptr);
    }

    void send_tool(std::string &out, json_t *call)
    {
        json_t *delta = json_object();
        json_t *calls = json_array();

        append(calls, call);
        put(delta, "tool_calls", calls);
        send_delta(out, delta, nullptr);
    }

    void send_finish(std::string &out, const char *reason)
    {
        if (!finished_) {
            finished_ = true;
            send_delta(out, json_object(), reason);
        }
    }

    void send_usage(std::string &out, const ChatUsage &u)
    {
        if (usage_sent_ || !usage) {
            return;
        }

        usage_sent_ = true;

        Json c = chunk();

        put(c.get(), "choices", json_array());
        put(c.get(), "usage", u.to_json());
        emit_data(out, c.get());
    }

    void send_error(std::string &out, std::string_view message,
                    std::string_view type, std::string_view code = "")
    {
        Json e(json_object());
        json_t *inner = json_object();

        /* the contract's error object */
        put(inner, "message", with_id(message));
        put(inner, "type", type.empty() ? "upstream_error" : type);
        put(inner, "code", code);
        put(e.get(), "error", inner);
        emit_data(out, e.get());
        errored_ = true;
        /* an error before the finish reason ends the stream short of it,
           as a pass-through stream's does (its row says 502) */
        cut = cut || !finished_;
    }

    /* The usage chunk (when one is due) and [DONE], once. */
    virtual void end(std::string &out) = 0;

    void send_done(std::string &out)
    {
        if (!done_) {
            done_ = true;
            out += "data: [DONE]\n\n";
        }
    }

    Json chunk() const
    {
        Json c(json_object());

        put(c.get(), "id", id_);
        put(c.get(), "object", "chat.completion.chunk");
        put_int(c.get(), "created", created_);
        put(c.get(), "model", model_);

        return c;
    }

    std::string  model_;
    std::string  id_;
    int64_t      created_;
    bool         started_ = false;
    bool         finished_ = false;
    bool         usage_sent_ = false;
    bool         done_ = false;
    bool         errored_ = false;
    int64_t      tools_ = 0;    /* tool calls announced so far */
};


class AnthropicToChat : public ChatStream {
public:
    explicit AnthropicToChat(std::string model)
        : ChatStream(std::move(model))
    {}

    void on_json(std::string_view name, const json_t *j,
                 std::string &out) override
    {
        std::string_view type = json_str(j, "type");

        if (type.empty()) {
            type = name;
        }

        if (type == "message_start") {
            const json_t *msg = json_object_get(j, "message");
            usage_.take(json_object_get(msg, "usage"));
            start(out, json_str(msg, "id"));

        } else if (type == "content_block_start") {
            start(out, {});
            block_start(out, j);

        } else if (type == "content_block_delta") {
            start(out, {});
            block_delta(out, j);

        } else if (type == "content_block_stop") {
            block_stop(out, j);

        } else if (type == "message_delta") {
            start(out, {});
            owe_all(out);
            usage_.take(json_object_get(j, "usage"));
            send_finish(out, chat_finish_from_anthropic(
                            json_str(json_object_get(j, "delta"),
                                     "stop_reason")));
            /* the usage chunk goes last, before [DONE] (end) */

        } else if (type == "message_stop") {
            end(out);

        } else if (type == "error") {
            const json_t *e = json_object_get(j, "error");
            std::string_view type = json_str(e, "type");
            /* Anthropic's type names the error: the code */
            send_error(out, json_str(e, "message"), "", type);
        }

        /* ping: nothing to say */
    }

private:
    void end(std::string &out) override
    {
        if (errored_) {
            /* the error chunk ended it: no [DONE] to say it is whole */
            return;
        }
        if (!finished_) {
            /* message_stop without a message_delta: the answer is whole
               but its reason unsaid; a client reads the last choice chunk
               for one */
            owe_all(out);
            start(out, {});
            send_finish(out, tools_ > 0 ? "tool_calls" : "stop");
        }
        send_usage(out, final_usage(chat_usage(usage_)));
        send_done(out);
    }

    /* A tool block the upstream never closed still gets arguments. */
    void owe_all(std::string &out)
    {
        for (auto &t : tool_index_) {
            tool_arguments_owed(out, t.second);
        }
    }

    void block_start(std::string &out, const json_t *j)
    {
        const json_t *block = json_object_get(j, "content_block");
        std::string_view type = json_str(block, "type");

        if (type == "tool_use") {
            int64_t n = tools_++;
            json_t *call = chat_function_call(json_str(block, "id"),
                                              json_str(block, "name"), "");
            ToolBlock &t = tool_index_[json_int(j, "index", 0)];

            t.call = n;
            t.sent = false;
            /* an input given whole at the start (no deltas follow) */
            const json_t *input = json_object_get(block, "input");
            t.start_input = json_object_size(input) > 0 ? json_dump(input)
                                                        : "{}";
            put_int(call, "index", n);
            send_tool(out, call);

        } else if (type == "text") {
            send_text(out, "content", json_str(block, "text"));

        } else if (type == "thinking") {
            send_text(out, "reasoning_content", json_str(block, "thinking"));
        }
    }

    void block_delta(std::string &out, const json_t *j)
    {
        const json_t *delta = json_object_get(j, "delta");
        std::string_view type = json_str(delta, "type");

        if (type == "text_delta") {
            send_text(out, "content", json_str(delta, "text"));

        } else if (type == "thinking_delta") {
            send_text(out, "reasoning_content", json_str(delta, "thinking"));

        } else if (type == "input_json_delta") {
            auto it = tool_index_.find(json_int(j, "index", 0));
            std::string_view part = json_str(delta, "partial_json");

            if (it == tool_index_.end() || part.empty()) {
                return;
            }

            it->second.sent = true;
            send_arguments(out, it->second.call, part);
        }
    }

    struct ToolBlock {
        int64_t      call = 0;       /* the chat tool call's index */
        bool         sent = false;   /* argument text sent */
        std::string  start_input;    /* what to send when none came */
    };

    void send_arguments(std::string &out, int64_t call_index,
                        std::string_view text)
    {
        json_t *fn = json_object();
        json_t *call = json_object();

        put(fn, "arguments", text);
        put_int(call, "index", call_index);
        put(call, "function", fn);
        send_tool(out, call);
    }

    /*
     * A tool call whose block ends without argument text (a tool with no
     * parameters streams partial_json "" or nothing) gets "{}", as the
     * answer without streaming does: clients parse the arguments as JSON.
     */
    void tool_arguments_owed(std::string &out, ToolBlock &t)
    {
        if (!t.sent) {
            t.sent = true;
            send_arguments(out, t.call, t.start_input);
        }
    }

    void block_stop(std::string &out, const json_t *j)
    {
        auto it = tool_index_.find(json_int(j, "index", 0));

        if (it != tool_index_.end()) {
            tool_arguments_owed(out, it->second);
        }
    }

    AnthropicUsage                usage_;
    std::map<int64_t, ToolBlock>  tool_index_;   /* block -> tool call */
};


class GeminiToChat : public ChatStream {
public:
    explicit GeminiToChat(std::string model)
        : ChatStream(std::move(model))
    {}

    void on_json(std::string_view, const json_t *j,
                 std::string &out) override
    {
        const json_t *e = json_object_get(j, "error");

        if (json_is_object(e)) {
            std::string_view status = json_str(e, "status");
            send_error(out, json_str(e, "message"), "", status);
            return;
        }

        start(out, json_str(j, "responseId"));

        if (json_is_object(json_object_get(j, "usageMetadata"))) {
            usage_ = gemini_usage(json_object_get(j, "usageMetadata"));
            usage_known_ = true;
        }

        const json_t *cand = json_array_get(json_object_get(j, "candidates"),
                                            0);
        size_t  i;
        json_t *part;

        json_array_foreach(json_object_get(json_object_get(cand, "content"),
                                           "parts"), i, part) {
            send_part(out, part);
        }

        std::string_view reason = json_str(cand, "finishReason");

        if (!reason.empty()) {
            send_finish(out, chat_finish_from_gemini(reason, tools_ > 0));
        } else if (cand == nullptr
                   && !json_str(json_object_get(j, "promptFeedback"),
                                "blockReason").empty())
        {
            send_finish(out, "content_filter");
        }
    }

private:
    void end(std::string &out) override
    {
        if (errored_) {
            /* the error chunk ended it: no [DONE] to say it is whole */
            return;
        }
        if (usage_known_ || billed) {
            /* also when no usageMetadata came: what is billed */
            send_usage(out, final_usage(usage_));
        }
        send_done(out);
    }

    void send_part(std::string &out, const json_t *part)
    {
        const json_t *fc = json_object_get(part, "functionCall");

        if (json_is_object(fc)) {
            /* Gemini sends a call whole, never in pieces */
            json_t *call = chat_function_call(
                "call_" + random_hex(12), json_str(fc, "name"),
                arguments_text(json_object_get(fc, "args")));
            put_int(call, "index", tools_++);
            send_tool(out, call);

        } else if (json_t *image = chat_image_of(part)) {
            json_t *delta = json_object();
            json_t *images = json_array();

            append(images, image);
            put(delta, "images", images);
            send_delta(out, delta, nullptr);

        } else if (json_is_true(json_object_get(part, "thought"))) {
            send_text(out, "reasoning_content", json_str(part, "text"));

        } else {
            send_text(out, "content", json_str(part, "text"));
        }
    }

    ChatUsage  usage_;
    bool       usage_known_ = false;
};


/*
 * Whether JSON text read piece by piece has closed its outer object or
 * array: a tool call's arguments are whole there, and nothing the upstream
 * adds after them can belong to a valid value.
 */
class JsonEnd {
public:
    void feed(std::string_view text)
    {
        for (char c : text) {
            int64_t before = bytes_.depth();

            switch (bytes_.step(c)) {
            case JsonBytes::Kind::open:
                whole_ = false;
                break;
            case JsonBytes::Kind::close:
                if (before > 0) {
                    whole_ = bytes_.depth() == 0;
                }
                break;
            default:
                break;
            }
        }
    }

    bool whole() const { return whole_; }

private:
    JsonBytes  bytes_;
    bool       whole_ = false;
};


class ChatToMessages : public StreamImpl {
public:
    explicit ChatToMessages(std::string model)
        : model_(std::move(model))
    {}

    void on_json(std::string_view, const json_t *j,
                 std::string &out) override
    {
        const json_t *e = json_object_get(j, "error");

        if (json_is_object(e)) {
            send_error(out, e);
            errored_ = true;
            cut = cut || (stop_reason_.empty() && !done_seen_);
            return;
        }

        take_usage(json_object_get(j, "usage"));
        start(out, json_str(j, "id"));

        const json_t *choice = json_array_get(json_object_get(j, "choices"),
                                              0);
        const json_t *delta = json_object_get(choice, "delta");
        size_t  i;
        json_t *tc;

        piece(out, Open::thinking, chat_reasoning(delta));
        piece(out, Open::text, openai_text(json_object_get(delta, "content")));

        std::string_view refusal = json_str(delta, "refusal");
        if (!refusal.empty()) {
            refused_ = true;
            piece(out, Open::text, refusal);
        }

        json_array_foreach(json_object_get(delta, "tool_calls"), i, tc) {
            tool_call(out, tc, static_cast<int64_t>(i));
        }

        if (!tool_pending()) {
            release_held(out);
        }

        std::string_view reason = json_str(choice, "finish_reason");

        if (!reason.empty() && stop_reason_.empty()) {
            close_all(out);
            stop_reason_ = refused_ ? std::string("refusal")
                                    : anthropic_stop_from_chat(
                                          reason, !tools_.empty());
        }
    }

    void on_done(std::string &out) override
    {
        done_seen_ = true;
        end(out);
    }

    void finish(std::string &out) override { end(out); }

private:
    void start(std::string &out, std::string_view id)
    {
        if (started_) {
            return;
        }

        started_ = true;

        Json ev(json_object());
        json_t *m = json_object();
        json_t *u = json_object();

        put_int(u, "input_tokens", usage_.prompt_tokens);
        put_int(u, "output_tokens", 0);
        put(m, "id", id.empty() ? "msg_" + random_hex(12) : std::string(id));
        put(m, "type", "message");
        put(m, "role", "assistant");
        put(m, "model", model_);
        put(m, "content", json_array());
        put(m, "stop_reason", json_null());
        put(m, "stop_sequence", json_null());
        put(m, "usage", u);
        put(ev.get(), "type", "message_start");
        put(ev.get(), "message", m);
        emit_event(out, "message_start", ev.get());
    }

    enum class Open { none, text, thinking, tool };

    /* An upstream tool call */
    struct Tool {
        std::string  id;
        std::string  name;
        std::string  held;         /* arguments before its block started */
        int64_t      block = -1;   /* its block, once started */
        JsonEnd      arguments;
    };

    /* A text or thinking block (opened on its first piece: a block is
       never left empty) */
    void open_kind(std::string &out, Open kind)
    {
        json_t *block = json_object();

        if (kind == Open::text) {
            put(block, "type", "text");
            put(block, "text", "");
        } else {
            put(block, "type", "thinking");
            put(block, "thinking", "");
            put(block, "signature", "");
        }
        open_block(out, block);
        open_kind_ = kind;
    }

    void open_block(std::string &out, json_t *block)
    {
        Json ev(json_object());

        open_ = next_block_++;
        open_kind_ = Open::tool;
        put(ev.get(), "type", "content_block_start");
        put_int(ev.get(), "index", open_);
        put(ev.get(), "content_block", block);
        emit_event(out, "content_block_start", ev.get());
    }

    void close_block(std::string &out)
    {
        if (open_ < 0) {
            return;
        }

        Json ev(json_object());

        put(ev.get(), "type", "content_block_stop");
        put_int(ev.get(), "index", open_);
        emit_event(out, "content_block_stop", ev.get());
        open_ = -1;
        tool_open_ = -1;
    }

    void send_block_delta(std::string &out, int64_t index, json_t *delta)
    {
        Json ev(json_object());

        put(ev.get(), "type", "content_block_delta");
        put_int(ev.get(), "index", index);
        put(ev.get(), "delta", delta);
        emit_event(out, "content_block_delta", ev.get());
    }

    /*
     * A piece of text or thinking.  One that comes while a tool call's
     * arguments are not whole waits: the tool's block must stay open for
     * the rest of them (a stopped block takes no delta), so the piece goes
     * once the arguments are whole, or at the end of the answer.
     */
    void piece(std::string &out, Open kind, std::string_view t)
    {
        if (t.empty() || !stop_reason_.empty()) {
            return;
        }

        if (tool_pending()) {
            if (held_.empty() || held_.back().first != kind) {
                held_.emplace_back(kind, std::string());
            }
            held_.back().second += t;
            return;
        }

        send_piece(out, kind, t);
    }

    void send_piece(std::string &out, Open kind, std::string_view t)
    {
        bool text = kind == Open::text;

        if (open_ < 0 || open_kind_ != kind) {
            close_block(out);
            open_kind(out, kind);
        }

        json_t *delta = json_object();

        put(delta, "type", text ? "text_delta" : "thinking_delta");
        put(delta, text ? "text" : "thinking", t);
        send_block_delta(out, open_, delta);
    }

    bool tool_pending()
    {
        return tool_open_ >= 0 && !tools_[tool_open_].arguments.whole();
    }

    /* The pieces that waited for a tool call, in the order they came. */
    void release_held(std::string &out)
    {
        for (const auto &h : held_) {
            send_piece(out, h.first, h.second);
        }
        held_.clear();
    }

    /*
     * Parallel tool calls may interleave their pieces (index 0's name,
     * index 1's name, index 0's arguments, ...), but an Anthropic block
     * gets all its deltas between its start and its stop, and a stopped
     * block none.  The open tool call streams; the others wait with their
     * pieces held until it is whole (its arguments' outer brackets closed)
     * or the answer ends, then open in the order they first came.
     */
    void tool_call(std::string &out, const json_t *tc, int64_t position)
    {
        int64_t n = json_int(tc, "index", position);
        const json_t *fn = json_object_get(tc, "function");
        std::string_view args = json_str(fn, "arguments");

        if (!stop_reason_.empty()) {
            return;
        }

        auto it = tools_.find(n);

        if (it == tools_.end()) {
            it = tools_.emplace(n, Tool()).first;
            it->second.id = json_str(tc, "id");
            it->second.name = json_str(fn, "name");
            waiting_.push_back(n);
        }

        Tool &t = it->second;

        t.arguments.feed(args);

        if (t.block < 0) {
            t.held += args;
            open_waiting(out, false);

        } else if (n == tool_open_) {
            send_arguments(out, t.block, args);
        }

        /* a piece for a block already stopped has nowhere valid to go */
    }

    /* Opens the waiting tool calls' blocks while the open block may stop
       (all of them at the end of the answer). */
    void open_waiting(std::string &out, bool all)
    {
        while (!waiting_.empty()) {
            if (!all && tool_open_ >= 0
                && !tools_[tool_open_].arguments.whole())
            {
                return;
            }

            int64_t n = waiting_.front();
            Tool &t = tools_[n];

            waiting_.erase(waiting_.begin());
            close_block(out);
            open_block(out, tool_use_block(t.id, t.name, json_object()));
            t.block = open_;
            tool_open_ = n;
            send_arguments(out, t.block, t.held);
            t.held.clear();
        }
    }

    void send_arguments(std::string &out, int64_t block,
                        std::string_view args)
    {
        if (args.empty()) {
            return;
        }

        json_t *delta = json_object();

        put(delta, "type", "input_json_delta");
        put(delta, "partial_json", args);
        send_block_delta(out, block, delta);
    }

    /* The waiting tool calls' blocks and pieces, then the last block's
       stop. */
    void close_all(std::string &out)
    {
        open_waiting(out, true);
        release_held(out);
        close_block(out);
    }

    void take_usage(const json_t *u)
    {
        if (!json_is_object(u)) {
            return;
        }

        usage_.prompt_tokens = json_int(u, "prompt_tokens",
                                        usage_.prompt_tokens);
        usage_.completion_tokens = json_int(u, "completion_tokens",
                                            usage_.completion_tokens);
        usage_.cache_read_tokens = json_int(
            json_object_get(u, "prompt_tokens_details"), "cached_tokens",
            usage_.cache_read_tokens);
    }

    /*
     * Sent at the upstream's end, not at its finish reason: an upstream
     * may report usage in every chunk, and the last count, after the
     * finish reason, is the one billed.
     */
    void message_delta(std::string &out)
    {
        Json ev(json_object());
        json_t *d = json_object();

        put(d, "stop_reason",
            stop_reason_.empty() ? anthropic_stop_from_chat("",
                                                            !tools_.empty())
                                 : stop_reason_);
        put(d, "stop_sequence", json_null());
        put(ev.get(), "type", "message_delta");
        put(ev.get(), "delta", d);
        /* the counts the gateway bills: also when the upstream reported
           none, or a part */
        put(ev.get(), "usage", anthropic_usage_of(billed ? billed()
                                                         : usage_));
        emit_event(out, "message_delta", ev.get());
    }

    void end(std::string &out)
    {
        if (stopped_) {
            return;
        }

        if (!started_ && !errored_) {
            /* not one chunk: an empty 200 would look like a whole, empty
               answer */
            stopped_ = true;
            Json e(json_object());
            put(e.get(), "type", "api_error");
            put(e.get(), "message",
                "the upstream stream ended before its first chunk");
            send_error(out, e.get());
            return;
        }

        stopped_ = true;

        if (errored_) {
            /* the upstream's error event said how the stream ended */
            return;
        }

        close_all(out);

        if (stop_reason_.empty() && !done_seen_) {
            /* the upstream's stream ended before it said why: cut short,
               which an end_turn would hide */
            Json e(json_object());
            put(e.get(), "type", "api_error");
            put(e.get(), "message",
                "the upstream stream ended before its finish reason");
            send_error(out, e.get());
            cut = true;
            return;
        }

        message_delta(out);

        Json ev(json_object());

        put(ev.get(), "type", "message_stop");
        emit_event(out, "message_stop", ev.get());
    }

    void send_error(std::string &out, const json_t *e)
    {
        Json ev(json_object());
        json_t *inner = json_object();
        std::string_view type = json_str(e, "type");

        put(inner, "type", type.empty() ? "api_error" : type);
        put(inner, "message", with_id(json_str(e, "message")));
        put(ev.get(), "type", "error");
        put(ev.get(), "error", inner);
        emit_event(out, "error", ev.get());
    }

    std::string                  model_;
    std::string                  stop_reason_;
    std::map<int64_t, Tool>      tools_;        /* by the upstream's index */
    std::vector<int64_t>         waiting_;      /* tool calls without block */
    std::vector<std::pair<Open, std::string>>  held_;   /* see piece() */
    int64_t                      tool_open_ = -1;   /* the one in open_ */
    int64_t                      next_block_ = 0;
    int64_t                      open_ = -1;
    Open                         open_kind_ = Open::none;
    bool                         refused_ = false;
    bool                         done_seen_ = false;
    bool                         errored_ = false;
    bool                         started_ = false;
    bool                         stopped_ = false;
    /* what the upstream reported (prompt_tokens counts the cache) */
    llmgw_usage_t                usage_ { 0, 0, 0, 0, 1, 0 };
};


} /* namespace */


StreamConverter::StreamConverter(int from_type, llmgw_endpoint_e to,
    std::string client_model)
{
    try {
        if (from_type == 14 && to == LLMGW_EP_CHAT) {
            impl_ = std::make_unique<AnthropicToChat>(std::move(client_model));
        } else if (from_type == 24 && to == LLMGW_EP_CHAT) {
            impl_ = std::make_unique<GeminiToChat>(std::move(client_model));
        } else if (from_type == 1 && to == LLMGW_EP_MESSAGES) {
            impl_ = std::make_unique<ChatToMessages>(std::move(client_model));
        }

    } catch (...) {
        impl_.reset();
    }
}


StreamConverter::~StreamConverter() = default;


bool
StreamConverter::usable() const
{
    return impl_ != nullptr;
}


void
StreamConverter::include_usage(bool on)
{
    if (impl_) {
        impl_->usage = on;
    }
}


void
StreamConverter::request_id(std::string id)
{
    if (impl_) {
        impl_->request_id = std::move(id);
    }
}


bool
StreamConverter::event(std::string_view event_name, std::string_view data,
    std::string &out)
{
    size_t mark = out.size();

    if (!impl_) {
        return false;
    }

    try {
        std::string_view d = trim(data);

        if (d == "[DONE]") {
            impl_->on_done(out);
            return true;
        }

        /* "event: ping" without data */
        if (d.empty()) {
            return true;
        }

        Json j = json_parse(d.data(), d.size());

        if (!json_is_object(j.get())) {
            return false;
        }

        impl_->on_json(event_name, j.get(), out);
        return true;

    } catch (...) {
        /* never half an event */
        out.resize(mark);
        return false;
    }
}


void
StreamConverter::finish(std::string &out)
{
    size_t mark = out.size();

    if (!impl_) {
        return;
    }

    try {
        impl_->finish(out);

    } catch (...) {
        out.resize(mark);
    }
}


void
StreamConverter::billed_usage(std::function<llmgw_usage_t()> source)
{
    if (impl_) {
        impl_->billed = std::move(source);
    }
}


bool
StreamConverter::cut() const
{
    return impl_ != nullptr && impl_->cut;
}


/* ---- a whole answer as a stream ---- */

namespace {

/* One chunk with the whole message, the usage chunk when asked, [DONE]. */
std::string
chat_stream_of(const json_t *a, bool include_usage)
{
    std::string out;
    const json_t *choice = json_array_get(json_object_get(a, "choices"), 0);
    const json_t *msg = json_object_get(choice, "message");
    Json c(json_object());
    json_t *delta = json_object();
    json_t *ch = json_object();
    json_t *choices = json_array();
    size_t  i;
    json_t *tc;

    put_copy(c.get(), "id", json_object_get(a, "id"));
    put(c.get(), "object", "chat.completion.chunk");
    put_copy(c.get(), "created", json_object_get(a, "created"));
    put_copy(c.get(), "model", json_object_get(a, "model"));

    put(delta, "role", "assistant");
    for (const char *k : { "content", "reasoning_content", "refusal" }) {
        if (json_is_string(json_object_get(msg, k))) {
            put_copy(delta, k, json_object_get(msg, k));
        }
    }
    if (json_array_size(json_object_get(msg, "tool_calls")) > 0) {
        json_t *calls = json_deep_copy(json_object_get(msg, "tool_calls"));
        json_array_foreach(calls, i, tc) {
            put_int(tc, "index", static_cast<int64_t>(i));
        }
        put(delta, "tool_calls", calls);
    }

    put_int(ch, "index", 0);
    put(ch, "delta", delta);
    put_copy(ch, "finish_reason", json_object_get(choice, "finish_reason"));
    append(choices, ch);
    put(c.get(), "choices", choices);
    emit_data(out, c.get());

    if (include_usage && json_is_object(json_object_get(a, "usage"))) {
        put(c.get(), "choices", json_array());
        put_copy(c.get(), "usage", json_object_get(a, "usage"));
        emit_data(out, c.get());
    }

    out += "data: [DONE]\n\n";
    return out;
}


/* message_start, each block whole, message_delta, message_stop. */
std::string
messages_stream_of(const json_t *m)
{
    std::string out;
    const json_t *usage = json_object_get(m, "usage");
    Json start(json_object());
    json_t *msg = json_deep_copy(m);
    size_t  i;
    json_t *b;

    put(msg, "content", json_array());
    put(msg, "stop_reason", json_null());
    put(msg, "stop_sequence", json_null());
    put(start.get(), "type", "message_start");
    put(start.get(), "message", msg);
    emit_event(out, "message_start", start.get());

    json_array_foreach(json_object_get(m, "content"), i, b) {
        std::string_view type = json_str(b, "type");
        Json ev(json_object());
        json_t *block = json_object();
        json_t *delta = json_object();

        put(block, "type", type);
        if (type == "text") {
            put(block, "text", "");
            put(delta, "type", "text_delta");
            put_copy(delta, "text", json_object_get(b, "text"));
        } else if (type == "thinking") {
            put(block, "thinking", "");
            put(block, "signature", "");
            put(delta, "type", "thinking_delta");
            put_copy(delta, "thinking", json_object_get(b, "thinking"));
        } else if (type == "tool_use") {
            put_copy(block, "id", json_object_get(b, "id"));
            put_copy(block, "name", json_object_get(b, "name"));
            put(block, "input", json_object());
            put(delta, "type", "input_json_delta");
            put(delta, "partial_json", json_dump(json_object_get(b, "input")));
        } else {
            json_decref(block);
            json_decref(delta);
            block = json_deep_copy(b);
            delta = nullptr;
        }

        put(ev.get(), "type", "content_block_start");
        put_int(ev.get(), "index", static_cast<int64_t>(i));
        put(ev.get(), "content_block", block);
        emit_event(out, "content_block_start", ev.get());

        if (delta != nullptr) {
            Json d(json_object());
            put(d.get(), "type", "content_block_delta");
            put_int(d.get(), "index", static_cast<int64_t>(i));
            put(d.get(), "delta", delta);
            emit_event(out, "content_block_delta", d.get());
        }

        /* a thinking block's signature comes as its own delta */
        if (type == "thinking" && !json_str(b, "signature").empty()) {
            Json d(json_object());
            json_t *sig = json_object();
            put(sig, "type", "signature_delta");
            put_copy(sig, "signature", json_object_get(b, "signature"));
            put(d.get(), "type", "content_block_delta");
            put_int(d.get(), "index", static_cast<int64_t>(i));
            put(d.get(), "delta", sig);
            emit_event(out, "content_block_delta", d.get());
        }

        Json stop(json_object());
        put(stop.get(), "type", "content_block_stop");
        put_int(stop.get(), "index", static_cast<int64_t>(i));
        emit_event(out, "content_block_stop", stop.get());
    }

    Json md(json_object());
    json_t *d = json_object();
    put_copy(d, "stop_reason", json_object_get(m, "stop_reason"));
    put_copy(d, "stop_sequence", json_object_get(m, "stop_sequence"));
    put(md.get(), "type", "message_delta");
    put(md.get(), "delta", d);
    if (json_is_object(usage)) {
        put(md.get(), "usage", json_deep_copy(usage));
    }
    emit_event(out, "message_delta", md.get());

    Json stop(json_object());
    put(stop.get(), "type", "message_stop");
    emit_event(out, "message_stop", stop.get());
    return out;
}

}  // namespace


std::string
stream_of_answer(llmgw_endpoint_e client, const json_t *answer,
    bool include_usage)
{
    switch (client) {
    case LLMGW_EP_CHAT:
        return chat_stream_of(answer, include_usage);
    case LLMGW_EP_MESSAGES:
        return messages_stream_of(answer);
    default: {
        /* Gemini's stream is a series of whole answers: this one */
        std::string out;
        emit_data(out, answer);
        return out;
    }
    }
}


/* ---- errors ---- */

namespace {

/* Anthropic's error types by status, for when the caller gave none. */
const char *
anthropic_error_type(int status)
{
    switch (status) {
    case 400:
        return "invalid_request_error";
    case 401:
        return "authentication_error";
    case 403:
        return "permission_error";
    case 404:
        return "not_found_error";
    case 413:
        return "request_too_large";
    case 429:
        return "rate_limit_error";
    case 529:
        return "overloaded_error";
    default:
        return "api_error";
    }
}

} /* namespace */


std::string
convert_error(llmgw_endpoint_e client, int status, std::string_view message,
    std::string_view type, std::string_view code)
{
    bool anthropic = client == LLMGW_EP_MESSAGES;

    try {
        Json root(json_object());
        json_t *inner = json_object();

        if (anthropic) {
            put(root.get(), "type", "error");
            put(inner, "type",
                type.empty() ? anthropic_error_type(status) : type);
            put(inner, "message", message);
        } else {
            put(inner, "message", message);
            put(inner, "type", type);
            put(inner, "code", code);
        }

        put(root.get(), "error", inner);

        std::string s = json_dump(root.get());

        if (!s.empty()) {
            return s;
        }

    } catch (...) {
        /* fall through to the fixed body */
    }

    return anthropic
        ? "{\"type\":\"error\",\"error\":{\"type\":\"api_error\","
          "\"message\":\"internal error\"}}"
        : "{\"error\":{\"message\":\"internal error\","
          "\"type\":\"gateway_error\",\"code\":\"internal_error\"}}";
}


/* ---- rerank ---- */

namespace {

/* The text of a rerank document: a string or {"text": ...}. */
const json_t *
document_text(const json_t *doc)
{
    if (json_is_string(doc)) {
        return doc;
    }

    const json_t *t = json_object_get(doc, "text");

    return json_is_string(t) ? t : nullptr;
}


bool
rerank_documents(const json_t *docs, json_t *out, std::string &err)
{
    size_t  i;
    json_t *d;

    if (docs == nullptr || json_is_null(docs)) {
        err = "field documents is required";
        return false;
    }

    if (!json_is_array(docs) || json_array_size(docs) == 0) {
        err = "documents must be a non-empty array";
        return false;
    }

    json_array_foreach(docs, i, d) {
        const json_t *t = document_text(d);

        if (t == nullptr) {
            err = at("documents", i)
                  + " must be a string or an object with text";
            return false;
        }

        json_array_append_new(out, json_deep_copy(t));
    }

    return true;
}


bool
rerank_options(const json_t *in, json_t *body, std::string &err)
{
    const json_t *top_n = json_object_get(in, "top_n");
    const json_t *ret = json_object_get(in, "return_documents");

    /* top_n goes only when the client gave it: upstreams differ in what
     * an absent top_n means, and the client's intent is "all" */
    if (top_n != nullptr && !json_is_null(top_n)) {
        if (!json_is_integer(top_n) || json_integer_value(top_n) < 1) {
            err = "top_n must be a positive integer";
            return false;
        }
        put_copy(body, "top_n", top_n);
    }

    if (ret != nullptr && !json_is_null(ret)) {
        if (!json_is_boolean(ret)) {
            err = "return_documents must be a boolean";
            return false;
        }
        put_copy(body, "return_documents", ret);
    }

    return true;
}


struct RerankHit {
    int64_t        index;
    double         score;
    const json_t  *result;
};


bool
rerank_hits(const json_t *results, std::vector<RerankHit> &hits,
    std::string &err)
{
    size_t  i;
    json_t *r;

    json_array_foreach(results, i, r) {
        const json_t *index = json_object_get(r, "index");
        const json_t *score = json_object_get(r, "relevance_score");

        if (!json_is_number(score)) {
            score = json_object_get(r, "score");
        }

        if (!json_is_integer(index) || json_integer_value(index) < 0) {
            err = "upstream " + at("results", i) + " has no index";
            return false;
        }

        if (!json_is_number(score)) {
            err = "upstream " + at("results", i) + " has no relevance_score";
            return false;
        }

        hits.push_back({ json_integer_value(index),
                         json_number_value(score), r });
    }

    std::stable_sort(hits.begin(), hits.end(),
                     [](const RerankHit &a, const RerankHit &b) {
                         return a.score > b.score;
                     });

    return true;
}


/* The document text for a hit: the upstream's, else the client's. */
const json_t *
hit_text(const RerankHit &h, const json_t *client_docs)
{
    const json_t *t = document_text(json_object_get(h.result, "document"));

    if (t == nullptr) {
        t = document_text(json_array_get(client_docs,
                                         static_cast<size_t>(h.index)));
    }

    return t;
}


json_t *
rerank_meta(const json_t *upstream)
{
    json_t *meta = json_object();
    Json counts(json_object());
    RerankCount c;

    /* what is read for billing, not the documents */
    for (const char *k : { "meta", "usage" }) {
        if (json_t *v = json_object_get(upstream, k)) {
            put_copy(counts.get(), k, v);
        }
    }

    std::string text = json_dump(counts.get());

    if (rerank_count(JsonView::parse(text), c)) {
        json_t *n = json_object();

        put_int(n, c.name, c.count);
        put(meta, c.billed_units ? "billed_units" : "tokens", n);
    }

    return meta;
}

} /* namespace */


bool
rerank_request(int to_type, const json_t *in, std::string_view upstream_model,
    Json &out, std::string &err)
{
    try {
        if (!endpoint_serves(LLMGW_EP_RERANK, to_type)) {
            err = no_conversion(LLMGW_EP_RERANK, to_type);
            return false;
        }

        const json_t *query = json_object_get(in, "query");
        Json body(json_object());
        Json docs(json_array());

        if (!json_is_string(json_object_get(in, "model"))
            || json_str(in, "model").empty())
        {
            err = "field model is required";
            return false;
        }

        if (query == nullptr || json_is_null(query)) {
            err = "field query is required";
            return false;
        }

        if (!json_is_string(query) || json_string_length(query) == 0) {
            err = "query must be a non-empty string";
            return false;
        }

        if (!rerank_documents(json_object_get(in, "documents"), docs.get(),
                              err))
        {
            return false;
        }

        put(body.get(), "model", upstream_model);
        put_copy(body.get(), "query", query);
        put(body.get(), "documents", docs.release());

        if (!rerank_options(in, body.get(), err)) {
            return false;
        }

        /* the upstream's own options (max_tokens_per_doc, rank_fields,
           ...) go as the client gave them */
        const char *k;
        json_t     *x;

        json_object_foreach(const_cast<json_t *>(in), k, x) {
            if (json_object_get(body.get(), k) == nullptr
                && std::strcmp(k, "documents") != 0
                && std::strcmp(k, "top_n") != 0
                && std::strcmp(k, "return_documents") != 0)
            {
                put_copy(body.get(), k, x);
            }
        }

        out = std::move(body);
        return true;

    } catch (...) {
        err = "the request could not be converted (out of memory)";
        return false;
    }
}


bool
rerank_response(int from_type, const json_t *upstream,
    const json_t *client_request, Json &out, std::string &err)
{
    try {
        if (!endpoint_serves(LLMGW_EP_RERANK, from_type)) {
            err = "no rerank answer from channel type "
                  + std::to_string(from_type);
            return false;
        }

        const json_t *results = json_object_get(upstream, "results");
        std::vector<RerankHit> hits;

        if (!json_is_array(results)) {
            results = json_object_get(upstream, "data");
        }

        if (!json_is_array(results)) {
            err = "the upstream rerank answer has no results";
            return false;
        }

        if (!rerank_hits(results, hits, err)) {
            return false;
        }

        /* each result names a document of the request, once */
        const json_t *docs = json_object_get(client_request, "documents");
        size_t ndocs = json_array_size(docs);
        std::vector<bool> named(ndocs, false);

        for (const RerankHit &h : hits) {
            if (h.index >= static_cast<int64_t>(ndocs)
                || named[static_cast<size_t>(h.index)])
            {
                err = "the upstream rerank answer names document "
                      + std::to_string(h.index)
                      + (h.index >= static_cast<int64_t>(ndocs)
                             ? " of " + std::to_string(ndocs) + " documents"
                             : " twice");
                return false;
            }
            named[static_cast<size_t>(h.index)] = true;
        }

        /* an upstream that ignored top_n must not show more */
        int64_t top_n = json_int(client_request, "top_n", -1);

        if (top_n > 0 && hits.size() > static_cast<size_t>(top_n)) {
            hits.resize(static_cast<size_t>(top_n));
        }

        bool with_docs = json_is_true(json_object_get(client_request,
                                                      "return_documents"));
        Json list(json_array());

        for (const RerankHit &h : hits) {
            json_t *r = json_object();
            const json_t *t = with_docs ? hit_text(h, docs) : nullptr;

            put_int(r, "index", h.index);
            put(r, "relevance_score", json_real(h.score));

            if (t != nullptr) {
                json_t *d = json_object();
                put_copy(d, "text", t);
                put(r, "document", d);
            }

            append(list.get(), r);
        }

        std::string_view id = json_str(upstream, "id");
        Json body(json_object());

        put(body.get(), "id", id.empty() ? "rerank-" + random_hex(16)
                                         : std::string(id));
        put(body.get(), "results", list.release());
        put(body.get(), "meta", rerank_meta(upstream));

        out = std::move(body);
        return true;

    } catch (...) {
        err = "the answer could not be converted (out of memory)";
        return false;
    }
}

} /* namespace llmgw */


/* ---- C entry points for the unit tests ---- */

namespace {

using llmgw::Json;

llmgw_buf_t
error_buf(const std::string &err)
{
    return llmgw::make_buf("ERROR: " + err);
}


llmgw_buf_t
json_buf(const Json &j)
{
    return llmgw::make_buf(llmgw::json_dump(j.get()));
}


Json
parse_text(const char *text)
{
    if (text == nullptr) {
        return Json();
    }

    return llmgw::json_parse(text, std::strlen(text));
}


struct StreamFeed {
    llmgw::StreamConverter  *conv;
    std::string              out;
};


void
on_test_event(void *arg, const llmgw_sse_event_t *ev)
{
    auto *f = static_cast<StreamFeed *>(arg);

    f->conv->event(llmgw::sv(ev->event), llmgw::sv(ev->data), f->out);
}

} /* namespace */


extern "C" llmgw_buf_t
llmgw_test_convert_request(int from_ep, int to_type, const char *json,
    const char *model)
{
    try {
        Json in = parse_text(json);
        Json out;
        std::string err;

        if (!in) {
            return error_buf("invalid JSON");
        }

        if (!llmgw::convert_request(static_cast<llmgw_endpoint_e>(from_ep),
                                    to_type, in.get(), model ? model : "",
                                    out, err))
        {
            return error_buf(err);
        }

        return json_buf(out);

    } catch (...) {
        return { nullptr, 0 };
    }
}


extern "C" llmgw_buf_t
llmgw_test_convert_response(int from_type, int to_ep, const char *json,
    const char *model)
{
    try {
        Json in = parse_text(json);
        Json out;
        std::string err;

        if (!in) {
            return error_buf("invalid JSON");
        }

        if (!llmgw::convert_response(from_type,
                                     static_cast<llmgw_endpoint_e>(to_ep),
                                     in.get(), model ? model : "", out, err))
        {
            return error_buf(err);
        }

        return json_buf(out);

    } catch (...) {
        return { nullptr, 0 };
    }
}


extern "C" llmgw_buf_t
llmgw_test_convert_stream(int from_type, int to_ep, const char *sse_text,
    const char *model)
{
    try {
        llmgw::StreamConverter conv(from_type,
                                    static_cast<llmgw_endpoint_e>(to_ep),
                                    model ? model : "");
        StreamFeed feed { &conv, {} };

        if (!conv.usable()) {
            return error_buf("no stream conversion from channel type "
                             + std::to_string(from_type));
        }

        std::unique_ptr<llmgw_sse_t, void (*)(llmgw_sse_t *)> sse(
            llmgw_sse_new(0), llmgw_sse_free);

        if (!sse || sse_text == nullptr
            || llmgw_sse_feed(sse.get(), sse_text, std::strlen(sse_text),
                              on_test_event, &feed) != 0)
        {
            return error_buf("the SSE text could not be read");
        }

        conv.finish(feed.out);

        return llmgw::make_buf(feed.out);

    } catch (...) {
        return { nullptr, 0 };
    }
}


extern "C" llmgw_buf_t
llmgw_test_convert_error(int client_ep, int status, const char *message,
    const char *type, const char *code)
{
    try {
        return llmgw::make_buf(llmgw::convert_error(
            static_cast<llmgw_endpoint_e>(client_ep), status,
            message ? message : "", type ? type : "", code ? code : ""));

    } catch (...) {
        return { nullptr, 0 };
    }
}


extern "C" llmgw_buf_t
llmgw_test_rerank_request(int to_type, const char *json, const char *model)
{
    try {
        Json in = parse_text(json);
        Json out;
        std::string err;

        if (!in) {
            return error_buf("invalid JSON");
        }

        if (!llmgw::rerank_request(to_type, in.get(), model ? model : "",
                                   out, err))
        {
            return error_buf(err);
        }

        return json_buf(out);

    } catch (...) {
        return { nullptr, 0 };
    }
}


extern "C" llmgw_buf_t
llmgw_test_rerank_response(int from_type, const char *upstream_json,
    const char *client_json)
{
    try {
        Json up = parse_text(upstream_json);
        Json client = parse_text(client_json);
        Json out;
        std::string err;

        if (!up || !client) {
            return error_buf("invalid JSON");
        }

        if (!llmgw::rerank_response(from_type, up.get(), client.get(), out,
                                    err))
        {
            return error_buf(err);
        }

        return json_buf(out);

    } catch (...) {
        return { nullptr, 0 };
    }
}
