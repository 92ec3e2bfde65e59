/*
 * Plugin manifest validation (Task Plugin API v1): every rule of the
 * contract, one test each, asserting the exact message; marketplace
 * aliases; normalisation.
 *
 * Manifests and export lists are written with single quotes for
 * readability; q() turns them into JSON.
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


/* A valid per_task plugin with three models. */
static const char *BASE =
    "{'apiVersion':1,'key':'acme','name':'Acme','version':'1.0.0',"
    "'author':{'name':'Acme Labs'},'models':['m1','m2','m3'],"
    "'fetchMode':'per_task'}";

static const char *BASE_EXPORTS =
    "'buildSubmitRequest','parseSubmitResponse','parseTaskResult',"
    "'buildQueryRequest'";


typedef struct {
    int      rc;
    json_t  *norm;      /* the normalised manifest (rc 0) */
    json_t  *errs;      /* the messages (rc -1) */
} result_t;


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


static json_t *
load(const char *quoted)
{
    json_error_t  e;
    char         *s = q(quoted);
    json_t       *j = json_loads(s, JSON_DECODE_ANY | JSON_ALLOW_NUL, &e);

    if (j == NULL) {
        fail_msg("bad test JSON: %s: %s", e.text, s);
    }

    free(s);
    return j;
}


static result_t
run_raw(const char *meta, size_t meta_len, const char *exports)
{
    result_t     r = { 0, NULL, NULL };
    llmgw_buf_t  norm, errs;

    r.rc = llmgw_manifest_validate(meta, meta_len, exports, strlen(exports),
                                   &norm, &errs);

    if (r.rc == 0) {
        assert_non_null(norm.data);
        assert_null(errs.data);
        r.norm = json_loadb(norm.data, norm.len, 0, NULL);
        assert_non_null(r.norm);
    } else {
        assert_int_equal(r.rc, -1);
        assert_null(norm.data);
        assert_non_null(errs.data);
        r.errs = json_loadb(errs.data, errs.len, 0, NULL);
        assert_true(json_is_array(r.errs));
        assert_true(json_array_size(r.errs) > 0);
    }

    llmgw_buf_free(&norm);
    llmgw_buf_free(&errs);
    return r;
}


/*
 * BASE with the top-level members of patch set (null removes one);
 * extra: more exports after BASE_EXPORTS, or the whole exports value when
 * it starts with '[' or '{'.
 */
static result_t
run(const char *patch, const char *extra)
{
    json_t      *m = load(BASE), *v;
    const char  *k;
    char         exports[4096];
    char        *meta, *ex;
    result_t     r;

    if (patch != NULL) {
        json_t *p = load(patch);

        json_object_foreach(p, k, v) {
            if (json_is_null(v)) {
                json_object_del(m, k);
            } else {
                json_object_set(m, k, v);
            }
        }

        json_decref(p);
    }

    if (extra != NULL && (extra[0] == '[' || extra[0] == '{')) {
        snprintf(exports, sizeof(exports), "%s", extra);
    } else {
        snprintf(exports, sizeof(exports), "[%s%s%s]", BASE_EXPORTS,
                 extra != NULL ? "," : "", extra != NULL ? extra : "");
    }

    meta = json_dumps(m, JSON_COMPACT);
    ex = q(exports);
    r = run_raw(meta, strlen(meta), ex);
    free(meta);
    free(ex);
    json_decref(m);
    return r;
}


static void
result_free(result_t *r)
{
    json_decref(r->norm);
    json_decref(r->errs);
}


static void
print_errors(const result_t *r)
{
    size_t   i;
    json_t  *e;

    json_array_foreach(r->errs, i, e) {
        print_message("  error: %s\n", json_string_value(e));
    }
}


/* Rejected, with msg among the messages. */
static void
expect_error(result_t r, const char *msg)
{
    size_t   i;
    json_t  *e;

    if (r.rc == 0) {
        char *s = json_dumps(r.norm, JSON_COMPACT);
        print_message("  accepted: %s\n", s);
        free(s);
        result_free(&r);
        fail_msg("accepted; expected \"%s\"", msg);
    }

    json_array_foreach(r.errs, i, e) {
        if (strcmp(json_string_value(e), msg) == 0) {
            result_free(&r);
            return;
        }
    }

    print_errors(&r);
    result_free(&r);
    fail_msg("no message \"%s\"", msg);
}


/* Accepted; the normalised manifest (caller frees). */
static json_t *
expect_ok(result_t r)
{
    if (r.rc != 0) {
        print_errors(&r);
        result_free(&r);
        fail_msg("rejected");
    }

    return r.norm;
}


#define REJECT(patch, extra, msg)  expect_error(run(patch, extra), msg)
#define ACCEPT(patch, extra)       json_decref(expect_ok(run(patch, extra)))


/* The normalised value at a top-level member equals the quoted JSON. */
static void
assert_member(json_t *norm, const char *key, const char *quoted)
{
    json_t *want = load(quoted);
    json_t *got = json_object_get(norm, key);

    if (!json_equal(want, got)) {
        char *w = json_dumps(want, JSON_COMPACT | JSON_ENCODE_ANY);
        char *g = got ? json_dumps(got, JSON_COMPACT | JSON_ENCODE_ANY)
                      : strdup("(absent)");
        print_message("  %s: want %s\n  %s:  got %s\n", key, w, key, g);
        free(w);
        free(g);
        fail_msg("normalised %s differs", key);
    }

    json_decref(want);
}


static char *
repeat(const char *unit, size_t n)
{
    size_t  len = strlen(unit);
    char   *out = malloc(len * n + 1);

    assert_non_null(out);

    for (size_t i = 0; i < n; i++) {
        memcpy(out + i * len, unit, len);
    }

    out[len * n] = '\0';
    return out;
}


/* {'<field>': '<value>'} for a string value built at run time. */
static result_t
run_string(const char *field, const char *value, const char *extra)
{
    json_t   *p = json_object();
    char     *s, *patch;
    result_t  r;

    json_object_set_new(p, field, json_string(value));
    s = json_dumps(p, JSON_COMPACT);
    patch = s;      /* run() accepts double quotes too */
    r = run(patch, extra);
    free(s);
    json_decref(p);
    return r;
}


/* ---- whole manifest ---- */

static void
test_minimal_manifest_accepted(void **state)
{
    (void) state;
    json_t *n = expect_ok(run(NULL, NULL));

    assert_member(n, "apiVersion", "1");
    assert_member(n, "key", "'acme'");
    assert_member(n, "models", "['m1','m2','m3']");
    json_decref(n);
}

static void
test_defaults_filled_in(void **state)
{
    (void) state;
    json_t *n = expect_ok(run(NULL, NULL));

    assert_member(n, "sortPriority", "0");
    assert_member(n, "submitResponseTypes", "['json']");
    assert_member(n, "upstreams", "['vendor']");
    json_decref(n);
}

static void
test_meta_not_json_rejected(void **state)
{
    (void) state;
    expect_error(run_raw("{\"key\":", 7, "[]"), "meta: not valid JSON");
}

static void
test_meta_not_object_rejected(void **state)
{
    (void) state;
    expect_error(run_raw("[1]", 3, "[]"), "meta: must be an object");
}

static void
test_all_errors_collected(void **state)
{
    (void) state;
    result_t r = run("{'key':'a b','version':'one','fetchMode':'poll',"
                     "'icon':'https://x.example/i.png'}", "[]");

    assert_int_equal(r.rc, -1);
    print_errors(&r);
    /* key, version, fetchMode, icon, three missing exports */
    assert_int_equal(json_array_size(r.errs), 7);
    result_free(&r);
}

static void
test_unknown_top_level_field_rejected(void **state)
{
    (void) state;
    REJECT("{'color':'red'}", NULL,
           "meta.color: unknown field (older hosts reject unrecognized "
           "fields; known fields: apiVersion, key, name, version, author, "
           "description, icon, website, sortPriority, models, fetchMode, "
           "baseUrl, allowedHosts, upstreams, auth, channelTypes, routes, "
           "protocols, usageSchema, usageExamples, usageProfiles, "
           "requiredCapabilities, submitResponseTypes)");
}


/* ---- legacy fields ---- */

static void
test_legacy_endpoints_rejected(void **state)
{
    (void) state;
    REJECT("{'endpoints':[]}", NULL, "meta.endpoints: legacy field, no "
           "longer supported (declare host protocols in meta.protocols)");
}

static void
test_legacy_resolve_request_rejected(void **state)
{
    (void) state;
    REJECT("{'resolveRequest':'x'}", NULL, "meta.resolveRequest: legacy "
           "field, no longer supported (routes name a decode function "
           "exported in native)");
    REJECT(NULL, "'resolveRequest'", "exports.resolveRequest: legacy "
           "export, no longer supported (routes name a decode function "
           "exported in native)");
}

static void
test_legacy_render_error_rejected(void **state)
{
    (void) state;
    REJECT("{'renderError':'x'}", NULL, "meta.renderError: legacy field, "
           "no longer supported (export native.error)");
    REJECT(NULL, "'renderError'", "exports.renderError: legacy export, no "
           "longer supported (export native.error)");
}

static void
test_legacy_renderers_rejected(void **state)
{
    (void) state;
    REJECT("{'renderers':{}}", NULL, "meta.renderers: legacy field, no "
           "longer supported (routes and protocols name their render "
           "functions)");
    REJECT(NULL, "'renderers.video'", "exports.renderers.video: legacy "
           "export, no longer supported (routes and protocols name their "
           "render functions)");
}

static void
test_legacy_route_renderer_rejected(void **state)
{
    (void) state;
    REJECT("{'routes':[{'method':'GET','path':'/a/:task_id','type':'query',"
           "'render':'r','renderer':'r'}]}", "'native.r'",
           "meta.routes[0].renderer: legacy field, no longer supported "
           "(use render)");
}


/* ---- apiVersion, key, name, version, author ---- */

static void
test_api_version_required(void **state)
{
    (void) state;
    REJECT("{'apiVersion':null}", NULL, "meta.apiVersion: required");
}

static void
test_api_version_must_be_1(void **state)
{
    (void) state;
    REJECT("{'apiVersion':2}", NULL, "meta.apiVersion: must be 1");
    REJECT("{'apiVersion':'1'}", NULL, "meta.apiVersion: must be 1");
}

static void
test_key_required(void **state)
{
    (void) state;
    REJECT("{'key':null}", NULL, "meta.key: required");
    REJECT("{'key':''}", NULL, "meta.key: must not be empty");
    REJECT("{'key':7}", NULL, "meta.key: must be a string");
}

static void
test_key_over_30_chars_rejected(void **state)
{
    (void) state;
    REJECT("{'key':'abcdefghij-abcdefghij-abcdefghij'}", NULL,
           "meta.key: at most 30 characters");
}

static void
test_key_of_30_chars_accepted(void **state)
{
    (void) state;
    ACCEPT("{'key':'abcdefghij_abcdefghij-abcdefg'}", NULL);
}

static void
test_key_must_be_safe_identifier(void **state)
{
    (void) state;
    const char *msg = "meta.key: must be a safe identifier (letters, "
                      "digits, '-' and '_' only)";

    REJECT("{'key':'acme/video'}", NULL, msg);
    REJECT("{'key':'acme video'}", NULL, msg);
    REJECT("{'key':'..'}", NULL, msg);
}

static void
test_name_required(void **state)
{
    (void) state;
    REJECT("{'name':null}", NULL, "meta.name: required");
    REJECT("{'name':'  '}", NULL, "meta.name: must be a non-empty string");
}

static void
test_version_must_be_semver(void **state)
{
    (void) state;
    const char *msg = "meta.version: must be a semantic version "
                      "(MAJOR.MINOR.PATCH, e.g. 1.0.0)";

    REJECT("{'version':'1.0'}", NULL, msg);
    REJECT("{'version':'v1.0.0'}", NULL, msg);
    REJECT("{'version':'01.0.0'}", NULL, msg);
    REJECT("{'version':null}", NULL, "meta.version: required");
}

static void
test_version_prerelease_and_build_accepted(void **state)
{
    (void) state;
    ACCEPT("{'version':'2.10.0-rc.1+sha.5114f85'}", NULL);
}

static void
test_author_required(void **state)
{
    (void) state;
    REJECT("{'author':null}", NULL, "meta.author: required");
    REJECT("{'author':'Acme'}", NULL,
           "meta.author: must be an object {name, url?}");
}

static void
test_author_name_required(void **state)
{
    (void) state;
    REJECT("{'author':{'url':'https://acme.example'}}", NULL,
           "meta.author.name: required");
    REJECT("{'author':{'name':''}}", NULL,
           "meta.author.name: must be a non-empty string");
}

static void
test_author_url_must_be_http_url(void **state)
{
    (void) state;
    ACCEPT("{'author':{'name':'A','url':'http://acme.example/team'}}", NULL);
    REJECT("{'author':{'name':'A','url':'ftp://acme.example'}}", NULL,
           "meta.author.url: must be an absolute http(s) URL");
    REJECT("{'author':{'name':'A','url':'acme.example'}}", NULL,
           "meta.author.url: must be an absolute http(s) URL");
}

static void
test_author_unknown_field_rejected(void **state)
{
    (void) state;
    REJECT("{'author':{'name':'A','email':'a@acme.example'}}", NULL,
           "meta.author.email: unknown field");
}


/* ---- models, fetchMode ---- */

static void
test_models_required(void **state)
{
    (void) state;
    REJECT("{'models':null}", NULL, "meta.models: required");
    REJECT("{'models':[]}", NULL, "meta.models: must not be empty");
    REJECT("{'models':'m1'}", NULL, "meta.models: must be an array of strings");
}

static void
test_model_names_non_empty_strings(void **state)
{
    (void) state;
    REJECT("{'models':['m1','']}", NULL,
           "meta.models[1]: must be a non-empty string");
    REJECT("{'models':['m1',3]}", NULL,
           "meta.models[1]: must be a non-empty string");
}

static void
test_fetch_mode_per_task_or_batch(void **state)
{
    (void) state;
    REJECT("{'fetchMode':'poll'}", NULL,
           "meta.fetchMode: must be \"per_task\" or \"batch\"");
    REJECT("{'fetchMode':null}", NULL, "meta.fetchMode: required");
}


/* ---- LocalizedText ---- */

static void
test_localized_string_becomes_en_map(void **state)
{
    (void) state;
    json_t *n = expect_ok(run("{'description':'  Makes videos  '}", NULL));

    assert_member(n, "description", "{'en':'Makes videos'}");
    json_decref(n);
}

static void
test_locale_keys_get_canonical_casing(void **state)
{
    (void) state;
    json_t *n = expect_ok(run("{'description':{'EN':'a','zh-tw':'b',"
                              "'ZH-hant-hk':'c','es-419':'d'}}", NULL));

    assert_member(n, "description",
                  "{'en':'a','zh-TW':'b','zh-Hant-HK':'c','es-419':'d'}");
    json_decref(n);
}

static void
test_locale_key_pattern_enforced(void **state)
{
    (void) state;
    REJECT("{'description':{'en':'a','english':'b'}}", NULL,
           "meta.description.english: locale must match "
           "^[a-zA-Z]{2,3}(-[a-zA-Z0-9]{2,8})*$");
    REJECT("{'description':{'en':'a','zh_TW':'b'}}", NULL,
           "meta.description.zh_TW: locale must match "
           "^[a-zA-Z]{2,3}(-[a-zA-Z0-9]{2,8})*$");
    REJECT("{'description':{'en':'a','en-x':'b'}}", NULL,
           "meta.description.en-x: locale must match "
           "^[a-zA-Z]{2,3}(-[a-zA-Z0-9]{2,8})*$");
}

static void
test_duplicate_locale_after_canonicalising_rejected(void **state)
{
    (void) state;
    REJECT("{'description':{'en':'a','zh-TW':'b','zh-tw':'c'}}", NULL,
           "meta.description.zh-tw: duplicate locale \"zh-TW\" after "
           "canonical casing");
}

static void
test_en_locale_required(void **state)
{
    (void) state;
    REJECT("{'description':{'zh':'b'}}", NULL,
           "meta.description: \"en\" is required");
}

static void
test_at_most_16_locales(void **state)
{
    (void) state;
    const char *l17 = "{'description':{'en':'a','de':'a','fr':'a','es':'a',"
        "'it':'a','pt':'a','nl':'a','sv':'a','da':'a','fi':'a','pl':'a',"
        "'cs':'a','ru':'a','uk':'a','ja':'a','ko':'a','zh':'a'}}";
    const char *l16 = "{'description':{'en':'a','de':'a','fr':'a','es':'a',"
        "'it':'a','pt':'a','nl':'a','sv':'a','da':'a','fi':'a','pl':'a',"
        "'cs':'a','ru':'a','uk':'a','ja':'a','ko':'a'}}";

    REJECT(l17, NULL, "meta.description: at most 16 locales");
    ACCEPT(l16, NULL);
}

static void
test_localized_value_non_empty(void **state)
{
    (void) state;
    REJECT("{'description':{'en':'a','de':'  '}}", NULL,
           "meta.description.de: must not be empty");
    REJECT("{'description':''}", NULL, "meta.description: must not be empty");
    REJECT("{'description':{'en':1}}", NULL,
           "meta.description.en: must be a string");
}

static void
test_localized_value_no_control_characters(void **state)
{
    (void) state;
    REJECT("{'description':{'en':'line\\u0000break'}}", NULL,
           "meta.description.en: must not contain control characters");
    REJECT("{'description':'a\\nb'}", NULL,
           "meta.description: must not contain control characters");
    /* surrounding white space (even new lines) is trimmed first */
    ACCEPT("{'description':'\\n ab \\t'}", NULL);
}

static void
test_localized_text_type(void **state)
{
    (void) state;
    REJECT("{'description':['en']}", NULL,
           "meta.description: must be a string or a map of locale to text");
}

static void
test_description_over_512_chars_rejected(void **state)
{
    (void) state;
    char *s = repeat("x", 513);
    char *cjk = repeat("\xe8\xa7\x86", 512);       /* 512 characters */

    expect_error(run_string("description", s, NULL),
                 "meta.description: at most 512 characters");
    json_decref(expect_ok(run_string("description", cjk, NULL)));
    free(s);
    free(cjk);
}


/* ---- icon ---- */

static void
test_icon_over_128_chars_rejected(void **state)
{
    (void) state;
    char *s = repeat("a", 129);

    expect_error(run_string("icon", s, NULL),
                 "meta.icon: at most 128 characters");
    free(s);
}

static void
test_icon_url_rejected(void **state)
{
    (void) state;
    const char *msg = "meta.icon: remote URLs and inline images are "
                      "rejected; use an icon library name, \"text\" or "
                      "\"text:<label>\"";

    REJECT("{'icon':'https://cdn.example/icon.png'}", NULL, msg);
    REJECT("{'icon':'//cdn.example/icon.png'}", NULL, msg);
}

static void
test_icon_data_uri_rejected(void **state)
{
    (void) state;
    REJECT("{'icon':'data:image/png;base64,iVBORw0KGgo='}", NULL,
           "meta.icon: remote URLs and inline images are rejected; use an "
           "icon library name, \"text\" or \"text:<label>\"");
}

static void
test_icon_library_name_and_text_accepted(void **state)
{
    (void) state;
    ACCEPT("{'icon':'lucide:video'}", NULL);
    ACCEPT("{'icon':'OpenAI.Color'}", NULL);
    ACCEPT("{'icon':'text'}", NULL);
    ACCEPT("{'icon':'text:AV'}", NULL);
}

static void
test_icon_text_needs_label(void **state)
{
    (void) state;
    REJECT("{'icon':'text:'}", NULL, "meta.icon: \"text:\" needs a label");
}

static void
test_icon_name_characters(void **state)
{
    (void) state;
    REJECT("{'icon':'my icon'}", NULL, "meta.icon: must be an icon library "
           "name (letters, digits, '.', '_', '-', ':'), \"text\" or "
           "\"text:<label>\"");
}


/* ---- website ---- */

static void
test_website_empty_accepted(void **state)
{
    (void) state;
    ACCEPT("{'website':''}", NULL);
}

static void
test_website_must_be_https(void **state)
{
    (void) state;
    const char *msg = "meta.website: must be empty or an absolute https URL";

    ACCEPT("{'website':'https://acme.example/docs?x=1#y'}", NULL);
    REJECT("{'website':'http://acme.example'}", NULL, msg);
    REJECT("{'website':'acme.example'}", NULL, msg);
    REJECT("{'website':'https:///path'}", NULL,
           "meta.website: host is not a valid host name or address");
}

static void
test_website_credentials_rejected(void **state)
{
    (void) state;
    REJECT("{'website':'https://user:pw@acme.example'}", NULL,
           "meta.website: must not contain credentials");
}

static void
test_website_whitespace_control_backslash_rejected(void **state)
{
    (void) state;
    const char *msg = "meta.website: must not contain whitespace, control "
                      "characters or backslashes";

    REJECT("{'website':'https://acme.example/a b'}", NULL, msg);
    REJECT("{'website':'https://acme.example\\\\@evil.example'}", NULL, msg);
    REJECT("{'website':'https://acme.example/\\u0007'}", NULL, msg);
}

static void
test_website_host_ascii(void **state)
{
    (void) state;
    REJECT("{'website':'https://b\xc3\xbc" "cher.example'}", NULL,
           "meta.website: host must be ASCII (use the punycode form)");
    ACCEPT("{'website':'https://xn--bcher-kva.example'}", NULL);
}


/* ---- sortPriority ---- */

static void
test_sort_priority_default_0(void **state)
{
    (void) state;
    json_t *n = expect_ok(run("{'sortPriority':7}", NULL));

    assert_member(n, "sortPriority", "7");
    json_decref(n);
}

static void
test_sort_priority_signed_32_bit(void **state)
{
    (void) state;
    const char *msg = "meta.sortPriority: must be a signed 32-bit integer";

    ACCEPT("{'sortPriority':2147483647}", NULL);
    ACCEPT("{'sortPriority':-2147483648}", NULL);
    REJECT("{'sortPriority':2147483648}", NULL, msg);
    REJECT("{'sortPriority':-2147483649}", NULL, msg);
    REJECT("{'sortPriority':1.5}", NULL, msg);
    REJECT("{'sortPriority':'1'}", NULL, msg);
}


/* ---- baseUrl ---- */

static void
test_base_url_normalised(void **state)
{
    (void) state;
    json_t *n = expect_ok(run("{'baseUrl':'HTTPS://API.Acme.Example/v1/'}",
                              NULL));

    assert_member(n, "baseUrl", "'https://api.acme.example/v1'");
    json_decref(n);
    n = expect_ok(run("{'baseUrl':'https://api.acme.example/'}", NULL));
    assert_member(n, "baseUrl", "'https://api.acme.example'");
    json_decref(n);
}

static void
test_base_url_self_hosted_http_accepted(void **state)
{
    (void) state;
    ACCEPT("{'baseUrl':'http://192.168.1.20:8080'}", NULL);
    ACCEPT("{'baseUrl':'http://[::1]:8080/api'}", NULL);
}

static void
test_base_url_over_191_chars_rejected(void **state)
{
    (void) state;
    char *path = repeat("a", 170);
    char  url[256];

    snprintf(url, sizeof(url), "https://api.acme.example/%s", path);
    assert_int_equal(strlen(url), 195);
    expect_error(run_string("baseUrl", url, NULL),
                 "meta.baseUrl: at most 191 characters");
    free(path);
}

static void
test_base_url_must_be_http(void **state)
{
    (void) state;
    REJECT("{'baseUrl':'ws://api.acme.example'}", NULL,
           "meta.baseUrl: must be an absolute http(s) URL");
    REJECT("{'baseUrl':'/v1'}", NULL,
           "meta.baseUrl: must be an absolute http(s) URL");
}

static void
test_base_url_credentials_rejected(void **state)
{
    (void) state;
    REJECT("{'baseUrl':'https://key@api.acme.example'}", NULL,
           "meta.baseUrl: must not contain credentials");
}

static void
test_base_url_query_rejected(void **state)
{
    (void) state;
    REJECT("{'baseUrl':'https://api.acme.example/v1?key=x'}", NULL,
           "meta.baseUrl: must not contain a query string");
}

static void
test_base_url_fragment_rejected(void **state)
{
    (void) state;
    REJECT("{'baseUrl':'https://api.acme.example/v1#x'}", NULL,
           "meta.baseUrl: must not contain a fragment");
}

static void
test_base_url_host_ascii(void **state)
{
    (void) state;
    REJECT("{'baseUrl':'https://\xe4\xbe\x8b\xe5\xad\x90.example'}", NULL,
           "meta.baseUrl: host must be ASCII (use the punycode form)");
}

static void
test_base_url_port_range(void **state)
{
    (void) state;
    REJECT("{'baseUrl':'https://api.acme.example:70000'}", NULL,
           "meta.baseUrl: port must be a number from 1 to 65535");
}


/* ---- allowedHosts ---- */

static void
test_allowed_hosts_lowercased(void **state)
{
    (void) state;
    json_t *n = expect_ok(run("{'allowedHosts':['CDN.Acme.Example',"
                              "'files.acme.example:8443','[2001:DB8::1]',"
                              "'[::1]:9000']}", NULL));

    assert_member(n, "allowedHosts", "['cdn.acme.example',"
                  "'files.acme.example:8443','[2001:db8::1]','[::1]:9000']");
    json_decref(n);
}

static void
test_allowed_hosts_duplicates_rejected(void **state)
{
    (void) state;
    REJECT("{'allowedHosts':['cdn.acme.example','CDN.acme.example']}", NULL,
           "meta.allowedHosts[1]: duplicate host \"cdn.acme.example\" "
           "(also meta.allowedHosts[0])");
    /* the port takes part: these are different entries */
    ACCEPT("{'allowedHosts':['cdn.acme.example','cdn.acme.example:443']}",
           NULL);
}

static void
test_allowed_host_no_scheme(void **state)
{
    (void) state;
    REJECT("{'allowedHosts':['https://cdn.acme.example']}", NULL,
           "meta.allowedHosts[0]: must not contain a scheme (use host or "
           "host:port)");
}

static void
test_allowed_host_no_path(void **state)
{
    (void) state;
    REJECT("{'allowedHosts':['cdn.acme.example/files']}", NULL,
           "meta.allowedHosts[0]: must not contain a path (use host or "
           "host:port)");
}

static void
test_allowed_host_no_credentials(void **state)
{
    (void) state;
    REJECT("{'allowedHosts':['user@cdn.acme.example']}", NULL,
           "meta.allowedHosts[0]: must not contain credentials");
}

static void
test_allowed_host_no_query(void **state)
{
    (void) state;
    REJECT("{'allowedHosts':['cdn.acme.example?x=1']}", NULL,
           "meta.allowedHosts[0]: must not contain a query or fragment");
}

static void
test_allowed_host_ipv6_in_brackets(void **state)
{
    (void) state;
    REJECT("{'allowedHosts':['2001:db8::1']}", NULL,
           "meta.allowedHosts[0]: IPv6 addresses must be written in "
           "brackets ([::1]:443)");
    REJECT("{'allowedHosts':['[2001:db8::zz]']}", NULL,
           "meta.allowedHosts[0]: IPv6 address is not valid");
}

static void
test_allowed_host_port_range(void **state)
{
    (void) state;
    REJECT("{'allowedHosts':['cdn.acme.example:0']}", NULL,
           "meta.allowedHosts[0]: port must be a number from 1 to 65535");
    REJECT("{'allowedHosts':['cdn.acme.example:']}", NULL,
           "meta.allowedHosts[0]: port must be a number from 1 to 65535");
}

static void
test_allowed_host_name_valid(void **state)
{
    (void) state;
    REJECT("{'allowedHosts':['*.acme.example']}", NULL,
           "meta.allowedHosts[0]: not a valid host name");
    REJECT("{'allowedHosts':['']}", NULL,
           "meta.allowedHosts[0]: must not be empty");
    REJECT("{'allowedHosts':['b\xc3\xbc" "cher.example']}", NULL,
           "meta.allowedHosts[0]: host must be ASCII (use the punycode form)");
}


/* ---- upstreams ---- */

static void
test_upstreams_vendor_and_peer_gateway(void **state)
{
    (void) state;
    json_t *n = expect_ok(run("{'upstreams':['peer_gateway']}", NULL));

    /* vendor is always supported */
    assert_member(n, "upstreams", "['vendor','peer_gateway']");
    json_decref(n);
}

static void
test_upstreams_unknown_rejected(void **state)
{
    (void) state;
    REJECT("{'upstreams':['vendor','proxy']}", NULL,
           "meta.upstreams[1]: must be \"vendor\" or \"peer_gateway\" "
           "(marketplace alias \"new_api\")");
}

static void
test_upstreams_unique(void **state)
{
    (void) state;
    REJECT("{'upstreams':['vendor','vendor']}", NULL,
           "meta.upstreams[1]: duplicate value \"vendor\"");
    REJECT("{'upstreams':['peer_gateway','new_api']}", NULL,
           "meta.upstreams[1]: duplicate value \"peer_gateway\"");
}

static void
test_marketplace_alias_new_api_accepted(void **state)
{
    (void) state;
    json_t *n = expect_ok(run("{'upstreams':['vendor','new_api']}", NULL));

    assert_member(n, "upstreams", "['vendor','peer_gateway']");
    json_decref(n);
}


/* ---- auth ---- */

static void
test_auth_strings_accepted(void **state)
{
    (void) state;
    json_t *n = expect_ok(run("{'auth':'vendor_oauth'}", NULL));

    assert_member(n, "auth", "'vendor_oauth'");
    json_decref(n);
    ACCEPT("{'auth':'none'}", NULL);
    ACCEPT("{'auth':'api_key'}", NULL);
}

static void
test_auth_unknown_string_rejected(void **state)
{
    (void) state;
    REJECT("{'auth':'basic'}", NULL, "meta.auth: must be \"none\", "
           "\"api_key\", \"vendor_oauth\" (marketplace: \"vertex_oauth\") "
           "or an object with a type");
}

static void
test_marketplace_alias_vertex_oauth_accepted(void **state)
{
    (void) state;
    json_t *n = expect_ok(run("{'auth':'vertex_oauth'}", NULL));

    assert_member(n, "auth", "{'type':'oauth2_jwt'}");
    json_decref(n);
}

static void
test_marketplace_auth_oauth2_jwt_object_accepted(void **state)
{
    (void) state;
    json_t *n = expect_ok(run("{'auth':{'type':'oauth2_jwt','scope':"
                              "'cloud-platform'}}", NULL));

    assert_member(n, "auth", "{'type':'oauth2_jwt','scope':'cloud-platform'}");
    json_decref(n);
}

static void
test_auth_object_needs_string_type(void **state)
{
    (void) state;
    REJECT("{'auth':{'kind':'api_key'}}", NULL,
           "meta.auth.type: must be a non-empty string");
    REJECT("{'auth':true}", NULL,
           "meta.auth: must be a string or an object with a type");
}


/* ---- channelTypes ---- */

static void
test_channel_types_not_60_or_61(void **state)
{
    (void) state;
    const char *msg = "must not be 60 or 61 (those channel types bind "
                      "plugins by key)";
    char m[128];

    ACCEPT("{'channelTypes':[45,52]}", NULL);
    snprintf(m, sizeof(m), "meta.channelTypes[1]: %s", msg);
    REJECT("{'channelTypes':[45,60]}", NULL, m);
    snprintf(m, sizeof(m), "meta.channelTypes[0]: %s", msg);
    REJECT("{'channelTypes':[61]}", NULL, m);
}

static void
test_channel_types_numbers(void **state)
{
    (void) state;
    REJECT("{'channelTypes':['45']}", NULL,
           "meta.channelTypes[0]: must be a positive integer");
    REJECT("{'channelTypes':45}", NULL,
           "meta.channelTypes: must be an array of channel type numbers");
}


/* ---- routes ---- */

#define QROUTE  "{'method':'GET','path':'/acme/tasks/:task_id','type':'query'," \
                "'render':'status'}"
#define SROUTE  "{'method':'POST','path':'/acme/tasks','type':'submit'," \
                "'decode':'create','render':'created'}"
#define ROUTE_EXPORTS  "'native.status','native.create','native.created'"

static void
test_routes_accepted_with_defaults(void **state)
{
    (void) state;
    json_t *n = expect_ok(run("{'routes':[" SROUTE "," QROUTE "]}",
                              ROUTE_EXPORTS));

    assert_member(n, "routes", "[{'method':'POST','path':'/acme/tasks',"
                  "'type':'submit','decode':'create','render':'created',"
                  "'retainResult':true},{'method':'GET','path':"
                  "'/acme/tasks/:task_id','type':'query','render':'status',"
                  "'taskIdParam':'task_id'}]");
    json_decref(n);
}

static void
test_route_method_required(void **state)
{
    (void) state;
    REJECT("{'routes':[{'path':'/a','type':'submit','decode':'create',"
           "'render':'created'}]}", ROUTE_EXPORTS,
           "meta.routes[0].method: required");
    REJECT("{'routes':[{'method':'get','path':'/a','type':'submit',"
           "'decode':'create','render':'created'}]}", ROUTE_EXPORTS,
           "meta.routes[0].method: must be one of GET, POST, PUT, PATCH, "
           "DELETE");
}

static void
test_route_path_starts_with_slash(void **state)
{
    (void) state;
    REJECT("{'routes':[{'method':'POST','path':'acme/tasks','type':'submit',"
           "'decode':'create','render':'created'}]}", ROUTE_EXPORTS,
           "meta.routes[0].path: must start with /");
    REJECT("{'routes':[{'method':'POST','type':'submit',"
           "'decode':'create','render':'created'}]}", ROUTE_EXPORTS,
           "meta.routes[0].path: required");
}

static void
test_route_path_plain(void **state)
{
    (void) state;
    REJECT("{'routes':[{'method':'POST','path':'/acme/tasks?x=1','type':"
           "'submit','decode':'create','render':'created'}]}", ROUTE_EXPORTS,
           "meta.routes[0].path: must be a plain path (letters, digits and "
           "-._~!$&'()*+,;=:@; no query, fragment or whitespace)");
    REJECT("{'routes':[{'method':'POST','path':'/acme//tasks','type':"
           "'submit','decode':'create','render':'created'}]}", ROUTE_EXPORTS,
           "meta.routes[0].path: must not contain empty segments (//)");
    /* nginx decodes and resolves a request path before it is matched */
    REJECT("{'routes':[{'method':'POST','path':'/acme/t%61sks','type':"
           "'submit','decode':'create','render':'created'}]}", ROUTE_EXPORTS,
           "meta.routes[0].path: must not contain '%' (a request path is "
           "percent-decoded before it is matched; write the character "
           "itself)");
    for (const char *const *p = (const char *const[]) {
             "/x/../acme/tasks", "/acme/./tasks", "/acme/..", "/.", NULL };
         *p != NULL; p++)
    {
        char  m[256];

        snprintf(m, sizeof(m), "{'routes':[{'method':'POST','path':'%s',"
                 "'type':'submit','decode':'create','render':'created'}]}",
                 *p);
        REJECT(m, ROUTE_EXPORTS, "meta.routes[0].path: must not contain "
               "\".\" or \"..\" segments (a request path is resolved "
               "before it is matched; the route could never be reached)");
    }
    ACCEPT("{'routes':[{'method':'POST','path':'/acme/v1.5/t..x/.well',"
           "'type':'submit','decode':'create','render':'created'}]}",
           ROUTE_EXPORTS);
    REJECT("{'routes':[{'method':'GET','path':'/acme/:1id','type':"
           "'query','render':'status'}]}", ROUTE_EXPORTS,
           "meta.routes[0].path: path parameter \":1id\" must be ':' and an "
           "identifier");
}

static void
test_route_type_submit_dynamic_query(void **state)
{
    (void) state;
    REJECT("{'routes':[{'method':'POST','path':'/a','type':'create',"
           "'decode':'create','render':'created'}]}", ROUTE_EXPORTS,
           "meta.routes[0].type: must be \"submit\", \"dynamic\" or "
           "\"query\"");
    REJECT("{'routes':[{'method':'POST','path':'/a','decode':'create',"
           "'render':'created'}]}", ROUTE_EXPORTS,
           "meta.routes[0].type: required");
}

static void
test_route_decode_required_for_submit(void **state)
{
    (void) state;
    REJECT("{'routes':[{'method':'POST','path':'/a','type':'submit',"
           "'render':'created'}]}", ROUTE_EXPORTS,
           "meta.routes[0].decode: required for submit and dynamic routes");
}

static void
test_route_decode_required_for_dynamic(void **state)
{
    (void) state;
    REJECT("{'routes':[{'method':'POST','path':'/a','type':'dynamic',"
           "'render':'created'}]}", ROUTE_EXPORTS,
           "meta.routes[0].decode: required for submit and dynamic routes");
}

static void
test_route_decode_forbidden_for_query(void **state)
{
    (void) state;
    REJECT("{'routes':[{'method':'GET','path':'/a/:task_id','type':'query',"
           "'decode':'create','render':'status'}]}", ROUTE_EXPORTS,
           "meta.routes[0].decode: not allowed on query routes");
}

static void
test_route_render_required(void **state)
{
    (void) state;
    REJECT("{'routes':[{'method':'GET','path':'/a/:task_id','type':'query'}]}",
           ROUTE_EXPORTS, "meta.routes[0].render: required");
    REJECT("{'routes':[{'method':'GET','path':'/a/:task_id','type':'query',"
           "'render':'native.status'}]}", ROUTE_EXPORTS,
           "meta.routes[0].render: must be the name of a function in native");
}

static void
test_route_decode_needs_native_export(void **state)
{
    (void) state;
    REJECT("{'routes':[" SROUTE "]}", "'native.created'",
           "meta.routes[0].decode: needs export native.create");
}

static void
test_route_render_needs_native_export(void **state)
{
    (void) state;
    REJECT("{'routes':[" QROUTE "]}", "'native.create'",
           "meta.routes[0].render: needs export native.status");
}

static void
test_route_models_only_submit_dynamic(void **state)
{
    (void) state;
    ACCEPT("{'routes':[{'method':'POST','path':'/a','type':'dynamic',"
           "'decode':'create','render':'created','models':['m1']}]}",
           ROUTE_EXPORTS);
    REJECT("{'routes':[{'method':'GET','path':'/a/:task_id','type':'query',"
           "'render':'status','models':['m1']}]}", ROUTE_EXPORTS,
           "meta.routes[0].models: not allowed on query routes");
}

static void
test_route_models_in_meta_models(void **state)
{
    (void) state;
    REJECT("{'routes':[{'method':'POST','path':'/a','type':'submit',"
           "'decode':'create','render':'created','models':['m1','M2']}]}",
           ROUTE_EXPORTS, "meta.routes[0].models[1]: \"M2\" is not in "
           "meta.models (spell it as in meta.models)");
}

static void
test_route_task_id_param_only_query(void **state)
{
    (void) state;
    REJECT("{'routes':[{'method':'POST','path':'/a/:id','type':'submit',"
           "'decode':'create','render':'created','taskIdParam':'id'}]}",
           ROUTE_EXPORTS, "meta.routes[0].taskIdParam: only allowed on "
           "query routes");
}

static void
test_query_route_path_needs_task_id(void **state)
{
    (void) state;
    REJECT("{'routes':[{'method':'GET','path':'/a/:id','type':'query',"
           "'render':'status'}]}", ROUTE_EXPORTS,
           "meta.routes[0].path: query routes need the path parameter "
           ":task_id");
}

static void
test_query_route_custom_task_id_param(void **state)
{
    (void) state;
    ACCEPT("{'routes':[{'method':'GET','path':'/kie/jobs/:taskId/info','type':"
           "'query','taskIdParam':'taskId','render':'status'}]}",
           ROUTE_EXPORTS);
    REJECT("{'routes':[{'method':'GET','path':'/a/:task_id','type':'query',"
           "'taskIdParam':'taskId','render':'status'}]}", ROUTE_EXPORTS,
           "meta.routes[0].path: query routes need the path parameter "
           ":taskId");
    REJECT("{'routes':[{'method':'GET','path':'/a/:task_id','type':'query',"
           "'taskIdParam':'task id','render':'status'}]}", ROUTE_EXPORTS,
           "meta.routes[0].taskIdParam: must be an identifier (letters, "
           "digits, '_')");
}

static void
test_route_retain_result_only_submit_dynamic(void **state)
{
    (void) state;
    ACCEPT("{'routes':[{'method':'POST','path':'/a','type':'submit',"
           "'decode':'create','render':'created','retainResult':false}]}",
           ROUTE_EXPORTS);
    REJECT("{'routes':[{'method':'GET','path':'/a/:task_id','type':'query',"
           "'render':'status','retainResult':true}]}", ROUTE_EXPORTS,
           "meta.routes[0].retainResult: not allowed on query routes");
}

static void
test_route_retain_result_boolean(void **state)
{
    (void) state;
    REJECT("{'routes':[{'method':'POST','path':'/a','type':'submit',"
           "'decode':'create','render':'created','retainResult':'no'}]}",
           ROUTE_EXPORTS, "meta.routes[0].retainResult: must be a boolean");
}

static void
test_marketplace_route_action_accepted(void **state)
{
    (void) state;
    json_t *n = expect_ok(run("{'routes':[{'method':'POST','path':'/vidu/t2v',"
                              "'type':'submit','action':'text_to_video',"
                              "'decode':'create','render':'created'}]}",
                              ROUTE_EXPORTS));
    json_t *r = json_array_get(json_object_get(n, "routes"), 0);

    assert_string_equal(json_string_value(json_object_get(r, "action")),
                        "text_to_video");
    json_decref(n);
    REJECT("{'routes':[{'method':'POST','path':'/a','type':'submit',"
           "'action':'','decode':'create','render':'created'}]}",
           ROUTE_EXPORTS, "meta.routes[0].action: must be a non-empty string");
}

static void
test_route_unknown_field_rejected(void **state)
{
    (void) state;
    REJECT("{'routes':[{'method':'POST','path':'/a','type':'submit',"
           "'decode':'create','render':'created','auth':'none'}]}",
           ROUTE_EXPORTS, "meta.routes[0].auth: unknown field");
}

static void
test_route_host_protocol_paths_rejected(void **state)
{
    (void) state;
    REJECT("{'routes':[{'method':'POST','path':'/v1/videos','type':'submit',"
           "'decode':'create','render':'created'}]}", ROUTE_EXPORTS,
           "meta.routes[0].path: /v1/videos is a host protocol path; "
           "declare host_video in meta.protocols instead");
    REJECT("{'routes':[{'method':'GET','path':'/v1/responses/:task_id',"
           "'type':'query','render':'status'}]}", ROUTE_EXPORTS,
           "meta.routes[0].path: /v1/responses is a host protocol path; "
           "declare host_responses in meta.protocols instead");
    REJECT("{'routes':[{'method':'POST','path':'/v1/images/edits','type':"
           "'submit','decode':'create','render':'created'}]}", ROUTE_EXPORTS,
           "meta.routes[0].path: /v1/images is a host protocol path; "
           "declare host_image in meta.protocols instead");
    ACCEPT("{'routes':[{'method':'POST','path':'/v1/videos2','type':'submit',"
           "'decode':'create','render':'created'}]}", ROUTE_EXPORTS);
}

#define GW_PATH  " a path the gateway serves itself; the route could " \
                 "never be reached"

static void
test_route_gateway_paths_rejected(void **state)
{
    (void) state;
    REJECT("{'routes':[{'method':'POST','path':'/v1/chat/completions',"
           "'type':'submit','decode':'create','render':'created'}]}",
           ROUTE_EXPORTS, "meta.routes[0].path: \"/v1/chat/completions\" is"
           GW_PATH);
    REJECT("{'routes':[{'method':'GET','path':'/v1/tasks/:task_id',"
           "'type':'query','render':'status'}]}", ROUTE_EXPORTS,
           "meta.routes[0].path: \"/v1/tasks/:task_id\" is under /v1/tasks,"
           GW_PATH);
    REJECT("{'routes':[{'method':'POST','path':'/api/user','type':'submit',"
           "'decode':'create','render':'created'}]}", ROUTE_EXPORTS,
           "meta.routes[0].path: \"/api/user\" is under /api," GW_PATH);

    static const struct {
        const char *path, *prefix;       /* prefix NULL: the path itself */
    } under[] = {
        { "/api/", "/api" }, { "/metrics", NULL }, { "/metrics/x", "/metrics" },
        { "/v1/messages", NULL }, { "/v1/rerank", NULL },
        { "/v2/rerank", NULL }, { "/v1/models", NULL },
        { "/v1/models/m:generateContent", "/v1/models" },
        { "/v1beta/models/m:generateContent", NULL },
        { "/v1beta/models/m:streamGenerateContent/",
          "/v1beta/models/m:streamGenerateContent" },
        { "/v1/tasks", NULL },
        { "/v1/tasks/vid", "/v1/tasks" },
        { "/v1/tasks/:task_id/artifacts", "/v1/tasks" },
    };

    for (size_t i = 0; i < sizeof(under) / sizeof(under[0]); i++) {
        char m[256], e[256], w[64] = " is";

        if (under[i].prefix != NULL) {
            snprintf(w, sizeof(w), " is under %s,", under[i].prefix);
        }
        snprintf(m, sizeof(m), "{'routes':[{'method':'POST','path':'%s',"
                 "'type':'submit','decode':'create','render':'created'}]}",
                 under[i].path);
        snprintf(e, sizeof(e), "meta.routes[0].path: \"%s\"%s" GW_PATH,
                 under[i].path, w);
        REJECT(m, ROUTE_EXPORTS, e);
    }

    /* reachable somewhere: a parameter, another spelling, or a path under
       /v1beta that is not a Gemini endpoint */
    ACCEPT("{'routes':[{'method':'POST','path':'/:ver/chat/completions',"
           "'type':'submit','decode':'create','render':'created'},"
           "{'method':'POST','path':'/apis/x','type':'submit',"
           "'decode':'create','render':'created'},"
           "{'method':'POST','path':'/v1/task','type':'submit',"
           "'decode':'create','render':'created'},"
           "{'method':'POST','path':'/v1/:kind/completions','type':'submit',"
           "'decode':'create','render':'created'},"
           "{'method':'POST','path':'/acme/v1/tasks','type':'submit',"
           "'decode':'create','render':'created'},"
           "{'method':'POST','path':'/v1beta/models/veo:predictLongRunning',"
           "'type':'submit','decode':'create','render':'created'},"
           "{'method':'GET','path':'/v1beta/operations/:task_id',"
           "'type':'query','render':'status'}]}", ROUTE_EXPORTS);
}

static void
test_route_conflict_same_method_and_shape(void **state)
{
    (void) state;
    REJECT("{'routes':[" QROUTE ",{'method':'GET','path':'/acme/tasks/:id/',"
           "'type':'query','taskIdParam':'id','render':'status'}]}",
           ROUTE_EXPORTS, "meta.routes[1]: conflicts with meta.routes[0] "
           "(same method and path shape)");
    ACCEPT("{'routes':[" QROUTE ",{'method':'DELETE','path':"
           "'/acme/tasks/:task_id','type':'query','render':'status'}]}",
           ROUTE_EXPORTS);
}


/* ---- protocols ---- */

#define VIDEO_EXPORTS  "'protocols.host_video.decodeRequest'," \
                       "'protocols.host_video.render'"
#define IMAGE_EXPORTS  "'protocols.host_image.decodeRequest'," \
                       "'protocols.host_image.render'"
#define RESP           "'protocols.host_responses."

static void
test_protocol_claims_normalised_to_objects(void **state)
{
    (void) state;
    json_t *n = expect_ok(run("{'protocols':['host_video',{'name':"
                              "'host_image','models':['m2']}]}",
                              VIDEO_EXPORTS "," IMAGE_EXPORTS));

    assert_member(n, "protocols", "[{'name':'host_video'},{'name':"
                  "'host_image','models':['m2']}]");
    json_decref(n);
}

static void
test_protocol_unknown_rejected(void **state)
{
    (void) state;
    REJECT("{'protocols':['host_audio']}", NULL, "meta.protocols[0]: "
           "unknown protocol \"host_audio\" (host_video, host_responses, "
           "host_image)");
    REJECT("{'protocols':[{'name':'openai_images'}]}", NULL,
           "meta.protocols[0].name: unknown protocol \"openai_images\" "
           "(host_video, host_responses, host_image)");
    REJECT("{'protocols':[7]}", NULL, "meta.protocols[0]: must be a "
           "protocol name or an object {name, models?, supports?}");
}

static void
test_marketplace_alias_openai_video_accepted(void **state)
{
    (void) state;
    json_t *n = expect_ok(run("{'protocols':['openai_video']}",
                              "'protocols.openai_video.decodeRequest',"
                              "'protocols.openai_video.render'"));

    assert_member(n, "protocols", "[{'name':'host_video'}]");
    json_decref(n);
    /* spec names in the exports satisfy a marketplace claim too */
    ACCEPT("{'protocols':['openai_video']}", VIDEO_EXPORTS);
}

static void
test_marketplace_alias_openai_image_accepted(void **state)
{
    (void) state;
    json_t *n = expect_ok(run("{'protocols':[{'name':'openai_image',"
                              "'models':['m1']}]}",
                              "'protocols.openai_image.decodeRequest',"
                              "'protocols.openai_image.render'"));

    assert_member(n, "protocols", "[{'name':'host_image','models':['m1']}]");
    json_decref(n);
}

static void
test_marketplace_alias_openai_responses_accepted(void **state)
{
    (void) state;
    json_t *n = expect_ok(run("{'protocols':[{'name':'openai_responses',"
                              "'supports':{'stream':true,'sync':true,"
                              "'background':true}}]}",
                              "'protocols.openai_responses.decodeRequest',"
                              "'protocols.openai_responses.renderEvents',"
                              "'protocols.openai_responses.renderFinal'"));

    assert_member(n, "protocols", "[{'name':'host_responses','supports':"
                  "{'stream':true,'sync':true,'background':true}}]");
    json_decref(n);
}

static void
test_host_video_needs_decode_request_and_render(void **state)
{
    (void) state;
    REJECT("{'protocols':['host_video']}", "'protocols.host_video.render'",
           "meta.protocols[0]: needs export "
           "protocols.host_video.decodeRequest");
    REJECT("{'protocols':['host_video']}",
           "'protocols.host_video.decodeRequest'",
           "meta.protocols[0]: needs export protocols.host_video.render");
}

static void
test_host_image_needs_decode_request_and_render(void **state)
{
    (void) state;
    REJECT("{'protocols':['host_image']}", "'protocols.host_image.render'",
           "meta.protocols[0]: needs export "
           "protocols.host_image.decodeRequest");
    REJECT("{'protocols':['host_image']}",
           "'protocols.host_image.decodeRequest'",
           "meta.protocols[0]: needs export protocols.host_image.render");
}

static void
test_host_video_and_image_declare_no_supports(void **state)
{
    (void) state;
    REJECT("{'protocols':[{'name':'host_video','supports':{'sync':true}}]}",
           VIDEO_EXPORTS, "meta.protocols[0].supports: host_video has no "
           "request modes; remove supports");
    REJECT("{'protocols':[{'name':'openai_image','supports':{'sync':true}}]}",
           IMAGE_EXPORTS, "meta.protocols[0].supports: host_image has no "
           "request modes; remove supports");
}

static void
test_host_responses_bare_string_rejected(void **state)
{
    (void) state;
    REJECT("{'protocols':['host_responses']}", RESP "decodeRequest'",
           "meta.protocols[0]: host_responses needs an object with supports "
           "(a bare string is valid only for protocols without modes)");
}

static void
test_host_responses_supports_list_rejected(void **state)
{
    (void) state;
    REJECT("{'protocols':[{'name':'openai_responses',"
           "'supports':['stream','sync']}]}",
           RESP "decodeRequest','protocols.openai_responses.renderEvents',"
           "'protocols.openai_responses.renderFinal'",
           "meta.protocols[0].supports: must be an object of modes (stream, "
           "sync, background)");
}

static void
test_host_responses_needs_supports(void **state)
{
    (void) state;
    REJECT("{'protocols':[{'name':'host_responses'}]}",
           RESP "decodeRequest'", "meta.protocols[0].supports: required for "
           "host_responses (an object of modes: stream, sync, background)");
    REJECT("{'protocols':[{'name':'host_responses','supports':'stream'}]}",
           RESP "decodeRequest'", "meta.protocols[0].supports: must be an "
           "object of modes (stream, sync, background)");
}

static void
test_host_responses_needs_decode_request(void **state)
{
    (void) state;
    REJECT("{'protocols':[{'name':'host_responses','supports':"
           "{'sync':true}}]}", RESP "renderFinal'", "meta.protocols[0]: "
           "needs export protocols.host_responses.decodeRequest");
}

static void
test_supports_unknown_mode_rejected(void **state)
{
    (void) state;
    REJECT("{'protocols':[{'name':'host_responses','supports':"
           "{'sync':true,'async':true}}]}",
           RESP "decodeRequest'," RESP "renderFinal'",
           "meta.protocols[0].supports.async: unknown mode (stream, sync, "
           "background)");
}

static void
test_supports_mode_boolean(void **state)
{
    (void) state;
    REJECT("{'protocols':[{'name':'host_responses','supports':"
           "{'sync':'yes'}}]}", RESP "decodeRequest'," RESP "renderFinal'",
           "meta.protocols[0].supports.sync: must be a boolean");
}

static void
test_supports_declares_a_mode(void **state)
{
    (void) state;
    REJECT("{'protocols':[{'name':'host_responses','supports':"
           "{'stream':false}}]}", RESP "decodeRequest'",
           "meta.protocols[0].supports: declare at least one of stream, "
           "sync, background");
}

static void
test_stream_mode_needs_render_events(void **state)
{
    (void) state;
    REJECT("{'protocols':[{'name':'host_responses','supports':"
           "{'stream':true}}]}", RESP "decodeRequest'",
           "meta.protocols[0]: \"stream\" needs export "
           "protocols.host_responses.renderEvents");
    ACCEPT("{'protocols':[{'name':'host_responses','supports':"
           "{'stream':true}}]}", RESP "decodeRequest'," RESP "renderEvents'");
}

static void
test_sync_mode_needs_render_final(void **state)
{
    (void) state;
    REJECT("{'protocols':[{'name':'host_responses','supports':"
           "{'sync':true}}]}", RESP "decodeRequest'",
           "meta.protocols[0]: \"sync\" needs export "
           "protocols.host_responses.renderFinal");
}

static void
test_background_mode_needs_render_final(void **state)
{
    (void) state;
    REJECT("{'protocols':[{'name':'host_responses','supports':"
           "{'background':true}}]}", RESP "decodeRequest'",
           "meta.protocols[0]: \"background\" needs export "
           "protocols.host_responses.renderFinal");
    REJECT("{'protocols':[{'name':'host_responses','supports':"
           "{'sync':true,'background':true}}]}", RESP "decodeRequest'",
           "meta.protocols[0]: \"sync\" and \"background\" need export "
           "protocols.host_responses.renderFinal");
}

static void
test_unused_render_events_rejected(void **state)
{
    (void) state;
    REJECT("{'protocols':[{'name':'host_responses','supports':"
           "{'sync':true,'stream':false}}]}",
           RESP "decodeRequest'," RESP "renderFinal'," RESP "renderEvents'",
           "exports.protocols.host_responses.renderEvents: no declared mode "
           "uses it (needs \"stream\" in meta.protocols[0].supports)");
}

static void
test_unused_render_final_rejected(void **state)
{
    (void) state;
    REJECT("{'protocols':[{'name':'openai_responses','supports':"
           "{'stream':true}}]}", "'protocols.openai_responses.decodeRequest',"
           "'protocols.openai_responses.renderEvents',"
           "'protocols.openai_responses.renderFinal'",
           "exports.protocols.host_responses.renderFinal: no declared mode "
           "uses it (needs \"sync\" or \"background\" in "
           "meta.protocols[0].supports)");
}

static void
test_protocol_hook_of_unclaimed_protocol_rejected(void **state)
{
    (void) state;
    REJECT(NULL, "'protocols.openai_image.render'",
           "exports.protocols.host_image.render: host_image is not claimed "
           "in meta.protocols");
    REJECT(NULL, "'protocols.sora.render'", "exports.protocols.sora.render: "
           "unknown protocol \"sora\" (host_video, host_responses, "
           "host_image)");
}

static void
test_protocol_unknown_hook_rejected(void **state)
{
    (void) state;
    REJECT("{'protocols':['host_video']}",
           VIDEO_EXPORTS ",'protocols.host_video.renderFinal'",
           "exports.protocols.host_video.renderFinal: not a hook of "
           "host_video (decodeRequest, render)");
    REJECT("{'protocols':[{'name':'host_responses','supports':"
           "{'sync':true}}]}",
           RESP "decodeRequest'," RESP "renderFinal'," RESP "render'",
           "exports.protocols.host_responses.render: not a hook of "
           "host_responses (decodeRequest, renderEvents, renderFinal)");
}

static void
test_protocol_duplicate_claim_rejected(void **state)
{
    (void) state;
    REJECT("{'protocols':['host_video','openai_video']}", VIDEO_EXPORTS,
           "meta.protocols[1]: duplicate claim for host_video (also "
           "meta.protocols[0])");
}

static void
test_protocol_models_in_meta_models(void **state)
{
    (void) state;
    REJECT("{'protocols':[{'name':'host_video','models':['m1','m9']}]}",
           VIDEO_EXPORTS, "meta.protocols[0].models[1]: \"m9\" is not in "
           "meta.models (spell it as in meta.models)");
    REJECT("{'protocols':[{'name':'host_video','models':[]}]}",
           VIDEO_EXPORTS, "meta.protocols[0].models: must not be empty");
}

static void
test_protocol_claim_unknown_field_rejected(void **state)
{
    (void) state;
    REJECT("{'protocols':[{'name':'host_video','path':'/v1/videos'}]}",
           VIDEO_EXPORTS, "meta.protocols[0].path: unknown field");
}


/* ---- SSE submit and capabilities ---- */

static void
test_submit_response_types_json_sse(void **state)
{
    (void) state;
    REJECT("{'submitResponseTypes':['json','xml']}", NULL,
           "meta.submitResponseTypes[1]: must be \"json\" or \"sse\"");
    REJECT("{'submitResponseTypes':['json','json']}", NULL,
           "meta.submitResponseTypes[1]: duplicate value \"json\"");
    REJECT("{'submitResponseTypes':[]}", NULL,
           "meta.submitResponseTypes: must not be empty");
}

static void
test_sse_snapshot_needs_parse_submit_event(void **state)
{
    (void) state;
    REJECT("{'submitResponseTypes':['json','sse']}", NULL,
           "meta.submitResponseTypes: \"sse\" needs export parseSubmitEvent");
    ACCEPT("{'submitResponseTypes':['json','sse']}", "'parseSubmitEvent'");
}

static void
test_sse_delta_needs_parse_submit_event_delta(void **state)
{
    (void) state;
    REJECT("{'submitResponseTypes':['sse'],'requiredCapabilities':"
           "['submit-sse-delta@1']}", "'parseSubmitEvent'",
           "meta.submitResponseTypes: \"sse\" with submit-sse-delta@1 needs "
           "export parseSubmitEventDelta");
    ACCEPT("{'submitResponseTypes':['sse'],'requiredCapabilities':"
           "['submit-sse-delta@1']}", "'parseSubmitEventDelta'");
}

static void
test_capabilities_exact_names_accepted(void **state)
{
    (void) state;
    ACCEPT("{'requiredCapabilities':['json-clone@1','submit-sse-delta@1']}",
           NULL);
}

static void
test_capability_unknown_rejected(void **state)
{
    (void) state;
    REJECT("{'requiredCapabilities':['json-clone@2']}", NULL,
           "meta.requiredCapabilities[0]: unknown capability "
           "\"json-clone@2\" (supported: json-clone@1, submit-sse-delta@1; "
           "name the exact version)");
    REJECT("{'requiredCapabilities':['json-clone']}", NULL,
           "meta.requiredCapabilities[0]: unknown capability \"json-clone\" "
           "(supported: json-clone@1, submit-sse-delta@1; name the exact "
           "version)");
}

static void
test_capability_duplicate_rejected(void **state)
{
    (void) state;
    REJECT("{'requiredCapabilities':['json-clone@1','json-clone@1']}", NULL,
           "meta.requiredCapabilities[1]: duplicate capability "
           "\"json-clone@1\"");
}


/* ---- required exports ---- */

static void
test_required_exports_for_all_plugins(void **state)
{
    (void) state;
    REJECT(NULL, "['parseSubmitResponse','parseTaskResult',"
           "'buildQueryRequest']",
           "exports: missing buildSubmitRequest (required for all plugins)");
    REJECT(NULL, "['buildSubmitRequest','parseTaskResult',"
           "'buildQueryRequest']",
           "exports: missing parseSubmitResponse (required for all plugins)");
    REJECT(NULL, "['buildSubmitRequest','parseSubmitResponse',"
           "'buildQueryRequest']",
           "exports: missing parseTaskResult (required for all plugins)");
}

static void
test_per_task_needs_build_query_request(void **state)
{
    (void) state;
    REJECT(NULL, "['buildSubmitRequest','parseSubmitResponse',"
           "'parseTaskResult']",
           "meta.fetchMode: \"per_task\" needs export buildQueryRequest");
}

static void
test_batch_needs_batch_query_hooks(void **state)
{
    (void) state;
    const char *base = "['buildSubmitRequest','parseSubmitResponse',"
                       "'parseTaskResult'";
    char ex[256];

    snprintf(ex, sizeof(ex), "%s,'parseBatchResult']", base);
    REJECT("{'fetchMode':'batch'}", ex,
           "meta.fetchMode: \"batch\" needs export buildBatchQueryRequest");
    snprintf(ex, sizeof(ex), "%s,'buildBatchQueryRequest']", base);
    REJECT("{'fetchMode':'batch'}", ex,
           "meta.fetchMode: \"batch\" needs export parseBatchResult");
    snprintf(ex, sizeof(ex), "%s,'buildBatchQueryRequest',"
             "'parseBatchResult']", base);
    ACCEPT("{'fetchMode':'batch'}", ex);
}

static void
test_artifact_hooks_exported_in_pairs(void **state)
{
    (void) state;
    REJECT(NULL, "'listArtifacts'", "exports.listArtifacts: needs "
           "buildContentRequest (exported as a pair)");
    REJECT(NULL, "'buildContentRequest'", "exports.buildContentRequest: "
           "needs listArtifacts (exported as a pair)");
    ACCEPT(NULL, "'listArtifacts','buildContentRequest'");
}

static void
test_exports_must_be_array(void **state)
{
    (void) state;
    REJECT(NULL, "{'buildSubmitRequest':true}",
           "exports: must be a JSON array of export paths");
    REJECT(NULL, "'buildQueryRequest',7", "exports[5]: must be a string");
}


/* ---- usage declarations ---- */

#define SECONDS  "'seconds':{'type':'number','unit':'second'}"

static void
test_usage_schema_normalised(void **state)
{
    (void) state;
    json_t *n = expect_ok(run("{'usageSchema':{'hd':{'type':'boolean',"
                              "'description':'HD output requested'},"
                              "'res':{'enum':['720p','1080p'],'enumLabels':"
                              "{'720p':'HD'}}},'usageExamples':[{'label':"
                              "'x','facts':{'hd':true,'res':'720p'}}]}",
                              NULL));

    assert_member(n, "usageSchema", "{'hd':{'type':'boolean','description':"
                  "{'en':'HD output requested'}},'res':{'enum':['720p',"
                  "'1080p'],'enumLabels':{'720p':{'en':'HD'}}}}");
    json_decref(n);
}

static void
test_usage_number_field_needs_unit(void **state)
{
    (void) state;
    REJECT("{'usageSchema':{'seconds':{'type':'number'}}}", NULL,
           "meta.usageSchema.seconds.unit: required for number fields "
           "(second, count, token or credit)");
    REJECT("{'usageSchema':{'seconds':{'type':'number','unit':'minute'}}}",
           NULL, "meta.usageSchema.seconds.unit: must be second, count, token "
           "or credit");
}

static void
test_usage_unit_only_on_numbers(void **state)
{
    (void) state;
    REJECT("{'usageSchema':{'hd':{'type':'boolean','unit':'count'}}}", NULL,
           "meta.usageSchema.hd.unit: only allowed on number fields");
}

static void
test_usage_unit_label_only_for_count(void **state)
{
    (void) state;
    ACCEPT("{'usageSchema':{'images':{'type':'number','unit':'count',"
           "'unitLabel':{'en':'image','zh':'\xe5\xbc\xa0'}}}}", NULL);
    REJECT("{'usageSchema':{'seconds':{'type':'number','unit':'second',"
           "'unitLabel':'s'}}}", NULL, "meta.usageSchema.seconds.unitLabel: "
           "only allowed on number fields with unit count");
}

static void
test_usage_field_type_or_enum(void **state)
{
    (void) state;
    REJECT("{'usageSchema':{'x':{'description':'x'}}}", NULL,
           "meta.usageSchema.x: needs type (\"number\" or \"boolean\") or "
           "enum");
    REJECT("{'usageSchema':{'x':{'type':'boolean','enum':['a']}}}", NULL,
           "meta.usageSchema.x: declare either type or enum, not both");
    REJECT("{'usageSchema':{'x':{'type':'string'}}}", NULL,
           "meta.usageSchema.x.type: must be \"number\" or \"boolean\"");
}

static void
test_usage_enum_values(void **state)
{
    (void) state;
    REJECT("{'usageSchema':{'res':{'enum':[]}}}", NULL,
           "meta.usageSchema.res.enum: must be a non-empty array of strings");
    REJECT("{'usageSchema':{'res':{'enum':['720p',720]}}}", NULL,
           "meta.usageSchema.res.enum[1]: must be a non-empty string");
    REJECT("{'usageSchema':{'res':{'enum':['720p','720p']}}}", NULL,
           "meta.usageSchema.res.enum[1]: duplicate value \"720p\"");
}

static void
test_usage_enum_labels_keys_declared(void **state)
{
    (void) state;
    REJECT("{'usageSchema':{'res':{'enum':['720p'],'enumLabels':"
           "{'720p':'HD','4k':'UHD'}}}}", NULL,
           "meta.usageSchema.res.enumLabels.4k: \"4k\" is not a declared "
           "enum value");
    REJECT("{'usageSchema':{'hd':{'type':'boolean','enumLabels':{}}}}", NULL,
           "meta.usageSchema.hd.enumLabels: only allowed on enum fields");
}

static void
test_usage_texts_at_most_256_chars(void **state)
{
    (void) state;
    char *s = repeat("d", 257);
    char  patch[1024];

    snprintf(patch, sizeof(patch), "{'usageSchema':{'hd':{'type':'boolean',"
             "'description':{'en':'ok','de':'%s'}}}}", s);
    REJECT(patch, NULL, "meta.usageSchema.hd.description.de: at most 256 "
           "characters");
    snprintf(patch, sizeof(patch), "{'usageSchema':{'res':{'enum':['a'],"
             "'enumLabels':{'a':'%s'}}}}", s);
    REJECT(patch, NULL, "meta.usageSchema.res.enumLabels.a: at most 256 "
           "characters");
    snprintf(patch, sizeof(patch), "{'usageSchema':{'n':{'type':'number',"
             "'unit':'count','unitLabel':'%s'}}}", s);
    REJECT(patch, NULL, "meta.usageSchema.n.unitLabel: at most 256 "
           "characters");
    free(s);
}

static void
test_usage_field_unknown_key_rejected(void **state)
{
    (void) state;
    REJECT("{'usageSchema':{'seconds':{'type':'number','unit':'second',"
           "'price':3}}}", NULL, "meta.usageSchema.seconds.price: unknown "
           "field");
    REJECT("{'usageSchema':{'9s':{'type':'boolean'}}}", NULL,
           "meta.usageSchema.9s: field name must start with a letter or '_' "
           "and hold only letters, digits, '_' and '-'");
}

static void
test_usage_examples_complete_vectors(void **state)
{
    (void) state;
    REJECT("{'usageSchema':{" SECONDS ",'hd':{'type':'boolean'}},"
           "'usageExamples':[{'label':'x','facts':{'seconds':5}}]}", NULL,
           "meta.usageExamples[0].facts: missing \"hd\" (examples are "
           "complete vectors over the usage schema)");
    REJECT("{'usageSchema':{" SECONDS "},'usageExamples':[{'label':'x',"
           "'facts':{'seconds':5,'frames':3}}]}", NULL,
           "meta.usageExamples[0].facts.frames: not declared in the usage "
           "schema");
}

static void
test_usage_example_values_match_schema(void **state)
{
    (void) state;
    const char *schema = "'usageSchema':{" SECONDS ",'hd':{'type':'boolean'},"
                         "'res':{'enum':['720p','1080p']}}";
    char patch[512];

    snprintf(patch, sizeof(patch), "{%s,'usageExamples':[{'label':'x',"
             "'facts':{'seconds':'5','hd':true,'res':'720p'}}]}", schema);
    REJECT(patch, NULL, "meta.usageExamples[0].facts.seconds: must be a "
           "non-negative number");
    snprintf(patch, sizeof(patch), "{%s,'usageExamples':[{'label':'x',"
             "'facts':{'seconds':5,'hd':1,'res':'720p'}}]}", schema);
    REJECT(patch, NULL, "meta.usageExamples[0].facts.hd: must be a boolean");
    snprintf(patch, sizeof(patch), "{%s,'usageExamples':[{'label':'x',"
             "'facts':{'seconds':5,'hd':true,'res':'4k'}}]}", schema);
    REJECT(patch, NULL, "meta.usageExamples[0].facts.res: must be one of "
           "\"720p\", \"1080p\"");
}

static void
test_usage_example_label_required(void **state)
{
    (void) state;
    REJECT("{'usageSchema':{" SECONDS "},'usageExamples':[{'facts':"
           "{'seconds':5}}]}", NULL,
           "meta.usageExamples[0].label: must be a non-empty string");
}

static void
test_token_field_needs_an_example(void **state)
{
    (void) state;
    REJECT("{'usageSchema':{'tokens':{'type':'number','unit':'token'}}}",
           NULL, "meta.usageExamples: the token field \"tokens\" needs at "
           "least one example");
    ACCEPT("{'usageSchema':{'tokens':{'type':'number','unit':'token'}},"
           "'usageExamples':[{'label':'1k','facts':{'tokens':1000}}]}", NULL);
}

static void
test_usage_profiles_accepted(void **state)
{
    (void) state;
    ACCEPT("{'usageProfiles':[{'models':['m1','m2'],'schema':{" SECONDS "},"
           "'examples':[{'label':'5 s','facts':{'seconds':5}}]},"
           "{'models':['m3'],'schema':{}}]}", NULL);
}

static void
test_usage_profile_models_non_empty(void **state)
{
    (void) state;
    REJECT("{'usageProfiles':[{'models':[],'schema':{}}]}", NULL,
           "meta.usageProfiles[0].models: must be a non-empty array of model "
           "names");
}

static void
test_usage_profile_models_spelled_as_in_models(void **state)
{
    (void) state;
    REJECT("{'usageProfiles':[{'models':['M1'],'schema':{}}]}", NULL,
           "meta.usageProfiles[0].models[0]: \"M1\" is not in meta.models "
           "(spell it as in meta.models)");
}

static void
test_usage_profile_model_in_one_profile(void **state)
{
    (void) state;
    REJECT("{'usageProfiles':[{'models':['m1'],'schema':{}},{'models':"
           "['m2','m1'],'schema':{}}]}", NULL,
           "meta.usageProfiles[1].models[1]: \"m1\" is already in "
           "meta.usageProfiles[0] (a model belongs to at most one profile)");
}

static void
test_usage_profile_schema_required(void **state)
{
    (void) state;
    REJECT("{'usageProfiles':[{'models':['m1']}]}", NULL,
           "meta.usageProfiles[0].schema: required (may be {})");
}

static void
test_usage_profile_examples_checked_against_its_schema(void **state)
{
    (void) state;
    REJECT("{'usageSchema':{" SECONDS "},'usageExamples':[{'label':'x',"
           "'facts':{'seconds':1}}],'usageProfiles':[{'models':['m1'],"
           "'schema':{'images':{'type':'number','unit':'count'}},"
           "'examples':[{'label':'x','facts':{'seconds':1}}]}]}", NULL,
           "meta.usageProfiles[0].examples[0].facts: missing \"images\" "
           "(examples are complete vectors over the usage schema)");
}

static void
test_usage_profile_token_field_needs_an_example(void **state)
{
    (void) state;
    REJECT("{'usageProfiles':[{'models':['m1'],'schema':{'tokens':"
           "{'type':'number','unit':'token'}}}]}", NULL,
           "meta.usageProfiles[0].examples: the token field \"tokens\" needs "
           "at least one example");
}


int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_minimal_manifest_accepted),
        cmocka_unit_test(test_defaults_filled_in),
        cmocka_unit_test(test_meta_not_json_rejected),
        cmocka_unit_test(test_meta_not_object_rejected),
        cmocka_unit_test(test_all_errors_collected),
        cmocka_unit_test(test_unknown_top_level_field_rejected),

        cmocka_unit_test(test_legacy_endpoints_rejected),
        cmocka_unit_test(test_legacy_resolve_request_rejected),
        cmocka_unit_test(test_legacy_render_error_rejected),
        cmocka_unit_test(test_legacy_renderers_rejected),
        cmocka_unit_test(test_legacy_route_renderer_rejected),

        cmocka_unit_test(test_api_version_required),
        cmocka_unit_test(test_api_version_must_be_1),
        cmocka_unit_test(test_key_required),
        cmocka_unit_test(test_key_over_30_chars_rejected),
        cmocka_unit_test(test_key_of_30_chars_accepted),
        cmocka_unit_test(test_key_must_be_safe_identifier),
        cmocka_unit_test(test_name_required),
        cmocka_unit_test(test_version_must_be_semver),
        cmocka_unit_test(test_version_prerelease_and_build_accepted),
        cmocka_unit_test(test_author_required),
        cmocka_unit_test(test_author_name_required),
        cmocka_unit_test(test_author_url_must_be_http_url),
        cmocka_unit_test(test_author_unknown_field_rejected),

        cmocka_unit_test(test_models_required),
        cmocka_unit_test(test_model_names_non_empty_strings),
        cmocka_unit_test(test_fetch_mode_per_task_or_batch),

        cmocka_unit_test(test_localized_string_becomes_en_map),
        cmocka_unit_test(test_locale_keys_get_canonical_casing),
        cmocka_unit_test(test_locale_key_pattern_enforced),
        cmocka_unit_test(test_duplicate_locale_after_canonicalising_rejected),
        cmocka_unit_test(test_en_locale_required),
        cmocka_unit_test(test_at_most_16_locales),
        cmocka_unit_test(test_localized_value_non_empty),
        cmocka_unit_test(test_localized_value_no_control_characters),
        cmocka_unit_test(test_localized_text_type),
        cmocka_unit_test(test_description_over_512_chars_rejected),

        cmocka_unit_test(test_icon_over_128_chars_rejected),
        cmocka_unit_test(test_icon_url_rejected),
        cmocka_unit_test(test_icon_data_uri_rejected),
        cmocka_unit_test(test_icon_library_name_and_text_accepted),
        cmocka_unit_test(test_icon_text_needs_label),
        cmocka_unit_test(test_icon_name_characters),

        cmocka_unit_test(test_website_empty_accepted),
        cmocka_unit_test(test_website_must_be_https),
        cmocka_unit_test(test_website_credentials_rejected),
        cmocka_unit_test(test_website_whitespace_control_backslash_rejected),
        cmocka_unit_test(test_website_host_ascii),

        cmocka_unit_test(test_sort_priority_default_0),
        cmocka_unit_test(test_sort_priority_signed_32_bit),

        cmocka_unit_test(test_base_url_normalised),
        cmocka_unit_test(test_base_url_self_hosted_http_accepted),
        cmocka_unit_test(test_base_url_over_191_chars_rejected),
        cmocka_unit_test(test_base_url_must_be_http),
        cmocka_unit_test(test_base_url_credentials_rejected),
        cmocka_unit_test(test_base_url_query_rejected),
        cmocka_unit_test(test_base_url_fragment_rejected),
        cmocka_unit_test(test_base_url_host_ascii),
        cmocka_unit_test(test_base_url_port_range),

        cmocka_unit_test(test_allowed_hosts_lowercased),
        cmocka_unit_test(test_allowed_hosts_duplicates_rejected),
        cmocka_unit_test(test_allowed_host_no_scheme),
        cmocka_unit_test(test_allowed_host_no_path),
        cmocka_unit_test(test_allowed_host_no_credentials),
        cmocka_unit_test(test_allowed_host_no_query),
        cmocka_unit_test(test_allowed_host_ipv6_in_brackets),
        cmocka_unit_test(test_allowed_host_port_range),
        cmocka_unit_test(test_allowed_host_name_valid),

        cmocka_unit_test(test_upstreams_vendor_and_peer_gateway),
        cmocka_unit_test(test_upstreams_unknown_rejected),
        cmocka_unit_test(test_upstreams_unique),
        cmocka_unit_test(test_marketplace_alias_new_api_accepted),

        cmocka_unit_test(test_auth_strings_accepted),
        cmocka_unit_test(test_auth_unknown_string_rejected),
        cmocka_unit_test(test_marketplace_alias_vertex_oauth_accepted),
        cmocka_unit_test(test_marketplace_auth_oauth2_jwt_object_accepted),
        cmocka_unit_test(test_auth_object_needs_string_type),

        cmocka_unit_test(test_channel_types_not_60_or_61),
        cmocka_unit_test(test_channel_types_numbers),

        cmocka_unit_test(test_routes_accepted_with_defaults),
        cmocka_unit_test(test_route_method_required),
        cmocka_unit_test(test_route_path_starts_with_slash),
        cmocka_unit_test(test_route_path_plain),
        cmocka_unit_test(test_route_type_submit_dynamic_query),
        cmocka_unit_test(test_route_decode_required_for_submit),
        cmocka_unit_test(test_route_decode_required_for_dynamic),
        cmocka_unit_test(test_route_decode_forbidden_for_query),
        cmocka_unit_test(test_route_render_required),
        cmocka_unit_test(test_route_decode_needs_native_export),
        cmocka_unit_test(test_route_render_needs_native_export),
        cmocka_unit_test(test_route_models_only_submit_dynamic),
        cmocka_unit_test(test_route_models_in_meta_models),
        cmocka_unit_test(test_route_task_id_param_only_query),
        cmocka_unit_test(test_query_route_path_needs_task_id),
        cmocka_unit_test(test_query_route_custom_task_id_param),
        cmocka_unit_test(test_route_retain_result_only_submit_dynamic),
        cmocka_unit_test(test_route_retain_result_boolean),
        cmocka_unit_test(test_marketplace_route_action_accepted),
        cmocka_unit_test(test_route_unknown_field_rejected),
        cmocka_unit_test(test_route_host_protocol_paths_rejected),
        cmocka_unit_test(test_route_gateway_paths_rejected),
        cmocka_unit_test(test_route_conflict_same_method_and_shape),

        cmocka_unit_test(test_protocol_claims_normalised_to_objects),
        cmocka_unit_test(test_protocol_unknown_rejected),
        cmocka_unit_test(test_marketplace_alias_openai_video_accepted),
        cmocka_unit_test(test_marketplace_alias_openai_image_accepted),
        cmocka_unit_test(test_marketplace_alias_openai_responses_accepted),
        cmocka_unit_test(test_host_video_needs_decode_request_and_render),
        cmocka_unit_test(test_host_image_needs_decode_request_and_render),
        cmocka_unit_test(test_host_video_and_image_declare_no_supports),
        cmocka_unit_test(test_host_responses_bare_string_rejected),
        cmocka_unit_test(test_host_responses_supports_list_rejected),
        cmocka_unit_test(test_host_responses_needs_supports),
        cmocka_unit_test(test_host_responses_needs_decode_request),
        cmocka_unit_test(test_supports_unknown_mode_rejected),
        cmocka_unit_test(test_supports_mode_boolean),
        cmocka_unit_test(test_supports_declares_a_mode),
        cmocka_unit_test(test_stream_mode_needs_render_events),
        cmocka_unit_test(test_sync_mode_needs_render_final),
        cmocka_unit_test(test_background_mode_needs_render_final),
        cmocka_unit_test(test_unused_render_events_rejected),
        cmocka_unit_test(test_unused_render_final_rejected),
        cmocka_unit_test(test_protocol_hook_of_unclaimed_protocol_rejected),
        cmocka_unit_test(test_protocol_unknown_hook_rejected),
        cmocka_unit_test(test_protocol_duplicate_claim_rejected),
        cmocka_unit_test(test_protocol_models_in_meta_models),
        cmocka_unit_test(test_protocol_claim_unknown_field_rejected),

        cmocka_unit_test(test_submit_response_types_json_sse),
        cmocka_unit_test(test_sse_snapshot_needs_parse_submit_event),
        cmocka_unit_test(test_sse_delta_needs_parse_submit_event_delta),
        cmocka_unit_test(test_capabilities_exact_names_accepted),
        cmocka_unit_test(test_capability_unknown_rejected),
        cmocka_unit_test(test_capability_duplicate_rejected),

        cmocka_unit_test(test_required_exports_for_all_plugins),
        cmocka_unit_test(test_per_task_needs_build_query_request),
        cmocka_unit_test(test_batch_needs_batch_query_hooks),
        cmocka_unit_test(test_artifact_hooks_exported_in_pairs),
        cmocka_unit_test(test_exports_must_be_array),

        cmocka_unit_test(test_usage_schema_normalised),
        cmocka_unit_test(test_usage_number_field_needs_unit),
        cmocka_unit_test(test_usage_unit_only_on_numbers),
        cmocka_unit_test(test_usage_unit_label_only_for_count),
        cmocka_unit_test(test_usage_field_type_or_enum),
        cmocka_unit_test(test_usage_enum_values),
        cmocka_unit_test(test_usage_enum_labels_keys_declared),
        cmocka_unit_test(test_usage_texts_at_most_256_chars),
        cmocka_unit_test(test_usage_field_unknown_key_rejected),
        cmocka_unit_test(test_usage_examples_complete_vectors),
        cmocka_unit_test(test_usage_example_values_match_schema),
        cmocka_unit_test(test_usage_example_label_required),
        cmocka_unit_test(test_token_field_needs_an_example),
        cmocka_unit_test(test_usage_profiles_accepted),
        cmocka_unit_test(test_usage_profile_models_non_empty),
        cmocka_unit_test(test_usage_profile_models_spelled_as_in_models),
        cmocka_unit_test(test_usage_profile_model_in_one_profile),
        cmocka_unit_test(test_usage_profile_schema_required),
        cmocka_unit_test(test_usage_profile_examples_checked_against_its_schema),
        cmocka_unit_test(test_usage_profile_token_field_needs_an_example),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
