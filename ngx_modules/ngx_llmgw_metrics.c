/*
 * Prometheus metrics of the node, kept in the shared zone: requests by
 * endpoint, model and status, an upstream latency histogram, retries and
 * rate-limited requests.  The series count is capped so that unknown model
 * names cannot grow the zone without bound.
 */

#include "ngx_llmgw.h"


#define NGX_LLMGW_METRICS_MAX_SERIES  4096
#define NGX_LLMGW_LABEL_MAX           128


typedef struct {
    u_char                     color;
    u_char                     endpoint;
    u_short                    status;
    ngx_atomic_t               count;
    u_short                    len;
    u_char                     model[1];
} ngx_llmgw_series_t;


static const char *ngx_llmgw_ep_names[] = {
    "other", "chat", "messages", "gemini", "rerank", "models", "invalid_url",
    "task"
};

/* upper bounds of the latency buckets, in milliseconds */
static const ngx_msec_t  ngx_llmgw_buckets[NGX_LLMGW_LATENCY_BUCKETS] = {
    5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000
};


void
ngx_llmgw_metrics_retry(void)
{
    ngx_llmgw_shm_ctx_t  *ctx = ngx_llmgw_shm();

    if (ctx) {
        (void) ngx_atomic_fetch_add(&ctx->sh->retries, 1);
    }
}


void
ngx_llmgw_metrics_rate_limited(void)
{
    ngx_llmgw_shm_ctx_t  *ctx = ngx_llmgw_shm();

    if (ctx) {
        (void) ngx_atomic_fetch_add(&ctx->sh->rate_limited, 1);
    }
}


/* A request that waited for ledger room (and whether it was refused). */
void
ngx_llmgw_metrics_ledger_wait(ngx_uint_t refused)
{
    ngx_llmgw_shm_ctx_t  *ctx = ngx_llmgw_shm();

    if (ctx) {
        (void) ngx_atomic_fetch_add(refused ? &ctx->sh->ledger_refused
                                            : &ctx->sh->ledger_waits, 1);
    }
}


typedef struct {
    ngx_uint_t                 ep;
    ngx_uint_t                 status;
    ngx_str_t                 *model;
} ngx_llmgw_series_want_t;


static ngx_int_t
ngx_llmgw_series_match(ngx_rbtree_node_t *node, const void *data)
{
    const ngx_llmgw_series_want_t  *w = data;
    ngx_llmgw_series_t             *s;

    s = (ngx_llmgw_series_t *) &node->color;

    return s->endpoint == w->ep && s->status == w->status
           && s->len == w->model->len
           && ngx_memcmp(s->model, w->model->data, w->model->len) == 0;
}


static ngx_llmgw_series_t *
ngx_llmgw_series(ngx_llmgw_shm_ctx_t *ctx, ngx_uint_t ep, ngx_str_t *model,
    ngx_uint_t status)
{
    uint32_t                  hash;
    ngx_rbtree_node_t        *node;
    ngx_llmgw_series_t       *s;
    ngx_llmgw_series_want_t   want;

    hash = ngx_crc32_short(model->data, model->len) ^ (uint32_t) (ep << 24)
           ^ (uint32_t) status;

    want.ep = ep;
    want.status = status;
    want.model = model;

    node = ngx_llmgw_rbtree_find(&ctx->sh->m_tree, hash,
                                 ngx_llmgw_series_match, &want);
    if (node) {
        return (ngx_llmgw_series_t *) &node->color;
    }

    if (ctx->sh->m_count >= NGX_LLMGW_METRICS_MAX_SERIES) {
        return NULL;
    }

    node = ngx_slab_alloc_locked(ctx->shpool,
                                 offsetof(ngx_rbtree_node_t, color)
                                 + offsetof(ngx_llmgw_series_t, model)
                                 + model->len);
    if (node == NULL) {
        return NULL;
    }

    node->key = hash;
    s = (ngx_llmgw_series_t *) &node->color;
    s->endpoint = (u_char) ep;
    s->status = (u_short) status;
    s->count = 0;
    s->len = (u_short) model->len;
    ngx_memcpy(s->model, model->data, model->len);

    ngx_rbtree_insert(&ctx->sh->m_tree, node);
    ctx->sh->m_count++;

    return s;
}


/*
 * A model name as a label value: at most NGX_LLMGW_LABEL_MAX bytes, cut
 * between characters, each byte that is not valid UTF-8 a '?' (Prometheus
 * refuses a whole scrape over one invalid label, and a Gemini model comes
 * from a URL's decoded bytes).
 */
static size_t
ngx_llmgw_label_text(u_char *dst, u_char *src, size_t len)
{
    u_char    *p, *end, *d, *start;
    uint32_t   cp;

    p = src;
    end = src + len;
    d = dst;

    while (p < end) {
        start = p;

        if (*p < 0x80) {
            p++;
            cp = *start;

        } else {
            cp = ngx_utf8_decode(&p, end - p);

            if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
                if ((size_t) (d - dst) + 1 > NGX_LLMGW_LABEL_MAX) {
                    break;
                }
                *d++ = '?';
                p = start + 1;
                continue;
            }
        }

        if ((size_t) (d - dst) + (p - start) > NGX_LLMGW_LABEL_MAX) {
            break;
        }

        d = ngx_cpymem(d, start, p - start);
    }

    return d - dst;
}


void
ngx_llmgw_metrics_record(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx)
{
    ngx_uint_t            i, ep;
    ngx_str_t             model;
    u_char                label[NGX_LLMGW_LABEL_MAX];
    ngx_msec_t            ms;
    ngx_llmgw_shm_ctx_t  *shm;
    ngx_llmgw_series_t   *s;
    llmgw_price_t         price;

    shm = ngx_llmgw_shm();
    if (shm == NULL) {
        return;
    }

    ep = ctx->endpoint.ep;
    if (ep >= sizeof(ngx_llmgw_ep_names) / sizeof(ngx_llmgw_ep_names[0])) {
        ep = 0;
    }

    model.data = label;
    model.len = 0;

    /* a priced model, not any name a client sends: series are capped */
    if (ctx->model.len > 0
        && (ctx->model_priced
            || (ctx->snapshot != NULL
                && llmgw_snapshot_price(ctx->snapshot,
                       (llmgw_str_t) { (char *) ctx->model.data,
                                       ctx->model.len }, &price) == 0)))
    {
        model.len = ngx_llmgw_label_text(label, ctx->model.data,
                                         ctx->model.len);
    }

    ngx_shmtx_lock(&shm->shpool->mutex);
    s = ngx_llmgw_series(shm, ep, &model, r->headers_out.status);
    ngx_shmtx_unlock(&shm->shpool->mutex);

    if (s) {
        (void) ngx_atomic_fetch_add(&s->count, 1);
    }

    if (ctx->tried == 0) {
        return;
    }

    ms = ngx_current_msec - ctx->upstream_start;

    for (i = 0; i < NGX_LLMGW_LATENCY_BUCKETS; i++) {
        if (ms <= ngx_llmgw_buckets[i]) {
            break;
        }
    }

    (void) ngx_atomic_fetch_add(&shm->sh->latency[i], 1);
    (void) ngx_atomic_fetch_add(&shm->sh->latency_count, 1);
    (void) ngx_atomic_fetch_add(&shm->sh->latency_sum_us, ms * 1000);
}


/* Label values are escaped as Prometheus asks: \\ \" \n. */
static u_char *
ngx_llmgw_label(u_char *p, u_char *s, size_t len)
{
    size_t  i;

    for (i = 0; i < len; i++) {
        switch (s[i]) {
        case '\\': *p++ = '\\'; *p++ = '\\'; break;
        case '"':  *p++ = '\\'; *p++ = '"'; break;
        case '\n': *p++ = '\\'; *p++ = 'n'; break;
        default:   *p++ = s[i];
        }
    }

    return p;
}


static void
ngx_llmgw_series_walk(ngx_rbtree_node_t *node, ngx_rbtree_node_t *sentinel,
    ngx_buf_t *b)
{
    ngx_llmgw_series_t  *s;

    if (node == sentinel) {
        return;
    }

    ngx_llmgw_series_walk(node->left, sentinel, b);

    s = (ngx_llmgw_series_t *) &node->color;

    if ((size_t) (b->end - b->last) > 2 * NGX_LLMGW_LABEL_MAX + 128) {
        b->last = ngx_sprintf(b->last,
                              "llmgw_requests_total{endpoint=\"%s\",model=\"",
                              ngx_llmgw_ep_names[s->endpoint]);
        b->last = ngx_llmgw_label(b->last, s->model, s->len);
        b->last = ngx_sprintf(b->last, "\",status=\"%ui\"} %uA\n",
                              (ngx_uint_t) s->status, s->count);
    }

    ngx_llmgw_series_walk(node->right, sentinel, b);
}


ngx_int_t
ngx_llmgw_metrics_handler(ngx_http_request_t *r)
{
    size_t                size;
    ngx_uint_t            i;
    ngx_atomic_uint_t     cum;
    ngx_int_t             rc;
    ngx_buf_t            *b;
    ngx_chain_t           out;
    ngx_llmgw_shm_ctx_t  *shm;

    if (!(r->method & (NGX_HTTP_GET|NGX_HTTP_HEAD))) {
        return ngx_llmgw_allow_header(r, "(allowed: GET, HEAD)") == NGX_OK
               ? NGX_HTTP_NOT_ALLOWED : NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (ngx_http_discard_request_body(r) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    shm = ngx_llmgw_shm();
    if (shm == NULL) {
        return NGX_HTTP_SERVICE_UNAVAILABLE;
    }

    /* sized under the mutex: series added meanwhile would not fit */
    ngx_shmtx_lock(&shm->shpool->mutex);

    size = 4096 + shm->sh->m_count * (2 * NGX_LLMGW_LABEL_MAX + 128);

    b = ngx_create_temp_buf(r->pool, size);
    if (b == NULL) {
        ngx_shmtx_unlock(&shm->shpool->mutex);
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    b->last = ngx_cpymem(b->last,
        "# HELP llmgw_requests_total Requests by endpoint, model and status.\n"
        "# TYPE llmgw_requests_total counter\n",
        sizeof("# HELP llmgw_requests_total Requests by endpoint, model and "
               "status.\n# TYPE llmgw_requests_total counter\n") - 1);

    ngx_llmgw_series_walk(shm->sh->m_tree.root, shm->sh->m_tree.sentinel, b);
    ngx_shmtx_unlock(&shm->shpool->mutex);

    b->last = ngx_sprintf(b->last,
        "# HELP llmgw_upstream_latency_seconds Time to the end of the "
        "upstream answer.\n"
        "# TYPE llmgw_upstream_latency_seconds histogram\n");

    cum = 0;

    for (i = 0; i < NGX_LLMGW_LATENCY_BUCKETS; i++) {
        cum += shm->sh->latency[i];
        b->last = ngx_sprintf(b->last,
                              "llmgw_upstream_latency_seconds_bucket"
                              "{le=\"%.3f\"} %uA\n",
                              (double) ngx_llmgw_buckets[i] / 1000, cum);
    }

    cum += shm->sh->latency[NGX_LLMGW_LATENCY_BUCKETS];

    b->last = ngx_sprintf(b->last,
        "llmgw_upstream_latency_seconds_bucket{le=\"+Inf\"} %uA\n"
        "llmgw_upstream_latency_seconds_sum %.6f\n"
        "llmgw_upstream_latency_seconds_count %uA\n"
        "# HELP llmgw_retries_total Tries on another channel.\n"
        "# TYPE llmgw_retries_total counter\n"
        "llmgw_retries_total %uA\n"
        "# HELP llmgw_rate_limited_total Requests refused by the rate "
        "limit.\n"
        "# TYPE llmgw_rate_limited_total counter\n"
        "llmgw_rate_limited_total %uA\n"
        "# HELP llmgw_ledger_rows Ledger rows not yet written to the "
        "database.\n"
        "# TYPE llmgw_ledger_rows gauge\n"
        "llmgw_ledger_rows %ui\n"
        "# HELP llmgw_ledger_waits_total Requests that waited for ledger "
        "room.\n"
        "# TYPE llmgw_ledger_waits_total counter\n"
        "llmgw_ledger_waits_total %uA\n"
        "# HELP llmgw_ledger_refused_total Requests refused because the "
        "ledger had no room in time.\n"
        "# TYPE llmgw_ledger_refused_total counter\n"
        "llmgw_ledger_refused_total %uA\n",
        cum, (double) shm->sh->latency_sum_us / 1000000,
        shm->sh->latency_count, shm->sh->retries, shm->sh->rate_limited,
        shm->sh->ledger_held, shm->sh->ledger_waits, shm->sh->ledger_refused);

    b->last_buf = 1;
    b->last_in_chain = 1;

    r->headers_out.status = NGX_HTTP_OK;
    r->headers_out.content_length_n = b->last - b->pos;
    ngx_str_set(&r->headers_out.content_type,
                "text/plain; version=0.0.4; charset=utf-8");

    rc = ngx_http_send_header(r);

    if (rc == NGX_ERROR || rc > NGX_OK || r->header_only) {
        return rc;
    }

    out.buf = b;
    out.next = NULL;

    return ngx_http_output_filter(r, &out);
}
