/*
 * Key hashing (what the database stores), constant-time comparison and key
 * generation.
 */

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "llmgw.h"


#define SHA256_ABC \
    "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
#define SHA256_SK_ABC \
    "1460db1b6902f8b1fc2a40d9381a24d0fd22c3bc1b2c6f999c521da73776fbe0"


static int
hash(const char *key, size_t len, char out[65])
{
    llmgw_str_t k = { key, len };

    memset(out, 'Z', 65);
    return llmgw_key_hash(k, out);
}


static void
test_key_hash_is_lowercase_sha256_hex(void **state)
{
    char out[65];

    assert_int_equal(hash("abc", 3, out), 0);
    assert_string_equal(out, SHA256_ABC);
}


static void
test_sk_prefix_is_stripped_before_hashing(void **state)
{
    char out[65];

    assert_int_equal(hash("sk-abc", 6, out), 0);
    assert_string_equal(out, SHA256_ABC);
}


static void
test_only_one_sk_prefix_is_stripped(void **state)
{
    char out[65];

    assert_int_equal(hash("sk-sk-abc", 9, out), 0);
    assert_string_equal(out, SHA256_SK_ABC);
}


static void
test_empty_key_is_rejected(void **state)
{
    char out[65];

    assert_int_equal(hash("", 0, out), -1);
    assert_int_equal(hash("sk-", 3, out), -1);
}


static void
test_bytes_outside_printable_ascii_are_rejected(void **state)
{
    char out[65];

    assert_int_equal(hash("ab c", 4, out), -1);
    assert_int_equal(hash("abc\t", 4, out), -1);
    assert_int_equal(hash("ab\x7f", 3, out), -1);
    assert_int_equal(hash("ab\xc3\xa9", 4, out), -1);
    assert_int_equal(hash("ab\0c", 4, out), -1);
    assert_int_equal(hash("sk- abc", 7, out), -1);
}


static void
test_printable_ascii_edges_are_accepted(void **state)
{
    char out[65];

    assert_int_equal(hash("!~", 2, out), 0);
    assert_string_equal(out,
        "040731f7e1c01eb3a4f23b002c50e1a1f6be1951c63dd899771de509e9ceb918");
}


static void
test_ct_equal_compares_all_bytes(void **state)
{
    assert_int_equal(llmgw_ct_equal("abcdef", "abcdef", 6), 1);
    assert_int_equal(llmgw_ct_equal("abcdef", "abcdeg", 6), 0);
    assert_int_equal(llmgw_ct_equal("xbcdef", "abcdef", 6), 0);
    assert_int_equal(llmgw_ct_equal("abcdef", "abcdeg", 5), 1);
}


static void
test_generated_key_is_sk_and_48_lowercase_hex(void **state)
{
    char out[52];

    memset(out, 'Z', sizeof(out));
    assert_int_equal(llmgw_key_generate(out), 0);

    assert_int_equal(strlen(out), 51);
    assert_memory_equal(out, "sk-", 3);

    for (size_t i = 3; i < 51; i++) {
        assert_true((out[i] >= '0' && out[i] <= '9')
                    || (out[i] >= 'a' && out[i] <= 'f'));
    }
}


static void
test_generated_keys_differ_and_hash(void **state)
{
    char a[52], b[52], h[65];

    assert_int_equal(llmgw_key_generate(a), 0);
    assert_int_equal(llmgw_key_generate(b), 0);
    assert_string_not_equal(a, b);
    assert_int_equal(hash(a, strlen(a), h), 0);
}


static int
client(const char *key, char out[65])
{
    return llmgw_client_key_hash((llmgw_str_t) { (char *) key, strlen(key) },
                                 out);
}


static void
test_client_key_is_48_lowercase_hex_with_or_without_sk(void **state)
{
    char a[65], b[65], h[65];
    const char *hex = "0123456789abcdef0123456789abcdef0123456789abcdef";
    char with[52];

    snprintf(with, sizeof(with), "sk-%s", hex);

    assert_int_equal(client(hex, a), 0);
    assert_int_equal(client(with, b), 0);
    assert_string_equal(a, b);
    assert_int_equal(hash(hex, strlen(hex), h), 0);
    assert_string_equal(a, h);

    /* one short, one long, upper case, a non-hex letter, sk- only, "" */
    assert_int_equal(client("sk-0123456789abcdef0123456789abcdef0123456789abcde",
                            h), -1);
    assert_int_equal(client("0123456789abcdef0123456789abcdef0123456789abcdef0",
                            h), -1);
    assert_int_equal(client("0123456789ABCDEF0123456789abcdef0123456789abcdef",
                            h), -1);
    assert_int_equal(client("sk-0123456789abcdeg0123456789abcdef0123456789abcdef",
                            h), -1);
    assert_int_equal(client("sk-", h), -1);
    assert_int_equal(client("", h), -1);
    /* "sk-" twice is not a key either */
    assert_int_equal(client("sk-sk-0123456789abcdef0123456789abcdef0123456789abcdef",
                            h), -1);
}


static size_t
mask(char *query)
{
    return llmgw_query_key_mask(query, strlen(query));
}


static void
test_query_key_mask_hides_every_key_parameter_only(void **state)
{
    char q[] = "key=sk-abc&alt=sse&monkey=1&KEY=x%2By&key=&keys=2&key";

    assert_int_equal(mask(q), 2);
    assert_string_equal(q, "key=******&alt=sse&monkey=1&KEY=*****"
                           "&key=&keys=2&key");
}


/* $request and $request_uri show a fragment as the client sent it. */
static void
test_query_key_mask_goes_past_a_fragment_mark(void **state)
{
    char q[] = "alt=sse&key=sk-1#x&key=frag";
    char r[] = "alt=sse#&key=sk-2";
    char s[] = "alt=sse#key=sk-3&x=1";

    assert_int_equal(mask(q), 2);
    assert_string_equal(q, "alt=sse&key=******&key=****");
    assert_int_equal(mask(r), 1);
    assert_string_equal(r, "alt=sse#&key=****");
    assert_int_equal(mask(s), 1);
    assert_string_equal(s, "alt=sse#key=****&x=1");
}


/* Spellings ngx_http_arg() does not read are keys all the same. */
static void
test_query_key_mask_hides_percent_encoded_names(void **state)
{
    char q[] = "%6Bey=sk-1&k%65y=sk-2&%4B%45%59=sk-3&ke%79=&alt=sse";
    char r[] = "%6Be=sk-1&%6Beyy=sk-2&k%65y2=x&%2Bkey=y&%6B%65%79%00=z";

    assert_int_equal(mask(q), 3);
    assert_string_equal(q, "%6Bey=****&k%65y=****&%4B%45%59=****&ke%79="
                           "&alt=sse");
    assert_int_equal(llmgw_query_key_count(r, strlen(r)), 0);
    assert_int_equal(mask(r), 0);
    assert_string_equal(r, "%6Be=sk-1&%6Beyy=sk-2&k%65y2=x&%2Bkey=y"
                           "&%6B%65%79%00=z");
}


/* A value runs to the next '&', as ngx_http_arg() reads it. */
static void
test_query_key_mask_hides_keys_after_a_semicolon(void **state)
{
    char q[] = "a=1;key=sk-1&b=2;KEY=sk-2;c=3&d=4";
    char r[] = "key=sk-1;alt=sse&x=1";

    assert_int_equal(llmgw_query_key_count(q, strlen(q)), 2);
    assert_int_equal(mask(q), 2);
    assert_string_equal(q, "a=1;key=****&b=2;KEY=********&d=4");
    assert_int_equal(mask(r), 1);
    assert_string_equal(r, "key=************&x=1");
}


static void
test_query_key_mask_leaves_a_query_without_key(void **state)
{
    char q[] = "alt=sse&apikey=1&key2=3&x=key=4&%=key=5";

    assert_int_equal(mask(q), 0);
    assert_string_equal(q, "alt=sse&apikey=1&key2=3&x=key=4&%=key=5");
    assert_int_equal(llmgw_query_key_mask(q, 0), 0);
}


int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_key_hash_is_lowercase_sha256_hex),
        cmocka_unit_test(test_sk_prefix_is_stripped_before_hashing),
        cmocka_unit_test(test_only_one_sk_prefix_is_stripped),
        cmocka_unit_test(test_empty_key_is_rejected),
        cmocka_unit_test(
            test_client_key_is_48_lowercase_hex_with_or_without_sk),
        cmocka_unit_test(test_bytes_outside_printable_ascii_are_rejected),
        cmocka_unit_test(test_printable_ascii_edges_are_accepted),
        cmocka_unit_test(test_ct_equal_compares_all_bytes),
        cmocka_unit_test(test_generated_key_is_sk_and_48_lowercase_hex),
        cmocka_unit_test(test_generated_keys_differ_and_hash),
        cmocka_unit_test(test_query_key_mask_hides_every_key_parameter_only),
        cmocka_unit_test(test_query_key_mask_goes_past_a_fragment_mark),
        cmocka_unit_test(test_query_key_mask_hides_percent_encoded_names),
        cmocka_unit_test(test_query_key_mask_hides_keys_after_a_semicolon),
        cmocka_unit_test(test_query_key_mask_leaves_a_query_without_key),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
