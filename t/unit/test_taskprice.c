/*
 * Task pricing: the usage schema chosen for a task, the check of usage
 * facts against it, and exact quotas under per-call, per-unit and
 * per-token pricing entries (500,000 quota = 1 USD).
 */

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "llmgw.h"
#include "taskprice.h"


#define S(s)  ((llmgw_str_t) { (s), strlen(s) })

static const char MANIFEST[] =
    "{\"key\":\"vid\",\"models\":[\"v\",\"v-pro\",\"v-lite\"],"
    "\"usageSchema\":{\"seconds\":{\"type\":\"number\",\"unit\":\"second\"}},"
    "\"usageProfiles\":["
    "{\"models\":[\"v-pro\"],\"schema\":{"
    "\"frames\":{\"type\":\"number\",\"unit\":\"count\"}}},"
    "{\"models\":[\"v-lite\"],\"schema\":{}}]}";

static const char SCHEMA[] =
    "{\"seconds\":{\"type\":\"number\",\"unit\":\"second\"},"
    "\"input_tokens\":{\"type\":\"number\",\"unit\":\"token\"},"
    "\"output_tokens\":{\"type\":\"number\",\"unit\":\"token\"},"
    "\"audio\":{\"type\":\"boolean\"},"
    "\"resolution\":{\"enum\":[\"720p\",\"1080p\"]}}";

static const char UNIT_ENTRY[] =
    "{\"unit_prices\":{\"seconds\":0.1,\"frames\":0.001},"
    "\"multipliers\":{\"resolution\":{\"720p\":1,\"1080p\":1.5},"
    "\"audio\":{\"true\":2,\"false\":1}}}";


static char *
schema_for(const char *manifest, const char *upstream, const char *model)
{
    llmgw_buf_t b;
    static char out[1024];

    assert_int_equal(llmgw_task_usage_schema(manifest, strlen(manifest),
                                             S(upstream), S(model), &b), 0);
    assert_non_null(b.data);
    assert_true(b.len < sizeof(out));
    memcpy(out, b.data, b.len);
    out[b.len] = '\0';
    llmgw_buf_free(&b);
    return out;
}


static int64_t
quota(const char *entry, const char *facts, double group_ratio)
{
    int64_t q = -1;
    char err[256] = "";

    if (llmgw_task_quota(entry, strlen(entry), facts,
                         facts ? strlen(facts) : 0, group_ratio, &q,
                         err, sizeof(err)) != 0)
    {
        fail_msg("llmgw_task_quota: %s", err);
    }
    return q;
}


/* The error of a refused quota. */
static const char *
quota_err(const char *entry, const char *facts, double group_ratio)
{
    static char err[256];
    int64_t q = 7;

    err[0] = '\0';
    assert_int_equal(llmgw_task_quota(entry, strlen(entry), facts,
                                      facts ? strlen(facts) : 0, group_ratio,
                                      &q, err, sizeof(err)), -1);
    assert_int_equal(q, 0);
    return err;
}


static const char *
check_err(const char *schema, const char *facts)
{
    static char err[256];

    err[0] = '\0';
    assert_int_equal(llmgw_task_usage_check(schema, strlen(schema), facts,
                                            strlen(facts), err, sizeof(err)),
                     -1);
    return err;
}


static int
check_ok(const char *schema, const char *facts)
{
    char err[256] = "";

    return llmgw_task_usage_check(schema, strlen(schema), facts,
                                  facts ? strlen(facts) : 0, err,
                                  sizeof(err));
}


/* ---- the usage schema ---- */

static void
test_schema_profile_of_the_upstream_model_wins(void **state)
{
    (void) state;
    /* the client asked for v-lite, the channel mapped it to v-pro */
    assert_string_equal(schema_for(MANIFEST, "v-pro", "v-lite"),
        "{\"frames\":{\"type\":\"number\",\"unit\":\"count\"}}");
}

static void
test_schema_profile_of_the_client_model_when_upstream_has_none(void **state)
{
    (void) state;
    assert_string_equal(schema_for(MANIFEST, "v-2024", "v-pro"),
        "{\"frames\":{\"type\":\"number\",\"unit\":\"count\"}}");
}

static void
test_schema_empty_profile_replaces_the_defaults(void **state)
{
    (void) state;
    assert_string_equal(schema_for(MANIFEST, "", "v-lite"), "{}");
}

static void
test_schema_defaults_without_a_profile(void **state)
{
    (void) state;
    assert_string_equal(schema_for(MANIFEST, "v", "v"),
        "{\"seconds\":{\"type\":\"number\",\"unit\":\"second\"}}");
}

static void
test_schema_is_empty_when_the_manifest_declares_none(void **state)
{
    (void) state;
    assert_string_equal(schema_for("{\"key\":\"x\"}", "a", "b"), "{}");
}

static void
test_schema_refuses_a_manifest_that_is_not_an_object(void **state)
{
    llmgw_buf_t b = { (char *) "x", 1 };

    (void) state;
    assert_int_equal(llmgw_task_usage_schema("[1]", 3, S("a"), S("b"), &b),
                     -1);
    assert_null(b.data);
    assert_int_equal(llmgw_task_usage_schema("{bad", 4, S("a"), S("b"), &b),
                     -1);
}


/* ---- checking facts ---- */

static void
test_check_accepts_facts_of_the_schema(void **state)
{
    (void) state;
    assert_int_equal(check_ok(SCHEMA, "{\"seconds\":5.5,\"input_tokens\":0,"
                              "\"audio\":false,\"resolution\":\"1080p\"}"), 0);
    assert_int_equal(check_ok(SCHEMA, "{}"), 0);
}

static void
test_check_accepts_null_or_no_facts(void **state)
{
    (void) state;
    assert_int_equal(check_ok(SCHEMA, "null"), 0);
    assert_int_equal(check_ok(SCHEMA, NULL), 0);
}

static void
test_check_names_an_undeclared_fact(void **state)
{
    (void) state;
    assert_string_equal(check_err(SCHEMA, "{\"seconds\":1,\"width\":2}"),
        "usage fact \"width\" is not declared in the usage schema");
    assert_string_equal(check_err("{}", "{\"seconds\":1}"),
        "usage fact \"seconds\" is not declared in the usage schema");
}

static void
test_check_numbers_are_non_negative(void **state)
{
    (void) state;
    assert_string_equal(check_err(SCHEMA, "{\"seconds\":-1}"),
        "usage fact \"seconds\" must be a finite number >= 0");
    assert_string_equal(check_err(SCHEMA, "{\"seconds\":\"5\"}"),
        "usage fact \"seconds\" must be a finite number >= 0");
    assert_string_equal(check_err(SCHEMA, "{\"seconds\":null}"),
        "usage fact \"seconds\" must be a finite number >= 0");
}

static void
test_check_booleans_and_enums(void **state)
{
    (void) state;
    assert_string_equal(check_err(SCHEMA, "{\"audio\":1}"),
        "usage fact \"audio\" must be true or false");
    assert_string_equal(check_err(SCHEMA, "{\"resolution\":\"4k\"}"),
        "usage fact \"resolution\" must be one of \"720p\", \"1080p\"");
    assert_string_equal(check_err(SCHEMA, "{\"resolution\":true}"),
        "usage fact \"resolution\" must be one of \"720p\", \"1080p\"");
}

static void
test_check_refuses_facts_that_are_not_an_object(void **state)
{
    (void) state;
    assert_string_equal(check_err(SCHEMA, "[1]"),
        "usage facts must be a JSON object or null");
    assert_string_equal(check_err(SCHEMA, "{\"a\":"),
        "usage facts must be a JSON object or null");
}

static void
test_check_error_is_cut_to_the_buffer(void **state)
{
    char err[8];

    (void) state;
    assert_int_equal(llmgw_task_usage_check(SCHEMA, strlen(SCHEMA),
                                            "{\"zz\":1}", 8, err,
                                            sizeof(err)), -1);
    assert_string_equal(err, "usage f");
}


/* ---- quotas ---- */

static void
test_quota_per_call_price(void **state)
{
    (void) state;
    /* 0.04 USD x 500,000 */
    assert_int_equal(quota("{\"price\":0.04}", NULL, 1), 20000);
    assert_int_equal(quota("{\"price\":0.04}", "{\"seconds\":99}", 1.5),
                     30000);
    assert_int_equal(quota("{\"price\":0}", NULL, 1), 0);
}

static void
test_quota_unit_prices_sum_over_facts(void **state)
{
    (void) state;
    /* 5 s x 0.1 + 200 frames x 0.001 = 0.7 USD */
    assert_int_equal(quota(UNIT_ENTRY, "{\"seconds\":5,\"frames\":200}", 1),
                     350000);
}

static void
test_quota_unit_prices_missing_facts_count_zero(void **state)
{
    (void) state;
    assert_int_equal(quota(UNIT_ENTRY, "{\"seconds\":2}", 1), 100000);
    assert_int_equal(quota(UNIT_ENTRY, "{}", 1), 0);
    assert_int_equal(quota(UNIT_ENTRY, "null", 1), 0);
    assert_int_equal(quota(UNIT_ENTRY, NULL, 1), 0);
}

static void
test_quota_multipliers_for_enum_and_boolean_facts(void **state)
{
    (void) state;
    /* 0.5 USD x 1.5 (1080p) x 2 (audio) x group 0.5 */
    assert_int_equal(quota(UNIT_ENTRY, "{\"seconds\":5,\"resolution\":"
                           "\"1080p\",\"audio\":true}", 0.5), 375000);
    assert_int_equal(quota(UNIT_ENTRY, "{\"seconds\":5,\"resolution\":"
                           "\"1080p\",\"audio\":false}", 1), 375000);
    /* a value the table does not list multiplies by 1 */
    assert_int_equal(quota(UNIT_ENTRY, "{\"seconds\":5,\"resolution\":"
                           "\"4k\"}", 1), 250000);
    /* a zero factor makes the call free */
    assert_int_equal(quota("{\"unit_prices\":{\"seconds\":1},\"multipliers\":"
                           "{\"draft\":{\"true\":0}}}",
                           "{\"seconds\":3,\"draft\":true}", 1), 0);
}

static void
test_quota_without_multipliers(void **state)
{
    (void) state;
    assert_int_equal(quota("{\"unit_prices\":{\"seconds\":0.02}}",
                           "{\"seconds\":10,\"resolution\":\"1080p\"}", 2),
                     200000);
}

static void
test_quota_rounds_to_the_nearest_unit(void **state)
{
    (void) state;
    /* 3 tokens x 0.5 = 1.5 -> 2; 0.7 -> 1; 0.3 -> 0 */
    assert_int_equal(quota("{\"ratio\":0.5}", "{\"t\":3}", 1), 2);
    assert_int_equal(quota("{\"unit_prices\":{\"s\":1}}",
                           "{\"s\":0.0000014}", 1), 1);
    assert_int_equal(quota("{\"unit_prices\":{\"s\":1}}",
                           "{\"s\":0.0000006}", 1), 0);
    /* 150 x 0.3 x 0.7 = 31.5 (31.499999999999996 in doubles) -> 32 */
    assert_int_equal(quota("{\"ratio\":0.3}", "{\"t\":150}", 0.7), 32);
}

static void
test_quota_ratio_counts_token_facts(void **state)
{
    int64_t q = -1;
    char err[128] = "";
    const char *entry = "{\"ratio\":2,\"completion_ratio\":4}";
    const char *facts = "{\"input_tokens\":100,\"output_tokens\":50,"
                        "\"seconds\":10,\"audio\":true}";

    (void) state;
    /* completion_ratio is ignored: task usage has no completion side */
    assert_int_equal(llmgw_task_quota_schema(entry, strlen(entry), SCHEMA,
                                             strlen(SCHEMA), facts,
                                             strlen(facts), 1.5, &q, err,
                                             sizeof(err)), 0);
    assert_int_equal(q, 450);
    /* without a schema every numeric fact counts */
    assert_int_equal(quota(entry, facts, 1), 320);
}

static void
test_quota_schema_variant_prices_units_like_the_plain_one(void **state)
{
    int64_t q = -1;
    char err[128] = "";
    const char *facts = "{\"seconds\":5,\"resolution\":\"1080p\"}";

    (void) state;
    assert_int_equal(llmgw_task_quota_schema(UNIT_ENTRY, strlen(UNIT_ENTRY),
                                             NULL, 0, facts, strlen(facts),
                                             1, &q, err, sizeof(err)), 0);
    assert_int_equal(q, 375000);
}

static void
test_quota_refuses_unusable_entries(void **state)
{
    (void) state;
    assert_string_equal(quota_err("[1]", NULL, 1),
                        "the pricing entry is not a JSON object");
    assert_string_equal(quota_err("{}", NULL, 1),
                        "the pricing entry has no price, unit_prices or ratio");
    assert_string_equal(quota_err("{\"price\":-1}", NULL, 1),
                        "price must be a number >= 0");
    assert_string_equal(quota_err("{\"price\":\"1\"}", NULL, 1),
                        "price must be a number >= 0");
    assert_string_equal(quota_err("{\"unit_prices\":{}}", NULL, 1),
                        "unit_prices must be a non-empty object");
    assert_string_equal(quota_err("{\"unit_prices\":{\"s\":-0.1}}", NULL, 1),
                        "unit_prices.s must be a number >= 0");
    assert_string_equal(quota_err("{\"unit_prices\":{\"s\":1},\"multipliers\":"
                                  "{\"r\":{\"hd\":\"x\"}}}",
                                  "{\"r\":\"hd\"}", 1),
                        "multipliers.r.hd must be a number >= 0");
    assert_string_equal(quota_err("{\"unit_prices\":{\"s\":1},\"multipliers\":"
                                  "{\"r\":2}}", NULL, 1),
                        "multipliers.r must be an object of value to factor");
}

static void
test_quota_refuses_bad_facts_and_ratios(void **state)
{
    (void) state;
    assert_string_equal(quota_err(UNIT_ENTRY, "[]", 1),
                        "usage facts must be a JSON object or null");
    assert_string_equal(quota_err(UNIT_ENTRY, "{\"seconds\":-2}", 1),
                        "usage fact \"seconds\" must be a finite number >= 0");
    assert_string_equal(quota_err("{\"price\":1}", NULL, -1),
                        "group ratio must be a finite number >= 0");
    assert_string_equal(quota_err("{\"price\":1}", NULL, NAN),
                        "group ratio must be a finite number >= 0");
    assert_string_equal(quota_err("{\"price\":1e300}", NULL, 1),
                        "the quota is out of range");
}


int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_schema_profile_of_the_upstream_model_wins),
        cmocka_unit_test(
            test_schema_profile_of_the_client_model_when_upstream_has_none),
        cmocka_unit_test(test_schema_empty_profile_replaces_the_defaults),
        cmocka_unit_test(test_schema_defaults_without_a_profile),
        cmocka_unit_test(
            test_schema_is_empty_when_the_manifest_declares_none),
        cmocka_unit_test(
            test_schema_refuses_a_manifest_that_is_not_an_object),
        cmocka_unit_test(test_check_accepts_facts_of_the_schema),
        cmocka_unit_test(test_check_accepts_null_or_no_facts),
        cmocka_unit_test(test_check_names_an_undeclared_fact),
        cmocka_unit_test(test_check_numbers_are_non_negative),
        cmocka_unit_test(test_check_booleans_and_enums),
        cmocka_unit_test(test_check_refuses_facts_that_are_not_an_object),
        cmocka_unit_test(test_check_error_is_cut_to_the_buffer),
        cmocka_unit_test(test_quota_per_call_price),
        cmocka_unit_test(test_quota_unit_prices_sum_over_facts),
        cmocka_unit_test(test_quota_unit_prices_missing_facts_count_zero),
        cmocka_unit_test(test_quota_multipliers_for_enum_and_boolean_facts),
        cmocka_unit_test(test_quota_without_multipliers),
        cmocka_unit_test(test_quota_rounds_to_the_nearest_unit),
        cmocka_unit_test(test_quota_ratio_counts_token_facts),
        cmocka_unit_test(
            test_quota_schema_variant_prices_units_like_the_plain_one),
        cmocka_unit_test(test_quota_refuses_unusable_entries),
        cmocka_unit_test(test_quota_refuses_bad_facts_and_ratios),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
