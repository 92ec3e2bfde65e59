/*
 * The model endpoints: key, limits, body, route, then the upstream.
 *
 * A request moves through these steps in order, each refusing in the error
 * contract: endpoint (404), key (401), address / group (403), rate limit
 * (429), body (400), model access (403), route (503 / 500), upstream.  The
 * rate limit comes before the body so that bad requests count too.
 */

#include "ngx_llmgw.h"


#define NGX_LLMGW_ADMIT_STEP  1     /* ms */


static ngx_int_t ngx_llmgw_after_token(ngx_http_request_t *r,
    ngx_llmgw_ctx_t *ctx, llmgw_token_t *t, const char *err);
static void ngx_llmgw_token_ready(ngx_http_request_t *r, llmgw_token_t *t,
    const char *err);
static void ngx_llmgw_body_ready(ngx_http_request_t *r);
static void ngx_llmgw_admit(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx);
static void ngx_llmgw_admitted(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx);
static void ngx_llmgw_admit_tick(ngx_event_t *ev);
static ngx_int_t ngx_llmgw_retry_after(ngx_http_request_t *r,
    ngx_uint_t seconds);

/* What a request needs before its price, touching no nginx state, so that
   it may run in a thread (ngx_llmgw_prep). */
typedef struct {
    ngx_llmgw_ctx_t   *ctx;
    uint64_t           seed;
    ngx_uint_t         max_tries;
    ngx_uint_t         prepare;       /* build the tries' bodies too */
    ngx_uint_t         refused;       /* v holds the answer */
    size_t             incompatible;
    llmgw_verdict_t    v;
#if (NGX_THREADS)
    /* a timer that is not cancelable: a worker that is shutting down
       waits for the task instead of exiting under it */
    ngx_event_t        hold;
#endif
} ngx_llmgw_prep_t;

static void ngx_llmgw_prep(ngx_llmgw_prep_t *p);
static void ngx_llmgw_prepped(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx,
    ngx_llmgw_prep_t *p);
#if (NGX_THREADS)
static ngx_int_t ngx_llmgw_offload(ngx_http_request_t *r,
    ngx_llmgw_ctx_t *ctx, ngx_thread_pool_t *tp);
static void ngx_llmgw_offload_thread(void *data, ngx_log_t *log);
static void ngx_llmgw_offload_done(ngx_event_t *ev);
static void ngx_llmgw_offload_wait(ngx_http_request_t *r);
static void ngx_llmgw_offload_hold(ngx_event_t *ev);
#endif
static ngx_int_t ngx_llmgw_route(ngx_http_request_t *r,
    ngx_llmgw_ctx_t *ctx, size_t incompatible, llmgw_verdict_t *v);
static ngx_int_t ngx_llmgw_price(ngx_http_request_t *r,
    ngx_llmgw_ctx_t *ctx, llmgw_verdict_t *v);
static ngx_int_t ngx_llmgw_reserve(ngx_http_request_t *r,
    ngx_llmgw_ctx_t *ctx, llmgw_verdict_t *v);
static ngx_int_t ngx_llmgw_models(ngx_http_request_t *r,
    ngx_llmgw_ctx_t *ctx);
static ngx_int_t ngx_llmgw_refuse(ngx_http_request_t *r,
    ngx_llmgw_ctx_t *ctx, int status, const char *type, const char *code,
    const char *message);
typedef struct {
    ngx_str_t  key;
    ngx_str_t  args;
} ngx_llmgw_saved_query_t;


static void ngx_llmgw_saved_query(void *data);
static ngx_int_t ngx_llmgw_take_query_key(ngx_http_request_t *r,
    ngx_llmgw_ctx_t *ctx);
static void ngx_llmgw_mask_uri_key(u_char *uri, size_t len);
static ngx_int_t ngx_llmgw_find_key(ngx_http_request_t *r,
    ngx_llmgw_ctx_t *ctx, ngx_str_t *key);


ngx_int_t
ngx_llmgw_gateway_handler(ngx_http_request_t *r)
{
    ngx_int_t               rc;
    ngx_str_t               key;
    llmgw_token_t          *t;
    llmgw_verdict_t         v;
    ngx_llmgw_ctx_t        *ctx;
    ngx_llmgw_main_conf_t  *mcf;

    ctx = ngx_llmgw_get_ctx(r);
    if (ctx == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    llmgw_endpoint_classify(
        (llmgw_str_t) { (char *) r->method_name.data, r->method_name.len },
        (llmgw_str_t) { (char *) r->uri.data, r->uri.len },
        &ctx->endpoint);

    if (ctx->endpoint.ep == LLMGW_EP_INVALID_URL
        || ctx->endpoint.ep == LLMGW_EP_NONE)
    {
        /* the task API and the plugins' own routes */
        ctx->snapshot = ngx_llmgw_cache_snapshot();

        if (ctx->snapshot != NULL) {
            llmgw_task_route(ctx->snapshot,
                (llmgw_str_t) { (char *) r->method_name.data,
                                r->method_name.len },
                (llmgw_str_t) { (char *) r->uri.data, r->uri.len },
                &ctx->troute);

            if (ctx->troute.kind != LLMGW_TROUTE_NONE) {
                ctx->endpoint.ep = LLMGW_EP_TASK;
                ctx->endpoint.method_ok = ctx->troute.method_ok;
            }
        }
    }

    /* taken at the start of the request (ngx_llmgw_post_read); a
       location reached by an internal redirect has a new context */
    if (!ctx->query_key_taken
        && ngx_llmgw_take_query_key(r, ctx) != NGX_OK)
    {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (ctx->endpoint.ep == LLMGW_EP_INVALID_URL) {
        return ngx_llmgw_refuse(r, ctx, NGX_HTTP_NOT_FOUND, "gateway_error",
                                "invalid_url", ctx->endpoint.message);
    }

    if (!ctx->endpoint.method_ok) {
        /* method and path are cut so that the gateway's list, not the
           client's text, ends the message the Allow header is read from */
        llmgw_verdict_set(&v, NGX_HTTP_NOT_ALLOWED, "gateway_error",
                          "method_not_allowed", "method %.*s is not allowed "
                          "on %.*s (allowed: %s)",
                          (int) ngx_min(r->method_name.len, 32),
                          r->method_name.data, (int) ngx_min(r->uri.len, 128),
                          r->uri.data,
                          ctx->endpoint.ep == LLMGW_EP_TASK
                          ? ctx->troute.allow
                          : ctx->endpoint.ep == LLMGW_EP_MODELS
                            ? "GET, HEAD" : "POST");
        return ngx_llmgw_send_error(r, ctx, &v);
    }

    if (ctx->snapshot == NULL) {
        ctx->snapshot = ngx_llmgw_cache_snapshot();
    }

    if (ctx->snapshot == NULL) {
        return ngx_llmgw_refuse(r, ctx, NGX_HTTP_SERVICE_UNAVAILABLE,
                                "gateway_error", "service_unavailable",
                                "the gateway has not loaded its "
                                "configuration yet; retry shortly");
    }

    if (ctx->endpoint.ep == LLMGW_EP_TASK
        && ctx->troute.kind == LLMGW_TROUTE_CONTENT)
    {
        /* a signed artifact link stands for the key */
        mcf = ngx_http_get_module_main_conf(r, ngx_http_llmgw_module);
        rc = llmgw_artifact_link_check(
                 (llmgw_str_t) { (char *) mcf->crypto_secret.data,
                                 mcf->crypto_secret.len },
                 (llmgw_str_t) { (char *) r->uri.data, r->uri.len },
                 ctx->args.data
                 ? (llmgw_str_t) { (char *) ctx->args.data, ctx->args.len }
                 : (llmgw_str_t) { (char *) r->args.data, r->args.len },
                 (int64_t) ngx_time(), &v);

        if (rc < 0) {
            return ngx_llmgw_send_error(r, ctx, &v);
        }

        if (rc == 0) {
            ctx->signed_link = 1;
            rc = ngx_http_read_client_request_body(r, ngx_llmgw_body_ready);
            return rc >= NGX_HTTP_SPECIAL_RESPONSE ? rc : NGX_DONE;
        }
    }

    if (ngx_llmgw_find_key(r, ctx, &key) != NGX_OK
        || llmgw_client_key_hash((llmgw_str_t) { (char *) key.data, key.len },
                                 ctx->key_hash) != 0)
    {
        return ngx_llmgw_refuse(r, ctx, NGX_HTTP_UNAUTHORIZED,
                                "gateway_error", "invalid_token",
                                "Invalid token");
    }

    t = NULL;
    rc = ngx_llmgw_cache_token(r, ctx->key_hash, &t, ngx_llmgw_token_ready);

    if (rc == NGX_OK) {
        return ngx_llmgw_after_token(r, ctx, t, NULL);
    }

    if (rc == NGX_AGAIN) {
        r->main->count++;
        ctx->waiting = 1;
        return NGX_DONE;
    }

    return ngx_llmgw_after_token(r, ctx, NULL, "the key store is busy");
}


static void
ngx_llmgw_token_ready(ngx_http_request_t *r, llmgw_token_t *t,
    const char *err)
{
    ngx_llmgw_ctx_t  *ctx;

    ctx = ngx_llmgw_get_ctx(r);

    if (ctx == NULL) {
        llmgw_token_free(t);
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    ctx->waiting = 0;

    /* the lookup's reference becomes the request's */
    ngx_http_finalize_request(r, ngx_llmgw_after_token(r, ctx, t, err));
}


static ngx_int_t
ngx_llmgw_client_addr(ngx_http_request_t *r, int *family, uint8_t **addr)
{
    struct sockaddr      *sa = r->connection->sockaddr;
#if (NGX_HAVE_INET6)
    struct sockaddr_in6  *sin6;
#endif

    switch (sa->sa_family) {

    case AF_INET:
        *family = AF_INET;
        *addr = (uint8_t *) &((struct sockaddr_in *) sa)->sin_addr;
        return NGX_OK;

#if (NGX_HAVE_INET6)
    case AF_INET6:
        sin6 = (struct sockaddr_in6 *) sa;
        *family = AF_INET6;
        *addr = (uint8_t *) &sin6->sin6_addr;
        return NGX_OK;
#endif

    default:
        return NGX_DECLINED;
    }
}


static ngx_int_t
ngx_llmgw_after_token(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx,
    llmgw_token_t *t, const char *err)
{
    int                  family, which;
    char                 addr_text[NGX_SOCKADDR_STRLEN + 1];
    double               ratio;
    uint8_t             *addr;
    ngx_int_t            rc;
    ngx_uint_t           retry;
    llmgw_str_t          group;
    llmgw_verdict_t      v;
    llmgw_rate_limit_t   rl;

    if (err != NULL) {
        llmgw_token_free(t);
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "llmgw: key lookup failed: %s", err);
        return ngx_llmgw_refuse(r, ctx, NGX_HTTP_SERVICE_UNAVAILABLE,
                                "gateway_error", "service_unavailable",
                                "the key could not be checked right now; "
                                "retry shortly");
    }

    if (t == NULL) {
        return ngx_llmgw_refuse(r, ctx, NGX_HTTP_UNAUTHORIZED,
                                "gateway_error", "invalid_token",
                                "Invalid token");
    }

    ctx->token = t;
    ctx->token_id = llmgw_token_id(t);
    ctx->user_id = llmgw_token_user_id(t);

    /* whether the key has quota left is the zone's to say: it may know a
       later balance than the record (a refund, say) */
    if (llmgw_token_check_standing(t, (int64_t) ngx_time(), &v) != 0
        || ngx_llmgw_billing_key_check(ctx, &v) != NGX_OK)
    {
        return ngx_llmgw_send_error(r, ctx, &v);
    }

    /* a client of no IP address (a Unix socket without realip) matches no
       allow-list: a key limited to addresses is refused there */
    if (ngx_llmgw_client_addr(r, &family, &addr) != NGX_OK) {
        family = 0;
        addr = NULL;
    }

    ngx_cpystrn((u_char *) addr_text, r->connection->addr_text.data,
                ngx_min(r->connection->addr_text.len + 1, sizeof(addr_text)));

    if (llmgw_token_check_ip(t, family, addr, addr_text, &v) != 0) {
        return ngx_llmgw_send_error(r, ctx, &v);
    }

    group = llmgw_token_group(t);
    ctx->group.data = (u_char *) group.data;
    ctx->group.len = group.len;

    if (llmgw_snapshot_group_check(ctx->snapshot, group, &ratio, &v) != 0) {
        return ngx_llmgw_send_error(r, ctx, &v);
    }

    ctx->group_ratio = ratio;

    llmgw_snapshot_rate_limit(ctx->snapshot, group, &rl);

    if (rl.window_ms > 0
        && ngx_llmgw_rl_acquire(ctx, &rl, ctx->user_id, &which, &retry)
           == NGX_DECLINED)
    {
        ngx_llmgw_metrics_rate_limited();

        if (ngx_llmgw_retry_after(r, retry) != NGX_OK) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        if (which == LLMGW_RL_SUCCESS) {
            llmgw_verdict_set(&v, NGX_HTTP_TOO_MANY_REQUESTS, "gateway_error",
                              "rate_limit_exceeded", "rate limit exceeded: "
                              "at most %u successful requests in %d minute%s "
                              "(a request under way holds a slot until it "
                              "ends)", (unsigned) rl.success,
                              (int) (rl.window_ms / 60000),
                              rl.window_ms == 60000 ? "" : "s");
        } else {
            llmgw_verdict_set(&v, NGX_HTTP_TOO_MANY_REQUESTS, "gateway_error",
                              "rate_limit_exceeded", "rate limit exceeded: "
                              "at most %u requests in %d minute%s (failed "
                              "requests count too)", (unsigned) rl.total,
                              (int) (rl.window_ms / 60000),
                              rl.window_ms == 60000 ? "" : "s");
        }

        return ngx_llmgw_send_error(r, ctx, &v);
    }

    /* a listing is a request of the key's like any other: counted above */
    if (ctx->endpoint.ep == LLMGW_EP_MODELS) {
        return ngx_llmgw_models(r, ctx);
    }

    rc = ngx_http_read_client_request_body(r, ngx_llmgw_body_ready);

    if (rc >= NGX_HTTP_SPECIAL_RESPONSE) {
        return rc;
    }

    return NGX_DONE;
}


static void
ngx_llmgw_body_ready(ngx_http_request_t *r)
{
    llmgw_verdict_t          v;
    ngx_llmgw_ctx_t         *ctx;
    ngx_llmgw_prep_t         prep;
    ngx_llmgw_loc_conf_t    *lcf;
#if (NGX_THREADS)
    ngx_llmgw_main_conf_t   *mcf;
#endif

    ctx = ngx_llmgw_get_ctx(r);
    if (ctx == NULL) {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    /* a task request takes the body itself: a spooled upload stays in
     * its temp file */
    if (ctx->endpoint.ep != LLMGW_EP_TASK
        && ngx_llmgw_read_body(r, &ctx->body) != NGX_OK)
    {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    if (ctx->endpoint.ep == LLMGW_EP_TASK) {
        if (ctx->troute.kind == LLMGW_TROUTE_SUBMIT
            && ctx->troute.plugin < 0)
        {
            llmgw_verdict_set(&v, NGX_HTTP_NOT_FOUND, "gateway_error",
                              "plugin_not_found", "no enabled task plugin "
                              "is named by %.*s",
                              (int) ngx_min(r->uri.len, 128), r->uri.data);
            ngx_http_finalize_request(r, ngx_llmgw_send_error(r, ctx, &v));
            return;
        }

        ngx_llmgw_task_start(r, ctx);
        return;
    }

#if (NGX_THREADS)
    mcf = ngx_http_get_module_main_conf(r, ngx_http_llmgw_module);

    /* a large body takes milliseconds to read and convert: not in the
       worker, which serves every other request meanwhile */
    if (mcf->thread_pool != NULL && ctx->body.len >= mcf->offload_size
        && ngx_llmgw_offload(r, ctx, mcf->thread_pool) == NGX_OK)
    {
        return;
    }
#endif

    lcf = ngx_http_get_module_loc_conf(r, ngx_http_llmgw_module);

    ngx_memzero(&prep, sizeof(ngx_llmgw_prep_t));
    prep.ctx = ctx;
    prep.seed = ((uint64_t) ngx_random() << 32) ^ (uint64_t) ngx_random();
    prep.max_tries = lcf->max_tries;

    ngx_llmgw_prep(&prep);
    ngx_llmgw_prepped(r, ctx, &prep);
}


static void
ngx_llmgw_prep(ngx_llmgw_prep_t *p)
{
    ngx_uint_t        i;
    llmgw_str_t       model;
    ngx_llmgw_ctx_t  *ctx;

    ctx = p->ctx;

    ctx->req = llmgw_req_parse(ctx->endpoint.ep, ctx->endpoint.model,
                               (char *) ctx->body.data, ctx->body.len,
                               &p->v);
    if (ctx->req == NULL) {
        /* the refusal is logged under the model it names, if any */
        model = ctx->endpoint.model.len
                ? ctx->endpoint.model
                : llmgw_req_model_in((char *) ctx->body.data, ctx->body.len);
        ctx->model.data = (u_char *) model.data;
        ctx->model.len = model.len;
        p->refused = 1;
        return;
    }

    model = llmgw_req_model(ctx->req);
    ctx->model.data = (u_char *) model.data;
    ctx->model.len = model.len;

    if (llmgw_token_check_model(ctx->token, model, &p->v) != 0) {
        p->refused = 1;
        return;
    }

    ctx->nchannels = llmgw_route(ctx->snapshot, ctx->endpoint.ep, model,
        (llmgw_str_t) { (char *) ctx->group.data, ctx->group.len },
        p->seed, ctx->channels, p->max_tries, &p->incompatible, ctx->req,
        &p->v);

    /* the body of every try: once per channel type and model sent */
    for (i = 0; p->prepare && i < ctx->nchannels; i++) {
        llmgw_req_prepare(ctx->req, ctx->channels[i],
                          llmgw_channel_map_model(ctx->snapshot,
                                                  ctx->channels[i], model));
    }
}


static void
ngx_llmgw_prepped(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx,
    ngx_llmgw_prep_t *p)
{
    llmgw_verdict_t  v;

    if (p->refused) {
        ngx_http_finalize_request(r, ngx_llmgw_send_error(r, ctx, &p->v));
        return;
    }

    if (ngx_llmgw_route(r, ctx, p->incompatible, &p->v) != NGX_OK) {
        ngx_http_finalize_request(r, ngx_llmgw_send_error(r, ctx, &p->v));
        return;
    }

    if (ngx_llmgw_price(r, ctx, &v) != NGX_OK) {
        ngx_http_finalize_request(r, ngx_llmgw_send_error(r, ctx, &v));
        return;
    }

    ngx_llmgw_admit(r, ctx);
}


#if (NGX_THREADS)

/*
 * ngx_llmgw_prep in a thread of the pool.  The request is blocked
 * meanwhile (nginx frees nothing of it, and a client that leaves is seen
 * when the task is done); the thread reads the request's body, key and
 * snapshot, which nothing changes until then, and writes only the
 * request's own ctx.
 */
static ngx_int_t
ngx_llmgw_offload(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx,
    ngx_thread_pool_t *tp)
{
    ngx_llmgw_prep_t      *p;
    ngx_thread_task_t     *task;
    ngx_llmgw_loc_conf_t  *lcf;

    lcf = ngx_http_get_module_loc_conf(r, ngx_http_llmgw_module);

    task = ngx_thread_task_alloc(r->pool, sizeof(ngx_llmgw_prep_t));
    if (task == NULL) {
        return NGX_ERROR;
    }

    p = task->ctx;
    p->ctx = ctx;
    p->seed = ((uint64_t) ngx_random() << 32) ^ (uint64_t) ngx_random();
    p->max_tries = lcf->max_tries;
    p->prepare = 1;

    task->handler = ngx_llmgw_offload_thread;
    task->event.handler = ngx_llmgw_offload_done;
    task->event.data = task;
    task->event.log = r->connection->log;

    /* all set before the thread may see the task */
    p->hold.handler = ngx_llmgw_offload_hold;
    p->hold.data = task;
    p->hold.log = r->connection->log;

    if (ngx_thread_task_post(tp, task) != NGX_OK) {
        return NGX_ERROR;
    }

    /* the task's end is an event of this worker: not before this returns */
    ngx_add_timer(&p->hold, 3600 * 1000);

    r->main->blocked++;
    r->aio = 1;
    r->write_event_handler = ngx_llmgw_offload_wait;

    return NGX_OK;
}


static void
ngx_llmgw_offload_hold(ngx_event_t *ev)
{
    ngx_add_timer(ev, 3600 * 1000);
}


static void
ngx_llmgw_offload_thread(void *data, ngx_log_t *log)
{
    ngx_llmgw_prep(data);
}


/* Write events while the thread works: nothing to write yet. */
static void
ngx_llmgw_offload_wait(ngx_http_request_t *r)
{
}


static void
ngx_llmgw_offload_done(ngx_event_t *ev)
{
    ngx_connection_t    *c;
    ngx_llmgw_prep_t    *p;
    ngx_thread_task_t   *task;
    ngx_http_request_t  *r;

    task = ev->data;
    p = task->ctx;
    r = p->ctx->request;
    c = r->connection;

    if (p->hold.timer_set) {
        ngx_del_timer(&p->hold);
    }

    r->main->blocked--;
    r->aio = 0;

    if (r->write_event_handler != ngx_llmgw_offload_wait) {
        /* ended meanwhile (nginx set its finalizer) */
        r->write_event_handler(r);

    } else {
        r->write_event_handler = ngx_http_request_empty_handler;
        ngx_llmgw_prepped(r, p->ctx, p);
    }

    ngx_http_run_posted_requests(c);
}

#endif


/*
 * A request is served only when its ledger row will have room.  While the
 * database is behind, it waits up to llmgw_ledger_wait rather than being
 * refused at once: a short stall of the database costs latency, not errors,
 * and a waiting worker leaves the CPU to the database instead of spending
 * it on refusals.  The waiters of a worker form one queue, served oldest
 * first as room appears (looked at every NGX_LLMGW_ADMIT_STEP while any
 * wait); a newcomer queues behind them, so that none waits for ever while
 * later ones pass.
 */
static ngx_queue_t  ngx_llmgw_admit_waiting;
static ngx_event_t  ngx_llmgw_admit_ev;


static void
ngx_llmgw_admit(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx)
{
    ngx_llmgw_main_conf_t  *mcf;

    if (ngx_llmgw_admit_ev.handler == NULL) {
        ngx_queue_init(&ngx_llmgw_admit_waiting);
        ngx_llmgw_admit_ev.handler = ngx_llmgw_admit_tick;
        ngx_llmgw_admit_ev.data = &ngx_llmgw_no_connection;
        ngx_llmgw_admit_ev.log = ngx_cycle->log;
    }

    if (ngx_queue_empty(&ngx_llmgw_admit_waiting)
        && ngx_llmgw_ledger_has_room() == NGX_OK)
    {
        ngx_llmgw_admitted(r, ctx);
        return;
    }

    mcf = ngx_http_get_module_main_conf(r, ngx_http_llmgw_module);

    ngx_llmgw_metrics_ledger_wait(0);

    ctx->admit_r = r;
    ctx->admit_until = ngx_current_msec + mcf->ledger_wait;
    ngx_queue_insert_tail(&ngx_llmgw_admit_waiting, &ctx->admit_queue);
    ngx_llmgw_ledger_wake();

    if (!ngx_llmgw_admit_ev.timer_set) {
        ngx_add_timer(&ngx_llmgw_admit_ev, NGX_LLMGW_ADMIT_STEP);
    }
}


/* Takes a request that ends (or is admitted) out of the queue. */
void
ngx_llmgw_admit_cancel(ngx_llmgw_ctx_t *ctx)
{
    if (ctx->admit_r == NULL) {
        return;
    }

    ngx_queue_remove(&ctx->admit_queue);
    ctx->admit_r = NULL;

    if (ngx_queue_empty(&ngx_llmgw_admit_waiting)
        && ngx_llmgw_admit_ev.timer_set)
    {
        ngx_del_timer(&ngx_llmgw_admit_ev);
    }
}


/* requests of this worker wait for ledger room */
ngx_uint_t
ngx_llmgw_admit_waiters(void)
{
    return ngx_llmgw_admit_ev.handler != NULL
           && !ngx_queue_empty(&ngx_llmgw_admit_waiting);
}


static void
ngx_llmgw_admit_tick(ngx_event_t *ev)
{
    ngx_queue_t         *q;
    ngx_connection_t    *c;
    llmgw_verdict_t      v;
    ngx_llmgw_ctx_t     *ctx;
    ngx_http_request_t  *r;

    while (!ngx_queue_empty(&ngx_llmgw_admit_waiting)) {
        q = ngx_queue_head(&ngx_llmgw_admit_waiting);
        ctx = ngx_queue_data(q, ngx_llmgw_ctx_t, admit_queue);
        r = ctx->admit_r;
        c = r->connection;

        if (ngx_llmgw_ledger_has_room() == NGX_OK) {
            ngx_llmgw_admit_cancel(ctx);
            ngx_llmgw_admitted(r, ctx);
            ngx_http_run_posted_requests(c);
            continue;
        }

        /* the head waited longest: when it may still wait, so may the rest
           (also in a worker told to stop: a reload's new workers, or this
           one's flushes, make room) */
        if ((ngx_msec_int_t) (ctx->admit_until - ngx_current_msec) > 0
            && !ngx_terminate)
        {
            break;
        }

        ngx_llmgw_admit_cancel(ctx);
        ngx_llmgw_metrics_ledger_wait(1);

        llmgw_verdict_set(&v, NGX_HTTP_SERVICE_UNAVAILABLE, "gateway_error",
                          "service_unavailable", "the ledger is behind; "
                          "retry shortly");
        ngx_http_finalize_request(r,
            ngx_llmgw_retry_after(r, 1) == NGX_OK
            ? ngx_llmgw_send_error(r, ctx, &v)
            : NGX_HTTP_INTERNAL_SERVER_ERROR);
        ngx_http_run_posted_requests(c);
    }

    if (!ngx_queue_empty(&ngx_llmgw_admit_waiting) && !ev->timer_set) {
        ngx_add_timer(ev, NGX_LLMGW_ADMIT_STEP);
    }
}


static void
ngx_llmgw_admitted(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx)
{
    ngx_int_t        rc;
    llmgw_verdict_t  v;

    if (ngx_llmgw_reserve(r, ctx, &v) != NGX_OK) {
        ngx_http_finalize_request(r, ngx_llmgw_send_error(r, ctx, &v));
        return;
    }

    rc = ngx_llmgw_upstream_start(r, ctx);

    if (rc != NGX_OK) {
        ngx_http_finalize_request(r, rc);
    }
}


/* A Retry-After header of the given seconds. */
static ngx_int_t
ngx_llmgw_retry_after(ngx_http_request_t *r, ngx_uint_t seconds)
{
    u_char            v[NGX_INT_T_LEN];
    static ngx_str_t  key = ngx_string("Retry-After");

    return ngx_llmgw_out_header(r, &key, v,
                                ngx_sprintf(v, "%ui", seconds) - v);
}


/* NGX_OK with the channels llmgw_route() found, or NGX_DECLINED and why
   in v (when llmgw_route() did not say why). */
static ngx_int_t
ngx_llmgw_route(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx,
    size_t incompatible, llmgw_verdict_t *v)
{
    char  shown[LLMGW_SHOWN_SIZE];

    if (ctx->nchannels > 0) {
        return NGX_OK;
    }

    /* served, but no channel's format can carry this request */
    if (v->status != 0) {
        return NGX_DECLINED;
    }

    llmgw_shown((char *) ctx->model.data, ctx->model.len, shown);

    if (incompatible > 0) {
        llmgw_verdict_set(v, NGX_HTTP_INTERNAL_SERVER_ERROR, "gateway_error",
                          "convert_request_failed", "model %s is not "
                          "available through %.*s", shown,
                          (int) ngx_min(r->uri.len, 128), r->uri.data);
    } else {
        llmgw_verdict_set(v, NGX_HTTP_SERVICE_UNAVAILABLE, "gateway_error",
                          "model_not_found", "no available channel for "
                          "model %s in group %.*s", shown,
                          (int) ctx->group.len, ctx->group.data);
    }

    return NGX_DECLINED;
}


static ngx_int_t
ngx_llmgw_models(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx)
{
    ngx_int_t    rc;
    llmgw_buf_t  list;

    list = llmgw_models_json(ctx->snapshot,
        (llmgw_str_t) { (char *) ctx->group.data, ctx->group.len },
        ctx->token);

    if (list.data == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    rc = ngx_llmgw_send_json(r, NGX_HTTP_OK, (u_char *) list.data, list.len);
    llmgw_buf_free(&list);

    return rc;
}


/* A model is served only with a price; "free" is a price of zero. */
static ngx_int_t
ngx_llmgw_price(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx,
    llmgw_verdict_t *v)
{
    char  shown[LLMGW_SHOWN_SIZE];

    if (llmgw_snapshot_price(ctx->snapshot,
            (llmgw_str_t) { (char *) ctx->model.data, ctx->model.len },
            &ctx->price)
        == 0)
    {
        ctx->model_priced = 1;
        return NGX_OK;
    }

    llmgw_verdict_set(v, NGX_HTTP_BAD_REQUEST, "gateway_error",
                      "model_price_error", "model %s has no price; an "
                      "administrator sets one with PUT /api/pricing (a "
                      "ratio or price of 0 makes it free)",
                      llmgw_shown((char *) ctx->model.data, ctx->model.len,
                                  shown));

    return NGX_DECLINED;
}


/*
 * The reservation: the prompt estimate plus max_tokens (or, when the
 * client set none, llmgw_reserve_tokens, or what a conversion for one of
 * the channels sends when more) for each answer asked for, priced like
 * the answer.  A rerank's max_tokens is 0: it is never billed for output.
 */
static ngx_int_t
ngx_llmgw_reserve(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx,
    llmgw_verdict_t *v)
{
    int64_t                max;
    ngx_uint_t             i;
    llmgw_usage_t          est;
    ngx_llmgw_loc_conf_t  *lcf;

    lcf = ngx_http_get_module_loc_conf(r, ngx_http_llmgw_module);

    ngx_memzero(&est, sizeof(est));

    max = llmgw_req_max_tokens(ctx->req);

    if (max < 0) {
        max = (int64_t) lcf->reserve_tokens;    /* at most 10,000,000 */

        /* a channel that will be sent a limit of the gateway's own */
        for (i = 0; i < ctx->nchannels; i++) {
            if (ctx->endpoint.ep == LLMGW_EP_CHAT
                && ctx->channels[i]->type == 14)
            {
                max = ngx_max(max, LLMGW_CONVERTED_MAX_TOKENS);
            }
        }
    }

    est.prompt_tokens = llmgw_req_prompt_estimate(ctx->req);
    est.completion_tokens = max * llmgw_req_choices(ctx->req);

    return ngx_llmgw_billing_reserve(ctx,
               llmgw_quota(&ctx->price, ctx->group_ratio, &est), v);
}


static ngx_int_t
ngx_llmgw_refuse(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx, int status,
    const char *type, const char *code, const char *message)
{
    llmgw_verdict_t  v;

    llmgw_verdict_set(&v, status, type, code, "%s", message);

    return ngx_llmgw_send_error(r, ctx, &v);
}


static ngx_table_elt_t *
ngx_llmgw_header(ngx_http_request_t *r, const char *name, size_t len)
{
    ngx_uint_t        i;
    ngx_list_part_t  *part;
    ngx_table_elt_t  *h;

    part = &r->headers_in.headers.part;
    h = part->elts;

    for (i = 0; /* void */; i++) {

        if (i >= part->nelts) {
            if (part->next == NULL) {
                return NULL;
            }
            part = part->next;
            h = part->elts;
            i = 0;
        }

        if (h[i].key.len == len
            && ngx_strncasecmp(h[i].key.data, (u_char *) name, len) == 0)
        {
            return &h[i];
        }
    }
}


/*
 * A key sent as ?key= (the Gemini SDKs send it so) is copied for the
 * lookup, then masked for the logs (ngx_llmgw_mask_query_key) with every
 * other key parameter (llmgw_query_key_mask).  A task route gets its query
 * as it came (a copy): it is the plugin's.
 */
static ngx_int_t
ngx_llmgw_take_query_key(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx)
{
    u_char                   *dst, *src;
    ngx_str_t                 v;
    ngx_pool_cleanup_t       *cln;
    ngx_llmgw_saved_query_t  *saved;

    ctx->query_key_taken = 1;

    /* taken before an internal redirect, which cleared the context: the
       query is masked by now, the copies are kept with the request */
    for (cln = r->main->pool->cleanup; cln; cln = cln->next) {
        if (cln->handler == ngx_llmgw_saved_query) {
            saved = cln->data;
            ctx->query_key = saved->key;
            ctx->args = saved->args;
            return NGX_OK;
        }
    }

    if (llmgw_query_key_count((char *) r->args.data, r->args.len) == 0) {
        return NGX_OK;
    }

    ctx->args.data = ngx_pstrdup(r->pool, &r->args);
    if (ctx->args.data == NULL) {
        return NGX_ERROR;
    }

    ctx->args.len = r->args.len;

    /* read as $arg_key reads it; "?%6Bey=" and "?a=1;key=" are masked
       as keys all the same, but not read */
    if (ngx_http_arg(r, (u_char *) "key", 3, &v) == NGX_OK) {
        ctx->query_key.data = ngx_pstrdup(r->pool, &v);
        if (ctx->query_key.data == NULL) {
            return NGX_ERROR;
        }

        /* the value as a URL parser reads it: %2D is the "-" it encodes */
        dst = ctx->query_key.data;
        src = ctx->query_key.data;
        ngx_unescape_uri(&dst, &src, v.len, 0);
        ctx->query_key.len = dst - ctx->query_key.data;
    }

    cln = ngx_pool_cleanup_add(r->main->pool, sizeof(ngx_llmgw_saved_query_t));
    if (cln == NULL) {
        return NGX_ERROR;
    }

    cln->handler = ngx_llmgw_saved_query;
    saved = cln->data;
    saved->key = ctx->query_key;
    saved->args = ctx->args;

    ngx_llmgw_mask_query_key(r);

    return NGX_OK;
}


/*
 * A key=... of the query, masked where nginx keeps the request for the
 * logs: $args, $request_uri, and $request, which error-log lines repeat
 * as "request:".  Over HTTP/1 the three point into one client buffer (a
 * long request line is moved to a large header buffer before they are
 * set); HTTP/2 builds $request as a copy.  A request nginx refused while
 * reading its head may have no URI yet: its line (cut short for a 414) is
 * what $request shows, made from the client buffer as $request makes it.
 */
void
ngx_llmgw_mask_query_key(ngx_http_request_t *r)
{
    u_char  *p, *q, *end, *copy;

    if (r->request_line.data == NULL && r->request_start != NULL
        && r->header_in != NULL)
    {
        for (p = r->request_start; p < r->header_in->last; p++) {
            if (*p == CR || *p == LF) {
                break;
            }
        }

        r->request_line.data = r->request_start;
        r->request_line.len = p - r->request_start;
    }

    if (r->unparsed_uri.len > 0) {
        /* found before the URI is masked: the same bytes, or a copy */
        copy = r->request_line.len == 0
               ? NULL
               : memmem(r->request_line.data, r->request_line.len,
                        r->unparsed_uri.data, r->unparsed_uri.len);

        ngx_llmgw_mask_uri_key(r->unparsed_uri.data, r->unparsed_uri.len);

        if (copy != NULL) {
            ngx_llmgw_mask_uri_key(copy, r->unparsed_uri.len);
        }

    } else if (r->request_line.len > 0) {
        end = r->request_line.data + r->request_line.len;
        q = ngx_strlchr(r->request_line.data, end, '?');

        if (q != NULL) {
            p = ngx_strlchr(q, end, ' ');
            ngx_llmgw_mask_uri_key(q, (p ? p : end) - q);
        }
    }

    (void) llmgw_query_key_mask((char *) r->args.data, r->args.len);
}


/* Marks the copies of a masked query in the request's pool cleanups. */
static void
ngx_llmgw_saved_query(void *data)
{
    (void) data;
}


/*
 * The key is masked as soon as the request line is read, in every server
 * with llmgw locations: nginx refuses some requests before any location
 * is chosen (a Content-Length over client_max_body_size), and logs them
 * with their request line.
 */
ngx_int_t
ngx_llmgw_post_read(ngx_http_request_t *r)
{
    ngx_llmgw_ctx_t       *ctx;
    ngx_llmgw_loc_conf_t  *slcf;

    if (r != r->main || r->args.len < 4) {
        return NGX_DECLINED;
    }

    /* the server's own configuration: its location is not chosen yet */
    slcf = ngx_http_get_module_loc_conf(r, ngx_http_llmgw_module);

    if (!slcf->server_errors
        || llmgw_query_key_count((char *) r->args.data, r->args.len) == 0)
    {
        return NGX_DECLINED;
    }

    ctx = ngx_llmgw_get_ctx(r);

    if (ctx == NULL || ngx_llmgw_take_query_key(r, ctx) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    return NGX_DECLINED;
}


static void
ngx_llmgw_mask_uri_key(u_char *uri, size_t len)
{
    u_char  *q;

    q = ngx_strlchr(uri, uri + len, '?');

    if (q != NULL) {
        (void) llmgw_query_key_mask((char *) q + 1, uri + len - q - 1);
    }
}


static ngx_int_t
ngx_llmgw_find_key(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx,
    ngx_str_t *key)
{
    ngx_str_t         v;
    ngx_table_elt_t  *h;

    h = r->headers_in.authorization;

    if (h != NULL) {
        v = h->value;

        if (v.len > 7 && ngx_strncasecmp(v.data, (u_char *) "Bearer ", 7)
                         == 0)
        {
            v.data += 7;
            v.len -= 7;

            while (v.len && v.data[0] == ' ') {
                v.data++;
                v.len--;
            }

            *key = v;
            return v.len ? NGX_OK : NGX_DECLINED;
        }
    }

    if (ctx->endpoint.ep == LLMGW_EP_MESSAGES) {
        h = ngx_llmgw_header(r, "x-api-key", sizeof("x-api-key") - 1);
        if (h != NULL && h->value.len) {
            *key = h->value;
            return NGX_OK;
        }
    }

    if (ctx->endpoint.ep == LLMGW_EP_GEMINI) {
        h = ngx_llmgw_header(r, "x-goog-api-key",
                             sizeof("x-goog-api-key") - 1);
        if (h != NULL && h->value.len) {
            *key = h->value;
            return NGX_OK;
        }

        if (ctx->query_key.len) {
            *key = ctx->query_key;
            return NGX_OK;
        }
    }

    return NGX_DECLINED;
}


/* A 2xx, unless its answer failed under that head (a stream without
   text: the upstream's error came first, or not one event came; a JSON
   answer ended by the upstream's closing that is none). */
ngx_uint_t
ngx_llmgw_succeeded(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx)
{
    ngx_uint_t  status;

    status = r->headers_out.status;

    if (status < 200 || status >= 300) {
        return 0;
    }

    return ctx->resp == NULL
           || !llmgw_resp_failed(ctx->resp, ctx->end_status
                                        == NGX_HTTP_CLIENT_CLOSED_REQUEST);
}


/*
 * Settlement, the ledger row, metrics and the rate limiter's success log,
 * once per request: as soon as the answer is decided (before its last byte
 * leaves), else in the log phase.
 */
void
ngx_llmgw_gateway_log(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx)
{
    if (ctx->logged) {
        return;
    }

    ctx->logged = 1;

    if (ctx->token != NULL) {
        ngx_llmgw_rl_done(ctx, ngx_llmgw_succeeded(r, ctx));
    }

    ngx_llmgw_metrics_record(r, ctx);

    if (ctx->endpoint.ep == LLMGW_EP_TASK) {
        /* tasks are charged in the database with their task rows */
        ngx_llmgw_billing_release(ctx);
        return;
    }

    if (ctx->token != NULL) {
        ngx_llmgw_ledger_record(r, ctx);
    }
}
