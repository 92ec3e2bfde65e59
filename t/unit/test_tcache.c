/*
 * A worker's key cache: hits, remembered misses, drops by token and by user
 * (misses with them), clear, the bound, and references that outlive the
 * cache entry.
 */

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "llmgw.h"


typedef struct {
    char  h[65];
} hash_t;


/* A 64-character key hash made of one repeated hex digit. */
static hash_t
H(char c)
{
    hash_t h;

    memset(h.h, c, 64);
    h.h[64] = '\0';
    return h;
}


static llmgw_token_t *
token(int64_t id, int64_t user_id)
{
    char            buf[256];
    llmgw_token_t  *t;

    snprintf(buf, sizeof(buf),
             "{\"id\":%lld,\"user_id\":%lld,\"status\":\"enabled\","
             "\"remain_quota\":10,\"user\":{\"status\":\"enabled\"}}",
             (long long) id, (long long) user_id);
    t = llmgw_token_parse(buf, strlen(buf));
    assert_non_null(t);
    return t;
}


/* Caches a new token under hash c and drops the caller's reference. */
static void
put_token(llmgw_tcache_t *c, char h, int64_t id, int64_t user_id)
{
    llmgw_token_t *t = token(id, user_id);

    llmgw_tcache_put(c, H(h).h, t);
    llmgw_token_free(t);
}


/* The cached token id under hash c; 0 for a remembered miss; -1 if none. */
static int64_t
cached(llmgw_tcache_t *c, char h)
{
    llmgw_token_t  *t = (llmgw_token_t *) 1;
    int64_t         id;

    if (!llmgw_tcache_get(c, H(h).h, &t)) {
        return -1;
    }

    if (t == NULL) {
        return 0;
    }

    id = llmgw_token_id(t);
    llmgw_token_free(t);
    return id;
}


static void
test_tcache_get_returns_the_token_put(void **state)
{
    (void) state;

    llmgw_tcache_t  *c = llmgw_tcache_new(16);
    llmgw_token_t   *t = token(7, 1), *got = NULL;

    llmgw_tcache_put(c, H('a').h, t);
    assert_int_equal(llmgw_tcache_get(c, H('a').h, &got), 1);
    assert_ptr_equal(got, t);
    assert_int_equal(llmgw_token_id(got), 7);
    llmgw_token_free(got);
    llmgw_token_free(t);

    /* another key is not in the cache */
    assert_int_equal(cached(c, 'b'), -1);
    llmgw_tcache_free(c);
}


static void
test_tcache_remembers_a_miss_as_null(void **state)
{
    (void) state;

    llmgw_tcache_t  *c = llmgw_tcache_new(16);
    llmgw_token_t   *got = (llmgw_token_t *) 1;

    llmgw_tcache_put(c, H('a').h, NULL);
    assert_int_equal(llmgw_tcache_get(c, H('a').h, &got), 1);
    assert_null(got);
    llmgw_tcache_free(c);
}


static void
test_tcache_put_replaces_the_entry(void **state)
{
    (void) state;

    llmgw_tcache_t *c = llmgw_tcache_new(16);

    llmgw_tcache_put(c, H('a').h, NULL);
    put_token(c, 'a', 9, 1);
    assert_int_equal(cached(c, 'a'), 9);
    put_token(c, 'a', 10, 1);
    assert_int_equal(cached(c, 'a'), 10);
    llmgw_tcache_free(c);
}


static void
test_tcache_drop_token_drops_that_token_and_misses(void **state)
{
    (void) state;

    llmgw_tcache_t *c = llmgw_tcache_new(16);

    put_token(c, 'a', 7, 1);
    put_token(c, 'b', 8, 1);
    put_token(c, 'c', 9, 2);
    llmgw_tcache_put(c, H('d').h, NULL);

    llmgw_tcache_drop_token(c, 7);

    assert_int_equal(cached(c, 'a'), -1);
    assert_int_equal(cached(c, 'b'), 8);
    assert_int_equal(cached(c, 'c'), 9);
    /* the changed token may be the one a remembered miss was about */
    assert_int_equal(cached(c, 'd'), -1);
    llmgw_tcache_free(c);
}


static void
test_tcache_drop_user_drops_all_the_users_tokens_and_misses(void **state)
{
    (void) state;

    llmgw_tcache_t *c = llmgw_tcache_new(16);

    put_token(c, 'a', 7, 1);
    put_token(c, 'b', 8, 1);
    put_token(c, 'c', 9, 2);
    llmgw_tcache_put(c, H('d').h, NULL);

    llmgw_tcache_drop_user(c, 1);

    assert_int_equal(cached(c, 'a'), -1);
    assert_int_equal(cached(c, 'b'), -1);
    assert_int_equal(cached(c, 'c'), 9);
    assert_int_equal(cached(c, 'd'), -1);
    llmgw_tcache_free(c);
}


static void
test_tcache_clear_drops_everything(void **state)
{
    (void) state;

    llmgw_tcache_t *c = llmgw_tcache_new(16);

    put_token(c, 'a', 7, 1);
    put_token(c, 'b', 8, 2);
    llmgw_tcache_put(c, H('c').h, NULL);

    llmgw_tcache_clear(c);

    assert_int_equal(cached(c, 'a'), -1);
    assert_int_equal(cached(c, 'b'), -1);
    assert_int_equal(cached(c, 'c'), -1);

    /* and it is usable afterwards */
    put_token(c, 'a', 7, 1);
    assert_int_equal(cached(c, 'a'), 7);
    llmgw_tcache_free(c);
}


static void
test_tcache_full_cache_empties_before_the_next_put(void **state)
{
    (void) state;

    llmgw_tcache_t *c = llmgw_tcache_new(3);

    put_token(c, 'a', 1, 1);
    put_token(c, 'b', 2, 1);
    llmgw_tcache_put(c, H('c').h, NULL);

    /* up to the bound everything stays */
    assert_int_equal(cached(c, 'a'), 1);
    assert_int_equal(cached(c, 'b'), 2);
    assert_int_equal(cached(c, 'c'), 0);

    put_token(c, 'd', 4, 1);

    assert_int_equal(cached(c, 'a'), -1);
    assert_int_equal(cached(c, 'b'), -1);
    assert_int_equal(cached(c, 'c'), -1);
    assert_int_equal(cached(c, 'd'), 4);
    llmgw_tcache_free(c);
}


static void
test_tcache_token_got_survives_clear_until_freed(void **state)
{
    (void) state;

    llmgw_tcache_t  *c = llmgw_tcache_new(16);
    llmgw_token_t   *got = NULL;

    put_token(c, 'a', 42, 3);      /* the cache holds the only reference */
    assert_int_equal(llmgw_tcache_get(c, H('a').h, &got), 1);
    assert_non_null(got);

    llmgw_tcache_clear(c);
    llmgw_tcache_drop_token(c, 42);
    /* a request in flight keeps using its token (valgrind checks this) */
    assert_int_equal(llmgw_token_id(got), 42);
    assert_int_equal(llmgw_token_user_id(got), 3);
    llmgw_token_free(got);

    /* and the same after the whole cache is gone */
    put_token(c, 'b', 43, 3);
    assert_int_equal(llmgw_tcache_get(c, H('b').h, &got), 1);
    llmgw_tcache_free(c);
    assert_int_equal(llmgw_token_id(got), 43);
    llmgw_token_free(got);
}


int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tcache_get_returns_the_token_put),
        cmocka_unit_test(test_tcache_remembers_a_miss_as_null),
        cmocka_unit_test(test_tcache_put_replaces_the_entry),
        cmocka_unit_test(test_tcache_drop_token_drops_that_token_and_misses),
        cmocka_unit_test(
            test_tcache_drop_user_drops_all_the_users_tokens_and_misses),
        cmocka_unit_test(test_tcache_clear_drops_everything),
        cmocka_unit_test(test_tcache_full_cache_empties_before_the_next_put),
        cmocka_unit_test(test_tcache_token_got_survives_clear_until_freed),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
