/*
 * llmgw's internal HTTP/1.1 client: one non-blocking call per request built
 * from a plugin descriptor (submit, poll, content downloads), on nginx's
 * event loop, usable from timers outside any client request.  Connections
 * are kept alive per worker (llmgw_keepalive, llmgw_keepalive_timeout).
 */

#ifndef NGX_LLMGW_HTTP_H
#define NGX_LLMGW_HTTP_H

#include "ngx_llmgw.h"


/* the status line and headers of a response together, at most */
#define NGX_LLMGW_HTTP_MAX_HEADER  (64 * 1024)


typedef struct ngx_llmgw_http_s  ngx_llmgw_http_t;

typedef struct {
    ngx_str_t                  name;        /* lowercased */
    ngx_str_t                  value;       /* without surrounding spaces */
} ngx_llmgw_http_header_t;

typedef struct {
    ngx_uint_t                 status;
    ngx_array_t                headers;     /* ngx_llmgw_http_header_t, in
                                             * the order received */
    ngx_str_t                  body;        /* the whole body (dechunked),
                                             * followed by a '\0' not counted
                                             * in len; empty when streaming */
} ngx_llmgw_http_resp_t;

typedef struct {
    ngx_str_t                  method;      /* "GET", "POST", ... */
    ngx_uint_t                 tls;         /* https */
    ngx_str_t                  host;        /* DNS name or IP literal (no
                                             * brackets) */
    in_port_t                  port;        /* 0: 80 or 443 */
    ngx_str_t                  host_header; /* the Host value, e.g.
                                             * "api.x.com" or "h:8443";
                                             * empty: made from host, port */
    ngx_str_t                  uri;         /* path and query, "/..." */
    ngx_str_t                  headers;     /* extra lines "Name: value\r\n"
                                             * (already validated) */
    ngx_str_t                  body;        /* sent with Content-Length when
                                             * the method has a body (POST,
                                             * PUT, PATCH) or body.len > 0 */
    ngx_msec_t                 timeout;     /* resolving, connecting, the TLS
                                             * handshake, each send and each
                                             * read (idle); 0: the
                                             * llmgw_task_http_timeout */
    ngx_msec_t                 body_timeout; /* each read once the
                                             * response header has come
                                             * (a stream's idle timeout);
                                             * 0: timeout */
    ngx_msec_t                 deadline;    /* ngx_current_msec after
                                             * which no wait is armed (the
                                             * timeout is cut to it); 0:
                                             * none */
    size_t                     max_body;    /* a longer body fails the call
                                             * with NGX_DECLINED (also counted
                                             * when streaming); 0: the
                                             * llmgw_task_max_response */

    /*
     * Optional.  on_headers is called once after the header (also when not
     * streaming): NGX_OK reads the body, NGX_DONE finishes successfully
     * without it, NGX_ERROR aborts (done gets NGX_ERROR).
     *
     * Streaming mode when on_data is set: body bytes (dechunked) are handed
     * over as they arrive and not kept.  NGX_OK goes on, NGX_DONE finishes
     * successfully now (the connection is closed), NGX_ERROR aborts.
     */
    ngx_int_t                (*on_headers)(void *data,
                                           ngx_llmgw_http_resp_t *resp);
    ngx_int_t                (*on_data)(void *data, u_char *p, size_t len);

    /*
     * Called exactly once unless the call was cancelled, never from inside
     * ngx_llmgw_http_start(): rc NGX_OK with resp; or NGX_ERROR,
     * NGX_ETIMEDOUT, NGX_DECLINED (the body is too large) with a short
     * reason in err that names no secret (resp is then set when a header
     * was received, with the part of the body that came, else NULL).  resp
     * and err live until done returns; the
     * handle is gone afterwards.  It runs in an event handler of its own:
     * a caller that touches a client request there runs
     * ngx_http_run_posted_requests() itself.
     */
    void                     (*done)(void *data, ngx_int_t rc,
                                     ngx_llmgw_http_resp_t *resp,
                                     const char *err);
    void                      *data;
    /* Optional: set to 1 once the whole request was written (after that a
     * failure is ambiguous: the server may have acted on it).  A request
     * written on a kept-alive connection that the peer turns out to have
     * closed, with no byte of a response, is sent again on a new one: only
     * that write counts. */
    ngx_uint_t                *sent;
    /* The request may be sent twice (a poll, a download): a kept-alive
     * connection found closed after the whole request was written is then
     * retried on a new one.  Without it only an unwritten request is. */
    ngx_uint_t                 resend;
    /* The URL was chosen by a plugin (llmgw_outbound_t.public_only): only
     * addresses llmgw_content_addr_ok() admits under
     * llmgw_content_allow_private are connected to, each resolved address
     * checked, and a kept-alive connection only when its own was. */
    ngx_uint_t                 public_only;
} ngx_llmgw_http_opts_t;


ngx_int_t ngx_llmgw_http_init_process(ngx_cycle_t *cycle,
    ngx_llmgw_main_conf_t *mcf);
void ngx_llmgw_http_exit_process(ngx_cycle_t *cycle);

/* Copies everything it needs from opts; NULL only on allocation failure. */
ngx_llmgw_http_t *ngx_llmgw_http_start(ngx_llmgw_http_opts_t *opts,
    ngx_log_t *log);

/*
 * Stops a call and frees it; done is not called afterwards.  Safe from
 * inside on_headers and on_data; a no-op inside done.
 */
void ngx_llmgw_http_cancel(ngx_llmgw_http_t *h);

/*
 * A streaming reader that cannot take more for now: after the bytes
 * already read are handed over, nothing more is read (and the idle
 * timeout does not run) until ngx_llmgw_http_resume().
 */
void ngx_llmgw_http_pause(ngx_llmgw_http_t *h);
void ngx_llmgw_http_resume(ngx_llmgw_http_t *h);


#endif /* NGX_LLMGW_HTTP_H */
