/*
 * Inbound request bodies: JSON, urlencoded forms and multipart/form-data
 * as the DecodedBody hooks see, file references and bytes, size caps, and
 * the refusals of malformed bodies.
 */

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmgw.h"
#include "inbound.h"


#define NOCAP  0

/* One line of a multipart body; bytes may hold NUL, hence the length. */
typedef struct {
    const char  *s;
    size_t       n;
} chunk_t;

#define C(lit)  { (lit), sizeof(lit) - 1 }


/* ---- helpers ---- */

static char *
join(const chunk_t *chunks, size_t count, size_t *len)
{
    size_t total = 0, pos = 0;

    for (size_t i = 0; i < count; i++) {
        total += chunks[i].n;
    }

    char *out = malloc(total + 1);
    assert_non_null(out);

    for (size_t i = 0; i < count; i++) {
        memcpy(out + pos, chunks[i].s, chunks[i].n);
        pos += chunks[i].n;
    }

    out[total] = '\0';
    *len = total;
    return out;
}

static llmgw_inbound_t *
parse_ok(const char *type, const char *body, size_t len, size_t max_file,
    size_t max_total)
{
    llmgw_verdict_t v = { 0 };
    llmgw_str_t ct = { type, type ? strlen(type) : 0 };
    llmgw_inbound_t *in = llmgw_inbound_parse(ct, body, len, max_file,
                                              max_total, &v);

    if (in == NULL) {
        print_error("refused: %d %s\n", v.status, v.message);
    }
    assert_non_null(in);
    return in;
}

static void
parse_fails(const char *type, const char *body, size_t len, size_t max_file,
    size_t max_total, int status, const char *code, const char *want)
{
    llmgw_verdict_t v = { 0 };
    llmgw_str_t ct = { type, type ? strlen(type) : 0 };

    assert_null(llmgw_inbound_parse(ct, body, len, max_file, max_total, &v));
    assert_int_equal(v.status, status);
    assert_string_equal(v.type, "gateway_error");
    assert_string_equal(v.code, code);
    if (strstr(v.message, want) == NULL) {
        print_error("message \"%s\" lacks \"%s\"\n", v.message, want);
        fail();
    }
}

static void
assert_decoded(const llmgw_inbound_t *in, const char *expected)
{
    llmgw_buf_t b = llmgw_inbound_json(in);

    assert_non_null(b.data);
    assert_string_equal(b.data, expected);
    llmgw_buf_free(&b);
}

static void
assert_bytes(const llmgw_file_t *f, const char *data, size_t len)
{
    assert_int_equal(f->len, len);
    assert_memory_equal(f->data, data, len);
}


/* ---- json, none, content types ---- */

static void
test_json_body_keeps_its_value(void **unused)
{
    const char *body = "{\"model\":\"v1\",\"n\":[1,2.5,null],\"s\":\"\\u00e9\"}";
    llmgw_inbound_t *in;
    llmgw_buf_t value;

    (void) unused;
    in = parse_ok("application/json; charset=utf-8", body, strlen(body),
                  NOCAP, NOCAP);
    assert_string_equal(llmgw_inbound_kind(in), "json");
    assert_decoded(in, "{\"kind\":\"json\",\"value\":{\"model\":\"v1\","
                       "\"n\":[1,2.5,null],\"s\":\"\\u00e9\"}}");

    value = llmgw_inbound_value(in);
    assert_string_equal(value.data, body);
    llmgw_buf_free(&value);
    llmgw_inbound_free(in);
}

static void
test_json_suffix_types_and_scalars_are_json(void **unused)
{
    llmgw_inbound_t *in;

    (void) unused;
    in = parse_ok("Application/Vnd.Api+JSON", "42", 2, NOCAP, NOCAP);
    assert_string_equal(llmgw_inbound_kind(in), "json");
    assert_decoded(in, "{\"kind\":\"json\",\"value\":42}");
    llmgw_inbound_free(in);
}

static void
test_invalid_json_is_400(void **unused)
{
    (void) unused;
    parse_fails("application/json", "{\"a\":", 5, NOCAP, NOCAP, 400,
                "invalid_json", "invalid JSON request body");
}

/* nested as deep as hooks take is taken; one level more is refused */
static char *
nested(size_t levels, size_t *len)
{
    size_t i;
    char *b = malloc(2 * levels + 1);

    assert_non_null(b);
    for (i = 0; i < levels; i++) {
        b[i] = '[';
        b[2 * levels - 1 - i] = ']';
    }
    b[2 * levels] = '\0';
    *len = 2 * levels;
    return b;
}

static void
test_json_nested_over_512_levels_is_400(void **unused)
{
    size_t len;
    char *b;

    (void) unused;
    b = nested(512, &len);
    llmgw_inbound_free(parse_ok("application/json", b, len, NOCAP, NOCAP));
    free(b);

    b = nested(513, &len);
    parse_fails("application/json", b, len, NOCAP, NOCAP, 400,
                "invalid_json", "nested more than 512 levels deep");
    free(b);

    /* brackets inside strings are no nesting */
    b = nested(600, &len);
    {
        char *s = malloc(len + 3);
        assert_non_null(s);
        s[0] = '"';
        memcpy(s + 1, b, len);
        s[len + 1] = '"';
        llmgw_inbound_free(parse_ok("application/json", s, len + 2, NOCAP,
                                    NOCAP));
        free(s);
    }
    free(b);
}

static void
test_empty_body_is_none(void **unused)
{
    llmgw_inbound_t *in;
    llmgw_buf_t value;

    (void) unused;
    in = parse_ok("application/json", "", 0, NOCAP, NOCAP);
    assert_string_equal(llmgw_inbound_kind(in), "none");
    assert_decoded(in, "{\"kind\":\"none\"}");
    value = llmgw_inbound_value(in);
    assert_null(value.data);
    llmgw_inbound_free(in);

    in = parse_ok(NULL, NULL, 0, NOCAP, NOCAP);
    assert_string_equal(llmgw_inbound_kind(in), "none");
    llmgw_inbound_free(in);
}

static void
test_other_content_types_are_400(void **unused)
{
    (void) unused;
    parse_fails("text/plain", "hi", 2, NOCAP, NOCAP, 400, "invalid_request",
                "unsupported Content-Type \"text/plain\"");
    parse_fails("application/jsonx", "{}", 2, NOCAP, NOCAP, 400,
                "invalid_request", "unsupported Content-Type");
    parse_fails(NULL, "{}", 2, NOCAP, NOCAP, 400, "invalid_request",
                "needs a Content-Type");
}


/* ---- forms and queries ---- */

static void
test_form_fields_are_decoded_arrays_in_order(void **unused)
{
    const char *body = "a=1&b=x+y%20z&a=2&&flag&=e&euro=%E2%82%ac&my+k%3D=v";
    llmgw_inbound_t *in;

    (void) unused;
    in = parse_ok("application/x-www-form-urlencoded; charset=UTF-8", body,
                  strlen(body), NOCAP, NOCAP);
    assert_string_equal(llmgw_inbound_kind(in), "form");
    assert_decoded(in, "{\"kind\":\"form\",\"fields\":{\"a\":[\"1\",\"2\"],"
                       "\"b\":[\"x y z\"],\"flag\":[\"\"],\"\":[\"e\"],"
                       "\"euro\":[\"\xe2\x82\xac\"],\"my k=\":[\"v\"]}}");
    llmgw_inbound_free(in);
}

static void
test_form_with_a_bad_escape_is_400(void **unused)
{
    (void) unused;
    parse_fails("application/x-www-form-urlencoded", "a=%zz", 5, NOCAP,
                NOCAP, 400, "invalid_request", "invalid percent escape");
    parse_fails("application/x-www-form-urlencoded", "a=1%4", 5, NOCAP,
                NOCAP, 400, "invalid_request", "invalid percent escape");
}

static void
test_form_bytes_that_are_not_utf8_become_replacement_characters(void **un)
{
    llmgw_inbound_t *in;

    (void) un;
    in = parse_ok("application/x-www-form-urlencoded", "k=%FF", 5, NOCAP,
                  NOCAP);
    assert_decoded(in, "{\"kind\":\"form\",\"fields\":{\"k\":"
                       "[\"\xef\xbf\xbd\"]}}");
    llmgw_inbound_free(in);
}

static void
test_query_json(void **unused)
{
    llmgw_buf_t b;

    (void) unused;
    b = llmgw_query_json(LLMGW_STR("a=1&a=2&b=x%20y&c=p+q"));
    assert_string_equal(b.data, "{\"a\":[\"1\",\"2\"],\"b\":[\"x y\"],"
                                "\"c\":[\"p q\"]}");
    llmgw_buf_free(&b);

    /* a query is not refused for a bad escape: it is kept as written */
    b = llmgw_query_json(LLMGW_STR("q=100%&r=%zz"));
    assert_string_equal(b.data, "{\"q\":[\"100%\"],\"r\":[\"%zz\"]}");
    llmgw_buf_free(&b);

    b = llmgw_query_json((llmgw_str_t) { NULL, 0 });
    assert_string_equal(b.data, "{}");
    llmgw_buf_free(&b);
}


/* ---- multipart ---- */

static void
test_multipart_fields_and_repeated_file_fields(void **unused)
{
    static const chunk_t parts[] = {
        C("preamble to ignore\r\n"),
        C("--XyZ\r\n"),
        C("Content-Disposition: form-data; name=\"prompt\"\r\n\r\n"),
        C("a cat\r\n"),
        C("--XyZ\r\n"),
        C("Content-Disposition: form-data; name=\"image[]\"; "
          "filename=\"a.png\"\r\n"),
        C("Content-Type: image/png\r\n\r\n"),
        C("PNG-A\r\n"),
        C("--XyZ\r\n"),
        C("content-disposition: form-data; name=\"image[]\"; "
          "filename=\"b.png\"\r\n"),
        C("CONTENT-TYPE: image/png\r\n\r\n"),
        C("PNG-B\r\n"),
        C("--XyZ\r\n"),
        C("Content-Disposition: form-data; name=\"prompt\"\r\n\r\n"),
        C("second\r\n"),
        C("--XyZ\r\n"),
        C("Content-Disposition: form-data; name=\"mask\"; "
          "filename=\"m.bin\"\r\n\r\n"),
        C("M\r\n"),
        C("--XyZ\r\n"),
        C("Content-Disposition: form-data; name=\"image[]\"; "
          "filename=\"c.jpg\"\r\n"),
        C("Content-Type: image/jpeg\r\n\r\n"),
        C("JPG\r\n"),
        C("--XyZ--\r\n"),
        C("epilogue to ignore\r\n"),
    };
    const llmgw_file_t *f;
    llmgw_inbound_t *in;
    size_t len;
    char *body = join(parts, sizeof(parts) / sizeof(parts[0]), &len);

    (void) unused;
    in = parse_ok("multipart/form-data; boundary=XyZ", body, len, NOCAP,
                  NOCAP);
    assert_string_equal(llmgw_inbound_kind(in), "multipart");
    assert_decoded(in,
        "{\"kind\":\"multipart\",\"fields\":{\"prompt\":[\"a cat\","
        "\"second\"]},\"files\":["
        "{\"ref\":\"request_file:image[]\",\"field\":\"image[]\","
        "\"filename\":\"a.png\",\"mimeType\":\"image/png\",\"size\":5},"
        "{\"ref\":\"request_file:image[]#1\",\"field\":\"image[]\","
        "\"filename\":\"b.png\",\"mimeType\":\"image/png\",\"size\":5},"
        "{\"ref\":\"request_file:mask\",\"field\":\"mask\","
        "\"filename\":\"m.bin\",\"mimeType\":\"application/octet-stream\","
        "\"size\":1},"
        "{\"ref\":\"request_file:image[]#2\",\"field\":\"image[]\","
        "\"filename\":\"c.jpg\",\"mimeType\":\"image/jpeg\",\"size\":3}]}");

    assert_int_equal(llmgw_inbound_files(in, &f), 4);
    assert_string_equal(f[0].ref, "request_file:image[]");
    assert_string_equal(f[1].ref, "request_file:image[]#1");
    assert_string_equal(f[2].ref, "request_file:mask");
    assert_string_equal(f[3].ref, "request_file:image[]#2");
    assert_string_equal(f[3].field, "image[]");
    assert_string_equal(f[3].filename, "c.jpg");
    assert_string_equal(f[3].mime, "image/jpeg");
    assert_bytes(&f[0], "PNG-A", 5);
    assert_bytes(&f[1], "PNG-B", 5);
    assert_bytes(&f[3], "JPG", 3);
    /* in place: the bytes are the client body's */
    assert_true((const char *) f[0].data > body
                && (const char *) f[0].data < body + len);

    llmgw_inbound_free(in);
    free(body);
}

static void
test_multipart_binary_bytes_survive_exactly(void **unused)
{
    /* CR, LF, NUL, 0xff and things that look like the boundary */
    static const char data[] =
        "\r\n\x00\xff\r--b0undary\r\n"
        "--b0undary-not-at-line-start\r\n"
        "--b0undaryX\r\n"
        "--b0undary--x\r\n"
        "--b0undar\r\n"
        "\n--b0undary trailing\r\n"
        "ends with CR\r";
    static const chunk_t parts[] = {
        C("--b0undary\r\n"),
        C("Content-Disposition: form-data; name=\"file\"; "
          "filename=\"x.bin\"\r\n"),
        C("Content-Type: application/octet-stream\r\n\r\n"),
        { data, sizeof(data) - 1 },
        C("\r\n--b0undary--"),
    };
    const llmgw_file_t *f;
    llmgw_inbound_t *in;
    size_t len;
    char *body = join(parts, sizeof(parts) / sizeof(parts[0]), &len);

    (void) unused;
    in = parse_ok("multipart/form-data; boundary=b0undary", body, len, NOCAP,
                  NOCAP);
    assert_int_equal(llmgw_inbound_files(in, &f), 1);
    assert_bytes(&f[0], data, sizeof(data) - 1);
    llmgw_inbound_free(in);
    free(body);
}

static void
test_multipart_quoted_boundary_and_lf_line_ends(void **unused)
{
    static const chunk_t parts[] = {
        C("--a:b c'd\n"),
        C("Content-Disposition: form-data; name=\"k\"\n\n"),
        C("v1\n"),
        C("--a:b c'd  \n"),     /* blanks after a delimiter are allowed */
        C("Content-Disposition: form-data; name=\"f\"; filename=\"f.txt\"\n"),
        C("Content-Type: text/plain\n\n"),
        C("line1\nline2\n"),
        C("--a:b c'd--\n"),
    };
    const llmgw_file_t *f;
    llmgw_inbound_t *in;
    size_t len;
    char *body = join(parts, sizeof(parts) / sizeof(parts[0]), &len);

    (void) unused;
    in = parse_ok("multipart/form-data; charset=utf-8; "
                  "BOUNDARY=\"a:b c'd\"", body, len, NOCAP, NOCAP);
    assert_int_equal(llmgw_inbound_files(in, &f), 1);
    assert_bytes(&f[0], "line1\nline2", 11);
    assert_decoded(in,
        "{\"kind\":\"multipart\",\"fields\":{\"k\":[\"v1\"]},\"files\":["
        "{\"ref\":\"request_file:f\",\"field\":\"f\",\"filename\":\"f.txt\","
        "\"mimeType\":\"text/plain\",\"size\":11}]}");
    llmgw_inbound_free(in);
    free(body);
}

static void
test_multipart_empty_filename_is_still_a_file(void **unused)
{
    static const chunk_t parts[] = {
        C("--B\r\n"),
        C("Content-Disposition: form-data; name=\"upload\"; "
          "filename=\"\"\r\n\r\n"),
        C("\r\n"),
        C("--B--\r\n"),
    };
    const llmgw_file_t *f;
    llmgw_inbound_t *in;
    size_t len;
    char *body = join(parts, sizeof(parts) / sizeof(parts[0]), &len);

    (void) unused;
    in = parse_ok("multipart/form-data; boundary=B", body, len, NOCAP, NOCAP);
    assert_int_equal(llmgw_inbound_files(in, &f), 1);
    assert_string_equal(f[0].ref, "request_file:upload");
    assert_string_equal(f[0].filename, "");
    assert_int_equal(f[0].len, 0);
    assert_decoded(in,
        "{\"kind\":\"multipart\",\"fields\":{},\"files\":["
        "{\"ref\":\"request_file:upload\",\"field\":\"upload\","
        "\"filename\":\"\",\"mimeType\":\"application/octet-stream\","
        "\"size\":0}]}");
    llmgw_inbound_free(in);
    free(body);
}

static void
test_multipart_filename_star_wins_and_quotes_unescape(void **unused)
{
    static const chunk_t parts[] = {
        C("--B\r\n"),
        C("Content-Disposition: form-data; name=\"doc\"; "
          "filename=\"naive.txt\"; filename*=UTF-8''na%C3%AFve%20%E2%82%AC.txt"
          "\r\n\r\n"),
        C("x\r\n"),
        C("--B\r\n"),
        C("Content-Disposition: form-data; name=\"say \\\"hi\\\"; now\"; "
          "filename=\"C:\\dir\\q.txt\"\r\n\r\n"),
        C("y\r\n"),
        C("--B\r\n"),
        C("Content-Disposition: form-data; name=\"z\"; "
          "filename*=not-an-ext-value; filename=\"plain.txt\"\r\n\r\n"),
        C("z\r\n"),
        C("--B--\r\n"),
    };
    const llmgw_file_t *f;
    llmgw_inbound_t *in;
    size_t len;
    char *body = join(parts, sizeof(parts) / sizeof(parts[0]), &len);

    (void) unused;
    in = parse_ok("multipart/form-data; boundary=B", body, len, NOCAP, NOCAP);
    assert_int_equal(llmgw_inbound_files(in, &f), 3);
    assert_string_equal(f[0].filename, "na\xc3\xafve \xe2\x82\xac.txt");
    assert_string_equal(f[2].filename, "plain.txt");
    assert_string_equal(f[1].field, "say \"hi\"; now");
    assert_string_equal(f[1].ref, "request_file:say \"hi\"; now");
    /* a bare backslash is not an escape: Windows paths arrive intact */
    assert_string_equal(f[1].filename, "C:\\dir\\q.txt");
    llmgw_inbound_free(in);
    free(body);
}

static void
test_multipart_empty_part_content(void **unused)
{
    static const chunk_t parts[] = {
        C("--B\r\n"),
        C("Content-Disposition: form-data; name=\"a\"\r\n\r\n"),
        C("\r\n--B\r\n"),
        C("Content-Disposition: form-data; name=\"b\"\r\n\r\n"),
        C("--B--"),
    };
    llmgw_inbound_t *in;
    size_t len;
    char *body = join(parts, sizeof(parts) / sizeof(parts[0]), &len);

    (void) unused;
    in = parse_ok("multipart/form-data; boundary=B", body, len, NOCAP, NOCAP);
    assert_decoded(in, "{\"kind\":\"multipart\",\"fields\":{\"a\":[\"\"],"
                       "\"b\":[\"\"]},\"files\":[]}");
    llmgw_inbound_free(in);
    free(body);
}

static void
multipart_fails(const char *type, const chunk_t *parts, size_t count,
    const char *want)
{
    size_t len;
    char *body = join(parts, count, &len);

    parse_fails(type, body, len, NOCAP, NOCAP, 400, "invalid_request", want);
    free(body);
}

static void
test_malformed_multipart_is_400(void **unused)
{
    static const chunk_t ok_part[] = {
        C("--B\r\n"),
        C("Content-Disposition: form-data; name=\"a\"\r\n\r\n"),
        C("1\r\n--B--\r\n"),
    };
    static const chunk_t no_close[] = {
        C("--B\r\n"),
        C("Content-Disposition: form-data; name=\"a\"\r\n\r\n"),
        C("1\r\n--B-\r\n"),
    };
    static const chunk_t no_disposition[] = {
        C("--B\r\n"),
        C("Content-Type: text/plain\r\n\r\n"),
        C("1\r\n--B--\r\n"),
    };
    static const chunk_t no_name[] = {
        C("--B\r\n"),
        C("Content-Disposition: form-data; name=\"a\"\r\n\r\n"),
        C("1\r\n--B\r\n"),
        C("Content-Disposition: form-data; filename=\"x\"\r\n\r\n"),
        C("1\r\n--B--\r\n"),
    };
    static const chunk_t unended_headers[] = {
        C("--B\r\n"),
        C("Content-Disposition: form-data; name=\"a\""),
    };
    static const chunk_t not_form_data[] = {
        C("--B\r\n"),
        C("Content-Disposition: attachment; name=\"a\"\r\n\r\n"),
        C("1\r\n--B--\r\n"),
    };

    (void) unused;
    multipart_fails("multipart/form-data", ok_part, 3,
                    "Content-Type has no boundary");
    multipart_fails("multipart/form-data; boundary=\"\"", ok_part, 3,
                    "Content-Type has no boundary");
    multipart_fails("multipart/form-data; boundary=C", ok_part, 3,
                    "no boundary delimiter \"--C\"");
    multipart_fails("multipart/form-data; boundary=B", no_close, 3,
                    "no closing delimiter \"--B--\"");
    multipart_fails("multipart/form-data; boundary=B", no_disposition, 3,
                    "multipart part 1 has no Content-Disposition header");
    multipart_fails("multipart/form-data; boundary=B", no_name, 5,
                    "multipart part 2: Content-Disposition has no name");
    multipart_fails("multipart/form-data; boundary=B", unended_headers, 2,
                    "multipart part 1: headers do not end");
    multipart_fails("multipart/form-data; boundary=B", not_form_data, 3,
                    "Content-Disposition is \"attachment\", not form-data");
}

/*
 * A file's reference is "request_file:" and its field name, "#<n>" after
 * the first: a file field named "a#1" would share the reference of the
 * second file of "a", and one not UTF-8 would reach the plugin as another
 * text than the host keeps.  Both are refused; a text field may be named
 * so (it has no reference).
 */
static void
test_file_field_names_keep_refs_unique(void **unused)
{
    static const chunk_t hash_file[] = {
        C("--B\r\n"),
        C("Content-Disposition: form-data; name=\"a#1\"; filename=\"x\"\r\n\r\n"),
        C("1\r\n--B\r\n"),
        C("Content-Disposition: form-data; name=\"a\"; filename=\"x\"\r\n\r\n"),
        C("2\r\n--B\r\n"),
        C("Content-Disposition: form-data; name=\"a\"; filename=\"x\"\r\n\r\n"),
        C("3\r\n--B--\r\n"),
    };
    static const chunk_t latin1_file[] = {
        C("--B\r\n"),
        C("Content-Disposition: form-data; name=\"img\xe9\"; filename=\"x\"\r\n\r\n"),
        C("1\r\n--B--\r\n"),
    };
    static const chunk_t text_fields[] = {
        C("--B\r\n"),
        C("Content-Disposition: form-data; name=\"a#1\"\r\n\r\n"),
        C("1\r\n--B\r\n"),
        C("Content-Disposition: form-data; name=\"n\xc3\xa4me\"; filename=\"x\"\r\n\r\n"),
        C("2\r\n--B--\r\n"),
    };
    const char *type = "multipart/form-data; boundary=B";
    const llmgw_file_t *f;
    size_t len;
    char *body;

    (void) unused;
    multipart_fails(type, hash_file, 7,
                    "multipart part 1: a file's field name may not hold "
                    "\"#\"");
    multipart_fails(type, latin1_file, 3,
                    "multipart part 1: a file's field name is not valid "
                    "UTF-8");

    body = join(text_fields, 5, &len);
    llmgw_inbound_t *in = parse_ok(type, body, len, NOCAP, NOCAP);
    assert_int_equal(llmgw_inbound_files(in, &f), 1);
    assert_string_equal(f[0].ref, "request_file:n\xc3\xa4me");
    llmgw_inbound_free(in);
    free(body);
}

/* Two files of 4 and 6 bytes in fields "a" and "b", and a text field. */
static char *
two_files(size_t *len)
{
    static const chunk_t parts[] = {
        C("--B\r\n"),
        C("Content-Disposition: form-data; name=\"note\"\r\n\r\n"),
        C("a text field is not a file\r\n--B\r\n"),
        C("Content-Disposition: form-data; name=\"a\"; filename=\"a\"\r\n\r\n"),
        C("aaaa\r\n--B\r\n"),
        C("Content-Disposition: form-data; name=\"b\"; filename=\"b\"\r\n\r\n"),
        C("bbbbbb\r\n--B--\r\n"),
    };

    return join(parts, sizeof(parts) / sizeof(parts[0]), len);
}

static void
test_file_size_caps_hold_at_the_boundary(void **unused)
{
    const char *type = "multipart/form-data; boundary=B";
    size_t len;
    char *body = two_files(&len);

    (void) unused;
    /* per file: the largest is 6 bytes */
    llmgw_inbound_free(parse_ok(type, body, len, 6, NOCAP));
    parse_fails(type, body, len, 5, NOCAP, 413, "file_too_large",
                "file in field \"b\" is 6 bytes, more than the per-file "
                "limit of 5 bytes");

    /* in total: 10 bytes (the text field does not count) */
    llmgw_inbound_free(parse_ok(type, body, len, NOCAP, 10));
    parse_fails(type, body, len, NOCAP, 9, 413, "file_too_large",
                "more than the total limit of 9 bytes (at field \"b\")");
    free(body);
}


int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_body_keeps_its_value),
        cmocka_unit_test(test_json_suffix_types_and_scalars_are_json),
        cmocka_unit_test(test_invalid_json_is_400),
        cmocka_unit_test(test_json_nested_over_512_levels_is_400),
        cmocka_unit_test(test_empty_body_is_none),
        cmocka_unit_test(test_other_content_types_are_400),
        cmocka_unit_test(test_form_fields_are_decoded_arrays_in_order),
        cmocka_unit_test(test_form_with_a_bad_escape_is_400),
        cmocka_unit_test(
            test_form_bytes_that_are_not_utf8_become_replacement_characters),
        cmocka_unit_test(test_query_json),
        cmocka_unit_test(test_multipart_fields_and_repeated_file_fields),
        cmocka_unit_test(test_multipart_binary_bytes_survive_exactly),
        cmocka_unit_test(test_multipart_quoted_boundary_and_lf_line_ends),
        cmocka_unit_test(test_multipart_empty_filename_is_still_a_file),
        cmocka_unit_test(test_multipart_filename_star_wins_and_quotes_unescape),
        cmocka_unit_test(test_multipart_empty_part_content),
        cmocka_unit_test(test_malformed_multipart_is_400),
        cmocka_unit_test(test_file_field_names_keep_refs_unique),
        cmocka_unit_test(test_file_size_caps_hold_at_the_boundary),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
