/*
 * The configuration snapshot: channel addresses from base_url, routing by
 * model, group and endpoint with priorities and weights, model mapping,
 * groups, rate limits, admin hashes and prices.
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


#define MAXC  16


/*
 * Parses a snapshot written with single quotes for readability (no value
 * below needs an apostrophe); fails the test when it does not parse.
 */
static llmgw_snapshot_t *
snap(const char *text)
{
    char               err[256] = "";
    char              *json = strdup(text);
    llmgw_snapshot_t  *s;

    assert_non_null(json);

    for (char *p = json; *p; p++) {
        if (*p == '\'') {
            *p = '"';
        }
    }

    s = llmgw_snapshot_parse(json, strlen(json), err, sizeof(err));
    if (s == NULL) {
        fail_msg("snapshot did not parse: %s: %s", err, json);
    }

    free(json);
    return s;
}


static llmgw_str_t
S(const char *s)
{
    return (llmgw_str_t) { s, strlen(s) };
}


static size_t
route(const llmgw_snapshot_t *s, llmgw_endpoint_e ep, const char *model,
    const char *group, uint64_t seed, const llmgw_channel_t **out,
    size_t *incompatible)
{
    return llmgw_route(s, ep, S(model), S(group), seed, out, MAXC,
                       incompatible, NULL, NULL);
}


/* The one channel a snapshot routes for model "m" in group "default". */
static const llmgw_channel_t *
only_channel(const llmgw_snapshot_t *s)
{
    const llmgw_channel_t  *out[MAXC];
    size_t                  inc;

    assert_int_equal(route(s, LLMGW_EP_CHAT, "m", "default", 1, out, &inc),
                     1);
    return out[0];
}


/* A snapshot with one type-1 channel serving "m" at base_url. */
static llmgw_snapshot_t *
snap_url(const char *base_url)
{
    char buf[512];

    snprintf(buf, sizeof(buf),
             "{'channels':[{'id':1,'type':1,'base_url':'%s',"
             "'models':['m'],'groups':['default']}]}", base_url);
    return snap(buf);
}


static void
test_snapshot_parse_reads_revision_and_channel_fields(void **state)
{
    (void) state;

    llmgw_snapshot_t *s = snap(
        "{'revision':42,'channels':[{'id':7,'name':'openai-main','type':1,"
        "'base_url':'https://api.openai.com/v1','key':'sk-upstream',"
        "'models':['m'],'groups':['default'],'priority':5,'weight':9,"
        "'model_mapping':{}}],'pricing':{},'groups':{},'rate_limit':{},"
        "'admin_hashes':[]}");
    const llmgw_channel_t *c = only_channel(s);

    assert_int_equal(llmgw_snapshot_revision(s), 42);
    assert_int_equal(c->id, 7);
    assert_string_equal(c->name, "openai-main");
    assert_int_equal(c->type, 1);
    assert_string_equal(c->key, "sk-upstream");
    assert_int_equal(c->priority, 5);
    assert_int_equal(c->weight, 9);
    assert_int_equal(c->tls, 1);
    assert_string_equal(c->host, "api.openai.com");
    assert_int_equal(c->port, 443);
    assert_string_equal(c->base_path, "/v1");
    assert_string_equal(c->host_header, "api.openai.com");
    llmgw_snapshot_free(s);
}


static void
test_snapshot_parse_refuses_what_is_not_a_json_object(void **state)
{
    static const char *const bad[] = { "[]", "\"x\"", "{", "" };
    (void) state;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char err[256] = "";

        assert_null(llmgw_snapshot_parse(bad[i], strlen(bad[i]), err,
                                         sizeof(err)));
        assert_true(err[0] != '\0');
    }
}


static void
test_base_url_https_defaults_to_port_443(void **state)
{
    (void) state;

    llmgw_snapshot_t       *s = snap_url("https://api.example.com");
    const llmgw_channel_t  *c = only_channel(s);

    assert_int_equal(c->tls, 1);
    assert_int_equal(c->port, 443);
    assert_string_equal(c->host, "api.example.com");
    assert_string_equal(c->host_header, "api.example.com");
    assert_string_equal(c->base_path, "");
    llmgw_snapshot_free(s);
}


static void
test_base_url_http_defaults_to_port_80(void **state)
{
    (void) state;

    llmgw_snapshot_t       *s = snap_url("http://10.1.2.3");
    const llmgw_channel_t  *c = only_channel(s);

    assert_int_equal(c->tls, 0);
    assert_int_equal(c->port, 80);
    assert_string_equal(c->host, "10.1.2.3");
    assert_string_equal(c->host_header, "10.1.2.3");
    llmgw_snapshot_free(s);
}


static void
test_base_url_explicit_port_is_used_and_kept_in_host_header(void **state)
{
    (void) state;

    llmgw_snapshot_t       *s = snap_url("https://gw.example.com:8443/v1");
    const llmgw_channel_t  *c = only_channel(s);

    assert_int_equal(c->tls, 1);
    assert_int_equal(c->port, 8443);
    assert_string_equal(c->host, "gw.example.com");
    assert_string_equal(c->host_header, "gw.example.com:8443");
    assert_string_equal(c->base_path, "/v1");
    llmgw_snapshot_free(s);

    /* the default port written out is kept as written too */
    s = snap_url("http://h.example:80");
    c = only_channel(s);
    assert_int_equal(c->port, 80);
    assert_string_equal(c->host_header, "h.example:80");
    llmgw_snapshot_free(s);
}


static void
test_base_url_ipv6_literal_in_brackets(void **state)
{
    (void) state;

    llmgw_snapshot_t       *s = snap_url("http://[2001:db8::1]:8080/api");
    const llmgw_channel_t  *c = only_channel(s);

    assert_int_equal(c->tls, 0);
    assert_string_equal(c->host, "2001:db8::1");
    assert_int_equal(c->port, 8080);
    assert_string_equal(c->host_header, "[2001:db8::1]:8080");
    assert_string_equal(c->base_path, "/api");
    llmgw_snapshot_free(s);

    s = snap_url("https://[::1]");
    c = only_channel(s);
    assert_string_equal(c->host, "::1");
    assert_int_equal(c->port, 443);
    assert_string_equal(c->host_header, "[::1]");
    llmgw_snapshot_free(s);
}


static void
test_base_url_path_prefix_kept_without_trailing_slash(void **state)
{
    (void) state;

    llmgw_snapshot_t       *s = snap_url("https://h.example/openai/v1/");
    const llmgw_channel_t  *c = only_channel(s);

    assert_string_equal(c->base_path, "/openai/v1");
    assert_string_equal(c->host_header, "h.example");
    llmgw_snapshot_free(s);

    s = snap_url("https://h.example/");
    c = only_channel(s);
    assert_string_equal(c->base_path, "");
    llmgw_snapshot_free(s);
}


static void
test_bad_base_url_skips_only_that_channel(void **state)
{
    static const char *const bad[] = {
        "ftp://h.example",
        "api.openai.com/v1",
        "https://",
        "https:///v1",
        "https://user:pw@h.example",
        "https://h.example:0",
        "https://h.example:65536",
        "https://h.example:80a",
        "https://[::1",
        "https://[::1]8080",
        "https://:443",
        "",
    };
    (void) state;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char                    buf[512];
        const llmgw_channel_t  *out[MAXC];
        size_t                  inc;
        llmgw_snapshot_t       *s;

        snprintf(buf, sizeof(buf),
                 "{'channels':["
                 "{'id':1,'type':1,'base_url':'%s','models':['m'],"
                 "'groups':['default'],'priority':10},"
                 "{'id':2,'type':1,'base_url':'https://ok.example',"
                 "'models':['m'],'groups':['default']}]}", bad[i]);
        s = snap(buf);

        if (route(s, LLMGW_EP_CHAT, "m", "default", 1, out, &inc) != 1) {
            fail_msg("base_url \"%s\" was not skipped", bad[i]);
        }
        assert_int_equal(out[0]->id, 2);
        llmgw_snapshot_free(s);
    }
}


/* A CR or LF in the key or an upstream model name would start a header. */
static void
test_control_characters_leave_the_channel_out_and_are_named(void **state)
{
    static const char   json[] =
        "{\"channels\":["
        "{\"id\":1,\"type\":1,\"base_url\":\"https://a.example\","
        "\"key\":\"sk-up\\r\\nX-Injected: yes\",\"models\":[\"m\"],"
        "\"groups\":[\"default\"],\"priority\":9},"
        "{\"id\":2,\"type\":24,\"base_url\":\"https://b.example\","
        "\"key\":\"k\",\"models\":[\"m\",\"g\\nX\"],"
        "\"groups\":[\"default\"],\"priority\":9},"
        "{\"id\":3,\"type\":1,\"base_url\":\"https://c.example\","
        "\"key\":\"k\",\"models\":[\"m\"],\"groups\":[\"default\"],"
        "\"model_mapping\":{\"m\":\"up\\u0000x\"},\"priority\":9},"
        "{\"id\":4,\"type\":1,\"base_url\":\"https://d.example\","
        "\"key\":\"sk-fine \",\"models\":[\"m\"],"
        "\"groups\":[\"default\"]}]}";
    char                err[256];
    llmgw_snapshot_t   *s;

    (void) state;

    s = llmgw_snapshot_parse(json, strlen(json), err, sizeof(err));
    assert_non_null(s);
    assert_int_equal(only_channel(s)->id, 4);
    assert_string_equal(err,
        "left out channel 1: its key holds a control character; "
        "channel 2: a model name holds a control character; "
        "channel 3: a model_mapping entry holds a control character");
    llmgw_snapshot_free(s);

    s = llmgw_snapshot_parse("{}", 2, err, sizeof(err));
    assert_non_null(s);
    assert_string_equal(err, "");
    llmgw_snapshot_free(s);
}


static void
test_route_only_channels_serving_the_model_in_the_keys_group(void **state)
{
    (void) state;

    llmgw_snapshot_t *s = snap(
        "{'channels':["
        "{'id':1,'type':1,'base_url':'https://a','models':['gpt-4o'],"
        "'groups':['default']},"
        "{'id':2,'type':1,'base_url':'https://b','models':['gpt-4o'],"
        "'groups':['vip']},"
        "{'id':3,'type':1,'base_url':'https://c','models':['gpt-4o-mini'],"
        "'groups':['default','vip']},"
        "{'id':4,'type':1,'base_url':'https://d','models':['x','gpt-4o'],"
        "'groups':['default','vip']}]}");
    const llmgw_channel_t  *out[MAXC];
    size_t                  inc, n;
    int                     seen[5] = { 0 };

    n = route(s, LLMGW_EP_CHAT, "gpt-4o", "default", 3, out, &inc);
    assert_int_equal(n, 2);
    for (size_t i = 0; i < n; i++) {
        assert_true(out[i]->id >= 1 && out[i]->id <= 4);
        seen[out[i]->id]++;
    }
    assert_int_equal(seen[1], 1);
    assert_int_equal(seen[4], 1);
    assert_int_equal(inc, 0);

    memset(seen, 0, sizeof(seen));
    n = route(s, LLMGW_EP_CHAT, "gpt-4o", "vip", 3, out, &inc);
    assert_int_equal(n, 2);
    for (size_t i = 0; i < n; i++) {
        seen[out[i]->id]++;
    }
    assert_int_equal(seen[2], 1);
    assert_int_equal(seen[4], 1);

    /* a group no channel serves */
    assert_int_equal(route(s, LLMGW_EP_CHAT, "gpt-4o", "free", 3, out, &inc),
                     0);
    /* a model no channel serves */
    assert_int_equal(route(s, LLMGW_EP_CHAT, "gpt-5", "default", 3, out,
                           &inc), 0);
    llmgw_snapshot_free(s);
}


/* One channel of each type serving "m"; ids equal their types. */
static const char *const all_types =
    "{'channels':["
    "{'id':1,'type':1,'base_url':'https://a','models':['m'],"
    "'groups':['default']},"
    "{'id':14,'type':14,'base_url':'https://a','models':['m'],"
    "'groups':['default']},"
    "{'id':24,'type':24,'base_url':'https://a','models':['m'],"
    "'groups':['default']},"
    "{'id':34,'type':34,'base_url':'https://a','models':['m'],"
    "'groups':['default']},"
    "{'id':38,'type':38,'base_url':'https://a','models':['m'],"
    "'groups':['default']},"
    "{'id':40,'type':40,'base_url':'https://a','models':['m'],"
    "'groups':['default']}]}";


static void
test_route_endpoint_compatibility_by_channel_type(void **state)
{
    static const struct {
        llmgw_endpoint_e  ep;
        int64_t           ids[3];
        size_t            n;
    } cases[] = {
        /* chat and messages reach the other formats by conversion */
        { LLMGW_EP_CHAT,     { 1, 14, 24 }, 3 },
        { LLMGW_EP_MESSAGES, { 14, 1 },     2 },
        { LLMGW_EP_GEMINI,   { 24 },        1 },
        { LLMGW_EP_RERANK,   { 1, 34, 38 }, 3 },
    };
    llmgw_snapshot_t *s = snap(all_types);
    (void) state;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const llmgw_channel_t  *out[MAXC];
        size_t                  inc, n;
        int                     hit[3] = { 0 };

        n = route(s, cases[i].ep, "m", "default", 5, out, &inc);
        assert_int_equal(n, cases[i].n);
        /* incompatible counts the other channels of the six */
        assert_int_equal(inc, 6 - cases[i].n);

        for (size_t k = 0; k < n; k++) {
            int found = 0;
            for (size_t w = 0; w < cases[i].n; w++) {
                if (out[k]->id == cases[i].ids[w]) {
                    hit[w]++;
                    found = 1;
                }
            }
            if (!found) {
                fail_msg("endpoint %d routed to type %d", (int) cases[i].ep,
                         out[k]->type);
            }
        }
        for (size_t w = 0; w < cases[i].n; w++) {
            assert_int_equal(hit[w], 1);
        }
    }

    llmgw_snapshot_free(s);
}


static void
test_route_incompatible_counts_only_the_groups_channels(void **state)
{
    (void) state;

    llmgw_snapshot_t *s = snap(
        "{'channels':["
        "{'id':1,'type':14,'base_url':'https://a','models':['m'],"
        "'groups':['default']},"
        "{'id':2,'type':24,'base_url':'https://a','models':['m'],"
        "'groups':['default']},"
        "{'id':3,'type':14,'base_url':'https://a','models':['m'],"
        "'groups':['vip']}]}");
    const llmgw_channel_t  *out[MAXC];
    size_t                  inc = 99;

    /* the model exists but no channel of the group reranks: the 500 */
    assert_int_equal(route(s, LLMGW_EP_RERANK, "m", "default", 1, out, &inc),
                     0);
    assert_int_equal(inc, 2);

    inc = 99;
    assert_int_equal(route(s, LLMGW_EP_CHAT, "other", "default", 1, out,
                           &inc), 0);
    assert_int_equal(inc, 0);
    llmgw_snapshot_free(s);
}


static void
test_route_highest_priority_first(void **state)
{
    (void) state;

    llmgw_snapshot_t *s = snap(
        "{'channels':["
        "{'id':1,'type':1,'base_url':'https://a','models':['m'],"
        "'groups':['default'],'priority':0,'weight':1000},"
        "{'id':2,'type':1,'base_url':'https://a','models':['m'],"
        "'groups':['default'],'priority':100,'weight':1},"
        "{'id':3,'type':1,'base_url':'https://a','models':['m'],"
        "'groups':['default'],'priority':-5,'weight':1000},"
        "{'id':4,'type':1,'base_url':'https://a','models':['m'],"
        "'groups':['default'],'priority':50,'weight':1}]}");

    for (uint64_t seed = 0; seed < 200; seed++) {
        const llmgw_channel_t  *out[MAXC];
        size_t                  inc;

        assert_int_equal(route(s, LLMGW_EP_CHAT, "m", "default", seed, out,
                               &inc), 4);
        assert_int_equal(out[0]->id, 2);
        assert_int_equal(out[1]->id, 4);
        assert_int_equal(out[2]->id, 1);
        assert_int_equal(out[3]->id, 3);
    }

    llmgw_snapshot_free(s);
}


/* How often each of channels 1..3 comes first over many seeds. */
static void
count_first(const llmgw_snapshot_t *s, int nseeds, int first[4],
    size_t want_n)
{
    memset(first, 0, 4 * sizeof(int));

    for (int seed = 0; seed < nseeds; seed++) {
        const llmgw_channel_t  *out[MAXC];
        size_t                  inc;

        assert_int_equal(route(s, LLMGW_EP_CHAT, "m", "default",
                               (uint64_t) seed * 7919 + 13, out, &inc),
                         want_n);
        assert_true(out[0]->id >= 1 && out[0]->id <= 3);
        first[out[0]->id]++;
    }
}


static void
test_route_weights_split_traffic_three_to_one(void **state)
{
    (void) state;

    llmgw_snapshot_t *s = snap(
        "{'channels':["
        "{'id':1,'type':1,'base_url':'https://a','models':['m'],"
        "'groups':['default'],'weight':3},"
        "{'id':2,'type':1,'base_url':'https://a','models':['m'],"
        "'groups':['default'],'weight':1}]}");
    int first[4];

    /* 20000 draws: one standard deviation is about 0.3 % */
    count_first(s, 20000, first, 2);
    assert_in_range(first[1], 14600, 15400);
    assert_in_range(first[2], 4600, 5400);
    llmgw_snapshot_free(s);
}


static void
test_route_zero_weight_never_first_when_a_positive_one_exists(void **state)
{
    (void) state;

    llmgw_snapshot_t *s = snap(
        "{'channels':["
        "{'id':1,'type':1,'base_url':'https://a','models':['m'],"
        "'groups':['default'],'weight':0},"
        "{'id':2,'type':1,'base_url':'https://a','models':['m'],"
        "'groups':['default'],'weight':1},"
        "{'id':3,'type':1,'base_url':'https://a','models':['m'],"
        "'groups':['default'],'weight':5}]}");

    for (uint64_t seed = 0; seed < 5000; seed++) {
        const llmgw_channel_t  *out[MAXC];
        size_t                  inc;

        assert_int_equal(route(s, LLMGW_EP_CHAT, "m", "default", seed, out,
                               &inc), 3);
        /* still a fallback: tried after every weighted channel */
        assert_int_equal(out[2]->id, 1);
    }

    llmgw_snapshot_free(s);
}


static void
test_route_all_zero_weights_pick_uniformly(void **state)
{
    (void) state;

    llmgw_snapshot_t *s = snap(
        "{'channels':["
        "{'id':1,'type':1,'base_url':'https://a','models':['m'],"
        "'groups':['default'],'weight':0},"
        "{'id':2,'type':1,'base_url':'https://a','models':['m'],"
        "'groups':['default'],'weight':0},"
        "{'id':3,'type':1,'base_url':'https://a','models':['m'],"
        "'groups':['default'],'weight':0}]}");
    int first[4];

    count_first(s, 30000, first, 3);
    for (int id = 1; id <= 3; id++) {
        assert_in_range(first[id], 9400, 10600);
    }
    llmgw_snapshot_free(s);
}


static void
test_route_every_candidate_returned_once(void **state)
{
    (void) state;

    llmgw_snapshot_t *s = snap(
        "{'channels':["
        "{'id':1,'type':1,'base_url':'https://a','models':['m'],"
        "'groups':['default'],'weight':7},"
        "{'id':2,'type':1,'base_url':'https://a','models':['m'],"
        "'groups':['default'],'weight':1},"
        "{'id':3,'type':1,'base_url':'https://a','models':['m'],"
        "'groups':['default'],'weight':2}]}");

    for (uint64_t seed = 0; seed < 300; seed++) {
        const llmgw_channel_t  *out[MAXC];
        size_t                  inc;
        int                     seen[4] = { 0 };

        assert_int_equal(route(s, LLMGW_EP_CHAT, "m", "default", seed, out,
                               &inc), 3);
        for (int i = 0; i < 3; i++) {
            seen[out[i]->id]++;
        }
        assert_int_equal(seen[1], 1);
        assert_int_equal(seen[2], 1);
        assert_int_equal(seen[3], 1);
    }

    llmgw_snapshot_free(s);
}


static void
test_route_trailing_space_in_model_does_not_match(void **state)
{
    (void) state;

    llmgw_snapshot_t *s = snap(
        "{'channels':[{'id':1,'type':1,'base_url':'https://a',"
        "'models':['gpt-4o'],'groups':['default']}]}");
    const llmgw_channel_t  *out[MAXC];
    size_t                  inc;

    assert_int_equal(route(s, LLMGW_EP_CHAT, "gpt-4o ", "default", 1, out,
                           &inc), 0);
    assert_int_equal(route(s, LLMGW_EP_CHAT, "GPT-4o", "default", 1, out,
                           &inc), 0);
    assert_int_equal(route(s, LLMGW_EP_CHAT, "gpt-4o", "default", 1, out,
                           &inc), 1);
    llmgw_snapshot_free(s);
}


static void
test_route_max_bounds_the_output(void **state)
{
    (void) state;

    llmgw_snapshot_t *s = snap(
        "{'channels':["
        "{'id':1,'type':1,'base_url':'https://a','models':['m'],"
        "'groups':['default'],'priority':3},"
        "{'id':2,'type':1,'base_url':'https://a','models':['m'],"
        "'groups':['default'],'priority':2},"
        "{'id':3,'type':1,'base_url':'https://a','models':['m'],"
        "'groups':['default'],'priority':1},"
        "{'id':4,'type':1,'base_url':'https://a','models':['m'],"
        "'groups':['default'],'priority':0}]}");
    const llmgw_channel_t  *out[5];
    size_t                  inc;

    out[2] = NULL;
    assert_int_equal(llmgw_route(s, LLMGW_EP_CHAT, S("m"), S("default"), 1,
                                 out, 2, &inc, NULL, NULL), 2);
    assert_int_equal(out[0]->id, 1);
    assert_int_equal(out[1]->id, 2);
    assert_null(out[2]);

    assert_int_equal(llmgw_route(s, LLMGW_EP_CHAT, S("m"), S("default"), 1,
                                 out, 0, &inc, NULL, NULL), 0);
    llmgw_snapshot_free(s);
}


static void
test_route_same_seed_same_order(void **state)
{
    (void) state;

    llmgw_snapshot_t *s = snap(
        "{'channels':["
        "{'id':1,'type':1,'base_url':'https://a','models':['m'],"
        "'groups':['default'],'weight':1},"
        "{'id':2,'type':1,'base_url':'https://a','models':['m'],"
        "'groups':['default'],'weight':1},"
        "{'id':3,'type':1,'base_url':'https://a','models':['m'],"
        "'groups':['default'],'weight':1},"
        "{'id':4,'type':1,'base_url':'https://a','models':['m'],"
        "'groups':['default'],'weight':1}]}");
    int differs = 0;

    for (uint64_t seed = 0; seed < 100; seed++) {
        const llmgw_channel_t  *a[MAXC], *b[MAXC], *c[MAXC];
        size_t                  inc;

        assert_int_equal(route(s, LLMGW_EP_CHAT, "m", "default", seed, a,
                               &inc), 4);
        assert_int_equal(route(s, LLMGW_EP_CHAT, "m", "default", seed, b,
                               &inc), 4);
        assert_memory_equal(a, b, 4 * sizeof(a[0]));

        route(s, LLMGW_EP_CHAT, "m", "default", seed + 1000, c, &inc);
        differs += memcmp(a, c, 4 * sizeof(a[0])) != 0;
    }

    /* and the seed matters: otherwise there is no spreading at all */
    assert_true(differs > 50);
    llmgw_snapshot_free(s);
}


static const char *const mapping_snap =
    "{'channels':["
    "{'id':1,'type':1,'base_url':'https://a','models':['gpt-4o','o1'],"
    "'groups':['default'],'model_mapping':{'gpt-4o':'gpt-4o-2024-08-06',"
    "'o1':''}},"
    "{'id':2,'type':1,'base_url':'https://b','models':['gpt-4o'],"
    "'groups':['default']}]}";


static const llmgw_channel_t *
channel_by_id(const llmgw_snapshot_t *s, const char *model, int64_t id)
{
    const llmgw_channel_t  *out[MAXC];
    size_t                  inc, n;

    n = route(s, LLMGW_EP_CHAT, model, "default", 1, out, &inc);
    for (size_t i = 0; i < n; i++) {
        if (out[i]->id == id) {
            return out[i];
        }
    }

    fail_msg("channel %lld does not serve %s", (long long) id, model);
    return NULL;
}


static void
assert_str(llmgw_str_t got, const char *want)
{
    assert_int_equal(got.len, strlen(want));
    assert_memory_equal(got.data, want, got.len);
}


static void
test_channel_map_model_renames_mapped_models_only(void **state)
{
    (void) state;

    llmgw_snapshot_t       *s = snap(mapping_snap);
    const llmgw_channel_t  *c1 = channel_by_id(s, "gpt-4o", 1);
    const llmgw_channel_t  *c2 = channel_by_id(s, "gpt-4o", 2);

    assert_str(llmgw_channel_map_model(s, c1, S("gpt-4o")),
               "gpt-4o-2024-08-06");
    /* the mapping is the channel's own: channel 2 sends the client's name */
    assert_str(llmgw_channel_map_model(s, c2, S("gpt-4o")), "gpt-4o");
    /* an empty target is no mapping */
    assert_str(llmgw_channel_map_model(s, c1, S("o1")), "o1");
    llmgw_snapshot_free(s);
}


static void
test_group_default_is_always_present(void **state)
{
    (void) state;

    llmgw_snapshot_t  *s = snap("{'channels':[]}");
    llmgw_verdict_t    v = { 0 };
    double             ratio = -1;

    assert_int_equal(llmgw_snapshot_group_check(s, S("default"), &ratio, &v),
                     0);
    assert_true(ratio == 1.0);
    llmgw_snapshot_free(s);
}


static void
test_group_unknown_is_403_group_unavailable(void **state)
{
    (void) state;

    llmgw_snapshot_t  *s = snap("{'groups':{'vip':{'ratio':2}}}");
    llmgw_verdict_t    v = { 0 };
    double             ratio = -1;

    assert_int_equal(llmgw_snapshot_group_check(s, S("svip"), &ratio, &v),
                     -1);
    assert_int_equal(v.status, 403);
    assert_string_equal(v.type, "gateway_error");
    assert_string_equal(v.code, "group_unavailable");
    assert_string_equal(v.message, "no access to group svip");
    llmgw_snapshot_free(s);
}


static void
test_group_deprecated_is_403_group_deprecated(void **state)
{
    (void) state;

    llmgw_snapshot_t  *s = snap(
        "{'groups':{'old':{'ratio':1,'deprecated':true}}}");
    llmgw_verdict_t    v = { 0 };
    double             ratio = -1;

    assert_int_equal(llmgw_snapshot_group_check(s, S("old"), &ratio, &v), -1);
    assert_int_equal(v.status, 403);
    assert_string_equal(v.type, "gateway_error");
    assert_string_equal(v.code, "group_deprecated");
    assert_string_equal(v.message, "group old deprecated");
    llmgw_snapshot_free(s);
}


static void
test_group_ratio_is_returned(void **state)
{
    (void) state;

    llmgw_snapshot_t  *s = snap(
        "{'groups':{'default':{'ratio':1,'deprecated':false},"
        "'vip':{'ratio':0.8,'deprecated':false},'bulk':2.5}}");
    llmgw_verdict_t    v = { 0 };
    double             ratio = -1;

    assert_int_equal(llmgw_snapshot_group_check(s, S("vip"), &ratio, &v), 0);
    assert_true(ratio == 0.8);
    /* hand-written rows: a bare number is the ratio */
    assert_int_equal(llmgw_snapshot_group_check(s, S("bulk"), &ratio, &v), 0);
    assert_true(ratio == 2.5);
    llmgw_snapshot_free(s);
}


static void
test_rate_limit_group_overrides_default(void **state)
{
    (void) state;

    llmgw_snapshot_t *s = snap(
        "{'rate_limit':{'default':{'duration_minutes':1,'total':60,"
        "'success':50},'groups':{'vip':{'duration_minutes':10,"
        "'total':1000,'success':0}}}}");
    llmgw_rate_limit_t rl;

    llmgw_snapshot_rate_limit(s, S("vip"), &rl);
    assert_int_equal(rl.window_ms, 600000);
    assert_int_equal(rl.total, 1000);
    assert_int_equal(rl.success, 0);

    llmgw_snapshot_rate_limit(s, S("default"), &rl);
    assert_int_equal(rl.window_ms, 60000);
    assert_int_equal(rl.total, 60);
    assert_int_equal(rl.success, 50);

    llmgw_snapshot_rate_limit(s, S("other"), &rl);
    assert_int_equal(rl.window_ms, 60000);
    assert_int_equal(rl.total, 60);
    llmgw_snapshot_free(s);
}


/* What the shared zone, which knows groups by hash only, asks of a
   user's log: how long it still counts. */
static void
test_rate_limit_window_by_group_hash(void **state)
{
    (void) state;

    llmgw_snapshot_t *s = snap(
        "{'rate_limit':{'default':{'duration_minutes':1,'total':60,"
        "'success':0},'groups':{'vip':{'duration_minutes':10,"
        "'total':1000,'success':0},'open':null}}}");

    assert_int_equal(llmgw_snapshot_rate_limit_window(s,
                         llmgw_rl_group_hash(S("vip"))), 600000);
    assert_int_equal(llmgw_snapshot_rate_limit_window(s,
                         llmgw_rl_group_hash(S("other"))), 60000);
    /* a group without a limit of its own limits nothing */
    assert_int_equal(llmgw_snapshot_rate_limit_window(s,
                         llmgw_rl_group_hash(S("open"))), 0);
    llmgw_snapshot_free(s);

    s = snap("{}");
    assert_int_equal(llmgw_snapshot_rate_limit_window(s,
                         llmgw_rl_group_hash(S("vip"))), 0);
    llmgw_snapshot_free(s);
}


static void
test_rate_limit_absent_means_no_limit(void **state)
{
    (void) state;

    llmgw_snapshot_t *s = snap(
        "{'rate_limit':{'default':null,'groups':{}}}");
    llmgw_rate_limit_t rl = { 1, 1, 1 };

    llmgw_snapshot_rate_limit(s, S("default"), &rl);
    assert_int_equal(rl.window_ms, 0);
    llmgw_snapshot_free(s);

    s = snap("{}");
    rl = (llmgw_rate_limit_t) { 1, 1, 1 };
    llmgw_snapshot_rate_limit(s, S("vip"), &rl);
    assert_int_equal(rl.window_ms, 0);
    llmgw_snapshot_free(s);
}


#define HASH_A  "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
#define HASH_B  "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
#define HASH_C  "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc"


static void
test_is_admin_only_for_listed_hashes(void **state)
{
    (void) state;

    llmgw_snapshot_t *s = snap("{'admin_hashes':['" HASH_A "','" HASH_B
                               "']}");

    assert_int_equal(llmgw_snapshot_is_admin(s, HASH_A), 1);
    assert_int_equal(llmgw_snapshot_is_admin(s, HASH_B), 1);
    assert_int_equal(llmgw_snapshot_is_admin(s, HASH_C), 0);
    llmgw_snapshot_free(s);

    s = snap("{'admin_hashes':[]}");
    assert_int_equal(llmgw_snapshot_is_admin(s, HASH_A), 0);
    llmgw_snapshot_free(s);
}


static const char *const pricing_snap =
    "{'pricing':{'gpt-4o':{'ratio':2.5,'completion_ratio':4},"
    "'cheap':{'ratio':0.25,'completion_ratio':2},"
    "'flat':{'ratio':2},"
    "'dall-e-3':{'price':0.04}}}";


static int64_t
quota_of(const llmgw_snapshot_t *s, const char *model, double group_ratio,
    int64_t prompt, int64_t completion)
{
    llmgw_price_t  p;
    llmgw_usage_t  u = { 0 };

    assert_int_equal(llmgw_snapshot_price(s, S(model), &p), 0);
    assert_int_equal(p.known, 1);
    u.prompt_tokens = prompt;
    u.completion_tokens = completion;
    u.known = 1;

    return llmgw_quota(&p, group_ratio, &u);
}


static void
test_price_per_token_reads_ratios(void **state)
{
    (void) state;

    llmgw_snapshot_t  *s = snap(pricing_snap);
    llmgw_price_t      p;

    assert_int_equal(llmgw_snapshot_price(s, S("gpt-4o"), &p), 0);
    assert_int_equal(p.known, 1);
    assert_int_equal(p.per_call, 0);
    assert_true(p.ratio == 2.5);
    assert_true(p.completion_ratio == 4);

    /* completion_ratio defaults to 1 */
    assert_int_equal(llmgw_snapshot_price(s, S("flat"), &p), 0);
    assert_true(p.completion_ratio == 1);
    llmgw_snapshot_free(s);
}


/*
 * A number beyond any double (the database stores what jansson cannot read)
 * is read as the largest power of ten, not as an unreadable snapshot.
 */
static void
test_snapshot_reads_numbers_beyond_a_double(void **state)
{
    (void) state;

    llmgw_snapshot_t  *s = snap("{'pricing':{'huge':{'ratio':1e400,"
                                "'completion_ratio':-2e999},"
                                "'wide':{'ratio':100000000000000000000000"
                                "00000000000000000000000000000000000000000"
                                "0000000000000000000000000000000000000000"
                                "0000000000000000000000000000000000000000"
                                "0000000000000000000000000000000000000000"
                                "0000000000000000000000000000000000000000"
                                "0000000000000000000000000000000000000000"
                                "0000000000000000000000000000000000000000e9},"
                                "'ok':{'ratio':0.5}}}");
    llmgw_price_t      p;

    assert_int_equal(llmgw_snapshot_price(s, S("huge"), &p), 0);
    assert_true(p.ratio == 1e308);
    assert_true(p.completion_ratio == -1e308);
    assert_int_equal(llmgw_snapshot_price(s, S("wide"), &p), 0);
    assert_true(p.ratio == 1e308);
    assert_int_equal(llmgw_snapshot_price(s, S("ok"), &p), 0);
    assert_true(p.ratio == 0.5);
    llmgw_snapshot_free(s);
}


static void
test_quota_per_token_is_prompt_plus_weighted_completion(void **state)
{
    (void) state;

    llmgw_snapshot_t *s = snap(pricing_snap);

    /* (100 + 30 x 4) x 2.5 x 0.5 */
    assert_int_equal(quota_of(s, "gpt-4o", 0.5, 100, 30), 275);
    /* (10 + 10 x 1) x 2 */
    assert_int_equal(quota_of(s, "flat", 1, 10, 10), 40);
    assert_int_equal(quota_of(s, "gpt-4o", 1, 0, 0), 0);
    /* never a credit, never an overflow */
    assert_int_equal(quota_of(s, "gpt-4o", 1, -1000, -1000), 0);
    /* at most what a ledger batch can sum */
    assert_int_equal(quota_of(s, "gpt-4o", 1000, INT64_MAX, INT64_MAX),
                     LLMGW_QUOTA_MAX);
    llmgw_snapshot_free(s);
}


static void
test_quota_rounds_to_the_nearest_unit(void **state)
{
    (void) state;

    llmgw_snapshot_t *s = snap(pricing_snap);

    /* (1 + 1 x 2) x 0.25 = 0.75 -> 1, not truncated to 0 */
    assert_int_equal(quota_of(s, "cheap", 1, 1, 1), 1);
    /* (9 + 0) x 0.25 = 2.25 -> 2 */
    assert_int_equal(quota_of(s, "cheap", 1, 9, 0), 2);
    /* (3 + 0) x 0.25 x 2 = 1.5 -> 2 */
    assert_int_equal(quota_of(s, "cheap", 2, 3, 0), 2);
    llmgw_snapshot_free(s);

    /* an exact decimal half that binary floating point computes a hair
       below it: (30 + 60 x 2) x 0.3 x 0.7 = 31.5 -> 32, not 31 */
    s = snap("{'pricing':{'m':{'ratio':0.3,'completion_ratio':2}}}");
    assert_int_equal(quota_of(s, "m", 0.7, 30, 60), 32);
    /* 35 x 0.3 x 0.7 = 7.35 -> 7: only what is a half rounds up */
    assert_int_equal(quota_of(s, "m", 0.7, 35, 0), 7);
    llmgw_snapshot_free(s);
}


/*
 * Ratios given in decimals that binary floating point cannot hold exactly:
 * a charge of exactly half a unit still rounds up, and one a hair off the
 * half rounds to the nearer unit.
 */
static void
test_quota_exact_decimal_halves_round_up(void **state)
{
    (void) state;

    llmgw_snapshot_t *s = snap("{'pricing':{'p3':{'ratio':0.3,"
                               "'completion_ratio':2},"
                               "'p1':{'ratio':0.1,'completion_ratio':1},"
                               "'p7':{'ratio':0.7,'completion_ratio':1.1},"
                               "'call':{'price':0.0000033}}}");

    /* (30 + 60 x 2) x 0.3 x 0.7 = 31.5 (31.499999999999996 in doubles) */
    assert_int_equal(quota_of(s, "p3", 0.7, 30, 60), 32);
    /* (5 + 0) x 0.1 x 1 = 0.5; 25 x 0.1 x 1 = 2.5; 35 x 0.1 x 0.3 = 1.05 */
    assert_int_equal(quota_of(s, "p1", 1, 5, 0), 1);
    assert_int_equal(quota_of(s, "p1", 1, 25, 0), 3);
    assert_int_equal(quota_of(s, "p1", 0.3, 35, 0), 1);
    /* (0 + 5 x 1.1) x 0.7 = 3.85 -> 4; (10 + 0) x 0.7 x 0.5 = 3.5 -> 4 */
    assert_int_equal(quota_of(s, "p7", 1, 0, 5), 4);
    assert_int_equal(quota_of(s, "p7", 0.5, 10, 0), 4);
    /* 0.0000033 x 500000 x 1 = 1.65 -> 2; x 0.3 = 0.495 -> 0 */
    assert_int_equal(quota_of(s, "call", 1, 0, 0), 2);
    assert_int_equal(quota_of(s, "call", 0.3, 0, 0), 0);
    /* 1.5 stays 2, 2.4999 stays 2 */
    assert_int_equal(quota_of(s, "p1", 1, 15, 0), 2);
    assert_int_equal(quota_of(s, "p1", 0.9999, 25, 0), 2);
    llmgw_snapshot_free(s);
}


static void
test_quota_per_call_is_price_times_500000_times_group_ratio(void **state)
{
    (void) state;

    llmgw_snapshot_t  *s = snap(pricing_snap);
    llmgw_price_t      p;

    assert_int_equal(llmgw_snapshot_price(s, S("dall-e-3"), &p), 0);
    assert_int_equal(p.per_call, 1);
    assert_true(p.price == 0.04);

    /* 0.04 USD x 500000 x 1.5, whatever the tokens */
    assert_int_equal(quota_of(s, "dall-e-3", 1.5, 0, 0), 30000);
    assert_int_equal(quota_of(s, "dall-e-3", 1.5, 5000, 9000), 30000);
    assert_int_equal(quota_of(s, "dall-e-3", 1, 1, 1), 20000);
    llmgw_snapshot_free(s);
}


static void
test_price_unknown_model_is_minus_one(void **state)
{
    (void) state;

    llmgw_snapshot_t  *s = snap(pricing_snap);
    llmgw_price_t      p;

    memset(&p, 0x5a, sizeof(p));
    assert_int_equal(llmgw_snapshot_price(s, S("gpt-5"), &p), -1);
    assert_int_equal(p.known, 0);
    assert_int_equal(llmgw_snapshot_price(s, S("gpt-4o "), &p), -1);
    llmgw_snapshot_free(s);
}


int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(
            test_snapshot_parse_reads_revision_and_channel_fields),
        cmocka_unit_test(
            test_snapshot_parse_refuses_what_is_not_a_json_object),
        cmocka_unit_test(test_base_url_https_defaults_to_port_443),
        cmocka_unit_test(test_base_url_http_defaults_to_port_80),
        cmocka_unit_test(
            test_base_url_explicit_port_is_used_and_kept_in_host_header),
        cmocka_unit_test(test_base_url_ipv6_literal_in_brackets),
        cmocka_unit_test(
            test_base_url_path_prefix_kept_without_trailing_slash),
        cmocka_unit_test(test_bad_base_url_skips_only_that_channel),
        cmocka_unit_test(
            test_control_characters_leave_the_channel_out_and_are_named),
        cmocka_unit_test(
            test_route_only_channels_serving_the_model_in_the_keys_group),
        cmocka_unit_test(test_route_endpoint_compatibility_by_channel_type),
        cmocka_unit_test(
            test_route_incompatible_counts_only_the_groups_channels),
        cmocka_unit_test(test_route_highest_priority_first),
        cmocka_unit_test(test_route_weights_split_traffic_three_to_one),
        cmocka_unit_test(
            test_route_zero_weight_never_first_when_a_positive_one_exists),
        cmocka_unit_test(test_route_all_zero_weights_pick_uniformly),
        cmocka_unit_test(test_route_every_candidate_returned_once),
        cmocka_unit_test(test_route_trailing_space_in_model_does_not_match),
        cmocka_unit_test(test_route_max_bounds_the_output),
        cmocka_unit_test(test_route_same_seed_same_order),
        cmocka_unit_test(test_channel_map_model_renames_mapped_models_only),
        cmocka_unit_test(test_group_default_is_always_present),
        cmocka_unit_test(test_group_unknown_is_403_group_unavailable),
        cmocka_unit_test(test_group_deprecated_is_403_group_deprecated),
        cmocka_unit_test(test_group_ratio_is_returned),
        cmocka_unit_test(test_rate_limit_group_overrides_default),
        cmocka_unit_test(test_rate_limit_window_by_group_hash),
        cmocka_unit_test(test_rate_limit_absent_means_no_limit),
        cmocka_unit_test(test_is_admin_only_for_listed_hashes),
        cmocka_unit_test(test_price_per_token_reads_ratios),
        cmocka_unit_test(
            test_quota_per_token_is_prompt_plus_weighted_completion),
        cmocka_unit_test(test_quota_rounds_to_the_nearest_unit),
        cmocka_unit_test(test_quota_exact_decimal_halves_round_up),
        cmocka_unit_test(
            test_quota_per_call_is_price_times_500000_times_group_ratio),
        cmocka_unit_test(test_price_unknown_model_is_minus_one),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
