/*
 * Ledger rows: the line of COPY text the writer sends, field by field, and
 * the statement that applies a new batch's charges.
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
#include "balances_seen.h"


/* The row's line, which must end in one newline and hold 18 fields. */
static char *
row_line(const llmgw_ledger_row_t *row)
{
    llmgw_buf_t   b = llmgw_ledger_row_copy(row);
    char         *s;
    size_t        tabs = 0, i;

    assert_non_null(b.data);
    assert_true(b.len > 0);
    assert_int_equal(b.data[b.len - 1], '\n');
    assert_null(memchr(b.data, '\n', b.len - 1));

    for (i = 0; i < b.len; i++) {
        tabs += b.data[i] == '\t';
    }
    assert_int_equal(tabs, 17);

    s = strndup(b.data, b.len);
    llmgw_buf_free(&b);

    return s;
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
test_ledger_columns_name_every_field_in_order(void **state)
{
    (void) state;

    assert_string_equal(LLMGW_LEDGER_COLUMNS,
        "request_id, type, user_id, token_id, channel_id, model_name, "
        "upstream_model, endpoint, channels_tried, prompt_tokens, "
        "completion_tokens, cache_read_tokens, cache_creation_tokens, quota, "
        "is_stream, status, latency_ms, created_at");
}


static void
test_ledger_row_values(void **state)
{
    llmgw_ledger_row_t   row = consume_row();
    char                *s = row_line(&row);
    (void) state;

    assert_string_equal(s,
        "20240101000000abcdef\tconsume\t5\t11\t9\tgpt-4o\tgpt-4o-2024-08-06\t"
        "chat\t[4,9]\t120\t30\t64\t8\t675\tt\t200\t1234\t"
        "2023-11-14 22:13:20.250+00\n");
    free(s);
}


static void
test_ledger_row_without_a_channel(void **state)
{
    llmgw_ledger_row_t   row = consume_row();
    char                *s;
    (void) state;

    row.type = "error";
    row.channel_id = 0;
    row.ntried = 0;
    row.tried = NULL;
    row.upstream_model = LLMGW_STR("");
    row.is_stream = 0;
    row.status = 503;
    row.quota = 0;
    row.created_at = 1700000000.9996;   /* rounds up into the next second */
    s = row_line(&row);

    assert_string_equal(s,
        "20240101000000abcdef\terror\t5\t11\t\\N\tgpt-4o\t\tchat\t[]\t"
        "120\t30\t64\t8\t0\tf\t503\t1234\t2023-11-14 22:13:21.000+00\n");
    free(s);
}


static void
test_ledger_row_keeps_large_ids_exact(void **state)
{
    llmgw_ledger_row_t   row = consume_row();
    char                *s;
    (void) state;

    row.user_id = INT64_C(9007199254740993);    /* 2^53 + 1 */
    row.token_id = INT64_C(9223372036854775807);
    row.quota = INT64_C(-5000000000);           /* a refund */
    row.type = "refund";
    s = row_line(&row);

    assert_non_null(strstr(s, "\trefund\t9007199254740993\t"
                              "9223372036854775807\t"));
    assert_non_null(strstr(s, "\t-5000000000\tt\t"));
    free(s);
}


static void
test_ledger_row_text_is_escaped(void **state)
{
    llmgw_ledger_row_t   row = consume_row();
    char                *s;
    (void) state;

    /* tab, newline, CR and backslash escaped; NUL dropped; bad UTF-8 */
    row.model = (llmgw_str_t) { "a\tb\nc\rd\\e\0f\xc3\xa9\xff", 15 };
    s = row_line(&row);

    assert_non_null(strstr(s, "\t9\ta\\tb\\nc\\rd\\\\ef\xc3\xa9\xef\xbf\xbd\t"));
    free(s);
}


static void
test_flush_new_sql_sums_charges_per_id(void **state)
{
    const llmgw_charge_t  c[] = {
        { 7, 2, 100 }, { 3, 2, 50 }, { 7, 2, 25 }, { 0, 0, 0 },
        { 3, 1, -10 }, { 9, 1, 0 }
    };
    llmgw_buf_t           b;
    (void) state;

    b = llmgw_flush_new_sql(c, sizeof(c) / sizeof(c[0]));
    assert_non_null(b.data);
    assert_string_equal(b.data,
        "COPY logs (" LLMGW_LEDGER_COLUMNS ") FROM STDIN; "
        "SELECT llmgw_flush_apply('{3,7,9}','{40,125,0}',"
        "'{1,2}','{-10,175}')::text");
    llmgw_buf_free(&b);

    b = llmgw_flush_new_sql(c, 0);
    assert_non_null(b.data);
    assert_non_null(strstr(b.data, "llmgw_flush_apply('{}','{}','{}','{}')"));
    llmgw_buf_free(&b);
}


/* Balances come with their revisions; an answer without them says -1. */
static void
test_flush_answer_reports_balances_with_revisions(void **state)
{
    static const char with[] = "{\"inserted\":3,\"tokens\":{\"7\":470},"
        "\"users\":{\"2\":970},\"token_revs\":{\"7\":12},"
        "\"user_revs\":{\"2\":5}}";
    static const char without[] = "{\"tokens\":{\"7\":400},\"users\":{}}";
    seen_t s = { 0 };
    (void) state;

    assert_int_equal(llmgw_flush_answer(with, strlen(with), seen, &s), 0);
    assert_int_equal(s.n, 2);
    assert_int_equal(s.is_user[0], 0);
    assert_int_equal(s.id[0], 7);
    assert_int_equal(s.balance[0], 470);
    assert_int_equal(s.rev[0], 12);
    assert_int_equal(s.is_user[1], 1);
    assert_int_equal(s.balance[1], 970);
    assert_int_equal(s.rev[1], 5);

    s.n = 0;
    assert_int_equal(llmgw_flush_answer(without, strlen(without), seen, &s),
                     0);
    assert_int_equal(s.n, 1);
    assert_int_equal(s.balance[0], 400);
    assert_int_equal(s.rev[0], -1);
}


int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ledger_columns_name_every_field_in_order),
        cmocka_unit_test(test_ledger_row_values),
        cmocka_unit_test(test_flush_answer_reports_balances_with_revisions),
        cmocka_unit_test(test_ledger_row_without_a_channel),
        cmocka_unit_test(test_ledger_row_keeps_large_ids_exact),
        cmocka_unit_test(test_ledger_row_text_is_escaped),
        cmocka_unit_test(test_flush_new_sql_sums_charges_per_id),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
