/*
 * The client of the v8_host helper: framed JSON calls over kept-alive Unix
 * socket connections, on nginx's event loop.
 *
 * A connection carries one call at a time, and every call gets one at
 * once: an idle one, or a new one.  The helper queues the calls per plugin
 * and shares its workers between plugins; a fixed pool here would put a
 * call behind another plugin's slow calls before the helper ever saw it.
 * Up to llmgw_v8host_connections idle connections are kept; calls in
 * flight are bounded by llmgw_v8host_max_inflight, each with its own
 * deadline.  A connection that fails (the helper restarted, a bad frame, a
 * reply with the wrong request id) fails its call and is closed.  Callers
 * are never called back before ngx_llmgw_v8_call() returns.
 */

#include "ngx_llmgw.h"


typedef struct ngx_llmgw_v8_conn_s  ngx_llmgw_v8_conn_t;


typedef struct {
    ngx_queue_t                queue;
    uint32_t                   id;
    ngx_buf_t                 *out;        /* header + body */
    ngx_llmgw_v8_handler_pt    handler;
    void                      *data;
    ngx_event_t                timer;
    ngx_llmgw_v8_conn_t       *conn;       /* NULL: still queued */
} ngx_llmgw_v8_call_t;


struct ngx_llmgw_v8_conn_s {
    ngx_queue_t                queue;      /* in the idle or busy list */
    ngx_connection_t          *c;
    ngx_llmgw_v8_call_t       *call;
    unsigned                   idle:1;
    u_char                     head[LLMGW_FRAME_HEADER_LEN];
    size_t                     head_got;
    u_char                    *body;
    size_t                     body_len;
    size_t                     body_got;
};


static ngx_int_t ngx_llmgw_v8_send(ngx_uint_t type, u_char *body,
    size_t len, ngx_llmgw_v8_handler_pt handler, void *data,
    ngx_llmgw_v8_call_t **callp);
static void ngx_llmgw_v8_cancel(ngx_llmgw_v8_call_t *call);
static ngx_llmgw_v8_conn_t *ngx_llmgw_v8_connect(void);
static void ngx_llmgw_v8_dispatch(void);
static void ngx_llmgw_v8_write(ngx_event_t *wev);
static void ngx_llmgw_v8_read(ngx_event_t *rev);
static void ngx_llmgw_v8_fail(ngx_llmgw_v8_conn_t *vc, const char *why);
static void ngx_llmgw_v8_fail_as(ngx_llmgw_v8_conn_t *vc, ngx_int_t rc,
    const char *why);
static void ngx_llmgw_v8_release(ngx_llmgw_v8_conn_t *vc);
static void ngx_llmgw_v8_close(ngx_llmgw_v8_conn_t *vc);
static void ngx_llmgw_v8_finish(ngx_llmgw_v8_call_t *call, ngx_int_t rc,
    u_char *body, size_t len);
static void ngx_llmgw_v8_timeout(ngx_event_t *ev);
static void ngx_llmgw_v8_posted(ngx_event_t *ev);
static void ngx_llmgw_v8_fail_pending(const char *why);


static ngx_uint_t              ngx_llmgw_v8_enabled;
static ngx_queue_t             ngx_llmgw_v8_idle;
static ngx_uint_t              ngx_llmgw_v8_nidle;
static ngx_queue_t             ngx_llmgw_v8_busy;
static ngx_queue_t             ngx_llmgw_v8_pending;
static ngx_uint_t              ngx_llmgw_v8_inflight;
static uint32_t                ngx_llmgw_v8_next_id;
static ngx_llmgw_main_conf_t  *ngx_llmgw_v8_mcf;
static ngx_log_t              *ngx_llmgw_v8_log;
static ngx_event_t             ngx_llmgw_v8_kick;


ngx_int_t
ngx_llmgw_v8host_init_process(ngx_cycle_t *cycle, ngx_llmgw_main_conf_t *mcf)
{
    ngx_llmgw_v8_mcf = mcf;
    ngx_llmgw_v8_log = cycle->log;

    ngx_queue_init(&ngx_llmgw_v8_pending);
    ngx_queue_init(&ngx_llmgw_v8_idle);
    ngx_queue_init(&ngx_llmgw_v8_busy);
    ngx_llmgw_v8_nidle = 0;

    if (mcf->v8host.len == 0) {
        return NGX_OK;
    }

    ngx_llmgw_v8_enabled = 1;

    ngx_llmgw_v8_kick.handler = ngx_llmgw_v8_posted;
    ngx_llmgw_v8_kick.data = &ngx_llmgw_no_connection;
    ngx_llmgw_v8_kick.log = cycle->log;

    return NGX_OK;
}


void
ngx_llmgw_v8host_exit_process(ngx_cycle_t *cycle)
{
    ngx_queue_t  *q;

    while (!ngx_queue_empty(&ngx_llmgw_v8_busy)) {
        q = ngx_queue_head(&ngx_llmgw_v8_busy);
        ngx_llmgw_v8_close(ngx_queue_data(q, ngx_llmgw_v8_conn_t, queue));
    }

    while (!ngx_queue_empty(&ngx_llmgw_v8_idle)) {
        q = ngx_queue_head(&ngx_llmgw_v8_idle);
        ngx_llmgw_v8_close(ngx_queue_data(q, ngx_llmgw_v8_conn_t, queue));
    }

    ngx_llmgw_v8_enabled = 0;
}


ngx_uint_t
ngx_llmgw_v8host_enabled(void)
{
    return ngx_llmgw_v8_enabled;
}


ngx_int_t
ngx_llmgw_v8_call(ngx_uint_t type, u_char *body, size_t len,
    ngx_llmgw_v8_handler_pt handler, void *data)
{
    return ngx_llmgw_v8_send(type, body, len, handler, data, NULL);
}


static ngx_int_t
ngx_llmgw_v8_send(ngx_uint_t type, u_char *body, size_t len,
    ngx_llmgw_v8_handler_pt handler, void *data, ngx_llmgw_v8_call_t **callp)
{
    size_t                plen;
    u_char                prefix[48];
    ngx_buf_t            *b;
    llmgw_frame_t         f;
    ngx_llmgw_v8_call_t  *call;

    if (!ngx_llmgw_v8_enabled) {
        return NGX_DECLINED;
    }

    if (ngx_llmgw_v8_inflight >= ngx_llmgw_v8_mcf->v8host_max_inflight) {
        return NGX_BUSY;
    }

    plen = 0;

    if (type == LLMGW_FRAME_CALL && len > 2 && body[0] == '{') {
        /* the hook's deadline comes before this call's timer: a hook that
           runs too long is the plugin's fault, not the runtime's */
        plen = ngx_sprintf(prefix, "{\"deadline_ms\":%L,",
                           llmgw_plugin_call_deadline(
                               (int64_t) ngx_llmgw_v8_mcf->v8host_timeout))
               - prefix;
        body++;
        len--;
    }

    if (plen + len > ngx_llmgw_v8_mcf->v8host_max_frame) {
        return NGX_ABORT;
    }

    len += plen;

    call = ngx_calloc(sizeof(ngx_llmgw_v8_call_t) + sizeof(ngx_buf_t)
                      + LLMGW_FRAME_HEADER_LEN + len, ngx_llmgw_v8_log);
    if (call == NULL) {
        return NGX_ERROR;
    }

    b = (ngx_buf_t *) (call + 1);
    b->start = (u_char *) (b + 1);
    b->pos = b->start;
    b->end = b->start + LLMGW_FRAME_HEADER_LEN + len;

    /* ids start anywhere and never repeat in a worker's lifetime, mostly */
    if (ngx_llmgw_v8_next_id == 0) {
        ngx_llmgw_v8_next_id = (uint32_t) ngx_random() | 1;
    }

    call->id = ngx_llmgw_v8_next_id++;

    f.version = LLMGW_FRAME_VERSION;
    f.type = (uint8_t) type;
    f.request_id = call->id;
    f.length = (uint32_t) len;

    llmgw_frame_encode(&f, b->start);
    b->last = ngx_cpymem(b->start + LLMGW_FRAME_HEADER_LEN, prefix, plen);
    b->last = ngx_cpymem(b->last, body, len - plen);

    call->out = b;
    call->handler = handler;
    call->data = data;
    call->timer.handler = ngx_llmgw_v8_timeout;
    call->timer.data = call;
    call->timer.log = ngx_llmgw_v8_log;

    ngx_add_timer(&call->timer, ngx_llmgw_v8_mcf->v8host_timeout);

    ngx_queue_insert_tail(&ngx_llmgw_v8_pending, &call->queue);
    ngx_llmgw_v8_inflight++;

    if (callp != NULL) {
        *callp = call;
    }

    /* sending starts from a posted event, never inside the caller */
    if (!ngx_llmgw_v8_kick.posted) {
        ngx_post_event(&ngx_llmgw_v8_kick, &ngx_posted_events);
    }

    return NGX_OK;
}


static void
ngx_llmgw_v8_posted(ngx_event_t *ev)
{
    ngx_llmgw_v8_dispatch();
}


static void
ngx_llmgw_v8_dispatch(void)
{
    ngx_queue_t          *q;
    ngx_llmgw_v8_conn_t  *vc;
    ngx_llmgw_v8_call_t  *call;

    while (!ngx_queue_empty(&ngx_llmgw_v8_pending)) {

        if (!ngx_queue_empty(&ngx_llmgw_v8_idle)) {
            q = ngx_queue_head(&ngx_llmgw_v8_idle);
            ngx_queue_remove(q);
            ngx_llmgw_v8_nidle--;
            vc = ngx_queue_data(q, ngx_llmgw_v8_conn_t, queue);
            vc->idle = 0;

        } else {
            vc = ngx_llmgw_v8_connect();
            if (vc == NULL && !ngx_queue_empty(&ngx_llmgw_v8_busy)) {
                /* the runtime answers on the connections in use; this one
                   could not be opened now (its listen queue, or
                   worker_connections, is full): the calls wait for one
                   of those to come free, or for their deadline */
                return;
            }
            if (vc == NULL) {
                /* the helper is down: say so now rather than at the
                   deadline */
                ngx_llmgw_v8_fail_pending("the plugin runtime is not "
                                          "running");
                return;
            }
        }

        q = ngx_queue_head(&ngx_llmgw_v8_pending);
        ngx_queue_remove(q);

        call = ngx_queue_data(q, ngx_llmgw_v8_call_t, queue);
        call->conn = vc;
        call->out->pos = call->out->start;

        ngx_queue_insert_tail(&ngx_llmgw_v8_busy, &vc->queue);
        vc->call = call;
        vc->head_got = 0;
        vc->body = NULL;
        vc->body_len = 0;
        vc->body_got = 0;

        ngx_llmgw_v8_write(vc->c->write);
    }
}


static ngx_llmgw_v8_conn_t *
ngx_llmgw_v8_connect(void)
{
    ngx_int_t              rc;
    ngx_llmgw_v8_conn_t   *vc;
    ngx_peer_connection_t  pc;

    vc = ngx_calloc(sizeof(ngx_llmgw_v8_conn_t), ngx_llmgw_v8_log);
    if (vc == NULL) {
        return NULL;
    }

    ngx_memzero(&pc, sizeof(ngx_peer_connection_t));

    pc.sockaddr = ngx_llmgw_v8_mcf->v8host_addr.sockaddr;
    pc.socklen = ngx_llmgw_v8_mcf->v8host_addr.socklen;
    pc.name = &ngx_llmgw_v8_mcf->v8host_addr.name;
    pc.get = ngx_event_get_peer;
    pc.log = ngx_llmgw_v8_log;
    pc.log_error = NGX_ERROR_ERR;

    rc = ngx_event_connect_peer(&pc);

    if (rc == NGX_ERROR || rc == NGX_DECLINED || rc == NGX_BUSY) {
        if (pc.connection) {
            ngx_close_connection(pc.connection);
        }
        ngx_free(vc);
        return NULL;
    }

    vc->c = pc.connection;
    vc->c->data = vc;
    vc->c->read->handler = ngx_llmgw_v8_read;
    vc->c->write->handler = ngx_llmgw_v8_write;
    vc->c->pool = NULL;

    return vc;
}


static void
ngx_llmgw_v8_write(ngx_event_t *wev)
{
    ssize_t               n;
    ngx_buf_t            *b;
    ngx_connection_t     *c;
    ngx_llmgw_v8_conn_t  *vc;

    c = wev->data;
    vc = c->data;

    if (vc->call == NULL) {
        return;
    }

    b = vc->call->out;

    while (b->pos < b->last) {
        n = c->send(c, b->pos, b->last - b->pos);

        if (n == NGX_AGAIN) {
            if (ngx_handle_write_event(wev, 0) != NGX_OK) {
                ngx_llmgw_v8_fail(vc, "cannot watch the helper socket");
            }
            return;
        }

        if (n == NGX_ERROR) {
            ngx_llmgw_v8_fail(vc, "sending to the helper failed");
            return;
        }

        b->pos += n;
    }

    if (ngx_handle_read_event(c->read, 0) != NGX_OK) {
        ngx_llmgw_v8_fail(vc, "cannot watch the helper socket");
    }
}


static void
ngx_llmgw_v8_read(ngx_event_t *rev)
{
    char                  err[128];
    size_t                len;
    ssize_t               n;
    u_char               *body;
    llmgw_frame_t         f;
    ngx_connection_t     *c;
    ngx_llmgw_v8_conn_t  *vc;
    ngx_llmgw_v8_call_t  *call;

    c = rev->data;
    vc = c->data;

    if (vc->call == NULL) {
        /* an idle connection only ever reads its own closing */
        n = c->recv(c, vc->head, 1);
        if (n == NGX_AGAIN) {
            (void) ngx_handle_read_event(rev, 0);
            return;
        }
        ngx_llmgw_v8_close(vc);
        return;
    }

    while (vc->head_got < LLMGW_FRAME_HEADER_LEN) {
        n = c->recv(c, vc->head + vc->head_got,
                    LLMGW_FRAME_HEADER_LEN - vc->head_got);

        if (n == NGX_AGAIN) {
            (void) ngx_handle_read_event(rev, 0);
            return;
        }

        if (n == NGX_ERROR || n == 0) {
            ngx_llmgw_v8_fail(vc, "the helper closed the connection "
                                  "(it may have restarted)");
            return;
        }

        vc->head_got += n;

        if (vc->head_got == LLMGW_FRAME_HEADER_LEN) {
            /* any length first: a reply to this call that is too long is
               what the call returned, not a fault of the helper */
            if (llmgw_frame_decode(vc->head, (size_t) UINT32_MAX, &f, err,
                                   sizeof(err))
                != 0)
            {
                ngx_llmgw_v8_fail(vc, err);
                return;
            }

            if (f.request_id != vc->call->id
                || !(f.type & LLMGW_FRAME_REPLY))
            {
                ngx_llmgw_v8_fail(vc, "the helper answered another call");
                return;
            }

            if (f.length > ngx_llmgw_v8_mcf->v8host_max_frame) {
                ngx_snprintf((u_char *) err, sizeof(err) - 1,
                             "the result is %uD bytes of JSON, over "
                             "llmgw_v8host_max_frame (%uz)%Z", f.length,
                             ngx_llmgw_v8_mcf->v8host_max_frame);
                ngx_llmgw_v8_fail_as(vc, NGX_ABORT, err);
                return;
            }

            vc->body_len = f.length;
            vc->body = ngx_alloc(f.length + 1, ngx_llmgw_v8_log);
            if (vc->body == NULL) {
                ngx_llmgw_v8_fail(vc, "out of memory");
                return;
            }
        }
    }

    while (vc->body_got < vc->body_len) {
        n = c->recv(c, vc->body + vc->body_got, vc->body_len - vc->body_got);

        if (n == NGX_AGAIN) {
            (void) ngx_handle_read_event(rev, 0);
            return;
        }

        if (n == NGX_ERROR || n == 0) {
            ngx_llmgw_v8_fail(vc, "the helper closed the connection "
                                  "(it may have restarted)");
            return;
        }

        vc->body_got += n;
    }

    body = vc->body;
    body[vc->body_len] = '\0';
    call = vc->call;
    len = vc->body_len;

    vc->body = NULL;
    ngx_llmgw_v8_release(vc);

    ngx_llmgw_v8_finish(call, NGX_OK, body, len);
    ngx_free(body);

    ngx_llmgw_v8_dispatch();
}


/* A connection whose call is answered: kept idle, or closed when enough
   idle ones are kept already. */
static void
ngx_llmgw_v8_release(ngx_llmgw_v8_conn_t *vc)
{
    vc->call = NULL;

    /* kept for a waiting call, which takes it at once */
    if (ngx_llmgw_v8_nidle >= ngx_llmgw_v8_mcf->v8host_connections
        && ngx_queue_empty(&ngx_llmgw_v8_pending))
    {
        ngx_llmgw_v8_close(vc);
        return;
    }

    ngx_queue_remove(&vc->queue);
    ngx_queue_insert_head(&ngx_llmgw_v8_idle, &vc->queue);
    vc->idle = 1;
    ngx_llmgw_v8_nidle++;
}


static void
ngx_llmgw_v8_finish(ngx_llmgw_v8_call_t *call, ngx_int_t rc, u_char *body,
    size_t len)
{
    if (call->timer.timer_set) {
        ngx_del_timer(&call->timer);
    }

    ngx_llmgw_v8_inflight--;

    if (call->handler) {
        call->handler(call->data, rc, body, len);
    }

    ngx_free(call);
}


static void
ngx_llmgw_v8_timeout(ngx_event_t *ev)
{
    ngx_llmgw_v8_call_t  *call = ev->data;

    if (call->conn == NULL) {
        ngx_queue_remove(&call->queue);
        ngx_llmgw_v8_finish(call, NGX_ETIMEDOUT, NULL, 0);
        return;
    }

    /* on a connection: that connection is given up (the helper sees it
       close and drops the call if it has not started), its call answered */
    ngx_llmgw_v8_fail(call->conn, "the helper did not answer in time");
}


/*
 * A call nobody waits for any more: it is never answered.  On a connection
 * the connection goes (the helper drops the call if it has not started it;
 * one under way runs to its end, for nobody); nothing is logged.
 */
static void
ngx_llmgw_v8_cancel(ngx_llmgw_v8_call_t *call)
{
    call->handler = NULL;

    if (call->conn == NULL) {
        ngx_queue_remove(&call->queue);

    } else {
        ngx_llmgw_v8_close(call->conn);
    }

    ngx_llmgw_v8_finish(call, NGX_DECLINED, NULL, 0);

    /* calls waiting for a connection to come free open one of their own */
    if (!ngx_queue_empty(&ngx_llmgw_v8_pending) && !ngx_llmgw_v8_kick.posted) {
        ngx_post_event(&ngx_llmgw_v8_kick, &ngx_posted_events);
    }
}


static void
ngx_llmgw_v8_fail_pending(const char *why)
{
    ngx_queue_t          *q;
    ngx_llmgw_v8_call_t  *call;

    while (!ngx_queue_empty(&ngx_llmgw_v8_pending)) {
        q = ngx_queue_head(&ngx_llmgw_v8_pending);
        ngx_queue_remove(q);

        call = ngx_queue_data(q, ngx_llmgw_v8_call_t, queue);

        ngx_llmgw_v8_finish(call, NGX_DECLINED, (u_char *) why,
                            ngx_strlen(why));
    }
}


static void
ngx_llmgw_v8_fail(ngx_llmgw_v8_conn_t *vc, const char *why)
{
    ngx_llmgw_v8_fail_as(vc, NGX_ERROR, why);
}


/* Ends a connection and answers its call with rc and why. */
static void
ngx_llmgw_v8_fail_as(ngx_llmgw_v8_conn_t *vc, ngx_int_t rc, const char *why)
{
    ngx_llmgw_v8_call_t  *call;

    ngx_log_error(NGX_LOG_ERR, ngx_llmgw_v8_log, 0,
                  "llmgw: v8_host call failed: %s", why);

    call = vc->call;

    ngx_llmgw_v8_close(vc);

    if (call) {
        ngx_llmgw_v8_finish(call, rc, (u_char *) why, ngx_strlen(why));
    }

    /* from a posted event: a failure met while dispatching must not
       dispatch again inside itself */
    if (!ngx_queue_empty(&ngx_llmgw_v8_pending) && !ngx_llmgw_v8_kick.posted) {
        ngx_post_event(&ngx_llmgw_v8_kick, &ngx_posted_events);
    }
}


/* Closes and frees a connection of either list. */
static void
ngx_llmgw_v8_close(ngx_llmgw_v8_conn_t *vc)
{
    ngx_queue_remove(&vc->queue);

    if (vc->idle) {
        ngx_llmgw_v8_nidle--;
    }

    if (vc->body) {
        ngx_free(vc->body);
    }

    if (vc->c) {
        ngx_close_connection(vc->c);
    }

    ngx_free(vc);
}


/*
 * A hook of a published source.  The helper keeps compiled sources by sha
 * and may have lost them (a restart, another helper worker): then the
 * source is read from PostgreSQL, loaded, and the call made once more.
 */

struct ngx_llmgw_hook_s {
    char                       sha[65];
    u_char                    *body;
    size_t                     len;
    ngx_llmgw_v8_handler_pt    handler;     /* NULL: cancelled */
    void                      *data;
    ngx_llmgw_v8_call_t       *call;        /* its CALL or LOAD in flight */
    ngx_uint_t                 reloaded;
};


static void ngx_llmgw_hook_replied(void *data, ngx_int_t rc, u_char *body,
    size_t len);
static void ngx_llmgw_hook_source(void *data, PGresult *res,
    const char *err);
static void ngx_llmgw_hook_loaded(void *data, ngx_int_t rc, u_char *body,
    size_t len);


static void
ngx_llmgw_hook_done(ngx_llmgw_hook_t *h, ngx_int_t rc, u_char *body,
    size_t len)
{
    if (h->handler != NULL) {
        h->handler(h->data, rc, body, len);
    }

    ngx_free(h);
}


ngx_int_t
ngx_llmgw_hook(const char *sha, u_char *body, size_t len,
    ngx_llmgw_v8_handler_pt handler, void *data, ngx_llmgw_hook_t **hookp)
{
    ngx_int_t          rc;
    ngx_llmgw_hook_t  *h;

    h = ngx_alloc(sizeof(ngx_llmgw_hook_t) + len, ngx_llmgw_v8_log);
    if (h == NULL) {
        return NGX_ERROR;
    }

    ngx_cpystrn((u_char *) h->sha, (u_char *) sha, sizeof(h->sha));
    h->body = (u_char *) (h + 1);
    h->len = len;
    ngx_memcpy(h->body, body, len);
    h->handler = handler;
    h->data = data;
    h->call = NULL;
    h->reloaded = 0;

    rc = ngx_llmgw_v8_send(LLMGW_FRAME_CALL, h->body, h->len,
                           ngx_llmgw_hook_replied, h, &h->call);
    if (rc != NGX_OK) {
        ngx_free(h);
        return rc;
    }

    if (hookp != NULL) {
        *hookp = h;
    }

    return NGX_OK;
}


void
ngx_llmgw_hook_cancel(ngx_llmgw_hook_t *h)
{
    h->handler = NULL;

    if (h->call != NULL) {
        ngx_llmgw_v8_cancel(h->call);
        ngx_free(h);
    }

    /* else the statement reading its source is under way: its answer
       frees the hook */
}


static void
ngx_llmgw_hook_replied(void *data, ngx_int_t rc, u_char *body, size_t len)
{
    ngx_llmgw_hook_t  *h = data;
    const char        *params[1];

    h->call = NULL;

    if (rc != NGX_OK || h->reloaded
        || !llmgw_plugin_not_loaded((char *) body, len))
    {
        ngx_llmgw_hook_done(h, rc, body, len);
        return;
    }

    params[0] = h->sha;

    if (ngx_llmgw_pg_query("select llmgw_plugin_source($1)", 1, params, NULL,
                           ngx_llmgw_hook_source, h)
        != NGX_OK)
    {
        ngx_llmgw_hook_done(h, NGX_ERROR,
                            (u_char *) "the database queue is full", 26);
    }
}


static void
ngx_llmgw_hook_source(void *data, PGresult *res, const char *err)
{
    ngx_llmgw_hook_t *h = data;

    static const char  unknown[] = "the plugin source is not stored";

    llmgw_buf_t  load;
    llmgw_verdict_t  v;

    if (h->handler == NULL) {
        ngx_free(h);
        return;
    }

    if (err != NULL) {
        ngx_llmgw_hook_done(h, NGX_ERROR, (u_char *) err, ngx_strlen(err));
        return;
    }

    if (PQntuples(res) != 1 || PQgetisnull(res, 0, 0)) {
        ngx_llmgw_hook_done(h, NGX_ERROR, (u_char *) unknown,
                            sizeof(unknown) - 1);
        return;
    }

    load.data = NULL;

    if (llmgw_plugin_source_request(PQgetvalue(res, 0, 0),
                                    PQgetlength(res, 0, 0), &load, &v)
        != 0
        || ngx_llmgw_v8_send(LLMGW_FRAME_LOAD, (u_char *) load.data,
                             load.len, ngx_llmgw_hook_loaded, h, &h->call)
           != NGX_OK)
    {
        llmgw_buf_free(&load);
        ngx_llmgw_hook_done(h, NGX_ERROR,
                            (u_char *) "the plugin could not be loaded", 30);
        return;
    }

    llmgw_buf_free(&load);
}


static void
ngx_llmgw_hook_loaded(void *data, ngx_int_t rc, u_char *body, size_t len)
{
    ngx_llmgw_hook_t  *h = data;

    char             sha[65];
    llmgw_verdict_t  v;

    h->call = NULL;

    if (rc != NGX_OK
        || llmgw_plugin_load_reply((char *) body, len, sha, &v) != 0)
    {
        ngx_llmgw_hook_done(h, rc == NGX_OK ? NGX_ERROR : rc,
                            rc == NGX_OK ? (u_char *) v.message : body,
                            rc == NGX_OK ? ngx_strlen(v.message) : len);
        return;
    }

    h->reloaded = 1;

    if (ngx_llmgw_v8_send(LLMGW_FRAME_CALL, h->body, h->len,
                          ngx_llmgw_hook_replied, h, &h->call)
        != NGX_OK)
    {
        ngx_llmgw_hook_done(h, NGX_ERROR,
                            (u_char *) "the plugin runtime is busy", 26);
    }
}
