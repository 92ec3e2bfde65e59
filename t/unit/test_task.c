/*
 * The task engine driven with canned results: which route serves a request,
 * the steps of a submit (hooks, reservation, HTTP, the create statement)
 * and of its refusals, the update a poll writes for each class of vendor
 * answer, batch polling, and an SSE submit read event by event.
 *
 * JSON texts are written with single quotes (sq() turns them into double
 * quotes) so that the expectations stay readable.
 */

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "llmgw.h"
#include "task.h"
#include "balances_seen.h"


#define S(s)  ((llmgw_str_t) { (s), strlen(s) })


/* ---- fixtures ---- */

#define VID_MANIFEST                                                         \
    "{'key':'vid','channelTypes':[50],"                                      \
    "'submitResponseTypes':['json','sse'],"                                  \
    "'usageSchema':{'seconds':{'type':'number','unit':'second'}},"           \
    "'exports':['extractUsage','buildSubmitRequest','parseSubmitResponse',"  \
    "'parseSubmitEvent','buildQueryRequest','parseTaskResult',"              \
    "'extractUsageOnComplete','native.decodeX','native.renderX',"           \
    "'native.error'],"                                                       \
    "'routes':["                                                             \
    "{'method':'POST','path':'/vid/v1/generate','type':'submit',"            \
    "'decode':'decodeX','render':'renderX'},"                                \
    "{'method':'GET','path':'/vid/v1/tasks/:task_id','type':'query',"        \
    "'render':'renderX'},"                                                   \
    "{'method':'GET','path':'/vid/v2/jobs/{id}','type':'query',"             \
    "'taskIdParam':'id','render':'renderX'},"                                \
    "{'method':'POST','path':'/vid/v1/instant','type':'submit',"             \
    "'decode':'decodeX','render':'renderX','retainResult':false}]}"

#define BAT_MANIFEST                                                         \
    "{'key':'bat','channelTypes':[50],'fetchMode':'batch',"                  \
    "'exports':['buildSubmitRequest','parseSubmitResponse',"                 \
    "'buildBatchQueryRequest','parseBatchResult']}"

/* Channel 1 (priority 10) is tried before channel 2; m2 has no price and
 * m3 no channel. */
static const char SNAPSHOT[] =
    "{'revision':1,"
    "'channels':["
    "{'id':1,'name':'one','type':50,'base_url':'https://vendor.example/v1',"
    "'key':'sk-one-secret','models':['m1','m2'],'groups':['default'],"
    "'priority':10,'model_mapping':{'m1':'m1-up'}},"
    "{'id':2,'name':'two','type':50,'base_url':'https://second.example',"
    "'key':'sk-two','models':['m1'],'groups':['default'],'priority':5}],"
    "'groups':{'default':1},"
    "'pricing':{'m1':{'price':0.01}},"
    "'plugins':["
    "{'key':'vid','version':'1.0.0','sha':'sha-vid','manifest':"
    VID_MANIFEST "},"
    "{'key':'bat','version':'2.0.0','sha':'sha-bat','manifest':"
    BAT_MANIFEST "}]}";

static const char TOKEN[] =
    "{'id':7,'user_id':42,'status':'enabled','remain_quota':1000000,"
    "'user':{'status':'enabled','quota':1000000}}";

static llmgw_snapshot_t  *snap;
static llmgw_token_t     *token;

static const llmgw_task_conf_t  conf = {
    .poll_interval_ms = 5000,
    .timeout_ms = 3600000,
    .max_failures = 3,
    .batch_size = 10,
    .max_file_bytes = 0,
    .max_total_bytes = 0,
    .max_redirects = 3,
    .max_tries = 3,
};


/* ---- JSON helpers ---- */

/* A malloc'ed copy with every ' turned into ". */
static char *
sq(const char *s)
{
    char *out = strdup(s);

    assert_non_null(out);
    for (char *p = out; *p != '\0'; p++) {
        if (*p == '\'') {
            *p = '"';
        }
    }
    return out;
}


static json_t *
jparse(const char *text, size_t len)
{
    json_error_t  e;
    json_t       *j = json_loadb(text, len, JSON_DECODE_ANY, &e);

    if (j == NULL) {
        fail_msg("bad JSON (%s): %.*s", e.text, (int) len, text);
    }
    return j;
}


static json_t *
jsq(const char *text)
{
    char   *t = sq(text);
    json_t *j = jparse(t, strlen(t));

    free(t);
    return j;
}


/* The string at a path of object members ("a", "b", NULL); "" if absent. */
static const char *
jstr_at(const json_t *j, ...)
{
    va_list      ap;
    const char  *k;

    va_start(ap, j);
    while ((k = va_arg(ap, const char *)) != NULL) {
        j = json_object_get(j, k);
    }
    va_end(ap);

    return json_is_string(j) ? json_string_value(j) : "";
}


static json_int_t
jint(const json_t *j, const char *k)
{
    const json_t *v = json_object_get(j, k);

    if (!json_is_integer(v)) {
        fail_msg("member %s is not an integer", k);
    }
    return json_integer_value(v);
}


static void
assert_json_eq(const json_t *got, const char *want_sq)
{
    json_t *want = jsq(want_sq);

    if (!json_equal(got, want)) {
        char *g = json_dumps(got, JSON_COMPACT | JSON_SORT_KEYS
                                  | JSON_ENCODE_ANY);
        char *w = json_dumps(want, JSON_COMPACT | JSON_SORT_KEYS);
        print_error("got  %s\nwant %s\n", g, w);
        free(g);
        free(w);
        json_decref(want);
        fail();
    }
    json_decref(want);
}


/* ---- driving a job ---- */

static const llmgw_tstep_t *
expect_step(llmgw_tjob_t *j, llmgw_tstep_e kind)
{
    const llmgw_tstep_t *st = llmgw_tjob_next(j);

    if (st->kind != kind) {
        fail_msg("step %d, expected %d (status %d, body %.*s)", st->kind,
                 kind, st->status, (int) st->body.len,
                 st->body.data ? st->body.data : "");
    }
    return st;
}


/* The next step is a call of hook with the plugin's sha; its frame. */
static json_t *
expect_hook(llmgw_tjob_t *j, const char *hook, const char *sha)
{
    const llmgw_tstep_t *st = expect_step(j, LLMGW_TSTEP_HOOK);
    json_t *frame = jparse(st->body.data, st->body.len);

    assert_string_equal(jstr_at(frame, "hook", NULL), hook);
    assert_string_equal(jstr_at(frame, "sha", NULL), sha);
    assert_string_equal(st->sha, sha);
    assert_true(llmgw_tjob_busy(j));
    return frame;
}


static json_t *
hook_arg(const json_t *frame, size_t i)
{
    json_t *a = json_array_get(json_object_get(frame, "args"), i);

    assert_non_null(a);
    return a;
}


static void
hook_reply(llmgw_tjob_t *j, const char *reply_sq)
{
    char *r = sq(reply_sq);

    llmgw_tjob_hook_done(j, 0, r, strlen(r));
    free(r);
}


static void
hook_ok(llmgw_tjob_t *j, const char *result_sq)
{
    size_t  n = strlen(result_sq) + 32;
    char   *buf = malloc(n);

    assert_non_null(buf);
    snprintf(buf, n, "{'ok':true,'result':%s}", result_sq);
    hook_reply(j, buf);
    free(buf);
}


#define MIB  (1024 * 1024)

/* fmt (one %s) with a JSON string of x's that encodes to n bytes in the
 * place of %s; malloc'ed. */
static char *
with_string_of(const char *fmt, size_t n)
{
    char   *x = malloc(n + 1);
    size_t  len = strlen(fmt) + n + 1;
    char   *out = malloc(len);

    assert_true(n >= 2);
    assert_non_null(x);
    assert_non_null(out);
    memset(x, 'x', n);
    x[0] = '\'';
    x[n - 1] = '\'';
    x[n] = '\0';
    snprintf(out, len, fmt, x);
    free(x);
    return out;
}


/* Expects the next step to be the named hook and answers it. */
static void
pass_hook(llmgw_tjob_t *j, const char *hook, const char *sha,
    const char *result_sq)
{
    json_decref(expect_hook(j, hook, sha));
    hook_ok(j, result_sq);
}


static void
http_reply(llmgw_tjob_t *j, int status, const char *ctype, const char *body)
{
    llmgw_str_t names[] = { LLMGW_STR("Content-Type") };
    llmgw_str_t values[] = { S(ctype) };

    llmgw_tjob_http_done(j, 0, 0, status, names, values, 1, body,
                         strlen(body), NULL);
}


static void
sql_reply(llmgw_tjob_t *j, const char *json_sq)
{
    char *t = sq(json_sq);

    llmgw_tjob_sql_done(j, t, strlen(t), NULL);
    free(t);
}


/* The next step answers the client; its parsed body. */
static json_t *
expect_respond(llmgw_tjob_t *j, int status)
{
    const llmgw_tstep_t *st = expect_step(j, LLMGW_TSTEP_RESPOND);

    assert_int_equal(st->status, status);
    return jparse(st->body.data, st->body.len);
}


/* The next step refuses in the error contract with this status and code;
 * the message contains part (when given). */
static void
expect_error(llmgw_tjob_t *j, int status, const char *type, const char *code,
    const char *part)
{
    json_t *b = expect_respond(j, status);

    assert_string_equal(jstr_at(b, "error", "type", NULL), type);
    assert_string_equal(jstr_at(b, "error", "code", NULL), code);
    if (part != NULL) {
        const char *m = jstr_at(b, "error", "message", NULL);
        if (strstr(m, part) == NULL) {
            fail_msg("message \"%s\" lacks \"%s\"", m, part);
        }
    }
    json_decref(b);
}


/* Request bodies live as long as the group: jobs borrow them. */
static char  *kept_bodies[256];
static size_t nkept;

static void
keep_body(char *body)
{
    assert_true(nkept < sizeof(kept_bodies) / sizeof(kept_bodies[0]));
    kept_bodies[nkept++] = body;
}


static llmgw_tjob_t *
submit_job(const char *body_sq)
{
    llmgw_troute_t  r;
    llmgw_treq_t    q;
    char           *body = sq(body_sq);
    llmgw_tjob_t   *j;

    llmgw_task_route(snap, LLMGW_STR("POST"), LLMGW_STR("/v1/tasks/vid"), &r);
    assert_int_equal(r.kind, LLMGW_TROUTE_SUBMIT);

    memset(&q, 0, sizeof(q));
    q.method = LLMGW_STR("POST");
    q.path = LLMGW_STR("/v1/tasks/vid");
    q.content_type = LLMGW_STR("application/json");
    q.body = S(body);
    q.headers_json = LLMGW_STR("{\"x-trace\":\"t1\"}");
    q.request_id = LLMGW_STR("req-1");
    q.token = token;
    q.group = LLMGW_STR("default");
    q.group_ratio = 1.0;
    q.seed = 1;

    j = llmgw_tjob_request(snap, &conf, &r, &q);
    keep_body(body);            /* the job borrows it (task.h) */
    assert_non_null(j);
    return j;
}


static llmgw_tjob_t *
query_job(const char *method, const char *path)
{
    llmgw_troute_t  r;
    llmgw_treq_t    q;
    llmgw_tjob_t   *j;

    llmgw_task_route(snap, S(method), S(path), &r);
    assert_int_not_equal(r.kind, LLMGW_TROUTE_NONE);
    assert_true(r.method_ok);

    memset(&q, 0, sizeof(q));
    q.method = S(method);
    q.path = S(path);
    q.request_id = LLMGW_STR("req-2");
    q.token = token;
    q.group = LLMGW_STR("default");
    q.group_ratio = 1.0;

    j = llmgw_tjob_request(snap, &conf, &r, &q);
    assert_non_null(j);
    return j;
}


/* A POST to a native route of vid; body_sq as JSON, or (ctype given) the
 * raw body of that type. */
static llmgw_tjob_t *
native_job(const char *path, const char *ctype, const char *body_sq)
{
    llmgw_troute_t  r;
    llmgw_treq_t    q;
    char           *body = ctype ? strdup(body_sq) : sq(body_sq);
    llmgw_tjob_t   *j;

    llmgw_task_route(snap, LLMGW_STR("POST"), S(path), &r);
    assert_int_equal(r.kind, LLMGW_TROUTE_NATIVE);
    assert_true(r.method_ok);

    memset(&q, 0, sizeof(q));
    q.method = LLMGW_STR("POST");
    q.path = S(path);
    q.args = LLMGW_STR("v=1");
    q.content_type = S(ctype ? ctype : "application/json");
    q.body = S(body);
    q.headers_json = LLMGW_STR("{}");
    q.request_id = LLMGW_STR("req-3");
    q.token = token;
    q.group = LLMGW_STR("default");
    q.group_ratio = 1.0;
    q.seed = 1;

    j = llmgw_tjob_request(snap, &conf, &r, &q);
    keep_body(body);
    assert_non_null(j);
    return j;
}


/* A submit of m1 up to its buildSubmitRequest call (extractUsage answered,
 * the reservation granted); the hook's frame. */
static json_t *
submit_to_build(llmgw_tjob_t *j)
{
    pass_hook(j, "extractUsage", "sha-vid", "null");
    const llmgw_tstep_t *st = expect_step(j, LLMGW_TSTEP_RESERVE);
    assert_int_equal(st->amount, 5000);
    llmgw_tjob_reserve_done(j, NULL);
    return expect_hook(j, "buildSubmitRequest", "sha-vid");
}


/* ---- routes ---- */

static void
check_route_in(const llmgw_snapshot_t *s, const char *method,
    const char *path, llmgw_troute_e kind, long plugin, long route,
    int method_ok)
{
    llmgw_troute_t r;

    llmgw_task_route(s, S(method), S(path), &r);
    if (r.kind != kind || r.plugin != plugin || r.route != route
        || r.method_ok != method_ok)
    {
        fail_msg("%s %s: kind %d plugin %ld route %ld ok %d", method, path,
                 r.kind, r.plugin, r.route, r.method_ok);
    }
}


static void
check_route(const char *method, const char *path, llmgw_troute_e kind,
    long plugin, long route, int method_ok)
{
    check_route_in(snap, method, path, kind, plugin, route, method_ok);
}


/* An image or sync Responses request waits 600 s unless configured
   (TASK_PLUGIN_PROTOCOL_TIMEOUT_SECONDS, "default 600 seconds"). */
static void
test_wait_default_is_the_protocol_timeout(void **state)
{
    (void) state;

    assert_int_equal(LLMGW_TASK_WAIT_DEFAULT_MS, 600 * 1000);
}


static void
test_route_generic_submit_and_get(void **state)
{
    (void) state;

    check_route("POST", "/v1/tasks/vid", LLMGW_TROUTE_SUBMIT, 0, -1, 1);
    check_route("post", "/v1/tasks/bat", LLMGW_TROUTE_SUBMIT, 1, -1, 1);
    check_route("POST", "/v1/tasks/nope", LLMGW_TROUTE_SUBMIT, -1, -1, 1);
    check_route("GET", "/v1/tasks/task_abc", LLMGW_TROUTE_GET, -1, -1, 1);
    check_route("DELETE", "/v1/tasks/task_abc", LLMGW_TROUTE_GET, -1, -1, 0);
}


static void
test_route_native_paths_with_parameters(void **state)
{
    (void) state;

    check_route("POST", "/vid/v1/generate", LLMGW_TROUTE_NATIVE, 0, 0, 1);
    check_route("GET", "/vid/v1/tasks/abc", LLMGW_TROUTE_NATIVE, 0, 1, 1);
    check_route("GET", "/vid/v2/jobs/abc", LLMGW_TROUTE_NATIVE, 0, 2, 1);
    /* a known path with another method: 405, not 404; it names the route
       of that path, whose plugin's native.error shapes the 405 */
    check_route("GET", "/vid/v1/generate", LLMGW_TROUTE_NATIVE, 0, 0, 0);
}


static void
test_route_unrelated_paths_are_none(void **state)
{
    (void) state;

    check_route("POST", "/v1/chat/completions", LLMGW_TROUTE_NONE, -1, -1, 0);
    check_route("GET", "/vid/v1/tasks/abc/extra", LLMGW_TROUTE_NONE, -1, -1,
                0);
    check_route("GET", "/vid/v2/jobs", LLMGW_TROUTE_NONE, -1, -1, 0);
    check_route("GET", "/v1/tasks", LLMGW_TROUTE_NONE, -1, -1, 0);
}


static void
check_proto(const char *method, const char *path, llmgw_tproto_e proto,
    int method_ok, const char *allow)
{
    llmgw_troute_t r;

    llmgw_task_route(snap, S(method), S(path), &r);
    if (r.kind != LLMGW_TROUTE_PROTOCOL || r.proto != proto
        || r.method_ok != method_ok || strcmp(r.allow, allow) != 0)
    {
        fail_msg("%s %s: kind %d proto %d ok %d allow %s", method, path,
                 r.kind, r.proto, r.method_ok, r.allow);
    }
}


static void
test_route_host_protocol_paths(void **state)
{
    (void) state;

    check_proto("POST", "/v1/videos", LLMGW_TPROTO_VIDEO_CREATE, 1, "POST");
    check_proto("GET", "/v1/videos/", LLMGW_TPROTO_VIDEO_CREATE, 0, "POST");
    check_proto("GET", "/v1/videos/task_1", LLMGW_TPROTO_VIDEO_GET, 1, "GET");
    check_proto("DELETE", "/v1/videos/task_1", LLMGW_TPROTO_VIDEO_GET, 0,
                "GET");
    check_proto("POST", "/v1/images/generations",
                LLMGW_TPROTO_IMAGE_GENERATE, 1, "POST");
    check_proto("POST", "/v1/images/edits", LLMGW_TPROTO_IMAGE_EDIT, 1,
                "POST");
    check_proto("GET", "/v1/images/edits", LLMGW_TPROTO_IMAGE_EDIT, 0,
                "POST");
    check_route("POST", "/v1/images/variations", LLMGW_TROUTE_NONE, -1, -1, 0);
    check_proto("GET", "/v1/videos/task_1/content",
                LLMGW_TPROTO_VIDEO_CONTENT, 1, "GET, HEAD");
    check_proto("HEAD", "/v1/videos/task_1/content",
                LLMGW_TPROTO_VIDEO_CONTENT, 1, "GET, HEAD");
    check_proto("POST", "/v1/videos/task_1/content",
                LLMGW_TPROTO_VIDEO_CONTENT, 0, "GET, HEAD");
    check_route("GET", "/v1/videos/task_1/other", LLMGW_TROUTE_NONE, -1, -1,
                0);
    check_route("POST", "/v2/videos", LLMGW_TROUTE_NONE, -1, -1, 0);
}


static void
test_route_artifacts_and_content(void **state)
{
    (void) state;

    check_route("GET", "/v1/tasks/task_1/artifacts", LLMGW_TROUTE_ARTIFACTS,
                -1, -1, 1);
    check_route("POST", "/v1/tasks/task_1/artifacts", LLMGW_TROUTE_ARTIFACTS,
                -1, -1, 0);
    check_route("GET", "/v1/tasks/task_1/artifacts/video/content",
                LLMGW_TROUTE_CONTENT, -1, -1, 1);
    check_route("HEAD", "/v1/tasks/task_1/artifacts/video/content",
                LLMGW_TROUTE_CONTENT, -1, -1, 1);
    check_route("DELETE", "/v1/tasks/task_1/artifacts/video/content",
                LLMGW_TROUTE_CONTENT, -1, -1, 0);
    check_route("GET", "/v1/tasks/task_1/artifacts/video",
                LLMGW_TROUTE_NONE, -1, -1, 0);
}


/*
 * Two plugins whose routes overlap (stored with force): "aa-b" sorts first
 * and claims every first segment; "zz-a" names its own.  A third route
 * pair overlaps with the literal segments in other places.
 */
static const char OVERLAP_SNAPSHOT[] =
    "{'revision':1,'channels':[],'groups':{'default':1},'pricing':{},"
    "'plugins':["
    "{'key':'aa-b','version':'1.0.0','sha':'sha-b','manifest':"
    "{'key':'aa-b','routes':["
    "{'method':'POST','path':'/:x/submit','type':'submit',"
    "'decode':'d','render':'r'},"
    "{'method':'GET','path':'/:x/q/:task_id','type':'query','render':'r'},"
    "{'method':'GET','path':'/m/:a/z','type':'query','taskIdParam':'a',"
    "'render':'r'}]}},"
    "{'key':'zz-a','version':'1.0.0','sha':'sha-a','manifest':"
    "{'key':'zz-a','routes':["
    "{'method':'POST','path':'/zz-a/submit','type':'submit',"
    "'decode':'d','render':'r'},"
    "{'method':'GET','path':'/zz-a/q/{task_id}','type':'query',"
    "'render':'r'},"
    "{'method':'GET','path':'/:b/y/:task_id','type':'query',"
    "'render':'r'}]}}]}";

static llmgw_snapshot_t  *overlap_snap;

static void
check_overlap(const char *method, const char *path, long plugin, long route,
    int method_ok)
{
    check_route_in(overlap_snap, method, path, LLMGW_TROUTE_NATIVE, plugin,
                   route, method_ok);
}

static void
test_route_most_specific_wins_over_plugin_order(void **state)
{
    (void) state;

    /* zz-a's literal first segment beats aa-b's parameter */
    check_overlap("POST", "/zz-a/submit", 1, 0, 1);
    check_overlap("POST", "/zz-a/submit/", 1, 0, 1);
    check_overlap("POST", "/zz-a//submit", 1, 0, 1);
    check_overlap("GET", "/zz-a/q/task_1", 1, 1, 1);
    /* other first segments are aa-b's */
    check_overlap("POST", "/other/submit", 0, 0, 1);
    check_overlap("GET", "/other/q/task_1", 0, 1, 1);
    /* left to right: "/m/:a/z" beats "/:b/y/:task_id" at the first
       segment, though the other has a literal second */
    check_overlap("GET", "/m/y/z", 0, 2, 1);
    check_overlap("GET", "/n/y/z", 1, 2, 1);
    /* the method still has to match: 405, not another plugin's route; the
       405 names the most specific route of the path */
    check_overlap("PUT", "/zz-a/submit", 1, 0, 0);
    check_overlap("PUT", "/other/submit", 0, 0, 0);
}


/* ---- queries ---- */

static void
test_get_task_answers_the_view_without_private_fields(void **state)
{
    llmgw_tjob_t         *j = query_job("GET", "/v1/tasks/task_abc");
    const llmgw_tstep_t  *st;
    json_t               *b;

    (void) state;

    st = expect_step(j, LLMGW_TSTEP_SQL);
    assert_string_equal(st->sql,
                        "select llmgw_task_lookup($1::bigint, $2::jsonb)");
    assert_int_equal(st->nparams, 2);
    assert_string_equal(st->params[0], "42");
    assert_string_equal(st->params[1], "[\"task_abc\"]");

    sql_reply(j, "{'tasks':[{'task_id':'task_abc','status':'SUCCESS',"
                 "'plugin_key':'vid','model':'m1','action':'gen',"
                 "'progress':'100%','data':{'url':'u'},"
                 "'upstream_task_id':'up-secret','state':{'s':1},"
                 "'quota':5000,'created_at':10}]}");

    b = expect_respond(j, 200);
    assert_json_eq(b, "{'task_id':'task_abc','status':'SUCCESS',"
                      "'progress':'100%','fail_reason':'','created_at':10,"
                      "'updated_at':null,'finished_at':null,"
                      "'data':{'url':'u'},'model':'m1','action':'gen',"
                      "'plugin':'vid'}");
    json_decref(b);
    llmgw_tjob_free(j);
}


static void
test_get_task_of_another_id_is_not_found(void **state)
{
    llmgw_tjob_t *j = query_job("GET", "/v1/tasks/task_abc");

    (void) state;

    expect_step(j, LLMGW_TSTEP_SQL);
    sql_reply(j, "{'tasks':[]}");
    expect_error(j, 404, "gateway_error", "task_not_found", "task_abc");
    llmgw_tjob_free(j);
}


static void
test_native_query_routes_take_the_id_from_their_parameter(void **state)
{
    const char *paths[] = { "/vid/v1/tasks/abc", "/vid/v2/jobs/abc" };

    (void) state;

    for (size_t i = 0; i < 2; i++) {
        llmgw_tjob_t *j = query_job("GET", paths[i]);
        const llmgw_tstep_t *st = expect_step(j, LLMGW_TSTEP_SQL);

        assert_string_equal(st->params[1], "[\"abc\"]");
        sql_reply(j, "{'tasks':[{'task_id':'abc','status':'QUEUED',"
                     "'plugin_key':'vid'}]}");

        json_t *f = expect_hook(j, "native.renderX", "sha-vid");
        assert_string_equal(jstr_at(hook_arg(f, 0), "path", NULL), paths[i]);
        assert_string_equal(jstr_at(hook_arg(f, 1), "status", NULL),
                            "QUEUED");
        json_decref(f);

        hook_ok(j, "{'id':'abc','state':'queued'}");
        json_t *b = expect_respond(j, 200);
        assert_json_eq(b, "{'id':'abc','state':'queued'}");
        json_decref(b);
        llmgw_tjob_free(j);
    }
}


/* A body the gateway cannot read is refused through the route's
 * native.error (the plugin's envelope on its routes, contract facts), with
 * the context there is: the body none. */
static void
test_native_route_body_errors_go_through_native_error(void **state)
{
    static const struct {
        const char *ctype, *body, *code;
    } cases[] = {
        { "application/json", "{\"model\": ", "invalid_json" },
        { "text/plain", "x", "invalid_request" },
    };

    (void) state;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        llmgw_tjob_t *j = native_job("/vid/v1/generate", cases[i].ctype,
                                     cases[i].body);
        json_t *f = expect_hook(j, "native.error", "sha-vid");

        assert_json_eq(hook_arg(f, 0),
                       "{'method':'POST','path':'/vid/v1/generate',"
                       "'params':{},'query':{'v':['1']},"
                       "'body':{'kind':'none'}}");
        assert_string_equal(jstr_at(hook_arg(f, 1), "code", NULL),
                            cases[i].code);
        assert_int_equal(jint(hook_arg(f, 1), "httpStatus"), 400);
        assert_true(json_is_false(json_object_get(hook_arg(f, 1),
                                                  "retryable")));
        json_decref(f);

        hook_ok(j, "{'vendor_error':'bad body'}");
        json_t *b = expect_respond(j, 400);
        assert_json_eq(b, "{'vendor_error':'bad body'}");
        json_decref(b);
        llmgw_tjob_free(j);
    }
}


/* A refusal before the job (here a 405, and a 429) is shaped by the
 * native.error of the route's plugin, with the route's context and no
 * body; a hook that fails or returns no object leaves the contract. */
static llmgw_tjob_t *
refusal_job(const char *method, const char *path, int status,
    const char *code)
{
    llmgw_troute_t   r;
    llmgw_treq_t     q;
    llmgw_verdict_t  v;

    llmgw_task_route(snap, S(method), S(path), &r);
    assert_int_equal(r.kind, LLMGW_TROUTE_NATIVE);

    memset(&q, 0, sizeof(q));
    q.method = S(method);
    q.path = S(path);
    q.args = LLMGW_STR("v=1");
    q.request_id = LLMGW_STR("req-9");
    llmgw_verdict_set(&v, status, "gateway_error", code, "refused here");

    return llmgw_tjob_refusal(snap, &conf, &r, &q, &v);
}


static void
test_native_route_refusals_go_through_native_error(void **state)
{
    llmgw_tjob_t  *j;
    json_t        *f, *b;

    (void) state;

    j = refusal_job("GET", "/vid/v1/generate", 405, "method_not_allowed");
    assert_non_null(j);
    f = expect_hook(j, "native.error", "sha-vid");
    assert_json_eq(hook_arg(f, 0),
                   "{'method':'GET','path':'/vid/v1/generate',"
                   "'params':{},'query':{'v':['1']},"
                   "'body':{'kind':'none'}}");
    assert_json_eq(hook_arg(f, 1),
                   "{'code':'method_not_allowed','message':'refused here',"
                   "'httpStatus':405,'retryable':false}");
    json_decref(f);
    hook_ok(j, "{'vendor_error':'no'}");
    b = expect_respond(j, 405);
    assert_json_eq(b, "{'vendor_error':'no'}");
    json_decref(b);
    llmgw_tjob_free(j);

    /* the path's parameters are given; a 429 is retryable */
    j = refusal_job("GET", "/vid/v1/tasks/t1", 429, "rate_limit_exceeded");
    assert_non_null(j);
    f = expect_hook(j, "native.error", "sha-vid");
    assert_json_eq(json_object_get(hook_arg(f, 0), "params"),
                   "{'task_id':'t1'}");
    assert_true(json_is_true(json_object_get(hook_arg(f, 1), "retryable")));
    json_decref(f);
    hook_reply(j, "{'ok':false,'error':{'kind':'threw','message':'x'}}");
    expect_error(j, 429, "gateway_error", "rate_limit_exceeded",
                 "refused here (request id: req-9)");
    llmgw_tjob_free(j);

    j = refusal_job("POST", "/vid/v1/generate", 401, "invalid_token");
    assert_non_null(j);
    json_decref(expect_hook(j, "native.error", "sha-vid"));
    hook_ok(j, "[1]");
    expect_error(j, 401, "gateway_error", "invalid_token", "refused here");
    llmgw_tjob_free(j);

    /* the runtime unavailable: the contract */
    j = refusal_job("POST", "/vid/v1/generate", 403, "access_denied");
    assert_non_null(j);
    json_decref(expect_hook(j, "native.error", "sha-vid"));
    llmgw_tjob_hook_done(j, -1, "down", 4);
    expect_error(j, 403, "gateway_error", "access_denied", "refused here");
    llmgw_tjob_free(j);
}


static void
test_refusals_without_native_error_are_the_callers(void **state)
{
    llmgw_troute_t   r;
    llmgw_treq_t     q;
    llmgw_verdict_t  v;

    (void) state;

    memset(&q, 0, sizeof(q));
    q.method = LLMGW_STR("POST");
    q.path = LLMGW_STR("/v1/tasks/bat");
    llmgw_verdict_set(&v, 401, "gateway_error", "invalid_token", "no");

    /* not a native route */
    llmgw_task_route(snap, q.method, q.path, &r);
    assert_null(llmgw_tjob_refusal(snap, &conf, &r, &q, &v));

    /* bat exports no native.error: shaped as if it were vid's route */
    r.kind = LLMGW_TROUTE_NATIVE;
    r.plugin = 1;
    r.route = 0;
    assert_null(llmgw_tjob_refusal(snap, &conf, &r, &q, &v));
}


/* ---- submit ---- */

static void
test_submit_runs_usage_reserve_build_send_parse_create(void **state)
{
    llmgw_tjob_t         *j = submit_job("{'model':'m1','prompt':'cat'}");
    const llmgw_tstep_t  *st;
    json_t               *f, *ctx, *b;
    char                  task_id[64];

    (void) state;

    /* extractUsage sees the same context as buildSubmitRequest */
    f = expect_hook(j, "extractUsage", "sha-vid");
    assert_string_equal(jstr_at(hook_arg(f, 0), "upstreamModel", NULL),
                        "m1-up");
    json_decref(f);
    hook_ok(j, "null");

    /* price 0.01 USD per call at group ratio 1 */
    st = expect_step(j, LLMGW_TSTEP_RESERVE);
    assert_int_equal(st->amount, 5000);
    assert_true(llmgw_tjob_busy(j));
    llmgw_tjob_reserve_done(j, NULL);

    f = expect_hook(j, "buildSubmitRequest", "sha-vid");
    ctx = hook_arg(f, 0);
    assert_json_eq(json_object_get(ctx, "requestBody"),
                   "{'model':'m1','prompt':'cat'}");
    assert_json_eq(json_object_get(ctx, "requestHeaders"), "{'x-trace':'t1'}");
    assert_string_equal(jstr_at(ctx, "model", NULL), "m1");
    assert_string_equal(jstr_at(ctx, "upstreamModel", NULL), "m1-up");
    assert_string_equal(jstr_at(ctx, "apiKey", NULL), "sk-one-secret");
    assert_string_equal(jstr_at(ctx, "authHeader", NULL),
                        "Bearer sk-one-secret");
    assert_string_equal(jstr_at(ctx, "auth", "apiKey", NULL),
                        "sk-one-secret");
    assert_string_equal(jstr_at(ctx, "baseUrl", NULL),
                        "https://vendor.example/v1");
    assert_string_equal(jstr_at(ctx, "upstream", "kind", NULL), "vendor");
    assert_int_equal(strncmp(jstr_at(ctx, "publicTaskId", NULL), "task_", 5),
                     0);
    assert_true(strlen(jstr_at(ctx, "publicTaskId", NULL)) > 5
                && strlen(jstr_at(ctx, "publicTaskId", NULL))
                   < sizeof(task_id));
    strcpy(task_id, jstr_at(ctx, "publicTaskId", NULL));
    json_decref(f);

    hook_ok(j, "{'url':'https://vendor.example/v1/videos','method':'POST',"
               "'body':{'prompt':'cat'}}");

    st = expect_step(j, LLMGW_TSTEP_HTTP);
    assert_int_equal(st->channel_id, 1);
    assert_non_null(st->out);
    assert_int_equal(st->out->sse, 0);
    assert_string_equal(st->out->method, "POST");
    assert_int_equal(st->out->url.len, strlen("https://vendor.example/v1/"
                                              "videos"));
    assert_memory_equal(st->out->url.data, "https://vendor.example/v1/videos",
                        st->out->url.len);
    assert_true(llmgw_tjob_busy(j));
    http_reply(j, 200, "application/json", "{\"id\":\"up-1\"}");

    f = expect_hook(j, "parseSubmitResponse", "sha-vid");
    assert_json_eq(hook_arg(f, 1),
                   "{'statusCode':200,"
                   "'headers':{'content-type':['application/json']},"
                   "'body':{'id':'up-1'}}");
    json_decref(f);
    hook_ok(j, "{'taskId':'up-1','taskData':{'k':1}}");

    st = expect_step(j, LLMGW_TSTEP_SQL);
    assert_string_equal(st->sql, "select llmgw_task_create($1::jsonb)");
    assert_int_equal(st->nparams, 1);
    assert_true(st->learn);
    assert_false(llmgw_tjob_charged(j));

    json_t *t = jparse(st->params[0], strlen(st->params[0]));
    assert_int_equal(jint(t, "quota_reserve"), 5000);
    assert_int_equal(jint(t, "channel_id"), 1);
    assert_int_equal(jint(t, "user_id"), 42);
    assert_int_equal(jint(t, "token_id"), 7);
    assert_string_equal(jstr_at(t, "plugin_key", NULL), "vid");
    assert_string_equal(jstr_at(t, "plugin_version", NULL), "1.0.0");
    assert_string_equal(jstr_at(t, "upstream_task_id", NULL), "up-1");
    assert_string_equal(jstr_at(t, "task_id", NULL), task_id);
    assert_string_equal(jstr_at(t, "status", NULL), "SUBMITTED");
    assert_string_equal(jstr_at(t, "upstream_model", NULL), "m1-up");
    assert_string_equal(jstr_at(t, "request_id", NULL), "req-1");
    assert_json_eq(json_object_get(t, "data"), "{'k':1}");
    assert_json_eq(json_object_get(t, "price"), "{'price':0.01}");
    assert_true(json_is_null(json_object_get(t, "final_quota")));
    json_decref(t);

    sql_reply(j, "{'task':{'task_id':'task_x','status':'SUBMITTED',"
                 "'model':'m1','plugin_key':'vid','action':'',"
                 "'progress':'','data':{'k':1},'created_at':5}}");

    b = expect_respond(j, 200);
    assert_true(llmgw_tjob_charged(j));
    assert_json_eq(b, "{'task_id':'task_x','status':'SUBMITTED',"
                      "'progress':'','fail_reason':'','created_at':5,"
                      "'updated_at':null,'finished_at':null,'data':{'k':1},"
                      "'model':'m1','action':'','plugin':'vid'}");
    json_decref(b);
    llmgw_tjob_free(j);
}


static void
test_submit_without_model_is_model_not_specified(void **state)
{
    llmgw_tjob_t *j = submit_job("{'prompt':'cat'}");

    (void) state;

    expect_error(j, 400, "gateway_error", "model_not_specified", NULL);
    assert_false(llmgw_tjob_charged(j));
    llmgw_tjob_free(j);
}


static void
test_submit_of_a_model_without_channel_is_model_not_found(void **state)
{
    llmgw_tjob_t *j = submit_job("{'model':'m3'}");

    (void) state;

    expect_error(j, 503, "gateway_error", "model_not_found", "m3");
    llmgw_tjob_free(j);
}


static void
test_submit_of_a_model_without_price_is_model_price_error(void **state)
{
    llmgw_tjob_t *j = submit_job("{'model':'m2'}");

    (void) state;

    /* refused before any hook runs or quota is reserved */
    expect_error(j, 400, "gateway_error", "model_price_error", "m2");
    llmgw_tjob_free(j);
}


static void
test_submit_refused_reservation_answers_its_verdict(void **state)
{
    llmgw_tjob_t     *j = submit_job("{'model':'m1'}");
    llmgw_verdict_t   v;

    (void) state;

    pass_hook(j, "extractUsage", "sha-vid", "null");
    expect_step(j, LLMGW_TSTEP_RESERVE);

    llmgw_verdict_set(&v, 403, "gateway_error", "insufficient_user_quota",
                      "user quota is not enough");
    llmgw_tjob_reserve_done(j, &v);

    expect_error(j, 403, "gateway_error", "insufficient_user_quota",
                 "user quota is not enough");
    llmgw_tjob_free(j);
}


static void
test_submit_descriptor_to_a_foreign_host_is_not_sent(void **state)
{
    llmgw_tjob_t *j = submit_job("{'model':'m1'}");

    (void) state;

    json_decref(submit_to_build(j));
    hook_ok(j, "{'url':'https://evil.example/steal','method':'POST',"
               "'body':{}}");

    /* the answer comes at once: no HTTP step before it */
    expect_error(j, 500, "gateway_error", "invalid_descriptor",
                 "evil.example");
    assert_false(llmgw_tjob_charged(j));
    llmgw_tjob_free(j);
}


static void
test_submit_vendor_500_moves_to_the_next_channel(void **state)
{
    llmgw_tjob_t         *j = submit_job("{'model':'m1'}");
    const llmgw_tstep_t  *st;
    json_t               *f, *ctx;

    (void) state;

    json_decref(submit_to_build(j));
    hook_ok(j, "{'url':'https://vendor.example/v1/videos','body':{}}");
    st = expect_step(j, LLMGW_TSTEP_HTTP);
    assert_int_equal(st->channel_id, 1);
    http_reply(j, 500, "application/json", "{\"error\":\"down\"}");

    /* the second channel is priced again but not reserved again */
    f = expect_hook(j, "extractUsage", "sha-vid");
    assert_string_equal(jstr_at(hook_arg(f, 0), "baseUrl", NULL),
                        "https://second.example");
    json_decref(f);
    hook_ok(j, "null");

    f = expect_hook(j, "buildSubmitRequest", "sha-vid");
    assert_int_equal(llmgw_tjob_channel(j), 2);
    ctx = hook_arg(f, 0);
    assert_string_equal(jstr_at(ctx, "baseUrl", NULL),
                        "https://second.example");
    assert_string_equal(jstr_at(ctx, "apiKey", NULL), "sk-two");
    /* channel 2 maps nothing */
    assert_string_equal(jstr_at(ctx, "upstreamModel", NULL), "m1");
    json_decref(f);

    /* the first channel's host is foreign to the second channel */
    hook_ok(j, "{'url':'https://vendor.example/v1/videos','body':{}}");
    expect_error(j, 500, "gateway_error", "invalid_descriptor", NULL);
    llmgw_tjob_free(j);
}


/* The log names the client's model, and the channel the submit last went
 * to with the name it went as: not a channel only priced for the next try. */
static void
test_submit_log_names_the_model_and_the_channel_last_sent_to(void **state)
{
    llmgw_tjob_t      *j = submit_job("{'model':'m1'}");
    llmgw_tjob_log_t   l;

    (void) state;

    llmgw_tjob_log(j, &l);
    assert_int_equal(l.model.len, 0);
    assert_null(l.channel);

    json_decref(submit_to_build(j));
    llmgw_tjob_log(j, &l);
    assert_memory_equal(l.model.data, "m1", 2);
    assert_int_equal(l.model.len, 2);
    assert_true(l.priced);
    assert_null(l.channel);
    assert_int_equal(l.tries, 0);
    assert_int_equal(l.upstream_model.len, 0);

    hook_ok(j, "{'url':'https://vendor.example/v1/videos','body':{}}");
    expect_step(j, LLMGW_TSTEP_HTTP);
    llmgw_tjob_log(j, &l);
    assert_non_null(l.channel);
    assert_int_equal(l.channel->id, 1);
    assert_int_equal(l.tries, 1);
    assert_int_equal(l.upstream_model.len, 5);
    assert_memory_equal(l.upstream_model.data, "m1-up", 5);
    http_reply(j, 500, "application/json", "{\"error\":\"down\"}");

    /* channel 2 is priced, but the submit has not gone there yet */
    pass_hook(j, "extractUsage", "sha-vid", "null");
    json_decref(expect_hook(j, "buildSubmitRequest", "sha-vid"));
    llmgw_tjob_log(j, &l);
    assert_int_equal(l.channel->id, 1);
    assert_int_equal(l.tries, 1);

    hook_ok(j, "{'url':'https://second.example/videos','body':{}}");
    expect_step(j, LLMGW_TSTEP_HTTP);
    llmgw_tjob_log(j, &l);
    assert_int_equal(l.channel->id, 2);
    assert_int_equal(l.tries, 2);
    assert_int_equal(l.upstream_model.len, 2);
    assert_memory_equal(l.upstream_model.data, "m1", 2);

    /* a redirect is no try of its own */
    {
        llmgw_str_t names[] = { LLMGW_STR("Location") };
        llmgw_str_t values[] = { LLMGW_STR("https://second.example/v2") };

        llmgw_tjob_http_done(j, 0, 0, 307, names, values, 1, "", 0, NULL);
    }
    expect_step(j, LLMGW_TSTEP_HTTP);
    llmgw_tjob_log(j, &l);
    assert_int_equal(l.channel->id, 2);
    assert_int_equal(l.tries, 2);
    llmgw_tjob_free(j);
}


/* Once the whole submit was written (or the wait timed out) the vendor may
 * have the task: trying another channel could make a second billed one. */
static void
test_submit_sent_then_failed_is_not_retried(void **state)
{
    static const int  flags[] = {
        LLMGW_THTTP_TIMED_OUT, LLMGW_THTTP_SENT,
        LLMGW_THTTP_SENT | LLMGW_THTTP_TIMED_OUT
    };
    static const int  status[] = { 504, 502, 504 };

    (void) state;

    for (size_t i = 0; i < sizeof(flags) / sizeof(flags[0]); i++) {
        llmgw_tjob_t *j = submit_job("{'model':'m1'}");

        json_decref(submit_to_build(j));
        hook_ok(j, "{'url':'https://vendor.example/v1/videos','body':{}}");
        expect_step(j, LLMGW_TSTEP_HTTP);
        llmgw_tjob_http_done(j, -1, flags[i], 0, NULL, NULL, 0, NULL, 0,
                             "reading the response timed out");
        expect_error(j, status[i], "upstream_error", "do_request_failed",
                     NULL);
        assert_false(llmgw_tjob_charged(j));
        llmgw_tjob_free(j);
    }
}


/* A connection that never carried the submit is tried elsewhere. */
static void
test_submit_unsent_failure_moves_to_the_next_channel(void **state)
{
    llmgw_tjob_t  *j = submit_job("{'model':'m1'}");
    json_t        *f;

    (void) state;

    json_decref(submit_to_build(j));
    hook_ok(j, "{'url':'https://vendor.example/v1/videos','body':{}}");
    expect_step(j, LLMGW_TSTEP_HTTP);
    llmgw_tjob_http_done(j, -1, 0, 0, NULL, NULL, 0, NULL, 0,
                         "could not connect to vendor.example:443");

    f = expect_hook(j, "extractUsage", "sha-vid");
    assert_string_equal(jstr_at(hook_arg(f, 0), "baseUrl", NULL),
                        "https://second.example");
    json_decref(f);
    llmgw_tjob_free(j);
}


/* A submit of m1 on channel 1 that the vendor answered with status. */
static llmgw_tjob_t *
submit_answered(int status, const char *json_body)
{
    llmgw_tjob_t *j = submit_job("{'model':'m1'}");

    json_decref(submit_to_build(j));
    hook_ok(j, "{'url':'https://vendor.example/v1/videos','body':{}}");
    expect_step(j, LLMGW_TSTEP_HTTP);
    http_reply(j, status, "application/json", json_body);

    return j;
}


static void
test_submit_vendor_400_is_an_upstream_error_without_retry(void **state)
{
    llmgw_tjob_t *j = submit_answered(400,
                                      "{\"error\":{\"message\":\"bad prompt\","
                                      "\"code\":\"invalid_prompt\"}}");

    (void) state;

    expect_error(j, 400, "upstream_error", "invalid_prompt", "bad prompt");
    assert_false(llmgw_tjob_charged(j));
    llmgw_tjob_free(j);
}


static void
test_submit_vendor_401_quoting_the_channel_key_hides_it(void **state)
{
    llmgw_tjob_t *j = submit_answered(401,
                                      "{\"error\":{\"message\":\"Incorrect API "
                                      "key provided: Bearer sk-one-secret\"}}");

    (void) state;

    expect_error(j, 401, "upstream_error", "bad_response_status_code",
                 "Incorrect API key provided: Bearer [credential] "
                 "(request id: ");
    llmgw_tjob_free(j);
}


static void
test_submit_throwing_hook_is_plugin_error_with_its_message(void **state)
{
    llmgw_tjob_t *j = submit_job("{'model':'m1'}");

    (void) state;

    json_decref(submit_to_build(j));
    hook_reply(j, "{'ok':false,'error':{'kind':'plugin','message':'boom'}}");

    expect_error(j, 500, "gateway_error", "plugin_error", "boom");
    llmgw_tjob_free(j);
}


/* ---- immediate results ---- */

/* A submit through route (a native path, or NULL: the generic API) whose
 * vendor answered and whose parseSubmitResponse returned result_sq; the
 * hooks up to the create statement are answered, the statement is the next
 * step. */
static llmgw_tjob_t *
submit_parsed(const char *route, const char *result_sq)
{
    llmgw_tjob_t *j;

    if (route != NULL) {
        j = native_job(route, NULL, "{'model':'m1'}");
        pass_hook(j, "native.decodeX", "sha-vid",
                  "{'kind':'submit','model':'m1'}");
    } else {
        j = submit_job("{'model':'m1'}");
    }

    json_decref(submit_to_build(j));
    hook_ok(j, "{'url':'https://vendor.example/v1/videos','body':{}}");
    expect_step(j, LLMGW_TSTEP_HTTP);
    http_reply(j, 200, "application/json", "{}");
    pass_hook(j, "parseSubmitResponse", "sha-vid", result_sq);

    if (strstr(result_sq, "'SUCCESS'") != NULL) {
        pass_hook(j, "extractUsageOnComplete", "sha-vid", "null");
    }
    return j;
}


/* The task row of the create statement that is the next step. */
static json_t *
expect_create(llmgw_tjob_t *j)
{
    const llmgw_tstep_t *st = expect_step(j, LLMGW_TSTEP_SQL);

    assert_string_equal(st->sql, "select llmgw_task_create($1::jsonb)");
    return jparse(st->params[0], strlen(st->params[0]));
}


/* retainResult false (spec, States and transitions): the data of a task
 * finished at submit is not persisted, but the submit's renderer, and the
 * host's own view when the renderer fails, still show it. */
static void
test_unretained_immediate_result_is_rendered_not_stored(void **state)
{
    static const char  result[] =
        "{'taskId':'up-i','immediate':{'status':'SUCCESS',"
        "'data':{'image_b64':'AAAA'}}}";
    static const char  row[] =
        "{'task':{'task_id':'task_i','status':'SUCCESS','model':'m1',"
        "'plugin_key':'vid','action':'','progress':'100%','data':null}}";

    (void) state;

    for (int fails = 0; fails < 2; fails++) {
        llmgw_tjob_t *j = submit_parsed("/vid/v1/instant", result);
        json_t *t = expect_create(j);

        assert_true(json_is_false(json_object_get(t, "retain_result")));
        assert_string_equal(jstr_at(t, "status", NULL), "SUCCESS");
        assert_true(json_is_null(json_object_get(t, "data")));
        json_decref(t);
        sql_reply(j, row);

        json_t *f = expect_hook(j, "native.renderX", "sha-vid");
        assert_json_eq(json_object_get(hook_arg(f, 1), "data"),
                       "{'image_b64':'AAAA'}");
        json_decref(f);

        if (fails) {
            hook_reply(j, "{'ok':false,'error':{'kind':'plugin',"
                          "'message':'boom'}}");
        } else {
            hook_ok(j, "{'img':'rendered'}");
        }

        json_t *b = expect_respond(j, 200);
        if (fails) {
            assert_string_equal(jstr_at(b, "task_id", NULL), "task_i");
            assert_json_eq(json_object_get(b, "data"),
                           "{'image_b64':'AAAA'}");
        } else {
            assert_json_eq(b, "{'img':'rendered'}");
        }
        json_decref(b);
        llmgw_tjob_free(j);
    }
}


/* An immediate result is a TaskResult like a poll's (v1.d.ts): without
 * "data", its other members are merged into the taskData; with it, "data"
 * replaces the taskData. */
static void
test_immediate_result_members_merge_into_the_task_data(void **state)
{
    llmgw_tjob_t *j = submit_job("{'model':'m1'}");
    json_t       *f, *t;

    (void) state;

    json_decref(submit_to_build(j));
    hook_ok(j, "{'url':'https://vendor.example/v1/videos','body':{}}");
    expect_step(j, LLMGW_TSTEP_HTTP);
    http_reply(j, 200, "application/json", "{}");
    pass_hook(j, "parseSubmitResponse", "sha-vid",
              "{'taskId':'up-m','taskData':{'k':1,'url':'old'},"
              "'state':{'s':1},'immediate':{'status':'SUCCESS',"
              "'progress':'90%','reason':'','url':'https://cdn.example/v.mp4',"
              "'result':{'w':2}}}");

    f = expect_hook(j, "extractUsageOnComplete", "sha-vid");
    assert_json_eq(json_object_get(hook_arg(f, 0), "data"),
                   "{'k':1,'url':'https://cdn.example/v.mp4',"
                   "'result':{'w':2}}");
    assert_json_eq(hook_arg(f, 2), "{'k':1,'url':'https://cdn.example/v.mp4',"
                                   "'result':{'w':2}}");
    json_decref(f);
    hook_ok(j, "null");

    t = expect_create(j);
    assert_json_eq(json_object_get(t, "data"),
                   "{'k':1,'url':'https://cdn.example/v.mp4',"
                   "'result':{'w':2}}");
    assert_json_eq(json_object_get(t, "state"), "{'s':1}");
    json_decref(t);
    llmgw_tjob_free(j);

    j = submit_parsed(NULL, "{'taskId':'up-d','taskData':{'k':1},"
                            "'immediate':{'status':'SUCCESS','url':'u',"
                            "'data':{'only':true},'state':{'s':2}}}");
    t = expect_create(j);
    assert_json_eq(json_object_get(t, "data"), "{'only':true}");
    assert_json_eq(json_object_get(t, "state"), "{'s':2}");
    json_decref(t);
    llmgw_tjob_free(j);
}


/* Persisted data and state are at most 1 MiB each (spec, Limits): a
 * submit whose taskData, state or immediate data (any JSON value) is
 * larger fails as a contract violation, before anything is stored or
 * charged; nothing is cut. */
static void
test_submit_task_data_and_state_over_one_mib_are_plugin_error(void **state)
{
    static const char *fmts[] = {
        "{'taskId':'up-b','taskData':%s}",
        "{'taskId':'up-b','taskData':{'k':1},'state':%s}",
        "{'taskId':'up-b','immediate':{'status':'FAILURE','data':%s}}",
        "{'taskId':'up-b','immediate':{'status':'FAILURE','state':[%s]}}",
    };

    (void) state;

    for (size_t i = 0; i < sizeof(fmts) / sizeof(fmts[0]); i++) {
        /* [s] encodes to two bytes more than s */
        size_t  at = i == 3 ? MIB - 2 : MIB;
        char   *fits = with_string_of(fmts[i], at);
        char   *over = with_string_of(fmts[i], at + 1);

        llmgw_tjob_t *j = submit_parsed(NULL, fits);
        json_decref(expect_create(j));
        llmgw_tjob_free(j);

        j = submit_parsed(NULL, over);
        expect_error(j, 500, "gateway_error", "plugin_error",
                     "larger than 1 MiB");
        assert_false(llmgw_tjob_charged(j));
        llmgw_tjob_free(j);

        free(fits);
        free(over);
    }
}


/* The data of a result final at once on a retainResult false route is not
 * stored: it goes to the renderer whatever its size. */
static void
test_unretained_immediate_data_is_not_capped(void **state)
{
    char *big = with_string_of("{'taskId':'up-u','immediate':"
                               "{'status':'SUCCESS','data':%s}}", 2 * MIB);
    llmgw_tjob_t *j = submit_parsed("/vid/v1/instant", big);
    json_t *t = expect_create(j);

    (void) state;

    assert_true(json_is_null(json_object_get(t, "data")));
    json_decref(t);
    sql_reply(j, "{'task':{'task_id':'task_u','status':'SUCCESS',"
                 "'plugin_key':'vid','data':null}}");

    json_t *f = expect_hook(j, "native.renderX", "sha-vid");
    assert_int_equal(json_string_length(json_object_get(hook_arg(f, 1),
                                                        "data")),
                     2 * MIB - 2);
    json_decref(f);
    llmgw_tjob_free(j);
    free(big);
}


/* A retaining route stores what it renders. */
static void
test_retained_immediate_result_is_stored(void **state)
{
    llmgw_tjob_t *j = submit_parsed("/vid/v1/generate",
                                    "{'taskId':'up-r','immediate':"
                                    "{'status':'SUCCESS','data':{'v':1}}}");
    json_t *t = expect_create(j);

    (void) state;

    assert_true(json_is_true(json_object_get(t, "retain_result")));
    assert_json_eq(json_object_get(t, "data"), "{'v':1}");
    json_decref(t);
    llmgw_tjob_free(j);
}


/* ---- SSE submit ---- */

static void
test_sse_submit_reads_events_until_done_then_parses_the_state(void **state)
{
    llmgw_tjob_t         *j = submit_job("{'model':'m1'}");
    const llmgw_tstep_t  *st;
    json_t               *f;
    llmgw_str_t           names[] = { LLMGW_STR("content-type") };
    llmgw_str_t           values[] = { LLMGW_STR("text/event-stream") };
    static const char     ev[] = "data: {\"p\":1}\n\n";

    (void) state;

    json_decref(submit_to_build(j));
    hook_ok(j, "{'url':'https://vendor.example/v1/videos','body':{},"
               "'responseType':'sse'}");

    st = expect_step(j, LLMGW_TSTEP_HTTP);
    assert_non_null(st->out);
    assert_int_equal(st->out->sse, 1);
    assert_true(st->timeout_ms > 0);
    /* a stream step is not waited on: the stream calls drive it */
    assert_false(llmgw_tjob_busy(j));

    assert_int_equal(llmgw_tjob_stream_headers(j, 200, names, values, 1), 0);
    assert_int_equal(llmgw_tjob_stream_data(j, ev, strlen(ev)), 1);

    f = expect_hook(j, "parseSubmitEvent", "sha-vid");
    assert_string_equal(jstr_at(hook_arg(f, 1), "data", NULL), "{\"p\":1}");
    assert_true(json_is_null(hook_arg(f, 2)));
    json_decref(f);
    hook_ok(j, "{'state':{'taskId':'up-s','n':1},'done':true}");

    expect_step(j, LLMGW_TSTEP_HTTP_CANCEL);
    /* what still arrives after the cancel is refused */
    assert_int_equal(llmgw_tjob_stream_data(j, ev, strlen(ev)), -1);

    f = expect_hook(j, "parseSubmitResponse", "sha-vid");
    assert_int_equal(jint(hook_arg(f, 1), "statusCode"), 200);
    assert_json_eq(json_object_get(hook_arg(f, 1), "body"),
                   "{'taskId':'up-s','n':1}");
    json_decref(f);
    hook_ok(j, "{'taskId':'up-s'}");

    st = expect_step(j, LLMGW_TSTEP_SQL);
    assert_string_equal(st->sql, "select llmgw_task_create($1::jsonb)");
    assert_non_null(strstr(st->params[0], "\"upstream_task_id\":\"up-s\""));
    llmgw_tjob_free(j);
}


static void
test_sse_submit_event_not_done_waits_for_more(void **state)
{
    llmgw_tjob_t         *j = submit_job("{'model':'m1'}");
    json_t               *f;
    llmgw_str_t           names[] = { LLMGW_STR("content-type") };
    llmgw_str_t           values[] = { LLMGW_STR("text/event-stream") };
    static const char     ev1[] = "data: a\n\n", ev2[] = "data: b\n\n";

    (void) state;

    json_decref(submit_to_build(j));
    hook_ok(j, "{'url':'https://vendor.example/v1/videos','body':{},"
               "'responseType':'sse'}");
    expect_step(j, LLMGW_TSTEP_HTTP);
    llmgw_tjob_stream_headers(j, 200, names, values, 1);

    assert_int_equal(llmgw_tjob_stream_data(j, ev1, strlen(ev1)), 1);
    pass_hook(j, "parseSubmitEvent", "sha-vid", "{'state':{'n':1},"
                                                "'done':false}");
    expect_step(j, LLMGW_TSTEP_WAIT);

    /* the next event carries the state the plugin returned */
    assert_int_equal(llmgw_tjob_stream_data(j, ev2, strlen(ev2)), 1);
    f = expect_hook(j, "parseSubmitEvent", "sha-vid");
    assert_string_equal(jstr_at(hook_arg(f, 1), "data", NULL), "b");
    assert_json_eq(hook_arg(f, 2), "{'n':1}");
    json_decref(f);
    llmgw_tjob_free(j);
}


/* The stream to one SSE submit, its head answered; ready for events. */
static llmgw_tjob_t *
sse_submit_streaming(void)
{
    llmgw_tjob_t  *j = submit_job("{'model':'m1'}");
    llmgw_str_t    names[] = { LLMGW_STR("content-type") };
    llmgw_str_t    values[] = { LLMGW_STR("text/event-stream") };

    json_decref(submit_to_build(j));
    hook_ok(j, "{'url':'https://vendor.example/v1/videos','body':{},"
               "'responseType':'sse'}");
    expect_step(j, LLMGW_TSTEP_HTTP);
    assert_int_equal(llmgw_tjob_stream_headers(j, 200, names, values, 1), 0);
    return j;
}


/* The next step gives the plugin the event whose member is value; the
 * plugin answers result_sq. */
static void
expect_event(llmgw_tjob_t *j, const char *member, const char *value,
    const char *result_sq)
{
    json_t *f = expect_hook(j, "parseSubmitEvent", "sha-vid");

    assert_string_equal(jstr_at(hook_arg(f, 1), member, NULL), value);
    json_decref(f);
    hook_ok(j, result_sq);
}


/* Events that came whole before the connection failed go to the plugin,
 * in order; one it reports done at makes the submit. */
static void
test_sse_events_before_a_reset_still_reach_the_plugin(void **state)
{
    llmgw_tjob_t       *j = sse_submit_streaming();
    json_t             *f;
    static const char   ev1[] = "data: a\n\n";
    static const char   rest[] = "data: b\n\nevent: done\ndata: c\n\ndata: d";

    (void) state;

    assert_int_equal(llmgw_tjob_stream_data(j, ev1, strlen(ev1)), 1);
    f = expect_hook(j, "parseSubmitEvent", "sha-vid");
    json_decref(f);

    /* while the plugin works on the first: two more, then a reset */
    assert_int_equal(llmgw_tjob_stream_data(j, rest, strlen(rest)), 0);
    llmgw_tjob_http_done(j, -1, LLMGW_THTTP_SENT, 0, NULL, NULL, 0, NULL, 0,
                         "reading the response from vendor.example failed");
    hook_ok(j, "{'state':{'n':1},'done':false}");

    expect_event(j, "data", "b", "{'state':{'n':2},'done':false}");

    expect_event(j, "event", "done", "{'state':{'taskId':'up-r'},'done':true}");

    /* the stream is over already: nothing to cancel */
    f = expect_hook(j, "parseSubmitResponse", "sha-vid");
    assert_json_eq(json_object_get(hook_arg(f, 1), "body"),
                   "{'taskId':'up-r'}");
    json_decref(f);
    llmgw_tjob_free(j);

    /* without done among them the failure is the answer, after them */
    j = sse_submit_streaming();
    assert_int_equal(llmgw_tjob_stream_data(j, ev1, strlen(ev1)), 1);
    json_decref(expect_hook(j, "parseSubmitEvent", "sha-vid"));
    llmgw_tjob_http_done(j, -1, LLMGW_THTTP_SENT, 0, NULL, NULL, 0, NULL, 0,
                         "reading the response from vendor.example failed");
    hook_ok(j, "{'state':{'n':1},'done':false}");
    expect_error(j, 502, "upstream_error", "bad_response_status_code",
                 "the submit event stream failed: reading the response");
    llmgw_tjob_free(j);
}


/* The runtime down while the vendor streams an accepted submit: the event
 * is given again after a pause, as a JSON answer would be, and the job
 * goes on without its client meanwhile. */
static void
test_sse_event_waits_for_the_plugin_runtime(void **state)
{
    llmgw_tjob_t         *j = sse_submit_streaming();
    const llmgw_tstep_t  *st;
    static const char     ev1[] = "data: a\n\n";
    static const char     ev2[] = "event: done\ndata: b\n\n";

    (void) state;

    assert_int_equal(llmgw_tjob_stream_data(j, ev1, strlen(ev1)), 1);
    json_decref(expect_hook(j, "parseSubmitEvent", "sha-vid"));
    llmgw_tjob_hook_done(j, -1, "the plugin runtime is not available", 35);

    st = expect_step(j, LLMGW_TSTEP_SLEEP);
    assert_true(st->amount > 0 && st->amount <= 1000);
    assert_true(llmgw_tjob_must_go_on(j));
    /* the stream is read on meanwhile, without waking the job */
    assert_int_equal(llmgw_tjob_stream_data(j, ev2, strlen(ev2)), 0);

    expect_event(j, "data", "a", "{'state':{'n':1},'done':false}");

    expect_event(j, "data", "b", "{'state':{'taskId':'up-w'},'done':true}");
    expect_step(j, LLMGW_TSTEP_HTTP_CANCEL);
    json_decref(expect_hook(j, "parseSubmitResponse", "sha-vid"));
    llmgw_tjob_free(j);

    /* a refusal of the call itself: no retry is offered once accepted */
    j = sse_submit_streaming();
    assert_int_equal(llmgw_tjob_stream_data(j, ev1, strlen(ev1)), 1);
    json_decref(expect_hook(j, "parseSubmitEvent", "sha-vid"));
    hook_reply(j, "{'ok':false,'error':{'kind':'bad_request',"
                  "'message':'unreadable frame'}}");
    expect_error(j, 502, "gateway_error", "plugin_unavailable",
                 "the vendor may have started the task");
    llmgw_tjob_free(j);
}


/* What parseSubmitEvent returns outside its contract ({state, done} with
 * a boolean done) is the plugin's error, as for every hook: 500. */
static void
test_sse_event_result_outside_the_contract_is_plugin_error(void **state)
{
    static const struct {
        const char *result, *part;
    } cases[] = {
        { "{'state':{},'done':'yes'}",
          "does not allow: submit event result: \"done\" is not a boolean" },
        { "'text'",
          "does not allow: submit event result is not an object with state, "
          "done" },
        { "{'state':{},'done':true,'more':1}",
          "does not allow: submit event result has an unknown member "
          "\"more\"" },
    };
    llmgw_str_t        names[] = { LLMGW_STR("content-type") };
    llmgw_str_t        values[] = { LLMGW_STR("text/event-stream") };
    static const char  ev[] = "data: {}\n\n";

    (void) state;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        llmgw_tjob_t *j = submit_job("{'model':'m1'}");

        json_decref(submit_to_build(j));
        hook_ok(j, "{'url':'https://vendor.example/v1/videos','body':{},"
                   "'responseType':'sse'}");
        expect_step(j, LLMGW_TSTEP_HTTP);
        llmgw_tjob_stream_headers(j, 200, names, values, 1);
        assert_int_equal(llmgw_tjob_stream_data(j, ev, strlen(ev)), 1);
        pass_hook(j, "parseSubmitEvent", "sha-vid", cases[i].result);

        expect_error(j, 500, "gateway_error", "plugin_error", cases[i].part);
        assert_false(llmgw_tjob_charged(j));
        llmgw_tjob_free(j);
    }
}


/* An SSE submit of m1 sent to channel 1, before any answer. */
static llmgw_tjob_t *
sse_submit_sent(void)
{
    llmgw_tjob_t *j = submit_job("{'model':'m1'}");

    json_decref(submit_to_build(j));
    hook_ok(j, "{'url':'https://vendor.example/v1/videos','body':{},"
               "'responseType':'sse'}");
    assert_int_equal(expect_step(j, LLMGW_TSTEP_HTTP)->out->sse, 1);
    expect_step(j, LLMGW_TSTEP_WAIT);
    return j;
}


/* The vendor answers an SSE submit with status and an error body. */
static void
sse_refused(llmgw_tjob_t *j, int status)
{
    llmgw_str_t        names[] = { LLMGW_STR("content-type") };
    llmgw_str_t        values[] = { LLMGW_STR("application/json") };
    static const char  body[] = "{\"error\":{\"message\":\"busy\"}}";

    assert_int_equal(llmgw_tjob_stream_headers(j, status, names, values, 1),
                     0);
    assert_int_equal(llmgw_tjob_stream_data(j, body, strlen(body)), 0);
    llmgw_tjob_http_done(j, 0, 0, status, names, values, 1, NULL, 0, NULL);
}


/* The next step is channel 2's try; its JSON submit goes through. */
static void
expect_second_channel_takes_it(llmgw_tjob_t *j)
{
    json_t *f = expect_hook(j, "extractUsage", "sha-vid");

    assert_string_equal(jstr_at(hook_arg(f, 0), "baseUrl", NULL),
                        "https://second.example");
    json_decref(f);
    hook_ok(j, "null");

    pass_hook(j, "buildSubmitRequest", "sha-vid",
              "{'url':'https://second.example/videos','body':{}}");
    const llmgw_tstep_t *st = expect_step(j, LLMGW_TSTEP_HTTP);
    assert_int_equal(st->channel_id, 2);
    assert_int_equal(st->out->sse, 0);
    http_reply(j, 200, "application/json", "{\"id\":\"up-2\"}");
    pass_hook(j, "parseSubmitResponse", "sha-vid", "{'taskId':'up-2'}");

    json_t *t = expect_create(j);
    assert_int_equal(jint(t, "channel_id"), 2);
    json_decref(t);
}


/* An SSE submit moves on as a JSON one does (contract facts: 429 and 5xx
 * except 504, or a connection that never carried it) while the vendor has
 * not accepted it. */
static void
test_sse_submit_refused_with_429_or_5xx_moves_to_the_next_channel(
    void **state)
{
    static const int  status[] = { 429, 500, 503 };

    (void) state;

    for (size_t i = 0; i < sizeof(status) / sizeof(status[0]); i++) {
        llmgw_tjob_t *j = sse_submit_sent();

        sse_refused(j, status[i]);
        expect_second_channel_takes_it(j);
        assert_false(llmgw_tjob_charged(j));
        llmgw_tjob_free(j);
    }

    llmgw_tjob_t *j = sse_submit_sent();
    llmgw_tjob_http_done(j, -1, 0, 0, NULL, NULL, 0, NULL, 0,
                         "could not connect to vendor.example:443");
    expect_second_channel_takes_it(j);
    llmgw_tjob_free(j);
}


static void
test_sse_submit_504_or_a_sent_failure_is_final(void **state)
{
    llmgw_tjob_t *j = sse_submit_sent();

    (void) state;

    sse_refused(j, 504);
    expect_error(j, 504, "upstream_error", "bad_response_status_code",
                 "busy");
    llmgw_tjob_free(j);

    j = sse_submit_sent();
    sse_refused(j, 400);
    expect_error(j, 400, "upstream_error", "bad_response_status_code",
                 "busy");
    llmgw_tjob_free(j);

    j = sse_submit_sent();
    llmgw_tjob_http_done(j, -1, LLMGW_THTTP_SENT, 0, NULL, NULL, 0, NULL, 0,
                         "the connection was reset");
    expect_error(j, 502, "upstream_error", "do_request_failed",
                 "the connection was reset");
    llmgw_tjob_free(j);
}


/* ---- polling ---- */

#define ROW_VID(failures, extra)                                             \
    "{'task_id':'task_a','upstream_task_id':'up-a','plugin_key':'vid',"      \
    "'channel_id':1,'model':'m1','upstream_model':'m1-up',"                  \
    "'status':'IN_PROGRESS','poll_failures':" failures ",'quota':5000,"      \
    "'data':{'k':1}" extra "}"

/* The poll jobs of a claim answer; *n of them. */
static llmgw_tjob_t **
claim(const char *claim_sq, size_t *n, size_t *ntasks)
{
    char           *c = sq(claim_sq);
    llmgw_tjob_t  **jobs = NULL;

    *n = llmgw_task_poll_jobs(snap, &conf, c, strlen(c), LLMGW_STR("owner-1"),
                              NULL, NULL, &jobs, ntasks);
    free(c);
    assert_non_null(jobs);
    return jobs;
}


/* The update statement a poll job ends with; its update list.  The job is
 * finished (DONE) after the statement's answer. */
static json_t *
expect_update(llmgw_tjob_t *j)
{
    const llmgw_tstep_t *st = expect_step(j, LLMGW_TSTEP_SQL);
    json_t *u;

    assert_string_equal(st->sql, "select llmgw_task_update($1, $2::jsonb)");
    assert_int_equal(st->nparams, 2);
    assert_string_equal(st->params[0], "owner-1");
    u = jparse(st->params[1], strlen(st->params[1]));
    assert_true(json_is_array(u));

    sql_reply(j, "{}");
    expect_step(j, LLMGW_TSTEP_DONE);
    return u;
}


/*
 * Polls one vid task: buildQueryRequest, the vendor's answer, then the
 * parse hook (when parse_sq) and extractUsageOnComplete (when usage_sq)
 * answered with these results.  The task's update.
 */
static json_t *
poll_one(const char *row_sq, int status, const char *body,
    const char *parse_sq, const char *usage_sq)
{
    char                  buf[2048];
    size_t                n, ntasks;
    llmgw_tjob_t        **jobs;
    llmgw_tjob_t         *j;
    const llmgw_tstep_t  *st;
    json_t               *f, *list, *u;

    snprintf(buf, sizeof(buf), "{'tasks':[%s]}", row_sq);
    jobs = claim(buf, &n, &ntasks);
    assert_int_equal(n, 1);
    assert_int_equal(ntasks, 1);
    j = jobs[0];
    free(jobs);

    f = expect_hook(j, "buildQueryRequest", "sha-vid");
    assert_string_equal(jstr_at(hook_arg(f, 0), "taskId", NULL), "up-a");
    assert_string_equal(jstr_at(hook_arg(f, 0), "publicTaskId", NULL),
                        "task_a");
    assert_string_equal(jstr_at(hook_arg(f, 0), "baseUrl", NULL),
                        "https://vendor.example/v1");
    json_decref(f);
    hook_ok(j, "{'url':'https://vendor.example/v1/videos/up-a'}");

    st = expect_step(j, LLMGW_TSTEP_HTTP);
    assert_string_equal(st->out->method, "GET");
    assert_int_equal(st->channel_id, 1);
    http_reply(j, status, "application/json", body);

    if (parse_sq != NULL) {
        f = expect_hook(j, "parseTaskResult", "sha-vid");
        assert_int_equal(jint(hook_arg(f, 2), "status"), status);
        json_decref(f);
        hook_ok(j, parse_sq);
    }

    if (usage_sq != NULL) {
        f = expect_hook(j, "extractUsageOnComplete", "sha-vid");
        assert_string_equal(jstr_at(hook_arg(f, 0), "status", NULL),
                            "SUCCESS");
        json_decref(f);
        hook_ok(j, usage_sq);
    }

    list = expect_update(j);
    assert_int_equal(json_array_size(list), 1);
    u = json_incref(json_array_get(list, 0));
    json_decref(list);
    assert_string_equal(jstr_at(u, "task_id", NULL), "task_a");

    llmgw_tjob_free(j);
    return u;
}


static void
assert_contains(const char *s, const char *part)
{
    if (strstr(s, part) == NULL) {
        fail_msg("\"%s\" lacks \"%s\"", s, part);
    }
}


static void
test_poll_404_fails_the_task_without_parsing(void **state)
{
    json_t *u = poll_one(ROW_VID("0", ""), 404, "{}", NULL, NULL);

    (void) state;

    assert_string_equal(jstr_at(u, "status", NULL), "FAILURE");
    assert_contains(jstr_at(u, "fail_reason", NULL), "404");
    json_decref(u);
}


static void
test_poll_500_counts_a_failure_and_keeps_the_status(void **state)
{
    json_t *u = poll_one(ROW_VID("0", ""), 500, "oops", NULL, NULL);

    (void) state;

    assert_int_equal(jint(u, "poll_failures"), 1);
    assert_null(json_object_get(u, "status"));
    assert_null(json_object_get(u, "fail_reason"));
    assert_int_equal(jint(u, "next_poll_ms"), 5000);
    json_decref(u);
}


/* The runtime down while polling is not the task's failure; a hook that
 * throws is. */
static void
test_poll_runtime_outage_is_not_counted(void **state)
{
    size_t           n, ntasks, k;
    llmgw_tjob_t   **jobs;
    llmgw_tjob_t    *j;
    json_t          *f, *u;
    char             buf[2048];
    static const char  *const replies[] = {
        NULL,           /* hook_done rc -1: the runtime did not answer */
        "{\"ok\":false,\"error\":{\"kind\":\"plugin\",\"message\":\"boom\"}}"
    };

    (void) state;

    for (k = 0; k < 2; k++) {
        snprintf(buf, sizeof(buf), "{'tasks':[%s]}", ROW_VID("2", ""));
        jobs = claim(buf, &n, &ntasks);
        assert_int_equal(n, 1);
        j = jobs[0];
        free(jobs);

        f = expect_hook(j, "buildQueryRequest", "sha-vid");
        json_decref(f);

        if (replies[k] == NULL) {
            llmgw_tjob_hook_done(j, -1, "the plugin runtime is not available",
                                 35);
        } else {
            llmgw_tjob_hook_done(j, 0, replies[k], strlen(replies[k]));
        }

        u = json_array_get(expect_update(j), 0);
        json_incref(u);
        if (k == 0) {
            assert_int_equal(jint(u, "poll_failures"), 2);    /* unchanged */
            assert_null(json_object_get(u, "status"));
        } else {
            assert_int_equal(jint(u, "poll_failures"), 3);
            assert_string_equal(jstr_at(u, "status", NULL), "FAILURE");
        }
        json_decref(u);
        llmgw_tjob_free(j);
    }
}


static void
test_poll_failures_reaching_the_limit_fail_the_task(void **state)
{
    json_t *u = poll_one(ROW_VID("2", ""), 503, "oops", NULL, NULL);

    (void) state;

    assert_int_equal(jint(u, "poll_failures"), 3);
    assert_string_equal(jstr_at(u, "status", NULL), "FAILURE");
    assert_contains(jstr_at(u, "fail_reason", NULL), "3 times");
    json_decref(u);
}


static void
test_poll_in_progress_sets_progress_and_clears_failures(void **state)
{
    json_t *u = poll_one(ROW_VID("2", ""), 200, "{\"s\":\"running\"}",
                         "{'status':'IN_PROGRESS','progress':50}", NULL);

    (void) state;

    assert_string_equal(jstr_at(u, "status", NULL), "IN_PROGRESS");
    assert_string_equal(jstr_at(u, "progress", NULL), "50%");
    assert_int_equal(jint(u, "poll_failures"), 0);
    /* no state in the result: the stored state stays */
    assert_null(json_object_get(u, "state"));
    json_decref(u);
}


/* The same 1 MiB as at submit, for any JSON value the data may be. */
static void
test_poll_data_over_one_mib_is_a_failed_poll(void **state)
{
    char   *fits = with_string_of("{'status':'IN_PROGRESS','data':%s}", MIB);
    char   *over = with_string_of("{'status':'IN_PROGRESS','data':%s}",
                                  MIB + 1);
    json_t *u;

    (void) state;

    u = poll_one(ROW_VID("0", ""), 200, "{}", fits, NULL);
    assert_int_equal(jint(u, "poll_failures"), 0);
    assert_int_equal(json_string_length(json_object_get(u, "data")),
                     MIB - 2);
    json_decref(u);

    u = poll_one(ROW_VID("0", ""), 200, "{}", over, NULL);
    assert_int_equal(jint(u, "poll_failures"), 1);
    assert_null(json_object_get(u, "data"));
    assert_null(json_object_get(u, "status"));
    json_decref(u);

    free(fits);
    free(over);
}


static void
test_poll_unknown_status_counts_a_failure(void **state)
{
    json_t *u = poll_one(ROW_VID("0", ""), 200, "{}",
                         "{'status':'UNKNOWN'}", NULL);

    (void) state;

    assert_int_equal(jint(u, "poll_failures"), 1);
    assert_null(json_object_get(u, "status"));
    json_decref(u);
}


static void
test_poll_4xx_with_a_non_terminal_parse_counts_a_failure(void **state)
{
    json_t *u = poll_one(ROW_VID("0", ""), 400, "{}",
                         "{'status':'IN_PROGRESS','state':{'c':2}}", NULL);

    (void) state;

    assert_int_equal(jint(u, "poll_failures"), 1);
    assert_json_eq(json_object_get(u, "state"), "{'c':2}");
    json_decref(u);
}


static void
test_poll_success_prices_the_usage_facts_at_the_stored_price(void **state)
{
    /* 10 s at 0.01 USD/s at group ratio 2: 0.2 USD = 100000 quota */
    json_t *u = poll_one(ROW_VID("1", ",'group_ratio':2,"
                                      "'price':{'unit_prices':"
                                      "{'seconds':0.01}}"),
                         200, "{}",
                         "{'status':'SUCCESS','data':{'url':'v.mp4'},"
                         "'state':{'done':1}}",
                         "{'seconds':10}");

    (void) state;

    assert_string_equal(jstr_at(u, "status", NULL), "SUCCESS");
    assert_string_equal(jstr_at(u, "progress", NULL), "100%");
    assert_int_equal(jint(u, "final_quota"), 100000);
    assert_json_eq(json_object_get(u, "usage"), "{'seconds':10}");
    assert_json_eq(json_object_get(u, "data"), "{'url':'v.mp4'}");
    assert_json_eq(json_object_get(u, "state"), "{'done':1}");
    json_decref(u);
}


/* The balances a claim's refunds of expired tasks left are learned with
   their revisions (a reading without one could only lower a balance). */
static void
test_poll_jobs_learn_the_claims_refunds_with_revisions(void **state)
{
    llmgw_tjob_t  **jobs = NULL;
    seen_t          l = { 0 };
    size_t          n, ntasks;
    char           *c = sq("{'expired':1,'tokens':{'7':5000},"
                           "'users':{'3':90000},'token_revs':{'7':12},"
                           "'user_revs':{'3':40},'tasks':[]}");

    (void) state;

    n = llmgw_task_poll_jobs(snap, &conf, c, strlen(c), LLMGW_STR("o"),
                             seen, &l, &jobs, &ntasks);
    free(c);
    free(jobs);

    assert_int_equal(n, 0);
    assert_int_equal(ntasks, 0);
    assert_int_equal(l.n, 2);
    assert_int_equal(l.is_user[0], 0);
    assert_int_equal(l.id[0], 7);
    assert_int_equal(l.balance[0], 5000);
    assert_int_equal(l.rev[0], 12);
    assert_int_equal(l.is_user[1], 1);
    assert_int_equal(l.id[1], 3);
    assert_int_equal(l.balance[1], 90000);
    assert_int_equal(l.rev[1], 40);
}


static void
test_poll_jobs_group_a_batch_plugin_by_channel_and_size(void **state)
{
    llmgw_task_conf_t   small = conf;
    llmgw_tjob_t      **jobs = NULL;
    size_t              n, ntasks;
    char               *c;

    /* three bat tasks on channel 1, one on channel 2, one vid task */
    static const char CLAIM[] =
        "{'tasks':["
        "{'task_id':'t1','upstream_task_id':'u1','plugin_key':'bat',"
        "'channel_id':1},"
        "{'task_id':'t2','upstream_task_id':'u2','plugin_key':'bat',"
        "'channel_id':1},"
        "{'task_id':'t3','upstream_task_id':'u3','plugin_key':'bat',"
        "'channel_id':2},"
        "{'task_id':'t4','upstream_task_id':'u4','plugin_key':'vid',"
        "'channel_id':1},"
        "{'task_id':'t5','upstream_task_id':'u5','plugin_key':'bat',"
        "'channel_id':1}]}";

    (void) state;

    c = sq(CLAIM);

    n = llmgw_task_poll_jobs(snap, &conf, c, strlen(c), LLMGW_STR("o"),
                             NULL, NULL, &jobs, &ntasks);
    assert_int_equal(ntasks, 5);
    assert_int_equal(n, 3);
    for (size_t i = 0; i < n; i++) {
        llmgw_tjob_free(jobs[i]);
    }
    free(jobs);

    small.batch_size = 2;
    n = llmgw_task_poll_jobs(snap, &small, c, strlen(c), LLMGW_STR("o"),
                             NULL, NULL, &jobs, &ntasks);
    assert_int_equal(ntasks, 5);
    assert_int_equal(n, 4);
    for (size_t i = 0; i < n; i++) {
        llmgw_tjob_free(jobs[i]);
    }
    free(jobs);
    free(c);
}


static const json_t *
update_of(const json_t *list, const char *task_id)
{
    size_t   i;
    json_t  *u;

    json_array_foreach(list, i, u) {
        if (strcmp(jstr_at(u, "task_id", NULL), task_id) == 0) {
            return u;
        }
    }
    fail_msg("no update for %s", task_id);
    return NULL;
}


/* The one poll job of three bat tasks u1..u3 on channel 2, task t2 with
 * t2_failures failed polls so far. */
static llmgw_tjob_t *
bat_job(int t2_failures)
{
    char            buf[1024];
    size_t          n, ntasks;
    llmgw_tjob_t  **jobs, *j;

    snprintf(buf, sizeof(buf), "{'tasks':["
             "{'task_id':'t1','upstream_task_id':'u1','plugin_key':'bat',"
             "'channel_id':2,'poll_failures':0,'status':'QUEUED'},"
             "{'task_id':'t2','upstream_task_id':'u2','plugin_key':'bat',"
             "'channel_id':2,'poll_failures':%d,'status':'QUEUED'},"
             "{'task_id':'t3','upstream_task_id':'u3','plugin_key':'bat',"
             "'channel_id':2,'poll_failures':0,'status':'QUEUED'}]}",
             t2_failures);
    jobs = claim(buf, &n, &ntasks);
    assert_int_equal(n, 1);
    assert_int_equal(ntasks, 3);
    j = jobs[0];
    free(jobs);
    return j;
}


static void
test_batch_poll_matches_results_by_task_id(void **state)
{
    llmgw_tjob_t         *j;
    json_t               *f, *list;
    const json_t         *u;

    (void) state;

    j = bat_job(1);
    assert_int_equal(llmgw_tjob_channel(j), 2);

    f = expect_hook(j, "buildBatchQueryRequest", "sha-bat");
    assert_string_equal(jstr_at(hook_arg(f, 0), "baseUrl", NULL),
                        "https://second.example");
    assert_int_equal(json_array_size(hook_arg(f, 1)), 3);
    assert_string_equal(jstr_at(json_array_get(hook_arg(f, 1), 1), "taskId",
                                NULL), "u2");
    json_decref(f);
    hook_ok(j, "{'url':'https://second.example/batch','method':'POST',"
               "'body':{'ids':['u1','u2','u3']}}");

    expect_step(j, LLMGW_TSTEP_HTTP);
    http_reply(j, 200, "application/json", "{\"items\":[]}");

    /* answered out of order, u1 left out */
    f = expect_hook(j, "parseBatchResult", "sha-bat");
    assert_json_eq(hook_arg(f, 1), "{'items':[]}");
    json_decref(f);
    hook_ok(j, "[{'taskId':'u3','status':'SUCCESS','data':{'url':'3'}},"
               "{'taskId':'u2','status':'IN_PROGRESS','progress':'20%'}]");

    list = expect_update(j);
    assert_int_equal(json_array_size(list), 3);

    u = update_of(list, "t1");
    assert_int_equal(jint(u, "poll_failures"), 1);
    assert_null(json_object_get(u, "status"));

    u = update_of(list, "t2");
    assert_string_equal(jstr_at(u, "status", NULL), "IN_PROGRESS");
    assert_string_equal(jstr_at(u, "progress", NULL), "20%");
    assert_int_equal(jint(u, "poll_failures"), 0);

    u = update_of(list, "t3");
    assert_string_equal(jstr_at(u, "status", NULL), "SUCCESS");
    assert_json_eq(json_object_get(u, "data"), "{'url':'3'}");
    /* bat has no extractUsageOnComplete: nothing to settle from facts */
    assert_null(json_object_get(u, "final_quota"));

    json_decref(list);
    llmgw_tjob_free(j);
}


/* A 404 to the batch query says nothing of its tasks: each without a
 * result counts one failure (FAILURE only at the limit), parsed as any
 * other 4xx, so a result for a task still applies. */
static void
test_batch_poll_404_counts_a_failure_for_each_task(void **state)
{
    llmgw_tjob_t         *j;
    json_t               *f, *list;
    const json_t         *u;

    (void) state;

    j = bat_job(2);

    json_decref(expect_hook(j, "buildBatchQueryRequest", "sha-bat"));
    hook_ok(j, "{'url':'https://second.example/batch','method':'POST',"
               "'body':{}}");
    expect_step(j, LLMGW_TSTEP_HTTP);
    http_reply(j, 404, "application/json", "{\"error\":\"no route\"}");

    f = expect_hook(j, "parseBatchResult", "sha-bat");
    assert_int_equal(jint(hook_arg(f, 2), "status"), 404);
    json_decref(f);
    hook_ok(j, "[{'taskId':'u3','status':'FAILURE','reason':'gone'}]");

    list = expect_update(j);

    u = update_of(list, "t1");
    assert_int_equal(jint(u, "poll_failures"), 1);
    assert_null(json_object_get(u, "status"));

    /* the third failure in a row: the limit */
    u = update_of(list, "t2");
    assert_string_equal(jstr_at(u, "status", NULL), "FAILURE");
    assert_contains(jstr_at(u, "fail_reason", NULL),
                    "the upstream answered HTTP 404 to the batch query");

    u = update_of(list, "t3");
    assert_string_equal(jstr_at(u, "status", NULL), "FAILURE");
    assert_string_equal(jstr_at(u, "fail_reason", NULL), "gone");

    json_decref(list);
    llmgw_tjob_free(j);
}


/* ---- setup ---- */

static int
setup(void **state)
{
    char  err[256];
    char *s = sq(SNAPSHOT);
    char *t = sq(TOKEN);

    (void) state;

    snap = llmgw_snapshot_parse(s, strlen(s), err, sizeof(err));
    token = llmgw_token_parse(t, strlen(t));
    free(s);
    free(t);
    s = sq(OVERLAP_SNAPSHOT);
    overlap_snap = llmgw_snapshot_parse(s, strlen(s), err, sizeof(err));
    free(s);
    return snap != NULL && token != NULL && overlap_snap != NULL ? 0 : -1;
}


static int
teardown(void **state)
{
    while (nkept > 0) {
        free(kept_bodies[--nkept]);
    }

    (void) state;

    llmgw_snapshot_free(snap);
    llmgw_snapshot_free(overlap_snap);
    llmgw_token_free(token);
    return 0;
}


int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wait_default_is_the_protocol_timeout),
        cmocka_unit_test(test_route_generic_submit_and_get),
        cmocka_unit_test(test_route_native_paths_with_parameters),
        cmocka_unit_test(test_route_unrelated_paths_are_none),
        cmocka_unit_test(test_route_host_protocol_paths),
        cmocka_unit_test(test_route_artifacts_and_content),
        cmocka_unit_test(test_route_most_specific_wins_over_plugin_order),
        cmocka_unit_test(
            test_get_task_answers_the_view_without_private_fields),
        cmocka_unit_test(test_get_task_of_another_id_is_not_found),
        cmocka_unit_test(
            test_native_query_routes_take_the_id_from_their_parameter),
        cmocka_unit_test(
            test_native_route_body_errors_go_through_native_error),
        cmocka_unit_test(
            test_native_route_refusals_go_through_native_error),
        cmocka_unit_test(test_refusals_without_native_error_are_the_callers),
        cmocka_unit_test(
            test_submit_runs_usage_reserve_build_send_parse_create),
        cmocka_unit_test(test_submit_without_model_is_model_not_specified),
        cmocka_unit_test(
            test_submit_of_a_model_without_channel_is_model_not_found),
        cmocka_unit_test(
            test_submit_of_a_model_without_price_is_model_price_error),
        cmocka_unit_test(test_submit_refused_reservation_answers_its_verdict),
        cmocka_unit_test(test_submit_descriptor_to_a_foreign_host_is_not_sent),
        cmocka_unit_test(test_submit_vendor_500_moves_to_the_next_channel),
        cmocka_unit_test(
            test_submit_log_names_the_model_and_the_channel_last_sent_to),
        cmocka_unit_test(test_submit_sent_then_failed_is_not_retried),
        cmocka_unit_test(test_submit_unsent_failure_moves_to_the_next_channel),
        cmocka_unit_test(
            test_submit_vendor_400_is_an_upstream_error_without_retry),
        cmocka_unit_test(
            test_submit_vendor_401_quoting_the_channel_key_hides_it),
        cmocka_unit_test(
            test_submit_throwing_hook_is_plugin_error_with_its_message),
        cmocka_unit_test(
            test_unretained_immediate_result_is_rendered_not_stored),
        cmocka_unit_test(test_retained_immediate_result_is_stored),
        cmocka_unit_test(
            test_submit_task_data_and_state_over_one_mib_are_plugin_error),
        cmocka_unit_test(test_unretained_immediate_data_is_not_capped),
        cmocka_unit_test(
            test_immediate_result_members_merge_into_the_task_data),
        cmocka_unit_test(
            test_sse_submit_reads_events_until_done_then_parses_the_state),
        cmocka_unit_test(test_sse_submit_event_not_done_waits_for_more),
        cmocka_unit_test(
            test_sse_events_before_a_reset_still_reach_the_plugin),
        cmocka_unit_test(test_sse_event_waits_for_the_plugin_runtime),
        cmocka_unit_test(
            test_sse_event_result_outside_the_contract_is_plugin_error),
        cmocka_unit_test(
            test_sse_submit_refused_with_429_or_5xx_moves_to_the_next_channel),
        cmocka_unit_test(test_sse_submit_504_or_a_sent_failure_is_final),
        cmocka_unit_test(test_poll_404_fails_the_task_without_parsing),
        cmocka_unit_test(test_poll_500_counts_a_failure_and_keeps_the_status),
        cmocka_unit_test(test_poll_failures_reaching_the_limit_fail_the_task),
        cmocka_unit_test(test_poll_runtime_outage_is_not_counted),
        cmocka_unit_test(
            test_poll_in_progress_sets_progress_and_clears_failures),
        cmocka_unit_test(test_poll_data_over_one_mib_is_a_failed_poll),
        cmocka_unit_test(test_poll_unknown_status_counts_a_failure),
        cmocka_unit_test(
            test_poll_4xx_with_a_non_terminal_parse_counts_a_failure),
        cmocka_unit_test(
            test_poll_success_prices_the_usage_facts_at_the_stored_price),
        cmocka_unit_test(
            test_poll_jobs_group_a_batch_plugin_by_channel_and_size),
        cmocka_unit_test(
            test_poll_jobs_learn_the_claims_refunds_with_revisions),
        cmocka_unit_test(test_batch_poll_matches_results_by_task_id),
        cmocka_unit_test(test_batch_poll_404_counts_a_failure_for_each_task),
    };

    return cmocka_run_group_tests(tests, setup, teardown);
}
