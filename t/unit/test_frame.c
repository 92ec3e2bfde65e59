/*
 * The frame header between nginx and v8_host.
 */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "llmgw.h"


static void
test_header_is_twelve_bytes_in_network_order(void **state)
{
    uint8_t        out[LLMGW_FRAME_HEADER_LEN];
    llmgw_frame_t  f = { LLMGW_FRAME_VERSION, LLMGW_FRAME_CALL, 0x01020304,
                         0x0a0b0c0d };
    const uint8_t  want[] = { 1, 2, 0, 0, 1, 2, 3, 4, 0x0a, 0x0b, 0x0c, 0x0d };

    (void) state;

    llmgw_frame_encode(&f, out);
    assert_memory_equal(out, want, sizeof(want));
}


static void
test_round_trip_keeps_type_id_and_length(void **state)
{
    char           err[128];
    uint8_t        buf[LLMGW_FRAME_HEADER_LEN];
    llmgw_frame_t  f = { LLMGW_FRAME_VERSION,
                         LLMGW_FRAME_REPLY | LLMGW_FRAME_LOAD, 0xfffffffe,
                         4096 }, g;

    (void) state;

    llmgw_frame_encode(&f, buf);
    assert_int_equal(llmgw_frame_decode(buf, 1 << 20, &g, err, sizeof(err)),
                     0);
    assert_int_equal(g.type, LLMGW_FRAME_REPLY | LLMGW_FRAME_LOAD);
    assert_int_equal(g.request_id, 0xfffffffe);
    assert_int_equal(g.length, 4096);
}


static void
test_wrong_version_is_refused(void **state)
{
    char           err[128];
    uint8_t        buf[LLMGW_FRAME_HEADER_LEN];
    llmgw_frame_t  f = { 2, LLMGW_FRAME_CALL, 1, 1 }, g;

    (void) state;

    llmgw_frame_encode(&f, buf);
    assert_int_equal(llmgw_frame_decode(buf, 1 << 20, &g, err, sizeof(err)),
                     -1);
    assert_non_null(strstr(err, "version 2"));
}


static void
test_unknown_type_is_refused(void **state)
{
    char           err[128];
    uint8_t        buf[LLMGW_FRAME_HEADER_LEN];
    llmgw_frame_t  f = { LLMGW_FRAME_VERSION, 9, 1, 1 }, g;

    (void) state;

    llmgw_frame_encode(&f, buf);
    assert_int_equal(llmgw_frame_decode(buf, 1 << 20, &g, err, sizeof(err)),
                     -1);
    assert_non_null(strstr(err, "unknown frame type 9"));

    f.type = 0;
    llmgw_frame_encode(&f, buf);
    assert_int_equal(llmgw_frame_decode(buf, 1 << 20, &g, err, sizeof(err)),
                     -1);
}


static void
test_length_over_the_cap_is_refused(void **state)
{
    char           err[128];
    uint8_t        buf[LLMGW_FRAME_HEADER_LEN];
    llmgw_frame_t  f = { LLMGW_FRAME_VERSION, LLMGW_FRAME_STATUS, 7, 1025 },
                   g;

    (void) state;

    llmgw_frame_encode(&f, buf);
    assert_int_equal(llmgw_frame_decode(buf, 1024, &g, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "over the limit of 1024"));

    f.length = 1024;
    llmgw_frame_encode(&f, buf);
    assert_int_equal(llmgw_frame_decode(buf, 1024, &g, err, sizeof(err)), 0);
}


int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_header_is_twelve_bytes_in_network_order),
        cmocka_unit_test(test_round_trip_keeps_type_id_and_length),
        cmocka_unit_test(test_wrong_version_is_refused),
        cmocka_unit_test(test_unknown_type_is_refused),
        cmocka_unit_test(test_length_over_the_cap_is_refused),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
