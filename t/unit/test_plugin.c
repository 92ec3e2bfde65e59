/*
 * What the gateway sends v8_host for a hook call, read from an admin
 * dry-run body, and how it tells a "not loaded" answer.
 */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "llmgw.h"


static json_t *
call_frame(const char *body, const char *sha, llmgw_verdict_t *v, int *rc)
{
    json_t       *out;
    llmgw_buf_t   frame = { NULL, 0 };

    *rc = llmgw_plugin_call_request(body, strlen(body), sha, &frame, v);
    if (*rc != 0) {
        assert_null(frame.data);
        return NULL;
    }

    out = json_loadb(frame.data, frame.len, 0, NULL);
    assert_non_null(out);
    llmgw_buf_free(&frame);
    return out;
}


static void
test_call_frame_names_sha_hook_and_args_as_written(void **state)
{
    int              rc;
    json_t          *f, *want;
    llmgw_verdict_t  v;

    (void) state;

    f = call_frame("{\"key\":\"k\",\"hook\":\"build\\u0053ubmit\","
                   "\"args\":[{\"a\":[1,2.5,\"\\u00e9\\n\"]},null],"
                   "\"hook\":\"buildSubmitRequest\"}", "ab12", &v, &rc);
    assert_int_equal(rc, 0);

    /* the last of repeated members counts, as anywhere else */
    want = json_loads("{\"sha\":\"ab12\",\"hook\":\"buildSubmitRequest\","
                      "\"args\":[{\"a\":[1,2.5,\"\\u00e9\\n\"]},null]}", 0,
                      NULL);
    assert_true(json_equal(f, want));
    json_decref(f);
    json_decref(want);

    /* no args: an empty list; an empty sha (a source's dry run) stays */
    f = call_frame("{\"hook\":\"native.decode\"}", "", &v, &rc);
    assert_int_equal(rc, 0);
    want = json_loads("{\"sha\":\"\",\"hook\":\"native.decode\","
                      "\"args\":[]}", 0, NULL);
    assert_true(json_equal(f, want));
    json_decref(f);
    json_decref(want);
}


static void
test_call_frame_refuses_bad_hook_and_args(void **state)
{
    static const char *const bad[] = { "{\"hook\":\"h\",", "bad", "" };
    int              rc;
    llmgw_verdict_t  v;

    (void) state;

    assert_null(call_frame("{\"hook\":\"\"}", "ab", &v, &rc));
    assert_int_equal(rc, -1);
    assert_int_equal(v.status, 400);
    assert_non_null(strstr(v.message, "field hook is required"));

    assert_null(call_frame("{\"hook\":7,\"args\":[]}", "ab", &v, &rc));
    assert_int_equal(v.status, 400);

    assert_null(call_frame("[\"hook\"]", "ab", &v, &rc));
    assert_int_equal(v.status, 400);
    assert_string_equal(v.code, "invalid_json");

    assert_null(call_frame("{\"hook\":\"h\",\"args\":{}}", "ab", &v, &rc));
    assert_int_equal(v.status, 400);
    assert_non_null(strstr(v.message, "args: must be an array"));

    assert_null(call_frame("{\"hook\":\"h\",\"args\":null}", "ab", &v, &rc));
    assert_int_equal(v.status, 400);

    /* a body that is not JSON is the caller's fault, not the gateway's */
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_null(call_frame(bad[i], "ab", &v, &rc));
        assert_int_equal(v.status, 400);
        assert_string_equal(v.code, "invalid_json");
    }
}


static void
test_body_key(void **state)
{
    char             key[8];
    llmgw_verdict_t  v;

    (void) state;

    assert_int_equal(llmgw_plugin_body_key("{\"key\":\"a\\u0062c\"}", 18, key,
                                           sizeof(key), &v), 0);
    assert_string_equal(key, "abc");

    /* a source makes it a source's dry run, whatever the key */
    assert_int_equal(llmgw_plugin_body_key("{\"key\":\"abc\",\"source\":null}",
                                           28, key, sizeof(key), &v), 1);
    assert_int_equal(llmgw_plugin_body_key("{\"hook\":\"x\"}", 12, key,
                                           sizeof(key), &v), 1);
    assert_int_equal(llmgw_plugin_body_key("{\"key\":\"abc\"", 12, key,
                                           sizeof(key), &v), 1);

    /* a key no plugin has is looked up (and not found), never a source */
    assert_int_equal(llmgw_plugin_body_key("{\"key\":\"\"}", 10, key,
                                           sizeof(key), &v), 0);
    assert_string_equal(key, "");
    assert_int_equal(llmgw_plugin_body_key("{\"key\":\"abcdefgh\"}", 18, key,
                                           sizeof(key), &v), 0);
    assert_string_equal(key, "");

    assert_int_equal(llmgw_plugin_body_key("{\"key\":1}", 9, key,
                                           sizeof(key), &v), -1);
    assert_int_equal(v.status, 400);
    assert_string_equal(v.code, "invalid_request");
    assert_non_null(strstr(v.message, "key must be a string"));
    assert_int_equal(llmgw_plugin_body_key("{\"key\":null}", 12, key,
                                           sizeof(key), &v), -1);
}


static void
test_not_loaded(void **state)
{
    const char  *yes = "{\"error\":{\"kind\":\"not_loaded\",\"message\":\"x\"}}";
    const char  *result = "{\"result\":{\"kind\":\"not_loaded\"}}";
    const char  *other = "{\"error\":{\"kind\":\"plugin\",\"message\":"
                         "\"not_loaded\"}}";

    (void) state;

    assert_int_equal(llmgw_plugin_not_loaded(yes, strlen(yes)), 1);
    assert_int_equal(llmgw_plugin_not_loaded(result, strlen(result)), 0);
    assert_int_equal(llmgw_plugin_not_loaded(other, strlen(other)), 0);
    assert_int_equal(llmgw_plugin_not_loaded("{\"result\":1}", 12), 0);
    assert_int_equal(llmgw_plugin_not_loaded("not_loaded", 10), 0);
}


/* A hook's deadline ends before nginx stops waiting for its call, with
   room for the 2 s in which the runtime ends a worker that ignores it. */
static void
test_call_deadline_ends_before_nginx_stops_waiting(void **state)
{
    int64_t  wait;

    (void) state;

    assert_int_equal(llmgw_plugin_call_deadline(10000), 7500);
    assert_int_equal(llmgw_plugin_call_deadline(5000), 2500);
    assert_int_equal(llmgw_plugin_call_deadline(2000), 1000);
    assert_int_equal(llmgw_plugin_call_deadline(1), 1);
    /* never over the runtime's largest deadline */
    assert_int_equal(llmgw_plugin_call_deadline(INT64_C(31622400000)),
                     600000);

    for (wait = 2; wait < 700000; wait += wait / 3 + 1) {
        assert_true(llmgw_plugin_call_deadline(wait) < wait);
        assert_true(llmgw_plugin_call_deadline(wait) >= wait / 2
                    || llmgw_plugin_call_deadline(wait) == 600000);
    }
}


int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_call_frame_names_sha_hook_and_args_as_written),
        cmocka_unit_test(test_call_frame_refuses_bad_hook_and_args),
        cmocka_unit_test(test_body_key),
        cmocka_unit_test(test_not_loaded),
        cmocka_unit_test(test_call_deadline_ends_before_nginx_stops_waiting),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
