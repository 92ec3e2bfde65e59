/*
 * Key records and the Authentication checks: 401 Invalid token for a
 * disabled, expired or exhausted key or a disabled user; 403 for an address
 * outside the allow list or a model outside the key's list; the effective
 * group.
 */

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "llmgw.h"


#define NOW  1700000000


/*
 * A key record as llmgw_token_lookup() returns it, with single quotes for
 * readability; "extra" replaces or adds members after the defaults (jansson
 * keeps the last of duplicate keys).
 */
static llmgw_token_t *
token(const char *extra, const char *user_status, const char *user_group)
{
    char            buf[2048];
    llmgw_token_t  *t;

    snprintf(buf, sizeof(buf),
             "{'id':11,'user_id':5,'name':'ci','status':'enabled',"
             "'expired_time':-1,'remain_quota':1000,'used_quota':0,"
             "'unlimited_quota':false,'models':null,'allow_ips':null,"
             "'group':''%s%s,"
             "'user':{'id':5,'status':'%s','quota':0,'used_quota':0,"
             "'group':'%s'}}",
             extra[0] ? "," : "", extra, user_status, user_group);

    for (char *p = buf; *p; p++) {
        if (*p == '\'') {
            *p = '"';
        }
    }

    t = llmgw_token_parse(buf, strlen(buf));
    if (t == NULL) {
        fail_msg("token did not parse: %s", buf);
    }

    return t;
}


static llmgw_token_t *
tok(const char *extra)
{
    return token(extra, "enabled", "default");
}


static void
assert_str(llmgw_str_t got, const char *want)
{
    assert_int_equal(got.len, strlen(want));
    assert_memory_equal(got.data, want, got.len);
}


static llmgw_str_t
S(const char *s)
{
    return (llmgw_str_t) { s, strlen(s) };
}


static void
assert_invalid_token(const llmgw_token_t *t, int64_t now)
{
    llmgw_verdict_t v = { 0 };

    assert_int_equal(llmgw_token_check(t, now, &v), -1);
    assert_int_equal(v.status, 401);
    assert_string_equal(v.type, "gateway_error");
    assert_string_equal(v.message, "Invalid token");
}


static void
assert_token_ok(const llmgw_token_t *t, int64_t now)
{
    llmgw_verdict_t v = { 0 };

    assert_int_equal(llmgw_token_check(t, now, &v), 0);
    assert_int_equal(v.status, 0);
}


static void
test_token_parse_reads_ids(void **state)
{
    (void) state;

    llmgw_token_t *t = tok("'id':123456789012,'user_id':98765");

    assert_int_equal(llmgw_token_id(t), 123456789012LL);
    assert_int_equal(llmgw_token_user_id(t), 98765);
    llmgw_token_free(t);
}


static void
test_token_parse_refuses_what_is_not_an_object(void **state)
{
    static const char *const bad[] = { "", "null", "[]", "{\"id\":", "7" };
    (void) state;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_null(llmgw_token_parse(bad[i], strlen(bad[i])));
    }
}


static void
test_token_ref_keeps_it_alive_until_the_last_free(void **state)
{
    (void) state;

    llmgw_token_t *t = tok("'id':77");

    assert_ptr_equal(llmgw_token_ref(t), t);
    llmgw_token_free(t);
    /* one reference left: still readable (valgrind checks the rest) */
    assert_int_equal(llmgw_token_id(t), 77);
    llmgw_token_free(t);

    assert_null(llmgw_token_ref(NULL));
    llmgw_token_free(NULL);
}


static void
test_token_group_is_the_tokens_own_first(void **state)
{
    (void) state;

    llmgw_token_t *t = token("'group':'vip'", "enabled", "svip");

    assert_str(llmgw_token_group(t), "vip");
    llmgw_token_free(t);
}


static void
test_token_group_falls_back_to_the_users(void **state)
{
    (void) state;

    llmgw_token_t *t = token("'group':''", "enabled", "svip");

    assert_str(llmgw_token_group(t), "svip");
    llmgw_token_free(t);
}


static void
test_token_group_falls_back_to_default(void **state)
{
    (void) state;

    llmgw_token_t *t = token("'group':''", "enabled", "");

    assert_str(llmgw_token_group(t), "default");
    llmgw_token_free(t);
}


static void
test_token_check_enabled_key_passes(void **state)
{
    (void) state;

    llmgw_token_t *t = tok("");

    assert_token_ok(t, NOW);
    llmgw_token_free(t);
}


static void
test_token_check_disabled_key_is_401(void **state)
{
    (void) state;

    llmgw_token_t *t = tok("'status':'disabled'");

    assert_invalid_token(t, NOW);
    llmgw_token_free(t);
}


static void
test_token_check_disabled_user_is_401(void **state)
{
    (void) state;

    llmgw_token_t *t = token("", "disabled", "default");

    assert_invalid_token(t, NOW);
    llmgw_token_free(t);
}


static void
test_token_check_expired_at_or_before_now_is_401(void **state)
{
    char            extra[64];
    llmgw_token_t  *t;
    (void) state;

    snprintf(extra, sizeof(extra), "'expired_time':%d", NOW);
    t = tok(extra);
    assert_invalid_token(t, NOW);        /* expires this very second */
    assert_invalid_token(t, NOW + 1);
    assert_token_ok(t, NOW - 1);
    llmgw_token_free(t);
}


static void
test_token_check_expired_time_minus_one_never_expires(void **state)
{
    (void) state;

    llmgw_token_t *t = tok("'expired_time':-1");

    assert_token_ok(t, NOW);
    assert_token_ok(t, INT64_MAX);
    llmgw_token_free(t);
}


static void
test_token_check_exhausted_quota_is_401(void **state)
{
    (void) state;

    llmgw_token_t *t = tok("'remain_quota':0,'unlimited_quota':false");

    assert_invalid_token(t, NOW);
    llmgw_token_free(t);

    t = tok("'remain_quota':-20,'unlimited_quota':false");
    assert_invalid_token(t, NOW);
    llmgw_token_free(t);

    t = tok("'remain_quota':1,'unlimited_quota':false");
    assert_token_ok(t, NOW);
    llmgw_token_free(t);
}


static void
test_token_check_unlimited_with_zero_remaining_passes(void **state)
{
    (void) state;

    llmgw_token_t *t = tok("'remain_quota':0,'unlimited_quota':true");

    assert_token_ok(t, NOW);
    llmgw_token_free(t);
}


static int
check_ip(const llmgw_token_t *t, const char *ip, llmgw_verdict_t *v)
{
    uint8_t addr[16];

    if (inet_pton(AF_INET, ip, addr) == 1) {
        return llmgw_token_check_ip(t, AF_INET, addr, ip, v);
    }

    assert_int_equal(inet_pton(AF_INET6, ip, addr), 1);
    return llmgw_token_check_ip(t, AF_INET6, addr, ip, v);
}


static void
assert_ip_denied(const llmgw_token_t *t, const char *ip)
{
    llmgw_verdict_t v = { 0 };

    if (check_ip(t, ip, &v) != -1) {
        fail_msg("%s was admitted", ip);
    }
    assert_int_equal(v.status, 403);
    assert_string_equal(v.type, "gateway_error");
    assert_string_equal(v.code, "access_denied");
    /* the caller learns which address was refused */
    assert_non_null(strstr(v.message, ip));
}


static void
assert_ip_allowed(const llmgw_token_t *t, const char *ip)
{
    llmgw_verdict_t v = { 0 };

    if (check_ip(t, ip, &v) != 0) {
        fail_msg("%s was refused: %s", ip, v.message);
    }
}


static void
test_check_ip_allow_list_v4_v6_and_cidr(void **state)
{
    (void) state;

    llmgw_token_t *t = tok("'allow_ips':['192.168.1.5','10.0.0.0/8',"
                           "'2001:db8::/32','::1']");

    assert_ip_allowed(t, "192.168.1.5");
    assert_ip_allowed(t, "10.200.3.4");
    assert_ip_allowed(t, "2001:db8:1::7");
    assert_ip_allowed(t, "::1");

    assert_ip_denied(t, "192.168.1.6");
    assert_ip_denied(t, "11.0.0.1");
    assert_ip_denied(t, "2001:db9::1");
    assert_ip_denied(t, "::2");
    llmgw_token_free(t);
}


static void
test_check_ip_unreadable_list_admits_nobody(void **state)
{
    (void) state;

    /* short IPv4 forms some parsers take ("10/8"), one among good ones */
    llmgw_token_t *t = tok("'allow_ips':['10/8','10.0.0.0/8']");

    assert_non_null(t);
    assert_ip_denied(t, "10.1.2.3");
    assert_ip_denied(t, "127.0.0.1");
    assert_ip_denied(t, "::1");
    llmgw_token_free(t);
}


static void
test_check_ip_null_or_empty_list_admits_any_address(void **state)
{
    (void) state;

    llmgw_token_t *t = tok("'allow_ips':null");

    assert_ip_allowed(t, "203.0.113.9");
    assert_ip_allowed(t, "2001:db8::9");
    llmgw_token_free(t);

    t = tok("'allow_ips':[]");
    assert_ip_allowed(t, "203.0.113.9");
    assert_ip_allowed(t, "2001:db8::9");
    llmgw_token_free(t);
}


static void
test_check_model_null_allows_every_model(void **state)
{
    (void) state;

    llmgw_token_t    *t = tok("'models':null");
    llmgw_verdict_t   v = { 0 };

    assert_int_equal(llmgw_token_check_model(t, S("gpt-4o"), &v), 0);
    assert_int_equal(llmgw_token_check_model(t, S("anything"), &v), 0);
    llmgw_token_free(t);
}


static void
test_check_model_empty_list_is_no_access_to_any_model(void **state)
{
    (void) state;

    llmgw_token_t    *t = tok("'models':[]");
    llmgw_verdict_t   v = { 0 };

    assert_int_equal(llmgw_token_check_model(t, S("gpt-4o"), &v), -1);
    assert_int_equal(v.status, 403);
    assert_string_equal(v.type, "gateway_error");
    assert_string_equal(v.message, "no access to any model");
    llmgw_token_free(t);
}


static void
test_check_model_missing_is_no_access_to_model_x(void **state)
{
    (void) state;

    llmgw_token_t    *t = tok("'models':['gpt-4o','claude-3-5-sonnet']");
    llmgw_verdict_t   v = { 0 };

    assert_int_equal(llmgw_token_check_model(t, S("gpt-4o"), &v), 0);
    assert_int_equal(llmgw_token_check_model(t, S("claude-3-5-sonnet"), &v),
                     0);

    assert_int_equal(llmgw_token_check_model(t, S("gpt-4"), &v), -1);
    assert_int_equal(v.status, 403);
    assert_string_equal(v.type, "gateway_error");
    assert_string_equal(v.message, "no access to model gpt-4");

    memset(&v, 0, sizeof(v));
    assert_int_equal(llmgw_token_check_model(t, S("gpt-4o "), &v), -1);
    assert_string_equal(v.message, "no access to model gpt-4o ");

    /* a NUL or another control character does not end the name shown */
    memset(&v, 0, sizeof(v));
    llmgw_str_t nul = { "gpt-4o\0evil\n", 12 };
    assert_int_equal(llmgw_token_check_model(t, nul, &v), -1);
    assert_string_equal(v.message, "no access to model gpt-4o\\u0000evil\\u000a");

    /* 200 bytes at most, not into a character */
    char long_name[300];
    memset(long_name, 'a', sizeof(long_name));
    memcpy(long_name + 199, "\xc3\xa9", 2);
    memset(&v, 0, sizeof(v));
    llmgw_str_t lm = { long_name, sizeof(long_name) };
    assert_int_equal(llmgw_token_check_model(t, lm, &v), -1);
    assert_int_equal(strlen(v.message), strlen("no access to model ") + 199);
    llmgw_token_free(t);
}


int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_token_parse_reads_ids),
        cmocka_unit_test(test_token_parse_refuses_what_is_not_an_object),
        cmocka_unit_test(test_token_ref_keeps_it_alive_until_the_last_free),
        cmocka_unit_test(test_token_group_is_the_tokens_own_first),
        cmocka_unit_test(test_token_group_falls_back_to_the_users),
        cmocka_unit_test(test_token_group_falls_back_to_default),
        cmocka_unit_test(test_token_check_enabled_key_passes),
        cmocka_unit_test(test_token_check_disabled_key_is_401),
        cmocka_unit_test(test_token_check_disabled_user_is_401),
        cmocka_unit_test(test_token_check_expired_at_or_before_now_is_401),
        cmocka_unit_test(
            test_token_check_expired_time_minus_one_never_expires),
        cmocka_unit_test(test_token_check_exhausted_quota_is_401),
        cmocka_unit_test(
            test_token_check_unlimited_with_zero_remaining_passes),
        cmocka_unit_test(test_check_ip_allow_list_v4_v6_and_cidr),
        cmocka_unit_test(test_check_ip_null_or_empty_list_admits_any_address),
        cmocka_unit_test(test_check_ip_unreadable_list_admits_nobody),
        cmocka_unit_test(test_check_model_null_allows_every_model),
        cmocka_unit_test(
            test_check_model_empty_list_is_no_access_to_any_model),
        cmocka_unit_test(test_check_model_missing_is_no_access_to_model_x),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
