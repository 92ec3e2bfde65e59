/*
 * Signed artifact links: a link signed with the secret (HMAC-SHA256 over
 * the task, the artifact key and the expiry) is accepted until it expires,
 * and nothing else is: another secret, task, key or expiry, a cut or
 * altered signature.  A query without the link's parameters leaves the
 * decision to the API key.
 */

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "llmgw.h"
#include "task.h"


#define SECRET  "0123456789abcdef0123456789abcdef-secret"
#define NOW     1800000000


static llmgw_str_t
S(const char *s)
{
    llmgw_str_t r = { s, strlen(s) };
    return r;
}


/* The signature as the README describes it, computed independently. */
static void
sign(const char *secret, const char *task, const char *key, long long exp,
    char hex[65])
{
    char           msg[512];
    unsigned char  mac[EVP_MAX_MD_SIZE];
    unsigned int   n = 0, i;

    snprintf(msg, sizeof(msg), "llmgw-artifact-v1\n%s\n%s\n%lld", task, key,
             exp);
    HMAC(EVP_sha256(), secret, (int) strlen(secret),
         (const unsigned char *) msg, strlen(msg), mac, &n);

    for (i = 0; i < n; i++) {
        sprintf(hex + 2 * i, "%02x", mac[i]);
    }
    hex[2 * n] = '\0';
}


static int
check(const char *secret, const char *path, const char *args,
    llmgw_verdict_t *v)
{
    memset(v, 0, sizeof(*v));
    return llmgw_artifact_link_check(S(secret), S(path), S(args), NOW, v);
}


static void
test_a_signed_link_is_accepted_until_it_expires(void **state)
{
    char             sig[65], args[256];
    llmgw_verdict_t  v;

    (void) state;

    sign(SECRET, "task_abc", "video", NOW + 60, sig);
    snprintf(args, sizeof(args), "expires=%lld&signature=%s",
             (long long) NOW + 60, sig);
    assert_int_equal(check(SECRET, "/v1/tasks/task_abc/artifacts/video/"
                           "content", args, &v), 0);

    /* the parameters in any order, other ones beside them */
    snprintf(args, sizeof(args), "x=1&signature=%s&expires=%lld", sig,
             (long long) NOW + 60);
    assert_int_equal(check(SECRET, "/v1/tasks/task_abc/artifacts/video/"
                           "content", args, &v), 0);

    /* expired: the same signature, checked later */
    sign(SECRET, "task_abc", "video", NOW, sig);
    snprintf(args, sizeof(args), "expires=%lld&signature=%s",
             (long long) NOW, sig);
    assert_int_equal(check(SECRET, "/v1/tasks/task_abc/artifacts/video/"
                           "content", args, &v), -1);
    assert_int_equal(v.status, 403);
    assert_string_equal(v.code, "link_expired");
}


static void
test_a_link_signs_its_task_key_and_expiry_only(void **state)
{
    char             sig[65], args[256];
    llmgw_verdict_t  v;

    (void) state;

    sign(SECRET, "task_abc", "video", NOW + 60, sig);

    /* another task, another key */
    snprintf(args, sizeof(args), "expires=%lld&signature=%s",
             (long long) NOW + 60, sig);
    assert_int_equal(check(SECRET, "/v1/tasks/task_abd/artifacts/video/"
                           "content", args, &v), -1);
    assert_string_equal(v.code, "invalid_signature");
    assert_int_equal(check(SECRET, "/v1/tasks/task_abc/artifacts/thumb/"
                           "content", args, &v), -1);
    assert_string_equal(v.code, "invalid_signature");

    /* a later expiry than signed */
    snprintf(args, sizeof(args), "expires=%lld&signature=%s",
             (long long) NOW + 61, sig);
    assert_int_equal(check(SECRET, "/v1/tasks/task_abc/artifacts/video/"
                           "content", args, &v), -1);
    assert_string_equal(v.code, "invalid_signature");

    /* another secret (a rotation) */
    snprintf(args, sizeof(args), "expires=%lld&signature=%s",
             (long long) NOW + 60, sig);
    assert_int_equal(check(SECRET "2", "/v1/tasks/task_abc/artifacts/video/"
                           "content", args, &v), -1);
    assert_string_equal(v.code, "invalid_signature");

    /* no secret configured: no link is valid */
    assert_int_equal(check("", "/v1/tasks/task_abc/artifacts/video/content",
                           args, &v), -1);
    assert_string_equal(v.code, "invalid_signature");
}


static void
test_altered_or_partial_links_are_refused(void **state)
{
    char             sig[65], args[256];
    size_t           i;
    llmgw_verdict_t  v;

    static const char *const  other[] = {
        "expires=0%lld&signature=%s", "expires=%%2B%lld&signature=%s",
        "expires=%%20%lld&signature=%s", "expires=%lld+&signature=%s",
        "expires=%lld%%000&signature=%s", "expires=%lld&signature=%s%%00x",
    };

    (void) state;

    sign(SECRET, "task_abc", "video", NOW + 60, sig);

    /* a signature cut short, upper-cased, one digit changed */
    snprintf(args, sizeof(args), "expires=%lld&signature=%.63s",
             (long long) NOW + 60, sig);
    assert_int_equal(check(SECRET, "/v1/tasks/task_abc/artifacts/video/"
                           "content", args, &v), -1);
    sig[0] = sig[0] == 'a' ? 'b' : 'a';
    snprintf(args, sizeof(args), "expires=%lld&signature=%s",
             (long long) NOW + 60, sig);
    assert_int_equal(check(SECRET, "/v1/tasks/task_abc/artifacts/video/"
                           "content", args, &v), -1);
    assert_string_equal(v.code, "invalid_signature");

    /* one parameter without the other, an expiry that is no number */
    assert_int_equal(check(SECRET, "/v1/tasks/task_abc/artifacts/video/"
                           "content", "expires=1900000000", &v), -1);
    assert_int_equal(check(SECRET, "/v1/tasks/task_abc/artifacts/video/"
                           "content", "signature=00", &v), -1);
    assert_int_equal(check(SECRET, "/v1/tasks/task_abc/artifacts/video/"
                           "content", "expires=12x&signature=00", &v), -1);

    /* the same expiry spelt otherwise, or either value with more after a
       NUL, is another link */
    sign(SECRET, "task_abc", "video", NOW + 60, sig);
    for (i = 0; i < sizeof(other) / sizeof(other[0]); i++) {
        snprintf(args, sizeof(args), other[i], (long long) NOW + 60, sig);
        assert_int_equal(check(SECRET, "/v1/tasks/task_abc/artifacts/video/"
                               "content", args, &v), -1);
        assert_string_equal(v.code, "invalid_signature");
    }

    /* a path that is no content path */
    snprintf(args, sizeof(args), "expires=%lld&signature=%s",
             (long long) NOW + 60, sig);
    assert_int_equal(check(SECRET, "/v1/tasks/task_abc/artifacts", args, &v),
                     -1);
}


static void
test_without_link_parameters_the_key_decides(void **state)
{
    llmgw_verdict_t  v;

    (void) state;

    assert_int_equal(check(SECRET, "/v1/tasks/task_abc/artifacts/video/"
                           "content", "", &v), 1);
    assert_int_equal(check(SECRET, "/v1/tasks/task_abc/artifacts/video/"
                           "content", "download=1", &v), 1);
}


int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_signed_link_is_accepted_until_it_expires),
        cmocka_unit_test(test_a_link_signs_its_task_key_and_expiry_only),
        cmocka_unit_test(test_altered_or_partial_links_are_refused),
        cmocka_unit_test(test_without_link_parameters_the_key_decides),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
