/*
 * The sliding-log limiter: "at most total requests and at most success
 * successful ones in any window", exact to the millisecond.
 */

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "llmgw.h"


#define WINDOW  1000


/* Memory as nginx hands it out: not zeroed. */
static void *
limiter(uint32_t total, uint32_t success)
{
    size_t  n = llmgw_rl_size(total, success);
    void   *mem = malloc(n);

    assert_non_null(mem);
    memset(mem, 0xa5, n);
    llmgw_rl_init(mem, total, success);

    return mem;
}


static int
acquire(void *mem, int64_t now, int64_t *retry)
{
    *retry = -12345;
    return llmgw_rl_acquire(mem, now, WINDOW, retry, NULL);
}


/* Admitted: the success slot it holds; refused: -1. */
static int64_t
admit(void *mem, int64_t now)
{
    int64_t  retry, reserved = -7;

    if (llmgw_rl_acquire(mem, now, WINDOW, &retry, &reserved) != LLMGW_RL_OK) {
        assert_int_equal(reserved, -1);
        return -1;
    }

    return reserved;
}


static void
test_size_is_header_plus_two_rings_of_int64(void **state)
{
    assert_int_equal(llmgw_rl_size(0, 0), 32);
    assert_int_equal(llmgw_rl_size(3, 2), 32 + 5 * 8);
    assert_int_equal(llmgw_rl_size(100000, 0), 32 + 100000 * 8);
}


static void
test_total_limit_refuses_exactly_at_m(void **state)
{
    void     *rl = limiter(3, 0);
    int64_t   retry;

    assert_int_equal(acquire(rl, 0, &retry), LLMGW_RL_OK);
    assert_int_equal(retry, 0);
    assert_int_equal(acquire(rl, 1, &retry), LLMGW_RL_OK);
    assert_int_equal(acquire(rl, 2, &retry), LLMGW_RL_OK);
    assert_int_equal(acquire(rl, 3, &retry), LLMGW_RL_TOTAL);
    assert_int_equal(retry, 0 + WINDOW - 3);
    free(rl);
}


static void
test_slot_frees_exactly_one_window_after_oldest(void **state)
{
    void     *rl = limiter(1, 0);
    int64_t   retry;

    assert_int_equal(acquire(rl, 0, &retry), LLMGW_RL_OK);
    assert_int_equal(acquire(rl, WINDOW - 1, &retry), LLMGW_RL_TOTAL);
    assert_int_equal(retry, 1);
    assert_int_equal(acquire(rl, WINDOW, &retry), LLMGW_RL_OK);
    free(rl);
}


static void
test_window_slides_instead_of_resetting(void **state)
{
    void     *rl = limiter(2, 0);
    int64_t   retry;

    /* a fixed 0..999 bucket would reset at 1000 and admit at 1050 */
    assert_int_equal(acquire(rl, 900, &retry), LLMGW_RL_OK);
    assert_int_equal(acquire(rl, 950, &retry), LLMGW_RL_OK);
    assert_int_equal(acquire(rl, 1050, &retry), LLMGW_RL_TOTAL);
    assert_int_equal(retry, 900 + WINDOW - 1050);
    assert_int_equal(acquire(rl, 1900, &retry), LLMGW_RL_OK);
    assert_int_equal(acquire(rl, 1920, &retry), LLMGW_RL_TOTAL);
    assert_int_equal(retry, 950 + WINDOW - 1920);
    free(rl);
}


static void
test_refused_request_is_not_recorded(void **state)
{
    void     *rl = limiter(2, 0);
    int64_t   retry;

    assert_int_equal(acquire(rl, 0, &retry), LLMGW_RL_OK);
    assert_int_equal(acquire(rl, 10, &retry), LLMGW_RL_OK);
    assert_int_equal(acquire(rl, 500, &retry), LLMGW_RL_TOTAL);
    assert_int_equal(acquire(rl, 600, &retry), LLMGW_RL_TOTAL);
    /* both admitted ones expired; the refusals left no trace */
    assert_int_equal(acquire(rl, 1010, &retry), LLMGW_RL_OK);
    assert_int_equal(acquire(rl, 1011, &retry), LLMGW_RL_OK);
    free(rl);
}


static void
test_retry_after_never_exceeds_window_after_clock_step_back(void **state)
{
    void     *rl = limiter(1, 0);
    int64_t   retry;

    assert_int_equal(acquire(rl, 5000, &retry), LLMGW_RL_OK);
    assert_int_equal(acquire(rl, 1000, &retry), LLMGW_RL_TOTAL);
    assert_int_equal(retry, WINDOW);
    free(rl);
}


static void
test_success_limit_refuses_exactly_at_s(void **state)
{
    void     *rl = limiter(0, 2);
    int64_t   retry;

    assert_int_equal(admit(rl, 0), 0);
    assert_int_equal(admit(rl, 1), 1);
    /* an admitted request that did not succeed gives its slot back */
    llmgw_rl_release(rl, 1);
    assert_int_equal(admit(rl, 2), 2);
    assert_int_equal(acquire(rl, 4, &retry), LLMGW_RL_SUCCESS);
    assert_int_equal(retry, 0 + WINDOW - 4);
    assert_int_equal(acquire(rl, WINDOW, &retry), LLMGW_RL_OK);
    free(rl);
}


static void
test_requests_in_flight_hold_success_slots(void **state)
{
    void     *rl = limiter(1000, 5);
    int64_t   retry;
    int       ok = 0;

    /* thirty at once, none finished yet: five may run */
    for (int i = 0; i < 30; i++) {
        if (acquire(rl, 100, &retry) == LLMGW_RL_OK) {
            ok++;
        } else {
            assert_int_equal(retry, WINDOW);
        }
    }

    assert_int_equal(ok, 5);
    free(rl);
}


static void
test_release_takes_out_its_own_entry_only(void **state)
{
    void     *rl = limiter(0, 3);
    int64_t   retry;

    assert_int_equal(admit(rl, 0), 0);
    assert_int_equal(admit(rl, 10), 10);
    assert_int_equal(admit(rl, 20), 20);
    /* the middle one failed: 0 still decides the wait */
    llmgw_rl_release(rl, 10);
    /* a slot already gone, or none taken: nothing changes */
    llmgw_rl_release(rl, 15);
    llmgw_rl_release(rl, -1);
    assert_int_equal(admit(rl, 30), 30);
    assert_int_equal(acquire(rl, 40, &retry), LLMGW_RL_SUCCESS);
    assert_int_equal(retry, 0 + WINDOW - 40);
    llmgw_rl_release(rl, 30);
    llmgw_rl_release(rl, 0);
    assert_int_equal(admit(rl, 50), 50);
    assert_int_equal(admit(rl, 55), 55);
    assert_int_equal(acquire(rl, 60, &retry), LLMGW_RL_SUCCESS);
    assert_int_equal(retry, 20 + WINDOW - 60);
    free(rl);
}


static void
test_release_after_the_ring_wrapped(void **state)
{
    void     *rl = limiter(0, 3);
    int64_t   retry;

    /* the ring's start moves past its end */
    for (int64_t t = 0; t < 5 * WINDOW; t += WINDOW) {
        assert_int_equal(admit(rl, t), t);
        assert_int_equal(admit(rl, t + 1), t + 1);
    }

    assert_int_equal(admit(rl, 4 * WINDOW + 2), 4 * WINDOW + 2);
    llmgw_rl_release(rl, 4 * WINDOW + 1);
    assert_int_equal(admit(rl, 4 * WINDOW + 3), 4 * WINDOW + 3);
    assert_int_equal(acquire(rl, 4 * WINDOW + 4, &retry), LLMGW_RL_SUCCESS);
    assert_int_equal(retry, WINDOW - 4);
    llmgw_rl_release(rl, 4 * WINDOW);
    assert_int_equal(admit(rl, 4 * WINDOW + 5), 4 * WINDOW + 5);
    assert_int_equal(acquire(rl, 4 * WINDOW + 6, &retry), LLMGW_RL_SUCCESS);
    assert_int_equal(retry, 2 + WINDOW - 6);
    free(rl);
}


static void
test_success_refusal_is_not_recorded_in_total(void **state)
{
    void     *rl = limiter(2, 1);
    int64_t   retry;

    assert_int_equal(admit(rl, 0), 0);
    assert_int_equal(acquire(rl, 500, &retry), LLMGW_RL_SUCCESS);
    assert_int_equal(acquire(rl, 600, &retry), LLMGW_RL_SUCCESS);
    /* had 500 and 600 been recorded the total ring would be full now */
    assert_int_equal(admit(rl, 1000), 1000);
    llmgw_rl_release(rl, 1000);
    assert_int_equal(acquire(rl, 1001, &retry), LLMGW_RL_OK);
    free(rl);
}


static void
test_total_limit_is_reported_before_success_limit(void **state)
{
    void     *rl = limiter(1, 1);
    int64_t   retry;

    assert_int_equal(acquire(rl, 0, &retry), LLMGW_RL_OK);
    assert_int_equal(acquire(rl, 200, &retry), LLMGW_RL_TOTAL);
    assert_int_equal(retry, 0 + WINDOW - 200);
    free(rl);
}


/* A limit lowered keeps its ring: raised again within the window, the
   requests made before still count. */
static void
test_a_lowered_then_raised_limit_remembers_every_request(void **state)
{
    void     *rl = limiter(4, 0);
    int64_t   retry;
    (void) state;

    for (int64_t t = 0; t < 4; t++) {
        assert_int_equal(acquire(rl, t * 100, &retry), LLMGW_RL_OK);
    }

    assert_int_equal(llmgw_rl_limit(rl, 2, 0), 0);
    assert_int_equal(acquire(rl, 400, &retry), LLMGW_RL_TOTAL);
    /* three must leave (one fewer than the limit is what admits): the
       slot frees when 200 does */
    assert_int_equal(retry, 200 + WINDOW - 400);

    assert_int_equal(llmgw_rl_limit(rl, 4, 0), 0);
    assert_int_equal(acquire(rl, 500, &retry), LLMGW_RL_TOTAL);
    assert_int_equal(retry, 0 + WINDOW - 500);
    assert_int_equal(acquire(rl, WINDOW + 1, &retry), LLMGW_RL_OK);

    /* over the rings' capacity: the caller makes larger ones */
    assert_int_equal(llmgw_rl_limit(rl, 5, 0), -1);
    free(rl);
}


static void
test_copy_keeps_the_newest_history(void **state)
{
    void     *a = limiter(4, 4);
    void     *b = limiter(2, 6);
    void     *c = limiter(0, 0);
    int64_t   retry;

    for (int64_t t = 0; t < 4; t++) {
        assert_int_equal(admit(a, t * 100), t * 100);
    }

    /* lowered: the newest two decide; raised: all four are kept */
    llmgw_rl_copy(b, a);
    assert_int_equal(acquire(b, 400, &retry), LLMGW_RL_TOTAL);
    assert_int_equal(retry, 200 + WINDOW - 400);
    assert_int_equal(admit(b, 1250), 1250);
    assert_int_equal(admit(b, 1310), 1310);
    assert_int_equal(acquire(b, 1330, &retry), LLMGW_RL_TOTAL);
    assert_int_equal(retry, 1250 + WINDOW - 1330);

    /* to and from an unlimited one */
    llmgw_rl_copy(c, a);
    llmgw_rl_copy(a, c);
    assert_int_equal(acquire(a, 500, &retry), LLMGW_RL_TOTAL);

    free(a);
    free(b);
    free(c);
}


static void
test_zero_limits_are_unlimited(void **state)
{
    void     *rl = limiter(0, 0);
    int64_t   retry;

    for (int i = 0; i < 10000; i++) {
        assert_int_equal(acquire(rl, i / 100, &retry), LLMGW_RL_OK);
    }

    assert_int_equal(admit(rl, 200), -1);
    free(rl);
}


static void
test_zero_window_is_no_limit(void **state)
{
    void     *rl = limiter(1, 1);
    int64_t   retry = -1;

    for (int i = 0; i < 5; i++) {
        assert_int_equal(llmgw_rl_acquire(rl, 7, 0, &retry, NULL), LLMGW_RL_OK);
        assert_int_equal(retry, 0);
    }

    free(rl);
}


static void
test_null_retry_pointer_is_allowed(void **state)
{
    void *rl = limiter(1, 0);

    assert_int_equal(llmgw_rl_acquire(rl, 0, WINDOW, NULL, NULL), LLMGW_RL_OK);
    assert_int_equal(llmgw_rl_acquire(rl, 1, WINDOW, NULL, NULL),
                     LLMGW_RL_TOTAL);
    free(rl);
}


static void
test_state_survives_a_move_to_other_memory(void **state)
{
    size_t    n = llmgw_rl_size(2, 0);
    void     *a = limiter(2, 0);
    void     *b = malloc(n);
    int64_t   retry;

    assert_non_null(b);
    assert_int_equal(acquire(a, 0, &retry), LLMGW_RL_OK);
    assert_int_equal(acquire(a, 10, &retry), LLMGW_RL_OK);
    memcpy(b, a, n);
    memset(a, 0, n);
    free(a);

    assert_int_equal(acquire(b, 20, &retry), LLMGW_RL_TOTAL);
    assert_int_equal(retry, WINDOW - 20);
    free(b);
}


/*
 * Against a naive model that keeps every timestamp: pseudo-random arrivals
 * wrap both rings many times.
 */
#define SIM_STEPS  20000

static int64_t  sim_admitted[SIM_STEPS];
static int64_t  sim_succeeded[SIM_STEPS];

static size_t
in_window(const int64_t *log, size_t n, int64_t now, size_t *first)
{
    size_t i = 0;

    while (i < n && log[i] <= now - WINDOW) {
        i++;
    }

    *first = i;
    return n - i;
}


static void
test_matches_naive_sliding_log(void **state)
{
    const uint32_t  total = 7, success = 4;
    void           *rl = limiter(total, success);
    uint64_t        seed = 42;
    int64_t         now = 0, retry, want_retry, reserved;
    size_t          na = 0, ns = 0, first_a, first_s, in_a, in_s;
    int             want, got;

    for (int step = 0; step < SIM_STEPS; step++) {
        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
        now += (int64_t) ((seed >> 33) % 150);

        in_a = in_window(sim_admitted, na, now, &first_a);
        in_s = in_window(sim_succeeded, ns, now, &first_s);

        if (in_a >= total) {
            want = LLMGW_RL_TOTAL;
            want_retry = sim_admitted[na - total] + WINDOW - now;
        } else if (in_s >= success) {
            want = LLMGW_RL_SUCCESS;
            want_retry = sim_succeeded[ns - success] + WINDOW - now;
        } else {
            want = LLMGW_RL_OK;
            want_retry = 0;
            sim_admitted[na++] = now;
        }

        got = llmgw_rl_acquire(rl, now, WINDOW, &retry, &reserved);
        assert_int_equal(got, want);
        assert_int_equal(retry, want_retry);

        /* admitted: holds a success slot, given back by a failure */
        if (got == LLMGW_RL_OK) {
            assert_int_equal(reserved, now);

            if ((seed >> 20) % 3 != 0) {
                sim_succeeded[ns++] = now;
            } else {
                llmgw_rl_release(rl, reserved);
            }
        }
    }

    free(rl);
}


/* A group is told apart by its name's 64-bit FNV-1a: the hash the shared
   zone keeps and the snapshot is asked about must be the same, byte for
   byte (names are UTF-8). */
static void
test_group_hash_is_fnv1a_of_the_name(void **state)
{
    (void) state;

    assert_true(llmgw_rl_group_hash((llmgw_str_t) { "", 0 })
                == 0xcbf29ce484222325ULL);
    assert_true(llmgw_rl_group_hash((llmgw_str_t) { "a", 1 })
                == 0xaf63dc4c8601ec8cULL);
    assert_true(llmgw_rl_group_hash((llmgw_str_t) { "\xc3\xa9", 2 })
                != llmgw_rl_group_hash((llmgw_str_t) { "\xc3\xa8", 2 }));
}


int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_size_is_header_plus_two_rings_of_int64),
        cmocka_unit_test(
            test_a_lowered_then_raised_limit_remembers_every_request),
        cmocka_unit_test(test_total_limit_refuses_exactly_at_m),
        cmocka_unit_test(test_slot_frees_exactly_one_window_after_oldest),
        cmocka_unit_test(test_window_slides_instead_of_resetting),
        cmocka_unit_test(test_refused_request_is_not_recorded),
        cmocka_unit_test(
            test_retry_after_never_exceeds_window_after_clock_step_back),
        cmocka_unit_test(test_success_limit_refuses_exactly_at_s),
        cmocka_unit_test(test_requests_in_flight_hold_success_slots),
        cmocka_unit_test(test_release_takes_out_its_own_entry_only),
        cmocka_unit_test(test_release_after_the_ring_wrapped),
        cmocka_unit_test(test_success_refusal_is_not_recorded_in_total),
        cmocka_unit_test(test_total_limit_is_reported_before_success_limit),
        cmocka_unit_test(test_copy_keeps_the_newest_history),
        cmocka_unit_test(test_zero_limits_are_unlimited),
        cmocka_unit_test(test_zero_window_is_no_limit),
        cmocka_unit_test(test_null_retry_pointer_is_allowed),
        cmocka_unit_test(test_state_survives_a_move_to_other_memory),
        cmocka_unit_test(test_matches_naive_sliding_log),
        cmocka_unit_test(test_group_hash_is_fnv1a_of_the_name),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
