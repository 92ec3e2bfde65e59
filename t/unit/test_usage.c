/*
 * Usage read from upstream answers (OpenAI, Anthropic, Gemini, rerank; JSON
 * and streams), the injected usage chunk held back from the client, feeds
 * split anywhere, and the estimate when no usage came.
 */

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "llmgw.h"


typedef struct {
    char           *out;        /* what reached the client */
    size_t          len;
    llmgw_usage_t   u;
} run_t;


static void
append(run_t *r, const char *data, size_t len)
{
    r->out = realloc(r->out, r->len + len + 1);
    assert_non_null(r->out);
    memcpy(r->out + r->len, data, len);
    r->len += len;
    r->out[r->len] = '\0';
}


/* the channel credential of the next run_cuts(), when set */
static const char  *run_secret;
/* run_cuts() answers a Gemini stream as one array (llmgw_resp_array), and
   then says in run_cut whether it was cut short */
static int          run_array_mode;
static int          run_cut;


/*
 * Feeds body in pieces ending at the given cut offsets (ascending, each
 * inside the body), then finishes; collects the client bytes and usage.
 */
static run_t
run_cuts(llmgw_endpoint_e ep, int type, int stream, int injected,
    const char *body, const size_t *cuts, size_t ncuts)
{
    run_t          r = { NULL, 0, { 0 } };
    llmgw_resp_t  *resp = llmgw_resp_new(ep, type, stream, injected);
    size_t         total = strlen(body), pos = 0;
    llmgw_buf_t    out;

    assert_non_null(resp);
    append(&r, "", 0);
    if (run_secret != NULL) {
        llmgw_resp_secret(resp, run_secret, strlen(run_secret), "rid", 3);
    }
    if (run_array_mode) {
        llmgw_resp_array(resp);
        assert_true(llmgw_resp_rewrites(resp));
    }

    for (size_t i = 0; i <= ncuts; i++) {
        size_t end = i < ncuts ? cuts[i] : total;

        assert_true(end >= pos && end <= total);
        assert_int_equal(llmgw_resp_feed(resp, body + pos, end - pos, &out),
                         0);
        /* an array passes nothing as it came */
        assert_true(!run_array_mode || out.data != NULL);
        if (out.data == NULL) {
            append(&r, body + pos, end - pos);    /* passed through */
        } else {
            append(&r, out.data, out.len);
            llmgw_buf_free(&out);
        }
        pos = end;
    }

    assert_int_equal(llmgw_resp_finish(resp, &out), 0);
    if (out.data != NULL) {
        append(&r, out.data, out.len);
        llmgw_buf_free(&out);
    }

    run_cut = llmgw_resp_cut(resp);
    llmgw_resp_usage(resp, &r.u);
    llmgw_resp_free(resp);
    return r;
}


static run_t
run(llmgw_endpoint_e ep, int type, int stream, int injected,
    const char *body)
{
    return run_cuts(ep, type, stream, injected, body, NULL, 0);
}


static void
assert_usage(const llmgw_usage_t *u, int64_t prompt, int64_t completion,
    int64_t cache_read, int64_t cache_creation)
{
    assert_int_equal(u->known, 1);
    assert_int_equal(u->prompt_tokens, prompt);
    assert_int_equal(u->completion_tokens, completion);
    assert_int_equal(u->cache_read_tokens, cache_read);
    assert_int_equal(u->cache_creation_tokens, cache_creation);
}


static void
test_openai_json_usage_is_read(void **state)
{
    static const char body[] =
        "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\","
        "\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\","
        "\"content\":\"Hello there\"},\"finish_reason\":\"stop\"}],"
        "\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":34,"
        "\"total_tokens\":46,\"prompt_tokens_details\":"
        "{\"cached_tokens\":5}}}";
    run_t r = run(LLMGW_EP_CHAT, 1, 0, 0, body);
    (void) state;

    assert_usage(&r.u, 12, 34, 5, 0);
    /* a JSON answer reaches the client unchanged */
    assert_string_equal(r.out, body);
    free(r.out);
}


static void
test_anthropic_json_usage_reads_cache_read_and_creation(void **state)
{
    static const char body[] =
        "{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\","
        "\"content\":[{\"type\":\"text\",\"text\":\"Hi!\"}],"
        "\"stop_reason\":\"end_turn\",\"usage\":{\"input_tokens\":21,"
        "\"cache_creation_input_tokens\":300,"
        "\"cache_read_input_tokens\":1200,\"output_tokens\":9}}";
    run_t r = run(LLMGW_EP_MESSAGES, 14, 0, 0, body);
    (void) state;

    assert_usage(&r.u, 21, 9, 1200, 300);
    assert_string_equal(r.out, body);
    free(r.out);
}


static void
test_usage_is_read_from_an_answer_with_an_integer_beyond_int64(void **state)
{
    static const char body[] =
        "{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\","
        "\"content\":[{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"f\","
        "\"input\":{\"id\":123456789012345678901234567890}}],"
        "\"stop_reason\":\"tool_use\",\"usage\":{\"input_tokens\":21,"
        "\"output_tokens\":9}}";
    run_t r = run(LLMGW_EP_MESSAGES, 14, 0, 0, body);
    (void) state;

    assert_usage(&r.u, 21, 9, 0, 0);
    assert_string_equal(r.out, body);
    free(r.out);
}


static void
test_usage_counts_that_are_no_counts_are_no_usage(void **state)
{
    /* billed by estimate rather than as the zero they would read as */
    static const char *const usages[] = {
        "{\"prompt_tokens\":99999999999999999999,\"completion_tokens\":5}",
        "{\"prompt_tokens\":10,\"completion_tokens\":-5}",
        "{\"prompt_tokens\":1e300,\"completion_tokens\":5}",
        "{\"prompt_tokens\":10.5,\"completion_tokens\":5}",
        "{\"prompt_tokens\":\"900\",\"completion_tokens\":\"900\"}",
        "{\"prompt_tokens\":{},\"completion_tokens\":[]}",
        "{\"prompt_tokens\":10,\"completion_tokens\":5,"
        "\"prompt_tokens_details\":{\"cached_tokens\":-1}}",
        "{}",
    };
    char   body[512];
    size_t i;
    (void) state;

    for (i = 0; i < sizeof(usages) / sizeof(usages[0]); i++) {
        snprintf(body, sizeof(body),
                 "{\"id\":\"c\",\"choices\":[{\"index\":0,\"message\":"
                 "{\"role\":\"assistant\",\"content\":\"abcdefgh\"}}],"
                 "\"usage\":%s}", usages[i]);
        run_t r = run(LLMGW_EP_CHAT, 1, 0, 0, body);

        if (r.u.known != 0 || r.u.completion_tokens != 2) {
            fail_msg("usage %s: known %d, completion %lld", usages[i],
                     r.u.known, (long long) r.u.completion_tokens);
        }
        free(r.out);
    }
}


/*
 * An event past the 16 MiB a filtered stream re-frames: what was taken of
 * it goes out as it came and the rest passes through (no byte lost), and
 * the usage after it is still read.
 */
static void
test_stream_event_over_the_limit_is_passed_whole_and_billed(void **state)
{
    static const char  head[] =
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n"
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"";
    static const char  tail[] =
        "\"}}]}\n\n"
        "data: {\"choices\":[{\"index\":0,\"delta\":{},"
        "\"finish_reason\":\"stop\"}]}\n\n"
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":10,"
        "\"completion_tokens\":20}}\n\n"
        "data: [DONE]\n\n";
    size_t  big = (16u << 20) + 100, total, cuts[400], ncuts = 0, at;
    char   *body;
    (void) state;

    total = strlen(head) + big + strlen(tail);
    body = malloc(total + 1);
    assert_non_null(body);
    memcpy(body, head, strlen(head));
    memset(body + strlen(head), 'x', big);
    memcpy(body + strlen(head) + big, tail, strlen(tail) + 1);

    /* 64 KiB reads, the first ending inside the first event */
    for (at = 10; at < total && ncuts < 400; at += 65536) {
        cuts[ncuts++] = at;
    }

    run_t r = run_cuts(LLMGW_EP_CHAT, 1, 1, 1, body, cuts, ncuts);

    /* the client did not ask for usage: hidden while it could be; the
       bytes of every event are there, in order */
    assert_int_equal(r.len, total);
    assert_memory_equal(r.out, body, total);
    assert_usage(&r.u, 10, 20, 0, 0);
    free(r.out);
    free(body);
}


/*
 * An event past the 16 MiB limit, with no usage reported: it went out, so
 * it is an event (a stream of nothing else is no failure), but its bytes
 * are not estimated as text (such events carry inline media: an image's
 * base64 is no completion); filtered or not, whatever the reads.
 */
static void
test_stream_event_over_the_limit_without_usage_is_an_event(void **state)
{
    static const char  head[] =
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n";
    static const char  open[] = "data: {\"choices\":[{\"index\":0,\"delta\":"
                                "{\"content\":\"";
    static const char  close[] = "\"}}]}\n\n";
    static const char  tail[] =
        "data: {\"choices\":[{\"index\":0,\"delta\":{},"
        "\"finish_reason\":\"stop\"}]}\n\n"
        "data: [DONE]\n\n";
    static const size_t steps[] = { 65536, (1u << 20) + 7, 5u << 20 };
    size_t  big = (40u << 20) + 1000, total, cuts[1000], ncuts, at;
    char   *body;
    (void) state;

    total = strlen(head) + strlen(open) + big + strlen(close) + strlen(tail);
    body = malloc(total + 1);
    assert_non_null(body);
    at = 0;
    memcpy(body + at, head, strlen(head));
    at += strlen(head);
    memcpy(body + at, open, strlen(open));
    at += strlen(open);
    memset(body + at, 'x', big);
    at += big;
    memcpy(body + at, close, strlen(close));
    at += strlen(close);
    memcpy(body + at, tail, strlen(tail) + 1);

    for (int injected = 0; injected < 2; injected++) {
        for (size_t k = 0; k < sizeof(steps) / sizeof(steps[0]); k++) {
            ncuts = 0;
            for (at = steps[k]; at < total && ncuts < 1000; at += steps[k]) {
                cuts[ncuts++] = at;
            }
            run_t r = run_cuts(LLMGW_EP_CHAT, 1, 1, injected, body, cuts,
                               ncuts);

            /* every byte went to the client, in order */
            assert_int_equal(r.len, total);
            assert_memory_equal(r.out, body, total);
            assert_int_equal(r.u.known, 0);
            assert_true(r.u.completion_tokens <= 1);
            free(r.out);
        }
    }

    /* nothing but one such event (not even JSON), then [DONE]: an answer */
    char *only = malloc(big + 64);
    assert_non_null(only);
    memcpy(only, "data: ", 6);
    memset(only + 6, '{', big);
    memcpy(only + 6 + big, "\n\ndata: [DONE]\n\n", 17);
    llmgw_resp_t  *resp = llmgw_resp_new(LLMGW_EP_CHAT, 1, 1, 0);
    llmgw_buf_t    out;
    for (at = 0; at < big + 23; at += 65536) {
        size_t n = big + 23 - at < 65536 ? big + 23 - at : 65536;
        assert_int_equal(llmgw_resp_feed(resp, only + at, n, &out), 0);
        llmgw_buf_free(&out);
    }
    assert_int_equal(llmgw_resp_finish(resp, &out), 0);
    llmgw_buf_free(&out);
    assert_int_equal(llmgw_resp_failed(resp, 0), 0);
    llmgw_resp_free(resp);
    free(only);
    free(body);
}


/* A Gemini stream asked for without alt=sse: one JSON array. */
static run_t
run_array(const char *body, const size_t *cuts, size_t ncuts, int *cut)
{
    run_array_mode = 1;
    run_t r = run_cuts(LLMGW_EP_GEMINI, 24, 1, 0, body, cuts, ncuts);
    run_array_mode = 0;
    *cut = run_cut;
    return r;
}


static void
test_gemini_array_stream(void **state)
{
    static const char e1[] = "{\"candidates\":[{\"content\":{\"parts\":"
                             "[{\"text\":\"Hel\"}]}}]}";
    static const char e2[] = "{\"candidates\":[{\"content\":{\"parts\":"
                             "[{\"text\":\"lo\"}]},\"finishReason\":\"STOP\"}],"
                             "\"usageMetadata\":{\"promptTokenCount\":3,"
                             "\"candidatesTokenCount\":2}}";
    char    body[1024], want[1024];
    size_t  cuts[2] = { 9, 40 };
    int     cut;
    (void) state;

    snprintf(body, sizeof(body), "data: %s\r\n\r\ndata: %s\r\n\r\n", e1, e2);
    snprintf(want, sizeof(want), "[%s,\r\n%s]", e1, e2);
    run_t r = run_array(body, cuts, 2, &cut);
    assert_string_equal(r.out, want);
    assert_int_equal(cut, 0);
    assert_usage(&r.u, 3, 2, 0, 0);
    free(r.out);

    /* cut short: left unclosed */
    snprintf(body, sizeof(body), "data: %s\n\n", e1);
    r = run_array(body, NULL, 0, &cut);
    assert_int_equal(cut, 1);
    assert_true(r.len == strlen(e1) + 1 && r.out[0] == '[');
    free(r.out);

    /* no answer at all: nothing, not an empty array */
    r = run_array(": keep-alive\n\n", NULL, 0, &cut);
    assert_int_equal(r.len, 0);
    free(r.out);

    /* an event too large to read: what follows is lost, so the array is
       cut there and not closed */
    size_t big = (17u << 20), n = 0, at, total;
    char  *huge = malloc(big + 2048);
    size_t hcuts[400];
    assert_non_null(huge);
    at = (size_t) sprintf(huge, "data: %s\n\ndata: {\"x\":\"", e1);
    memset(huge + at, 'x', big);
    at += big;
    total = at + (size_t) sprintf(huge + at, "\"}\n\ndata: %s\n\n", e2);
    for (at = 65536; at < total && n < 400; at += 65536) {
        hcuts[n++] = at;
    }
    r = run_array(huge, hcuts, n, &cut);
    assert_int_equal(cut, 1);
    assert_int_equal(r.len, strlen(e1) + 1);
    assert_memory_equal(r.out + 1, e1, strlen(e1));
    free(r.out);
    free(huge);
}


static void
test_usage_counts_whole_reals_and_a_bounded_cache(void **state)
{
    static const char body[] =
        "{\"id\":\"c\",\"choices\":[{\"index\":0,\"message\":"
        "{\"role\":\"assistant\",\"content\":\"x\"}}],"
        "\"usage\":{\"prompt_tokens\":100.0,\"completion_tokens\":20,"
        "\"prompt_tokens_details\":{\"cached_tokens\":1000000}}}";
    run_t r = run(LLMGW_EP_CHAT, 1, 0, 0, body);
    (void) state;

    assert_int_equal(r.u.known, 1);
    assert_usage(&r.u, 100, 20, 100, 0);
    free(r.out);
}


static void
test_json_over_the_limit_passes_and_is_billed_by_its_size(void **state)
{
    size_t  total = (17u << 20) + 8;
    char   *body = malloc(total + 1);
    size_t  cuts[17];
    (void) state;

    assert_non_null(body);
    memcpy(body, "{\"x\":\"", 6);
    memset(body + 6, 'a', total - 8);
    memcpy(body + total - 2, "\"}", 2);
    body[total] = '\0';
    for (size_t i = 0; i < 17; i++) {
        cuts[i] = (i + 1) << 20;
    }

    run_t r = run_cuts(LLMGW_EP_CHAT, 1, 0, 0, body, cuts, 17);

    assert_int_equal(r.len, total);
    assert_int_equal(r.u.known, 0);
    /* every byte counts, those before the limit too */
    assert_int_equal(r.u.completion_tokens, (int64_t) (total / 4));
    free(r.out);
    free(body);
}


/*
 * A body of `head`, then `pad` bytes of 'a' inside a string, then `tail`,
 * fed in 1 MiB pieces and a last piece cut inside the tail.
 */
static run_t
run_large(llmgw_endpoint_e ep, int type, const char *head, size_t pad,
    const char *tail)
{
    size_t  hl = strlen(head), tl = strlen(tail), total = hl + pad + tl;
    char   *body = malloc(total + 1);
    size_t  cuts[40], n = 0;

    assert_non_null(body);
    memcpy(body, head, hl);
    memset(body + hl, 'a', pad);
    memcpy(body + hl + pad, tail, tl + 1);
    for (size_t at = 1u << 20; at < total && n < 39; at += 1u << 20) {
        cuts[n++] = at;
    }
    cuts[n++] = total - tl / 2;

    run_t r = run_cuts(ep, type, 0, 0, body, cuts, n);

    assert_int_equal(r.len, total);
    assert_memory_equal(r.out, body, total);
    free(body);
    return r;
}


static void
test_json_over_the_limit_is_billed_by_its_usage_member(void **state)
{
    (void) state;

    /* OpenAI: usage after the text; a "usage" inside a string, and one
       nested deeper, are not it */
    run_t r = run_large(LLMGW_EP_CHAT, 1,
        "{\"id\":\"x\",\"meta\":{\"usage\":{\"prompt_tokens\":7}},"
        "\"choices\":[{\"message\":{\"content\":\"say \\\"usage\\\":{\\\"prompt_tokens\\\":9} ",
        17u << 20,
        "\"}}],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":20,"
        "\"total_tokens\":30}}");
    assert_usage(&r.u, 10, 20, 0, 0);
    free(r.out);

    /* Gemini: usageMetadata last, after 17 MiB of inline audio */
    r = run_large(LLMGW_EP_GEMINI, 24,
        "{\"candidates\":[{\"content\":{\"parts\":[{\"inlineData\":"
        "{\"mimeType\":\"audio/L16;rate=24000\",\"data\":\"",
        17u << 20,
        "\"}}]},\"finishReason\":\"STOP\"}],\"usageMetadata\":"
        "{\"promptTokenCount\":12,\"candidatesTokenCount\":4000,"
        "\"totalTokenCount\":4012}}");
    assert_usage(&r.u, 12, 4000, 0, 0);
    free(r.out);

    /* Anthropic: usage first, before the long text */
    r = run_large(LLMGW_EP_MESSAGES, 14,
        "{\"id\":\"m\",\"type\":\"message\",\"usage\":{\"input_tokens\":5,"
        "\"output_tokens\":6},\"content\":[{\"type\":\"text\",\"text\":\"",
        17u << 20, "\"}]}");
    assert_usage(&r.u, 5, 6, 0, 0);
    free(r.out);
}


static void
test_gemini_usage_metadata_counts_thoughts_as_completion(void **state)
{
    static const char body[] =
        "{\"candidates\":[{\"content\":{\"role\":\"model\",\"parts\":"
        "[{\"inlineData\":{\"mimeType\":\"audio/L16;rate=24000\","
        "\"data\":\"AAAA\"}}]},\"finishReason\":\"STOP\"}],"
        "\"usageMetadata\":{\"promptTokenCount\":10,"
        "\"candidatesTokenCount\":200,\"thoughtsTokenCount\":50,"
        "\"cachedContentTokenCount\":4,\"totalTokenCount\":260}}";
    run_t r = run(LLMGW_EP_GEMINI, 24, 0, 0, body);
    (void) state;

    assert_usage(&r.u, 10, 250, 4, 0);
    assert_string_equal(r.out, body);
    free(r.out);
}


static void
test_rerank_usage_from_billed_search_units(void **state)
{
    (void) state;

    /* Cohere */
    run_t r = run(LLMGW_EP_RERANK, 34, 0, 0,
        "{\"id\":\"r1\",\"results\":[{\"index\":1,"
        "\"relevance_score\":0.9}],\"meta\":{\"api_version\":"
        "{\"version\":\"1\"},\"billed_units\":{\"search_units\":2}}}");

    assert_usage(&r.u, 2, 0, 0, 0);
    free(r.out);
}


static void
test_rerank_usage_from_usage_total_tokens(void **state)
{
    (void) state;

    /* Jina and OpenAI-compatible rerank servers */
    run_t r = run(LLMGW_EP_RERANK, 38, 0, 0,
        "{\"model\":\"jina-reranker-v2\",\"usage\":{\"total_tokens\":123},"
        "\"results\":[{\"index\":0,\"relevance_score\":0.5}]}");

    assert_usage(&r.u, 123, 0, 0, 0);
    free(r.out);

    /* no usage at all: nothing the upstream wrote is billed as output
       (the ledger bills the request's estimate as the prompt) */
    static const char bare[] =
        "{\"results\":[{\"index\":0,\"relevance_score\":0.5},"
        "{\"index\":1,\"relevance_score\":0.25}]}";
    r = run(LLMGW_EP_RERANK, 1, 0, 0, bare);
    assert_int_equal(r.u.known, 0);
    assert_int_equal(r.u.completion_tokens, 0);
    free(r.out);

    /* billed units without a count leave the usage to read */
    r = run(LLMGW_EP_RERANK, 34, 0, 0,
        "{\"meta\":{\"billed_units\":{}},\"usage\":{\"total_tokens\":44},"
        "\"results\":[{\"index\":0,\"relevance_score\":0.5}]}");
    assert_usage(&r.u, 44, 0, 0, 0);
    free(r.out);
}


/* An OpenAI stream that ends with the usage-only chunk and [DONE]. */
#define OA_CHUNK1 \
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\"," \
    "\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"," \
    "\"content\":\"\"}}],\"usage\":null}\n\n"
#define OA_CHUNK2 \
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\"," \
    "\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"}}]," \
    "\"usage\":null}\n\n"
#define OA_CHUNK3 \
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\"," \
    "\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]," \
    "\"usage\":null}\n\n"
#define OA_USAGE \
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\"," \
    "\"choices\":[],\"usage\":{\"prompt_tokens\":9," \
    "\"completion_tokens\":2,\"total_tokens\":11," \
    "\"prompt_tokens_details\":{\"cached_tokens\":3}}}\n\n"
#define OA_DONE  "data: [DONE]\n\n"

static const char oa_stream[] =
    OA_CHUNK1 OA_CHUNK2 OA_CHUNK3 OA_USAGE OA_DONE;
static const char oa_stream_without_usage_chunk[] =
    OA_CHUNK1 OA_CHUNK2 OA_CHUNK3 OA_DONE;


/* An upstream error event (or a 2xx body) quoting the channel key: the
   client gets "[credential]", wherever the reads cut the key */
static void
test_the_channel_key_never_reaches_the_client(void **state)
{
    static const char *key = "vk-0123456789abcdef";
    static const char *stream =
        "data: {\"choices\":[{\"delta\":{\"content\":\"Hi vk-0\"}}]}\n\n"
        "data: {\"error\":{\"message\":\"Incorrect API key provided: "
        "vk-0123456789abcdef.\"}}\n\n"
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,"
        "\"completion_tokens\":2}}\n\n";
    static const char *json =
        "{\"error\":{\"message\":\"bad key vk-0123456789abcdef\"}}";
    size_t total = strlen(stream);
    (void) state;

    run_secret = key;

    for (size_t cut = 1; cut < total; cut++) {
        run_t r = run_cuts(LLMGW_EP_CHAT, 1, 1, 0, stream, &cut, 1);

        assert_null(strstr(r.out, key));
        assert_non_null(strstr(r.out, "provided: [credential]."));
        /* the rest is as it came: a prefix of the key is no key */
        assert_non_null(strstr(r.out, "\"Hi vk-0\"}}]}\n\n"));
        assert_int_equal(r.len, total - strlen(key) + strlen("[credential]"));
        assert_usage(&r.u, 3, 2, 0, 0);
        free(r.out);
    }

    /* split over three reads, and escaped as some JSON writers do */
    {
        size_t at = (size_t) (strstr(stream, "provided: vk") - stream) + 10;
        size_t cuts[] = { at + 3, at + 6, at + 9 };
        run_t r = run_cuts(LLMGW_EP_CHAT, 1, 1, 0, stream, cuts, 3);
        assert_null(strstr(r.out, key));
        assert_non_null(strstr(r.out, "provided: [credential]."));
        free(r.out);
    }
    {
        run_secret = "vk/0123456789abcdef";
        run_t r = run(LLMGW_EP_CHAT, 1, 0, 0,
                      "{\"error\":{\"message\":\"bad key vk\\/0123456789abcdef\"}}");
        assert_string_equal(r.out,
                            "{\"error\":{\"message\":\"bad key [credential]\"}}");
        free(r.out);
        run_secret = key;
    }

    /* a stream that ends in the start of a key hands it out at the end */
    {
        size_t cut = 5;
        run_t r = run_cuts(LLMGW_EP_CHAT, 1, 1, 0, "data: vk-0123", &cut, 1);
        assert_string_equal(r.out, "data: vk-0123");
        free(r.out);
    }

    {
        run_t r = run(LLMGW_EP_CHAT, 1, 0, 0, json);
        assert_string_equal(r.out,
                            "{\"error\":{\"message\":\"bad key [credential]\"}}");
        free(r.out);
    }

    /* a key too short to be told from the text of an answer (a local
       server's placeholder such as "lm-studio") is left alone there */
    run_secret = "vk-0123456789ab";
    {
        run_t r = run(LLMGW_EP_CHAT, 1, 1, 0, stream);
        assert_string_equal(r.out, stream);
        free(r.out);
    }

    run_secret = NULL;
}


static void
test_openai_stream_usage_chunk_is_read_and_passed_through(void **state)
{
    run_t r = run(LLMGW_EP_CHAT, 1, 1, 0, oa_stream);
    (void) state;

    assert_usage(&r.u, 9, 2, 3, 0);
    /* the client asked for usage itself: every byte reaches it */
    assert_string_equal(r.out, oa_stream);
    free(r.out);
}


static void
test_injected_usage_chunk_is_removed_from_the_stream(void **state)
{
    run_t r = run(LLMGW_EP_CHAT, 1, 1, 1, oa_stream);
    (void) state;

    assert_usage(&r.u, 9, 2, 3, 0);
    assert_string_equal(r.out, oa_stream_without_usage_chunk);
    free(r.out);
}


static void
test_injected_stream_reframes_other_chunks_as_data_lines(void **state)
{
    /* no space after the colon, CRLF line ends, a two-line data field */
    static const char in[] =
        "data:{\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\r\n\r\n"
        "data: {\"choices\":[{\"delta\":\r\ndata: {\"content\":\"b\"}}]}"
        "\r\n\r\n"
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,"
        "\"completion_tokens\":2}}\r\n\r\n"
        "data: [DONE]\r\n\r\n";
    static const char want[] =
        "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n"
        "data: {\"choices\":[{\"delta\":\n"
        "data: {\"content\":\"b\"}}]}\n\n"
        "data: [DONE]\n\n";
    run_t r = run(LLMGW_EP_CHAT, 1, 1, 1, in);
    (void) state;

    assert_string_equal(r.out, want);
    assert_usage(&r.u, 1, 2, 0, 0);
    free(r.out);
}


static const char anthropic_stream[] =
    "event: message_start\n"
    "data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\","
    "\"type\":\"message\",\"role\":\"assistant\",\"content\":[],"
    "\"model\":\"claude-3-5-sonnet\",\"usage\":{\"input_tokens\":25,"
    "\"cache_creation_input_tokens\":7,\"cache_read_input_tokens\":100,"
    "\"output_tokens\":1}}}\n\n"
    "event: content_block_start\n"
    "data: {\"type\":\"content_block_start\",\"index\":0,"
    "\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n"
    "event: ping\n"
    "data: {\"type\": \"ping\"}\n\n"
    "event: content_block_delta\n"
    "data: {\"type\":\"content_block_delta\",\"index\":0,"
    "\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello!\"}}\n\n"
    "event: content_block_stop\n"
    "data: {\"type\":\"content_block_stop\",\"index\":0}\n\n"
    "event: message_delta\n"
    "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":"
    "\"end_turn\",\"stop_sequence\":null},\"usage\":"
    "{\"output_tokens\":15}}\n\n"
    "event: message_stop\n"
    "data: {\"type\":\"message_stop\"}\n\n";


/* A peer gateway (type 60) answers in the client's own dialect. */
static void
test_peer_gateway_usage_is_read_in_the_client_dialect(void **state)
{
    static const char messages[] =
        "{\"id\":\"msg_1\",\"type\":\"message\",\"content\":[],"
        "\"usage\":{\"input_tokens\":21,\"output_tokens\":9,"
        "\"cache_read_input_tokens\":3}}";
    static const char gemini[] =
        "{\"candidates\":[],\"usageMetadata\":{\"promptTokenCount\":10,"
        "\"candidatesTokenCount\":20}}";
    static const char chat[] =
        "{\"choices\":[],\"usage\":{\"prompt_tokens\":4,"
        "\"completion_tokens\":6}}";
    run_t r;
    (void) state;

    r = run(LLMGW_EP_MESSAGES, 60, 0, 0, messages);
    assert_usage(&r.u, 21, 9, 3, 0);
    free(r.out);

    r = run(LLMGW_EP_GEMINI, 60, 0, 0, gemini);
    assert_usage(&r.u, 10, 20, 0, 0);
    free(r.out);

    r = run(LLMGW_EP_CHAT, 60, 0, 0, chat);
    assert_usage(&r.u, 4, 6, 0, 0);
    free(r.out);

    r = run(LLMGW_EP_MESSAGES, 60, 1, 0, anthropic_stream);
    assert_usage(&r.u, 25, 15, 100, 7);
    free(r.out);
}


static void
test_anthropic_stream_usage_from_message_start_and_delta(void **state)
{
    run_t r = run(LLMGW_EP_MESSAGES, 14, 1, 0, anthropic_stream);
    (void) state;

    /* input and cache from message_start, output from message_delta */
    assert_usage(&r.u, 25, 15, 100, 7);
    assert_string_equal(r.out, anthropic_stream);
    free(r.out);
}


/* A final count that is no count: what came before counts for nothing
   either, the stream is billed by estimate. */
static void
test_anthropic_stream_with_a_bad_final_count_is_billed_by_estimate(void **state)
{
    static const char  from[] = "{\"output_tokens\":15}";
    static const char  to[] = "{\"output_tokens\":-1}";
    char              *body = strdup(anthropic_stream);
    char              *at = strstr(body, from);
    (void) state;

    assert_non_null(at);
    assert_int_equal(strlen(from), strlen(to));
    memcpy(at, to, strlen(to));

    run_t r = run(LLMGW_EP_MESSAGES, 14, 1, 0, body);

    assert_int_equal(r.u.known, 0);
    assert_int_equal(r.u.completion_tokens, 1);     /* "Hello!": 6 / 4 */
    free(r.out);
    free(body);
}


static const char gemini_stream[] =
    "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"Hel\"}],"
    "\"role\":\"model\"}}],\"usageMetadata\":{\"promptTokenCount\":8,"
    "\"candidatesTokenCount\":1,\"totalTokenCount\":9}}\r\n\r\n"
    "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"lo\"}],"
    "\"role\":\"model\"},\"finishReason\":\"STOP\"}],\"usageMetadata\":"
    "{\"promptTokenCount\":8,\"candidatesTokenCount\":12,"
    "\"thoughtsTokenCount\":30,\"cachedContentTokenCount\":4,"
    "\"totalTokenCount\":54}}\r\n\r\n";


static void
test_gemini_stream_takes_the_last_usage_metadata(void **state)
{
    run_t r = run(LLMGW_EP_GEMINI, 24, 1, 0, gemini_stream);
    (void) state;

    assert_usage(&r.u, 8, 42, 4, 0);
    assert_string_equal(r.out, gemini_stream);
    free(r.out);
}


/* Gemini's promptTokenCount leaves out the prompt of tool use: it is
   billed as prompt too, in a JSON answer and in a stream. */
static void
test_gemini_tool_use_prompt_is_prompt(void **state)
{
    static const char body[] =
        "{\"candidates\":[{\"content\":{\"role\":\"model\",\"parts\":"
        "[{\"text\":\"42\"}]},\"finishReason\":\"STOP\"}],"
        "\"usageMetadata\":{\"promptTokenCount\":10,"
        "\"toolUsePromptTokenCount\":900,\"candidatesTokenCount\":5,"
        "\"totalTokenCount\":915}}";
    static const char stream[] =
        "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":"
        "\"4\"}],\"role\":\"model\"}}],\"usageMetadata\":"
        "{\"promptTokenCount\":10,\"toolUsePromptTokenCount\":900,"
        "\"candidatesTokenCount\":1}}\r\n\r\n"
        "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":"
        "\"2\"}],\"role\":\"model\"},\"finishReason\":\"STOP\"}],"
        "\"usageMetadata\":{\"promptTokenCount\":10,"
        "\"toolUsePromptTokenCount\":900,\"candidatesTokenCount\":5,"
        "\"totalTokenCount\":915}}\r\n\r\n";
    run_t r = run(LLMGW_EP_GEMINI, 24, 0, 0, body);
    (void) state;

    assert_usage(&r.u, 910, 5, 0, 0);
    free(r.out);

    r = run(LLMGW_EP_GEMINI, 24, 1, 0, stream);
    assert_usage(&r.u, 910, 5, 0, 0);
    free(r.out);
}


/* A later chunk's usageMetadata that leaves a count out keeps what an
   earlier chunk said; one that states it replaces it. */
static void
test_gemini_stream_keeps_counts_a_later_chunk_leaves_out(void **state)
{
    static const char stream[] =
        "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":"
        "\"a\"}],\"role\":\"model\"}}],\"usageMetadata\":"
        "{\"promptTokenCount\":1000,\"candidatesTokenCount\":1}}\r\n\r\n"
        "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":"
        "\"b\"}],\"role\":\"model\"},\"finishReason\":\"STOP\"}],"
        "\"usageMetadata\":{\"candidatesTokenCount\":10,"
        "\"totalTokenCount\":1010}}\r\n\r\n";
    static const char restated[] =
        "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":"
        "\"a\"}],\"role\":\"model\"}}],\"usageMetadata\":"
        "{\"promptTokenCount\":1000,\"candidatesTokenCount\":1}}\r\n\r\n"
        "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":"
        "\"b\"}],\"role\":\"model\"},\"finishReason\":\"STOP\"}],"
        "\"usageMetadata\":{\"promptTokenCount\":700,"
        "\"candidatesTokenCount\":10}}\r\n\r\n";
    run_t r = run(LLMGW_EP_GEMINI, 24, 1, 0, stream);
    (void) state;

    assert_usage(&r.u, 1000, 10, 0, 0);
    free(r.out);

    r = run(LLMGW_EP_GEMINI, 24, 1, 0, restated);
    assert_usage(&r.u, 700, 10, 0, 0);
    free(r.out);
}


/* Every single cut point, then one byte at a time: the same result. */
static void
assert_split_invariant(llmgw_endpoint_e ep, int type, int injected,
    const char *body)
{
    run_t   whole = run(ep, type, 1, injected, body);
    size_t  n = strlen(body);
    size_t *cuts = malloc(n * sizeof(size_t));

    assert_non_null(cuts);
    assert_int_equal(whole.u.known, 1);

    for (size_t k = 1; k < n; k++) {
        run_t r = run_cuts(ep, type, 1, injected, body, &k, 1);

        if (r.len != whole.len || memcmp(r.out, whole.out, r.len) != 0) {
            fail_msg("cut at %zu changed the client bytes:\n%s", k, r.out);
        }
        assert_memory_equal(&r.u, &whole.u, sizeof(r.u));
        free(r.out);
    }

    for (size_t k = 0; k + 1 < n; k++) {
        cuts[k] = k + 1;
    }

    run_t bytes = run_cuts(ep, type, 1, injected, body, cuts, n - 1);

    assert_int_equal(bytes.len, whole.len);
    assert_memory_equal(bytes.out, whole.out, whole.len);
    assert_memory_equal(&bytes.u, &whole.u, sizeof(bytes.u));

    free(bytes.out);
    free(whole.out);
    free(cuts);
}


static void
test_stream_split_at_any_byte_gives_the_same_result(void **state)
{
    (void) state;

    assert_split_invariant(LLMGW_EP_CHAT, 1, 1, oa_stream);
    assert_split_invariant(LLMGW_EP_CHAT, 1, 0, oa_stream);
    assert_split_invariant(LLMGW_EP_MESSAGES, 14, 0, anthropic_stream);
    assert_split_invariant(LLMGW_EP_GEMINI, 24, 0, gemini_stream);
}


static void
test_json_split_at_any_byte_gives_the_same_usage(void **state)
{
    static const char body[] =
        "{\"choices\":[{\"message\":{\"content\":\"ok\"}}],"
        "\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}";
    size_t n = strlen(body);
    (void) state;

    for (size_t k = 1; k < n; k++) {
        run_t r = run_cuts(LLMGW_EP_CHAT, 1, 0, 0, body, &k, 1);

        assert_usage(&r.u, 3, 4, 0, 0);
        assert_string_equal(r.out, body);
        free(r.out);
    }
}


/* The completion tokens estimated for body, which carries no usage. */
static int64_t
estimate_of(llmgw_endpoint_e ep, int type, int stream, const char *body)
{
    run_t    r = run(ep, type, stream, 0, body);
    int64_t  n = r.u.completion_tokens;

    assert_int_equal(r.u.known, 0);
    free(r.out);
    return n;
}


static void
test_stream_without_usage_estimates_completion_from_text(void **state)
{
    /* 40 bytes of content; "usage":null is no usage */
    static const char in[] =
        "data: {\"choices\":[{\"delta\":{\"content\":"
        "\"0123456789abcdefghij\"}}],\"usage\":null}\n\n"
        "data: {\"choices\":[{\"delta\":{\"content\":"
        "\"klmnopqrstuvwxyz0123\"}}],\"usage\":null}\n\n"
        "data: [DONE]\n\n";
    static const char gem[] =
        "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":"
        "\"0123456789abcdefghijklmnopqrstuvwxyz0123\"}]}}]}\r\n\r\n";
    run_t r;
    (void) state;

    r = run(LLMGW_EP_CHAT, 1, 1, 1, in);
    assert_int_equal(r.u.known, 0);
    assert_int_equal(r.u.completion_tokens, 10);
    /* nothing was held back: there was no usage chunk */
    assert_string_equal(r.out, in);
    free(r.out);

    r = run(LLMGW_EP_GEMINI, 24, 1, 0, gem);
    assert_int_equal(r.u.known, 0);
    assert_int_equal(r.u.completion_tokens, 10);
    free(r.out);

    /* Python's spacing around the colon; an escape is the bytes it stands
       for: 20 bytes, then 8 x 2 + 4 = 20 */
    assert_int_equal(estimate_of(LLMGW_EP_CHAT, 1, 1,
        "data: {\"choices\": [{\"delta\": {\"content\": "
        "\"0123456789abcdefghij\"}}]}\n\n"
        "data: {\"choices\": [{\"delta\": {\"content\" :\t \""
        "\\u00e9\\u00e9\\u00e9\\u00e9\\u00e9\\u00e9\\u00e9\\u00E9"
        "\\n\\n\\\"\\\\\"}}]}\n\n"
        "data: [DONE]\n\n"), 10);

    /* "type": "text" is a value, not text */
    assert_int_equal(estimate_of(LLMGW_EP_MESSAGES, 14, 1,
        "event: content_block_start\ndata: {\"type\": \"content_block_start\", "
        "\"content_block\": {\"type\": \"text\", \"text\": \"\"}}\n\n"
        "event: content_block_delta\ndata: {\"type\": \"content_block_delta\", "
        "\"delta\": {\"type\": \"text_delta\", \"text\": \"0123456789ab\"}}\n\n"), 3);
}


/* An error event after text written with spaces is no failure: the text
   was delivered. */
static void
test_stream_error_after_spaced_text_is_no_failure(void **state)
{
    static const char in[] =
        "data: {\"choices\": [{\"delta\": {\"content\": \"abcd\"}}]}\n\n"
        "data: {\"error\": {\"message\": \"boom\"}}\n\n";
    llmgw_resp_t  *resp = llmgw_resp_new(LLMGW_EP_CHAT, 1, 1, 0);
    llmgw_buf_t    out;
    (void) state;

    assert_non_null(resp);
    assert_int_equal(llmgw_resp_feed(resp, in, sizeof(in) - 1, &out), 0);
    llmgw_buf_free(&out);
    assert_int_equal(llmgw_resp_finish(resp, &out), 0);
    llmgw_buf_free(&out);
    assert_int_equal(llmgw_resp_failed(resp, 0), 0);
    llmgw_resp_free(resp);
}


/* Whether a passed-on stream that ends after body was cut short. */
static int
cut_of(llmgw_endpoint_e ep, int type, const char *body)
{
    llmgw_resp_t  *resp = llmgw_resp_new(ep, type, 1, 0);
    llmgw_buf_t    out;
    int            cut;

    assert_non_null(resp);
    assert_int_equal(llmgw_resp_feed(resp, body, strlen(body), &out), 0);
    llmgw_buf_free(&out);
    assert_int_equal(llmgw_resp_finish(resp, &out), 0);
    llmgw_buf_free(&out);
    cut = llmgw_resp_cut(resp);
    llmgw_resp_free(resp);
    return cut;
}


static void
test_a_stream_ended_without_its_end_marker_was_cut(void **state)
{
    (void) state;

    /* OpenAI: [DONE] or a finish reason ends it; quoted in the text, no */
    assert_int_equal(cut_of(LLMGW_EP_CHAT, 1,
        "data: {\"choices\":[{\"delta\":{\"content\":"
        "\"say \\\"finish_reason\\\":\\\"stop\\\"\"},"
        "\"finish_reason\":null}]}\n\n"), 1);
    assert_int_equal(cut_of(LLMGW_EP_CHAT, 1,
        "data: {\"choices\":[{\"delta\":{},"
        "\"finish_reason\" : \"stop\"}]}\n\n"), 0);
    assert_int_equal(cut_of(LLMGW_EP_CHAT, 1,
        "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n"
        "data: [DONE]\n\n"), 0);

    /* Anthropic: message_delta or message_stop */
    assert_int_equal(cut_of(LLMGW_EP_MESSAGES, 14,
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\","
        "\"delta\":{\"type\":\"text_delta\","
        "\"text\":\"{\\\"type\\\":\\\"message_stop\\\"}\"}}\n\n"), 1);
    assert_int_equal(cut_of(LLMGW_EP_MESSAGES, 14,
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"), 0);
    assert_int_equal(cut_of(LLMGW_EP_MESSAGES, 14,
        "data: {\"type\":\"message_delta\",\"delta\":"
        "{\"stop_reason\":\"end_turn\"}}\n\n"), 0);

    /* Gemini: a candidate's finishReason */
    assert_int_equal(cut_of(LLMGW_EP_GEMINI, 24,
        "data: {\"candidates\":[{\"content\":{\"parts\":"
        "[{\"text\":\"x\"}]}}]}\r\n\r\n"), 1);
    assert_int_equal(cut_of(LLMGW_EP_GEMINI, 24,
        "data: {\"candidates\":[{\"finishReason\":\"STOP\"}]}\r\n\r\n"), 0);
    assert_int_equal(cut_of(LLMGW_EP_GEMINI, 24,
        "data: {\"promptFeedback\":{\"blockReason\":\"SAFETY\"}}\r\n\r\n"), 0);

    /* no event at all is a failed answer, not a cut one */
    assert_int_equal(cut_of(LLMGW_EP_CHAT, 1, ""), 0);
}


static void
test_json_without_usage_estimates_completion_from_text(void **state)
{
    run_t r;
    (void) state;

    /* 20 bytes of content */
    r = run(LLMGW_EP_CHAT, 1, 0, 0,
            "{\"choices\":[{\"message\":{\"role\":\"assistant\","
            "\"content\":\"0123456789abcdefghij\"}}]}");
    assert_int_equal(r.u.known, 0);
    assert_int_equal(r.u.completion_tokens, 5);
    free(r.out);

    /* 12 bytes of text */
    r = run(LLMGW_EP_MESSAGES, 14, 0, 0,
            "{\"type\":\"message\",\"content\":[{\"type\":\"text\","
            "\"text\":\"0123456789ab\"}]}");
    assert_int_equal(r.u.known, 0);
    assert_int_equal(r.u.completion_tokens, 3);
    free(r.out);

    /* reasoning (7) and tool arguments (13) with no content: 20 bytes */
    assert_int_equal(estimate_of(LLMGW_EP_CHAT, 1, 0,
        "{\"choices\":[{\"message\":{\"role\":\"assistant\","
        "\"content\":null,\"reasoning_content\":\"thinkin\","
        "\"tool_calls\":[{\"id\":\"t\",\"type\":\"function\","
        "\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":\\\"12345\\\"}\"}}]},"
        "\"finish_reason\":\"tool_calls\"}]}"), 5);

    /* thinking (7), text (4) and a tool's input as JSON text (13) */
    assert_int_equal(estimate_of(LLMGW_EP_MESSAGES, 14, 0,
        "{\"type\":\"message\",\"content\":["
        "{\"type\":\"thinking\",\"thinking\":\"hmmmmmm\",\"signature\":\"s\"},"
        "{\"type\":\"text\",\"text\":\"abcd\"},"
        "{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"f\","
        "\"input\":{\"a\":\"12345\"}}]}"), 6);

    /* a Gemini function call: its JSON (28 bytes) and a text (4) */
    assert_int_equal(estimate_of(LLMGW_EP_GEMINI, 24, 0,
        "{\"candidates\":[{\"content\":{\"parts\":[{\"functionCall\":"
        "{\"name\":\"f\",\"args\":{\"a\":12}}},{\"text\":\"abcd\"}]}}]}"), 8);
}


static void
test_gemini_json_without_usage_estimates_completion_from_text(void **state)
{
    run_t r;
    (void) state;

    /* 40 bytes of text, as in the Gemini stream case */
    r = run(LLMGW_EP_GEMINI, 24, 0, 0,
            "{\"candidates\":[{\"content\":{\"role\":\"model\",\"parts\":"
            "[{\"text\":\"0123456789abcdefghijklmnopqrstuvwxyz0123\"}]},"
            "\"finishReason\":\"STOP\"}]}");
    free(r.out);
    assert_int_equal(r.u.known, 0);
    assert_int_equal(r.u.completion_tokens, 10);
}


static void
test_anthropic_null_usage_fields_keep_earlier_counts(void **state)
{
    /*
     * MessageDeltaUsage declares input and cache counts optional: servers
     * built on those types send null, which is "not reported", not 0.
     */
    static const char in[] =
        "event: message_start\n"
        "data: {\"type\":\"message_start\",\"message\":{\"usage\":"
        "{\"input_tokens\":25,\"cache_creation_input_tokens\":7,"
        "\"cache_read_input_tokens\":100,\"output_tokens\":1}}}\n\n"
        "event: message_delta\n"
        "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":"
        "\"end_turn\"},\"usage\":{\"input_tokens\":null,"
        "\"cache_creation_input_tokens\":null,"
        "\"cache_read_input_tokens\":null,\"output_tokens\":15}}\n\n";
    run_t r = run(LLMGW_EP_MESSAGES, 14, 1, 0, in);
    (void) state;

    free(r.out);
    assert_usage(&r.u, 25, 15, 100, 7);
}


int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_the_channel_key_never_reaches_the_client),
        cmocka_unit_test(test_openai_json_usage_is_read),
        cmocka_unit_test(
            test_usage_is_read_from_an_answer_with_an_integer_beyond_int64),
        cmocka_unit_test(test_usage_counts_that_are_no_counts_are_no_usage),
        cmocka_unit_test(test_usage_counts_whole_reals_and_a_bounded_cache),
        cmocka_unit_test(test_stream_event_over_the_limit_is_passed_whole_and_billed),
        cmocka_unit_test(test_stream_event_over_the_limit_without_usage_is_an_event),
        cmocka_unit_test(test_gemini_array_stream),
        cmocka_unit_test(
            test_json_over_the_limit_passes_and_is_billed_by_its_size),
        cmocka_unit_test(
            test_json_over_the_limit_is_billed_by_its_usage_member),
        cmocka_unit_test(
            test_anthropic_json_usage_reads_cache_read_and_creation),
        cmocka_unit_test(
            test_gemini_usage_metadata_counts_thoughts_as_completion),
        cmocka_unit_test(test_rerank_usage_from_billed_search_units),
        cmocka_unit_test(test_peer_gateway_usage_is_read_in_the_client_dialect),
        cmocka_unit_test(test_rerank_usage_from_usage_total_tokens),
        cmocka_unit_test(
            test_openai_stream_usage_chunk_is_read_and_passed_through),
        cmocka_unit_test(test_injected_usage_chunk_is_removed_from_the_stream),
        cmocka_unit_test(
            test_injected_stream_reframes_other_chunks_as_data_lines),
        cmocka_unit_test(
            test_anthropic_stream_usage_from_message_start_and_delta),
        cmocka_unit_test(
            test_anthropic_stream_with_a_bad_final_count_is_billed_by_estimate),
        cmocka_unit_test(test_gemini_stream_takes_the_last_usage_metadata),
        cmocka_unit_test(test_gemini_tool_use_prompt_is_prompt),
        cmocka_unit_test(
            test_gemini_stream_keeps_counts_a_later_chunk_leaves_out),
        cmocka_unit_test(test_stream_split_at_any_byte_gives_the_same_result),
        cmocka_unit_test(test_a_stream_ended_without_its_end_marker_was_cut),
        cmocka_unit_test(test_json_split_at_any_byte_gives_the_same_usage),
        cmocka_unit_test(
            test_stream_without_usage_estimates_completion_from_text),
        cmocka_unit_test(test_stream_error_after_spaced_text_is_no_failure),
        cmocka_unit_test(
            test_json_without_usage_estimates_completion_from_text),
        cmocka_unit_test(
            test_gemini_json_without_usage_estimates_completion_from_text),
        cmocka_unit_test(
            test_anthropic_null_usage_fields_keep_earlier_counts),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
