/*
 * A key's IP allow list: IPv4 and IPv6 addresses and CIDRs, IPv4-mapped
 * clients, and errors that name the bad entry.  The addresses a content
 * fetch a plugin chose may reach, and the operator's list of exceptions.
 */

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <string.h>
#include <sys/socket.h>

#include "llmgw.h"


static llmgw_iplist_t *
parse_ok(const char *json)
{
    char             err[256] = "";
    llmgw_iplist_t  *l = llmgw_iplist_parse(json, strlen(json), err,
                                            sizeof(err));

    if (l == NULL) {
        fail_msg("%s: %s", json, err);
    }

    return l;
}


static void
assert_parse_error(const char *json, const char *want)
{
    char             err[256] = "";
    llmgw_iplist_t  *l = llmgw_iplist_parse(json, strlen(json), err,
                                            sizeof(err));

    assert_null(l);
    assert_string_equal(err, want);
}


typedef int (*addr_check_t)(const llmgw_iplist_t *l, int family,
    const uint8_t *addr);

/* check's answer for a textual address, IPv4 or IPv6. */
static int
check_text(addr_check_t check, const llmgw_iplist_t *l, const char *ip)
{
    uint8_t addr[16];

    if (inet_pton(AF_INET, ip, addr) == 1) {
        return check(l, AF_INET, addr);
    }

    assert_int_equal(inet_pton(AF_INET6, ip, addr), 1);
    return check(l, AF_INET6, addr);
}


/* 1 or 0 for a textual client address. */
static int
match(const llmgw_iplist_t *l, const char *ip)
{
    return check_text(llmgw_iplist_match, l, ip);
}


static void
test_ipv4_cidr_matches_inside_only(void **state)
{
    llmgw_iplist_t *l = parse_ok("[\"10.0.0.0/8\"]");

    assert_int_equal(match(l, "10.0.0.0"), 1);
    assert_int_equal(match(l, "10.255.255.255"), 1);
    assert_int_equal(match(l, "11.0.0.1"), 0);
    assert_int_equal(match(l, "9.255.255.255"), 0);
    llmgw_iplist_free(l);
}


static void
test_ipv4_address_matches_only_itself(void **state)
{
    llmgw_iplist_t *l = parse_ok("[\"127.0.0.1\"]");

    assert_int_equal(match(l, "127.0.0.1"), 1);
    assert_int_equal(match(l, "127.0.0.2"), 0);
    llmgw_iplist_free(l);
}


static void
test_ipv6_cidr_matches(void **state)
{
    llmgw_iplist_t *l = parse_ok("[\"2001:db8::/32\"]");

    assert_int_equal(match(l, "2001:db8::1"), 1);
    assert_int_equal(match(l, "2001:db8:ffff::9"), 1);
    assert_int_equal(match(l, "2001:db9::1"), 0);
    llmgw_iplist_free(l);
}


static void
test_ipv6_address_matches_only_itself(void **state)
{
    llmgw_iplist_t *l = parse_ok("[\"::1\"]");

    assert_int_equal(match(l, "::1"), 1);
    assert_int_equal(match(l, "::2"), 0);
    assert_int_equal(match(l, "127.0.0.1"), 0);
    llmgw_iplist_free(l);
}


static void
test_ipv4_mapped_client_matches_ipv4_entry(void **state)
{
    llmgw_iplist_t *l = parse_ok("[\"10.0.0.0/8\", \"192.0.2.7\"]");

    assert_int_equal(match(l, "::ffff:10.1.2.3"), 1);
    assert_int_equal(match(l, "::ffff:192.0.2.7"), 1);
    assert_int_equal(match(l, "::ffff:11.1.2.3"), 0);
    llmgw_iplist_free(l);
}


static void
test_ipv4_entry_does_not_match_native_ipv6(void **state)
{
    llmgw_iplist_t *l = parse_ok("[\"0.0.0.0/0\"]");

    assert_int_equal(match(l, "203.0.113.9"), 1);
    assert_int_equal(match(l, "2001:db8::1"), 0);
    /* the deprecated IPv4-compatible form is not IPv4 */
    assert_int_equal(match(l, "::10.0.0.1"), 0);
    llmgw_iplist_free(l);
}


static void
test_host_bits_set_are_masked(void **state)
{
    llmgw_iplist_t *l = parse_ok("[\"10.1.2.3/8\", \"2001:db8::1/32\"]");

    assert_int_equal(match(l, "10.200.0.1"), 1);
    assert_int_equal(match(l, "2001:db8:abcd::"), 1);
    assert_int_equal(match(l, "11.1.2.3"), 0);
    llmgw_iplist_free(l);
}


static void
test_prefix_not_on_byte_boundary(void **state)
{
    llmgw_iplist_t *l = parse_ok("[\"192.168.1.77/23\", \"2001:db8::/33\"]");

    assert_int_equal(match(l, "192.168.0.5"), 1);
    assert_int_equal(match(l, "192.168.1.200"), 1);
    assert_int_equal(match(l, "192.168.2.1"), 0);
    assert_int_equal(match(l, "2001:db8:7fff::1"), 1);
    assert_int_equal(match(l, "2001:db8:8000::1"), 0);
    llmgw_iplist_free(l);
}


static void
test_full_length_prefixes_are_exact(void **state)
{
    llmgw_iplist_t *l = parse_ok("[\"198.51.100.1/32\", \"2001:db8::5/128\"]");

    assert_int_equal(match(l, "198.51.100.1"), 1);
    assert_int_equal(match(l, "198.51.100.0"), 0);
    assert_int_equal(match(l, "2001:db8::5"), 1);
    assert_int_equal(match(l, "2001:db8::4"), 0);
    llmgw_iplist_free(l);
}


static void
test_any_entry_matching_admits(void **state)
{
    llmgw_iplist_t *l = parse_ok("[\"10.0.0.0/8\", \"::1\", \"172.16.0.1\"]");

    assert_int_equal(match(l, "172.16.0.1"), 1);
    assert_int_equal(match(l, "::1"), 1);
    assert_int_equal(match(l, "172.16.0.2"), 0);
    llmgw_iplist_free(l);
}


static void
test_whitespace_around_entry_is_ignored(void **state)
{
    llmgw_iplist_t *l = parse_ok("[\" 10.0.0.1 \"]");

    assert_int_equal(match(l, "10.0.0.1"), 1);
    llmgw_iplist_free(l);
}


static void
test_empty_list_is_no_restriction(void **state)
{
    llmgw_iplist_t *l = parse_ok("[]");

    assert_int_equal(match(l, "203.0.113.1"), 1);
    assert_int_equal(match(l, "2001:db8::1"), 1);
    llmgw_iplist_free(l);
}


static void
test_no_list_is_no_restriction(void **state)
{
    assert_int_equal(match(NULL, "203.0.113.1"), 1);
    llmgw_iplist_free(NULL);
}


static void
test_unknown_family_is_refused(void **state)
{
    llmgw_iplist_t  *l = parse_ok("[\"0.0.0.0/0\"]");
    uint8_t          addr[16] = { 0 };

    assert_int_equal(llmgw_iplist_match(l, AF_UNIX, addr), 0);
    llmgw_iplist_free(l);
}


static void
test_error_names_entry_index_and_text(void **state)
{
    assert_parse_error("[\"10.0.0.1\", \"::1\", \"abc\"]",
                       "allow_ips[2]: \"abc\" is not an IP address or CIDR");
}


static void
test_prefix_length_is_bounds_checked(void **state)
{
    assert_parse_error("[\"10.0.0.0/33\"]",
        "allow_ips[0]: \"10.0.0.0/33\" is not an IP address or CIDR");
    assert_parse_error("[\"::/129\"]",
        "allow_ips[0]: \"::/129\" is not an IP address or CIDR");
}


static void
test_malformed_prefix_is_rejected(void **state)
{
    assert_parse_error("[\"10.0.0.0/\"]",
        "allow_ips[0]: \"10.0.0.0/\" is not an IP address or CIDR");
    assert_parse_error("[\"10.0.0.0/-1\"]",
        "allow_ips[0]: \"10.0.0.0/-1\" is not an IP address or CIDR");
    assert_parse_error("[\"10.0.0.0/8/8\"]",
        "allow_ips[0]: \"10.0.0.0/8/8\" is not an IP address or CIDR");
    assert_parse_error("[\"10.0.0.0/0008\"]",
        "allow_ips[0]: \"10.0.0.0/0008\" is not an IP address or CIDR");
}


static void
test_malformed_addresses_are_rejected(void **state)
{
    assert_parse_error("[\"10.0.0\"]",
        "allow_ips[0]: \"10.0.0\" is not an IP address or CIDR");
    assert_parse_error("[\"256.0.0.1\"]",
        "allow_ips[0]: \"256.0.0.1\" is not an IP address or CIDR");
    assert_parse_error("[\"\"]",
        "allow_ips[0]: \"\" is not an IP address or CIDR");
    assert_parse_error("[\"/8\"]",
        "allow_ips[0]: \"/8\" is not an IP address or CIDR");
}


static void
test_non_string_entry_is_rejected(void **state)
{
    assert_parse_error("[\"::1\", 10]", "allow_ips[1]: not a string");
}


static void
test_non_array_is_rejected(void **state)
{
    assert_parse_error("{\"ip\":\"::1\"}",
                       "allow_ips: not a JSON array of IP addresses or CIDRs");
    assert_parse_error("[\"::1\"",
                       "allow_ips: not a JSON array of IP addresses or CIDRs");
}


static void
test_long_bad_entry_is_cut_in_error(void **state)
{
    char  json[300];
    char  err[256];

    strcpy(json, "[\"");
    memset(json + 2, 'z', 200);
    strcpy(json + 202, "\"]");

    assert_null(llmgw_iplist_parse(json, strlen(json), err, sizeof(err)));
    assert_non_null(strstr(err, "zzz...\" is not an IP address or CIDR"));
    assert_true(strlen(err) < 120);
}


/* llmgw_content_addr_ok for a textual address. */
static int
content_ok(const llmgw_iplist_t *allow, const char *ip)
{
    return check_text(llmgw_content_addr_ok, allow, ip);
}


static llmgw_iplist_t *
from_words(const char *a, const char *b)
{
    llmgw_str_t  w[2] = { { a, strlen(a) }, { b ? b : "", b ? strlen(b) : 0 } };
    size_t       bad = 99;
    llmgw_iplist_t *l = llmgw_iplist_from(w, b ? 2 : 1, &bad);

    assert_non_null(l);
    return l;
}


/* Each of ips is admitted (want 1) or refused (want 0) with no list. */
#define assert_content(ips, want)                                            \
    assert_content_n(ips, sizeof(ips) / sizeof(ips[0]), want)

static void
assert_content_n(const char *const *ips, size_t n, int want)
{
    for (size_t i = 0; i < n; i++) {
        if (content_ok(NULL, ips[i]) != want) {
            fail_msg("%s was %s", ips[i],
                     want ? "refused" : "taken for public");
        }
    }
}


static void
test_content_refuses_special_ipv4(void **state)
{
    static const char *special[] = {
        "127.0.0.1", "127.255.255.254", "0.0.0.0", "0.1.2.3", "10.0.0.1",
        "10.255.255.255", "172.16.0.1", "172.31.255.255", "192.168.1.1",
        "169.254.169.254", "169.254.0.1", "100.64.0.1", "100.127.255.255",
        "192.0.0.8", "192.0.2.1", "198.18.0.1", "198.19.255.255",
        "198.51.100.7", "203.0.113.9", "224.0.0.1", "239.255.255.250",
        "240.0.0.1", "255.255.255.255",
    };

    assert_content(special, 0);
}


static void
test_content_admits_public_ipv4(void **state)
{
    static const char *public[] = {
        "8.8.8.8", "1.1.1.1", "9.255.255.255", "11.0.0.0", "172.15.255.255",
        "172.32.0.0", "192.167.255.255", "192.169.0.0", "169.253.255.255",
        "100.63.255.255", "100.128.0.0", "223.255.255.255", "126.255.255.255",
        "128.0.0.0",
    };

    assert_content(public, 1);
}


static void
test_content_refuses_special_ipv6(void **state)
{
    static const char *special[] = {
        "::", "::1", "::127.0.0.1", "fc00::1", "fd12:3456::1", "fe80::1",
        "febf::1", "fec0::1", "ff02::1", "ff0e::1", "2001:db8::1",
        "100::1", "2001::1", "64:ff9b:1::1",
        /* IPv4 inside: mapped, NAT64, 6to4 */
        "::ffff:127.0.0.1", "::ffff:169.254.169.254", "::ffff:10.1.2.3",
        "64:ff9b::127.0.0.1", "64:ff9b::a9fe:a9fe", "2002:7f00:1::1",
        "2002:c0a8:101::",
    };

    assert_content(special, 0);
}


static void
test_content_admits_public_ipv6(void **state)
{
    static const char *public[] = {
        "2606:4700:4700::1111", "2a00:1450:4001::200e", "::ffff:8.8.8.8",
        "64:ff9b::808:808", "2002:808:808::1", "fbff::1", "fe00::1",
    };

    assert_content(public, 1);
}


static void
test_content_allow_list_admits_what_it_lists(void **state)
{
    llmgw_iplist_t *l = from_words("10.0.0.0/8", " ::1 ");

    assert_true(content_ok(l, "10.1.2.3"));
    assert_true(content_ok(l, "::ffff:10.1.2.3"));
    assert_true(content_ok(l, "::1"));
    assert_false(content_ok(l, "127.0.0.1"));
    assert_false(content_ok(l, "169.254.169.254"));
    assert_false(content_ok(l, "192.168.0.1"));
    /* public addresses need no entry */
    assert_true(content_ok(l, "8.8.8.8"));
    llmgw_iplist_free(l);

    /* what "on" stands for */
    l = from_words("0.0.0.0/0", "::/0");
    assert_true(content_ok(l, "127.0.0.1"));
    assert_true(content_ok(l, "fe80::1"));
    assert_true(content_ok(l, "169.254.169.254"));
    llmgw_iplist_free(l);
}


static void
test_content_unknown_family_is_refused(void **state)
{
    uint8_t addr[16] = { 8, 8, 8, 8 };

    assert_false(llmgw_content_addr_ok(NULL, AF_UNIX, addr));
    assert_false(llmgw_content_addr_ok(NULL, AF_INET, NULL));
}


static void
test_words_name_the_bad_one(void **state)
{
    llmgw_str_t  w[3] = { { "10.0.0.0/8", 10 }, { "10.0.0.0/33", 11 },
                          { "::1", 3 } };
    size_t       bad = 99;

    assert_null(llmgw_iplist_from(w, 3, &bad));
    assert_int_equal(bad, 1);

    w[1] = (llmgw_str_t) { "localhost", 9 };
    assert_null(llmgw_iplist_from(w, 3, &bad));
    assert_int_equal(bad, 1);
}


int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ipv4_cidr_matches_inside_only),
        cmocka_unit_test(test_ipv4_address_matches_only_itself),
        cmocka_unit_test(test_ipv6_cidr_matches),
        cmocka_unit_test(test_ipv6_address_matches_only_itself),
        cmocka_unit_test(test_ipv4_mapped_client_matches_ipv4_entry),
        cmocka_unit_test(test_ipv4_entry_does_not_match_native_ipv6),
        cmocka_unit_test(test_host_bits_set_are_masked),
        cmocka_unit_test(test_prefix_not_on_byte_boundary),
        cmocka_unit_test(test_full_length_prefixes_are_exact),
        cmocka_unit_test(test_any_entry_matching_admits),
        cmocka_unit_test(test_whitespace_around_entry_is_ignored),
        cmocka_unit_test(test_empty_list_is_no_restriction),
        cmocka_unit_test(test_no_list_is_no_restriction),
        cmocka_unit_test(test_unknown_family_is_refused),
        cmocka_unit_test(test_error_names_entry_index_and_text),
        cmocka_unit_test(test_prefix_length_is_bounds_checked),
        cmocka_unit_test(test_malformed_prefix_is_rejected),
        cmocka_unit_test(test_malformed_addresses_are_rejected),
        cmocka_unit_test(test_non_string_entry_is_rejected),
        cmocka_unit_test(test_non_array_is_rejected),
        cmocka_unit_test(test_long_bad_entry_is_cut_in_error),
        cmocka_unit_test(test_content_refuses_special_ipv4),
        cmocka_unit_test(test_content_admits_public_ipv4),
        cmocka_unit_test(test_content_refuses_special_ipv6),
        cmocka_unit_test(test_content_admits_public_ipv6),
        cmocka_unit_test(test_content_allow_list_admits_what_it_lists),
        cmocka_unit_test(test_content_unknown_family_is_refused),
        cmocka_unit_test(test_words_name_the_bad_one),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
