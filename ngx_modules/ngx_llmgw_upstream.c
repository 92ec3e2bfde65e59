/*
 * Talking to channels through nginx's upstream machinery.
 *
 * nginx's own upstream code does connections, timeouts, TLS and the
 * decision to try again (proxy_next_upstream semantics); this file supplies
 * the balancer that walks the routed channels in order, builds each try's
 * request with that channel's URL and credentials, parses the response
 * head, and passes the body on unbuffered while usage is read from it.
 * Connections are kept alive per worker, keyed by address and TLS name.
 */

#include "ngx_llmgw.h"


typedef struct {
    ngx_queue_t                queue;
    ngx_connection_t          *connection;
    socklen_t                  socklen;
    ngx_sockaddr_t             sockaddr;
    ngx_uint_t                 tls;
    u_char                     host[256];
    size_t                     host_len;
} ngx_llmgw_ka_item_t;


/* A worker's resolved channel hosts, refreshed when their TTL ends. */
typedef struct {
    u_char                    *host;
    size_t                     host_len;
    ngx_sockaddr_t             sockaddr;
    socklen_t                  socklen;
    time_t                     expire;
    ngx_uint_t                 failed;
} ngx_llmgw_dns_t;


static ngx_int_t ngx_llmgw_resolve_next(ngx_http_request_t *r,
    ngx_llmgw_ctx_t *ctx);
static void ngx_llmgw_resolved(ngx_resolver_ctx_t *rctx);
static ngx_int_t ngx_llmgw_create_request(ngx_http_request_t *r);
static ngx_int_t ngx_llmgw_reinit_request(ngx_http_request_t *r);
static ngx_int_t ngx_llmgw_process_header(ngx_http_request_t *r);
static ngx_int_t ngx_llmgw_hold(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx);
static ngx_int_t ngx_llmgw_held(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx);
static ngx_uint_t ngx_llmgw_unreadable_coding(ngx_str_t *key,
    ngx_str_t *value, ngx_uint_t error_mode);
static ngx_int_t ngx_llmgw_bad_answer(ngx_http_request_t *r,
    ngx_llmgw_ctx_t *ctx);
static ngx_int_t ngx_llmgw_chain(ngx_http_request_t *r, u_char *p,
    size_t size, ngx_chain_t ***ll);
static ngx_int_t ngx_llmgw_keep(ngx_http_request_t *r, llmgw_buf_t *from,
    ngx_str_t *to);
static llmgw_buf_t ngx_llmgw_error_answer(ngx_llmgw_ctx_t *ctx);
static ngx_uint_t ngx_llmgw_gemini_array(ngx_http_request_t *r,
    ngx_llmgw_ctx_t *ctx);
static ngx_int_t ngx_llmgw_new_resp(ngx_http_request_t *r,
    ngx_llmgw_ctx_t *ctx);
static ngx_int_t ngx_llmgw_sniff(ngx_llmgw_ctx_t *ctx, u_char *p, size_t n);
static ngx_int_t ngx_llmgw_stream_after_all(ngx_http_request_t *r,
    ngx_llmgw_ctx_t *ctx);
static ngx_int_t ngx_llmgw_hold_feed(ngx_http_request_t *r,
    ngx_llmgw_ctx_t *ctx, u_char *p, size_t n);
static ngx_int_t ngx_llmgw_emit(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx,
    u_char *pos, size_t size, ngx_chain_t ***ll);
static void ngx_llmgw_abort_request(ngx_http_request_t *r);
static void ngx_llmgw_finalize_request(ngx_http_request_t *r, ngx_int_t rc);
static ngx_int_t ngx_llmgw_filter_init(void *data);
static ngx_int_t ngx_llmgw_answer_out(ngx_http_request_t *r,
    ngx_llmgw_ctx_t *ctx);
static ngx_int_t ngx_llmgw_filter(void *data, ssize_t bytes);
static ngx_int_t ngx_llmgw_peer_init(ngx_http_request_t *r,
    ngx_http_upstream_srv_conf_t *us);
static ngx_int_t ngx_llmgw_peer_get(ngx_peer_connection_t *pc, void *data);
static void ngx_llmgw_peer_free(ngx_peer_connection_t *pc, void *data,
    ngx_uint_t state);
static ngx_int_t ngx_llmgw_build_request(ngx_http_request_t *r,
    ngx_llmgw_ctx_t *ctx, const llmgw_channel_t *ch);
static void ngx_llmgw_ka_close_handler(ngx_event_t *ev);
static void ngx_llmgw_ka_dummy_handler(ngx_event_t *ev);
static void ngx_llmgw_ka_close(ngx_connection_t *c);


static ngx_str_t  ngx_llmgw_hide_headers[] = {
    ngx_string("Date"),
    ngx_string("Server"),
    ngx_string("X-Pad"),
    ngx_string("X-Accel-Expires"),
    ngx_string("X-Accel-Redirect"),
    ngx_string("X-Accel-Limit-Rate"),
    ngx_string("X-Accel-Buffering"),
    ngx_string("X-Accel-Charset"),
    ngx_string("Set-Cookie"),
    ngx_string("X-Request-Id"),
    /* the operator's upstream account, and its challenge: not the client's */
    ngx_string("OpenAI-Organization"),
    ngx_string("OpenAI-Project"),
    ngx_string("Anthropic-Organization-Id"),
    ngx_string("WWW-Authenticate"),
    ngx_null_string
};


static ngx_array_t  *ngx_llmgw_dns;
static ngx_queue_t   ngx_llmgw_ka_cache;
static ngx_queue_t   ngx_llmgw_ka_free;
static ngx_msec_t    ngx_llmgw_ka_timeout;


void
ngx_llmgw_keepalive_init_process(ngx_cycle_t *cycle,
    ngx_llmgw_main_conf_t *mcf)
{
    ngx_uint_t            i;
    ngx_llmgw_ka_item_t  *items;

    ngx_queue_init(&ngx_llmgw_ka_cache);
    ngx_queue_init(&ngx_llmgw_ka_free);

    ngx_llmgw_dns = ngx_array_create(cycle->pool, 16,
                                     sizeof(ngx_llmgw_dns_t));
    ngx_llmgw_ka_timeout = mcf->keepalive_timeout;

    if (mcf->keepalive == 0) {
        return;
    }

    items = ngx_calloc(mcf->keepalive * sizeof(ngx_llmgw_ka_item_t),
                       cycle->log);
    if (items == NULL) {
        return;
    }

    for (i = 0; i < mcf->keepalive; i++) {
        ngx_queue_insert_head(&ngx_llmgw_ka_free, &items[i].queue);
    }
}


char *
ngx_llmgw_upstream_merge(ngx_conf_t *cf, ngx_llmgw_loc_conf_t *prev,
    ngx_llmgw_loc_conf_t *conf)
{
    ngx_hash_init_t                hash;
    ngx_pool_cleanup_t            *cln;
    ngx_http_upstream_conf_t      *u;
    ngx_http_upstream_srv_conf_t  *us;

    u = &conf->upstream;

    hash.max_size = 512;
    hash.bucket_size = 64;
    hash.name = "llmgw_hide_headers_hash";

    if (ngx_http_upstream_hide_headers_hash(cf, u, &prev->upstream,
                                            ngx_llmgw_hide_headers, &hash)
        != NGX_OK)
    {
        return NGX_CONF_ERROR;
    }

    if (conf->role != NGX_LLMGW_ROLE_GATEWAY) {
        return NGX_CONF_OK;
    }

    /* streams go to the client as they come: never buffered */
    u->buffering = 0;
    u->request_buffering = 1;
    u->ignore_client_abort = 0;
    u->intercept_errors = 0;
    u->pass_request_headers = 0;
    u->pass_request_body = 0;
    u->limit_rate = 0;
    u->next_upstream_tries = 0;
    u->next_upstream_timeout = 0;
    u->next_upstream = NGX_HTTP_UPSTREAM_FT_ERROR
                       | NGX_HTTP_UPSTREAM_FT_TIMEOUT
                       | NGX_HTTP_UPSTREAM_FT_INVALID_HEADER
                       | NGX_HTTP_UPSTREAM_FT_HTTP_500
                       | NGX_HTTP_UPSTREAM_FT_HTTP_502
                       | NGX_HTTP_UPSTREAM_FT_HTTP_503
                       | NGX_HTTP_UPSTREAM_FT_HTTP_429
                       | NGX_HTTP_UPSTREAM_FT_NON_IDEMPOTENT;

    us = ngx_pcalloc(cf->pool, sizeof(ngx_http_upstream_srv_conf_t));
    if (us == NULL) {
        return NGX_CONF_ERROR;
    }

    us->peer.init = ngx_llmgw_peer_init;
    ngx_str_set(&us->host, "llmgw");
    u->upstream = us;

    u->ssl = ngx_pcalloc(cf->pool, sizeof(ngx_ssl_t));
    if (u->ssl == NULL) {
        return NGX_CONF_ERROR;
    }

    u->ssl->log = cf->log;

    if (ngx_ssl_create(u->ssl, NGX_SSL_TLSv1_2|NGX_SSL_TLSv1_3, NULL)
        != NGX_OK)
    {
        return NGX_CONF_ERROR;
    }

    cln = ngx_pool_cleanup_add(cf->pool, 0);
    if (cln == NULL) {
        ngx_ssl_cleanup_ctx(u->ssl);
        return NGX_CONF_ERROR;
    }

    cln->handler = ngx_ssl_cleanup_ctx;
    cln->data = u->ssl;

    u->ssl_server_name = 1;
    u->ssl_session_reuse = 0;
    u->ssl_verify = conf->ssl_verify;

    if (conf->ssl_verify) {
        /* a bundle set by the directive was checked there: this one is
         * the default, which no directive line names */
        if (ngx_ssl_trusted_certificate(cf, u->ssl,
                                        &conf->ssl_trusted_certificate,
                                        conf->ssl_verify_depth)
            != NGX_OK)
        {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "\"llmgw_ssl_verify\" is on and the CA "
                               "bundle \"%V\" cannot be loaded: set "
                               "\"llmgw_ssl_trusted_certificate\"",
                               &conf->ssl_trusted_certificate);
            return NGX_CONF_ERROR;
        }
    }

    return NGX_CONF_OK;
}


ngx_int_t
ngx_llmgw_upstream_start(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx)
{
    ngx_http_upstream_t   *u;
    ngx_llmgw_loc_conf_t  *lcf;

    lcf = ngx_http_get_module_loc_conf(r, ngx_http_llmgw_module);

    if (ngx_http_upstream_create(r) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    u = r->upstream;

    ngx_str_set(&u->schema, "http://");
    u->output.tag = (ngx_buf_tag_t) &ngx_http_llmgw_module;
    u->conf = &lcf->upstream;

    u->create_request = ngx_llmgw_create_request;
    u->reinit_request = ngx_llmgw_reinit_request;
    u->process_header = ngx_llmgw_process_header;
    u->abort_request = ngx_llmgw_abort_request;
    u->finalize_request = ngx_llmgw_finalize_request;
    u->input_filter_init = ngx_llmgw_filter_init;
    u->input_filter = ngx_llmgw_filter;
    u->input_filter_ctx = r;

    ctx->upstream_start = ngx_current_msec;
    r->state = 0;

    return ngx_llmgw_resolve_next(r, ctx);
}


static ngx_uint_t
ngx_llmgw_is_literal(const char *host)
{
    u_char  buf[sizeof(struct in6_addr)];

    return ngx_strcasecmp((u_char *) host, (u_char *) "localhost") == 0
           || inet_pton(AF_INET, host, buf) == 1
           || inet_pton(AF_INET6, host, buf) == 1;
}


static ngx_llmgw_dns_t *
ngx_llmgw_dns_find(const char *host)
{
    size_t            len;
    ngx_uint_t        i;
    ngx_llmgw_dns_t  *d;

    if (ngx_llmgw_dns == NULL) {
        return NULL;
    }

    len = ngx_strlen(host);
    d = ngx_llmgw_dns->elts;

    for (i = 0; i < ngx_llmgw_dns->nelts; i++) {
        if (d[i].host_len == len
            && ngx_strncasecmp(d[i].host, (u_char *) host, len) == 0)
        {
            return &d[i];
        }
    }

    return NULL;
}


/* A new entry for host, or NULL when out of memory (nothing is added). */
static ngx_llmgw_dns_t *
ngx_llmgw_dns_add(const char *host)
{
    size_t            len;
    u_char           *copy;
    ngx_llmgw_dns_t  *d;

    len = ngx_strlen(host);

    copy = ngx_alloc(len, ngx_cycle->log);
    if (copy == NULL) {
        return NULL;
    }

    d = ngx_array_push(ngx_llmgw_dns);
    if (d == NULL) {
        ngx_free(copy);
        return NULL;
    }

    ngx_memzero(d, sizeof(ngx_llmgw_dns_t));
    ngx_memcpy(copy, host, len);
    d->host = copy;
    d->host_len = len;

    return d;
}


/*
 * Host names of the routed channels are resolved with nginx's resolver
 * before the first try, so that no try waits on DNS and none blocks.
 */
static ngx_int_t
ngx_llmgw_resolve_next(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx)
{
    ngx_uint_t                 i;
    ngx_llmgw_dns_t           *d;
    ngx_resolver_ctx_t        *rctx;
    const llmgw_channel_t     *ch;
    ngx_http_core_loc_conf_t  *clcf;

    for (i = 0; i < ctx->nchannels; i++) {
        ch = ctx->channels[i];

        if (ngx_llmgw_is_literal(ch->host)) {
            continue;
        }

        d = ngx_llmgw_dns_find(ch->host);

        if (d && d->expire > ngx_time()) {
            continue;
        }

        clcf = ngx_http_get_module_loc_conf(r, ngx_http_core_module);

        rctx = ngx_resolve_start(clcf->resolver, NULL);

        if (rctx == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        if (rctx == NGX_NO_RESOLVER) {
            ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                          "llmgw: channel %L host \"%s\" needs a "
                          "\"resolver\" directive", ch->id, ch->host);
            if (d == NULL) {
                d = ngx_llmgw_dns_add(ch->host);
                if (d == NULL) {
                    return NGX_HTTP_INTERNAL_SERVER_ERROR;
                }
            }
            d->failed = 1;
            d->expire = ngx_time() + 5;
            continue;
        }

        rctx->name.data = (u_char *) ch->host;
        rctx->name.len = ngx_strlen(ch->host);
        rctx->handler = ngx_llmgw_resolved;
        rctx->data = r;
        rctx->timeout = clcf->resolver_timeout;

        ctx->waiting = 1;

        if (ngx_resolve_name(rctx) != NGX_OK) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        return NGX_OK;
    }

    ctx->waiting = 0;

    ngx_http_upstream_init(r);

    return NGX_OK;
}


static void
ngx_llmgw_resolved(ngx_resolver_ctx_t *rctx)
{
    ngx_http_request_t *r = rctx->data;

    ngx_int_t          rc;
    ngx_llmgw_dns_t   *d;
    ngx_connection_t  *c;
    ngx_llmgw_ctx_t   *ctx;

    c = r->connection;
    ctx = ngx_llmgw_get_ctx(r);

    /*
     * Kept under the channel's own spelling: the resolver shortens
     * rctx->name by a trailing dot, and a lookup by the channel's host must
     * find what was resolved for it (else it resolves again, for ever).
     */
    d = ngx_llmgw_dns_find((char *) rctx->name.data);

    if (d == NULL) {
        d = ngx_llmgw_dns_add((char *) rctx->name.data);
        if (d == NULL) {
            ngx_resolve_name_done(rctx);
            goto failed;
        }
    }

    if (rctx->state || rctx->naddrs == 0) {
        ngx_log_error(NGX_LOG_ERR, c->log, 0,
                      "llmgw: \"%V\" could not be resolved (%i: %s)",
                      &rctx->name, rctx->state,
                      ngx_resolver_strerror(rctx->state));
        d->failed = 1;
        d->expire = ngx_time() + 5;

    } else {
        d->failed = 0;
        d->socklen = rctx->addrs[0].socklen;
        ngx_memcpy(&d->sockaddr, rctx->addrs[0].sockaddr, d->socklen);
        d->expire = ngx_max(rctx->valid, ngx_time() + 1);
    }

    ngx_resolve_name_done(rctx);

    if (ctx == NULL) {
        goto failed;
    }

    rc = ngx_llmgw_resolve_next(r, ctx);

    if (rc != NGX_OK) {
        ngx_http_finalize_request(r, rc);
    }

    ngx_http_run_posted_requests(c);
    return;

failed:

    ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
    ngx_http_run_posted_requests(c);
}


static ngx_int_t
ngx_llmgw_peer_init(ngx_http_request_t *r, ngx_http_upstream_srv_conf_t *us)
{
    ngx_llmgw_ctx_t  *ctx;

    ctx = ngx_llmgw_get_ctx(r);
    if (ctx == NULL) {
        return NGX_ERROR;
    }

    r->upstream->peer.get = ngx_llmgw_peer_get;
    r->upstream->peer.free = ngx_llmgw_peer_free;
    r->upstream->peer.data = ctx;
    r->upstream->peer.tries = ctx->nchannels;
    ctx->tries_left = ctx->nchannels;

    return NGX_OK;
}


/* Address of a channel: IP literals and "localhost" need no resolver. */
static ngx_int_t
ngx_llmgw_channel_addr(ngx_http_request_t *r, const llmgw_channel_t *ch,
    ngx_addr_t *addr)
{
    size_t            len;
    ngx_int_t         rc;
    ngx_str_t         host;
    ngx_llmgw_dns_t  *d;

    host.data = (u_char *) ch->host;
    host.len = ngx_strlen(ch->host);

    if (host.len == sizeof("localhost") - 1
        && ngx_strncasecmp(host.data, (u_char *) "localhost", host.len) == 0)
    {
        ngx_str_set(&host, "127.0.0.1");
    }

    len = host.len;
    rc = ngx_parse_addr(r->pool, addr, host.data, len);

    if (rc != NGX_OK) {
        d = ngx_llmgw_dns_find(ch->host);

        if (d == NULL || d->failed) {
            return NGX_DECLINED;
        }

        addr->sockaddr = ngx_palloc(r->pool, d->socklen);
        if (addr->sockaddr == NULL) {
            return NGX_ERROR;
        }

        ngx_memcpy(addr->sockaddr, &d->sockaddr, d->socklen);
        addr->socklen = d->socklen;
    }

    ngx_inet_set_port(addr->sockaddr, ch->port);

    return NGX_OK;
}


static ngx_int_t
ngx_llmgw_peer_get(ngx_peer_connection_t *pc, void *data)
{
    ngx_llmgw_ctx_t *ctx = data;

    size_t                  len;
    u_char                 *p;
    ngx_addr_t              addr;
    ngx_queue_t            *q;
    ngx_connection_t       *c;
    ngx_http_request_t     *r;
    ngx_http_upstream_t    *u;
    ngx_uint_t              fresh;
    ngx_llmgw_ka_item_t    *item;
    const llmgw_channel_t  *ch;

    r = ctx->request;
    u = r->upstream;
    fresh = 0;

    /*
     * Not a kept-alive connection unless one is found below: nginx adds a
     * try whenever a connection marked cached fails, so a mark left from
     * an earlier try would retry for ever.
     */
    pc->cached = 0;
    pc->connection = NULL;

    /* an earlier try's head is not the answer any more: should this try
       fail here, nginx's own error is put in the contract */
    ctx->upstream_header = 0;

    /*
     * nginx adds a try when a kept-alive connection failed (the channel may
     * simply have closed it): that try goes to the same channel, afresh.
     */
    if (pc->tries > ctx->tries_left && ctx->current >= 0) {
        ctx->retry_same = 1;
        ctx->tries_left = pc->tries;
    }

    for ( ;; ) {
        /*
         * A kept-alive connection the channel had closed is not the
         * channel's failure: the same channel is tried on a new one.
         */
        if (ctx->retry_same && ctx->current >= 0) {
            ctx->retry_same = 0;
            ch = ctx->channels[ctx->current];
            fresh = 1;
            break;
        }

        /* ctx->current always names a channel once one was tried */
        if ((ngx_uint_t) (ctx->current + 1) >= ctx->nchannels) {
            return NGX_BUSY;
        }

        ctx->current++;
        ch = ctx->channels[ctx->current];

        if (ctx->tried > 0) {
            ngx_llmgw_metrics_retry();
        }

        ctx->tried_ids[ctx->tried++] = ch->id;

        if (ngx_llmgw_channel_addr(r, ch, &addr) == NGX_OK) {
            break;
        }

        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "llmgw: channel %L host \"%s\" has no address",
                      ch->id, ch->host);

        ch = NULL;

        if (pc->tries > 1) {
            pc->tries--;
            continue;
        }

        return NGX_BUSY;
    }

    if (fresh && ngx_llmgw_channel_addr(r, ch, &addr) != NGX_OK) {
        return NGX_BUSY;
    }

    pc->sockaddr = addr.sockaddr;
    pc->socklen = addr.socklen;

    len = ngx_strlen(ch->host_header);
    p = ngx_pnalloc(r->pool, len);
    if (p == NULL) {
        return NGX_ERROR;
    }

    ngx_memcpy(p, ch->host_header, len);
    pc->name = ngx_palloc(r->pool, sizeof(ngx_str_t));
    if (pc->name == NULL) {
        return NGX_ERROR;
    }

    pc->name->data = p;
    pc->name->len = len;

#if (NGX_HTTP_SSL)
    u->ssl = ch->tls ? 1 : 0;
    u->ssl_name.data = (u_char *) ch->host;
    u->ssl_name.len = ngx_strlen(ch->host);
#endif

    /* a retry is worth a line; a first try is in the ledger row anyway */
    if (ctx->tried > 1) {
        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "llmgw: request %s try %ui on channel %L",
                      ctx->request_id, ctx->tried, ch->id);

    } else {
        ngx_log_debug2(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                       "llmgw: request %s first try on channel %L",
                       ctx->request_id, ch->id);
    }

    if (ngx_llmgw_build_request(r, ctx, ch) != NGX_OK) {
        return NGX_ERROR;
    }

    /* a kept-alive connection to the same address and TLS name */

    for (q = fresh ? ngx_queue_sentinel(&ngx_llmgw_ka_cache)
                   : ngx_queue_head(&ngx_llmgw_ka_cache);
         q != ngx_queue_sentinel(&ngx_llmgw_ka_cache);
         q = ngx_queue_next(q))
    {
        item = ngx_queue_data(q, ngx_llmgw_ka_item_t, queue);

        if (item->tls != (ngx_uint_t) ch->tls
            || ngx_memn2cmp((u_char *) &item->sockaddr,
                            (u_char *) pc->sockaddr, item->socklen,
                            pc->socklen) != 0
            || item->host_len != u->ssl_name.len
            || ngx_strncmp(item->host, u->ssl_name.data, item->host_len) != 0)
        {
            continue;
        }

        ngx_queue_remove(q);
        ngx_queue_insert_head(&ngx_llmgw_ka_free, q);

        c = item->connection;
        c->idle = 0;
        c->sent = 0;
        c->data = NULL;
        c->log = pc->log;
        c->read->log = pc->log;
        c->write->log = pc->log;
        c->pool->log = pc->log;

        if (c->read->timer_set) {
            ngx_del_timer(c->read);
        }

        pc->connection = c;
        pc->cached = 1;

        return NGX_DONE;
    }

    return NGX_OK;
}


static void
ngx_llmgw_peer_free(ngx_peer_connection_t *pc, void *data, ngx_uint_t state)
{
    ngx_llmgw_ctx_t *ctx = data;

    ngx_queue_t           *q;
    ngx_connection_t      *c;
    ngx_http_upstream_t   *u;
    ngx_llmgw_ka_item_t   *item;

    u = ctx->request->upstream;
    c = pc->connection;

    if (pc->tries) {
        pc->tries--;
    }

    /*
     * A timeout moves to the next channel only while none of the request
     * went out (connect, TLS handshake): after that the upstream may be
     * working on it, and the timeout is final (504).
     */
    if (c != NULL && (c->read->timedout || c->write->timedout)
        && u->request_sent)
    {
        pc->tries = 0;
    }

    ctx->tries_left = pc->tries;

    if (state & NGX_PEER_FAILED
        || c == NULL
        || c->read->eof
        || c->read->error
        || c->read->timedout
        || c->write->error
        || c->write->timedout
        || !u->keepalive
        || !u->request_body_sent
        || ngx_terminate
        || ngx_exiting
        || (ngx_queue_empty(&ngx_llmgw_ka_free)
            && ngx_queue_empty(&ngx_llmgw_ka_cache)))
    {
        return;
    }

    if (ngx_handle_read_event(c->read, 0) != NGX_OK) {
        return;
    }

    if (ngx_queue_empty(&ngx_llmgw_ka_free)) {
        q = ngx_queue_last(&ngx_llmgw_ka_cache);
        ngx_queue_remove(q);
        item = ngx_queue_data(q, ngx_llmgw_ka_item_t, queue);
        ngx_llmgw_ka_close(item->connection);

    } else {
        q = ngx_queue_head(&ngx_llmgw_ka_free);
        ngx_queue_remove(q);
        item = ngx_queue_data(q, ngx_llmgw_ka_item_t, queue);
    }

    ngx_queue_insert_head(&ngx_llmgw_ka_cache, q);

    item->connection = c;
    item->tls = u->ssl;
    item->host_len = ngx_min(u->ssl_name.len, sizeof(item->host));
    ngx_memcpy(item->host, u->ssl_name.data, item->host_len);
    item->socklen = pc->socklen;
    ngx_memcpy(&item->sockaddr, pc->sockaddr, pc->socklen);

    pc->connection = NULL;

    c->read->delayed = 0;
    ngx_add_timer(c->read, ngx_llmgw_ka_timeout);

    if (c->write->timer_set) {
        ngx_del_timer(c->write);
    }

    c->write->handler = ngx_llmgw_ka_dummy_handler;
    c->read->handler = ngx_llmgw_ka_close_handler;

    c->data = item;
    c->idle = 1;
    c->log = ngx_cycle->log;
    c->read->log = ngx_cycle->log;
    c->write->log = ngx_cycle->log;
    c->pool->log = ngx_cycle->log;

    if (c->read->ready) {
        ngx_llmgw_ka_close_handler(c->read);
    }
}


static void
ngx_llmgw_ka_dummy_handler(ngx_event_t *ev)
{
}


static void
ngx_llmgw_ka_close_handler(ngx_event_t *ev)
{
    int                   n;
    char                  buf[1];
    ngx_connection_t     *c;
    ngx_llmgw_ka_item_t  *item;

    c = ev->data;

    if (!c->close && !c->read->timedout) {
        n = recv(c->fd, buf, 1, MSG_PEEK);

        if (n == -1 && ngx_socket_errno == NGX_EAGAIN) {
            ev->ready = 0;

            if (ngx_handle_read_event(c->read, 0) == NGX_OK) {
                return;
            }
        }
    }

    item = c->data;

    ngx_llmgw_ka_close(c);

    ngx_queue_remove(&item->queue);
    ngx_queue_insert_head(&ngx_llmgw_ka_free, &item->queue);
}


static void
ngx_llmgw_ka_close(ngx_connection_t *c)
{
#if (NGX_HTTP_SSL)
    if (c->ssl) {
        c->ssl->no_wait_shutdown = 1;
        c->ssl->no_send_shutdown = 1;

        if (ngx_ssl_shutdown(c) == NGX_AGAIN) {
            c->ssl->handler = ngx_llmgw_ka_close;
            return;
        }
    }
#endif

    ngx_destroy_pool(c->pool);
    ngx_close_connection(c);
}


static ngx_str_t
ngx_llmgw_request_header(ngx_http_request_t *r, const char *name,
    ngx_uint_t list)
{
    size_t            len, total;
    u_char           *p;
    ngx_str_t         found = ngx_null_string;
    ngx_uint_t        i, n, pass;
    ngx_list_part_t  *part;
    ngx_table_elt_t  *h;

    len = ngx_strlen(name);
    total = 0;
    n = 0;
    p = NULL;

    /* the first line; for a list-valued header, repeated lines are one
       list (RFC 9110 5.3): joined with ", " */
    for (pass = 0; pass < 2; pass++) {
        part = &r->headers_in.headers.part;
        h = part->elts;

        for (i = 0; /* void */; i++) {

            if (i >= part->nelts) {
                if (part->next == NULL) {
                    break;
                }
                part = part->next;
                h = part->elts;
                i = 0;
            }

            if (h[i].key.len != len
                || ngx_strncasecmp(h[i].key.data, (u_char *) name, len) != 0)
            {
                continue;
            }

            if (pass == 0) {
                found = (n == 0) ? h[i].value : found;
                total += h[i].value.len + (n ? 2 : 0);
                n++;
                if (!list) {
                    return found;
                }
                continue;
            }

            if (n++ > 0) {
                *p++ = ','; *p++ = ' ';
            }
            p = ngx_cpymem(p, h[i].value.data, h[i].value.len);
        }

        if (pass == 0) {
            if (n < 2) {
                return found;
            }

            n = 0;              /* counts the values copied below */

            found.data = ngx_pnalloc(r->pool, total);
            if (found.data == NULL) {
                ngx_str_null(&found);
                return found;
            }
            found.len = total;
            p = found.data;
        }
    }

    return found;
}


/* The request line, headers and body of one try, for one channel. */
static ngx_int_t
ngx_llmgw_build_request(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx,
    const llmgw_channel_t *ch)
{
    size_t        len, klen;
    u_char       *p;
    ngx_uint_t    stream;
    ngx_buf_t    *b;
    ngx_str_t     path, version, beta, model;
    ngx_uint_t    owned;
    llmgw_str_t   upstream_model, view;
    llmgw_buf_t   body;
    ngx_chain_t  *cl;

    upstream_model = llmgw_channel_map_model(ctx->snapshot, ch,
        (llmgw_str_t) { (char *) ctx->model.data, ctx->model.len });

    model.len = upstream_model.len;
    model.data = ngx_pnalloc(r->pool, model.len);
    if (model.data == NULL) {
        return NGX_ERROR;
    }

    ngx_memcpy(model.data, upstream_model.data, model.len);
    ctx->upstream_model = model;

    /* built ahead in the thread pool for a large body, else now */
    owned = llmgw_req_prepared_body(ctx->req, ch, upstream_model, &view,
                                    &ctx->usage_injected) != 0;

    if (owned) {
        body = llmgw_req_upstream_body(ctx->req, ch, upstream_model,
                                       &ctx->usage_injected);
        if (body.data == NULL) {
            return NGX_ERROR;
        }

    } else {
        /* only read, and not freed (!owned) */
        body.data = (char *) view.data;
        body.len = view.len;
    }

    stream = llmgw_req_stream(ctx->req) || ctx->endpoint.stream;

    /* the path is the channel's format, whatever the client spoke */
    switch (ctx->endpoint.ep == LLMGW_EP_RERANK ? 0 : ch->type) {
    case 0:
        ngx_str_set(&path, "/v1/rerank");
        break;
    case 14:
        ngx_str_set(&path, "/v1/messages");
        break;
    case 24:
        /* one path segment, whatever the name holds ('/', '?', '#', ':',
           '%', spaces): each such byte takes 3 */
        len = sizeof("/v1beta/models/:streamGenerateContent?alt=sse") - 1
              + model.len
              + 2 * ngx_escape_uri(NULL, model.data, model.len,
                                   NGX_ESCAPE_URI_COMPONENT);
        path.data = ngx_pnalloc(r->pool, len);
        if (path.data == NULL) {
            if (owned) {
                llmgw_buf_free(&body);
            }
            return NGX_ERROR;
        }
        p = ngx_cpymem(path.data, "/v1beta/models/",
                       sizeof("/v1beta/models/") - 1);
        p = (u_char *) ngx_escape_uri(p, model.data, model.len,
                                      NGX_ESCAPE_URI_COMPONENT);
        p = ngx_sprintf(p, ":%s", stream ? "streamGenerateContent?alt=sse"
                                         : "generateContent");
        path.len = p - path.data;
        break;
    default:
        ngx_str_set(&path, "/v1/chat/completions");
    }

    version = ngx_llmgw_request_header(r, "anthropic-version", 0);
    beta = ngx_llmgw_request_header(r, "anthropic-beta", 1);

    if (version.len == 0) {
        ngx_str_set(&version, "2023-06-01");
    }

    klen = ngx_strlen(ch->key);

    len = sizeof("POST  HTTP/1.1\r\n") - 1 + ngx_strlen(ch->base_path)
          + path.len
          + sizeof("Host: \r\n") - 1 + ngx_strlen(ch->host_header)
          + sizeof("Content-Type: application/json\r\n") - 1
          + sizeof("Content-Length: \r\n") - 1 + NGX_SIZE_T_LEN
          + sizeof("Accept: text/event-stream\r\n") - 1
          + sizeof("Connection: keep-alive\r\n") - 1
          + sizeof("Authorization: Bearer \r\n") - 1 + klen
          + sizeof("anthropic-version: \r\n") - 1 + version.len
          + sizeof("anthropic-beta: \r\n") - 1 + beta.len
          + sizeof("\r\n") - 1
          + body.len;

    b = ngx_create_temp_buf(r->pool, len);
    if (b == NULL) {
        if (owned) {
            llmgw_buf_free(&body);
        }
        return NGX_ERROR;
    }

    p = b->last;
    p = ngx_sprintf(p, "POST %s%V HTTP/1.1\r\nHost: %s\r\n", ch->base_path,
                    &path, ch->host_header);
    p = ngx_sprintf(p, "Content-Type: application/json\r\n"
                       "Content-Length: %uz\r\n", body.len);
    p = ngx_cpymem(p, "Connection: keep-alive\r\n",
                   sizeof("Connection: keep-alive\r\n") - 1);

    if (stream) {
        p = ngx_cpymem(p, "Accept: text/event-stream\r\n",
                       sizeof("Accept: text/event-stream\r\n") - 1);
    }

    switch (ch->type) {

    case 14:
        p = ngx_sprintf(p, "x-api-key: %s\r\nanthropic-version: %V\r\n",
                        ch->key, &version);
        if (beta.len) {
            p = ngx_sprintf(p, "anthropic-beta: %V\r\n", &beta);
        }
        break;

    case 24:
        p = ngx_sprintf(p, "x-goog-api-key: %s\r\n", ch->key);
        break;

    default:
        if (klen) {
            p = ngx_sprintf(p, "Authorization: Bearer %s\r\n", ch->key);
        }
    }

    *p++ = CR; *p++ = LF;

    p = ngx_cpymem(p, body.data, body.len);
    if (owned) {
        llmgw_buf_free(&body);
    }

    b->last = p;

    /* TLS buffers writes until told to flush */
    b->flush = 1;

    cl = ngx_alloc_chain_link(r->pool);
    if (cl == NULL) {
        return NGX_ERROR;
    }

    cl->buf = b;
    cl->next = NULL;

    r->upstream->request_bufs = cl;

    return NGX_OK;
}


static ngx_int_t
ngx_llmgw_create_request(ngx_http_request_t *r)
{
    /* each try builds its own request in peer.get, for its channel */
    r->upstream->request_bufs = NULL;

    return NGX_OK;
}


static void
ngx_llmgw_reset_response(ngx_llmgw_ctx_t *ctx)
{
    ngx_memzero(&ctx->chunked, sizeof(ngx_http_chunked_t));
    ngx_memzero(&ctx->status_line, sizeof(ngx_http_status_t));
    ctx->length = -1;
    ctx->status = 0;
    ctx->error_mode = 0;
    ctx->whole_for_stream = 0;
    ctx->event_stream = 0;
    ctx->holding = 0;
    ctx->interim = 0;
    ctx->sniffed = 0;
    ctx->bad_answer = 0;
    ctx->bad_status = 0;
    ctx->next_after = 0;
    ctx->too_large = 0;
    ctx->upstream_header = 0;
    ctx->error_body = NULL;
    ctx->content_type = NULL;
    ngx_str_null(&ctx->answer);
    ngx_str_null(&ctx->pending);

    llmgw_resp_free(ctx->resp);
    ctx->resp = NULL;
}


static ngx_int_t
ngx_llmgw_reinit_request(ngx_http_request_t *r)
{
    ngx_llmgw_ctx_t  *ctx;

    ctx = ngx_llmgw_get_ctx(r);
    if (ctx == NULL) {
        return NGX_ERROR;
    }

    ngx_llmgw_reset_response(ctx);

    /* a try cut off inside a status or header line left the parser's state */
    r->state = 0;
    r->upstream->process_header = ngx_llmgw_process_header;

    return NGX_OK;
}


static ngx_table_elt_t *
ngx_llmgw_push_header(ngx_http_request_t *r, ngx_str_t *key,
    ngx_str_t *value, ngx_uint_t run_handler)
{
    ngx_table_elt_t                *h;
    ngx_http_upstream_header_t     *hh;
    ngx_http_upstream_main_conf_t  *umcf;

    umcf = ngx_http_get_module_main_conf(r, ngx_http_upstream_module);

    h = ngx_list_push(&r->upstream->headers_in.headers);
    if (h == NULL) {
        return NULL;
    }

    h->key = *key;
    h->value = *value;
    h->hash = ngx_hash_key_lc(key->data, key->len);

    h->lowcase_key = ngx_pnalloc(r->pool, key->len);
    if (h->lowcase_key == NULL) {
        return NULL;
    }

    ngx_strlow(h->lowcase_key, key->data, key->len);

    if (!run_handler) {
        return h;
    }

    hh = ngx_hash_find(&umcf->headers_in_hash, h->hash, h->lowcase_key,
                       h->key.len);

    if (hh && hh->handler(r, h, hh->offset) != NGX_OK) {
        return NULL;
    }

    return h;
}


/* Whether an upstream header value holds the try's channel credential. */
static ngx_uint_t
ngx_llmgw_quotes_key(ngx_llmgw_ctx_t *ctx, ngx_str_t *value)
{
    if (ctx->current < 0) {
        return 0;
    }

    return llmgw_channel_quotes_key(ctx->channels[ctx->current],
                                    (char *) value->data, value->len);
}


static ngx_int_t
ngx_llmgw_process_header(ngx_http_request_t *r)
{
    ngx_int_t             rc;
    ngx_str_t             key, value;
    ngx_uint_t            code, is_type, array;
    ngx_table_elt_t      *h;
    ngx_llmgw_ctx_t      *ctx;
    ngx_http_upstream_t  *u;

    u = r->upstream;
    ctx = ngx_llmgw_get_ctx(r);
    if (ctx == NULL) {
        return NGX_ERROR;
    }

    if (ctx->holding) {
        return ngx_llmgw_hold(r, ctx);
    }

    if (ctx->status == 0) {
        /* a status line can arrive in pieces: its parse goes on in ctx */
        rc = ngx_http_parse_status_line(r, &u->buffer, &ctx->status_line);

        if (rc == NGX_AGAIN) {
            return rc;
        }

        if (rc == NGX_ERROR) {
            ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                          "llmgw: upstream sent no valid HTTP/1.x status "
                          "line");
            return NGX_HTTP_UPSTREAM_INVALID_HEADER;
        }

        code = ctx->status_line.code;

        if (code >= 100 && code < 200 && code != 101) {
            /* an interim answer (100 Continue, 103 Early Hints): its head
               is skipped, the final status line follows */
            ctx->interim = 1;
        }

        ctx->status = code;
        u->headers_in.status_n = code;
        u->state->status = code;

        /* the channel answered: a failure from here on is the channel's,
           not that of a kept-alive connection it had closed */
        u->peer.cached = 0;

        /*
         * 5xx the upstream module does not retry by itself, except 504:
         * the next channel, once this one's error is held (it is the
         * answer should no later channel answer at all).
         */
        ctx->next_after = code >= 500 && code != 500 && code != 502
                          && code != 503 && code != 504
                          && u->peer.tries > 1;

        /* 304 and 101 answer no request of this API (101 would hand the
           client's connection to the upstream), and have no body */
        if (code == NGX_HTTP_NOT_MODIFIED
            || code == NGX_HTTP_SWITCHING_PROTOCOLS)
        {
            ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                          "llmgw: upstream answered %ui (channel %L)",
                          code, ctx->channels[ctx->current]->id);
            ctx->bad_status = 1;
            u->keepalive = 0;
            return NGX_HTTP_UPSTREAM_INVALID_HEADER;
        }

        ctx->error_mode = (code < 200 || code >= 300);
    }

    for ( ;; ) {

        rc = ngx_http_parse_header_line(r, &u->buffer, 1);

        if (ctx->interim && (rc == NGX_OK || rc == NGX_HTTP_PARSE_HEADER_DONE))
        {
            if (rc == NGX_HTTP_PARSE_HEADER_DONE) {
                ctx->interim = 0;
                ctx->status = 0;
                ngx_memzero(&ctx->status_line, sizeof(ngx_http_status_t));
                return ngx_llmgw_process_header(r);
            }

            continue;
        }

        if (rc == NGX_OK) {
            key.len = r->header_name_end - r->header_name_start;
            key.data = r->header_name_start;
            value.len = r->header_end - r->header_start;
            value.data = r->header_start;

            /* an error is rewritten: its own type and length go */
            if (ctx->error_mode
                && ((key.len == 12
                     && ngx_strncasecmp(key.data, (u_char *) "Content-Type",
                                        12) == 0)
                    || (key.len == 16
                        && ngx_strncasecmp(key.data,
                                           (u_char *) "Content-Encoding",
                                           16) == 0)))
            {
                continue;
            }

            /* a body the gateway cannot read is no answer: it could be
               neither billed nor checked for the channel's key */
            if (ngx_llmgw_unreadable_coding(&key, &value, ctx->error_mode)) {
                ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                              "llmgw: upstream answered with \"%V: %V\" "
                              "(channel %L)", &key, &value,
                              ctx->channels[ctx->current]->id);
                return ngx_llmgw_bad_answer(r, ctx);
            }

            is_type = key.len == 12
                      && ngx_strncasecmp(key.data, (u_char *) "Content-Type",
                                         12) == 0;

            if (is_type
                && llmgw_is_event_stream((llmgw_str_t) {
                       (const char *) value.data, value.len }))
            {
                ctx->event_stream = 1;
            }

            if (ngx_llmgw_quotes_key(ctx, &value)) {
                ngx_str_set(&value, "[credential]");
            }

            key.data = ngx_pstrdup(r->pool, &key);
            value.data = ngx_pstrdup(r->pool, &value);

            if (key.data == NULL || value.data == NULL) {
                return NGX_ERROR;
            }

            h = ngx_llmgw_push_header(r, &key, &value, 1);
            if (h == NULL) {
                return NGX_ERROR;
            }

            if (is_type) {
                ctx->content_type = h;
            }

            continue;
        }

        if (rc == NGX_HTTP_PARSE_HEADER_DONE) {
            break;
        }

        if (rc == NGX_AGAIN) {
            return NGX_AGAIN;
        }

        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "llmgw: upstream sent an invalid header");

        return NGX_HTTP_UPSTREAM_INVALID_HEADER;
    }

    if (u->headers_in.chunked) {
        u->headers_in.content_length_n = -1;
    }

    ctx->length = u->headers_in.content_length_n;

    if (ctx->status == NGX_HTTP_NO_CONTENT) {
        /* no body, whatever it says: held and judged as an empty one */
        ctx->length = 0;
    }

    if (ctx->status == NGX_HTTP_NO_CONTENT
        || ctx->status == NGX_HTTP_NOT_MODIFIED
        || (!u->headers_in.chunked && ctx->length == 0))
    {
        u->keepalive = !u->headers_in.connection_close;
    }

    ctx->upstream_header = 1;

    if (ctx->error_mode) {
        ngx_str_set(&key, "Content-Type");
        ngx_str_set(&value, "application/json");

        if (ngx_llmgw_push_header(r, &key, &value, 0) == NULL) {
            return NGX_ERROR;
        }

        u->headers_in.content_length_n = -1;
        u->headers_in.content_length = NULL;

        /* read whole before the head goes out too: one cut short is a
           transport error, not half an error for the client */
        if (u->headers_in.chunked || ctx->length >= 0) {
            ctx->holding = 1;
            return ngx_llmgw_hold(r, ctx);
        }

        if (ctx->next_after) {
            /* an error to its closing cannot be held: the next channel */
            u->keepalive = 0;
            return NGX_HTTP_UPSTREAM_INVALID_HEADER;
        }

        return NGX_OK;
    }

    /*
     * A stream was asked for and the upstream answers something else (one
     * JSON body: it ignored "stream"): that answer is held, and the client
     * still gets a stream, made of it.
     */
    if ((llmgw_req_stream(ctx->req) || ctx->endpoint.stream)
        && !ctx->event_stream)
    {
        ctx->whole_for_stream = 1;
    }

    /* a Gemini stream without alt=sse is one JSON array */
    array = ngx_llmgw_gemini_array(r, ctx);

    if (ctx->whole_for_stream || array) {
        if (array) {
            ngx_str_set(&value, "application/json");

        } else {
            ngx_str_set(&value, "text/event-stream");
        }

        if (ctx->content_type) {
            ctx->content_type->value = value;

        } else {
            ngx_str_set(&key, "Content-Type");

            if (ngx_llmgw_push_header(r, &key, &value, 0) == NULL) {
                return NGX_ERROR;
            }
        }
    }

    if (ngx_llmgw_new_resp(r, ctx) != NGX_OK) {
        return NGX_ERROR;
    }

    /*
     * A JSON answer is read whole before its head goes out: one that is
     * no answer (not JSON, empty, cut short) is then an upstream fault that
     * the next channel can still take over.  A body that only the upstream
     * closing would end cannot be told from a cut one: it is passed on.
     */
    if (llmgw_resp_holds(ctx->resp)
        && (u->headers_in.chunked || ctx->length >= 0))
    {
        ctx->holding = 1;
        return ngx_llmgw_hold(r, ctx);
    }

    return NGX_OK;
}


/*
 * A Gemini stream asked for without alt=sse (absent, or alt=json): Gemini
 * answers one JSON array then, written piece by piece.  The upstream is
 * always asked for events; the answer is put back in the asked form.
 */
static ngx_uint_t
ngx_llmgw_gemini_array(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx)
{
    ngx_str_t  alt;

    if (ctx->endpoint.ep != LLMGW_EP_GEMINI || !ctx->endpoint.stream) {
        return 0;
    }

    if (ngx_http_arg(r, (u_char *) "alt", 3, &alt) != NGX_OK) {
        return 1;
    }

    return !(alt.len == 3 && ngx_strncasecmp(alt.data, (u_char *) "sse", 3)
                             == 0);
}


/* The response reader of this try's 2xx answer. */
static ngx_int_t
ngx_llmgw_new_resp(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx)
{
    ngx_http_upstream_t  *u;

    u = r->upstream;

    llmgw_resp_free(ctx->resp);

    ctx->resp = llmgw_resp_new(ctx->endpoint.ep,
                               ctx->channels[ctx->current]->type,
                               (llmgw_req_stream(ctx->req)
                                || ctx->endpoint.stream)
                               && !ctx->whole_for_stream,
                               ctx->usage_injected);
    if (ctx->resp == NULL) {
        return NGX_ERROR;
    }

    llmgw_resp_secret_channel(ctx->resp, ctx->channels[ctx->current],
                              (char *) ctx->request_id,
                              NGX_LLMGW_REQUEST_ID_LEN);

    if (ctx->whole_for_stream) {
        llmgw_resp_whole_for_stream(ctx->resp);
    }

    if (ngx_llmgw_gemini_array(r, ctx)) {
        llmgw_resp_array(ctx->resp);
    }

    if (llmgw_resp_convert(ctx->resp, ctx->req) != 0) {
        return NGX_ERROR;
    }

    if (llmgw_resp_rewrites(ctx->resp)) {
        /* a chunk is held back, so the length is no longer known */
        u->headers_in.content_length_n = -1;
        u->headers_in.content_length = NULL;
    }

    return NGX_OK;
}


/*
 * Whether the first body bytes of a stream request's answer that did not
 * say text/event-stream are events after all (0: an SSE field first), to
 * be held as one answer (1: JSON, or anything else, which the check then
 * refuses), or nothing but white space so far (-1).
 */
static ngx_int_t
ngx_llmgw_sniff(ngx_llmgw_ctx_t *ctx, u_char *p, size_t n)
{
    size_t       len;
    u_char      *last;
    ngx_uint_t   i;

    if (!ctx->whole_for_stream || ctx->sniffed) {
        return 1;
    }

    static const char *const  fields[] = { "data:", "event:", "id:",
                                             "retry:", ":" };

    for (last = p + n; p < last; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\r' && *p != '\n') {
            break;
        }
    }

    if (p == last) {
        return -1;
    }

    ctx->sniffed = 1;

    for (i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        len = ngx_min((size_t) (last - p), ngx_strlen(fields[i]));

        if (ngx_strncmp(p, fields[i], len) == 0) {
            return 0;
        }
    }

    return 1;
}


/*
 * A stream request's answer labelled otherwise that turns out to be events
 * (some servers send SSE as text/plain): streamed as it comes after all,
 * from the bytes still in u->buffer.
 */
static ngx_int_t
ngx_llmgw_stream_after_all(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx)
{
    ctx->whole_for_stream = 0;
    ctx->holding = 0;

    return ngx_llmgw_new_resp(r, ctx);
}


/* Whether n more bytes of a held 2xx answer would pass the hold limit. */
static ngx_uint_t
ngx_llmgw_too_large(ngx_llmgw_ctx_t *ctx, size_t n)
{
    return !ctx->error_mode
           && llmgw_resp_held(ctx->resp) + n > llmgw_resp_hold_max();
}


/*
 * An answer too large to hold: what is held goes out first, then the rest
 * as it comes; or, when it was to be converted, it is no answer.
 */
static ngx_int_t
ngx_llmgw_unheld(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx)
{
    llmgw_buf_t  out;

    if (llmgw_resp_reshapes(ctx->resp)) {
        /* as it came it would be in the wrong format for the client */
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "llmgw: upstream answer over %uz bytes cannot be "
                      "converted (channel %L)", llmgw_resp_hold_max(),
                      ctx->channels[ctx->current]->id);
        ctx->too_large = 1;
        return ngx_llmgw_bad_answer(r, ctx);
    }

    if (llmgw_resp_release(ctx->resp, &out) != 0) {
        return NGX_ERROR;
    }

    if (ngx_llmgw_keep(r, &out, &ctx->pending) != NGX_OK) {
        return NGX_ERROR;
    }

    ctx->holding = 0;

    return NGX_OK;
}


/*
 * Reads a held answer's body out of u->buffer (a head already parsed) into
 * the response, until it is whole (then checked) or too large to hold
 * (then passed on as it comes, from the bytes held so far).
 */
static ngx_int_t
ngx_llmgw_hold(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx)
{
    size_t                n;
    ngx_int_t             rc;
    ngx_buf_t            *b;
    ngx_http_upstream_t  *u;

    u = r->upstream;
    b = &u->buffer;

    /* (a chunked body is measured by its chunks' bytes, below) */
    if (!u->headers_in.chunked
        && ngx_llmgw_too_large(ctx, (size_t) (b->last - b->pos)))
    {
        return ngx_llmgw_unheld(r, ctx);
    }

    for ( ;; ) {

        if (!u->headers_in.chunked) {
            n = ngx_min((off_t) (b->last - b->pos), ctx->length);

            if (ngx_llmgw_sniff(ctx, b->pos, n) == 0) {
                return ngx_llmgw_stream_after_all(r, ctx);
            }

            if (ngx_llmgw_hold_feed(r, ctx, b->pos, n) != NGX_OK) {
                return NGX_ERROR;
            }

            b->pos += n;
            ctx->length -= n;

            if (ctx->length > 0) {
                break;
            }

            u->keepalive = !u->headers_in.connection_close
                           && b->pos == b->last;
            return ngx_llmgw_held(r, ctx);
        }

        rc = ngx_http_parse_chunked(r, b, &ctx->chunked);

        if (rc == NGX_OK) {
            n = ngx_min((off_t) (b->last - b->pos), ctx->chunked.size);

            if (ngx_llmgw_too_large(ctx, n)) {
                /* the parser stays inside this chunk: the input filter
                   goes on from here */
                return ngx_llmgw_unheld(r, ctx);
            }

            if (ngx_llmgw_sniff(ctx, b->pos, n) == 0) {
                return ngx_llmgw_stream_after_all(r, ctx);
            }

            if (ngx_llmgw_hold_feed(r, ctx, b->pos, n) != NGX_OK) {
                return NGX_ERROR;
            }

            b->pos += n;
            ctx->chunked.size -= n;
            continue;
        }

        if (rc == NGX_DONE) {
            u->keepalive = !u->headers_in.connection_close
                           && b->pos == b->last;
            return ngx_llmgw_held(r, ctx);
        }

        if (rc == NGX_AGAIN) {
            break;
        }

        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "llmgw: upstream sent an invalid chunked body");

        return ngx_llmgw_bad_answer(r, ctx);
    }

    /* all of it is in the response: the buffer takes the next read */
    b->pos = b->start;
    b->last = b->start;

    /* nginx arms the read timer once for the head; a body read here
       gets it anew for each read, as the input filter's reads do */
    ngx_add_timer(u->peer.connection->read, u->conf->read_timeout);

    return NGX_AGAIN;
}


/* Bytes of a held body: into the response reader, or the error kept. */
static ngx_int_t
ngx_llmgw_hold_feed(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx, u_char *p,
    size_t n)
{
    llmgw_buf_t  out;

    if (ctx->error_mode) {
        /* kept up to its limit, never sent as it is */
        return ngx_llmgw_emit(r, ctx, p, n, NULL);
    }

    if (llmgw_resp_feed(ctx->resp, (char *) p, n, &out) != 0) {
        return NGX_ERROR;
    }

    llmgw_buf_free(&out);

    return NGX_OK;
}


/* A whole answer: checked, then its head goes out and the answer after. */
static ngx_int_t
ngx_llmgw_held(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx)
{
    llmgw_buf_t           out;
    ngx_http_upstream_t  *u;

    u = r->upstream;

    if (ctx->error_mode) {
        out = ngx_llmgw_error_answer(ctx);
        if (out.data == NULL) {
            return NGX_ERROR;
        }

    } else if (llmgw_resp_finish(ctx->resp, &out) != 0) {
        return NGX_ERROR;

    } else if (!llmgw_resp_valid(ctx->resp)) {
        llmgw_buf_free(&out);
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "llmgw: upstream answered %ui without a JSON answer "
                      "(channel %L)", ctx->status,
                      ctx->channels[ctx->current]->id);
        return ngx_llmgw_bad_answer(r, ctx);
    }

    if (ngx_llmgw_keep(r, &out, &ctx->answer) != NGX_OK) {
        return NGX_ERROR;
    }

    /* the answer if a later try reaches no channel at all */
    if (ctx->error_mode) {
        ctx->last_error = ctx->answer;
        ctx->last_error_status = ctx->status;

        if (ctx->next_after) {
            ngx_str_null(&ctx->answer);
            ctx->holding = 0;
            ctx->upstream_header = 0;
            return NGX_HTTP_UPSTREAM_INVALID_HEADER;
        }
    }

    ctx->holding = 0;
    ctx->length = 0;
    u->headers_in.chunked = 0;
    u->headers_in.content_length_n = ctx->answer.len;
    u->headers_in.content_length = NULL;
    u->buffer.pos = u->buffer.last;

    return NGX_OK;
}


/*
 * The upstream's error in the contract and the client's format, with the
 * try's credential taken out.
 */
static llmgw_buf_t
ngx_llmgw_error_answer(ngx_llmgw_ctx_t *ctx)
{
    const char  *key;
    ngx_buf_t   *b;

    b = ctx->error_body;
    key = ctx->current >= 0 ? ctx->channels[ctx->current]->key : "";

    return llmgw_upstream_error_for(ctx->endpoint.ep, (int) ctx->status,
        b ? (char *) b->pos : "", b ? (size_t) (b->last - b->pos) : 0,
        (llmgw_str_t) { key, ngx_strlen(key) },
        (llmgw_str_t) { (char *) ctx->request_id, NGX_LLMGW_REQUEST_ID_LEN });
}


/* Moves a core buffer into the request's pool (it is freed either way). */
static ngx_int_t
ngx_llmgw_keep(ngx_http_request_t *r, llmgw_buf_t *from, ngx_str_t *to)
{
    to->data = ngx_pnalloc(r->pool, from->len + 1);

    if (to->data != NULL) {
        to->len = ngx_cpymem(to->data, from->data, from->len) - to->data;
    }

    llmgw_buf_free(from);

    return to->data != NULL ? NGX_OK : NGX_ERROR;
}


/*
 * A Content-Encoding other than identity on an answer (error answers drop
 * theirs: their message is rewritten), or a Transfer-Encoding other than
 * chunked on any: the gateway sends no Accept-Encoding and decodes nothing.
 */
static ngx_uint_t
ngx_llmgw_unreadable_coding(ngx_str_t *key, ngx_str_t *value,
    ngx_uint_t error_mode)
{
    if (key->len == 16
        && ngx_strncasecmp(key->data, (u_char *) "Content-Encoding", 16) == 0)
    {
        /* "none" and an empty value: what some servers say for identity */
        return !error_mode
               && value->len != 0
               && !(value->len == 8
                    && ngx_strncasecmp(value->data, (u_char *) "identity", 8)
                       == 0)
               && !(value->len == 4
                    && ngx_strncasecmp(value->data, (u_char *) "none", 4)
                       == 0);
    }

    if (key->len == 17
        && ngx_strncasecmp(key->data, (u_char *) "Transfer-Encoding", 17)
           == 0)
    {
        return !(value->len == 7
                 && ngx_strncasecmp(value->data, (u_char *) "chunked", 7)
                    == 0);
    }

    return 0;
}


/* A 2xx that was no answer: the next channel, or 502 bad_response_body. */
static ngx_int_t
ngx_llmgw_bad_answer(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx)
{
    ctx->holding = 0;
    ctx->bad_answer = 1;
    /* its head was never sent: the error contract answers if nothing else
       does */
    ctx->upstream_header = 0;
    r->upstream->keepalive = 0;

    return NGX_HTTP_UPSTREAM_INVALID_HEADER;
}


/* A held answer, checked: settled, then it goes out. */
static ngx_int_t
ngx_llmgw_answer_out(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx)
{
    ngx_buf_t    *b;
    ngx_chain_t   out;

    ngx_llmgw_gateway_log(r, ctx);

    b = ngx_calloc_buf(r->pool);
    if (b == NULL) {
        return NGX_ERROR;
    }

    b->memory = 1;
    b->flush = 1;
    b->pos = ctx->answer.data;
    b->last = b->pos + ctx->answer.len;
    ngx_str_null(&ctx->answer);

    out.buf = b;
    out.next = NULL;

    return ngx_http_output_filter(r, &out);
}


static ngx_int_t
ngx_llmgw_filter_init(void *data)
{
    ngx_http_request_t  *r = data;

    ngx_llmgw_ctx_t      *ctx;
    ngx_http_upstream_t  *u;

    u = r->upstream;
    ctx = ngx_llmgw_get_ctx(r);
    if (ctx == NULL) {
        return NGX_ERROR;
    }

    if (ctx->answer.data) {
        /*
         * A held answer goes out now, in the same write as its head: nginx
         * has just queued the head, and the upstream buffer is empty, so
         * without this the head would be flushed alone and the answer
         * written after it (two sends, and the client woken twice).
         */
        ctx->responded = 1;
        u->length = 0;

        return ngx_llmgw_answer_out(r, ctx) == NGX_ERROR ? NGX_ERROR : NGX_OK;
    }

    if (ctx->status == NGX_HTTP_NO_CONTENT
        || ctx->status == NGX_HTTP_NOT_MODIFIED)
    {
        u->length = 0;

    } else if (u->headers_in.chunked) {
        /* not 0 until the last chunk is read */
        u->length = 1;

    } else {
        u->length = ctx->length;
    }

    return NGX_OK;
}


static ngx_int_t
ngx_llmgw_emit(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx, u_char *pos,
    size_t size, ngx_chain_t ***ll)
{
    size_t        n;
    u_char       *p;
    llmgw_buf_t   out;
    ngx_buf_t    *b;

    if (size == 0) {
        return NGX_OK;
    }

    if (ctx->error_mode) {
        b = ctx->error_body;

        if (b == NULL) {
            b = ngx_create_temp_buf(r->pool, LLMGW_ERROR_BODY_MAX);
            if (b == NULL) {
                return NGX_ERROR;
            }
            ctx->error_body = b;
        }

        n = ngx_min(size, (size_t) (b->end - b->last));
        b->last = ngx_cpymem(b->last, pos, n);

        return NGX_OK;
    }

    if (llmgw_resp_feed(ctx->resp, (char *) pos, size, &out) != 0) {
        return NGX_ERROR;
    }

    p = pos;

    if (out.data != NULL) {
        if (out.len == 0) {
            llmgw_buf_free(&out);
            return NGX_OK;
        }

        p = ngx_pnalloc(r->pool, out.len);
        if (p == NULL) {
            llmgw_buf_free(&out);
            return NGX_ERROR;
        }

        ngx_memcpy(p, out.data, out.len);
        size = out.len;
        llmgw_buf_free(&out);
    }

    return ngx_llmgw_chain(r, p, size, ll);
}


/* Bytes for the client, appended to the upstream's output chain. */
static ngx_int_t
ngx_llmgw_chain(ngx_http_request_t *r, u_char *p, size_t size,
    ngx_chain_t ***ll)
{
    ngx_buf_t            *b;
    ngx_chain_t          *cl;
    ngx_llmgw_ctx_t      *ctx;
    ngx_http_upstream_t  *u;

    u = r->upstream;
    ctx = ngx_llmgw_get_ctx(r);

    cl = ngx_chain_get_free_buf(r->pool, &u->free_bufs);
    if (cl == NULL) {
        return NGX_ERROR;
    }

    **ll = cl;
    *ll = &cl->next;

    b = cl->buf;
    b->flush = 1;
    b->memory = 1;
    b->start = p;
    b->pos = p;
    b->last = p + size;
    b->end = b->last;
    b->tag = u->output.tag;

    ctx->stream_started = 1;

    return NGX_OK;
}


static ngx_int_t
ngx_llmgw_filter(void *data, ssize_t bytes)
{
    ngx_http_request_t  *r = data;

    size_t                size;
    ngx_int_t             rc;
    ngx_buf_t            *buf;
    ngx_chain_t          *cl, **ll;
    ngx_llmgw_ctx_t      *ctx;
    ngx_http_upstream_t  *u;

    u = r->upstream;
    buf = &u->buffer;

    ctx = ngx_llmgw_get_ctx(r);
    if (ctx == NULL) {
        return NGX_ERROR;
    }

    for (cl = u->out_bufs, ll = &u->out_bufs; cl; cl = cl->next) {
        ll = &cl->next;
    }

    if (ctx->pending.len) {
        /* what was held of an answer too large to hold goes first */
        rc = ngx_llmgw_chain(r, ctx->pending.data, ctx->pending.len, &ll);
        ngx_str_null(&ctx->pending);

        if (rc != NGX_OK) {
            return NGX_ERROR;
        }
    }

    if (!u->headers_in.chunked) {
        size = bytes;

        if (u->length >= 0) {
            if (u->length == 0) {
                u->keepalive = 0;
                return NGX_OK;
            }
            size = ngx_min((size_t) bytes, (size_t) u->length);
            u->length -= size;
            if (u->length == 0) {
                u->keepalive = !u->headers_in.connection_close;
            }
        }

        rc = ngx_llmgw_emit(r, ctx, buf->last, size, &ll);
        buf->last += bytes;

        return rc;
    }

    buf->pos = buf->last;
    buf->last += bytes;

    for ( ;; ) {

        rc = ngx_http_parse_chunked(r, buf, &ctx->chunked);

        if (rc == NGX_OK) {
            size = ngx_min((off_t) (buf->last - buf->pos), ctx->chunked.size);

            if (ngx_llmgw_emit(r, ctx, buf->pos, size, &ll) != NGX_OK) {
                return NGX_ERROR;
            }

            buf->pos += size;
            ctx->chunked.size -= size;
            continue;
        }

        if (rc == NGX_DONE) {
            u->keepalive = !u->headers_in.connection_close;
            u->length = 0;

            if (buf->pos != buf->last) {
                u->keepalive = 0;
            }

            break;
        }

        if (rc == NGX_AGAIN) {
            break;
        }

        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "llmgw: upstream sent an invalid chunked body");

        if (r->connection->sent == 0) {
            /*
             * In the read that came with the head: nginx would drop the
             * head it queued (and what came before the bad chunk), and
             * the client would get nothing.  The answer ends here
             * instead, short of its end, as one the upstream ended early.
             */
            u->keepalive = 0;
            u->length = 0;
            return NGX_OK;
        }

        return NGX_ERROR;
    }

    return NGX_OK;
}


static void
ngx_llmgw_abort_request(ngx_http_request_t *r)
{
}


/* The end of the upstream body: an error answer is written now. */
static void
ngx_llmgw_finalize_request(ngx_http_request_t *r, ngx_int_t rc)
{
    llmgw_buf_t           json;
    ngx_buf_t            *b;
    ngx_chain_t           out;
    ngx_llmgw_ctx_t      *ctx;
    ngx_http_upstream_t  *u;

    u = r->upstream;
    ctx = ngx_llmgw_get_ctx(r);

    if (ctx == NULL || !u->header_sent) {
        return;
    }

    if (ctx->responded) {
        return;
    }

    ctx->responded = 1;

    /* an answer that started and then failed: its row says how it ended */
    if (rc != 0 && rc != NGX_DONE) {
        ctx->end_status = (rc == NGX_HTTP_CLIENT_CLOSED_REQUEST
                           || r->connection->error)
                          ? NGX_HTTP_CLIENT_CLOSED_REQUEST
                          : (rc == NGX_HTTP_GATEWAY_TIME_OUT
                             ? NGX_HTTP_GATEWAY_TIME_OUT
                             : NGX_HTTP_BAD_GATEWAY);
    }

    if (ctx->answer.data) {
        /* a held answer not written by the input filter's set-up: nginx
           skips that only for a head that has no body after it (a HEAD
           request); settled, and no body follows */
        ngx_llmgw_gateway_log(r, ctx);
        ngx_str_null(&ctx->answer);
        return;
    }

    if (ctx->resp) {
        /* usage is complete now; a converted answer may still owe bytes */
        rc = llmgw_resp_finish(ctx->resp, &json);

        if (rc == 0 && ctx->end_status == 0 && llmgw_resp_cut(ctx->resp)) {
            /* ended cleanly by the upstream, but short of its end: the
               client got an error event, and the row says 502 */
            ctx->end_status = NGX_HTTP_BAD_GATEWAY;
        }

        if (rc == 0 && !llmgw_resp_valid(ctx->resp)) {
            ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                          "llmgw: upstream answered %ui without a JSON "
                          "answer, ended by its closing, already passed on "
                          "(channel %L)", ctx->status,
                          ctx->channels[ctx->current]->id);
        }

        /* settled before the last bytes reach the client */
        ngx_llmgw_gateway_log(r, ctx);

        if (rc != 0 || json.data == NULL) {
            return;
        }

    } else if (ctx->error_mode) {
        json = ngx_llmgw_error_answer(ctx);
        ngx_llmgw_gateway_log(r, ctx);

    } else {
        ngx_llmgw_gateway_log(r, ctx);
        return;
    }

    if (json.len == 0) {
        llmgw_buf_free(&json);
        return;
    }

    if (json.data == NULL) {
        return;
    }

    b = ngx_create_temp_buf(r->pool, json.len);
    if (b == NULL) {
        llmgw_buf_free(&json);
        return;
    }

    b->last = ngx_cpymem(b->last, json.data, json.len);
    b->flush = 1;
    llmgw_buf_free(&json);

    out.buf = b;
    out.next = NULL;

    (void) ngx_http_output_filter(r, &out);
}
