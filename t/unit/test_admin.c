/*
 * Answers of the SQL admin dispatcher turned into HTTP answers, and the
 * configuration notices workers follow.
 */

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "llmgw.h"


static int
answer(const char *json, llmgw_buf_t *body, llmgw_verdict_t *v)
{
    memset(v, 0, sizeof(*v));
    v->status = -1;
    return llmgw_admin_answer(json, strlen(json), body, v);
}


static void
test_admin_success_sends_the_body(void **state)
{
    llmgw_buf_t      body;
    llmgw_verdict_t  v;
    json_error_t     err;
    json_t          *j;
    (void) state;

    assert_int_equal(answer("{\"status\":200,\"body\":{\"id\":3,"
                            "\"name\":\"alice\",\"quota\":500000}}",
                            &body, &v), 200);
    assert_int_equal(v.status, 0);
    assert_non_null(body.data);

    j = json_loadb(body.data, body.len, 0, &err);
    assert_non_null(j);
    assert_int_equal(json_object_size(j), 3);
    assert_int_equal(json_integer_value(json_object_get(j, "id")), 3);
    assert_string_equal(json_string_value(json_object_get(j, "name")),
                        "alice");
    assert_int_equal(json_integer_value(json_object_get(j, "quota")), 500000);
    json_decref(j);
    llmgw_buf_free(&body);
}


static void
test_admin_success_list_body_is_sent_as_is(void **state)
{
    llmgw_buf_t      body;
    llmgw_verdict_t  v;
    (void) state;

    assert_int_equal(answer("{\"status\":200,\"body\":[1,2]}", &body, &v),
                     200);
    assert_int_equal(body.len, strlen("[1,2]"));
    assert_memory_equal(body.data, "[1,2]", body.len);
    llmgw_buf_free(&body);
}


static void
assert_admin_error(const char *json, int status, const char *code,
    const char *message)
{
    llmgw_buf_t      body;
    llmgw_verdict_t  v;

    assert_int_equal(answer(json, &body, &v), status);
    assert_null(body.data);
    assert_int_equal(v.status, status);
    assert_string_equal(v.type, "gateway_error");
    assert_string_equal(v.code, code);
    assert_string_equal(v.message, message);
}


static void
test_admin_error_keeps_status_message_and_code(void **state)
{
    (void) state;

    assert_admin_error("{\"status\":400,\"message\":\"quota: must be an "
                       "integer\",\"code\":\"invalid_request\"}",
                       400, "invalid_request", "quota: must be an integer");
    assert_admin_error("{\"status\":404,\"message\":\"user 9 not found\","
                       "\"code\":\"not_found\"}",
                       404, "not_found", "user 9 not found");
    assert_admin_error("{\"status\":400,\"code\":\"invalid_json\","
                       "\"message\":\"invalid JSON request body\"}",
                       400, "invalid_json", "invalid JSON request body");
    assert_admin_error("{\"status\":405,\"code\":\"method_not_allowed\","
                       "\"message\":\"method PUT is not allowed on /user\","
                       "\"allow\":\"GET, POST\"}",
                       405, "method_not_allowed",
                       "method PUT is not allowed on /user");
    assert_admin_error("{\"status\":400,\"code\":\"conflict\","
                       "\"message\":\"username bob already exists\"}",
                       400, "conflict", "username bob already exists");
}


static void
test_admin_unknown_code_becomes_admin_error(void **state)
{
    (void) state;

    assert_admin_error("{\"status\":409,\"message\":\"busy\","
                       "\"code\":\"something_new\"}",
                       409, "admin_error", "busy");
}


static void
test_admin_unreadable_answer_is_500(void **state)
{
    static const char *const bad[] = {
        "", "not json", "[200]", "{\"status\":99}", "{\"status\":600}",
    };
    (void) state;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        llmgw_buf_t      body;
        llmgw_verdict_t  v;

        assert_int_equal(answer(bad[i], &body, &v), 500);
        assert_null(body.data);
        assert_int_equal(v.status, 500);
        assert_string_equal(v.type, "gateway_error");
        assert_true(v.message[0] != '\0');
    }
}


/*
 * The glue reads a 405's Allow header from the end of its message: a long
 * method or path is cut before that end, and a path that mimics it is not
 * read in its place.
 */
static void
test_admin_405_cut_keeps_the_allowed_methods(void **state)
{
    static const char allowed[] = " (allowed: GET, PATCH, DELETE)";
    char             json[2048], text[1024];
    size_t           n;
    llmgw_buf_t      body;
    llmgw_verdict_t  v;
    (void) state;

    /* the first cut would end right after the path's own "(allowed: ...)" */
    n = 480 - strlen("method PUT is not allowed on /plugin/task/")
        - strlen("(allowed: POST)");
    snprintf(text, sizeof(text), "method PUT is not allowed on "
             "/plugin/task/%0*d(allowed: POST)%s", (int) n, 0, allowed);
    snprintf(json, sizeof(json), "{\"status\":405,\"code\":"
             "\"method_not_allowed\",\"message\":\"%s\"}", text);

    assert_int_equal(answer(json, &body, &v), 405);
    assert_int_equal(strlen(v.message), 480);
    assert_string_equal(v.message + 480 - strlen(allowed), allowed);
    assert_memory_equal(v.message, text, 480 - strlen(allowed));

    /* a long method */
    memset(text, 'A', 600);
    text[600] = '\0';
    snprintf(json, sizeof(json), "{\"status\":405,\"code\":"
             "\"method_not_allowed\",\"message\":\"method %s is not "
             "allowed on /pricing (allowed: GET, PUT)\"}", text);

    assert_int_equal(answer(json, &body, &v), 405);
    assert_int_equal(strlen(v.message), 480);
    assert_string_equal(v.message + 480 - strlen(" (allowed: GET, PUT)"),
                        " (allowed: GET, PUT)");

    /* other statuses are cut at the end */
    snprintf(json, sizeof(json), "{\"status\":404,\"code\":\"not_found\","
             "\"message\":\"plugin %s not found (allowed: GET)\"}", text);

    assert_int_equal(answer(json, &body, &v), 404);
    assert_int_equal(strlen(v.message), 480);
    assert_null(strstr(v.message, "(allowed:"));
}


static llmgw_admin_route_e
route(const char *method, const char *path, llmgw_str_t *key,
    llmgw_verdict_t *v)
{
    memset(v, 0, sizeof(*v));
    return llmgw_admin_route((llmgw_str_t) { method, strlen(method) },
                             (llmgw_str_t) { path, strlen(path) }, key, v);
}


/* As llmgw_api() reads paths: /plugin/task/ is /plugin/task. */
static void
test_admin_route_trailing_slash_is_the_same_path(void **state)
{
    static const struct {
        const char           *method;
        const char           *path;
        llmgw_admin_route_e   want;
    } cases[] = {
        { "POST", "/plugin/task", LLMGW_ADMIN_UPLOAD },
        { "POST", "/plugin/task/", LLMGW_ADMIN_UPLOAD },
        { "POST", "/plugin/task//", LLMGW_ADMIN_UPLOAD },
        { "POST", "/plugin/task/dryrun/", LLMGW_ADMIN_DRYRUN },
        { "POST", "/plugin/task/marketplace/", LLMGW_ADMIN_MARKETPLACE },
        { "GET", "/plugin/task/runtime/status/", LLMGW_ADMIN_STATUS },
        { "GET", "/plugin/task/", LLMGW_ADMIN_DATABASE },
        { "PUT", "/plugin/task/", LLMGW_ADMIN_DATABASE },
        { "GET", "/plugin/task/dryrun", LLMGW_ADMIN_DATABASE },
        { "POST", "/plugin/task/x", LLMGW_ADMIN_DATABASE },
        { "POST", "/plugin/task/x/activate/", LLMGW_ADMIN_DATABASE },
        { "POST", "/plugin/taskx", LLMGW_ADMIN_DATABASE },
        { "POST", "/user/", LLMGW_ADMIN_DATABASE },
        { "POST", "/", LLMGW_ADMIN_DATABASE },
        { "POST", "", LLMGW_ADMIN_DATABASE },
    };
    size_t           i;
    llmgw_str_t      key;
    llmgw_verdict_t  v;
    (void) state;

    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        assert_int_equal(route(cases[i].method, cases[i].path, &key, &v),
                         cases[i].want);
        assert_int_equal(v.status, 0);
    }

    assert_int_equal(route("GET", "/plugin/task/my-key/icon/", &key, &v),
                     LLMGW_ADMIN_ICON);
    assert_int_equal(key.len, 6);
    assert_memory_equal(key.data, "my-key", 6);

    /* a key holds no slash, and is never empty */
    assert_int_equal(route("GET", "/plugin/task/a/b/icon", &key, &v),
                     LLMGW_ADMIN_DATABASE);
    assert_int_equal(route("GET", "/plugin/task//icon", &key, &v),
                     LLMGW_ADMIN_DATABASE);
    assert_int_equal(route("GET", "/plugin/task/icon", &key, &v),
                     LLMGW_ADMIN_DATABASE);
}


/*
 * Paths that only the gateway answers take GET alone: any other method is
 * a 405 whose message ends with the list the glue sends as Allow.
 */
static void
test_admin_route_gateway_paths_refuse_other_methods_with_405(void **state)
{
    char             method[601];
    llmgw_str_t      key;
    llmgw_verdict_t  v;
    (void) state;

    assert_int_equal(route("PUT", "/plugin/task/runtime/status/", &key, &v),
                     LLMGW_ADMIN_REFUSED);
    assert_int_equal(v.status, 405);
    assert_string_equal(v.code, "method_not_allowed");
    assert_string_equal(v.message, "method PUT is not allowed on "
                        "/api/plugin/task/runtime/status (allowed: GET)");

    assert_int_equal(route("HEAD", "/plugin/task/k/icon", &key, &v),
                     LLMGW_ADMIN_REFUSED);
    assert_null(key.data);
    assert_string_equal(v.message, "method HEAD is not allowed on "
                        "/api/plugin/task/k/icon (allowed: GET)");

    /* the client's key cannot end the message in place of the list */
    assert_int_equal(route("DELETE", "/plugin/task/x(allowed: DELETE)/icon",
                           &key, &v),
                     LLMGW_ADMIN_REFUSED);
    assert_string_equal(v.message + strlen(v.message)
                        - strlen(" (allowed: GET)"), " (allowed: GET)");

    memset(method, 'A', 600);
    method[600] = '\0';
    assert_int_equal(route(method, "/plugin/task/runtime/status", &key, &v),
                     LLMGW_ADMIN_REFUSED);
    assert_true(strlen(v.message) <= 480);
    assert_string_equal(v.message + strlen(v.message)
                        - strlen(" (allowed: GET)"), " (allowed: GET)");
}


static void
test_notice_parse_reads_rev_kind_and_id(void **state)
{
    static const char json[] = "{\"rev\" : 12, \"kind\" : \"user\", "
                               "\"id\" : 3}";
    llmgw_notice_t n;
    (void) state;

    assert_int_equal(llmgw_notice_parse(json, strlen(json), &n), 0);
    assert_int_equal(n.rev, 12);
    assert_string_equal(n.kind, "user");
    assert_int_equal(n.id, 3);
}


/* Numbers are sent as the database wrote them, not through a double. */
static void
test_admin_success_keeps_the_numbers_text(void **state)
{
    llmgw_buf_t      body;
    llmgw_verdict_t  v;
    static const char want[] = "{\"m\": {\"ratio\": 0.075, \"n\": "
                               "123456789012345678901234567890}}";
    char             json[256];
    (void) state;

    snprintf(json, sizeof(json), "{\"status\":200,\"body\":%s}", want);
    assert_int_equal(answer(json, &body, &v), 200);
    assert_int_equal(body.len, strlen(want));
    assert_memory_equal(body.data, want, body.len);
    llmgw_buf_free(&body);
}


static int
check(const char *path, const char *args, const char *body, size_t len,
    int object, llmgw_verdict_t *v)
{
    memset(v, 0, sizeof(*v));
    return llmgw_admin_check(LLMGW_ADMIN_DATABASE,
                             (llmgw_str_t) { path, strlen(path) },
                             (llmgw_str_t) { args, strlen(args) },
                             (llmgw_str_t) { body, len }, object, v);
}


static void
test_admin_check_refuses_what_the_database_cannot_take(void **state)
{
    static const char nul[] = "{\"quota\":7}\0{\"quota\":\"x\"}";
    static const char *const bad[] = {
        "{\"ratio\":1e400}", "{\"a\":[-1e999]}", "{\"u\":\"\xff\xfe\"}",
        "[]", "\"x\"", "{\"a\":", "not json",
    };
    llmgw_verdict_t  v;
    (void) state;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_equal(check("/user", "", bad[i], strlen(bad[i]), 1, &v), -1);
        assert_int_equal(v.status, 400);
        assert_string_equal(v.code, "invalid_json");
    }

    assert_int_equal(check("/user/1", "", nul, sizeof(nul) - 1, 1, &v), -1);
    assert_string_equal(v.code, "invalid_json");

    /* a path or query that is not UTF-8 */
    assert_int_equal(check("/user/\xff", "", "", 0, 0, &v), -1);
    assert_string_equal(v.code, "invalid_request");
    assert_int_equal(check("/log", "model=\xc3", "", 0, 0, &v), -1);
    assert_int_equal(v.status, 400);

    /* accepted: objects (big integers read as reals), empty bodies, bodies
       of methods that take none */
    assert_int_equal(check("/pricing", "", "{\"m\":{\"ratio\":1e300,\"n\":"
                           "123456789012345678901234567890}}", 56, 1, &v), 0);
    assert_int_equal(check("/user", "", " \n", 2, 1, &v), 0);
    assert_int_equal(check("/user/1", "x=\xc3\xa9", "[]", 2, 0, &v), 0);
}


static int
check_query(llmgw_admin_route_e route, const char *args, llmgw_verdict_t *v)
{
    memset(v, 0, sizeof(*v));
    return llmgw_admin_check(route, (llmgw_str_t) { "/plugin/task", 12 },
                             (llmgw_str_t) { args, strlen(args) },
                             (llmgw_str_t) { "", 0 }, 1, v);
}


/* The calls the gateway answers name what they do not take, as the
   database's calls do: a misspelt ?forse=1 is not dropped. */
static void
test_admin_check_gateway_calls_refuse_unknown_query_parameters(void **state)
{
    llmgw_verdict_t  v;
    (void) state;

    assert_int_equal(check_query(LLMGW_ADMIN_UPLOAD, "force=1", &v), 0);
    assert_int_equal(check_query(LLMGW_ADMIN_MARKETPLACE, "&force=false&",
                                 &v), 0);
    assert_int_equal(check_query(LLMGW_ADMIN_UPLOAD, "force=true&force=0",
                                 &v), 0);
    assert_int_equal(check_query(LLMGW_ADMIN_DATABASE, "userid=1", &v), 0);

    assert_int_equal(check_query(LLMGW_ADMIN_UPLOAD, "force=1&forse=1", &v),
                     -1);
    assert_int_equal(v.status, 400);
    assert_string_equal(v.code, "invalid_request");
    assert_string_equal(v.message,
                        "forse: unknown query parameter (known: force)");

    assert_int_equal(check_query(LLMGW_ADMIN_STATUS, "x=1", &v), -1);
    assert_string_equal(v.message,
                        "x: unknown query parameter (this call takes none)");
    assert_int_equal(check_query(LLMGW_ADMIN_DRYRUN, "force=1", &v), -1);
    assert_int_equal(check_query(LLMGW_ADMIN_ICON, "=", &v), -1);

    /* force as strictly as in a body: what is not read as true is not
       taken as false either */
    for (const char *const *q = (const char *const[]) {
             "force=yes", "force=maybe", "force", "force=", "force=TRUE",
             "force=1&force=2", NULL };
         *q != NULL; q++)
    {
        assert_int_equal(check_query(LLMGW_ADMIN_UPLOAD, *q, &v), -1);
        assert_int_equal(v.status, 400);
        assert_string_equal(v.code, "invalid_request");
        assert_string_equal(v.message,
                            "force: must be true or false (1 or 0)");
    }
}


static void
test_notice_parse_refuses_garbage(void **state)
{
    static const char *const bad[] = { "", "12", "{\"rev\":", "[]" };
    (void) state;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        llmgw_notice_t n;

        assert_int_equal(llmgw_notice_parse(bad[i], strlen(bad[i]), &n), -1);
    }
}


static void
test_notice_parse_long_kind_is_cut_not_overflowed(void **state)
{
    static const char json[] = "{\"rev\":1,\"kind\":"
                               "\"abcdefghijklmnopqrstuvwxyz\",\"id\":2}";
    llmgw_notice_t n;
    (void) state;

    assert_int_equal(llmgw_notice_parse(json, strlen(json), &n), 0);
    assert_int_equal(strlen(n.kind), sizeof(n.kind) - 1);
    assert_int_equal(n.id, 2);
    /* a cut kind is never mistaken for a known one */
    assert_true(strcmp(n.kind, "token") != 0);
}


int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_admin_success_sends_the_body),
        cmocka_unit_test(test_admin_success_list_body_is_sent_as_is),
        cmocka_unit_test(test_admin_error_keeps_status_message_and_code),
        cmocka_unit_test(test_admin_unknown_code_becomes_admin_error),
        cmocka_unit_test(test_admin_unreadable_answer_is_500),
        cmocka_unit_test(test_admin_405_cut_keeps_the_allowed_methods),
        cmocka_unit_test(test_admin_success_keeps_the_numbers_text),
        cmocka_unit_test(test_admin_check_refuses_what_the_database_cannot_take),
        cmocka_unit_test(
            test_admin_check_gateway_calls_refuse_unknown_query_parameters),
        cmocka_unit_test(test_admin_route_trailing_slash_is_the_same_path),
        cmocka_unit_test(
            test_admin_route_gateway_paths_refuse_other_methods_with_405),
        cmocka_unit_test(test_notice_parse_reads_rev_kind_and_id),
        cmocka_unit_test(test_notice_parse_refuses_garbage),
        cmocka_unit_test(test_notice_parse_long_kind_is_cut_not_overflowed),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
