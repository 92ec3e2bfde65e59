/*
 * llmgw's internal HTTP/1.1 client (see ngx_llmgw_http.h).
 *
 * One call: a posted event starts it (so done never runs inside
 * ngx_llmgw_http_start), the host is taken as an IP literal or resolved
 * with the http{} resolver, the addresses are tried in turn, TLS goes
 * through nginx's OpenSSL wrappers, the request is written from one buffer
 * and the response parsed as it arrives.  Every call has its own pool and
 * one timer, re-armed per phase and on every byte of progress.
 *
 * Connections are kept alive per worker, as nginx's upstream keepalive
 * module does: a call first takes an idle connection with the same scheme,
 * host name (which is also the SNI and the name the certificate was checked
 * against) and port, with its TLS session as it is; a successful call gives
 * its connection back when the response ended where its length or chunking
 * said, with nothing after it, over HTTP/1.1 without "Connection: close".
 * At most llmgw_keepalive connections wait, the least recently used goes
 * first, each for llmgw_keepalive_timeout; one the peer closes or writes
 * to meanwhile is dropped.  llmgw_keepalive 0 sends "Connection: close".
 *
 * Nothing here logs header values, URIs or bodies: they carry credentials.
 */

#include "ngx_llmgw_http.h"

#include <ngx_event.h>
#include <ngx_event_connect.h>


#define NGX_LLMGW_HTTP_BUFFER       16384   /* read buffer, first size */
#define NGX_LLMGW_HTTP_SEND_CHUNK   65536   /* the same length on a retry,
                                             * as SSL_write() wants */
#define NGX_LLMGW_HTTP_READS        32      /* reads per event, then yield */
#define NGX_LLMGW_HTTP_MAX_ADDRS    16
#define NGX_LLMGW_HTTP_ERR_LEN      256
#define NGX_LLMGW_HTTP_CONN_POOL    256     /* a connection's own pool */

/* as nginx's keepalive_time and keepalive_requests: old connections go, so
 * a changed DNS answer or a leaky server is not held on to for ever */
#define NGX_LLMGW_HTTP_KA_TIME      3600000
#define NGX_LLMGW_HTTP_KA_REQUESTS  1000


typedef enum {
    NGX_LLMGW_HTTP_PREPARE = 0,
    NGX_LLMGW_HTTP_RESOLVE,
    NGX_LLMGW_HTTP_CONNECT,
    NGX_LLMGW_HTTP_HANDSHAKE,
    NGX_LLMGW_HTTP_SEND,
    NGX_LLMGW_HTTP_READ
} ngx_llmgw_http_phase_e;


typedef enum {
    NGX_LLMGW_HTTP_STATUS_LINE = 0,
    NGX_LLMGW_HTTP_HEADER_LINE,
    NGX_LLMGW_HTTP_BODY
} ngx_llmgw_http_rstate_e;


typedef enum {
    NGX_LLMGW_HTTP_NO_BODY = 0,
    NGX_LLMGW_HTTP_LENGTH,
    NGX_LLMGW_HTTP_CHUNKED,
    NGX_LLMGW_HTTP_UNTIL_CLOSE
} ngx_llmgw_http_framing_e;


typedef enum {
    NGX_LLMGW_CHUNK_SIZE = 0,
    NGX_LLMGW_CHUNK_EXT,
    NGX_LLMGW_CHUNK_SIZE_LF,
    NGX_LLMGW_CHUNK_DATA,
    NGX_LLMGW_CHUNK_DATA_CR,
    NGX_LLMGW_CHUNK_DATA_LF,
    NGX_LLMGW_CHUNK_TRAILER,
    NGX_LLMGW_CHUNK_TRAILER_LINE,
    NGX_LLMGW_CHUNK_LAST_LF
} ngx_llmgw_http_chunk_e;


/* An idle connection and what it may be reused for. */
typedef struct {
    ngx_queue_t                queue;
    ngx_connection_t          *connection;
    ngx_uint_t                 tls;
    ngx_uint_t                 public_peer;  /* its address is public */
    in_port_t                  port;
    size_t                     host_len;
    u_char                     host[256];
} ngx_llmgw_http_idle_t;


struct ngx_llmgw_http_s {
    ngx_pool_t                *pool;
    ngx_log_t                  log;
    ngx_queue_t                queue;        /* the process's live calls */

    /* what to send and where */
    ngx_str_t                  host;         /* '\0'-terminated (SNI) */
    ngx_str_t                  name;         /* "host:port" for messages */
    in_port_t                  port;
    ngx_msec_t                 timeout;
    ngx_msec_t                 body_timeout; /* after the header */
    ngx_msec_t                 deadline;    /* absolute; 0: none */
    size_t                     max_body;
    ngx_buf_t                  out;

    ngx_int_t                (*on_headers)(void *data,
                                           ngx_llmgw_http_resp_t *resp);
    ngx_int_t                (*on_data)(void *data, u_char *p, size_t len);
    void                     (*done)(void *data, ngx_int_t rc,
                                     ngx_llmgw_http_resp_t *resp,
                                     const char *err);
    void                      *data;
    ngx_uint_t                *sent;         /* set when all was written */

    ngx_resolver_ctx_t        *rctx;
    ngx_addr_t                *addrs;
    ngx_uint_t                 naddrs;
    ngx_uint_t                 naddr;        /* the one being tried */
    ngx_uint_t                 refused;      /* not public (public_only) */
    ngx_peer_connection_t      peer;

    ngx_event_t                kick;         /* starts the call */
    ngx_event_t                timer;
    ngx_uint_t                 phase;

    /* the response */
    ngx_buf_t                 *in;
    ngx_uint_t                 rstate;
    size_t                     header_size;
    ngx_llmgw_http_resp_t      resp;
    off_t                      content_length;   /* -1: none */
    ngx_uint_t                 framing;
    off_t                      left;             /* by length */
    size_t                     body_size;        /* seen, also streamed */
    size_t                     body_cap;

    ngx_uint_t                 chunk_state;
    uint64_t                   chunk_size;
    ngx_uint_t                 chunk_digits;
    size_t                     chunk_extra;      /* extensions, trailers */

    ngx_int_t                  rc;
    const char                *err;

    unsigned                   tls:1;
    unsigned                   ip_literal:1;
    unsigned                   head:1;
    unsigned                   te:1;
    unsigned                   chunked:1;
    unsigned                   in_callback:1;
    unsigned                   cancelled:1;
    unsigned                   in_done:1;

    unsigned                   reused:1;     /* the connection was idle */
    unsigned                   resend:1;     /* may be sent twice */
    unsigned                   written:1;    /* the request is out whole */
    unsigned                   answered:1;   /* a response byte came */
    unsigned                   keepalive:1;  /* HTTP/1.1, no "close" */
    unsigned                   ended:1;      /* by the framing, exactly */
    unsigned                   paused:1;     /* the reader asked to wait */
    unsigned                   public_only:1;
    unsigned                   public_peer:1; /* the connection's address
                                               * passes the public check */
};


static ngx_int_t ngx_llmgw_http_fail(ngx_llmgw_http_t *h, ngx_int_t rc,
    const char *fmt, ...);
static const char *ngx_llmgw_http_check(ngx_llmgw_http_opts_t *o);
static ngx_int_t ngx_llmgw_http_names(ngx_llmgw_http_t *h, ngx_str_t *host);
static ngx_int_t ngx_llmgw_http_build(ngx_llmgw_http_t *h,
    ngx_llmgw_http_opts_t *o);
static void ngx_llmgw_http_kick(ngx_event_t *ev);
static ngx_int_t ngx_llmgw_http_begin(ngx_llmgw_http_t *h);
static ngx_int_t ngx_llmgw_http_resolve(ngx_llmgw_http_t *h);
static ngx_int_t ngx_llmgw_http_add_addr(ngx_llmgw_http_t *h,
    struct sockaddr *sa, socklen_t len);
static void ngx_llmgw_http_resolved(ngx_resolver_ctx_t *rctx);
static ngx_int_t ngx_llmgw_http_connect(ngx_llmgw_http_t *h);
static ngx_uint_t ngx_llmgw_http_addr_ok(ngx_addr_t *addr);
static ngx_int_t ngx_llmgw_http_connected(ngx_llmgw_http_t *h);
#if (NGX_SSL)
static ngx_int_t ngx_llmgw_http_handshake(ngx_llmgw_http_t *h);
static void ngx_llmgw_http_handshaked(ngx_connection_t *c);
static ngx_int_t ngx_llmgw_http_verify(ngx_llmgw_http_t *h);
static ngx_int_t ngx_llmgw_http_ssl_init(ngx_cycle_t *cycle,
    ngx_llmgw_main_conf_t *mcf);
#endif
static ngx_int_t ngx_llmgw_http_send(ngx_llmgw_http_t *h);
static ngx_int_t ngx_llmgw_http_retry(ngx_llmgw_http_t *h);
static void ngx_llmgw_http_write_handler(ngx_event_t *wev);
static void ngx_llmgw_http_read_handler(ngx_event_t *rev);
static ngx_int_t ngx_llmgw_http_read(ngx_llmgw_http_t *h);
static ngx_int_t ngx_llmgw_http_room(ngx_llmgw_http_t *h);
static ngx_int_t ngx_llmgw_http_process(ngx_llmgw_http_t *h);
static ngx_int_t ngx_llmgw_http_parse_header(ngx_llmgw_http_t *h);
static ngx_int_t ngx_llmgw_http_status_line(ngx_llmgw_http_t *h, u_char *p,
    u_char *end);
static ngx_int_t ngx_llmgw_http_header_line(ngx_llmgw_http_t *h, u_char *p,
    u_char *end);
static ngx_uint_t ngx_llmgw_http_has_close(u_char *p, u_char *end);
static ngx_int_t ngx_llmgw_http_header_done(ngx_llmgw_http_t *h);
static ngx_int_t ngx_llmgw_http_body(ngx_llmgw_http_t *h, u_char *p,
    u_char *last);
static ngx_int_t ngx_llmgw_http_chunked(ngx_llmgw_http_t *h, u_char *p,
    u_char *last);
static void ngx_llmgw_http_chunk_size_done(ngx_llmgw_http_t *h);
static void ngx_llmgw_http_ended(ngx_llmgw_http_t *h, size_t rest);
static ngx_int_t ngx_llmgw_http_deliver(ngx_llmgw_http_t *h, u_char *p,
    size_t n);
static ngx_int_t ngx_llmgw_http_eof(ngx_llmgw_http_t *h);
static ngx_int_t ngx_llmgw_http_too_large(ngx_llmgw_http_t *h);
static void ngx_llmgw_http_set_phase(ngx_llmgw_http_t *h, ngx_uint_t phase);
static void ngx_llmgw_http_arm(ngx_llmgw_http_t *h);
static void ngx_llmgw_http_timeout(ngx_event_t *ev);
static void ngx_llmgw_http_conclude(ngx_llmgw_http_t *h, ngx_int_t rc);
static void ngx_llmgw_http_finish(ngx_llmgw_http_t *h, ngx_int_t rc);
static void ngx_llmgw_http_release(ngx_llmgw_http_t *h, ngx_uint_t keep);
static void ngx_llmgw_http_free(ngx_llmgw_http_t *h);
static void ngx_llmgw_http_close(ngx_llmgw_http_t *h);
static void ngx_llmgw_http_close_connection(ngx_connection_t *c);
static ngx_connection_t *ngx_llmgw_http_idle_get(ngx_llmgw_http_t *h);
static ngx_uint_t ngx_llmgw_http_idle_put(ngx_llmgw_http_t *h);
static void ngx_llmgw_http_idle_handler(ngx_event_t *ev);
static void ngx_llmgw_http_idle_dummy(ngx_event_t *ev);
static u_char *ngx_llmgw_http_log_error(ngx_log_t *log, u_char *buf,
    size_t len);


/* indexed by ngx_llmgw_http_phase_e */
static const char  *ngx_llmgw_http_actions[] = {
    "starting",
    "resolving",
    "connecting",
    "TLS handshaking",
    "sending the request",
    "reading the response"
};

static const char  *ngx_llmgw_http_timeouts[] = {
    "starting the call to %V timed out",
    "resolving %V timed out",
    "connecting to %V timed out",
    "TLS handshake with %V timed out",
    "sending the request to %V timed out",
    "reading the response from %V timed out"
};


static ngx_llmgw_main_conf_t  *ngx_llmgw_http_mcf;
static ngx_queue_t             ngx_llmgw_http_calls = {
    &ngx_llmgw_http_calls, &ngx_llmgw_http_calls
};

/* idle connections, the most recently used first; unused items; none at
 * all when keep-alive is off */
static ngx_queue_t             ngx_llmgw_http_idle = {
    &ngx_llmgw_http_idle, &ngx_llmgw_http_idle
};
static ngx_queue_t             ngx_llmgw_http_spare = {
    &ngx_llmgw_http_spare, &ngx_llmgw_http_spare
};
static ngx_uint_t              ngx_llmgw_http_keepalive;
static ngx_msec_t              ngx_llmgw_http_idle_timeout;

#if (NGX_SSL)
static ngx_ssl_t              *ngx_llmgw_http_ssl;
static ngx_uint_t              ngx_llmgw_http_ssl_verify;
#endif


ngx_int_t
ngx_llmgw_http_init_process(ngx_cycle_t *cycle, ngx_llmgw_main_conf_t *mcf)
{
    ngx_uint_t              i;
    ngx_llmgw_http_idle_t  *items;

    ngx_llmgw_http_mcf = mcf;
    ngx_queue_init(&ngx_llmgw_http_calls);
    ngx_queue_init(&ngx_llmgw_http_idle);
    ngx_queue_init(&ngx_llmgw_http_spare);

    ngx_llmgw_http_keepalive = 0;
    ngx_llmgw_http_idle_timeout = mcf->keepalive_timeout;

    if (mcf->keepalive) {
        items = ngx_pcalloc(cycle->pool,
                            mcf->keepalive * sizeof(ngx_llmgw_http_idle_t));
        if (items == NULL) {
            return NGX_ERROR;
        }

        for (i = 0; i < mcf->keepalive; i++) {
            ngx_queue_insert_tail(&ngx_llmgw_http_spare, &items[i].queue);
        }

        ngx_llmgw_http_keepalive = mcf->keepalive;
    }

#if (NGX_SSL)
    return ngx_llmgw_http_ssl_init(cycle, mcf);
#else
    return NGX_OK;
#endif
}


void
ngx_llmgw_http_exit_process(ngx_cycle_t *cycle)
{
    ngx_queue_t            *q;
    ngx_llmgw_http_t       *h;
    ngx_llmgw_http_idle_t  *item;

    while (!ngx_queue_empty(&ngx_llmgw_http_calls)) {
        q = ngx_queue_head(&ngx_llmgw_http_calls);
        h = ngx_queue_data(q, ngx_llmgw_http_t, queue);
        ngx_llmgw_http_free(h);
    }

    while (!ngx_queue_empty(&ngx_llmgw_http_idle)) {
        q = ngx_queue_head(&ngx_llmgw_http_idle);
        ngx_queue_remove(q);
        item = ngx_queue_data(q, ngx_llmgw_http_idle_t, queue);
        ngx_llmgw_http_close_connection(item->connection);
    }

    ngx_queue_init(&ngx_llmgw_http_spare);
    ngx_llmgw_http_keepalive = 0;

#if (NGX_SSL)
    if (ngx_llmgw_http_ssl) {
        ngx_ssl_cleanup_ctx(ngx_llmgw_http_ssl);
        ngx_llmgw_http_ssl = NULL;
    }
#endif

    ngx_llmgw_http_mcf = NULL;
}


ngx_llmgw_http_t *
ngx_llmgw_http_start(ngx_llmgw_http_opts_t *opts, ngx_log_t *log)
{
    const char             *invalid;
    ngx_pool_t             *pool;
    ngx_llmgw_http_t       *h;
    ngx_llmgw_main_conf_t  *mcf;

    mcf = ngx_llmgw_http_mcf;

    pool = ngx_create_pool(4096, log);
    if (pool == NULL) {
        return NULL;
    }

    h = ngx_pcalloc(pool, sizeof(ngx_llmgw_http_t));
    if (h == NULL) {
        ngx_destroy_pool(pool);
        return NULL;
    }

    h->pool = pool;

    /* a copy: the caller's log (maybe a request's) may go first */
    h->log = *log;
    h->log.handler = ngx_llmgw_http_log_error;
    h->log.data = h;
    h->log.action = NULL;
    pool->log = &h->log;

    h->tls = opts->tls ? 1 : 0;
    h->port = opts->port ? opts->port : (h->tls ? 443 : 80);
    h->timeout = opts->timeout ? opts->timeout
                 : (mcf ? mcf->task_http_timeout : 60000);
    h->body_timeout = opts->body_timeout ? opts->body_timeout : h->timeout;
    h->deadline = opts->deadline;
    h->max_body = opts->max_body ? opts->max_body
                  : (mcf ? mcf->task_max_response : 16 * 1024 * 1024);
    h->max_body = ngx_min(h->max_body, NGX_MAX_SIZE_T_VALUE / 2);
    h->on_headers = opts->on_headers;
    h->on_data = opts->on_data;
    h->sent = opts->sent;
    h->resend = opts->resend;
    h->public_only = opts->public_only ? 1 : 0;
    h->done = opts->done;
    h->data = opts->data;
    h->content_length = -1;
    h->head = (opts->method.len == 4
               && ngx_strncmp(opts->method.data, "HEAD", 4) == 0);

    invalid = ngx_llmgw_http_check(opts);

    if (invalid) {
        /* reported from the posted event, like any failure */
        h->rc = NGX_ERROR;
        h->err = invalid;

    } else if (ngx_llmgw_http_names(h, &opts->host) != NGX_OK
               || ngx_llmgw_http_build(h, opts) != NGX_OK)
    {
        ngx_destroy_pool(pool);
        return NULL;
    }

    h->kick.handler = ngx_llmgw_http_kick;
    h->kick.data = h;
    h->kick.log = &h->log;

    h->timer.handler = ngx_llmgw_http_timeout;
    h->timer.data = h;
    h->timer.log = &h->log;

    ngx_queue_insert_tail(&ngx_llmgw_http_calls, &h->queue);

    ngx_post_event(&h->kick, &ngx_posted_events);

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, &h->log, 0,
                   "llmgw http: start %p %V", h, &h->name);

    return h;
}


void
ngx_llmgw_http_cancel(ngx_llmgw_http_t *h)
{
    if (h == NULL || h->in_done) {
        return;
    }

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, &h->log, 0,
                   "llmgw http: cancel %p", h);

    if (h->in_callback) {
        /* the callback's caller frees it once the callback returned */
        h->cancelled = 1;
        return;
    }

    ngx_llmgw_http_free(h);
}


void
ngx_llmgw_http_pause(ngx_llmgw_http_t *h)
{
    h->paused = 1;
}


void
ngx_llmgw_http_resume(ngx_llmgw_http_t *h)
{
    if (!h->paused) {
        return;
    }

    h->paused = 0;

    if (h->peer.connection != NULL && h->phase == NGX_LLMGW_HTTP_READ) {
        ngx_llmgw_http_arm(h);
        ngx_post_event(h->peer.connection->read, &ngx_posted_events);
    }
}


/* Sets the reason of a failure (in the call's pool); returns NGX_ERROR. */
static ngx_int_t
ngx_llmgw_http_fail(ngx_llmgw_http_t *h, ngx_int_t rc, const char *fmt, ...)
{
    u_char   *p, *last;
    va_list   args;

    h->rc = rc;

    p = ngx_pnalloc(h->pool, NGX_LLMGW_HTTP_ERR_LEN);
    if (p == NULL) {
        h->err = "out of memory";
        return NGX_ERROR;
    }

    va_start(args, fmt);
    last = ngx_vslprintf(p, p + NGX_LLMGW_HTTP_ERR_LEN - 1, fmt, args);
    va_end(args);

    *last = '\0';
    h->err = (const char *) p;

    return NGX_ERROR;
}


static ngx_uint_t
ngx_llmgw_http_tchar(u_char c)
{
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
        || (c >= '0' && c <= '9'))
    {
        return 1;
    }

    return c != '\0' && ngx_strchr("!#$%&'*+-.^_`|~", c) != NULL;
}


/*
 * The request line and Host value go on the wire as they are: a control
 * character or a space there would split or forge the request.
 */
static const char *
ngx_llmgw_http_check(ngx_llmgw_http_opts_t *o)
{
    size_t  i;
    u_char  c;

    if (o->method.len == 0 || o->method.len > 32) {
        return "invalid request method";
    }

    for (i = 0; i < o->method.len; i++) {
        if (!ngx_llmgw_http_tchar(o->method.data[i])) {
            return "invalid request method";
        }
    }

    if (o->host.len == 0 || o->host.len > 255) {
        return "invalid host";
    }

    for (i = 0; i < o->host.len; i++) {
        c = o->host.data[i];
        if (c <= ' ' || c >= 0x7f || c == '/' || c == '[' || c == ']') {
            return "invalid host";
        }
    }

    if (o->uri.len == 0 || o->uri.data[0] != '/') {
        return "invalid request target";
    }

    for (i = 0; i < o->uri.len; i++) {
        c = o->uri.data[i];
        if (c <= ' ' || c == 0x7f) {
            return "invalid request target";
        }
    }

    for (i = 0; i < o->host_header.len; i++) {
        c = o->host_header.data[i];
        if (c <= ' ' || c == 0x7f) {
            return "invalid Host header";
        }
    }

    if (o->headers.len
        && (o->headers.len < 2
            || o->headers.data[o->headers.len - 2] != CR
            || o->headers.data[o->headers.len - 1] != LF))
    {
        return "request header lines must end with CRLF";
    }

    return NULL;
}


static ngx_int_t
ngx_llmgw_http_names(ngx_llmgw_http_t *h, ngx_str_t *host)
{
    ngx_uint_t  v6;
#if (NGX_HAVE_INET6)
    u_char      addr6[16];
#endif

    h->host.data = ngx_pnalloc(h->pool, host->len + 1);
    if (h->host.data == NULL) {
        return NGX_ERROR;
    }

    ngx_cpystrn(h->host.data, host->data, host->len + 1);
    h->host.len = host->len;

    v6 = (ngx_strlchr(host->data, host->data + host->len, ':') != NULL);

    h->ip_literal = (ngx_inet_addr(host->data, host->len) != INADDR_NONE);

#if (NGX_HAVE_INET6)
    if (v6 && ngx_inet6_addr(host->data, host->len, addr6) == NGX_OK) {
        h->ip_literal = 1;
    }
#endif

    h->name.data = ngx_pnalloc(h->pool, host->len + sizeof("[]:65535"));
    if (h->name.data == NULL) {
        return NGX_ERROR;
    }

    h->name.len = ngx_sprintf(h->name.data, v6 ? "[%V]:%d" : "%V:%d",
                              &h->host, (int) h->port)
                  - h->name.data;

    return NGX_OK;
}


#define ngx_llmgw_http_method_is(m, s)                                       \
    ((m)->len == sizeof(s) - 1 && ngx_strncmp((m)->data, s, (m)->len) == 0)


static ngx_int_t
ngx_llmgw_http_build(ngx_llmgw_http_t *h, ngx_llmgw_http_opts_t *o)
{
    size_t      len;
    u_char     *p;
    ngx_uint_t  cl, v6, default_port;

    cl = (o->body.len > 0
          || ngx_llmgw_http_method_is(&o->method, "POST")
          || ngx_llmgw_http_method_is(&o->method, "PUT")
          || ngx_llmgw_http_method_is(&o->method, "PATCH"));

    v6 = (ngx_strlchr(h->host.data, h->host.data + h->host.len, ':')
          != NULL);
    default_port = (h->port == (h->tls ? 443 : 80));

    len = o->method.len + 1 + o->uri.len
          + sizeof(" HTTP/1.1" CRLF "Host: ") - 1
          + (o->host_header.len ? o->host_header.len
                                : h->host.len + sizeof("[]:65535") - 1)
          + sizeof(CRLF "Connection: keep-alive" CRLF) - 1
          + (cl ? sizeof("Content-Length: " CRLF) - 1 + NGX_SIZE_T_LEN : 0)
          + o->headers.len + sizeof(CRLF) - 1 + o->body.len;

    p = ngx_pnalloc(h->pool, len);
    if (p == NULL) {
        return NGX_ERROR;
    }

    h->out.start = p;
    h->out.pos = p;
    h->out.end = p + len;
    h->out.temporary = 1;

    p = ngx_cpymem(p, o->method.data, o->method.len);
    *p++ = ' ';
    p = ngx_cpymem(p, o->uri.data, o->uri.len);
    p = ngx_cpymem(p, " HTTP/1.1" CRLF "Host: ",
                   sizeof(" HTTP/1.1" CRLF "Host: ") - 1);

    if (o->host_header.len) {
        p = ngx_cpymem(p, o->host_header.data, o->host_header.len);

    } else {
        p = ngx_sprintf(p, v6 ? "[%V]" : "%V", &h->host);

        if (!default_port) {
            p = ngx_sprintf(p, ":%d", (int) h->port);
        }
    }

    if (ngx_llmgw_http_keepalive) {
        p = ngx_cpymem(p, CRLF "Connection: keep-alive" CRLF,
                       sizeof(CRLF "Connection: keep-alive" CRLF) - 1);

    } else {
        p = ngx_cpymem(p, CRLF "Connection: close" CRLF,
                       sizeof(CRLF "Connection: close" CRLF) - 1);
    }

    if (cl) {
        p = ngx_sprintf(p, "Content-Length: %uz" CRLF, o->body.len);
    }

    p = ngx_cpymem(p, o->headers.data, o->headers.len);
    *p++ = CR; *p++ = LF;
    p = ngx_cpymem(p, o->body.data, o->body.len);

    h->out.last = p;

    return NGX_OK;
}


static void
ngx_llmgw_http_kick(ngx_event_t *ev)
{
    ngx_llmgw_http_t  *h = ev->data;

    if (h->err) {
        ngx_llmgw_http_finish(h, h->rc);
        return;
    }

    ngx_llmgw_http_conclude(h, ngx_llmgw_http_begin(h));
}


static ngx_int_t
ngx_llmgw_http_begin(ngx_llmgw_http_t *h)
{
    ngx_connection_t  *c;

    c = ngx_llmgw_http_idle_get(h);

    if (c == NULL) {
        return ngx_llmgw_http_resolve(h);
    }

    h->peer.connection = c;
    h->peer.name = &h->name;
    h->peer.log = &h->log;
    h->reused = 1;

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, &h->log, 0,
                   "llmgw http: reusing connection %p to %V", c, &h->name);

    ngx_llmgw_http_set_phase(h, NGX_LLMGW_HTTP_SEND);

    return ngx_llmgw_http_send(h);
}


/* Finds the addresses of the host, then connects. */
static ngx_int_t
ngx_llmgw_http_resolve(ngx_llmgw_http_t *h)
{
    in_addr_t            inaddr;
    ngx_resolver_t      *resolver;
    struct sockaddr_in   sin;
    ngx_resolver_ctx_t  *rctx;
#if (NGX_HAVE_INET6)
    struct sockaddr_in6  sin6;
#endif

    inaddr = ngx_inet_addr(h->host.data, h->host.len);

    /* loopback mock servers and sidecars work without a resolver */
    if (inaddr == INADDR_NONE
        && h->host.len == sizeof("localhost") - 1
        && ngx_strncasecmp(h->host.data, (u_char *) "localhost",
                           h->host.len) == 0)
    {
        inaddr = htonl(INADDR_LOOPBACK);
    }

    if (inaddr != INADDR_NONE) {
        ngx_memzero(&sin, sizeof(struct sockaddr_in));
        sin.sin_family = AF_INET;
        sin.sin_addr.s_addr = inaddr;

        if (ngx_llmgw_http_add_addr(h, (struct sockaddr *) &sin,
                                    sizeof(struct sockaddr_in))
            != NGX_OK)
        {
            return ngx_llmgw_http_fail(h, NGX_ERROR, "out of memory");
        }

        return ngx_llmgw_http_connect(h);
    }

#if (NGX_HAVE_INET6)
    ngx_memzero(&sin6, sizeof(struct sockaddr_in6));

    if (ngx_inet6_addr(h->host.data, h->host.len, sin6.sin6_addr.s6_addr)
        == NGX_OK)
    {
        sin6.sin6_family = AF_INET6;

        if (ngx_llmgw_http_add_addr(h, (struct sockaddr *) &sin6,
                                    sizeof(struct sockaddr_in6))
            != NGX_OK)
        {
            return ngx_llmgw_http_fail(h, NGX_ERROR, "out of memory");
        }

        return ngx_llmgw_http_connect(h);
    }
#endif

    /*
     * Without a "resolver" directive nginx still makes an empty resolver
     * for the http{} block: ngx_resolve_start() then says NGX_NO_RESOLVER.
     */
    resolver = ngx_llmgw_http_mcf ? ngx_llmgw_http_mcf->resolver : NULL;
    rctx = resolver ? ngx_resolve_start(resolver, NULL) : NGX_NO_RESOLVER;

    if (rctx == NULL) {
        return ngx_llmgw_http_fail(h, NGX_ERROR, "out of memory");
    }

    if (rctx == NGX_NO_RESOLVER) {
        return ngx_llmgw_http_fail(h, NGX_ERROR,
                                   "no resolver configured for %V",
                                   &h->host);
    }

    rctx->name = h->host;
    rctx->handler = ngx_llmgw_http_resolved;
    rctx->data = h;
    rctx->timeout = ngx_llmgw_http_mcf->resolver_timeout
                    ? ngx_llmgw_http_mcf->resolver_timeout : 30000;

    h->rctx = rctx;
    ngx_llmgw_http_set_phase(h, NGX_LLMGW_HTTP_RESOLVE);

    if (ngx_resolve_name(rctx) != NGX_OK) {
        /* the resolver freed rctx and did not call the handler */
        h->rctx = NULL;
        return ngx_llmgw_http_fail(h, NGX_ERROR, "could not resolve %V",
                                   &h->host);
    }

    /*
     * A cached answer calls the handler from inside ngx_resolve_name(),
     * which may have finished and freed the call: h is not touched again.
     */
    return NGX_AGAIN;
}


static ngx_int_t
ngx_llmgw_http_add_addr(ngx_llmgw_http_t *h, struct sockaddr *sa,
    socklen_t len)
{
    u_char      *p;
    ngx_addr_t  *a;

    if (h->addrs == NULL) {
        h->addrs = ngx_pcalloc(h->pool,
                               NGX_LLMGW_HTTP_MAX_ADDRS * sizeof(ngx_addr_t));
        if (h->addrs == NULL) {
            return NGX_ERROR;
        }
    }

    if (h->naddrs == NGX_LLMGW_HTTP_MAX_ADDRS) {
        return NGX_OK;
    }

    a = &h->addrs[h->naddrs];

    a->sockaddr = ngx_palloc(h->pool, len);
    if (a->sockaddr == NULL) {
        return NGX_ERROR;
    }

    ngx_memcpy(a->sockaddr, sa, len);
    a->socklen = len;
    ngx_inet_set_port(a->sockaddr, h->port);

    p = ngx_pnalloc(h->pool, NGX_SOCKADDR_STRLEN);
    if (p == NULL) {
        return NGX_ERROR;
    }

    a->name.data = p;
    a->name.len = ngx_sock_ntop(a->sockaddr, len, p, NGX_SOCKADDR_STRLEN, 1);

    h->naddrs++;

    return NGX_OK;
}


static void
ngx_llmgw_http_resolved(ngx_resolver_ctx_t *rctx)
{
    ngx_llmgw_http_t *h = rctx->data;

    ngx_int_t   rc;
    ngx_uint_t  i;

    if (rctx->state || rctx->naddrs == 0) {
        rc = (rctx->state == NGX_RESOLVE_TIMEDOUT) ? NGX_ETIMEDOUT
                                                   : NGX_ERROR;
        (void) ngx_llmgw_http_fail(h, rc, "%V could not be resolved (%s)",
                                   &h->host,
                                   rctx->state
                                   ? ngx_resolver_strerror(rctx->state)
                                   : "no addresses");

        /* ngx_llmgw_http_release() ends the resolving */
        ngx_llmgw_http_finish(h, rc);
        return;
    }

    for (i = 0; i < rctx->naddrs; i++) {
        if (ngx_llmgw_http_add_addr(h, rctx->addrs[i].sockaddr,
                                    rctx->addrs[i].socklen)
            != NGX_OK)
        {
            (void) ngx_llmgw_http_fail(h, NGX_ERROR, "out of memory");
            ngx_llmgw_http_finish(h, NGX_ERROR);
            return;
        }
    }

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, &h->log, 0,
                   "llmgw http: %V resolved, %ui addresses",
                   &h->host, h->naddrs);

    ngx_resolve_name_done(rctx);
    h->rctx = NULL;

    ngx_llmgw_http_conclude(h, ngx_llmgw_http_connect(h));
}


/* Tries the addresses in turn until one accepts or starts connecting. */
static ngx_int_t
ngx_llmgw_http_connect(ngx_llmgw_http_t *h)
{
    ngx_int_t          rc;
    ngx_addr_t        *addr;
    ngx_connection_t  *c;

    for ( ;; ) {
        if (h->naddr >= h->naddrs) {
            if (h->refused && h->refused == h->naddrs) {
                return ngx_llmgw_http_fail(h, NGX_ERROR,
                                           h->ip_literal
                                           ? "%V is not a public address"
                                           : "%V has no public address",
                                           &h->name);
            }

            return ngx_llmgw_http_fail(h, NGX_ERROR,
                                       "could not connect to %V", &h->name);
        }

        addr = &h->addrs[h->naddr];

        /* checked here, on the address connected to: a name that resolves
         * to 127.0.0.1 is 127.0.0.1, whatever the URL said */
        h->public_peer = ngx_llmgw_http_addr_ok(addr);

        if (h->public_only && !h->public_peer) {
            ngx_log_error(NGX_LOG_WARN, &h->log, 0,
                          "llmgw http: %V is not a public address: refused "
                          "for a content request (llmgw_content_allow_private)",
                          &addr->name);
            h->refused++;
            h->naddr++;
            continue;
        }

        ngx_memzero(&h->peer, sizeof(ngx_peer_connection_t));
        h->peer.sockaddr = addr->sockaddr;
        h->peer.socklen = addr->socklen;
        h->peer.name = &addr->name;
        h->peer.get = ngx_event_get_peer;
        h->peer.log = &h->log;
        h->peer.log_error = NGX_ERROR_INFO;

        ngx_llmgw_http_set_phase(h, NGX_LLMGW_HTTP_CONNECT);

        rc = ngx_event_connect_peer(&h->peer);

        ngx_log_debug3(NGX_LOG_DEBUG_HTTP, &h->log, 0,
                       "llmgw http: connect %V (%ui/%ui)", &addr->name,
                       h->naddr + 1, h->naddrs);

        if (rc == NGX_ERROR) {
            return ngx_llmgw_http_fail(h, NGX_ERROR,
                                       "could not connect to %V", &h->name);
        }

        if (rc == NGX_BUSY || rc == NGX_DECLINED) {
            /* the connection is already closed */
            h->naddr++;
            continue;
        }

        c = h->peer.connection;

        /* its own: the TLS state in it may outlive the call when idle */
        c->pool = ngx_create_pool(NGX_LLMGW_HTTP_CONN_POOL, &h->log);
        if (c->pool == NULL) {
            ngx_llmgw_http_close(h);
            return ngx_llmgw_http_fail(h, NGX_ERROR, "out of memory");
        }

        c->data = h;
        c->read->handler = ngx_llmgw_http_read_handler;
        c->write->handler = ngx_llmgw_http_write_handler;

        if (rc == NGX_AGAIN) {
            return NGX_AGAIN;
        }

        return ngx_llmgw_http_connected(h);
    }
}


/* Whether a content request a plugin chose may connect to addr. */
static ngx_uint_t
ngx_llmgw_http_addr_ok(ngx_addr_t *addr)
{
    const uint8_t        *a;
    llmgw_iplist_t       *allow;
#if (NGX_HAVE_INET6)
    struct sockaddr_in6  *sin6;
#endif

    allow = ngx_llmgw_http_mcf ? ngx_llmgw_http_mcf->content_allow : NULL;

    switch (addr->sockaddr->sa_family) {

    case AF_INET:
        a = (const uint8_t *)
            &((struct sockaddr_in *) addr->sockaddr)->sin_addr.s_addr;
        return llmgw_content_addr_ok(allow, AF_INET, a);

#if (NGX_HAVE_INET6)
    case AF_INET6:
        sin6 = (struct sockaddr_in6 *) addr->sockaddr;
        return llmgw_content_addr_ok(allow, AF_INET6, sin6->sin6_addr.s6_addr);
#endif

    default:
        return 0;
    }
}


/*
 * A non-blocking connect() is over when the socket turns writable (or, with
 * epoll, readable on an error): SO_ERROR tells how it went.
 */
static ngx_int_t
ngx_llmgw_http_connected(ngx_llmgw_http_t *h)
{
    int                err;
    socklen_t          len;
    ngx_connection_t  *c;

    c = h->peer.connection;

    err = 0;
    len = sizeof(int);

    if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, (void *) &err, &len) == -1) {
        err = ngx_socket_errno;
    }

    if (err) {
        ngx_log_error(NGX_LOG_INFO, c->log, err, "connect() to %V failed",
                      h->peer.name);

        ngx_llmgw_http_close(h);
        h->naddr++;

        return ngx_llmgw_http_connect(h);
    }

#if (NGX_SSL)
    if (h->tls) {
        return ngx_llmgw_http_handshake(h);
    }
#else
    if (h->tls) {
        return ngx_llmgw_http_fail(h, NGX_ERROR,
                                   "TLS is not available in this build");
    }
#endif

    ngx_llmgw_http_set_phase(h, NGX_LLMGW_HTTP_SEND);

    return ngx_llmgw_http_send(h);
}


#if (NGX_SSL)

static ngx_int_t
ngx_llmgw_http_handshake(ngx_llmgw_http_t *h)
{
    ngx_int_t          rc;
    ngx_connection_t  *c;

    c = h->peer.connection;

    ngx_llmgw_http_set_phase(h, NGX_LLMGW_HTTP_HANDSHAKE);

    if (ngx_llmgw_http_ssl == NULL) {
        return ngx_llmgw_http_fail(h, NGX_ERROR,
                                   "TLS is not available (the trusted "
                                   "certificates could not be loaded, "
                                   "see the error log)");
    }

    if (ngx_ssl_create_connection(ngx_llmgw_http_ssl, c,
                                  NGX_SSL_BUFFER|NGX_SSL_CLIENT)
        != NGX_OK)
    {
        return ngx_llmgw_http_fail(h, NGX_ERROR, "TLS setup for %V failed",
                                   &h->name);
    }

    c->sendfile = 0;

    /* RFC 6066: no IP literals in SNI */
    if (!h->ip_literal
        && SSL_set_tlsext_host_name(c->ssl->connection,
                                    (char *) h->host.data)
           == 0)
    {
        ngx_ssl_error(NGX_LOG_ERR, &h->log, 0,
                      "SSL_set_tlsext_host_name(\"%s\") failed",
                      h->host.data);
        return ngx_llmgw_http_fail(h, NGX_ERROR, "TLS setup for %V failed",
                                   &h->name);
    }

    rc = ngx_ssl_handshake(c);

    if (rc == NGX_AGAIN) {
        /* ngx_ssl_handshake() took over both event handlers */
        c->ssl->handler = ngx_llmgw_http_handshaked;
        return NGX_AGAIN;
    }

    return ngx_llmgw_http_verify(h);
}


static void
ngx_llmgw_http_handshaked(ngx_connection_t *c)
{
    ngx_llmgw_http_t  *h = c->data;

    c->read->handler = ngx_llmgw_http_read_handler;
    c->write->handler = ngx_llmgw_http_write_handler;

    ngx_llmgw_http_conclude(h, ngx_llmgw_http_verify(h));
}


/*
 * As nginx's proxy does, the context verifies nothing during the handshake
 * (SSL_VERIFY_NONE) and the result is checked here: that gives a clear
 * reason instead of a handshake alert.
 */
static ngx_int_t
ngx_llmgw_http_verify(ngx_llmgw_http_t *h)
{
    long               rc;
    X509              *cert;
    ngx_int_t          ok;
    ngx_connection_t  *c;

    c = h->peer.connection;

    if (!c->ssl->handshaked) {
        return ngx_llmgw_http_fail(h, NGX_ERROR, "TLS handshake with %V "
                                   "failed", &h->name);
    }

    if (ngx_llmgw_http_ssl_verify) {
        rc = SSL_get_verify_result(c->ssl->connection);

        if (rc != X509_V_OK) {
            return ngx_llmgw_http_fail(h, NGX_ERROR, "the TLS certificate "
                                       "of %V is not trusted (%s)",
                                       &h->name,
                                       X509_verify_cert_error_string(rc));
        }

        if (h->ip_literal) {
            /* ngx_ssl_check_host() only knows DNS names */
            cert = SSL_get_peer_certificate(c->ssl->connection);
            ok = (cert != NULL
                  && X509_check_ip_asc(cert, (char *) h->host.data, 0) == 1);

            if (cert) {
                X509_free(cert);
            }

        } else {
            ok = (ngx_ssl_check_host(c, &h->host) == NGX_OK);
        }

        if (!ok) {
            return ngx_llmgw_http_fail(h, NGX_ERROR, "the TLS certificate "
                                       "of %V does not match the host",
                                       &h->name);
        }
    }

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, &h->log, 0,
                   "llmgw http: TLS with %V established", &h->name);

    ngx_llmgw_http_set_phase(h, NGX_LLMGW_HTTP_SEND);

    return ngx_llmgw_http_send(h);
}


/*
 * One client context per process.  A trusted certificate file that cannot
 * be loaded leaves the worker running with https calls failing and saying
 * why, rather than a worker that cannot start.
 */
static ngx_int_t
ngx_llmgw_http_ssl_init(ngx_cycle_t *cycle, ngx_llmgw_main_conf_t *mcf)
{
    u_char     *path;
    ngx_str_t   file;
    ngx_ssl_t  *ssl;

    ngx_llmgw_http_ssl_verify = mcf->task_ssl_verify ? 1 : 0;

    ssl = ngx_pcalloc(cycle->pool, sizeof(ngx_ssl_t));
    if (ssl == NULL) {
        return NGX_ERROR;
    }

    ssl->log = cycle->log;

    if (ngx_ssl_create(ssl, NGX_SSL_TLSv1_2|NGX_SSL_TLSv1_3, NULL)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    if (!ngx_llmgw_http_ssl_verify) {
        ngx_llmgw_http_ssl = ssl;
        return NGX_OK;
    }

    if (mcf->task_ssl_trusted_certificate.len == 0) {
        if (SSL_CTX_set_default_verify_paths(ssl->ctx) == 0) {
            ngx_ssl_error(NGX_LOG_ERR, cycle->log, 0,
                          "llmgw: SSL_CTX_set_default_verify_paths() "
                          "failed, task https calls will fail");
            ngx_ssl_cleanup_ctx(ssl);
            return NGX_OK;
        }

        ngx_llmgw_http_ssl = ssl;
        return NGX_OK;
    }

    file = mcf->task_ssl_trusted_certificate;

    if (ngx_get_full_name(cycle->pool, &cycle->conf_prefix, &file)
        != NGX_OK)
    {
        ngx_ssl_cleanup_ctx(ssl);
        return NGX_ERROR;
    }

    path = ngx_pnalloc(cycle->pool, file.len + 1);
    if (path == NULL) {
        ngx_ssl_cleanup_ctx(ssl);
        return NGX_ERROR;
    }

    ngx_cpystrn(path, file.data, file.len + 1);

    if (SSL_CTX_load_verify_locations(ssl->ctx, (char *) path, NULL) == 0) {
        ngx_ssl_error(NGX_LOG_ERR, cycle->log, 0,
                      "llmgw: \"llmgw_task_ssl_trusted_certificate\" \"%s\" "
                      "could not be loaded, task https calls will fail",
                      path);
        ngx_ssl_cleanup_ctx(ssl);
        return NGX_OK;
    }

    ngx_llmgw_http_ssl = ssl;

    return NGX_OK;
}

#endif


static ngx_int_t
ngx_llmgw_http_send(ngx_llmgw_http_t *h)
{
    size_t             size;
    ssize_t            n;
    ngx_buf_t         *b;
    ngx_connection_t  *c;

    c = h->peer.connection;
    b = &h->out;

    while (b->pos < b->last) {
        size = ngx_min((size_t) (b->last - b->pos),
                       NGX_LLMGW_HTTP_SEND_CHUNK);

        n = c->send(c, b->pos, size);

        if (n == NGX_ERROR) {
            if (h->reused && !h->answered) {
                return ngx_llmgw_http_retry(h);
            }

            return ngx_llmgw_http_fail(h, NGX_ERROR, "sending the request "
                                       "to %V failed", &h->name);
        }

        if (n == NGX_AGAIN || n == 0) {
            if (ngx_handle_write_event(c->write, 0) != NGX_OK) {
                return ngx_llmgw_http_fail(h, NGX_ERROR, "sending the "
                                           "request to %V failed", &h->name);
            }

            return NGX_AGAIN;
        }

        b->pos += n;
        ngx_llmgw_http_arm(h);
    }

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, &h->log, 0,
                   "llmgw http: request of %uz bytes sent to %V",
                   (size_t) (b->last - b->start), &h->name);

    h->written = 1;

    /* on a reused connection only once it is known not to be retried */
    if (h->sent != NULL && !h->reused) {
        *h->sent = 1;
    }

    ngx_llmgw_http_set_phase(h, NGX_LLMGW_HTTP_READ);

    /* level-triggered event methods would report writability forever */
    if (ngx_handle_write_event(c->write, 0) != NGX_OK) {
        return ngx_llmgw_http_fail(h, NGX_ERROR, "sending the request to %V "
                                   "failed", &h->name);
    }

    if (c->read->ready) {
        return ngx_llmgw_http_read(h);
    }

    return NGX_AGAIN;
}


/*
 * A reused connection that failed before any byte of the response came was
 * most likely closed by the peer while it sat idle, the classic keep-alive
 * race: the peer's idle timeout ends as the request goes out.  The call is
 * tried once more on a new connection when the request was not written
 * whole (the server cannot have acted on it), or when the caller says it
 * may be sent twice (opts.resend: polls and downloads).  A submit written
 * whole is not sent again, as nginx's upstream does not resend a POST
 * without "non_idempotent"; the engine reports it as sent.  opts.sent is
 * only set for the attempt that counts.  A timeout is not retried: a peer
 * that says nothing has not closed the connection.
 */
static ngx_int_t
ngx_llmgw_http_retry(ngx_llmgw_http_t *h)
{
    ngx_log_error(NGX_LOG_INFO, &h->log, 0,
                  "llmgw: kept-alive connection to %V was closed, "
                  "trying a new one", &h->name);

    ngx_llmgw_http_close(h);

    h->reused = 0;
    h->written = 0;
    h->out.pos = h->out.start;

    return ngx_llmgw_http_resolve(h);
}


static void
ngx_llmgw_http_write_handler(ngx_event_t *wev)
{
    ngx_int_t          rc;
    ngx_connection_t  *c;
    ngx_llmgw_http_t  *h;

    c = wev->data;
    h = c->data;

    switch (h->phase) {

    case NGX_LLMGW_HTTP_CONNECT:
        rc = ngx_llmgw_http_connected(h);
        break;

    case NGX_LLMGW_HTTP_SEND:
        rc = ngx_llmgw_http_send(h);
        break;

    default:
        return;
    }

    ngx_llmgw_http_conclude(h, rc);
}


static void
ngx_llmgw_http_read_handler(ngx_event_t *rev)
{
    ngx_int_t          rc;
    ngx_connection_t  *c;
    ngx_llmgw_http_t  *h;

    c = rev->data;
    h = c->data;

    switch (h->phase) {

    case NGX_LLMGW_HTTP_CONNECT:
        rc = ngx_llmgw_http_connected(h);
        break;

    /* a server may answer (an error, say) before it read the whole body */
    case NGX_LLMGW_HTTP_SEND:
    case NGX_LLMGW_HTTP_READ:
        rc = ngx_llmgw_http_read(h);
        break;

    default:
        return;
    }

    ngx_llmgw_http_conclude(h, rc);
}


/*
 * Returns NGX_AGAIN (wait), NGX_OK (the response is complete), NGX_ERROR
 * (h->rc and h->err say why) or NGX_ABORT (cancelled in a callback).
 */
static ngx_int_t
ngx_llmgw_http_read(ngx_llmgw_http_t *h)
{
    ssize_t            n;
    ngx_int_t          rc;
    ngx_uint_t         i;
    ngx_buf_t         *b;
    ngx_connection_t  *c;

    c = h->peer.connection;

    if (h->in == NULL) {
        h->in = ngx_create_temp_buf(h->pool, NGX_LLMGW_HTTP_BUFFER);
        if (h->in == NULL) {
            return ngx_llmgw_http_fail(h, NGX_ERROR, "out of memory");
        }
    }

    for (i = 0; i < NGX_LLMGW_HTTP_READS; i++) {

        if (h->paused) {
            /* nothing is read, and no time runs out, until resumed */
            if (h->timer.timer_set) {
                ngx_del_timer(&h->timer);
            }
            return NGX_AGAIN;
        }

        if (ngx_llmgw_http_room(h) != NGX_OK) {
            return NGX_ERROR;
        }

        b = h->in;

        n = c->recv(c, b->last, b->end - b->last);

        if (n == NGX_AGAIN) {
            if (ngx_handle_read_event(c->read, 0) != NGX_OK) {
                return ngx_llmgw_http_fail(h, NGX_ERROR, "reading the "
                                           "response from %V failed",
                                           &h->name);
            }

            return NGX_AGAIN;
        }

        if (n == NGX_ERROR || n == 0) {
            /* the whole request went out: only a call that may be made
             * twice is retried (a submit is not: a second task would be
             * billed) */
            if (h->reused && !h->answered && h->resend) {
                return ngx_llmgw_http_retry(h);
            }

            if (n == 0) {
                return ngx_llmgw_http_eof(h);
            }

            return ngx_llmgw_http_fail(h, NGX_ERROR, "reading the response "
                                       "from %V failed", &h->name);
        }

        h->answered = 1;
        b->last += n;
        ngx_llmgw_http_arm(h);

        rc = ngx_llmgw_http_process(h);

        if (rc != NGX_AGAIN) {
            return rc;
        }
    }

    /* a fast peer must not keep the worker from its other connections */
    ngx_post_event(c->read, &ngx_posted_events);

    return NGX_AGAIN;
}


/* Makes room in the read buffer; the header may need it to grow. */
static ngx_int_t
ngx_llmgw_http_room(ngx_llmgw_http_t *h)
{
    size_t      size, n;
    u_char     *p;
    ngx_buf_t  *b;

    b = h->in;

    if (b->last < b->end) {
        return NGX_OK;
    }

    n = b->last - b->pos;

    if (b->pos > b->start) {
        /* parsed header lines were copied out: keep the partial line */
        ngx_memmove(b->start, b->pos, n);
        b->pos = b->start;
        b->last = b->start + n;
        return NGX_OK;
    }

    size = b->end - b->start;

    if (size >= NGX_LLMGW_HTTP_MAX_HEADER) {
        return ngx_llmgw_http_fail(h, NGX_ERROR, "the response header from "
                                   "%V is too large", &h->name);
    }

    p = ngx_palloc(h->pool, size * 2);
    if (p == NULL) {
        return ngx_llmgw_http_fail(h, NGX_ERROR, "out of memory");
    }

    ngx_memcpy(p, b->pos, n);
    ngx_pfree(h->pool, b->start);

    b->start = p;
    b->pos = p;
    b->last = p + n;
    b->end = p + size * 2;

    return NGX_OK;
}


static ngx_int_t
ngx_llmgw_http_process(ngx_llmgw_http_t *h)
{
    ngx_int_t   rc;
    ngx_buf_t  *b;

    b = h->in;

    if (h->rstate != NGX_LLMGW_HTTP_BODY) {
        rc = ngx_llmgw_http_parse_header(h);
        if (rc != NGX_OK) {
            return rc;
        }

        rc = ngx_llmgw_http_header_done(h);
        if (rc != NGX_AGAIN) {
            return rc;
        }

        /* the body's own timeout from here */
        ngx_llmgw_http_arm(h);
    }

    rc = ngx_llmgw_http_body(h, b->pos, b->last);

    b->pos = b->start;
    b->last = b->start;

    return rc;
}


/* NGX_OK once the empty line after the header was read. */
static ngx_int_t
ngx_llmgw_http_parse_header(ngx_llmgw_http_t *h)
{
    u_char     *p, *start, *end;
    ngx_int_t   rc;
    ngx_buf_t  *b;

    b = h->in;

    for ( ;; ) {
        p = ngx_strlchr(b->pos, b->last, LF);

        if (p == NULL) {
            if (h->header_size + (b->last - b->pos)
                > NGX_LLMGW_HTTP_MAX_HEADER)
            {
                return ngx_llmgw_http_fail(h, NGX_ERROR, "the response "
                                           "header from %V is too large",
                                           &h->name);
            }

            return NGX_AGAIN;
        }

        h->header_size += p + 1 - b->pos;

        if (h->header_size > NGX_LLMGW_HTTP_MAX_HEADER) {
            return ngx_llmgw_http_fail(h, NGX_ERROR, "the response header "
                                       "from %V is too large", &h->name);
        }

        start = b->pos;
        end = (p > start && p[-1] == CR) ? p - 1 : p;
        b->pos = p + 1;

        if (h->rstate == NGX_LLMGW_HTTP_STATUS_LINE) {
            rc = ngx_llmgw_http_status_line(h, start, end);
            if (rc != NGX_OK) {
                return rc;
            }

            h->rstate = NGX_LLMGW_HTTP_HEADER_LINE;
            continue;
        }

        if (end > start) {
            rc = ngx_llmgw_http_header_line(h, start, end);
            if (rc != NGX_OK) {
                return rc;
            }

            continue;
        }

        if (h->resp.status < 200 && h->resp.status != 101) {
            /* an interim response (100, 103): the final one follows */
            h->resp.headers.nelts = 0;
            h->content_length = -1;
            h->te = 0;
            h->chunked = 0;
            h->rstate = NGX_LLMGW_HTTP_STATUS_LINE;
            continue;
        }

        h->rstate = NGX_LLMGW_HTTP_BODY;

        return NGX_OK;
    }
}


/* "HTTP/1.x DDD[ reason]" */
static ngx_int_t
ngx_llmgw_http_status_line(ngx_llmgw_http_t *h, u_char *p, u_char *end)
{
    ngx_uint_t  i;

    if (end - p < 12
        || ngx_strncmp(p, "HTTP/1.", 7) != 0
        || p[7] < '0' || p[7] > '9'
        || p[8] != ' '
        || (end - p > 12 && p[12] != ' '))
    {
        goto invalid;
    }

    h->resp.status = 0;

    for (i = 9; i < 12; i++) {
        if (p[i] < '0' || p[i] > '9') {
            goto invalid;
        }

        h->resp.status = h->resp.status * 10 + (p[i] - '0');
    }

    if (h->resp.status < 100) {
        goto invalid;
    }

    /* an HTTP/1.0 server closes unless told otherwise: never reused */
    h->keepalive = (p[7] != '0');

    if (h->resp.headers.elts == NULL
        && ngx_array_init(&h->resp.headers, h->pool, 16,
                          sizeof(ngx_llmgw_http_header_t))
           != NGX_OK)
    {
        return ngx_llmgw_http_fail(h, NGX_ERROR, "out of memory");
    }

    return NGX_OK;

invalid:

    h->resp.status = 0;

    return ngx_llmgw_http_fail(h, NGX_ERROR, "invalid response status line "
                               "from %V", &h->name);
}


static ngx_int_t
ngx_llmgw_http_header_line(ngx_llmgw_http_t *h, u_char *p, u_char *end)
{
    u_char                   *colon, *v, *vend, *q;
    off_t                     n;
    ngx_llmgw_http_header_t  *hdr;

    if (*p == ' ' || *p == '\t') {
        return ngx_llmgw_http_fail(h, NGX_ERROR, "obsolete line folding in "
                                   "the response header from %V", &h->name);
    }

    colon = ngx_strlchr(p, end, ':');

    if (colon == NULL || colon == p) {
        goto invalid;
    }

    for (q = p; q < colon; q++) {
        if (!ngx_llmgw_http_tchar(*q)) {
            goto invalid;
        }
    }

    v = colon + 1;
    vend = end;

    while (v < vend && (*v == ' ' || *v == '\t')) {
        v++;
    }

    while (vend > v && (vend[-1] == ' ' || vend[-1] == '\t')) {
        vend--;
    }

    for (q = v; q < vend; q++) {
        if ((*q < ' ' && *q != '\t') || *q == 0x7f) {
            goto invalid;
        }
    }

    hdr = ngx_array_push(&h->resp.headers);
    if (hdr == NULL) {
        return ngx_llmgw_http_fail(h, NGX_ERROR, "out of memory");
    }

    hdr->name.len = colon - p;
    hdr->name.data = ngx_pnalloc(h->pool, hdr->name.len + 1);
    hdr->value.len = vend - v;
    hdr->value.data = ngx_pnalloc(h->pool, hdr->value.len + 1);

    if (hdr->name.data == NULL || hdr->value.data == NULL) {
        return ngx_llmgw_http_fail(h, NGX_ERROR, "out of memory");
    }

    ngx_strlow(hdr->name.data, p, hdr->name.len);
    hdr->name.data[hdr->name.len] = '\0';
    ngx_cpystrn(hdr->value.data, v, hdr->value.len + 1);

    if (hdr->name.len == sizeof("content-length") - 1
        && ngx_strncmp(hdr->name.data, "content-length", hdr->name.len) == 0)
    {
        n = ngx_atoof(v, vend - v);

        /* two different lengths make the framing ambiguous (smuggling) */
        if (n == NGX_ERROR
            || (h->content_length != -1 && h->content_length != n))
        {
            return ngx_llmgw_http_fail(h, NGX_ERROR, "invalid Content-Length "
                                       "in the response from %V", &h->name);
        }

        h->content_length = n;

    } else if (hdr->name.len == sizeof("transfer-encoding") - 1
               && ngx_strncmp(hdr->name.data, "transfer-encoding",
                              hdr->name.len) == 0)
    {
        /* only the last coding tells whether the body is chunked */
        q = vend;

        while (q > v && q[-1] != ',') {
            q--;
        }

        while (q < vend && (*q == ' ' || *q == '\t')) {
            q++;
        }

        h->te = 1;
        h->chunked = (vend - q == 7
                      && ngx_strncasecmp(q, (u_char *) "chunked", 7) == 0);

    } else if (hdr->name.len == sizeof("connection") - 1
               && ngx_strncmp(hdr->name.data, "connection", hdr->name.len)
                  == 0
               && ngx_llmgw_http_has_close(v, vend))
    {
        h->keepalive = 0;
    }

    return NGX_OK;

invalid:

    return ngx_llmgw_http_fail(h, NGX_ERROR, "invalid response header from "
                               "%V", &h->name);
}


/* Whether a Connection value lists "close". */
static ngx_uint_t
ngx_llmgw_http_has_close(u_char *p, u_char *end)
{
    u_char  *start, *last;

    while (p < end) {
        start = p;

        while (p < end && *p != ',') {
            p++;
        }

        last = p++;

        while (start < last && (*start == ' ' || *start == '\t')) {
            start++;
        }

        while (last > start && (last[-1] == ' ' || last[-1] == '\t')) {
            last--;
        }

        if (last - start == 5
            && ngx_strncasecmp(start, (u_char *) "close", 5) == 0)
        {
            return 1;
        }
    }

    return 0;
}


/* NGX_AGAIN: read the body; NGX_OK: the response is complete. */
static ngx_int_t
ngx_llmgw_http_header_done(ngx_llmgw_http_t *h)
{
    ngx_int_t   rc;
    ngx_uint_t  status, empty;

    status = h->resp.status;

    if (status == 101) {
        /* a switch of protocols never asked for: the connection is lost */
        h->keepalive = 0;
    }

    if (h->head || status < 200 || status == 204 || status == 304) {
        h->framing = NGX_LLMGW_HTTP_NO_BODY;

    } else if (h->te) {
        /* RFC 9112 6.3: Transfer-Encoding wins over Content-Length */
        h->framing = h->chunked ? NGX_LLMGW_HTTP_CHUNKED
                                : NGX_LLMGW_HTTP_UNTIL_CLOSE;

    } else if (h->content_length >= 0) {
        h->framing = NGX_LLMGW_HTTP_LENGTH;
        h->left = h->content_length;

        if ((uint64_t) h->content_length > (uint64_t) h->max_body) {
            return ngx_llmgw_http_too_large(h);
        }

    } else {
        h->framing = NGX_LLMGW_HTTP_UNTIL_CLOSE;
    }

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, &h->log, 0,
                   "llmgw http: status %ui from %V, framing %ui",
                   status, &h->name, h->framing);

    empty = (h->framing == NGX_LLMGW_HTTP_NO_BODY
             || (h->framing == NGX_LLMGW_HTTP_LENGTH && h->left == 0));

    if (empty) {
        ngx_llmgw_http_ended(h, h->in->last - h->in->pos);
    }

    if (h->on_headers) {
        h->in_callback = 1;
        rc = h->on_headers(h->data, &h->resp);
        h->in_callback = 0;

        if (h->cancelled) {
            return NGX_ABORT;
        }

        if (rc == NGX_DONE) {
            return NGX_OK;
        }

        if (rc != NGX_OK) {
            return ngx_llmgw_http_fail(h, NGX_ERROR, "the response from %V "
                                       "was refused", &h->name);
        }
    }

    if (empty) {
        return NGX_OK;
    }

    if (h->framing == NGX_LLMGW_HTTP_LENGTH && h->on_data == NULL) {
        h->body_cap = (size_t) h->left + 1;
        h->resp.body.data = ngx_pnalloc(h->pool, h->body_cap);
        if (h->resp.body.data == NULL) {
            return ngx_llmgw_http_fail(h, NGX_ERROR, "out of memory");
        }
    }

    return NGX_AGAIN;
}


static ngx_int_t
ngx_llmgw_http_body(ngx_llmgw_http_t *h, u_char *p, u_char *last)
{
    off_t      n;
    ngx_int_t  rc;

    switch (h->framing) {

    case NGX_LLMGW_HTTP_LENGTH:
        /* bytes past the length are ignored (the connection is not kept) */
        n = ngx_min((off_t) (last - p), h->left);
        h->left -= n;

        rc = ngx_llmgw_http_deliver(h, p, (size_t) n);
        if (rc != NGX_AGAIN) {
            return rc;
        }

        if (h->left) {
            return NGX_AGAIN;
        }

        ngx_llmgw_http_ended(h, (last - p) - n);

        return NGX_OK;

    case NGX_LLMGW_HTTP_CHUNKED:
        return ngx_llmgw_http_chunked(h, p, last);

    case NGX_LLMGW_HTTP_UNTIL_CLOSE:
        return ngx_llmgw_http_deliver(h, p, last - p);

    default:
        return NGX_OK;
    }
}


#define ngx_llmgw_http_chunk_invalid(h)                                      \
    ngx_llmgw_http_fail(h, NGX_ERROR, "invalid chunked body from %V",       \
                        &(h)->name)


static ngx_int_t
ngx_llmgw_http_chunked(ngx_llmgw_http_t *h, u_char *p, u_char *last)
{
    u_char     ch, d;
    size_t     n;
    ngx_int_t  rc;

    while (p < last) {
        ch = *p;

        switch (h->chunk_state) {

        case NGX_LLMGW_CHUNK_SIZE:
            d = (u_char) (ch | 0x20);

            if ((ch >= '0' && ch <= '9') || (d >= 'a' && d <= 'f')) {
                if (h->chunk_size > ((uint64_t) -1 >> 4)) {
                    return ngx_llmgw_http_chunk_invalid(h);
                }

                h->chunk_size = h->chunk_size * 16
                                + (ch <= '9' ? ch - '0' : d - 'a' + 10);
                h->chunk_digits++;

                /* a chunk that cannot fit fails now, not after reading it */
                if (h->chunk_size > h->max_body - h->body_size) {
                    return ngx_llmgw_http_too_large(h);
                }

                p++;
                break;
            }

            if (h->chunk_digits == 0) {
                return ngx_llmgw_http_chunk_invalid(h);
            }

            if (ch == ';' || ch == ' ' || ch == '\t') {
                h->chunk_state = NGX_LLMGW_CHUNK_EXT;

            } else if (ch == CR) {
                h->chunk_state = NGX_LLMGW_CHUNK_SIZE_LF;

            } else if (ch == LF) {
                ngx_llmgw_http_chunk_size_done(h);

            } else {
                return ngx_llmgw_http_chunk_invalid(h);
            }

            p++;
            break;

        case NGX_LLMGW_CHUNK_EXT:
            if (ch == LF) {
                ngx_llmgw_http_chunk_size_done(h);

            } else if (++h->chunk_extra > NGX_LLMGW_HTTP_MAX_HEADER) {
                return ngx_llmgw_http_chunk_invalid(h);
            }

            p++;
            break;

        case NGX_LLMGW_CHUNK_SIZE_LF:
            if (ch != LF) {
                return ngx_llmgw_http_chunk_invalid(h);
            }

            ngx_llmgw_http_chunk_size_done(h);
            p++;
            break;

        case NGX_LLMGW_CHUNK_DATA:
            n = (size_t) ngx_min((uint64_t) (last - p), h->chunk_size);
            h->chunk_size -= n;

            rc = ngx_llmgw_http_deliver(h, p, n);
            if (rc != NGX_AGAIN) {
                return rc;
            }

            p += n;

            if (h->chunk_size == 0) {
                h->chunk_state = NGX_LLMGW_CHUNK_DATA_CR;
            }

            break;

        case NGX_LLMGW_CHUNK_DATA_CR:
            if (ch == CR) {
                h->chunk_state = NGX_LLMGW_CHUNK_DATA_LF;

            } else if (ch == LF) {
                h->chunk_state = NGX_LLMGW_CHUNK_SIZE;

            } else {
                return ngx_llmgw_http_chunk_invalid(h);
            }

            p++;
            break;

        case NGX_LLMGW_CHUNK_DATA_LF:
            if (ch != LF) {
                return ngx_llmgw_http_chunk_invalid(h);
            }

            h->chunk_state = NGX_LLMGW_CHUNK_SIZE;
            p++;
            break;

        case NGX_LLMGW_CHUNK_TRAILER:
            /* trailer fields are read and dropped */
            if (ch == LF) {
                ngx_llmgw_http_ended(h, last - p - 1);
                return NGX_OK;
            }

            h->chunk_state = (ch == CR) ? NGX_LLMGW_CHUNK_LAST_LF
                                        : NGX_LLMGW_CHUNK_TRAILER_LINE;
            p++;
            break;

        case NGX_LLMGW_CHUNK_TRAILER_LINE:
            if (ch == LF) {
                h->chunk_state = NGX_LLMGW_CHUNK_TRAILER;

            } else if (++h->chunk_extra > NGX_LLMGW_HTTP_MAX_HEADER) {
                return ngx_llmgw_http_chunk_invalid(h);
            }

            p++;
            break;

        default: /* NGX_LLMGW_CHUNK_LAST_LF */
            if (ch != LF) {
                return ngx_llmgw_http_chunk_invalid(h);
            }

            ngx_llmgw_http_ended(h, last - p - 1);
            return NGX_OK;
        }
    }

    return NGX_AGAIN;
}


static void
ngx_llmgw_http_chunk_size_done(ngx_llmgw_http_t *h)
{
    h->chunk_state = (h->chunk_size == 0) ? NGX_LLMGW_CHUNK_TRAILER
                                          : NGX_LLMGW_CHUNK_DATA;
    h->chunk_digits = 0;
}


/*
 * The response ended where its framing said.  Bytes after it answer
 * nothing that was asked: the connection cannot be trusted with another
 * request then.
 */
static void
ngx_llmgw_http_ended(ngx_llmgw_http_t *h, size_t rest)
{
    h->ended = (rest == 0);
}


/* NGX_AGAIN: go on; NGX_OK: the caller wants no more (streaming). */
static ngx_int_t
ngx_llmgw_http_deliver(ngx_llmgw_http_t *h, u_char *p, size_t n)
{
    size_t      cap;
    u_char     *data;
    ngx_int_t   rc;
    ngx_str_t  *body;

    if (n == 0) {
        return NGX_AGAIN;
    }

    if (n > h->max_body - h->body_size) {
        return ngx_llmgw_http_too_large(h);
    }

    h->body_size += n;

    if (h->on_data) {
        h->in_callback = 1;
        rc = h->on_data(h->data, p, n);
        h->in_callback = 0;

        if (h->cancelled) {
            return NGX_ABORT;
        }

        if (rc == NGX_DONE) {
            return NGX_OK;
        }

        if (rc != NGX_OK) {
            return ngx_llmgw_http_fail(h, NGX_ERROR, "the response from %V "
                                       "was refused", &h->name);
        }

        return NGX_AGAIN;
    }

    body = &h->resp.body;

    if (body->len + n + 1 > h->body_cap) {
        /* doubling keeps the copies linear; large blocks are given back */
        cap = ngx_max(h->body_cap * 2, body->len + n + 1);
        cap = ngx_max(cap, 4096);
        cap = ngx_min(cap, h->max_body + 1);

        data = ngx_pnalloc(h->pool, cap);
        if (data == NULL) {
            return ngx_llmgw_http_fail(h, NGX_ERROR, "out of memory");
        }

        if (body->data) {
            ngx_memcpy(data, body->data, body->len);
            ngx_pfree(h->pool, body->data);
        }

        body->data = data;
        h->body_cap = cap;
    }

    ngx_memcpy(body->data + body->len, p, n);
    body->len += n;

    return NGX_AGAIN;
}


static ngx_int_t
ngx_llmgw_http_eof(ngx_llmgw_http_t *h)
{
    if (h->rstate != NGX_LLMGW_HTTP_BODY) {
        return ngx_llmgw_http_fail(h, NGX_ERROR, "%V closed the connection "
                                   "%s", &h->name,
                                   h->header_size
                                   || (h->in && h->in->last > h->in->pos)
                                   ? "in the middle of the response header"
                                   : "without a response");
    }

    if (h->framing == NGX_LLMGW_HTTP_UNTIL_CLOSE) {
        return NGX_OK;
    }

    return ngx_llmgw_http_fail(h, NGX_ERROR, "%V closed the connection "
                               "before the end of the response body",
                               &h->name);
}


static ngx_int_t
ngx_llmgw_http_too_large(ngx_llmgw_http_t *h)
{
    return ngx_llmgw_http_fail(h, NGX_DECLINED, "response larger than %uz "
                               "bytes", h->max_body);
}


/*
 * The timeout (the body's once the header has come), or what is left to
 * the call's deadline when that is less.
 */
static void
ngx_llmgw_http_arm(ngx_llmgw_http_t *h)
{
    ngx_msec_t      timeout;
    ngx_msec_int_t  left;

    timeout = (h->rstate == NGX_LLMGW_HTTP_BODY) ? h->body_timeout
                                                 : h->timeout;

    if (h->deadline == 0) {
        ngx_add_timer(&h->timer, timeout);
        return;
    }

    left = (ngx_msec_int_t) (h->deadline - ngx_current_msec);
    left = ngx_max(left, 1);

    ngx_add_timer(&h->timer, ngx_min(timeout, (ngx_msec_t) left));
}


/* Every phase has the whole timeout; progress re-arms it. */
static void
ngx_llmgw_http_set_phase(ngx_llmgw_http_t *h, ngx_uint_t phase)
{
    h->phase = phase;
    h->log.action = (char *) ngx_llmgw_http_actions[phase];

    ngx_llmgw_http_arm(h);
}


static void
ngx_llmgw_http_timeout(ngx_event_t *ev)
{
    ngx_llmgw_http_t  *h = ev->data;

    (void) ngx_llmgw_http_fail(h, NGX_ETIMEDOUT,
                               ngx_llmgw_http_timeouts[h->phase], &h->name);

    ngx_llmgw_http_finish(h, NGX_ETIMEDOUT);
}


/* Acts on what a step returned; h may be gone afterwards. */
static void
ngx_llmgw_http_conclude(ngx_llmgw_http_t *h, ngx_int_t rc)
{
    switch (rc) {

    case NGX_AGAIN:
        return;

    case NGX_ABORT:
        ngx_llmgw_http_free(h);
        return;

    case NGX_OK:
        ngx_llmgw_http_finish(h, NGX_OK);
        return;

    default:
        /* every failure went through ngx_llmgw_http_fail() */
        ngx_llmgw_http_finish(h, h->rc != NGX_OK ? h->rc : NGX_ERROR);
    }
}


static void
ngx_llmgw_http_finish(ngx_llmgw_http_t *h, ngx_int_t rc)
{
    const char             *err;
    ngx_llmgw_http_resp_t  *resp;

    /* the connection goes first: done may well start the next call */
    ngx_llmgw_http_release(h, rc == NGX_OK);

    if (h->written && h->sent != NULL) {
        *h->sent = 1;
    }

    /* the room for the '\0' was kept in every allocation of the body */
    if (h->resp.body.data) {
        h->resp.body.data[h->resp.body.len] = '\0';

    } else {
        h->resp.body.data = (u_char *) "";
    }

    if (rc == NGX_OK) {
        err = NULL;
        resp = &h->resp;

        ngx_log_debug4(NGX_LOG_DEBUG_HTTP, &h->log, 0,
                       "llmgw http: %p done, status %ui, %uz body bytes "
                       "from %V", h, resp->status, h->body_size, &h->name);

    } else {
        err = h->err ? h->err : "internal error";
        resp = h->resp.status ? &h->resp : NULL;

        ngx_log_error(NGX_LOG_INFO, &h->log, 0,
                      "llmgw: task HTTP call failed: %s", err);
    }

    if (h->done) {
        h->in_done = 1;
        h->done(h->data, rc, resp, err);
    }

    ngx_queue_remove(&h->queue);
    ngx_destroy_pool(h->pool);
}


static void
ngx_llmgw_http_release(ngx_llmgw_http_t *h, ngx_uint_t keep)
{
    if (h->rctx) {
        ngx_resolve_name_done(h->rctx);
        h->rctx = NULL;
    }

    if (h->timer.timer_set) {
        ngx_del_timer(&h->timer);
    }

    if (h->kick.posted) {
        ngx_delete_posted_event(&h->kick);
    }

    if (!keep || !ngx_llmgw_http_idle_put(h)) {
        ngx_llmgw_http_close(h);
    }

    h->log.action = NULL;
}


static void
ngx_llmgw_http_free(ngx_llmgw_http_t *h)
{
    ngx_llmgw_http_release(h, 0);

    ngx_queue_remove(&h->queue);
    ngx_destroy_pool(h->pool);
}


static void
ngx_llmgw_http_close(ngx_llmgw_http_t *h)
{
    ngx_connection_t  *c;

    c = h->peer.connection;

    if (c == NULL) {
        return;
    }

    h->peer.connection = NULL;

    ngx_llmgw_http_close_connection(c);
}


static void
ngx_llmgw_http_close_connection(ngx_connection_t *c)
{
    ngx_pool_t  *pool;

    pool = c->pool;

#if (NGX_SSL)
    if (c->ssl) {
        /*
         * A quiet shutdown completes at once, so the connection can go
         * now, before the pool its SSL state lives in.
         */
        c->ssl->no_wait_shutdown = 1;
        c->ssl->no_send_shutdown = 1;

        (void) ngx_ssl_shutdown(c);
    }
#endif

    ngx_close_connection(c);

    if (pool) {
        ngx_destroy_pool(pool);
    }
}


/* Takes the most recently used idle connection made for the same peer. */
static ngx_connection_t *
ngx_llmgw_http_idle_get(ngx_llmgw_http_t *h)
{
    ngx_queue_t            *q;
    ngx_connection_t       *c;
    ngx_llmgw_http_idle_t  *item;

    for (q = ngx_queue_head(&ngx_llmgw_http_idle);
         q != ngx_queue_sentinel(&ngx_llmgw_http_idle);
         q = ngx_queue_next(q))
    {
        item = ngx_queue_data(q, ngx_llmgw_http_idle_t, queue);

        if (item->tls == h->tls
            && (item->public_peer || !h->public_only)
            && item->port == h->port
            && item->host_len == h->host.len
            && ngx_strncasecmp(item->host, h->host.data, h->host.len) == 0)
        {
            goto found;
        }
    }

    return NULL;

found:

    ngx_queue_remove(q);
    ngx_queue_insert_head(&ngx_llmgw_http_spare, q);

    c = item->connection;
    h->public_peer = item->public_peer ? 1 : 0;

    c->idle = 0;
    c->data = h;
    c->log = &h->log;
    c->read->log = &h->log;
    c->write->log = &h->log;
    c->pool->log = &h->log;

    if (c->read->timer_set) {
        ngx_del_timer(c->read);
    }

    c->read->handler = ngx_llmgw_http_read_handler;
    c->write->handler = ngx_llmgw_http_write_handler;

    return c;
}


/* Keeps the connection of a call that succeeded if it can serve again. */
static ngx_uint_t
ngx_llmgw_http_idle_put(ngx_llmgw_http_t *h)
{
    ngx_queue_t            *q;
    ngx_connection_t       *c;
    ngx_llmgw_http_idle_t  *item;

    c = h->peer.connection;

    if (c == NULL) {
        return 0;
    }

    c->requests++;

    if (ngx_llmgw_http_keepalive == 0
        || !h->ended
        || !h->keepalive
        || h->out.pos != h->out.last
        || c->read->eof
        || c->read->error
        || c->write->error
        || c->requests >= NGX_LLMGW_HTTP_KA_REQUESTS
        || ngx_current_msec - c->start_time > NGX_LLMGW_HTTP_KA_TIME
        || ngx_exiting
        || ngx_terminate)
    {
        return 0;
    }

#if (NGX_SSL)
    /*
     * A vendor's close_notify read with the last bytes, or bytes OpenSSL
     * still holds, do not show on the socket: such a connection is done.
     */
    if (c->ssl
        && (SSL_pending(c->ssl->connection) > 0
            || (SSL_get_shutdown(c->ssl->connection) & SSL_RECEIVED_SHUTDOWN)))
    {
        return 0;
    }
#endif

    if (ngx_handle_read_event(c->read, 0) != NGX_OK) {
        return 0;
    }

    if (ngx_queue_empty(&ngx_llmgw_http_spare)) {
        /* full: the least recently used one makes room */
        q = ngx_queue_last(&ngx_llmgw_http_idle);
        ngx_queue_remove(q);
        item = ngx_queue_data(q, ngx_llmgw_http_idle_t, queue);
        ngx_llmgw_http_close_connection(item->connection);

    } else {
        q = ngx_queue_head(&ngx_llmgw_http_spare);
        ngx_queue_remove(q);
        item = ngx_queue_data(q, ngx_llmgw_http_idle_t, queue);
    }

    ngx_queue_insert_head(&ngx_llmgw_http_idle, q);

    item->connection = c;
    item->tls = h->tls;
    item->public_peer = h->public_peer;
    item->port = h->port;
    item->host_len = h->host.len;
    ngx_memcpy(item->host, h->host.data, h->host.len);

    h->peer.connection = NULL;

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, &h->log, 0,
                   "llmgw http: keeping connection %p to %V", c, &h->name);

    if (c->write->timer_set) {
        ngx_del_timer(c->write);
    }

    c->read->handler = ngx_llmgw_http_idle_handler;
    c->write->handler = ngx_llmgw_http_idle_dummy;

    /* c->idle: a graceful shutdown closes it at once */
    c->data = item;
    c->idle = 1;
    c->log = ngx_cycle->log;
    c->read->log = ngx_cycle->log;
    c->write->log = ngx_cycle->log;
    c->pool->log = ngx_cycle->log;

    ngx_add_timer(c->read, ngx_llmgw_http_idle_timeout);

    if (c->read->ready) {
        ngx_llmgw_http_idle_handler(c->read);
    }

    return 1;
}


/*
 * Anything on an idle connection ends it: the peer closed it (EOF), or
 * sent what no request asked for.  The socket is peeked, not read, so that
 * TLS records are not torn out from under OpenSSL.
 */
static void
ngx_llmgw_http_idle_handler(ngx_event_t *ev)
{
    int                     n;
    char                    buf[1];
    ngx_connection_t       *c;
    ngx_llmgw_http_idle_t  *item;

    c = ev->data;

    if (!c->close && !ev->timedout) {
        n = recv(c->fd, buf, 1, MSG_PEEK);

        if (n == -1 && ngx_socket_errno == NGX_EAGAIN) {
            ev->ready = 0;

            if (ngx_handle_read_event(ev, 0) == NGX_OK) {
                return;
            }
        }
    }

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, ev->log, 0,
                   "llmgw http: closing idle connection %p%s", c,
                   ev->timedout ? " (timed out)" : "");

    item = c->data;

    ngx_queue_remove(&item->queue);
    ngx_queue_insert_head(&ngx_llmgw_http_spare, &item->queue);

    ngx_llmgw_http_close_connection(c);
}


static void
ngx_llmgw_http_idle_dummy(ngx_event_t *ev)
{
}


static u_char *
ngx_llmgw_http_log_error(ngx_log_t *log, u_char *buf, size_t len)
{
    u_char            *p;
    ngx_llmgw_http_t  *h;

    h = log->data;
    p = buf;

    if (log->action) {
        p = ngx_snprintf(p, len, " while %s", log->action);
        len -= p - buf;
    }

    return ngx_snprintf(p, len, ", task peer: %V", &h->name);
}
