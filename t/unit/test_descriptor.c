/*
 * Outbound HTTP descriptors: every rule that refuses a plugin's request
 * (foreign hosts, credential leaks, unsafe URLs, methods and headers,
 * credentialless limits, file caps) and the requests that are built
 * (JSON with file placeholders, multipart, form, text, redirects).
 *
 * Descriptors are written with single quotes; q() turns them into JSON.
 */

#define _GNU_SOURCE                 /* memmem */

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmgw.h"
#include "descriptor.h"


#define CRED  "sk-secret-channel-key-123"

static const llmgw_str_t ALLOWED[] = {
    LLMGW_STR("cdn.vendor.com"),
    LLMGW_STR("files.vendor.com:8443"),
    LLMGW_STR("media.vendor.com:443"),
    LLMGW_STR("[2001:db8::1]"),
    LLMGW_STR("[::1]:8080"),
};

static const unsigned char BIN[] = { 0x00, 0x01, 0x02, 0xff, 'z' };

static const llmgw_file_t FILES[] = {
    { "request_file:image", "image", "cat.png", "image/png",
      (const unsigned char *) "hello world", 11 },
    { "request_file:image#1", "image", "", "", BIN, sizeof(BIN) },
    { "request_file:doc", "doc", "a\"b.txt", "text/plain\r\nX-Evil: 1",
      (const unsigned char *) "doc", 3 },
};


static llmgw_desc_policy_t
policy(void)
{
    llmgw_desc_policy_t p;

    memset(&p, 0, sizeof(p));
    p.base_url = LLMGW_STR("https://api.vendor.com/v1");
    p.credential = LLMGW_STR(CRED);
    p.allowed_hosts = ALLOWED;
    p.nallowed = sizeof(ALLOWED) / sizeof(ALLOWED[0]);
    p.files = FILES;
    p.nfiles = sizeof(FILES) / sizeof(FILES[0]);
    return p;
}


/* Single quotes to double quotes (test JSON holds no apostrophes). */
static char *
q(const char *s)
{
    char *out = strdup(s);

    assert_non_null(out);

    for (char *p = out; *p; p++) {
        if (*p == '\'') {
            *p = '"';
        }
    }

    return out;
}


static char err[512];

static int
build_p(const char *quoted, const llmgw_desc_policy_t *p,
    llmgw_outbound_t *out)
{
    char *json = q(quoted);
    int   rc;

    err[0] = '\0';
    rc = llmgw_descriptor_build(json, strlen(json), p, out, err,
                                sizeof(err));
    free(json);

    if (rc == 0) {
        assert_non_null(out->url.data);
        assert_non_null(out->headers.data);
    } else {
        assert_int_equal(rc, -1);
        assert_null(out->host);
        assert_null(out->body.data);
        assert_true(strncmp(err, "descriptor: ", 12) == 0);
        assert_null(strstr(err, CRED));
    }

    return rc;
}


/* Built with policy p; fails the test with the message when refused. */
static void
ok_p(const char *quoted, const llmgw_desc_policy_t *p, llmgw_outbound_t *out)
{
    if (build_p(quoted, p, out) != 0) {
        fail_msg("refused: %s (%s)", err, quoted);
    }
}

static void
ok(const char *quoted, llmgw_outbound_t *out)
{
    llmgw_desc_policy_t p = policy();

    ok_p(quoted, &p, out);
}


/* Refused with policy p and a message containing want. */
static void
refused_p(const char *quoted, const llmgw_desc_policy_t *p, const char *want)
{
    llmgw_outbound_t out;

    if (build_p(quoted, p, &out) == 0) {
        llmgw_outbound_free(&out);
        fail_msg("accepted: %s", quoted);
    }

    if (strstr(err, want) == NULL) {
        fail_msg("message \"%s\" lacks \"%s\"", err, want);
    }
}

static void
refused(const char *quoted, const char *want)
{
    llmgw_desc_policy_t p = policy();

    refused_p(quoted, &p, want);
}


static void
assert_accepted(const char *quoted)
{
    llmgw_outbound_t out;

    ok(quoted, &out);
    llmgw_outbound_free(&out);
}


static void
assert_buf(llmgw_buf_t b, const char *want)
{
    assert_non_null(b.data);
    assert_int_equal(b.len, strlen(want));
    assert_memory_equal(b.data, want, b.len);
}


/* s occurs in b (which may hold NUL bytes). */
static int
has(llmgw_buf_t b, const char *s)
{
    return memmem(b.data, b.len, s, strlen(s)) != NULL;
}


/* The boundary of a multipart Content-Type line in the headers. */
static void
boundary_of(const llmgw_outbound_t *o, char *b, size_t size)
{
    const char *at = strstr(o->headers.data,
                            "Content-Type: multipart/form-data; boundary=");
    size_t      n;

    assert_non_null(at);
    at += strlen("Content-Type: multipart/form-data; boundary=");
    n = strcspn(at, "\r");
    assert_true(n > 16 && n < size);
    memcpy(b, at, n);
    b[n] = '\0';
}


/* ---- URL and host ---- */

static void
test_get_to_channel_host_is_built_without_body(void **state)
{
    llmgw_outbound_t o;

    (void) state;

    ok("{'url':'https://api.vendor.com/v1/tasks/7?full=1#frag'}", &o);
    assert_string_equal(o.method, "GET");
    assert_int_equal(o.tls, 1);
    assert_string_equal(o.host, "api.vendor.com");
    assert_int_equal(o.port, 443);
    assert_string_equal(o.host_header, "api.vendor.com");
    assert_string_equal(o.uri, "/v1/tasks/7?full=1");
    assert_buf(o.url, "https://api.vendor.com/v1/tasks/7?full=1");
    assert_buf(o.headers, "");
    assert_null(o.body.data);
    assert_int_equal(o.sse, 0);
    assert_int_equal(o.credentialless, 0);
    llmgw_outbound_free(&o);
}

static void
test_url_without_path_gets_slash(void **state)
{
    llmgw_outbound_t o;

    (void) state;

    ok("{'url':'https://api.vendor.com?x=1'}", &o);
    assert_string_equal(o.uri, "/?x=1");
    llmgw_outbound_free(&o);
}

static void
test_url_must_be_absolute_http(void **state)
{
    (void) state;

    refused("{'method':'GET'}", "url is required");
    refused("{'url':42}", "url is required");
    refused("{'url':'/v1/tasks'}", "url must be an absolute http(s) URL");
    refused("{'url':'ftp://api.vendor.com/x'}",
            "url must be an absolute http(s) URL");
    refused("{'url':'file:///etc/passwd'}",
            "url must be an absolute http(s) URL");
    refused("{'url':'https://'}", "url host \"\" is not valid");
}

static void
test_url_with_credentials_is_refused(void **state)
{
    (void) state;

    refused("{'url':'https://user:pass@api.vendor.com/'}",
            "url must not contain credentials (user:pass@)");
    refused("{'url':'https://api.vendor.com@evil.com/'}",
            "url must not contain credentials");
}

static void
test_url_with_whitespace_control_or_backslash_is_refused(void **state)
{
    (void) state;

    refused("{'url':'https://api.vendor.com/a b'}",
            "url must not contain whitespace or control characters");
    refused("{'url':'https://api.vendor.com/a\\tb'}",
            "url must not contain whitespace or control characters");
    refused("{'url':'https://api.vendor.com/a\\u0000b'}",
            "url must not contain whitespace or control characters");
    refused("{'url':'https://evil.com\\\\@api.vendor.com/'}",
            "url must not contain backslashes");
}

static void
test_url_host_must_be_ascii(void **state)
{
    (void) state;

    refused("{'url':'https://ap\xc3\xae.vendor.com/'}",
            "url host must be ASCII (use the punycode form)");
    refused("{'url':'https://api%2evendor.com/'}", "is not valid");
    refused("{'url':'https://api.vendor.com:99999/'}",
            "url port \"99999\" is not valid");
}

/* Other parsers read these as 127.0.0.1; the resolver would not. */
static void
test_url_ipv4_only_as_four_decimal_numbers(void **state)
{
    llmgw_desc_policy_t  p = policy();
    static const char   *odd[] = {
        "2130706433", "0x7f000001", "0x7f.1", "0177.0.0.1", "127.1",
        "127.0.1", "0x7F.0.0.1", "017700000001", "cdn.0x10", "a.b.1",
        "127.000.0.1", "0x",
    };
    /* names whose last label only looks numeric, and a public address */
    static const char   *fine[] = {
        "203.0.113.9", "1x.example", "0xcafe.example", "0xg", "1.2.3.4x",
    };
    char                 d[128];
    llmgw_outbound_t     cur, next;

    (void) state;

    p.allow_credentialless = 1;

    for (size_t i = 0; i < sizeof(odd) / sizeof(odd[0]); i++) {
        snprintf(d, sizeof(d), "{'url':'http://%s/','credentialless':true}",
                 odd[i]);
        refused_p(d, &p, "(an IPv4 address is four decimal numbers");
    }

    for (size_t i = 0; i < sizeof(fine) / sizeof(fine[0]); i++) {
        snprintf(d, sizeof(d), "{'url':'http://%s/','credentialless':true}",
                 fine[i]);
        ok_p(d, &p, &cur);
        llmgw_outbound_free(&cur);
    }

    /* redirects too */
    ok_p("{'url':'https://cdn.example.net/v','credentialless':true}", &p,
         &cur);
    assert_int_equal(llmgw_descriptor_redirect(&cur, 302,
                         LLMGW_STR("http://2130706433/"), &p, &next, err,
                         sizeof(err)), -1);
    assert_non_null(strstr(err, "four decimal numbers"));
    llmgw_outbound_free(&cur);
}

static void
test_url_non_ascii_path_is_percent_encoded(void **state)
{
    llmgw_outbound_t o;

    (void) state;

    ok("{'url':'https://api.vendor.com/f/\xc3\xa9t\xc3\xa9?q=\xc3\xa9'}", &o);
    assert_string_equal(o.uri, "/f/%C3%A9t%C3%A9?q=%C3%A9");
    llmgw_outbound_free(&o);
}

static void
test_foreign_host_is_refused(void **state)
{
    llmgw_outbound_t     o;
    llmgw_desc_policy_t  p = policy();

    (void) state;

    assert_int_equal(build_p("{'url':'https://evil.com/steal'}", &p, &o), -1);
    assert_string_equal(err, "descriptor: url host evil.com is neither the "
                             "channel host nor in allowedHosts");

    refused("{'url':'https://api.vendor.com.evil.com/'}",
            "url host api.vendor.com.evil.com is neither");
    refused("{'url':'https://xcdn.vendor.com/'}", "is neither");
    refused("{'url':'https://vendor.com/'}", "is neither");
}

static void
test_channel_host_needs_same_scheme_and_port(void **state)
{
    (void) state;

    assert_accepted("{'url':'https://api.vendor.com:443/v1/x'}");
    refused("{'url':'https://api.vendor.com:8443/v1/x'}",
            "url host api.vendor.com:8443 is neither");
    refused("{'url':'http://api.vendor.com/v1/x'}", "is neither");
    refused("{'url':'http://api.vendor.com:443/v1/x'}", "is neither");
}

static void
test_channel_host_with_port_in_base_url(void **state)
{
    llmgw_desc_policy_t  p = policy();
    llmgw_outbound_t     o;

    (void) state;

    p.base_url = LLMGW_STR("http://10.0.0.5:9000");
    ok_p("{'url':'http://10.0.0.5:9000/submit'}", &p, &o);
    assert_int_equal(o.tls, 0);
    assert_int_equal(o.port, 9000);
    assert_string_equal(o.host_header, "10.0.0.5:9000");
    llmgw_outbound_free(&o);
    refused_p("{'url':'http://10.0.0.5/submit'}", &p, "is neither");
}

static void
test_host_compare_is_case_insensitive(void **state)
{
    llmgw_outbound_t o;

    (void) state;

    ok("{'url':'HTTPS://API.Vendor.COM/v1/X'}", &o);
    assert_string_equal(o.host, "api.vendor.com");
    assert_buf(o.url, "https://api.vendor.com/v1/X");
    llmgw_outbound_free(&o);
    assert_accepted("{'url':'https://CDN.vendor.com/a'}");
}

static void
test_no_channel_host_and_no_allowed_hosts_refuses_everything(void **state)
{
    llmgw_desc_policy_t p = policy();

    (void) state;

    p.base_url = LLMGW_STR("");
    p.nallowed = 0;
    refused_p("{'url':'https://api.vendor.com/'}", &p, "is neither");
}

static void
test_allowed_host_without_port_matches_default_port_only(void **state)
{
    (void) state;

    assert_accepted("{'url':'https://cdn.vendor.com/a'}");
    assert_accepted("{'url':'http://cdn.vendor.com/a'}");
    assert_accepted("{'url':'https://cdn.vendor.com:443/a'}");
    assert_accepted("{'url':'http://cdn.vendor.com:80/a'}");
    refused("{'url':'https://cdn.vendor.com:8443/a'}",
            "url host cdn.vendor.com:8443 is neither");
    refused("{'url':'http://cdn.vendor.com:443/a'}", "is neither");
}

static void
test_allowed_hosts_port_must_match(void **state)
{
    (void) state;

    assert_accepted("{'url':'https://files.vendor.com:8443/a'}");
    refused("{'url':'https://files.vendor.com/a'}", "is neither");
    refused("{'url':'https://files.vendor.com:8444/a'}", "is neither");

    /* 443 matches a URL that omits the port, for https only */
    assert_accepted("{'url':'https://media.vendor.com/a'}");
    assert_accepted("{'url':'http://media.vendor.com:443/a'}");
    refused("{'url':'http://media.vendor.com/a'}", "is neither");
}

static void
test_allowed_ipv6_literal(void **state)
{
    llmgw_outbound_t o;

    (void) state;

    ok("{'url':'https://[2001:DB8:0::1]/x'}", &o);
    assert_string_equal(o.host, "2001:db8:0::1");
    assert_string_equal(o.host_header, "[2001:db8:0::1]");
    assert_buf(o.url, "https://[2001:db8:0::1]/x");
    llmgw_outbound_free(&o);

    ok("{'url':'http://[::1]:8080/y'}", &o);
    assert_string_equal(o.host, "::1");
    assert_string_equal(o.host_header, "[::1]:8080");
    assert_int_equal(o.port, 8080);
    llmgw_outbound_free(&o);

    refused("{'url':'https://[2001:db8::2]/'}", "is neither");
    refused("{'url':'http://[::1]/'}", "is neither");
    refused("{'url':'https://[::1%25eth0]:8080/'}", "is not valid");
    refused("{'url':'https://[zz::1]/'}", "is not valid");
}


/* ---- methods and headers ---- */

static void
test_method_defaults_and_allowed_list(void **state)
{
    llmgw_outbound_t o;

    (void) state;

    ok("{'url':'https://api.vendor.com/','body':{'a':1}}", &o);
    assert_string_equal(o.method, "POST");
    llmgw_outbound_free(&o);

    ok("{'url':'https://api.vendor.com/','method':'put','body':{}}", &o);
    assert_string_equal(o.method, "PUT");
    llmgw_outbound_free(&o);

    ok("{'url':'https://api.vendor.com/','method':'DELETE'}", &o);
    assert_string_equal(o.method, "DELETE");
    assert_null(o.body.data);
    llmgw_outbound_free(&o);

    refused("{'url':'https://api.vendor.com/','method':'TRACE'}",
            "method \"TRACE\" is not allowed");
    refused("{'url':'https://api.vendor.com/','method':'CONNECT'}",
            "is not allowed");
    refused("{'url':'https://api.vendor.com/','method':'GET /x HTTP/1.1'}",
            "is not allowed");
    refused("{'url':'https://api.vendor.com/','method':1}", "not allowed");
}

static void
test_get_and_head_with_body_are_refused(void **state)
{
    (void) state;

    refused("{'url':'https://api.vendor.com/','method':'GET','body':{}}",
            "method GET may not carry a body");
    refused("{'url':'https://api.vendor.com/','method':'HEAD','body':'x',"
            "'bodyType':'text'}", "method HEAD may not carry a body");
    refused("{'url':'https://api.vendor.com/','method':'GET',"
            "'bodyType':'multipart','parts':[{'name':'a','value':'b'}]}",
            "method GET may not carry a body");
}

static void
test_headers_are_sent_in_order_with_repeated_values(void **state)
{
    llmgw_outbound_t o;

    (void) state;

    ok("{'url':'https://api.vendor.com/','headers':{'Authorization':"
       "'Bearer " CRED "','X-Tag':['a','b'],'Range':'bytes=0-9'}}", &o);
    assert_buf(o.headers, "Authorization: Bearer " CRED "\r\n"
                          "X-Tag: a\r\nX-Tag: b\r\nRange: bytes=0-9\r\n");
    llmgw_outbound_free(&o);
}

static void
test_header_names_must_be_tokens(void **state)
{
    (void) state;

    refused("{'url':'https://api.vendor.com/','headers':{'Bad Name':'x'}}",
            "headers: \"Bad Name\" is not a valid header name");
    refused("{'url':'https://api.vendor.com/','headers':{'X:Y':'x'}}",
            "is not a valid header name");
    refused("{'url':'https://api.vendor.com/','headers':{'':'x'}}",
            "is not a valid header name");
    refused("{'url':'https://api.vendor.com/','headers':['X']}",
            "headers must be an object of strings");
}

static void
test_header_values_without_cr_lf_nul(void **state)
{
    (void) state;

    refused("{'url':'https://api.vendor.com/','headers':"
            "{'X-A':'v\\r\\nX-Injected: 1'}}",
            "headers.X-A value must not contain CR, LF, NUL");
    /* the refused value is never repeated */
    assert_null(strstr(err, "Injected"));
    refused("{'url':'https://api.vendor.com/','headers':{'X-A':'v\\u0000'}}",
            "must not contain CR, LF, NUL");
    refused("{'url':'https://api.vendor.com/','headers':{'X-A':['ok','\\n']}}",
            "must not contain CR, LF, NUL");
    refused("{'url':'https://api.vendor.com/','headers':{'X-A':1}}",
            "headers.X-A must be a string or an array of strings");
}

static void
test_host_managed_headers_are_refused(void **state)
{
    static const char *const names[] = {
        "Host", "content-length", "Transfer-Encoding", "Connection",
        "Upgrade", "TE", "Trailer", "Proxy-Authorization", "proxy-x",
        "Keep-Alive",
    };
    char json[256];

    (void) state;

    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        snprintf(json, sizeof(json),
                 "{'url':'https://api.vendor.com/','headers':{'%s':'x'}}",
                 names[i]);
        refused(json, "is set by the host and may not be sent by a plugin");
    }
}


/* ---- bodies ---- */

static void
test_json_body_is_compact_with_default_content_type(void **state)
{
    llmgw_outbound_t o;

    (void) state;

    ok("{'url':'https://api.vendor.com/','body':{ 'model' : 'm1', "
       "'n':[1, 0.1, 1e20, true, null], 's':'\\u00e9\\n' }}", &o);
    assert_buf(o.body, "{\"model\":\"m1\",\"n\":[1,0.1,1e+20,true,null],"
                       "\"s\":\"\xc3\xa9\\n\"}");
    assert_buf(o.headers, "Content-Type: application/json\r\n");
    llmgw_outbound_free(&o);
}

static void
test_json_body_keeps_plugin_content_type(void **state)
{
    llmgw_outbound_t o;

    (void) state;

    ok("{'url':'https://api.vendor.com/','headers':{'content-type':"
       "'application/vnd.api+json'},'body':[1]}", &o);
    assert_buf(o.headers, "content-type: application/vnd.api+json\r\n");
    assert_buf(o.body, "[1]");
    llmgw_outbound_free(&o);
}

static void
test_json_scalar_body_is_json_text(void **state)
{
    llmgw_outbound_t o;

    (void) state;

    ok("{'url':'https://api.vendor.com/','method':'PUT','body':'hi'}", &o);
    assert_buf(o.body, "\"hi\"");
    llmgw_outbound_free(&o);
}

static void
test_unknown_body_type_is_refused(void **state)
{
    (void) state;

    refused("{'url':'https://api.vendor.com/','bodyType':'xml','body':'x'}",
            "bodyType \"xml\" is not supported");
    refused("{'url':'https://api.vendor.com/','bodyType':1,'body':'x'}",
            "is not supported");
}

static void
test_form_body_is_urlencoded(void **state)
{
    llmgw_outbound_t o;

    (void) state;

    ok("{'url':'https://api.vendor.com/','bodyType':'form','body':"
       "{'a b':'x&y=z','k':['1','\xc3\xa9'],'e':''}}", &o);
    assert_buf(o.body, "a+b=x%26y%3Dz&k=1&k=%C3%A9&e=");
    assert_buf(o.headers,
               "Content-Type: application/x-www-form-urlencoded\r\n");
    llmgw_outbound_free(&o);

    refused("{'url':'https://api.vendor.com/','bodyType':'form','body':"
            "{'a':1}}", "body.a must be a string or an array of strings");
    refused("{'url':'https://api.vendor.com/','bodyType':'form','body':'a=b'}",
            "bodyType form needs body as an object of strings");
}

static void
test_text_and_raw_bodies_need_a_string(void **state)
{
    llmgw_outbound_t o;

    (void) state;

    ok("{'url':'https://api.vendor.com/','bodyType':'text','body':'a\\nb'}",
       &o);
    assert_buf(o.body, "a\nb");
    assert_buf(o.headers, "Content-Type: text/plain; charset=utf-8\r\n");
    llmgw_outbound_free(&o);

    ok("{'url':'https://api.vendor.com/','bodyType':'raw','body':''}", &o);
    assert_non_null(o.body.data);           /* empty, but a body */
    assert_int_equal(o.body.len, 0);
    assert_buf(o.headers, "Content-Type: application/octet-stream\r\n");
    llmgw_outbound_free(&o);

    refused("{'url':'https://api.vendor.com/','bodyType':'text','body':{}}",
            "bodyType text needs body as a string");
}

static void
test_unknown_top_level_members_are_ignored(void **state)
{
    (void) state;

    assert_accepted("{'url':'https://api.vendor.com/','maxBytes':10,"
                    "'timeout':5,'whatever':{'a':1}}");
}

static void
test_descriptor_must_be_a_json_object(void **state)
{
    (void) state;

    refused("[1]", "descriptor: must be a JSON object");
    refused("{'url':", "must be a JSON object");
    refused("", "must be a JSON object");
}


/* ---- responseType ---- */

static void
test_response_type_sse_needs_declaration(void **state)
{
    llmgw_desc_policy_t  p = policy();
    llmgw_outbound_t     o;
    const char          *d = "{'url':'https://api.vendor.com/','body':{},"
                             "'responseType':'sse'}";

    (void) state;

    refused(d, "responseType \"sse\" is not allowed here");

    p.allow_sse = 1;
    ok_p(d, &p, &o);
    assert_int_equal(o.sse, 1);
    llmgw_outbound_free(&o);

    ok_p("{'url':'https://api.vendor.com/','responseType':'json'}", &p, &o);
    assert_int_equal(o.sse, 0);
    llmgw_outbound_free(&o);

    refused_p("{'url':'https://api.vendor.com/','responseType':'binary'}", &p,
              "responseType must be \"json\" or \"sse\"");
}


/* ---- credentialless ---- */

static void
test_credentialless_only_in_content_requests(void **state)
{
    (void) state;

    refused("{'url':'https://cdn.example.net/v.mp4','credentialless':true}",
            "credentialless is allowed only in content requests");
    refused("{'url':'https://api.vendor.com/','credentialless':'yes'}",
            "credentialless must be a boolean");
}

static void
test_credentialless_get_may_reach_any_host(void **state)
{
    llmgw_desc_policy_t  p = policy();
    llmgw_outbound_t     o;

    (void) state;

    p.allow_credentialless = 1;
    ok_p("{'url':'https://cdn.example.net/v.mp4?sig=abc',"
         "'credentialless':true}", &p, &o);
    assert_int_equal(o.credentialless, 1);
    /* the plugin's address: only public addresses unless allowed */
    assert_int_equal(o.public_only, 1);
    assert_string_equal(o.method, "GET");
    assert_string_equal(o.host, "cdn.example.net");
    assert_buf(o.headers, "");
    assert_null(o.body.data);
    llmgw_outbound_free(&o);

    ok_p("{'url':'http://203.0.113.9/v.mp4','method':'HEAD',"
         "'credentialless':true,'headers':{}}", &p, &o);
    assert_string_equal(o.method, "HEAD");
    llmgw_outbound_free(&o);

    /* without the flag the same content request stays on allowed hosts */
    refused_p("{'url':'https://cdn.example.net/v.mp4'}", &p, "is neither");
    refused_p("{'url':'ftp://cdn.example.net/v.mp4','credentialless':true}",
              &p, "url must be an absolute http(s) URL");
}

/*
 * The channel's base URL is the operator's choice and may be private; a
 * content address elsewhere is the plugin's, and only public addresses
 * are connected to for it.  Requests with credentials stay on the
 * channel host or allowedHosts, which the operator reviewed.
 */
/* public_only of what descriptor d builds to with p. */
static int
public_only_of(const char *d, const llmgw_desc_policy_t *p)
{
    llmgw_outbound_t  o;
    int               v;

    ok_p(d, p, &o);
    v = o.public_only;
    llmgw_outbound_free(&o);
    return v;
}

static void
test_credentialless_public_only_off_the_channel_origin(void **state)
{
    llmgw_desc_policy_t  p = policy();

    (void) state;

    p.allow_credentialless = 1;
    p.base_url = LLMGW_STR("http://10.0.0.5:8080/v1");

    assert_false(public_only_of("{'url':'http://10.0.0.5:8080/files/v.mp4',"
                                "'credentialless':true}", &p));
    /* the same host on another port or scheme is another origin */
    assert_true(public_only_of("{'url':'http://10.0.0.5:22/',"
                               "'credentialless':true}", &p));
    assert_true(public_only_of("{'url':'https://10.0.0.5:8080/',"
                               "'credentialless':true}", &p));
    assert_true(public_only_of("{'url':'http://169.254.169.254/latest/',"
                               "'credentialless':true}", &p));
    assert_true(public_only_of("{'url':'http://[::ffff:127.0.0.1]/',"
                               "'credentialless':true}", &p));
    assert_false(public_only_of("{'url':'http://10.0.0.5:8080/v1/tasks'}",
                                &p));
}

static void
test_credentialless_allows_only_get_and_head(void **state)
{
    llmgw_desc_policy_t p = policy();

    (void) state;

    p.allow_credentialless = 1;
    refused_p("{'url':'https://cdn.example.net/','credentialless':true,"
              "'method':'POST'}", &p,
              "credentialless requests must use GET or HEAD");
    refused_p("{'url':'https://cdn.example.net/','credentialless':true,"
              "'body':{'a':1}}", &p,
              "credentialless requests must use GET or HEAD");
    refused_p("{'url':'https://cdn.example.net/','credentialless':true,"
              "'method':'GET','body':{'a':1}}", &p,
              "credentialless requests may not carry a body");
    refused_p("{'url':'https://cdn.example.net/','credentialless':true,"
              "'method':'GET','bodyType':'multipart',"
              "'parts':[{'name':'a','value':'b'}]}", &p,
              "credentialless requests may not carry a body");
}

static void
test_credentialless_refuses_plugin_headers(void **state)
{
    llmgw_desc_policy_t p = policy();

    (void) state;

    p.allow_credentialless = 1;
    refused_p("{'url':'https://cdn.example.net/','credentialless':true,"
              "'headers':{'Range':'bytes=0-1'}}", &p,
              "credentialless requests may not carry plugin headers");
}

static void
test_credentialless_url_must_not_carry_the_credential(void **state)
{
    llmgw_desc_policy_t  p = policy();
    llmgw_outbound_t     o;

    (void) state;

    p.allow_credentialless = 1;
    refused_p("{'url':'https://cdn.example.net/x?key=" CRED "',"
              "'credentialless':true}", &p,
              "credentialless url contains the channel credential");
    /* percent-encoded: sk%2Dsecret... */
    refused_p("{'url':'https://cdn.example.net/x?key=sk%2dsecret-channel-"
              "key-123','credentialless':true}", &p,
              "contains the channel credential");
    /* on the channel host too: credentialless means no credential */
    refused_p("{'url':'https://api.vendor.com/x?key=" CRED "',"
              "'credentialless':true}", &p, "contains the channel credential");

    /* a short credential is not searched for (it would match by chance) */
    p.credential = LLMGW_STR("abc");
    ok_p("{'url':'https://cdn.example.net/abc','credentialless':true}", &p,
         &o);
    llmgw_outbound_free(&o);
}

static void
test_messages_never_repeat_the_credential(void **state)
{
    llmgw_outbound_t     o;
    llmgw_desc_policy_t  p = policy();

    (void) state;

    assert_int_equal(build_p("{'url':'https://" CRED ".evil.com/'}", &p, &o),
                     -1);
    assert_non_null(strstr(err, "url host [credential].evil.com is neither"));
    assert_int_equal(build_p("{'url':'https://api.vendor.com/','body':"
                             "{'__fileRef':'" CRED "','encoding':'base64'}}",
                             &p, &o), -1);
    assert_non_null(strstr(err, "unknown file reference \"[credential]\""));
}


/* ---- file placeholders ---- */

static void
test_placeholder_becomes_base64(void **state)
{
    llmgw_outbound_t o;

    (void) state;

    ok("{'url':'https://api.vendor.com/','body':{'img':{'__fileRef':"
       "'request_file:image','encoding':'base64'},'n':1}}", &o);
    assert_buf(o.body, "{\"img\":\"aGVsbG8gd29ybGQ=\",\"n\":1}");
    llmgw_outbound_free(&o);

    ok("{'url':'https://api.vendor.com/','body':[{'__fileRef':"
       "'request_file:image#1','encoding':'base64','maxBytes':5}]}", &o);
    assert_buf(o.body, "[\"AAEC/3o=\"]");
    llmgw_outbound_free(&o);
}

static void
test_placeholder_becomes_data_url(void **state)
{
    llmgw_outbound_t o;

    (void) state;

    /* mimeType of the placeholder wins */
    ok("{'url':'https://api.vendor.com/','body':{'a':{'__fileRef':"
       "'request_file:image','encoding':'dataUrl','mimeType':'image/webp'}}}",
       &o);
    assert_buf(o.body, "{\"a\":\"data:image/webp;base64,aGVsbG8gd29ybGQ=\"}");
    llmgw_outbound_free(&o);

    /* else the file's type, else application/octet-stream */
    ok("{'url':'https://api.vendor.com/','body':{'a':{'__fileRef':"
       "'request_file:image','encoding':'dataUrl'},'b':{'__fileRef':"
       "'request_file:image#1','encoding':'dataUrl'}}}", &o);
    assert_buf(o.body, "{\"a\":\"data:image/png;base64,aGVsbG8gd29ybGQ=\","
                       "\"b\":\"data:application/octet-stream;base64,"
                       "AAEC/3o=\"}");
    llmgw_outbound_free(&o);
}

static void
test_placeholder_members_are_checked(void **state)
{
    (void) state;

    refused("{'url':'https://api.vendor.com/','body':{'__fileRef':"
            "'request_file:image','encoding':'base64','path':'/etc/x'}}",
            "file placeholder: member \"path\" is not allowed");
    refused("{'url':'https://api.vendor.com/','body':{'__fileRef':"
            "'request_file:image','encoding':'hex'}}",
            "file placeholder request_file:image: encoding must be "
            "\"base64\" or \"dataUrl\"");
    refused("{'url':'https://api.vendor.com/','body':{'__fileRef':"
            "'request_file:image'}}", "encoding must be");
    refused("{'url':'https://api.vendor.com/','body':{'__fileRef':1,"
            "'encoding':'base64'}}", "__fileRef must be a string");
    refused("{'url':'https://api.vendor.com/','body':{'__fileRef':"
            "'request_file:image','encoding':'base64','maxBytes':'1'}}",
            "maxBytes must be a positive integer");
    refused("{'url':'https://api.vendor.com/','body':{'__fileRef':"
            "'request_file:image','encoding':'dataUrl','mimeType':5}}",
            "mimeType must be a string");
}

static void
test_placeholder_with_unknown_ref_is_refused(void **state)
{
    (void) state;

    refused("{'url':'https://api.vendor.com/','body':{'x':[{'__fileRef':"
            "'request_file:image#2','encoding':'base64'}]}}",
            "unknown file reference \"request_file:image#2\"");
    refused("{'url':'https://api.vendor.com/','body':{'__fileRef':"
            "'/etc/passwd','encoding':'base64'}}",
            "unknown file reference \"/etc/passwd\"");
}

static void
test_placeholder_max_bytes_is_enforced(void **state)
{
    (void) state;

    refused("{'url':'https://api.vendor.com/','body':{'__fileRef':"
            "'request_file:image','encoding':'base64','maxBytes':10}}",
            "file request_file:image is 11 bytes, more than its maxBytes 10");
    assert_accepted("{'url':'https://api.vendor.com/','body':{'__fileRef':"
                    "'request_file:image','encoding':'base64',"
                    "'maxBytes':11}}");
}

static void
test_per_file_limit_applies_to_placeholders_and_parts(void **state)
{
    llmgw_desc_policy_t  p = policy();
    llmgw_outbound_t     o;

    (void) state;

    p.max_file_bytes = 10;
    refused_p("{'url':'https://api.vendor.com/','body':{'__fileRef':"
              "'request_file:image','encoding':'base64','maxBytes':100}}",
              &p, "file request_file:image is 11 bytes, more than the "
                  "per-file limit of 10 bytes");
    refused_p("{'url':'https://api.vendor.com/','bodyType':'multipart',"
              "'parts':[{'name':'f','fileRef':'request_file:image'}]}", &p,
              "more than the per-file limit of 10 bytes");
    p.max_file_bytes = 11;
    ok_p("{'url':'https://api.vendor.com/','bodyType':'multipart','parts':"
         "[{'name':'f','fileRef':'request_file:image'}]}", &p, &o);
    llmgw_outbound_free(&o);
}

static void
test_total_limit_counts_every_inlined_byte(void **state)
{
    llmgw_desc_policy_t  p = policy();
    llmgw_outbound_t     o;
    const char          *twice = "{'url':'https://api.vendor.com/','body':["
        "{'__fileRef':'request_file:image','encoding':'base64'},"
        "{'__fileRef':'request_file:image','encoding':'dataUrl'}]}";

    (void) state;

    p.max_total_bytes = 21;             /* 11 + 11 bytes referenced */
    refused_p(twice, &p, "files of this request exceed the total limit "
                         "of 21 bytes");
    refused_p("{'url':'https://api.vendor.com/','bodyType':'multipart',"
              "'parts':[{'name':'a','fileRef':'request_file:image'},"
              "{'name':'b','fileRef':'request_file:image'}]}", &p,
              "exceed the total limit of 21 bytes");

    p.max_total_bytes = 22;
    ok_p(twice, &p, &o);
    llmgw_outbound_free(&o);
}


/* ---- multipart ---- */

static void
test_multipart_body_with_fields_and_repeated_files(void **state)
{
    llmgw_outbound_t  o;
    char              b[128], want[2048];

    (void) state;

    ok("{'url':'https://api.vendor.com/edits','bodyType':'multipart',"
       "'headers':{'Authorization':'Bearer x'},'parts':["
       "{'name':'prompt','value':'a cat'},"
       "{'name':'image[]','fileRef':'request_file:image'},"
       "{'name':'image[]','fileRef':'request_file:image#1',"
       "'filename':'two.bin','contentType':'image/jpeg'},"
       "{'name':'meta','value':'{}','contentType':'application/json'}]}",
       &o);
    assert_string_equal(o.method, "POST");
    boundary_of(&o, b, sizeof(b));

    snprintf(want, sizeof(want),
             "--%s\r\n"
             "Content-Disposition: form-data; name=\"prompt\"\r\n\r\n"
             "a cat\r\n"
             "--%s\r\n"
             "Content-Disposition: form-data; name=\"image[]\"; "
             "filename=\"cat.png\"\r\n"
             "Content-Type: image/png\r\n\r\n"
             "hello world\r\n"
             "--%s\r\n"
             "Content-Disposition: form-data; name=\"image[]\"; "
             "filename=\"two.bin\"\r\n"
             "Content-Type: image/jpeg\r\n\r\n"
             "%%s\r\n"
             "--%s\r\n"
             "Content-Disposition: form-data; name=\"meta\"\r\n"
             "Content-Type: application/json\r\n\r\n"
             "{}\r\n"
             "--%s--\r\n", b, b, b, b, b);

    /* the binary file (with its NUL) sits where %s is */
    {
        const char *hole = strstr(want, "%s");
        size_t      head = (size_t) (hole - want);
        size_t      total = strlen(want) - 2 + sizeof(BIN);

        assert_int_equal(o.body.len, total);
        assert_memory_equal(o.body.data, want, head);
        assert_memory_equal(o.body.data + head, BIN, sizeof(BIN));
        assert_memory_equal(o.body.data + head + sizeof(BIN), hole + 2,
                            strlen(hole + 2));
    }

    assert_non_null(strstr(o.headers.data, "Authorization: Bearer x\r\n"));
    llmgw_outbound_free(&o);
}

static void
test_multipart_file_defaults_and_escaping(void **state)
{
    llmgw_outbound_t o;

    (void) state;

    /* no filename: "blob"; a client's CR/LF in the type cannot add lines */
    ok("{'url':'https://api.vendor.com/','bodyType':'multipart','parts':["
       "{'name':'f','fileRef':'request_file:image#1'},"
       "{'name':'n\\'q','fileRef':'request_file:doc'}]}", &o);
    assert_true(has(o.body, "name=\"f\"; filename=\"blob\"\r\n"
                            "Content-Type: application/octet-stream\r\n"));
    assert_true(has(o.body, "name=\"n%22q\"; filename=\"a%22b.txt\"\r\n"
                            "Content-Type: application/octet-stream\r\n"
                            "\r\ndoc\r\n"));
    assert_false(has(o.body, "X-Evil"));
    llmgw_outbound_free(&o);
}

static void
test_multipart_overrides_plugin_content_type(void **state)
{
    llmgw_outbound_t o;
    char             b[128];

    (void) state;

    ok("{'url':'https://api.vendor.com/','bodyType':'multipart','headers':"
       "{'Content-Type':'multipart/form-data; boundary=plugin'},"
       "'parts':[{'name':'a','value':'b'}]}", &o);
    boundary_of(&o, b, sizeof(b));
    assert_null(strstr(o.headers.data, "boundary=plugin"));
    assert_true(strncmp(o.body.data, "--", 2) == 0);
    assert_true(strncmp(o.body.data + 2, b, strlen(b)) == 0);
    llmgw_outbound_free(&o);
}

static void
test_multipart_boundary_is_random(void **state)
{
    llmgw_outbound_t  o1, o2;
    char              b1[128], b2[128];
    const char       *d = "{'url':'https://api.vendor.com/','bodyType':"
                          "'multipart','parts':[{'name':'a','value':'b'}]}";

    (void) state;

    ok(d, &o1);
    ok(d, &o2);
    boundary_of(&o1, b1, sizeof(b1));
    boundary_of(&o2, b2, sizeof(b2));
    assert_string_not_equal(b1, b2);
    llmgw_outbound_free(&o1);
    llmgw_outbound_free(&o2);
}

static void
test_multipart_part_rules(void **state)
{
    (void) state;

    refused("{'url':'https://api.vendor.com/','bodyType':'multipart'}",
            "bodyType multipart needs parts");
    refused("{'url':'https://api.vendor.com/','bodyType':'multipart',"
            "'parts':[]}", "parts must be a non-empty array");
    refused("{'url':'https://api.vendor.com/','bodyType':'multipart',"
            "'body':{},'parts':[{'name':'a','value':'b'}]}",
            "bodyType multipart takes parts, not body");
    refused("{'url':'https://api.vendor.com/','parts':[{'name':'a',"
            "'value':'b'}]}", "parts is used only with bodyType \"multipart\"");
    refused("{'url':'https://api.vendor.com/','bodyType':'multipart',"
            "'parts':[{'value':'b'}]}",
            "parts[0].name must be a non-empty string");
    refused("{'url':'https://api.vendor.com/','bodyType':'multipart',"
            "'parts':[{'name':'a','value':'b'},{'name':'f','value':'x',"
            "'fileRef':'request_file:image'}]}",
            "parts[1] needs exactly one of value and fileRef");
    refused("{'url':'https://api.vendor.com/','bodyType':'multipart',"
            "'parts':[{'name':'a'}]}",
            "needs exactly one of value and fileRef");
    refused("{'url':'https://api.vendor.com/','bodyType':'multipart',"
            "'parts':[{'name':'a','value':1}]}", "parts[0].value must be a "
            "string");
    refused("{'url':'https://api.vendor.com/','bodyType':'multipart',"
            "'parts':[{'name':'a','fileRef':'request_file:nope'}]}",
            "unknown file reference \"request_file:nope\"");
    refused("{'url':'https://api.vendor.com/','bodyType':'multipart',"
            "'parts':[{'name':'a','value':'b','contentType':'x\\r\\ny: z'}]}",
            "parts[0].contentType must not contain control characters");
    refused("{'url':'https://api.vendor.com/','bodyType':'multipart',"
            "'parts':['a']}", "parts[0] must be an object");
}


/* ---- redirects ---- */

static int
redirect(const llmgw_outbound_t *cur, int status, const char *loc,
    const llmgw_desc_policy_t *p, llmgw_outbound_t *next)
{
    int rc;

    err[0] = '\0';
    rc = llmgw_descriptor_redirect(cur, status,
                                   (llmgw_str_t) { loc, strlen(loc) }, p,
                                   next, err, sizeof(err));
    if (rc != 0) {
        assert_null(next->host);
        assert_null(strstr(err, CRED));
    }

    return rc;
}

static void
redirect_ok(const llmgw_outbound_t *cur, int status, const char *loc,
    const llmgw_desc_policy_t *p, llmgw_outbound_t *next)
{
    if (redirect(cur, status, loc, p, next) != 0) {
        fail_msg("redirect to %s refused: %s", loc, err);
    }
}

static void
test_redirect_resolves_relative_locations(void **state)
{
    static const struct { const char *loc, *url; } cases[] = {
        { "/v2/x?y=1", "https://api.vendor.com/v2/x?y=1" },
        { "b/c", "https://api.vendor.com/v1/tasks/b/c" },
        { "../up#frag", "https://api.vendor.com/v1/up" },
        { "./../../../../root", "https://api.vendor.com/root" },
        { "?page=2", "https://api.vendor.com/v1/tasks/7?page=2" },
        { "//cdn.vendor.com/f.mp4", "https://cdn.vendor.com/f.mp4" },
        { "https://files.vendor.com:8443/a/./b/../c",
          "https://files.vendor.com:8443/a/./b/../c" },
        { " /spaced\t", "https://api.vendor.com/spaced" },
    };
    llmgw_desc_policy_t  p = policy();
    llmgw_outbound_t     cur, next;

    (void) state;

    ok("{'url':'https://api.vendor.com/v1/tasks/7?x=1'}", &cur);

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        redirect_ok(&cur, 302, cases[i].loc, &p, &next);
        if (next.url.len != strlen(cases[i].url)
            || memcmp(next.url.data, cases[i].url, next.url.len) != 0)
        {
            fail_msg("%s -> %.*s, want %s", cases[i].loc, (int) next.url.len,
                     next.url.data, cases[i].url);
        }
        llmgw_outbound_free(&next);
    }

    llmgw_outbound_free(&cur);
}

static void
test_redirect_off_the_allowed_hosts_is_refused(void **state)
{
    llmgw_desc_policy_t  p = policy();
    llmgw_outbound_t     cur, next;

    (void) state;

    ok("{'url':'https://api.vendor.com/v1/x'}", &cur);

    assert_int_equal(redirect(&cur, 302, "https://evil.com/x", &p, &next), -1);
    assert_string_equal(err, "descriptor: redirect host evil.com is neither "
                             "the channel host nor in allowedHosts");
    assert_int_equal(redirect(&cur, 301, "//evil.com/x", &p, &next), -1);
    assert_int_equal(redirect(&cur, 307, "http://api.vendor.com/v1/x", &p,
                              &next), -1);
    assert_int_equal(redirect(&cur, 302, "ftp://api.vendor.com/", &p, &next),
                     -1);
    assert_non_null(strstr(err, "redirect location must be an absolute "
                                "http(s) URL"));
    assert_int_equal(redirect(&cur, 302, "https://u:p@cdn.vendor.com/", &p,
                              &next), -1);
    assert_non_null(strstr(err, "must not contain credentials"));
    assert_int_equal(redirect(&cur, 302, "", &p, &next), -1);
    assert_non_null(strstr(err, "redirect without a Location"));
    assert_int_equal(redirect(&cur, 200, "/x", &p, &next), -1);
    assert_non_null(strstr(err, "status 200 is not a redirect"));

    llmgw_outbound_free(&cur);
}

static void
test_redirect_303_and_post_301_302_become_get_without_body(void **state)
{
    static const int statuses[] = { 301, 302, 303 };
    llmgw_desc_policy_t  p = policy();
    llmgw_outbound_t     cur, next;

    (void) state;

    ok("{'url':'https://api.vendor.com/v1/x','headers':{'X-Keep':'1'},"
       "'body':{'a':1}}", &cur);

    for (size_t i = 0; i < 3; i++) {
        redirect_ok(&cur, statuses[i], "/v1/y", &p, &next);
        assert_string_equal(next.method, "GET");
        assert_null(next.body.data);
        assert_buf(next.headers, "X-Keep: 1\r\n");
        llmgw_outbound_free(&next);
    }

    llmgw_outbound_free(&cur);
}

static void
test_redirect_307_308_keep_method_and_body(void **state)
{
    static const int statuses[] = { 307, 308 };
    llmgw_desc_policy_t  p = policy();
    llmgw_outbound_t     cur, next;

    (void) state;

    ok("{'url':'https://api.vendor.com/v1/x','method':'PUT','body':{'a':1}}",
       &cur);

    for (size_t i = 0; i < 2; i++) {
        redirect_ok(&cur, statuses[i], "/v1/y", &p, &next);
        assert_string_equal(next.method, "PUT");
        assert_buf(next.body, "{\"a\":1}");
        assert_buf(next.headers, "Content-Type: application/json\r\n");
        llmgw_outbound_free(&next);
    }

    llmgw_outbound_free(&cur);
}

static void
test_redirect_keeps_get_and_head(void **state)
{
    llmgw_desc_policy_t  p = policy();
    llmgw_outbound_t     cur, next;

    (void) state;

    ok("{'url':'https://api.vendor.com/v1/x','method':'HEAD'}", &cur);
    redirect_ok(&cur, 303, "/y", &p, &next);
    assert_string_equal(next.method, "HEAD");
    llmgw_outbound_free(&next);
    redirect_ok(&cur, 301, "/y", &p, &next);
    assert_string_equal(next.method, "HEAD");
    llmgw_outbound_free(&next);
    llmgw_outbound_free(&cur);
}

static void
test_redirect_to_another_origin_drops_credentials(void **state)
{
    llmgw_desc_policy_t  p = policy();
    llmgw_outbound_t     cur, next;

    (void) state;

    ok("{'url':'https://api.vendor.com/v1/x','headers':{'Authorization':"
       "'Bearer " CRED "','X-Api-Key':'" CRED "','Cookie':'s=1',"
       "'Range':'bytes=0-9'}}", &cur);

    redirect_ok(&cur, 302, "/v1/elsewhere", &p, &next);
    assert_buf(next.headers, "Authorization: Bearer " CRED "\r\n"
                             "X-Api-Key: " CRED "\r\nCookie: s=1\r\n"
                             "Range: bytes=0-9\r\n");
    llmgw_outbound_free(&next);

    redirect_ok(&cur, 302, "https://cdn.vendor.com/signed?sig=1", &p, &next);
    assert_buf(next.headers, "Range: bytes=0-9\r\n");
    assert_string_equal(next.host, "cdn.vendor.com");
    llmgw_outbound_free(&next);

    llmgw_outbound_free(&cur);
}

static void
test_credentialless_redirect_may_go_anywhere_http(void **state)
{
    llmgw_desc_policy_t  p = policy();
    llmgw_outbound_t     cur, next;

    (void) state;

    p.allow_credentialless = 1;
    ok_p("{'url':'https://cdn.example.net/v.mp4','credentialless':true}", &p,
         &cur);

    redirect_ok(&cur, 302, "http://edge7.other-cdn.example/v.mp4?t=1", &p,
                &next);
    assert_int_equal(next.credentialless, 1);
    assert_int_equal(next.public_only, 1);
    assert_int_equal(next.tls, 0);
    assert_string_equal(next.host, "edge7.other-cdn.example");
    llmgw_outbound_free(&next);

    /* every hop is checked again: to the channel's origin, or away */
    redirect_ok(&cur, 302, "https://api.vendor.com/files/v.mp4", &p, &next);
    assert_int_equal(next.public_only, 0);
    redirect_ok(&next, 302, "http://127.0.0.1/v.mp4", &p, &cur);
    llmgw_outbound_free(&next);
    assert_int_equal(cur.public_only, 1);
    assert_string_equal(cur.host, "127.0.0.1");

    assert_int_equal(redirect(&cur, 302, "file:///etc/passwd", &p, &next), -1);
    assert_int_equal(redirect(&cur, 302, "https://x.example/?k=" CRED, &p,
                              &next), -1);
    assert_non_null(strstr(err, "redirect location contains the channel "
                                "credential"));
    llmgw_outbound_free(&cur);
}


/* ---- response headers for parse hooks ---- */

static void
test_headers_json_lowercases_and_groups(void **state)
{
    const llmgw_str_t names[] = {
        LLMGW_STR("Content-Type"), LLMGW_STR("X-Id"), LLMGW_STR("x-id"),
        LLMGW_STR("Set-Cookie"),
    };
    const llmgw_str_t values[] = {
        LLMGW_STR("application/json"), LLMGW_STR("1"), LLMGW_STR("2\"q"),
        LLMGW_STR("a\xff"),
    };
    llmgw_buf_t b;

    (void) state;

    b = llmgw_headers_json(names, values, 4);
    assert_buf(b, "{\"content-type\":[\"application/json\"],"
                  "\"x-id\":[\"1\",\"2\\\"q\"],"
                  "\"set-cookie\":[\"a\xef\xbf\xbd\"]}");
    llmgw_buf_free(&b);

    b = llmgw_headers_json(NULL, NULL, 0);
    assert_buf(b, "{}");
    llmgw_buf_free(&b);
}


int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_get_to_channel_host_is_built_without_body),
        cmocka_unit_test(test_url_without_path_gets_slash),
        cmocka_unit_test(test_url_must_be_absolute_http),
        cmocka_unit_test(test_url_with_credentials_is_refused),
        cmocka_unit_test(
            test_url_with_whitespace_control_or_backslash_is_refused),
        cmocka_unit_test(test_url_host_must_be_ascii),
        cmocka_unit_test(test_url_ipv4_only_as_four_decimal_numbers),
        cmocka_unit_test(test_url_non_ascii_path_is_percent_encoded),
        cmocka_unit_test(test_foreign_host_is_refused),
        cmocka_unit_test(test_channel_host_needs_same_scheme_and_port),
        cmocka_unit_test(test_channel_host_with_port_in_base_url),
        cmocka_unit_test(test_host_compare_is_case_insensitive),
        cmocka_unit_test(
            test_no_channel_host_and_no_allowed_hosts_refuses_everything),
        cmocka_unit_test(
            test_allowed_host_without_port_matches_default_port_only),
        cmocka_unit_test(test_allowed_hosts_port_must_match),
        cmocka_unit_test(test_allowed_ipv6_literal),
        cmocka_unit_test(test_method_defaults_and_allowed_list),
        cmocka_unit_test(test_get_and_head_with_body_are_refused),
        cmocka_unit_test(test_headers_are_sent_in_order_with_repeated_values),
        cmocka_unit_test(test_header_names_must_be_tokens),
        cmocka_unit_test(test_header_values_without_cr_lf_nul),
        cmocka_unit_test(test_host_managed_headers_are_refused),
        cmocka_unit_test(test_json_body_is_compact_with_default_content_type),
        cmocka_unit_test(test_json_body_keeps_plugin_content_type),
        cmocka_unit_test(test_json_scalar_body_is_json_text),
        cmocka_unit_test(test_unknown_body_type_is_refused),
        cmocka_unit_test(test_form_body_is_urlencoded),
        cmocka_unit_test(test_text_and_raw_bodies_need_a_string),
        cmocka_unit_test(test_unknown_top_level_members_are_ignored),
        cmocka_unit_test(test_descriptor_must_be_a_json_object),
        cmocka_unit_test(test_response_type_sse_needs_declaration),
        cmocka_unit_test(test_credentialless_only_in_content_requests),
        cmocka_unit_test(test_credentialless_get_may_reach_any_host),
        cmocka_unit_test(
            test_credentialless_public_only_off_the_channel_origin),
        cmocka_unit_test(test_credentialless_allows_only_get_and_head),
        cmocka_unit_test(test_credentialless_refuses_plugin_headers),
        cmocka_unit_test(
            test_credentialless_url_must_not_carry_the_credential),
        cmocka_unit_test(test_messages_never_repeat_the_credential),
        cmocka_unit_test(test_placeholder_becomes_base64),
        cmocka_unit_test(test_placeholder_becomes_data_url),
        cmocka_unit_test(test_placeholder_members_are_checked),
        cmocka_unit_test(test_placeholder_with_unknown_ref_is_refused),
        cmocka_unit_test(test_placeholder_max_bytes_is_enforced),
        cmocka_unit_test(
            test_per_file_limit_applies_to_placeholders_and_parts),
        cmocka_unit_test(test_total_limit_counts_every_inlined_byte),
        cmocka_unit_test(test_multipart_body_with_fields_and_repeated_files),
        cmocka_unit_test(test_multipart_file_defaults_and_escaping),
        cmocka_unit_test(test_multipart_overrides_plugin_content_type),
        cmocka_unit_test(test_multipart_boundary_is_random),
        cmocka_unit_test(test_multipart_part_rules),
        cmocka_unit_test(test_redirect_resolves_relative_locations),
        cmocka_unit_test(test_redirect_off_the_allowed_hosts_is_refused),
        cmocka_unit_test(
            test_redirect_303_and_post_301_302_become_get_without_body),
        cmocka_unit_test(test_redirect_307_308_keep_method_and_body),
        cmocka_unit_test(test_redirect_keeps_get_and_head),
        cmocka_unit_test(test_redirect_to_another_origin_drops_credentials),
        cmocka_unit_test(test_credentialless_redirect_may_go_anywhere_http),
        cmocka_unit_test(test_headers_json_lowercases_and_groups),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
