/*
 * Ledger rows: the JSON object llmgw_flush() reads, field by field.
 */

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <string.h>

#include "llmgw.h"


static json_t *
row_json(const llmgw_ledger_row_t *row)
{
    llmgw_buf_t   b = llmgw_ledger_row_json(row);
    json_error_t  err;
    json_t       *j;

    assert_non_null(b.data);
    j = json_loadb(b.data, b.len, 0, &err);
    if (!json_is_object(j)) {
        fail_msg("not a JSON object: %s", b.data);
    }
    llmgw_buf_free(&b);

    return j;
}


static const char *
str_of(const json_t *j, const char *key)
{
    const char *s = json_string_value(json_object_get(j, key));

    if (s == NULL) {
        fail_msg("%s is not a string", key);
    }

    return s;
}


static int64_t
int_of(const json_t *j, const char *key)
{
    json_t *v = json_object_get(j, key);

    if (!json_is_integer(v)) {
        fail_msg("%s is not an integer", key);
    }

    return json_integer_value(v);
}


static const int64_t tried[] = { 4, 9 };

static llmgw_ledger_row_t
consume_row(void)
{
    llmgw_ledger_row_t row;

    memset(&row, 0, sizeof(row));
    row.request_id = "20240101000000abcdef";
    row.type = "consume";
    row.user_id = 5;
    row.token_id = 11;
    row.channel_id = 9;
    row.model = LLMGW_STR("gpt-4o");
    row.upstream_model = LLMGW_STR("gpt-4o-2024-08-06");
    row.endpoint = LLMGW_STR("chat");
    row.tried = tried;
    row.ntried = 2;
    row.usage.prompt_tokens = 120;
    row.usage.completion_tokens = 30;
    row.usage.cache_read_tokens = 64;
    row.usage.cache_creation_tokens = 8;
    row.usage.known = 1;
    row.quota = 675;
    row.is_stream = 1;
    row.status = 200;
    row.latency_ms = 1234;
    row.created_at = 1700000000.25;

    return row;
}


static void
test_ledger_row_names_and_values(void **state)
{
    llmgw_ledger_row_t   row = consume_row();
    json_t              *j = row_json(&row);
    json_t              *t;
    (void) state;

    assert_string_equal(str_of(j, "request_id"), "20240101000000abcdef");
    assert_string_equal(str_of(j, "type"), "consume");
    assert_int_equal(int_of(j, "user_id"), 5);
    assert_int_equal(int_of(j, "token_id"), 11);
    assert_int_equal(int_of(j, "channel_id"), 9);
    assert_string_equal(str_of(j, "model_name"), "gpt-4o");
    assert_string_equal(str_of(j, "upstream_model"), "gpt-4o-2024-08-06");
    assert_string_equal(str_of(j, "endpoint"), "chat");

    t = json_object_get(j, "channels_tried");
    assert_true(json_is_array(t));
    assert_int_equal(json_array_size(t), 2);
    assert_int_equal(json_integer_value(json_array_get(t, 0)), 4);
    assert_int_equal(json_integer_value(json_array_get(t, 1)), 9);

    assert_int_equal(int_of(j, "prompt_tokens"), 120);
    assert_int_equal(int_of(j, "completion_tokens"), 30);
    assert_int_equal(int_of(j, "cache_read_tokens"), 64);
    assert_int_equal(int_of(j, "cache_creation_tokens"), 8);
    assert_int_equal(int_of(j, "quota"), 675);
    assert_true(json_is_true(json_object_get(j, "is_stream")));
    assert_int_equal(int_of(j, "status"), 200);
    assert_int_equal(int_of(j, "latency_ms"), 1234);
    assert_true(json_is_number(json_object_get(j, "created_at")));
    assert_true(fabs(json_number_value(json_object_get(j, "created_at"))
                     - 1700000000.25) < 1e-6);
    json_decref(j);
}


static void
test_ledger_row_channel_id_is_null_without_a_channel(void **state)
{
    llmgw_ledger_row_t   row = consume_row();
    json_t              *j, *t;
    (void) state;

    row.type = "error";
    row.channel_id = 0;
    row.ntried = 0;
    row.tried = NULL;
    row.upstream_model = LLMGW_STR("");
    row.is_stream = 0;
    row.status = 503;
    row.quota = 0;
    j = row_json(&row);

    assert_string_equal(str_of(j, "type"), "error");
    assert_true(json_is_null(json_object_get(j, "channel_id")));
    t = json_object_get(j, "channels_tried");
    assert_true(json_is_array(t));
    assert_int_equal(json_array_size(t), 0);
    assert_true(json_is_false(json_object_get(j, "is_stream")));
    assert_int_equal(int_of(j, "status"), 503);
    assert_int_equal(int_of(j, "quota"), 0);
    json_decref(j);
}


static void
test_ledger_row_keeps_large_ids_exact(void **state)
{
    llmgw_ledger_row_t   row = consume_row();
    json_t              *j;
    (void) state;

    row.user_id = INT64_C(9007199254740993);    /* 2^53 + 1 */
    row.token_id = INT64_C(9223372036854775807);
    row.quota = INT64_C(-5000000000);           /* a refund */
    row.type = "refund";
    j = row_json(&row);

    assert_int_equal(int_of(j, "user_id"), INT64_C(9007199254740993));
    assert_int_equal(int_of(j, "token_id"), INT64_C(9223372036854775807));
    assert_int_equal(int_of(j, "quota"), INT64_C(-5000000000));
    json_decref(j);
}


static void
test_ledger_row_model_text_is_escaped(void **state)
{
    llmgw_ledger_row_t   row = consume_row();
    json_t              *j;
    (void) state;

    row.model = LLMGW_STR("a\"b\\c\n\xc3\xa9");
    j = row_json(&row);

    assert_string_equal(str_of(j, "model_name"), "a\"b\\c\n\xc3\xa9");
    json_decref(j);
}


int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ledger_row_names_and_values),
        cmocka_unit_test(test_ledger_row_channel_id_is_null_without_a_channel),
        cmocka_unit_test(test_ledger_row_keeps_large_ids_exact),
        cmocka_unit_test(test_ledger_row_model_text_is_escaped),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
