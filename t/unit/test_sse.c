/*
 * Incremental text/event-stream framing (WHATWG event stream rules): line
 * ends, field parsing, dispatch, size limit and split feeds; which
 * Content-Type says an event stream.
 */

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "llmgw.h"


#define MAX_EVENTS  16
#define FIELD_MAX   (2 * 1024 * 1024)


typedef struct {
    char    event[64];
    char    id[64];
    char   *data;
    size_t  data_len;
} got_event_t;

typedef struct {
    got_event_t  ev[MAX_EVENTS];
    int          n;
} got_t;


static void
copy_field(char *dst, size_t size, llmgw_str_t s)
{
    assert_true(s.len < size);
    memcpy(dst, s.data, s.len);
    dst[s.len] = '\0';
}


/* Copies out: the parser's strings live only during the call. */
static void
collect(void *arg, const llmgw_sse_event_t *ev)
{
    got_t        *g = arg;
    got_event_t  *e;

    assert_true(g->n < MAX_EVENTS);
    e = &g->ev[g->n++];

    copy_field(e->event, sizeof(e->event), ev->event);
    copy_field(e->id, sizeof(e->id), ev->id);
    assert_true(ev->data.len < FIELD_MAX);
    e->data = malloc(ev->data.len + 1);
    assert_non_null(e->data);
    memcpy(e->data, ev->data.data, ev->data.len);
    e->data[ev->data.len] = '\0';
    e->data_len = ev->data.len;
}


static void
got_free(got_t *g)
{
    for (int i = 0; i < g->n; i++) {
        free(g->ev[i].data);
    }

    g->n = 0;
}


static int
feed(llmgw_sse_t *p, const char *s, got_t *g)
{
    return llmgw_sse_feed(p, s, strlen(s), collect, g);
}


/* Feeds the whole text at once, then expects exactly n events. */
static void
parse_all(const char *text, got_t *g, int n)
{
    llmgw_sse_t *p = llmgw_sse_new(0);

    assert_non_null(p);
    memset(g, 0, sizeof(*g));
    assert_int_equal(feed(p, text, g), 0);
    assert_int_equal(g->n, n);
    llmgw_sse_free(p);
}


static void
assert_event(const got_t *g, int i, const char *event, const char *id,
    const char *data)
{
    assert_string_equal(g->ev[i].event, event);
    assert_string_equal(g->ev[i].id, id);
    assert_string_equal(g->ev[i].data, data);
}


static void
test_blank_line_dispatches_message_event(void **state)
{
    got_t g;

    parse_all("data: hello\n\n", &g, 1);
    assert_event(&g, 0, "message", "", "hello");
    got_free(&g);
}


static void
test_crlf_line_ends(void **state)
{
    got_t g;

    parse_all("event: a\r\ndata: 1\r\ndata: 2\r\n\r\ndata: 3\r\n\r\n", &g, 2);
    assert_event(&g, 0, "a", "", "1\n2");
    assert_event(&g, 1, "message", "", "3");
    got_free(&g);
}


static void
test_cr_only_line_ends(void **state)
{
    got_t g;

    parse_all("data: 1\rdata: 2\r\rdata: 3\r\r", &g, 2);
    assert_event(&g, 0, "message", "", "1\n2");
    assert_event(&g, 1, "message", "", "3");
    got_free(&g);
}


static void
test_crlf_split_across_feeds(void **state)
{
    llmgw_sse_t  *p = llmgw_sse_new(0);
    got_t         g = { .n = 0 };

    /* were the LF a line end of its own, "a" would dispatch alone */
    assert_int_equal(feed(p, "data: a\r", &g), 0);
    assert_int_equal(feed(p, "", &g), 0);
    assert_int_equal(feed(p, "\ndata: b\r\n\r\n", &g), 0);
    assert_int_equal(g.n, 1);
    assert_event(&g, 0, "message", "", "a\nb");
    got_free(&g);
    llmgw_sse_free(p);
}


static void
test_cr_at_end_of_feed_without_lf_is_a_line_end(void **state)
{
    llmgw_sse_t  *p = llmgw_sse_new(0);
    got_t         g = { .n = 0 };

    assert_int_equal(feed(p, "data: a\r", &g), 0);
    assert_int_equal(feed(p, "data: b\r", &g), 0);
    assert_int_equal(feed(p, "\r", &g), 0);
    assert_int_equal(g.n, 1);
    assert_event(&g, 0, "message", "", "a\nb");
    got_free(&g);
    llmgw_sse_free(p);
}


static void
test_data_lines_joined_with_lf(void **state)
{
    got_t g;

    parse_all("data: {\"a\":\ndata: 1}\ndata:\n\n", &g, 1);
    assert_event(&g, 0, "message", "", "{\"a\":\n1}\n");
    got_free(&g);
}


static void
test_only_one_leading_space_is_removed(void **state)
{
    got_t g;

    parse_all("data:x\n\ndata:  y\n\ndata:\tz\n\n", &g, 3);
    assert_event(&g, 0, "message", "", "x");
    assert_event(&g, 1, "message", "", " y");
    assert_event(&g, 2, "message", "", "\tz");
    got_free(&g);
}


static void
test_value_keeps_later_colons(void **state)
{
    got_t g;

    parse_all("data: {\"k\":\"v:w\"}\n\n", &g, 1);
    assert_event(&g, 0, "message", "", "{\"k\":\"v:w\"}");
    got_free(&g);
}


static void
test_event_name_resets_after_dispatch(void **state)
{
    got_t g;

    parse_all("event: content_block_delta\ndata: 1\n\ndata: 2\n\n", &g, 2);
    assert_event(&g, 0, "content_block_delta", "", "1");
    assert_event(&g, 1, "message", "", "2");
    got_free(&g);
}


static void
test_empty_event_name_means_message(void **state)
{
    got_t g;

    parse_all("event:\ndata: 1\n\n", &g, 1);
    assert_event(&g, 0, "message", "", "1");
    got_free(&g);
}


static void
test_last_id_is_kept_across_events(void **state)
{
    got_t g;

    parse_all("id: 7\ndata: a\n\ndata: b\n\nid:\ndata: c\n\n", &g, 3);
    assert_event(&g, 0, "message", "7", "a");
    assert_event(&g, 1, "message", "7", "b");
    assert_event(&g, 2, "message", "", "c");
    got_free(&g);
}


static void
test_id_containing_nul_is_ignored(void **state)
{
    static const char  text[] = "id: 1\ndata: a\n\nid: 2\0x\ndata: b\n\n";
    llmgw_sse_t       *p = llmgw_sse_new(0);
    got_t              g = { .n = 0 };

    assert_int_equal(llmgw_sse_feed(p, text, sizeof(text) - 1, collect, &g),
                     0);
    assert_int_equal(g.n, 2);
    assert_event(&g, 1, "message", "1", "b");
    got_free(&g);
    llmgw_sse_free(p);
}


static void
test_comment_lines_are_ignored(void **state)
{
    got_t g;

    parse_all(": keep-alive\n\n:data: x\ndata: y\n: mid\n\n", &g, 1);
    assert_event(&g, 0, "message", "", "y");
    got_free(&g);
}


static void
test_blank_lines_without_fields_do_not_dispatch(void **state)
{
    got_t g;

    parse_all("\n\r\n\r\n\n", &g, 0);
}


static void
test_event_name_without_data_dispatches(void **state)
{
    got_t g;

    parse_all("event: ping\n\n", &g, 1);
    assert_event(&g, 0, "ping", "", "");
    got_free(&g);
}


static void
test_field_without_colon_has_empty_value(void **state)
{
    got_t g;

    parse_all("data\n\ndata\ndata\n\n", &g, 2);
    assert_event(&g, 0, "message", "", "");
    assert_event(&g, 1, "message", "", "\n");
    got_free(&g);
}


static void
test_unknown_fields_are_ignored(void **state)
{
    got_t g;

    parse_all("foo: bar\nretry: 100\nDATA: no\ndata : no\ndata: yes\n\n",
              &g, 1);
    assert_event(&g, 0, "message", "", "yes");
    got_free(&g);
}


static void
test_incomplete_event_is_not_dispatched(void **state)
{
    got_t g;

    parse_all("data: a\n", &g, 0);
    parse_all("data: a", &g, 0);
}


static void
test_leading_bom_is_skipped(void **state)
{
    got_t g;

    parse_all("\xef\xbb\xbf" "data: a\n\n", &g, 1);
    assert_event(&g, 0, "message", "", "a");
    got_free(&g);
}


static void
test_byte_by_byte_feeds_equal_one_feed(void **state)
{
    static const char  text[] =
        "event: x\r\nid: 9\r\ndata: one\r\ndata: two\r\n\r\n"
        ": c\rdata: three\r\rdata: four\n\n";
    llmgw_sse_t       *p = llmgw_sse_new(0);
    got_t              g = { .n = 0 };

    for (size_t i = 0; i < sizeof(text) - 1; i++) {
        assert_int_equal(llmgw_sse_feed(p, text + i, 1, collect, &g), 0);
    }

    assert_int_equal(g.n, 3);
    assert_event(&g, 0, "x", "9", "one\ntwo");
    assert_event(&g, 1, "message", "9", "three");
    assert_event(&g, 2, "message", "9", "four");
    got_free(&g);
    llmgw_sse_free(p);
}


static void
test_event_at_max_size_is_accepted(void **state)
{
    llmgw_sse_t  *p = llmgw_sse_new(10);
    got_t         g = { .n = 0 };

    assert_int_equal(feed(p, "data: 0123456789\n\n", &g), 0);
    assert_int_equal(g.n, 1);
    assert_event(&g, 0, "message", "", "0123456789");
    got_free(&g);
    llmgw_sse_free(p);
}


static void
test_event_over_max_fails_and_stays_failed(void **state)
{
    llmgw_sse_t  *p = llmgw_sse_new(10);
    got_t         g = { .n = 0 };

    assert_int_equal(feed(p, "data: 01234567890\n", &g), -1);
    assert_int_equal(feed(p, "\ndata: ok\n\n", &g), -1);
    assert_int_equal(g.n, 0);
    llmgw_sse_free(p);
}


static void
test_max_counts_joined_data_with_newlines(void **state)
{
    llmgw_sse_t  *p = llmgw_sse_new(3);
    got_t         g = { .n = 0 };

    assert_int_equal(feed(p, "data: a\ndata: b\n\n", &g), 0);
    assert_int_equal(g.n, 1);
    assert_event(&g, 0, "message", "", "a\nb");
    assert_int_equal(feed(p, "data: a\ndata: b\ndata: c\n", &g), -1);
    assert_int_equal(g.n, 1);
    got_free(&g);
    llmgw_sse_free(p);
}


static void
test_limit_is_per_event_not_per_stream(void **state)
{
    llmgw_sse_t  *p = llmgw_sse_new(4);
    got_t         g = { .n = 0 };

    for (int i = 0; i < 10; i++) {
        assert_int_equal(feed(p, "data: abcd\n\n", &g), 0);
    }

    assert_int_equal(g.n, 10);
    got_free(&g);
    llmgw_sse_free(p);
}


static void
test_endless_line_fails_instead_of_buffering(void **state)
{
    llmgw_sse_t  *p = llmgw_sse_new(10);
    got_t         g = { .n = 0 };
    char          chunk[101];
    int           rc = 0;

    memset(chunk, 'x', 100);
    chunk[100] = '\0';

    for (int i = 0; i < 10 && rc == 0; i++) {
        rc = feed(p, chunk, &g);
    }

    assert_int_equal(rc, -1);
    llmgw_sse_free(p);
}


static void
test_default_max_is_one_mib(void **state)
{
    size_t        n = 1024 * 1024;
    char         *line = malloc(n + 16);
    llmgw_sse_t  *p = llmgw_sse_new(0);
    got_t         g = { .n = 0 };

    assert_non_null(line);
    memcpy(line, "data: ", 6);
    memset(line + 6, 'q', n);
    memcpy(line + 6 + n, "\n\n", 3);

    assert_int_equal(feed(p, line, &g), 0);
    assert_int_equal(g.n, 1);
    assert_int_equal(g.ev[0].data_len, n);
    got_free(&g);

    memcpy(line + 6 + n, "q\n\n", 4);
    assert_int_equal(feed(p, line, &g), -1);
    assert_int_equal(g.n, 0);

    free(line);
    llmgw_sse_free(p);
}


static int
event_stream(const char *content_type)
{
    return llmgw_is_event_stream((llmgw_str_t) { content_type,
                                                 strlen(content_type) });
}


/* RFC 9110 8.3.1: the media type ignores case, parameters follow ";". */
static void
test_event_stream_type_is_the_media_type_ignoring_case(void **state)
{
    (void) state;

    assert_true(event_stream("text/event-stream"));
    assert_true(event_stream("Text/Event-Stream; charset=utf-8"));
    assert_true(event_stream(" TEXT/EVENT-STREAM ;charset=UTF-8"));
    assert_true(event_stream("text/event-stream\t"));

    assert_false(event_stream("text/event-streamx"));
    assert_false(event_stream("xtext/event-stream"));
    assert_false(event_stream("text/event-stream-json"));
    assert_false(event_stream("application/json; x=text/event-stream"));
    assert_false(event_stream("text/plain, text/event-stream"));
    assert_false(event_stream(""));
    assert_false(llmgw_is_event_stream((llmgw_str_t) { NULL, 0 }));
}


int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_blank_line_dispatches_message_event),
        cmocka_unit_test(test_crlf_line_ends),
        cmocka_unit_test(test_cr_only_line_ends),
        cmocka_unit_test(test_crlf_split_across_feeds),
        cmocka_unit_test(test_cr_at_end_of_feed_without_lf_is_a_line_end),
        cmocka_unit_test(test_data_lines_joined_with_lf),
        cmocka_unit_test(test_only_one_leading_space_is_removed),
        cmocka_unit_test(test_value_keeps_later_colons),
        cmocka_unit_test(test_event_name_resets_after_dispatch),
        cmocka_unit_test(test_empty_event_name_means_message),
        cmocka_unit_test(test_last_id_is_kept_across_events),
        cmocka_unit_test(test_id_containing_nul_is_ignored),
        cmocka_unit_test(test_comment_lines_are_ignored),
        cmocka_unit_test(test_blank_lines_without_fields_do_not_dispatch),
        cmocka_unit_test(test_event_name_without_data_dispatches),
        cmocka_unit_test(test_field_without_colon_has_empty_value),
        cmocka_unit_test(test_unknown_fields_are_ignored),
        cmocka_unit_test(test_incomplete_event_is_not_dispatched),
        cmocka_unit_test(test_leading_bom_is_skipped),
        cmocka_unit_test(test_byte_by_byte_feeds_equal_one_feed),
        cmocka_unit_test(test_event_at_max_size_is_accepted),
        cmocka_unit_test(test_event_over_max_fails_and_stays_failed),
        cmocka_unit_test(test_max_counts_joined_data_with_newlines),
        cmocka_unit_test(test_limit_is_per_event_not_per_stream),
        cmocka_unit_test(test_endless_line_fails_instead_of_buffering),
        cmocka_unit_test(test_default_max_is_one_mib),
        cmocka_unit_test(
            test_event_stream_type_is_the_media_type_ignoring_case),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
