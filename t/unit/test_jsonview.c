/*
 * Request bodies are read without building a JSON tree (src/jsonview.cpp).
 * A body must still be accepted or refused exactly as jansson would: these
 * tests hold llmgw_req_parse's "invalid_json" verdict against json_loadb on
 * hand-picked edge cases and on many seeded mutations of valid bodies, and
 * check the fields read from the text (escapes, duplicates, numbers).
 */

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmgw.h"


static const llmgw_str_t no_path_model = { "", 0 };


/*
 * 1 when jansson takes text as the gateway's JSON (an object), else 0.
 * An integer beyond int64 is read as a real, as json_parse reads it.
 * One deliberate difference: jansson drops a NUL byte that directly follows
 * a number or a literal ("{\"a\":1\0}" loads); a NUL byte is never JSON,
 * and the gateway refuses any text that holds one outside an escape.
 */
static int
jansson_object(const char *text, size_t len)
{
    if (memchr(text, 0, len) != NULL) {
        return 0;
    }

    json_error_t  err;
    json_t       *j = json_loadb(text, len, JSON_ALLOW_NUL, &err);

    /* an integer beyond int64 is read as a real (src/core.cpp json_parse) */
    if (j == NULL && json_error_code(&err) == json_error_numeric_overflow) {
        j = json_loadb(text, len, JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL,
                       &err);
    }

    int           ok = json_is_object(j);

    json_decref(j);
    return ok;
}


/* 1 when the gateway reads text as a JSON object, 0 for invalid_json. */
static int
gateway_object(const char *text, size_t len)
{
    llmgw_verdict_t  v = { 0 };
    llmgw_req_t     *r = llmgw_req_parse(LLMGW_EP_NONE, no_path_model, text,
                                         len, &v);

    if (r != NULL) {
        llmgw_req_free(r);
        return 1;
    }
    return strcmp(v.code, "invalid_json") != 0;
}


static void
assert_same(const char *text, size_t len)
{
    int want = jansson_object(text, len);
    int got = gateway_object(text, len);

    if (want != got) {
        char shown[512];
        size_t n = 0;

        /* the text with bytes outside printable ASCII as \xNN */
        for (size_t i = 0; i < len && n + 5 < sizeof(shown); i++) {
            unsigned char c = (unsigned char) text[i];
            n += (size_t) snprintf(shown + n, sizeof(shown) - n,
                                   c >= 0x20 && c < 0x7f ? "%c" : "\\x%02x",
                                   c);
        }
        fail_msg("jansson %s, gateway %s: [%s] (%zu bytes)",
                 want ? "accepts" : "refuses", got ? "accepts" : "refuses",
                 shown, len);
    }
}


#define SAME(lit)  assert_same(lit, sizeof(lit) - 1)


static void
test_edge_cases_match_jansson(void **state)
{
    (void) state;

    /* structure */
    SAME("{}");
    SAME(" \t\r\n{ } \n");
    SAME("[]");
    SAME("");
    SAME("   ");
    SAME("{");
    SAME("}");
    SAME("{\"a\":1,}");
    SAME("{\"a\":1 \"b\":2}");
    SAME("{\"a\" 1}");
    SAME("{a:1}");
    SAME("{\"a\":}");
    SAME("{\"a\":[1,]}");
    SAME("{\"a\":[,1]}");
    SAME("{\"a\":[1 2]}");
    SAME("{} {}");
    SAME("{}x");
    SAME("\xef\xbb\xbf{}");
    SAME("1");
    SAME("\"s\"");
    SAME("null");

    /* literals */
    SAME("{\"a\":true,\"b\":false,\"c\":null}");
    SAME("{\"a\":tru}");
    SAME("{\"a\":truex}");
    SAME("{\"a\":true1}");
    SAME("{\"a\":nul}");
    SAME("{\"a\":True}");

    /* numbers */
    SAME("{\"a\":0,\"b\":-0,\"c\":1.5,\"d\":-1.5e10,\"e\":1E+2,\"f\":1e-2}");
    SAME("{\"a\":01}");
    SAME("{\"a\":-01}");
    SAME("{\"a\":+1}");
    SAME("{\"a\":-}");
    SAME("{\"a\":1.}");
    SAME("{\"a\":.5}");
    SAME("{\"a\":1e}");
    SAME("{\"a\":1e+}");
    SAME("{\"a\":1.e5}");
    SAME("{\"a\":9223372036854775807}");
    SAME("{\"a\":9223372036854775808}");
    SAME("{\"a\":-9223372036854775808}");
    SAME("{\"a\":-9223372036854775809}");
    SAME("{\"a\":10000000000000000000000}");
    SAME("{\"a\":[18446744073709551615,-18446744073709551616,1]}");
    {
        /* 310 digits: beyond a double as well, refused by both */
        char big[400] = "{\"a\":";
        size_t n = strlen(big);
        memset(big + n, '9', 310);
        strcpy(big + n + 310, "}");
        assert_same(big, strlen(big));
        assert_int_equal(gateway_object(big, strlen(big)), 0);
        /* 200 digits: a real */
        big[n + 200] = '}';
        big[n + 201] = '\0';
        assert_same(big, strlen(big));
        assert_int_equal(gateway_object(big, strlen(big)), 1);
    }
    SAME("{\"a\":1e308}");
    SAME("{\"a\":1e309}");
    SAME("{\"a\":-1e309}");
    SAME("{\"a\":1e-400}");
    SAME("{\"a\":0.1e310}");
    SAME("{\"a\":0.000000000000000000001e330}");
    SAME("{\"a\":1x}");
    SAME("{\"a\":0x10}");

    /* strings */
    SAME("{\"a\":\"\\\"\\\\\\/\\b\\f\\n\\r\\t\"}");
    SAME("{\"a\":\"\\x\"}");
    SAME("{\"a\":\"\\u00e9\\u20AC\"}");
    SAME("{\"a\":\"\\u00g9\"}");
    SAME("{\"a\":\"\\u00\"}");
    SAME("{\"a\":\"\\ud83d\\ude00\"}");
    SAME("{\"a\":\"\\ud83d\"}");
    SAME("{\"a\":\"\\ud83dx\"}");
    SAME("{\"a\":\"\\ud83d\\u0041\"}");
    SAME("{\"a\":\"\\ude00\"}");
    SAME("{\"a\":\"\\u0000\"}");
    SAME("{\"\\u0000\":1}");
    SAME("{\"a\\u0000b\":1}");
    SAME("{\"a\":\"tab\there\"}");
    SAME("{\"a\":\"new\nline\"}");
    SAME("{\"a\":\"\x7f\"}");
    SAME("{\"a\":\"unterminated}");
    SAME("{\"a\":\"caf\xc3\xa9\"}");
    SAME("{\"a\":\"\xc3\"}");
    SAME("{\"a\":\"\xc0\x80\"}");
    SAME("{\"a\":\"\xe0\x80\x80\"}");
    SAME("{\"a\":\"\xed\xa0\x80\"}");
    SAME("{\"a\":\"\xf4\x90\x80\x80\"}");
    SAME("{\"a\":\"\xf0\x9f\x98\x80\"}");
    SAME("{\"a\":\"\xff\"}");
    SAME("{\"a\":1}\xff");

    /* a NUL byte in the text itself */
    assert_same("{\"a\":\"x\0y\"}", 11);
    assert_same("{\"a\":1}\0", 8);
    assert_same("{\0}", 3);
    assert_same("{\"a\":1\0}", 8);
    assert_same("{\"a\":true\0}", 11);
}


/* Nesting up to jansson's limit and one beyond, in arrays and objects. */
static void
test_depth_limit_matches_jansson(void **state)
{
    (void) state;

    static const int depths[] = { 100, 2046, 2047, 2048, 2049, 3000 };

    for (size_t d = 0; d < sizeof(depths) / sizeof(depths[0]); d++) {
        int n = depths[d];
        char *buf = malloc((size_t) n * 8 + 16);
        size_t len;

        /* {"a":[[...[ 1 ]...]]} */
        len = 0;
        len += (size_t) sprintf(buf + len, "{\"a\":");
        for (int i = 0; i < n; i++) {
            buf[len++] = '[';
        }
        buf[len++] = '1';
        for (int i = 0; i < n; i++) {
            buf[len++] = ']';
        }
        buf[len++] = '}';
        assert_same(buf, len);

        /* the same with an empty innermost array */
        len = 0;
        len += (size_t) sprintf(buf + len, "{\"a\":");
        for (int i = 0; i < n; i++) {
            buf[len++] = '[';
        }
        for (int i = 0; i < n; i++) {
            buf[len++] = ']';
        }
        buf[len++] = '}';
        assert_same(buf, len);

        /* {"a":{"a":...{}...}} */
        len = 0;
        for (int i = 0; i < n; i++) {
            len += (size_t) sprintf(buf + len, "{\"a\":");
        }
        buf[len++] = '1';
        for (int i = 0; i < n; i++) {
            buf[len++] = '}';
        }
        assert_same(buf, len);

        free(buf);
    }
}


/* A small deterministic generator: the same cases on every run. */
static uint64_t
next_random(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}


/*
 * Valid bodies with bytes replaced, inserted or deleted: most mutations
 * break the text, some keep it valid, and jansson is the judge of which.
 */
static void
test_mutations_match_jansson(void **state)
{
    (void) state;

    static const char *seeds[] = {
        "{\"model\":\"gpt-4o\",\"messages\":[{\"role\":\"user\",\"content\":"
        "\"Hello, \\\"world\\\" \\u00e9\\ud83d\\ude00 caf\xc3\xa9\"}],"
        "\"max_tokens\":128,\"temperature\":0.7,\"stream\":true,"
        "\"stream_options\":{\"include_usage\":false},\"stop\":null}",
        "{\"a\":[1,-2,3.5e-3,true,false,null,{},[],\"\\n\\t\\/\"],"
        "\"b\":{\"c\":{\"d\":[[[\"x\"]]]}},\"e\":-0.0E+1}",
        "{\"query\":\"q\",\"documents\":[\"a\",{\"text\":\"b\"}],"
        "\"top_n\":2,\"return_documents\":true}",
    };
    /* bytes that matter to a JSON reader */
    static const char alphabet[] = "{}[]:,\"\\/-+.0123456789eEtrufalsn \t\n"
                                   "u\x00\x1f\x7f\xc3\xa9\xed\xa0\xf0\x9f\xff";
    uint64_t rng = 0x9e3779b97f4a7c15ULL;
    int accepted = 0, refused = 0;

    for (size_t s = 0; s < sizeof(seeds) / sizeof(seeds[0]); s++) {
        size_t base = strlen(seeds[s]);
        char *buf = malloc(base + 8);

        for (int round = 0; round < 20000; round++) {
            size_t len = base;
            int edits = 1 + (int) (next_random(&rng) % 3);

            memcpy(buf, seeds[s], base);

            for (int e = 0; e < edits && len > 0; e++) {
                size_t at = next_random(&rng) % len;
                char c = alphabet[next_random(&rng) % (sizeof(alphabet) - 1)];

                switch (next_random(&rng) % 3) {
                case 0:
                    buf[at] = c;
                    break;
                case 1:
                    memmove(buf + at + 1, buf + at, len - at);
                    buf[at] = c;
                    len++;
                    break;
                default:
                    memmove(buf + at, buf + at + 1, len - at - 1);
                    len--;
                }
            }

            assert_same(buf, len);
            if (jansson_object(buf, len)) {
                accepted++;
            } else {
                refused++;
            }
        }

        free(buf);
    }

    /* both outcomes were exercised */
    assert_true(accepted > 1000);
    assert_true(refused > 1000);
}


static llmgw_req_t *
parse(llmgw_endpoint_e ep, const char *body)
{
    llmgw_verdict_t  v = { 0 };
    llmgw_req_t     *r = llmgw_req_parse(ep, no_path_model, body,
                                         strlen(body), &v);

    if (r == NULL) {
        fail_msg("%s refused: %d %s", body, v.status, v.message);
    }
    return r;
}


/* Names and values as a tree would give them: decoded, the last duplicate. */
static void
test_fields_are_read_as_jansson_reads_them(void **state)
{
    (void) state;

    llmgw_req_t *r;
    llmgw_str_t  m;

    /* an escaped name and an escaped value */
    r = parse(LLMGW_EP_CHAT, "{\"mo\\u0064el\":\"gpt\\u002d4\\ud83d\\ude00\","
                             "\"messages\":[]}");
    m = llmgw_req_model(r);
    assert_int_equal(m.len, strlen("gpt-4\xf0\x9f\x98\x80"));
    assert_memory_equal(m.data, "gpt-4\xf0\x9f\x98\x80", m.len);
    llmgw_req_free(r);

    /* duplicates: the last one counts */
    r = parse(LLMGW_EP_CHAT, "{\"model\":\"a\",\"stream\":true,\"messages\":[],"
                             "\"model\":\"b\",\"stream\":false,"
                             "\"max_tokens\":5,\"max_tokens\":7}");
    m = llmgw_req_model(r);
    assert_int_equal(m.len, 1);
    assert_memory_equal(m.data, "b", 1);
    assert_int_equal(llmgw_req_stream(r), 0);
    assert_int_equal(llmgw_req_max_tokens(r), 7);
    llmgw_req_free(r);

    /* numbers: a real is truncated, a string is not a number */
    r = parse(LLMGW_EP_CHAT, "{\"model\":\"a\",\"messages\":[],"
                             "\"max_tokens\":12.9}");
    assert_int_equal(llmgw_req_max_tokens(r), 12);
    llmgw_req_free(r);

    r = parse(LLMGW_EP_CHAT, "{\"model\":\"a\",\"messages\":[],"
                             "\"max_tokens\":\"12\"}");
    assert_int_equal(llmgw_req_max_tokens(r), -1);
    llmgw_req_free(r);

    /* 0 and below are not given (many upstreams read 0 as not given) */
    r = parse(LLMGW_EP_CHAT, "{\"model\":\"a\",\"messages\":[],"
                             "\"max_tokens\":-9223372036854775808}");
    assert_int_equal(llmgw_req_max_tokens(r), -1);
    llmgw_req_free(r);

    /* nested: Gemini's generationConfig */
    {
        llmgw_verdict_t v = { 0 };
        const char *b = "{\"contents\":[],\"generationConfig\":"
                        "{\"x\":{\"maxOutputTokens\":1},\"maxOutputTokens\":64}}";
        llmgw_str_t pm = { "gemini-tts", 10 };

        r = llmgw_req_parse(LLMGW_EP_GEMINI, pm, b, strlen(b), &v);
        assert_non_null(r);
        assert_int_equal(llmgw_req_max_tokens(r), 64);
        llmgw_req_free(r);
    }

    /* "stream": only the literal true streams (other values than booleans
       are refused on chat and messages) */
    r = parse(LLMGW_EP_RERANK, "{\"model\":\"a\",\"query\":\"q\","
                               "\"documents\":[\"d\"],\"stream\":1}");
    assert_int_equal(llmgw_req_stream(r), 0);
    llmgw_req_free(r);

    /* a model name of more than 1024 bytes is refused */
    {
        llmgw_verdict_t v = { 0 };
        char b[1200];

        snprintf(b, sizeof(b), "{\"model\":\"%01025d\",\"messages\":[]}", 7);
        assert_null(llmgw_req_parse(LLMGW_EP_CHAT, no_path_model, b,
                                    strlen(b), &v));
        assert_int_equal(v.status, 400);
        assert_string_equal(v.message, "model: a model name has at most 1024 bytes");

        snprintf(b, sizeof(b), "{\"model\":\"%01024d\",\"messages\":[]}", 7);
        llmgw_req_free(parse(LLMGW_EP_CHAT, b));
    }

    /* a model that is not a string is refused as one */
    {
        llmgw_verdict_t v = { 0 };
        const char *b = "{\"model\":7,\"messages\":[]}";

        assert_null(llmgw_req_parse(LLMGW_EP_CHAT, no_path_model, b,
                                    strlen(b), &v));
        assert_string_equal(v.code, "invalid_request");
    }
}


/* The prompt estimate counts decoded text, not media or escapes. */
static void
test_prompt_estimate_counts_decoded_text(void **state)
{
    (void) state;

    llmgw_req_t *plain, *escaped, *media;

    plain = parse(LLMGW_EP_CHAT, "{\"model\":\"m\",\"messages\":"
                                 "[{\"role\":\"user\",\"content\":\"abcdefgh\"}]}");
    escaped = parse(LLMGW_EP_CHAT, "{\"model\":\"m\",\"messages\":"
                                   "[{\"role\":\"user\",\"content\":"
                                   "\"\\u0061bcdefg\\u0068\"}]}");
    media = parse(LLMGW_EP_CHAT, "{\"model\":\"m\",\"messages\":"
                                 "[{\"role\":\"user\",\"content\":\"abcdefgh\","
                                 "\"image_url\":{\"url\":\"data:image/png;base64,"
                                 "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\"}}]}");

    /* "m" + "user" + "abcdefgh" = 13 bytes: 13 / 4 + 4 */
    assert_int_equal(llmgw_req_prompt_estimate(plain), 13 / 4 + 4);
    assert_int_equal(llmgw_req_prompt_estimate(escaped), 13 / 4 + 4);
    assert_int_equal(llmgw_req_prompt_estimate(media), 13 / 4 + 4);

    llmgw_req_free(plain);
    llmgw_req_free(escaped);
    llmgw_req_free(media);
}


/* Prompt text counts strings at any depth, in one pass. */
static void
test_prompt_estimate_counts_every_depth(void **state)
{
    (void) state;

    for (int k = 30; k <= 300; k += 30) {
        char body[1024];
        size_t len = 0;
        llmgw_req_t *r;

        len += (size_t) sprintf(body + len, "{\"model\":\"m\",\"messages\":[],"
                                            "\"x\":");
        for (int i = 0; i < k; i++) {
            body[len++] = '[';
        }
        len += (size_t) sprintf(body + len, "\"abcdefgh\"");
        for (int i = 0; i < k; i++) {
            body[len++] = ']';
        }
        body[len++] = '}';
        body[len] = '\0';

        r = parse(LLMGW_EP_CHAT, body);
        /* "m" and "abcdefgh" */
        assert_int_equal(llmgw_req_prompt_estimate(r), 9 / 4 + 4);
        llmgw_req_free(r);
    }
}


/* Text under "data" counts (an Anthropic text document); base64 and data
   URLs do not, wherever they are. */
static void
test_prompt_estimate_counts_text_documents_not_base64(void **state)
{
    (void) state;

    char         text[1200], b64[1200], body[4096];
    llmgw_req_t *r;

    for (int i = 0; i < 1000; i++) {
        text[i] = i % 10 == 9 ? ' ' : 'a';
        b64[i] = "QUJDa9+/"[i % 8];
    }
    text[1000] = b64[1000] = '\0';

    snprintf(body, sizeof(body),
             "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":"
             "[{\"type\":\"document\",\"source\":{\"type\":\"text\","
             "\"data\":\"%s\"}}]}]}", text);
    r = parse(LLMGW_EP_MESSAGES, body);
    /* "m", "user", "document", "text" and the text: 1017 bytes */
    assert_int_equal(llmgw_req_prompt_estimate(r), 1017 / 4 + 4);
    llmgw_req_free(r);

    snprintf(body, sizeof(body),
             "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":"
             "[{\"type\":\"file\",\"file\":{\"file_data\":"
             "\"data:application/pdf;base64,%s\"}},"
             "{\"type\":\"input_audio\",\"input_audio\":{\"data\":\"%s\"}}]}]}",
             b64, b64);
    r = parse(LLMGW_EP_CHAT, body);
    /* "m", "user", "file", "input_audio" */
    assert_int_equal(llmgw_req_prompt_estimate(r), 20 / 4 + 4);
    llmgw_req_free(r);

    /* text written with \\u escapes (as Python's json.dumps writes CJK)
       counts decoded; base64 counts where it is no media member */
    {
        char esc[2000];
        size_t o = 0;

        for (int i = 0; i < 300; i++) {
            o += (size_t) sprintf(esc + o, "\\u4f60");
        }
        snprintf(body, sizeof(body),
                 "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":"
                 "\"%s\"},{\"role\":\"user\",\"content\":\"%s\"}]}", esc, b64);
        r = parse(LLMGW_EP_CHAT, body);
        /* "m", "user" twice, 900 bytes of text, 1000 of base64 */
        assert_int_equal(llmgw_req_prompt_estimate(r), 1909 / 4 + 4);
        llmgw_req_free(r);
    }

    /* a long run of one letter, or of hex digits, is text */
    memset(text, 'p', 1000);
    snprintf(body, sizeof(body),
             "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":"
             "\"%s\"}]}", text);
    r = parse(LLMGW_EP_CHAT, body);
    assert_int_equal(llmgw_req_prompt_estimate(r), 1005 / 4 + 4);
    llmgw_req_free(r);
}


/* The output limit and the number of answers a reservation is made for. */
static void
test_max_tokens_and_choices(void **state)
{
    (void) state;

    llmgw_req_t *r;

    /* max_completion_tokens 0 does not hide max_tokens */
    r = parse(LLMGW_EP_CHAT, "{\"model\":\"a\",\"messages\":[],"
              "\"max_completion_tokens\":0,\"max_tokens\":50000}");
    assert_int_equal(llmgw_req_max_tokens(r), 50000);
    assert_int_equal(llmgw_req_choices(r), 1);
    llmgw_req_free(r);

    /* both given: the larger, as upstreams differ in which wins */
    r = parse(LLMGW_EP_CHAT, "{\"model\":\"a\",\"messages\":[],"
              "\"max_completion_tokens\":300,\"max_tokens\":20,\"n\":8}");
    assert_int_equal(llmgw_req_max_tokens(r), 300);
    assert_int_equal(llmgw_req_choices(r), 8);
    llmgw_req_free(r);

    r = parse(LLMGW_EP_CHAT, "{\"model\":\"a\",\"messages\":[],"
              "\"max_tokens\":0,\"n\":100000}");
    assert_int_equal(llmgw_req_max_tokens(r), -1);
    assert_int_equal(llmgw_req_choices(r), 128);
    llmgw_req_free(r);

    r = parse(LLMGW_EP_MESSAGES, "{\"model\":\"a\",\"messages\":[],"
              "\"max_tokens\":1e30,\"n\":4}");
    assert_int_equal(llmgw_req_max_tokens(r), (int64_t) 1 << 40);
    assert_int_equal(llmgw_req_choices(r), 1);
    llmgw_req_free(r);

    /* Gemini: either spelling of the config and of its members */
    {
        llmgw_verdict_t v = { 0 };
        const char *b = "{\"contents\":[],\"generationConfig\":"
                        "{\"maxOutputTokens\":64,\"candidate_count\":3},"
                        "\"generation_config\":{\"max_output_tokens\":900}}";
        llmgw_str_t pm = { "gemini-x", 8 };

        r = llmgw_req_parse(LLMGW_EP_GEMINI, pm, b, strlen(b), &v);
        assert_non_null(r);
        assert_int_equal(llmgw_req_max_tokens(r), 900);
        assert_int_equal(llmgw_req_choices(r), 3);
        /* and "stream" is no member of Gemini's (its path streams) */
        llmgw_req_free(r);

        b = "{\"contents\":[],\"stream\":true}";
        r = llmgw_req_parse(LLMGW_EP_GEMINI, pm, b, strlen(b), &v);
        assert_non_null(r);
        assert_int_equal(llmgw_req_stream(r), 0);
        llmgw_req_free(r);
    }
}


/* A member an upstream that ignores case would read as a field. */
static void
test_fields_in_another_case_are_refused(void **state)
{
    (void) state;

    static const char *bodies[] = {
        "{\"model\":\"a\",\"Model\":\"b\",\"messages\":[]}",
        "{\"model\":\"a\",\"messages\":[],\"STREAM\":true}",
        /* U+017F folds to s, U+212A to k, in Go's matching */
        "{\"model\":\"a\",\"messages\":[],\"\xc5\xbftream\":true}",
        "{\"model\":\"a\",\"messages\":[],\"max_to\xe2\x84\xaa" "ens\":9}",
        "{\"model\":\"a\",\"messages\":[],\"N\":9}",
    };

    for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++) {
        llmgw_verdict_t v = { 0 };

        assert_null(llmgw_req_parse(LLMGW_EP_CHAT, no_path_model, bodies[i],
                                    strlen(bodies[i]), &v));
        assert_int_equal(v.status, 400);
        assert_string_equal(v.code, "invalid_request");
        assert_non_null(strstr(v.message, "only by letter case"));
    }

    /* names with capitals of their own match folded too */
    {
        llmgw_verdict_t v = { 0 };
        const char *b = "{\"contents\":[],\"generationConfig\":{},"
                        "\"GenerationConfig\":{\"maxOutputTokens\":9}}";
        llmgw_str_t pm = { "gemini-x", 8 };

        assert_null(llmgw_req_parse(LLMGW_EP_GEMINI, pm, b, strlen(b), &v));
        assert_int_equal(v.status, 400);
    }

    /* other members are the upstream's business */
    llmgw_req_free(parse(LLMGW_EP_CHAT, "{\"model\":\"a\",\"messages\":[],"
                                        "\"Temperature\":1,\"modelx\":2}"));
}


int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_edge_cases_match_jansson),
        cmocka_unit_test(test_depth_limit_matches_jansson),
        cmocka_unit_test(test_mutations_match_jansson),
        cmocka_unit_test(test_fields_are_read_as_jansson_reads_them),
        cmocka_unit_test(test_prompt_estimate_counts_decoded_text),
        cmocka_unit_test(test_prompt_estimate_counts_every_depth),
        cmocka_unit_test(
            test_prompt_estimate_counts_text_documents_not_base64),
        cmocka_unit_test(test_max_tokens_and_choices),
        cmocka_unit_test(test_fields_in_another_case_are_refused),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
