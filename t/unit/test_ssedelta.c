/*
 * SSE submit results: the snapshot result shape, delta changes (set,
 * append, appendText), their atomicity, every limit at its boundary, and
 * the event object given to the hooks.
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
#include "ssedelta.h"


#define MIB  (1024 * 1024)


/* ---- helpers ---- */

/* A growing malloc'ed string. */
typedef struct {
    char    *s;
    size_t   len;
} text_t;

static void
add(text_t *t, const char *s)
{
    size_t n = strlen(s);

    t->s = realloc(t->s, t->len + n + 1);
    assert_non_null(t->s);
    memcpy(t->s + t->len, s, n + 1);
    t->len += n;
}

static void
add_repeat(text_t *t, const char *s, size_t times)
{
    size_t n = strlen(s);

    t->s = realloc(t->s, t->len + n * times + 1);
    assert_non_null(t->s);
    for (size_t i = 0; i < times; i++) {
        memcpy(t->s + t->len, s, n);
        t->len += n;
    }
    t->s[t->len] = '\0';
}

/* {"changes":[<one change>],"state":null,"done":false} */
static char *
one_change(const char *op, const char *path, const text_t *value)
{
    text_t t = { NULL, 0 };

    add(&t, "{\"changes\":[{\"op\":\"");
    add(&t, op);
    add(&t, "\",\"path\":");
    add(&t, path);
    add(&t, ",\"value\":");
    add(&t, value->s);
    add(&t, "}],\"state\":null,\"done\":false}");
    return t.s;
}

static char *
body_of(const llmgw_sse_acc_t *a)
{
    llmgw_buf_t b = llmgw_sse_acc_body(a);

    assert_non_null(b.data);
    assert_int_equal(strlen(b.data), b.len);
    return b.data;
}

static void
assert_body(const llmgw_sse_acc_t *a, const char *expected)
{
    char *body = body_of(a);

    assert_string_equal(body, expected);
    free(body);
}

/* Applies a result that must succeed; returns done. */
static int
apply_ok(llmgw_sse_acc_t *a, const char *json)
{
    llmgw_buf_t state;
    char err[512] = "";
    int done = -1;
    int rc = llmgw_sse_acc_apply(a, json, strlen(json), &done, &state, err,
                                 sizeof(err));

    if (rc != 0) {
        print_error("unexpected error: %s\n", err);
    }
    assert_int_equal(rc, 0);
    assert_non_null(state.data);
    llmgw_buf_free(&state);
    return done;
}

/* A result that must fail with a message holding want, leaving the body
   exactly as it was. */
static void
apply_fails(llmgw_sse_acc_t *a, const char *json, const char *want)
{
    char *before = body_of(a);
    llmgw_buf_t state = { (char *) "x", 1 };
    char err[512] = "";
    int done = -1;
    int rc = llmgw_sse_acc_apply(a, json, strlen(json), &done, &state, err,
                                 sizeof(err));

    assert_int_equal(rc, -1);
    assert_null(state.data);
    if (strstr(err, want) == NULL) {
        print_error("error \"%s\" lacks \"%s\"\n", err, want);
        fail();
    }

    char *after = body_of(a);
    assert_string_equal(after, before);
    free(before);
    free(after);
}

static llmgw_sse_acc_t *
acc_with(const char *root_json)
{
    llmgw_sse_acc_t *a = llmgw_sse_acc_new();
    text_t v = { NULL, 0 };

    assert_non_null(a);
    add(&v, root_json);
    char *ev = one_change("set", "[]", &v);
    apply_ok(a, ev);
    free(ev);
    free(v.s);
    return a;
}

static void
set_root_ok(llmgw_sse_acc_t *a, const text_t *value)
{
    char *ev = one_change("set", "[]", value);
    apply_ok(a, ev);
    free(ev);
}


/* ---- snapshot mode ---- */

static void
test_snapshot_result_gives_state_and_done(void **unused)
{
    const char *j = "{\"state\":{\"text\":\"hi\",\"n\":[1,2.5]},\"done\":true}";
    llmgw_buf_t state;
    char err[256];
    int done = 0;

    (void) unused;
    assert_int_equal(llmgw_sse_snapshot_result(j, strlen(j), &done, &state,
                                               err, sizeof(err)), 0);
    assert_int_equal(done, 1);
    assert_string_equal(state.data, "{\"text\":\"hi\",\"n\":[1,2.5]}");
    llmgw_buf_free(&state);

    j = "{\"done\":false,\"state\":null}";
    assert_int_equal(llmgw_sse_snapshot_result(j, strlen(j), &done, &state,
                                               err, sizeof(err)), 0);
    assert_int_equal(done, 0);
    assert_string_equal(state.data, "null");
    llmgw_buf_free(&state);
}

static void
snapshot_fails(const char *j, const char *want)
{
    llmgw_buf_t state;
    char err[256] = "";
    int done = 0;

    assert_int_equal(llmgw_sse_snapshot_result(j, strlen(j), &done, &state,
                                               err, sizeof(err)), -1);
    assert_null(state.data);
    if (strstr(err, want) == NULL) {
        print_error("error \"%s\" lacks \"%s\"\n", err, want);
        fail();
    }
}

static void
test_snapshot_result_needs_exactly_state_and_done(void **unused)
{
    (void) unused;
    snapshot_fails("{\"state\":1}", "has no \"done\"");
    snapshot_fails("{\"done\":true}", "has no \"state\"");
    snapshot_fails("{\"state\":1,\"done\":true,\"extra\":0}",
                   "unknown member \"extra\"");
    snapshot_fails("{\"state\":1,\"done\":1}", "\"done\" is not a boolean");
    snapshot_fails("[1]", "is not an object");
    snapshot_fails("\"done\"", "is not an object with state, done");
    snapshot_fails("null", "is not an object with state, done");
    snapshot_fails("{\"state\":", "not valid JSON");
}

static void
test_snapshot_state_is_capped_at_one_mib(void **unused)
{
    text_t t = { NULL, 0 };
    llmgw_buf_t state;
    char err[256] = "";
    int done;

    (void) unused;
    /* "x...x" encodes to n + 2 bytes */
    add(&t, "{\"done\":true,\"state\":\"");
    add_repeat(&t, "x", MIB - 2);
    add(&t, "\"}");
    assert_int_equal(llmgw_sse_snapshot_result(t.s, t.len, &done, &state,
                                               err, sizeof(err)), 0);
    assert_int_equal(state.len, MIB);
    llmgw_buf_free(&state);

    t.len -= 2;
    add(&t, "x\"}");
    assert_int_equal(llmgw_sse_snapshot_result(t.s, t.len, &done, &state,
                                               err, sizeof(err)), -1);
    assert_non_null(strstr(err, "1048577 bytes"));
    free(t.s);
}


/* ---- delta mode: operations ---- */

static void
test_body_starts_as_null(void **unused)
{
    llmgw_sse_acc_t *a = llmgw_sse_acc_new();

    (void) unused;
    assert_body(a, "null");
    llmgw_sse_acc_free(a);
}

static void
test_set_append_and_append_text_build_the_body(void **unused)
{
    llmgw_sse_acc_t *a = llmgw_sse_acc_new();
    const char *ev =
        "{\"changes\":["
        "{\"op\":\"set\",\"path\":[],\"value\":{\"id\":\"t1\"}},"
        "{\"op\":\"set\",\"path\":[\"items\"],\"value\":[]},"
        "{\"op\":\"append\",\"path\":[\"items\"],\"value\":{\"text\":\"He\"}},"
        "{\"op\":\"appendText\",\"path\":[\"items\",0,\"text\"],"
        "\"value\":\"llo\"},"
        "{\"op\":\"append\",\"path\":[\"items\"],\"value\":2},"
        "{\"op\":\"set\",\"path\":[\"items\",1],\"value\":[true,null]},"
        "{\"op\":\"set\",\"path\":[\"id\"],\"value\":\"t2\"}"
        "],\"state\":{\"seen\":1},\"done\":false}";

    (void) unused;
    assert_int_equal(apply_ok(a, ev), 0);
    assert_body(a, "{\"id\":\"t2\",\"items\":[{\"text\":\"Hello\"},"
                   "[true,null]]}");

    assert_int_equal(apply_ok(a, "{\"changes\":[],\"state\":null,"
                                 "\"done\":true}"), 1);
    assert_body(a, "{\"id\":\"t2\",\"items\":[{\"text\":\"Hello\"},"
                   "[true,null]]}");
    llmgw_sse_acc_free(a);
}

static void
test_state_is_returned_as_json_text(void **unused)
{
    llmgw_sse_acc_t *a = llmgw_sse_acc_new();
    const char *ev = "{\"done\":false,\"changes\":[],"
                     "\"state\":{\"n\":3,\"s\":\"a\\nb\"}}";
    llmgw_buf_t state;
    char err[256];
    int done = 1;

    (void) unused;
    assert_int_equal(llmgw_sse_acc_apply(a, ev, strlen(ev), &done, &state,
                                         err, sizeof(err)), 0);
    assert_int_equal(done, 0);
    assert_string_equal(state.data, "{\"n\":3,\"s\":\"a\\nb\"}");
    llmgw_buf_free(&state);
    llmgw_sse_acc_free(a);
}

static void
test_numbers_keep_their_shortest_form(void **unused)
{
    llmgw_sse_acc_t *a = acc_with("[1.5,0.1,1e300,-0,12345678901,-7,2.0]");

    (void) unused;
    assert_body(a, "[1.5,0.1,1e+300,0,12345678901,-7,2]");
    llmgw_sse_acc_free(a);
}

static void
test_set_adds_a_member_and_replaces_an_existing_one(void **unused)
{
    llmgw_sse_acc_t *a = acc_with("{\"a\":1}");

    (void) unused;
    apply_ok(a, "{\"changes\":[{\"op\":\"set\",\"path\":[\"b\"],\"value\":2},"
                "{\"op\":\"set\",\"path\":[\"a\"],\"value\":[3]}],"
                "\"state\":null,\"done\":false}");
    assert_body(a, "{\"a\":[3],\"b\":2}");
    llmgw_sse_acc_free(a);
}

static void
test_set_needs_existing_parents_and_indices(void **unused)
{
    llmgw_sse_acc_t *a = acc_with("{\"list\":[1],\"n\":5,\"s\":\"x\"}");

    (void) unused;
    apply_fails(a, "{\"changes\":[{\"op\":\"set\",\"path\":[\"x\",\"y\"],"
                   "\"value\":1}],\"state\":null,\"done\":false}",
                "submit event change 0: path segment 0 (\"x\") does not "
                "exist");
    /* an index equal to the length is not an existing element */
    apply_fails(a, "{\"changes\":[{\"op\":\"set\",\"path\":[\"list\",1],"
                   "\"value\":1}],\"state\":null,\"done\":false}",
                "path segment 1 (1) does not exist");
    apply_fails(a, "{\"changes\":[{\"op\":\"set\",\"path\":[\"n\",\"y\"],"
                   "\"value\":1}],\"state\":null,\"done\":false}",
                "path segment 1 (\"y\") is a member name but the value "
                "there is a number");
    apply_fails(a, "{\"changes\":[{\"op\":\"set\",\"path\":[0],"
                   "\"value\":1}],\"state\":null,\"done\":false}",
                "path segment 0 (0) is an index but the value there is an "
                "object");
    apply_fails(a, "{\"changes\":[{\"op\":\"set\",\"path\":[\"list\",\"0\"],"
                   "\"value\":1}],\"state\":null,\"done\":false}",
                "is a member name but the value there is an array");

    apply_ok(a, "{\"changes\":[{\"op\":\"set\",\"path\":[\"list\",0],"
                "\"value\":9}],\"state\":null,\"done\":false}");
    assert_body(a, "{\"list\":[9],\"n\":5,\"s\":\"x\"}");
    llmgw_sse_acc_free(a);
}

static void
test_append_needs_an_array_and_append_text_a_string(void **unused)
{
    llmgw_sse_acc_t *a = acc_with("{\"list\":[],\"s\":\"x\"}");

    (void) unused;
    apply_fails(a, "{\"changes\":[{\"op\":\"append\",\"path\":[\"s\"],"
                   "\"value\":1}],\"state\":null,\"done\":false}",
                "append needs an array at the path, found a string");
    apply_fails(a, "{\"changes\":[{\"op\":\"append\",\"path\":[\"nope\"],"
                   "\"value\":1}],\"state\":null,\"done\":false}",
                "path segment 0 (\"nope\") does not exist");
    apply_fails(a, "{\"changes\":[{\"op\":\"appendText\",\"path\":[\"list\"],"
                   "\"value\":\"y\"}],\"state\":null,\"done\":false}",
                "appendText needs a string at the path, found an array");
    apply_fails(a, "{\"changes\":[{\"op\":\"appendText\",\"path\":[\"s\"],"
                   "\"value\":1}],\"state\":null,\"done\":false}",
                "appendText needs a string value");
    llmgw_sse_acc_free(a);
}

static void
test_result_and_changes_need_exact_members(void **unused)
{
    llmgw_sse_acc_t *a = acc_with("[]");

    (void) unused;
    apply_fails(a, "{\"changes\":[],\"done\":false}", "has no \"state\"");
    apply_fails(a, "{\"changes\":[],\"state\":1}", "has no \"done\"");
    apply_fails(a, "{\"state\":1,\"done\":true}", "has no \"changes\"");
    apply_fails(a, "{\"changes\":[],\"state\":1,\"done\":true,\"body\":2}",
                "unknown member \"body\"");
    apply_fails(a, "{\"changes\":{},\"state\":1,\"done\":true}",
                "\"changes\" is not an array");
    apply_fails(a, "{\"changes\":[],\"state\":1,\"done\":\"yes\"}",
                "\"done\" is not a boolean");
    apply_fails(a, "{\"changes\":[{\"op\":\"set\",\"path\":[]}],"
                   "\"state\":1,\"done\":true}",
                "submit event change 0 has no \"value\"");
    apply_fails(a, "{\"changes\":[{\"op\":\"append\",\"path\":[],\"value\":1,"
                   "\"x\":1}],\"state\":1,\"done\":true}",
                "submit event change 0 has an unknown member \"x\"");
    apply_fails(a, "{\"changes\":[{\"op\":\"delete\",\"path\":[],"
                   "\"value\":1}],\"state\":1,\"done\":true}",
                "op is not \"set\", \"append\" or \"appendText\"");
    apply_fails(a, "{\"changes\":[{\"op\":\"set\",\"path\":\"a\","
                   "\"value\":1}],\"state\":1,\"done\":true}",
                "path is not an array");
    apply_fails(a, "{\"changes\":[{\"op\":\"append\",\"path\":[-1],"
                   "\"value\":1}],\"state\":1,\"done\":true}",
                "path segment 0 is neither a string nor a non-negative "
                "integer");
    apply_fails(a, "{\"changes\":[{\"op\":\"append\",\"path\":[0.5],"
                   "\"value\":1}],\"state\":1,\"done\":true}",
                "path segment 0 is neither");
    apply_fails(a, "{\"changes\":[5],\"state\":1,\"done\":true}",
                "submit event change 0 is not an object");
    apply_fails(a, "not json", "not valid JSON");
    llmgw_sse_acc_free(a);
}


/* ---- atomicity ---- */

static void
test_a_failing_change_undoes_the_whole_event(void **unused)
{
    llmgw_sse_acc_t *a = acc_with("{\"list\":[1],\"s\":\"ab\",\"o\":{}}");

    (void) unused;
    /* every kind of change, then one that fails */
    apply_fails(a,
        "{\"changes\":["
        "{\"op\":\"set\",\"path\":[\"list\",0],\"value\":\"replaced\"},"
        "{\"op\":\"append\",\"path\":[\"list\"],\"value\":2},"
        "{\"op\":\"appendText\",\"path\":[\"s\"],\"value\":\"cd\"},"
        "{\"op\":\"set\",\"path\":[\"o\",\"new\"],\"value\":1},"
        "{\"op\":\"set\",\"path\":[\"o\"],\"value\":null},"
        "{\"op\":\"set\",\"path\":[],\"value\":[]},"
        "{\"op\":\"append\",\"path\":[],\"value\":3},"
        "{\"op\":\"set\",\"path\":[5],\"value\":1}"
        "],\"state\":null,\"done\":true}",
        "submit event change 7: path segment 0 (5) does not exist");

    /* the undone member is really gone: adding it again works once */
    apply_ok(a, "{\"changes\":["
                "{\"op\":\"set\",\"path\":[\"o\",\"new\"],\"value\":1},"
                "{\"op\":\"appendText\",\"path\":[\"s\"],\"value\":\"c\"}"
                "],\"state\":null,\"done\":false}");
    assert_body(a, "{\"list\":[1],\"s\":\"abc\",\"o\":{\"new\":1}}");
    llmgw_sse_acc_free(a);
}

static void
test_a_limit_failure_undoes_the_whole_event(void **unused)
{
    llmgw_sse_acc_t *a = acc_with("[]");
    text_t ev = { NULL, 0 };

    (void) unused;
    /* a small change, then one that puts the body over 1 MiB */
    add(&ev, "{\"changes\":[{\"op\":\"append\",\"path\":[],\"value\":1},"
             "{\"op\":\"append\",\"path\":[],\"value\":\"");
    add_repeat(&ev, "x", MIB);
    add(&ev, "\"}],\"state\":null,\"done\":false}");
    apply_fails(a, ev.s, "bytes encoded (at most 1048576)");
    assert_body(a, "[]");
    free(ev.s);
    llmgw_sse_acc_free(a);
}


/* ---- limits at their boundaries ---- */

static char *
appends(size_t n)
{
    text_t t = { NULL, 0 };

    add(&t, "{\"changes\":[");
    for (size_t i = 0; i < n; i++) {
        add(&t, i ? ",{\"op\":\"append\",\"path\":[],\"value\":0}"
                  : "{\"op\":\"append\",\"path\":[],\"value\":0}");
    }
    add(&t, "],\"state\":null,\"done\":false}");
    return t.s;
}

static void
test_at_most_256_changes_per_event(void **unused)
{
    llmgw_sse_acc_t *a = acc_with("[]");
    char *ok = appends(256), *over = appends(257);

    (void) unused;
    apply_ok(a, ok);
    apply_fails(a, over, "has 257 changes (at most 256 per event)");
    free(ok);
    free(over);
    llmgw_sse_acc_free(a);
}

/* ["k","k",...] with n segments */
static void
add_path(text_t *t, size_t n)
{
    add(t, "[");
    for (size_t i = 0; i < n; i++) {
        add(t, i ? ",\"k\"" : "\"k\"");
    }
    add(t, "]");
}

/* {"k":{"k":...{}}} with n objects */
static void
add_nested_objects(text_t *t, size_t n)
{
    add_repeat(t, "{\"k\":", n - 1);
    add(t, "{}");
    add_repeat(t, "}", n - 1);
}

static void
test_paths_have_at_most_32_segments(void **unused)
{
    text_t nested = { NULL, 0 }, p32 = { NULL, 0 }, p33 = { NULL, 0 };
    text_t one = { NULL, 0 };
    llmgw_sse_acc_t *a = llmgw_sse_acc_new();

    (void) unused;
    add_nested_objects(&nested, 33);        /* objects at levels 0..32 */
    set_root_ok(a, &nested);
    add_path(&p32, 32);
    add_path(&p33, 33);
    add(&one, "1");

    char *ok = one_change("set", p32.s, &one);
    char *over = one_change("set", p33.s, &one);

    apply_ok(a, ok);
    apply_fails(a, over, "path has 33 segments (at most 32)");

    free(ok);
    free(over);
    free(nested.s);
    free(p32.s);
    free(p33.s);
    free(one.s);
    llmgw_sse_acc_free(a);
}

/* n arrays nested around a 0: the 0 sits n levels below the outermost */
static void
add_nested_arrays(text_t *t, size_t n)
{
    add_repeat(t, "[", n);
    add(t, "0");
    add_repeat(t, "]", n);
}

static void
test_values_sit_at_most_32_levels_below_the_root(void **unused)
{
    text_t d32 = { NULL, 0 }, d33 = { NULL, 0 };
    llmgw_sse_acc_t *a = llmgw_sse_acc_new();

    (void) unused;
    add_nested_arrays(&d32, 32);
    add_nested_arrays(&d33, 33);

    char *ok = one_change("set", "[]", &d32);
    char *over = one_change("set", "[]", &d33);

    apply_fails(a, over, "the value would reach 33 levels below the root "
                         "(at most 32)");
    apply_ok(a, ok);
    free(ok);
    free(over);
    llmgw_sse_acc_free(a);

    /* append places its value one level below the array */
    text_t d31 = { NULL, 0 };
    a = acc_with("[]");
    add_nested_arrays(&d31, 31);
    ok = one_change("append", "[]", &d31);
    over = one_change("append", "[]", &d32);
    apply_fails(a, over, "33 levels");
    apply_ok(a, ok);
    free(ok);
    free(over);
    free(d31.s);
    free(d32.s);
    free(d33.s);
    llmgw_sse_acc_free(a);
}

static void
test_body_has_at_most_32768_values(void **unused)
{
    llmgw_sse_acc_t *a = acc_with("[]");
    text_t v = { NULL, 0 }, zero = { NULL, 0 };

    (void) unused;
    /* root + one array + 32766 numbers = 32768 */
    add(&v, "[0");
    add_repeat(&v, ",0", 32765);
    add(&v, "]");
    add(&zero, "0");

    char *ok = one_change("append", "[]", &v);
    char *over = one_change("append", "[]", &zero);

    apply_ok(a, ok);
    apply_fails(a, over, "the body would have 32769 values (at most 32768)");

    /* replacing values frees their count */
    char *shrink = one_change("set", "[0]", &zero);
    apply_ok(a, shrink);
    apply_ok(a, over);

    free(ok);
    free(over);
    free(shrink);
    free(v.s);
    free(zero.s);
    llmgw_sse_acc_free(a);
}

static void
test_body_is_at_most_one_mib_encoded(void **unused)
{
    llmgw_sse_acc_t *a = acc_with("{}");
    text_t v = { NULL, 0 }, x = { NULL, 0 };

    (void) unused;
    /* {"k\n":"x...x"} is n + 10 bytes */
    add(&v, "\"");
    add_repeat(&v, "x", MIB - 10);
    add(&v, "\"");
    add(&x, "\"x\"");

    char *ok = one_change("set", "[\"k\\n\"]", &v);
    char *over = one_change("appendText", "[\"k\\n\"]", &x);

    apply_ok(a, ok);
    char *body = body_of(a);
    assert_int_equal(strlen(body), MIB);
    free(body);
    apply_fails(a, over, "the body would be 1048577 bytes encoded (at most "
                         "1048576)");

    free(ok);
    free(over);
    free(v.s);
    free(x.s);
    llmgw_sse_acc_free(a);
}

static void
test_escaped_text_counts_as_encoded(void **unused)
{
    llmgw_sse_acc_t *a = acc_with("\"ab\"");
    text_t ctl = { NULL, 0 }, nl = { NULL, 0 };

    (void) unused;
    /* "ab" is 4 bytes; each U+0001 encodes as 6: 4 + 6 x 174762 = 1 MiB */
    add(&ctl, "\"");
    add_repeat(&ctl, "\\u0001", (MIB - 4) / 6);
    add(&ctl, "\"");
    add(&nl, "\"\\n\"");

    char *ok = one_change("appendText", "[]", &ctl);
    char *over = one_change("appendText", "[]", &nl);

    apply_ok(a, ok);
    char *body = body_of(a);
    assert_int_equal(strlen(body), MIB);
    free(body);
    apply_fails(a, over, "1048578 bytes");

    free(ok);
    free(over);
    free(ctl.s);
    free(nl.s);
    llmgw_sse_acc_free(a);
}

static void
test_appended_elements_count_their_commas(void **unused)
{
    llmgw_sse_acc_t *a = acc_with("[1]");
    text_t v = { NULL, 0 };

    (void) unused;
    /* [1,"x...x"] is n + 6 bytes */
    add(&v, "\"");
    add_repeat(&v, "x", MIB - 6);
    add(&v, "\"");

    char *ev = one_change("append", "[]", &v);
    apply_ok(a, ev);
    free(ev);

    v.len = 0;
    add(&v, "\"");
    add_repeat(&v, "x", MIB - 5);
    add(&v, "\"");
    ev = one_change("set", "[1]", &v);
    apply_fails(a, ev, "1048577 bytes");
    free(ev);
    free(v.s);
    llmgw_sse_acc_free(a);
}

static char *
state_event(size_t n)
{
    text_t t = { NULL, 0 };

    add(&t, "{\"changes\":[],\"done\":false,\"state\":\"");
    add_repeat(&t, "s", n);
    add(&t, "\"}");
    return t.s;
}

static void
test_state_is_at_most_64_kib_encoded(void **unused)
{
    llmgw_sse_acc_t *a = acc_with("[]");
    char *ok = state_event(65536 - 2), *over = state_event(65536 - 1);

    (void) unused;
    apply_ok(a, ok);
    apply_fails(a, over, "submit event state is 65537 bytes encoded (at "
                         "most 65536)");
    free(ok);
    free(over);
    llmgw_sse_acc_free(a);
}


/* ---- the event object ---- */

static void
test_event_json_holds_event_id_and_data(void **unused)
{
    llmgw_sse_event_t ev = {
        LLMGW_STR("message"), { "", 0 }, LLMGW_STR("{\"a\":1}\nline \xff")
    };
    llmgw_buf_t b;

    (void) unused;
    b = llmgw_sse_event_json(&ev);
    assert_string_equal(b.data, "{\"event\":\"message\",\"id\":\"\","
                                "\"data\":\"{\\\"a\\\":1}\\nline \xef\xbf\xbd\"}");
    llmgw_buf_free(&b);

    ev.event = LLMGW_STR("done");
    ev.id = LLMGW_STR("42");
    ev.data = (llmgw_str_t) { "", 0 };
    b = llmgw_sse_event_json(&ev);
    assert_string_equal(b.data, "{\"event\":\"done\",\"id\":\"42\","
                                "\"data\":\"\"}");
    llmgw_buf_free(&b);
}


int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_snapshot_result_gives_state_and_done),
        cmocka_unit_test(test_snapshot_result_needs_exactly_state_and_done),
        cmocka_unit_test(test_snapshot_state_is_capped_at_one_mib),
        cmocka_unit_test(test_body_starts_as_null),
        cmocka_unit_test(test_set_append_and_append_text_build_the_body),
        cmocka_unit_test(test_state_is_returned_as_json_text),
        cmocka_unit_test(test_numbers_keep_their_shortest_form),
        cmocka_unit_test(test_set_adds_a_member_and_replaces_an_existing_one),
        cmocka_unit_test(test_set_needs_existing_parents_and_indices),
        cmocka_unit_test(test_append_needs_an_array_and_append_text_a_string),
        cmocka_unit_test(test_result_and_changes_need_exact_members),
        cmocka_unit_test(test_a_failing_change_undoes_the_whole_event),
        cmocka_unit_test(test_a_limit_failure_undoes_the_whole_event),
        cmocka_unit_test(test_at_most_256_changes_per_event),
        cmocka_unit_test(test_paths_have_at_most_32_segments),
        cmocka_unit_test(test_values_sit_at_most_32_levels_below_the_root),
        cmocka_unit_test(test_body_has_at_most_32768_values),
        cmocka_unit_test(test_body_is_at_most_one_mib_encoded),
        cmocka_unit_test(test_escaped_text_counts_as_encoded),
        cmocka_unit_test(test_appended_elements_count_their_commas),
        cmocka_unit_test(test_state_is_at_most_64_kib_encoded),
        cmocka_unit_test(test_event_json_holds_event_id_and_data),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
