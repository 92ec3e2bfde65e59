/*
 * Client request bodies: the 400 errors of the spec (invalid JSON, model
 * not specified, a missing required field), what is read from a valid body
 * (model, stream, max tokens) and the body sent to the channel.
 */

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "llmgw.h"


static llmgw_str_t
S(const char *s)
{
    return (llmgw_str_t) { s, strlen(s) };
}


static const llmgw_str_t no_path_model = { "", 0 };


static llmgw_req_t *
parse_ok(llmgw_endpoint_e ep, llmgw_str_t path_model, const char *body)
{
    llmgw_verdict_t  v = { 0 };
    llmgw_req_t     *r = llmgw_req_parse(ep, path_model, body, strlen(body),
                                         &v);

    if (r == NULL) {
        fail_msg("%s refused: %d %s", body, v.status, v.message);
    }

    return r;
}


static void
assert_refused(llmgw_endpoint_e ep, llmgw_str_t path_model, const char *body,
    const char *code, const char *message)
{
    llmgw_verdict_t  v = { 0 };
    llmgw_req_t     *r = llmgw_req_parse(ep, path_model, body, strlen(body),
                                         &v);

    if (r != NULL) {
        llmgw_req_free(r);
        fail_msg("accepted: %s", body);
    }

    assert_int_equal(v.status, 400);
    assert_string_equal(v.type, "gateway_error");
    assert_string_equal(v.code, code);
    assert_string_equal(v.message, message);
}


static void
assert_str(llmgw_str_t got, const char *want)
{
    assert_int_equal(got.len, strlen(want));
    assert_memory_equal(got.data, want, got.len);
}


static void
test_invalid_json_is_400_invalid_json(void **state)
{
    static const char *const bad[] = {
        "", "{", "{\"model\":\"gpt-4o\",}", "model=gpt-4o", "\xff\xfe{}",
    };
    (void) state;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_refused(LLMGW_EP_CHAT, no_path_model, bad[i], "invalid_json",
                       "invalid JSON request body");
    }
}


static void
test_json_that_is_not_an_object_is_400_invalid_json(void **state)
{
    static const char *const bad[] = { "[]", "\"gpt-4o\"", "42", "null" };
    (void) state;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_refused(LLMGW_EP_CHAT, no_path_model, bad[i], "invalid_json",
                       "invalid JSON request body");
    }
}


/* Each body refused on chat and messages, and rerank_body on rerank. */
static void
assert_model_refused(const char *const *bad, size_t n,
    const char *rerank_body, const char *code, const char *message)
{
    for (size_t i = 0; i < n; i++) {
        assert_refused(LLMGW_EP_CHAT, no_path_model, bad[i], code, message);
        assert_refused(LLMGW_EP_MESSAGES, no_path_model, bad[i], code,
                       message);
    }

    assert_refused(LLMGW_EP_RERANK, no_path_model, rerank_body, code,
                   message);
}


static void
test_missing_or_empty_model_is_400_model_not_specified(void **state)
{
    static const char *const bad[] = {
        "{\"messages\":[]}",
        "{\"model\":\"\",\"messages\":[]}",
        "{\"model\":null,\"messages\":[]}",
    };
    (void) state;

    assert_model_refused(bad, sizeof(bad) / sizeof(bad[0]),
                         "{\"query\":\"q\",\"documents\":[\"a\"]}",
                         "model_not_specified", "Model name not specified");
}


static void
test_model_that_is_no_string_is_400_invalid_request(void **state)
{
    static const char *const bad[] = {
        "{\"model\":42,\"messages\":[]}",
        "{\"model\":true,\"messages\":[]}",
        "{\"model\":[\"gpt-4o\"],\"messages\":[]}",
        "{\"model\":{\"name\":\"gpt-4o\"},\"messages\":[]}",
    };
    (void) state;

    /* as the task endpoints answer it */
    assert_model_refused(bad, sizeof(bad) / sizeof(bad[0]),
                         "{\"model\":7,\"query\":\"q\","
                         "\"documents\":[\"a\"]}",
                         "invalid_request", "model must be a string");
}


static void
test_chat_and_messages_need_messages(void **state)
{
    (void) state;

    assert_refused(LLMGW_EP_CHAT, no_path_model, "{\"model\":\"gpt-4o\"}",
                   "invalid_request", "field messages is required");
    assert_refused(LLMGW_EP_MESSAGES, no_path_model,
                   "{\"model\":\"claude-3\",\"max_tokens\":10}",
                   "invalid_request", "field messages is required");
    assert_refused(LLMGW_EP_CHAT, no_path_model,
                   "{\"model\":\"gpt-4o\",\"messages\":null}",
                   "invalid_request", "field messages is required");
}


static void
test_chat_reads_model_and_stream(void **state)
{
    (void) state;

    llmgw_req_t *r = parse_ok(LLMGW_EP_CHAT, no_path_model,
        "{\"model\":\"gpt-4o\",\"stream\":true,"
        "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}");

    assert_str(llmgw_req_model(r), "gpt-4o");
    assert_int_equal(llmgw_req_stream(r), 1);
    assert_int_equal(llmgw_req_max_tokens(r), -1);
    llmgw_req_free(r);

    r = parse_ok(LLMGW_EP_CHAT, no_path_model,
                 "{\"model\":\"gpt-4o\",\"stream\":false,\"messages\":[]}");
    assert_int_equal(llmgw_req_stream(r), 0);
    llmgw_req_free(r);

    r = parse_ok(LLMGW_EP_CHAT, no_path_model,
                 "{\"model\":\"gpt-4o\",\"messages\":[]}");
    assert_int_equal(llmgw_req_stream(r), 0);
    llmgw_req_free(r);
}


/* a lenient upstream would stream what the gateway reads as no stream */
static void
test_stream_must_be_a_boolean(void **state)
{
    static const char *bad[] = { "\"true\"", "1", "0", "\"false\"", "{}", "[]" };
    char body[128];
    size_t i;
    (void) state;

    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        snprintf(body, sizeof(body),
                 "{\"model\":\"m\",\"stream\":%s,\"messages\":[]}", bad[i]);
        assert_refused(LLMGW_EP_CHAT, no_path_model, body, "invalid_request",
                       "stream must be a boolean");
        assert_refused(LLMGW_EP_MESSAGES, no_path_model, body,
                       "invalid_request", "stream must be a boolean");
    }

    llmgw_req_t *r = parse_ok(LLMGW_EP_CHAT, no_path_model,
        "{\"model\":\"m\",\"stream\":null,\"messages\":[]}");
    assert_int_equal(llmgw_req_stream(r), 0);
    llmgw_req_free(r);
}


static void
test_model_name_is_taken_as_sent(void **state)
{
    (void) state;

    /* a trailing space is the client's: routing turns it into 503 */
    llmgw_req_t *r = parse_ok(LLMGW_EP_CHAT, no_path_model,
                              "{\"model\":\"gpt-4o \",\"messages\":[]}");

    assert_str(llmgw_req_model(r), "gpt-4o ");
    llmgw_req_free(r);
}


static void
test_chat_prefers_max_completion_tokens(void **state)
{
    (void) state;

    llmgw_req_t *r = parse_ok(LLMGW_EP_CHAT, no_path_model,
        "{\"model\":\"o1\",\"messages\":[],\"max_tokens\":100,"
        "\"max_completion_tokens\":4000}");

    assert_int_equal(llmgw_req_max_tokens(r), 4000);
    llmgw_req_free(r);

    r = parse_ok(LLMGW_EP_CHAT, no_path_model,
                 "{\"model\":\"gpt-4o\",\"messages\":[],\"max_tokens\":100}");
    assert_int_equal(llmgw_req_max_tokens(r), 100);
    llmgw_req_free(r);

    r = parse_ok(LLMGW_EP_CHAT, no_path_model,
                 "{\"model\":\"gpt-4o\",\"messages\":[],\"max_tokens\":100,"
                 "\"max_completion_tokens\":null}");
    assert_int_equal(llmgw_req_max_tokens(r), 100);
    llmgw_req_free(r);
}


static void
test_messages_reads_max_tokens_and_stream(void **state)
{
    (void) state;

    llmgw_req_t *r = parse_ok(LLMGW_EP_MESSAGES, no_path_model,
        "{\"model\":\"claude-3-5-sonnet\",\"max_tokens\":1024,"
        "\"stream\":true,\"messages\":[{\"role\":\"user\","
        "\"content\":\"hi\"}]}");

    assert_str(llmgw_req_model(r), "claude-3-5-sonnet");
    assert_int_equal(llmgw_req_max_tokens(r), 1024);
    assert_int_equal(llmgw_req_stream(r), 1);
    llmgw_req_free(r);
}


static void
test_gemini_takes_the_model_from_the_path(void **state)
{
    (void) state;

    llmgw_req_t *r = parse_ok(LLMGW_EP_GEMINI, S("gemini-2.5-flash-tts"),
        "{\"model\":\"ignored\",\"contents\":[{\"parts\":[{\"text\":\"Say"
        " hi\"}]}],\"generationConfig\":{\"responseModalities\":[\"AUDIO\"],"
        "\"maxOutputTokens\":256}}");

    assert_str(llmgw_req_model(r), "gemini-2.5-flash-tts");
    assert_int_equal(llmgw_req_max_tokens(r), 256);
    llmgw_req_free(r);

    /* the body's model does not stand in for a missing path model */
    assert_refused(LLMGW_EP_GEMINI, no_path_model,
                   "{\"model\":\"gemini-pro\",\"contents\":[]}",
                   "model_not_specified", "Model name not specified");
}


static void
test_gemini_needs_contents(void **state)
{
    (void) state;

    assert_refused(LLMGW_EP_GEMINI, S("gemini-pro"),
                   "{\"generationConfig\":{}}",
                   "invalid_request", "field contents is required");
}


/* The spec's audio generation request: generationConfig is required. */
static void
test_gemini_speech_model_needs_generation_config(void **state)
{
    llmgw_req_t *r;
    (void) state;

    assert_refused(LLMGW_EP_GEMINI, S("gemini-2.5-flash-preview-tts"),
                   "{\"contents\":[{\"parts\":[{\"text\":\"hi\"}]}]}",
                   "invalid_request", "field generationConfig is required");
    assert_refused(LLMGW_EP_GEMINI, S("TTS-1-voice"),
                   "{\"contents\":[],\"generationConfig\":null}",
                   "invalid_request", "field generationConfig is required");

    /* in either of Google's spellings */
    r = parse_ok(LLMGW_EP_GEMINI, S("gemini-2.5-pro-preview-tts"),
        "{\"contents\":[],\"generation_config\":{\"response_modalities\":"
        "[\"AUDIO\"]}}");
    llmgw_req_free(r);

    /* a text model, or a name where "tts" is not a part of its own */
    r = parse_ok(LLMGW_EP_GEMINI, S("gemini-2.5-flash"), "{\"contents\":[]}");
    llmgw_req_free(r);
    r = parse_ok(LLMGW_EP_GEMINI, S("gemini-ttsx-1"), "{\"contents\":[]}");
    llmgw_req_free(r);
}


/* Members inside the objects the gateway reads or rewrites that differ
   from one it reads only by letter case: a case-blind upstream would read
   them instead (stream_options.Include_Usage: false would take back the
   usage the gateway asks for). */
static void
test_nested_lookalikes_refused(void **state)
{
    llmgw_req_t *r;
    (void) state;

    assert_refused(LLMGW_EP_CHAT, no_path_model,
        "{\"model\":\"m\",\"stream\":true,\"messages\":[],"
        "\"stream_options\":{\"Include_Usage\":false}}",
        "invalid_request",
        "member \"stream_options.Include_Usage\" differs from a field of "
        "the request only by letter case; upstreams that ignore case would "
        "read it as that field");
    assert_refused(LLMGW_EP_GEMINI, S("gemini-pro"),
        "{\"contents\":[],\"generationConfig\":{\"maxOutputTokens\":1,"
        "\"MaxOutputTokens\":100000}}",
        "invalid_request",
        "member \"generationConfig.MaxOutputTokens\" differs from a field "
        "of the request only by letter case; upstreams that ignore case "
        "would read it as that field");
    assert_refused(LLMGW_EP_GEMINI, S("gemini-pro"),
        "{\"contents\":[],\"generation_config\":{\"Candidate_Count\":8}}",
        "invalid_request",
        "member \"generation_config.Candidate_Count\" differs from a field "
        "of the request only by letter case; upstreams that ignore case "
        "would read it as that field");

    /* the exact names, and other members, pass */
    r = parse_ok(LLMGW_EP_CHAT, no_path_model,
        "{\"model\":\"m\",\"stream\":true,\"messages\":[],"
        "\"stream_options\":{\"include_usage\":false,"
        "\"Include_Obfuscation\":true}}");
    llmgw_req_free(r);
    r = parse_ok(LLMGW_EP_GEMINI, S("gemini-pro"),
        "{\"contents\":[],\"generationConfig\":{\"maxOutputTokens\":1,"
        "\"max_output_tokens\":2,\"candidateCount\":1,\"TopK\":3}}");
    llmgw_req_free(r);
}


static void
test_rerank_needs_query_and_documents(void **state)
{
    llmgw_req_t *r;
    (void) state;

    assert_refused(LLMGW_EP_RERANK, no_path_model,
                   "{\"model\":\"rerank-v3.5\",\"documents\":[\"a\"]}",
                   "invalid_request", "field query is required");
    assert_refused(LLMGW_EP_RERANK, no_path_model,
                   "{\"model\":\"rerank-v3.5\",\"query\":\"q\"}",
                   "invalid_request", "field documents is required");
    /* one that is given but wrong says what is wrong with it */
    assert_refused(LLMGW_EP_RERANK, no_path_model,
                   "{\"model\":\"rerank-v3.5\",\"query\":5,"
                   "\"documents\":[\"a\"]}",
                   "invalid_request", "query must be a non-empty string");
    assert_refused(LLMGW_EP_RERANK, no_path_model,
                   "{\"model\":\"rerank-v3.5\",\"query\":\"\","
                   "\"documents\":[\"a\"]}",
                   "invalid_request", "query must be a non-empty string");
    assert_refused(LLMGW_EP_RERANK, no_path_model,
                   "{\"model\":\"rerank-v3.5\",\"query\":\"q\","
                   "\"documents\":\"aa\"}",
                   "invalid_request", "documents must be a non-empty array");

    r = parse_ok(LLMGW_EP_RERANK, no_path_model,
                 "{\"model\":\"rerank-v3.5\",\"query\":\"capital\","
                 "\"documents\":[\"Paris\",\"Berlin\"],\"top_n\":1}");
    assert_str(llmgw_req_model(r), "rerank-v3.5");
    llmgw_req_free(r);
}


/* A rerank is billed for its query and documents only: nothing of
   llmgw_reserve_tokens, nor of a max_tokens it carries, is reserved. */
static void
test_rerank_reserves_no_output(void **state)
{
    static const char *bodies[] = {
        "{\"model\":\"rerank-v3.5\",\"query\":\"capital\","
        "\"documents\":[\"Paris\",\"Berlin\"]}",
        "{\"model\":\"rerank-v3.5\",\"query\":\"capital\","
        "\"documents\":[\"Paris\"],\"max_tokens\":500}",
    };
    (void) state;

    for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++) {
        llmgw_req_t *r = parse_ok(LLMGW_EP_RERANK, no_path_model, bodies[i]);

        assert_int_equal(llmgw_req_max_tokens(r), 0);
        llmgw_req_free(r);
    }
}


static const llmgw_channel_t openai = { .id = 1, .type = 1 };
static const llmgw_channel_t anthropic = { .id = 2, .type = 14 };
static const llmgw_channel_t gemini = { .id = 3, .type = 24 };


/* The upstream body of r for channel c, parsed. */
static json_t *
upstream(const llmgw_req_t *r, const llmgw_channel_t *c, const char *model,
    int *injected)
{
    json_error_t  err;
    llmgw_buf_t   b = llmgw_req_upstream_body(r, c, S(model), injected);
    json_t       *j;

    assert_non_null(b.data);
    j = json_loadb(b.data, b.len, 0, &err);
    if (j == NULL) {
        fail_msg("upstream body is not JSON: %s", b.data);
    }
    llmgw_buf_free(&b);

    return j;
}


static void
test_upstream_body_replaces_the_model_and_keeps_the_rest(void **state)
{
    (void) state;

    llmgw_req_t *r = parse_ok(LLMGW_EP_CHAT, no_path_model,
        "{\"model\":\"gpt-4o\",\"temperature\":0.5,"
        "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}");
    int      injected = -1;
    json_t  *j = upstream(r, &openai, "gpt-4o-2024-08-06", &injected);
    json_t  *m;

    assert_string_equal(json_string_value(json_object_get(j, "model")),
                        "gpt-4o-2024-08-06");
    assert_true(json_real_value(json_object_get(j, "temperature")) == 0.5);
    m = json_array_get(json_object_get(j, "messages"), 0);
    assert_string_equal(json_string_value(json_object_get(m, "content")),
                        "hi");
    /* not a stream: OpenAI refuses stream_options without stream */
    assert_null(json_object_get(j, "stream_options"));
    assert_int_equal(injected, 0);
    json_decref(j);
    llmgw_req_free(r);
}


static void
test_upstream_body_adds_include_usage_to_an_openai_stream(void **state)
{
    (void) state;

    llmgw_req_t *r = parse_ok(LLMGW_EP_CHAT, no_path_model,
        "{\"model\":\"gpt-4o\",\"stream\":true,\"messages\":[]}");
    int      injected = -1;
    json_t  *j = upstream(r, &openai, "gpt-4o", &injected);

    assert_true(json_is_true(json_object_get(
        json_object_get(j, "stream_options"), "include_usage")));
    assert_int_equal(injected, 1);
    json_decref(j);
    llmgw_req_free(r);

    /* asked for false: usage is still needed, and still held back */
    r = parse_ok(LLMGW_EP_CHAT, no_path_model,
                 "{\"model\":\"gpt-4o\",\"stream\":true,\"messages\":[],"
                 "\"stream_options\":{\"include_usage\":false}}");
    j = upstream(r, &openai, "gpt-4o", &injected);
    assert_true(json_is_true(json_object_get(
        json_object_get(j, "stream_options"), "include_usage")));
    assert_int_equal(injected, 1);
    json_decref(j);
    llmgw_req_free(r);
}


static void
test_upstream_body_keeps_include_usage_the_client_asked_for(void **state)
{
    (void) state;

    llmgw_req_t *r = parse_ok(LLMGW_EP_CHAT, no_path_model,
        "{\"model\":\"gpt-4o\",\"stream\":true,\"messages\":[],"
        "\"stream_options\":{\"include_usage\":true}}");
    int      injected = -1;
    json_t  *j = upstream(r, &openai, "gpt-4o", &injected);

    assert_true(json_is_true(json_object_get(
        json_object_get(j, "stream_options"), "include_usage")));
    /* the client wants the usage chunk: nothing is held back */
    assert_int_equal(injected, 0);
    json_decref(j);
    llmgw_req_free(r);
}


/* The upstream body as text (freed by the caller). */
static char *
upstream_text(llmgw_req_t *r, const llmgw_channel_t *c, const char *model,
    int *injected)
{
    llmgw_buf_t  b = llmgw_req_upstream_body(r, c, S(model), injected);
    char        *t;

    assert_non_null(b.data);
    t = strndup(b.data, b.len);
    llmgw_buf_free(&b);
    return t;
}


/*
 * The model and stream_options are edited in the client's own text: every
 * other byte (spacing, member order, number spelling) reaches the channel
 * as sent.  What cannot be edited plainly still comes out right.
 */
static void
test_upstream_body_is_edited_in_the_client_text(void **state)
{
    (void) state;

    static const struct {
        const char *body;
        const char *model;
        const char *want;       /* NULL: checked as JSON below */
        int         injected;
    } cases[] = {
        /* a mapped model, spacing and numbers kept */
        { "{ \"model\" : \"a\", \"temperature\": 1.50,\"messages\":[] }",
          "b\"x", "{ \"model\" : \"b\\\"x\", \"temperature\": 1.50,"
          "\"messages\":[] }", 0 },
        /* a stream: usage asked for as a new last member */
        { "{\"model\":\"a\",\"stream\":true,\"messages\":[]}\n", "a",
          "{\"model\":\"a\",\"stream\":true,\"messages\":[],"
          "\"stream_options\":{\"include_usage\":true}}\n", 1 },
        /* both edits, and stream_options empty or with other members */
        { "{\"stream_options\":{},\"model\":\"a\",\"stream\":true,"
          "\"messages\":[]}", "z",
          "{\"stream_options\":{\"include_usage\":true},\"model\":\"z\","
          "\"stream\":true,\"messages\":[]}", 1 },
        { "{\"model\":\"a\",\"stream\":true,\"messages\":[],"
          "\"stream_options\": {\"x\":1}}", "a",
          "{\"model\":\"a\",\"stream\":true,\"messages\":[],"
          "\"stream_options\": {\"include_usage\":true,\"x\":1}}", 1 },
        /* not plain: include_usage named, a model given twice */
        { "{\"model\":\"a\",\"stream\":true,\"messages\":[],"
          "\"stream_options\":{\"include_usage\":null}}", "a", NULL, 1 },
        { "{\"model\":\"x\",\"model\":\"a\",\"messages\":[]}", "b", NULL,
          0 },
        { "{\"model\":\"a\",\"stream\":true,\"messages\":[],"
          "\"stream_options\":null}", "a", NULL, 1 },
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        llmgw_req_t *r = parse_ok(LLMGW_EP_CHAT, no_path_model, cases[i].body);
        int          injected = -1;
        char        *t = upstream_text(r, &openai, cases[i].model, &injected);

        if (cases[i].want != NULL) {
            assert_string_equal(t, cases[i].want);
        } else {
            json_error_t  err;
            json_t       *j = json_loads(t, JSON_REJECT_DUPLICATES, &err);

            if (j == NULL) {
                fail_msg("case %zu: %s: %s", i, err.text, t);
            }
            assert_string_equal(json_string_value(json_object_get(j, "model")),
                                cases[i].model);
            if (cases[i].injected) {
                assert_true(json_is_true(json_object_get(
                    json_object_get(j, "stream_options"), "include_usage")));
            }
            json_decref(j);
        }
        assert_int_equal(injected, cases[i].injected);

        free(t);
        llmgw_req_free(r);
    }
}


static void
test_upstream_body_of_a_messages_stream_gets_no_stream_options(void **state)
{
    (void) state;

    llmgw_req_t *r = parse_ok(LLMGW_EP_MESSAGES, no_path_model,
        "{\"model\":\"claude\",\"max_tokens\":10,\"stream\":true,"
        "\"messages\":[]}");
    int      injected = -1;
    json_t  *j = upstream(r, &anthropic, "claude-3-5-sonnet-20241022",
                          &injected);

    assert_string_equal(json_string_value(json_object_get(j, "model")),
                        "claude-3-5-sonnet-20241022");
    assert_null(json_object_get(j, "stream_options"));
    assert_int_equal(injected, 0);
    json_decref(j);
    llmgw_req_free(r);
}


static void
test_upstream_body_of_gemini_gets_no_model_member(void **state)
{
    (void) state;

    /* Gemini names the model in the URL and refuses unknown members */
    llmgw_req_t *r = parse_ok(LLMGW_EP_GEMINI, S("gemini-pro"),
                              "{\"contents\":[{\"parts\":[{\"text\":\"x\"}]}]}");
    int      injected = -1;
    json_t  *j = upstream(r, &gemini, "gemini-1.5-pro-002", &injected);

    assert_null(json_object_get(j, "model"));
    assert_true(json_is_array(json_object_get(j, "contents")));
    assert_int_equal(injected, 0);
    json_decref(j);
    llmgw_req_free(r);
}


int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_invalid_json_is_400_invalid_json),
        cmocka_unit_test(test_json_that_is_not_an_object_is_400_invalid_json),
        cmocka_unit_test(
            test_missing_or_empty_model_is_400_model_not_specified),
        cmocka_unit_test(
            test_model_that_is_no_string_is_400_invalid_request),
        cmocka_unit_test(test_chat_and_messages_need_messages),
        cmocka_unit_test(test_chat_reads_model_and_stream),
        cmocka_unit_test(test_stream_must_be_a_boolean),
        cmocka_unit_test(test_model_name_is_taken_as_sent),
        cmocka_unit_test(test_chat_prefers_max_completion_tokens),
        cmocka_unit_test(test_messages_reads_max_tokens_and_stream),
        cmocka_unit_test(test_gemini_takes_the_model_from_the_path),
        cmocka_unit_test(test_gemini_needs_contents),
        cmocka_unit_test(test_gemini_speech_model_needs_generation_config),
        cmocka_unit_test(test_nested_lookalikes_refused),
        cmocka_unit_test(test_rerank_needs_query_and_documents),
        cmocka_unit_test(test_rerank_reserves_no_output),
        cmocka_unit_test(
            test_upstream_body_replaces_the_model_and_keeps_the_rest),
        cmocka_unit_test(
            test_upstream_body_adds_include_usage_to_an_openai_stream),
        cmocka_unit_test(
            test_upstream_body_keeps_include_usage_the_client_asked_for),
        cmocka_unit_test(
            test_upstream_body_of_a_messages_stream_gets_no_stream_options),
        cmocka_unit_test(test_upstream_body_of_gemini_gets_no_model_member),
        cmocka_unit_test(test_upstream_body_is_edited_in_the_client_text),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
