/*
 * The error contract: {"error":{"message","type","code"}} with the request
 * id at the end of the message, and upstream errors mapped into it.
 */

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <jansson.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>

#include "llmgw.h"


#define RID  LLMGW_STR("req-1")


typedef struct {
    json_t      *root;
    const char  *message;
    const char  *type;
    const char  *code;
} parsed_t;


/* Reads the three fields back; fails the test on any other shape. */
static parsed_t
parse(llmgw_buf_t b)
{
    parsed_t      p;
    json_error_t  err;
    json_t       *e;

    assert_non_null(b.data);
    p.root = json_loadb(b.data, b.len, 0, &err);
    assert_non_null(p.root);
    assert_int_equal(json_object_size(p.root), 1);

    e = json_object_get(p.root, "error");
    assert_true(json_is_object(e));
    assert_int_equal(json_object_size(e), 3);

    p.message = json_string_value(json_object_get(e, "message"));
    p.type = json_string_value(json_object_get(e, "type"));
    p.code = json_string_value(json_object_get(e, "code"));
    assert_non_null(p.message);
    assert_non_null(p.type);
    assert_non_null(p.code);

    return p;
}


/* The channel key of the try the upstream answered. */
#define KEY  "sk-chan-0123456789abcdef"


static parsed_t
upstream(int status, const char *body)
{
    llmgw_buf_t  b;
    parsed_t     p;

    b = llmgw_upstream_error_json(status, body, strlen(body),
                                  LLMGW_STR(KEY), RID);
    p = parse(b);
    llmgw_buf_free(&b);

    return p;
}


static void
test_error_json_is_exact_compact_contract(void **state)
{
    llmgw_buf_t b = llmgw_error_json(LLMGW_STR("Invalid token"),
                                     LLMGW_STR("gateway_error"),
                                     LLMGW_STR(""), RID);

    assert_non_null(b.data);
    assert_string_equal(b.data,
        "{\"error\":{\"message\":\"Invalid token (request id: req-1)\","
        "\"type\":\"gateway_error\",\"code\":\"\"}}");
    assert_int_equal(b.len, strlen(b.data));
    llmgw_buf_free(&b);
    assert_null(b.data);
}


static void
test_error_json_escapes_quotes_backslashes_and_newlines(void **state)
{
    llmgw_buf_t b = llmgw_error_json(LLMGW_STR("a \"b\" \\ c\nd"),
                                     LLMGW_STR("gateway_error"),
                                     LLMGW_STR("x\"y"), RID);
    parsed_t    p = parse(b);

    assert_string_equal(p.message, "a \"b\" \\ c\nd (request id: req-1)");
    assert_string_equal(p.code, "x\"y");
    json_decref(p.root);
    llmgw_buf_free(&b);
}


static void
test_error_json_invalid_utf8_still_renders(void **state)
{
    llmgw_buf_t b = llmgw_error_json(LLMGW_STR("bad \xff byte"),
                                     LLMGW_STR("gateway_error"),
                                     LLMGW_STR(""), RID);
    parsed_t    p = parse(b);

    assert_string_equal(p.message, "bad \xef\xbf\xbd byte (request id: req-1)");
    json_decref(p.root);
    llmgw_buf_free(&b);
}


static void
test_upstream_message_from_error_message(void **state)
{
    parsed_t p = upstream(429, "{\"error\":{\"message\":\"Slow down\","
                               "\"type\":\"requests\","
                               "\"code\":\"rate_limit_exceeded\"}}");

    assert_string_equal(p.message, "Slow down (request id: req-1)");
    assert_string_equal(p.type, "upstream_error");
    assert_string_equal(p.code, "rate_limit_exceeded");
    json_decref(p.root);
}


static void
test_upstream_message_from_top_level_message(void **state)
{
    parsed_t p = upstream(500, "{\"message\":\"boom\"}");

    assert_string_equal(p.message, "boom (request id: req-1)");
    assert_string_equal(p.code, "bad_response_status_code");
    json_decref(p.root);
}


static void
test_upstream_error_string_is_the_message(void **state)
{
    parsed_t p = upstream(502, "{\"error\":\"model overloaded\"}");

    assert_string_equal(p.message, "model overloaded (request id: req-1)");
    json_decref(p.root);
}


static void
test_upstream_detail_string_is_the_message(void **state)
{
    parsed_t p = upstream(422, "{\"detail\":\"Not Found\"}");

    assert_string_equal(p.message, "Not Found (request id: req-1)");
    json_decref(p.root);
}


static void
test_upstream_error_message_wins_over_top_level_message(void **state)
{
    parsed_t p = upstream(400, "{\"message\":\"outer\","
                               "\"error\":{\"message\":\"inner\"}}");

    assert_string_equal(p.message, "inner (request id: req-1)");
    json_decref(p.root);
}


static void
test_upstream_empty_error_message_falls_through(void **state)
{
    parsed_t p = upstream(400, "{\"error\":{\"message\":\"\"},"
                               "\"message\":\"outer\"}");

    assert_string_equal(p.message, "outer (request id: req-1)");
    json_decref(p.root);
}


static void
test_upstream_json_without_message_uses_raw_body(void **state)
{
    parsed_t p = upstream(500, "{\"foo\":1}");

    assert_string_equal(p.message, "{\"foo\":1} (request id: req-1)");
    json_decref(p.root);
}


static void
test_upstream_raw_text_is_trimmed(void **state)
{
    parsed_t p = upstream(502, "  \r\n<html>Bad Gateway</html>\n\t ");

    assert_string_equal(p.message,
                        "<html>Bad Gateway</html> (request id: req-1)");
    assert_string_equal(p.type, "upstream_error");
    assert_string_equal(p.code, "bad_response_status_code");
    json_decref(p.root);
}


static void
test_upstream_raw_text_cut_to_512_bytes(void **state)
{
    char      body[600 + 1];
    char      want[512 + sizeof(" (request id: req-1)")];
    parsed_t  p;

    memset(body, 'a', 600);
    body[600] = '\0';
    memset(want, 'a', 512);
    strcpy(want + 512, " (request id: req-1)");

    p = upstream(500, body);
    assert_string_equal(p.message, want);
    json_decref(p.root);
}


static void
test_upstream_raw_text_cut_on_utf8_boundary(void **state)
{
    /* 511 bytes then a 2-byte character straddling the 512-byte cut */
    char      body[511 + 2 + 10 + 1];
    char      want[511 + sizeof(" (request id: req-1)")];
    parsed_t  p;

    memset(body, 'a', 511);
    memcpy(body + 511, "\xc3\xa9", 2);
    memset(body + 513, 'b', 10);
    body[523] = '\0';
    memset(want, 'a', 511);
    strcpy(want + 511, " (request id: req-1)");

    p = upstream(500, body);
    assert_string_equal(p.message, want);
    json_decref(p.root);
}


static void
test_upstream_empty_body_names_the_status(void **state)
{
    parsed_t p = upstream(503, "");

    assert_string_equal(p.message,
                        "upstream returned HTTP 503 (request id: req-1)");
    json_decref(p.root);

    p = upstream(504, " \r\n ");
    assert_string_equal(p.message,
                        "upstream returned HTTP 504 (request id: req-1)");
    json_decref(p.root);
}


static void
test_upstream_numeric_code_becomes_text(void **state)
{
    parsed_t p = upstream(429, "{\"error\":{\"code\":429,"
                               "\"message\":\"quota\","
                               "\"status\":\"RESOURCE_EXHAUSTED\"}}");

    assert_string_equal(p.code, "429");
    assert_string_equal(p.message, "quota (request id: req-1)");
    json_decref(p.root);
}


static void
test_upstream_top_level_code_is_used(void **state)
{
    parsed_t p = upstream(400, "{\"code\":\"invalid_model\","
                               "\"message\":\"no such model\"}");

    assert_string_equal(p.code, "invalid_model");
    json_decref(p.root);
}


static void
test_upstream_error_type_is_code_fallback(void **state)
{
    parsed_t p = upstream(529, "{\"type\":\"error\",\"error\":{"
                               "\"type\":\"overloaded_error\","
                               "\"message\":\"Overloaded\"}}");

    assert_string_equal(p.code, "overloaded_error");
    assert_string_equal(p.type, "upstream_error");
    assert_string_equal(p.message, "Overloaded (request id: req-1)");
    json_decref(p.root);
}


static void
test_upstream_null_code_defaults_to_bad_response_status_code(void **state)
{
    parsed_t p = upstream(500, "{\"error\":{\"message\":\"m\","
                               "\"code\":null}}");

    assert_string_equal(p.code, "bad_response_status_code");
    json_decref(p.root);
}


static void
test_upstream_message_quoting_the_channel_key_hides_it(void **state)
{
    parsed_t p = upstream(401, "{\"error\":{\"message\":\"Incorrect API key "
                               "provided: Bearer " KEY "\","
                               "\"code\":\"invalid_api_key\"}}");

    assert_string_equal(p.message, "Incorrect API key provided: Bearer "
                                   "[credential] (request id: req-1)");
    assert_string_equal(p.code, "invalid_api_key");
    json_decref(p.root);

    p = upstream(500, "bad key " KEY " and again " KEY "\n");
    assert_string_equal(p.message, "bad key [credential] and again "
                                   "[credential] (request id: req-1)");
    json_decref(p.root);
}


static void
test_upstream_code_quoting_the_channel_key_hides_it(void **state)
{
    parsed_t p = upstream(401, "{\"error\":{\"message\":\"no\","
                               "\"code\":\"key-" KEY "\"}}");

    assert_string_equal(p.code, "key-[credential]");
    json_decref(p.root);
}


/* Cut first, the key's first bytes would survive as the message's end. */
static void
test_upstream_raw_text_hides_a_key_across_the_cut(void **state)
{
    char      body[505 + sizeof(KEY) + 20];
    parsed_t  p;

    memset(body, 'a', 505);
    strcpy(body + 505, KEY " and more text");

    p = upstream(500, body);
    assert_null(strstr(p.message, "sk-chan"));
    assert_int_equal(strncmp(p.message + 505, "[creden", 7), 0);
    json_decref(p.root);
}


/* An upstream that echoes its URL shows a ?key= percent-encoded. */
static void
test_upstream_percent_encoded_key_is_hidden(void **state)
{
    static const char  body[] = "bad request GET /v1?key=AIza%2Fk%2By%3D12 "
                                "or /v1?key=AIza%2fk%2by%3d12";
    llmgw_buf_t        b;
    parsed_t           p;

    b = llmgw_upstream_error_json(400, body, strlen(body),
                                  LLMGW_STR("AIza/k+y=12"), RID);
    p = parse(b);
    assert_string_equal(p.message, "bad request GET /v1?key=[credential] "
                                   "or /v1?key=[credential] "
                                   "(request id: req-1)");
    json_decref(p.root);
    llmgw_buf_free(&b);
}


/* base64 of lead bytes, the key and ":" (a Basic header's user part),
   standard or URL-safe, in out */
static void
base64_of_key(const char *lead, int url, char *out)
{
    char    in[128];
    size_t  n;

    n = (size_t) snprintf(in, sizeof(in), "%s%s:", lead, KEY);
    EVP_EncodeBlock((unsigned char *) out, (unsigned char *) in, (int) n);

    for (; url && *out; out++) {
        *out = *out == '+' ? '-' : *out == '/' ? '_' : *out;
    }
}


/* An upstream that echoes the Authorization: Basic it got shows the key in
   base64; so does a token that wraps it, at any byte alignment. */
static void
test_upstream_base64_of_the_key_is_hidden(void **state)
{
    static const char  *leads[] = { "", "u", "us", "use", "user" };
    char                b64[256], body[512], window[9];
    size_t              i, at, len;
    int                 url;
    parsed_t            p;

    (void) state;

    for (url = 0; url < 2; url++) {
        for (i = 0; i < sizeof(leads) / sizeof(leads[0]); i++) {
            base64_of_key(leads[i], url, b64);
            snprintf(body, sizeof(body), "refused Basic %s today", b64);

            p = upstream(401, body);
            assert_non_null(strstr(p.message, "[credential]"));
            assert_non_null(strstr(p.message, " today (request id: req-1)"));

            /* nothing is left of the characters the key alone decides */
            len = strlen(leads[i]);
            for (at = (8 * len + 5) / 6;
                 at + 8 <= 8 * (len + strlen(KEY)) / 6;
                 at++)
            {
                memcpy(window, b64 + at, 8);
                window[8] = '\0';
                assert_null(strstr(p.message, window));
            }
            json_decref(p.root);
        }
    }
}


/* A body cut at LLMGW_ERROR_BODY_MAX: blanks, words, then the first
   bytes of the key, as is or percent-encoded. */
static void
expect_cut_key_dropped(const char *key, const char *part)
{
    char         *body;
    size_t        n, len = LLMGW_ERROR_BODY_MAX;
    llmgw_str_t   k = { key, strlen(key) };
    llmgw_buf_t   b;
    parsed_t      p;

    body = malloc(len);
    assert_non_null(body);
    n = strlen("bad key ") + strlen(part);
    memset(body, ' ', len - n);
    memcpy(body + len - n, "bad key ", 8);
    memcpy(body + len - strlen(part), part, strlen(part));

    b = llmgw_upstream_error_json(401, body, len, k, RID);
    p = parse(b);
    assert_string_equal(p.message, "bad key (request id: req-1)");
    json_decref(p.root);
    llmgw_buf_free(&b);

    /* a body that was not cut keeps its last bytes */
    b = llmgw_upstream_error_json(401, body + 1, len - 1, k, RID);
    p = parse(b);
    assert_non_null(strstr(p.message, part));
    json_decref(p.root);
    llmgw_buf_free(&b);
    free(body);
}


static void
test_upstream_key_across_the_cut_leaves_no_part(void **state)
{
    (void) state;

    expect_cut_key_dropped(KEY, "sk-chan-0123");
    expect_cut_key_dropped(KEY, "s");
    expect_cut_key_dropped("AIza/k+y=12", "AIza%2Fk%2");
}


static void
test_upstream_error_for_messages_hides_the_channel_key(void **state)
{
    static const char  body[] = "{\"type\":\"error\",\"error\":{"
                                "\"type\":\"authentication_error\","
                                "\"message\":\"invalid x-api-key " KEY "\"}}";
    llmgw_buf_t        b;
    json_t            *root;

    b = llmgw_upstream_error_for(LLMGW_EP_MESSAGES, 401, body, strlen(body),
                                 LLMGW_STR(KEY), RID);
    assert_non_null(b.data);
    assert_null(strstr(b.data, KEY));

    root = json_loadb(b.data, b.len, 0, NULL);
    assert_string_equal(json_string_value(json_object_get(
        json_object_get(root, "error"), "message")),
        "invalid x-api-key [credential] (request id: req-1)");
    json_decref(root);
    llmgw_buf_free(&b);
}


/* A short key would be "found" in unrelated words. */
static void
test_upstream_short_key_is_not_searched(void **state)
{
    static const char  body[] = "{\"message\":\"key abc is wrong\"}";
    llmgw_buf_t        b;
    parsed_t           p;

    b = llmgw_upstream_error_json(401, body, strlen(body), LLMGW_STR("abc"),
                                  RID);
    p = parse(b);
    assert_string_equal(p.message, "key abc is wrong (request id: req-1)");
    json_decref(p.root);
    llmgw_buf_free(&b);
}


int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_error_json_is_exact_compact_contract),
        cmocka_unit_test(
            test_error_json_escapes_quotes_backslashes_and_newlines),
        cmocka_unit_test(test_error_json_invalid_utf8_still_renders),
        cmocka_unit_test(test_upstream_message_from_error_message),
        cmocka_unit_test(test_upstream_message_from_top_level_message),
        cmocka_unit_test(test_upstream_error_string_is_the_message),
        cmocka_unit_test(test_upstream_detail_string_is_the_message),
        cmocka_unit_test(
            test_upstream_error_message_wins_over_top_level_message),
        cmocka_unit_test(test_upstream_empty_error_message_falls_through),
        cmocka_unit_test(test_upstream_json_without_message_uses_raw_body),
        cmocka_unit_test(test_upstream_raw_text_is_trimmed),
        cmocka_unit_test(test_upstream_raw_text_cut_to_512_bytes),
        cmocka_unit_test(test_upstream_raw_text_cut_on_utf8_boundary),
        cmocka_unit_test(test_upstream_empty_body_names_the_status),
        cmocka_unit_test(test_upstream_numeric_code_becomes_text),
        cmocka_unit_test(test_upstream_top_level_code_is_used),
        cmocka_unit_test(test_upstream_error_type_is_code_fallback),
        cmocka_unit_test(
            test_upstream_null_code_defaults_to_bad_response_status_code),
        cmocka_unit_test(
            test_upstream_message_quoting_the_channel_key_hides_it),
        cmocka_unit_test(test_upstream_code_quoting_the_channel_key_hides_it),
        cmocka_unit_test(test_upstream_raw_text_hides_a_key_across_the_cut),
        cmocka_unit_test(test_upstream_percent_encoded_key_is_hidden),
        cmocka_unit_test(test_upstream_base64_of_the_key_is_hidden),
        cmocka_unit_test(test_upstream_key_across_the_cut_leaves_no_part),
        cmocka_unit_test(
            test_upstream_error_for_messages_hides_the_channel_key),
        cmocka_unit_test(test_upstream_short_key_is_not_searched),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
