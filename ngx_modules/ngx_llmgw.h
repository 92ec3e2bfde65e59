/*
 * llmgw nginx glue: types shared by the module's files.
 */

#ifndef NGX_LLMGW_H
#define NGX_LLMGW_H

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <libpq-fe.h>

#include "llmgw.h"
#include "task.h"


#define NGX_LLMGW_MAX_TRIES       10
#define NGX_LLMGW_REQUEST_ID_LEN  32


typedef struct {
    ngx_str_t                  database;
    ngx_flag_t                 needs_database;  /* a gateway or admin location */
    ngx_uint_t                 pg_pool_size;
    ngx_msec_t                 pg_timeout;
    ngx_msec_t                 flush_interval;
    ngx_uint_t                 ledger_backlog;
    ngx_msec_t                 ledger_wait;
    size_t                     offload_size;    /* bodies read in a thread */
    ngx_str_t                  thread_pool_name;
    void                      *thread_pool;     /* ngx_thread_pool_t */
    ngx_msec_t                 refresh_interval;
    ngx_uint_t                 key_cache_size;
    ngx_msec_t                 key_cache_ttl;
    ngx_msec_t                 key_cache_stale;
    ngx_shm_zone_t            *shm_zone;
    ssize_t                    shm_size;
    ngx_uint_t                 keepalive;
    ngx_msec_t                 keepalive_timeout;

    ngx_str_t                  v8host;
    ngx_addr_t                 v8host_addr;
    ngx_uint_t                 v8host_connections;
    ngx_msec_t                 v8host_timeout;
    ngx_uint_t                 v8host_max_inflight;
    size_t                     v8host_max_frame;

    /* the task engine (ngx_llmgw_task.c) and its HTTP client */
    ngx_msec_t                 task_poll_interval;
    ngx_uint_t                 task_poll_batch;       /* due tasks per pass */
    ngx_uint_t                 task_batch_size;       /* per batch query */
    ngx_uint_t                 task_poll_concurrency; /* per channel */
    ngx_uint_t                 task_poll_max_failures;
    ngx_msec_t                 task_timeout;          /* outer deadline */
    ngx_msec_t                 task_lease;
    ngx_msec_t                 task_wait_timeout;     /* host_image waits */
    ngx_msec_t                 task_http_timeout;     /* connect, send, read */
    ngx_msec_t                 task_sse_idle_timeout;
    size_t                     task_max_response;
    size_t                     task_max_file_size;
    size_t                     task_max_files_total;
    ngx_flag_t                 task_ssl_verify;
    ngx_str_t                  task_ssl_trusted_certificate;
    /* special addresses a plugin's content fetch may reach (NULL: none) */
    llmgw_iplist_t            *content_allow;
    ngx_flag_t                 content_allow_set;
    ngx_str_t                  crypto_secret;         /* artifact links */
    ngx_str_t                  task_public_address;
    ngx_str_t                  server_address;
    ngx_msec_t                 artifact_link_ttl;
    ngx_resolver_t            *resolver;              /* http{} level */
    ngx_msec_t                 resolver_timeout;
} ngx_llmgw_main_conf_t;


typedef enum {
    NGX_LLMGW_ROLE_NONE = 0,
    NGX_LLMGW_ROLE_GATEWAY,
    NGX_LLMGW_ROLE_ADMIN,
    NGX_LLMGW_ROLE_METRICS
} ngx_llmgw_role_e;


typedef struct {
    ngx_uint_t                 role;
    /* set on a server's own configuration when one of its locations has
     * an llmgw role: errors nginx makes before any location (a request
     * line or header it refuses) keep the JSON contract too */
    ngx_flag_t                 server_errors;
    ngx_uint_t                 max_tries;
    ngx_uint_t                 reserve_tokens;
    ngx_str_t                  request_id_header;
    ngx_http_upstream_conf_t   upstream;
    ngx_flag_t                 ssl_verify;
    ngx_str_t                  ssl_trusted_certificate;
    ngx_uint_t                 ssl_verify_depth;
} ngx_llmgw_loc_conf_t;


#define NGX_LLMGW_LATENCY_BUCKETS  12
#define NGX_LLMGW_MAX_PROCS        128


/* A process slot: its reservations and the ledger rows it is writing. */
typedef struct {
    ngx_pid_t                  pid;
    ngx_queue_t                holds;
    ngx_queue_t                batch;
    ngx_uint_t                 batch_rows;
} ngx_llmgw_proc_t;

/*
 * What a build keeps in the zone: the size of the state below, and a
 * version for what hangs off it (bumped when a node's layout changes).
 */
#define NGX_LLMGW_ZONE_LAYOUT  (sizeof(ngx_llmgw_shm_t) * 100 + 4)

/* The node-wide shared state (one slab zone): rate limiter and metrics. */
typedef struct {
    /* NGX_LLMGW_ZONE_LAYOUT in the build that made the zone: a reload into
     * a build with another layout is refused (first, so that any build can
     * read it) */
    size_t                     layout;

    ngx_rbtree_t               rl_tree;
    ngx_rbtree_node_t          rl_sentinel;
    ngx_queue_t                rl_lru;
    ngx_rbtree_t               m_tree;
    ngx_rbtree_node_t          m_sentinel;
    ngx_uint_t                 m_count;
    ngx_atomic_t               retries;
    ngx_atomic_t               rate_limited;
    ngx_atomic_t               latency[NGX_LLMGW_LATENCY_BUCKETS + 1];
    ngx_atomic_t               latency_count;
    ngx_atomic_t               latency_sum_us;

    /* balances (ngx_llmgw_billing.c) */
    ngx_rbtree_t               bal_tree;
    ngx_rbtree_node_t          bal_sentinel;
    ngx_queue_t                bal_lru;

    /* key records as a worker last read them, for every worker to fall
     * back on while the database cannot be read (ngx_llmgw_cache.c) */
    ngx_rbtree_t               krec_tree;
    ngx_rbtree_node_t          krec_sentinel;
    ngx_queue_t                krec_lru;
    ngx_uint_t                 krec_count;
    size_t                     krec_bytes;
    ngx_atomic_t               krec_gen;    /* bumped by every change of
                                             * keys or users a worker
                                             * learns of */

    /* ledger rows not yet written (ngx_llmgw_ledger.c) */
    ngx_queue_t                ledger;
    ngx_uint_t                 ledger_rows;     /* waiting */
    ngx_uint_t                 ledger_held;     /* waiting or being written */
    ngx_atomic_t               ledger_waits;    /* requests that waited */
    ngx_atomic_t               ledger_refused;  /* ... and found no room */

    /* a poller found more due tasks than one pass takes: until this
     * time (ngx_current_msec) every worker polls without waiting for its
     * interval (ngx_llmgw_task.c) */
    ngx_atomic_t               task_backlog_until;

    ngx_llmgw_proc_t           procs[NGX_LLMGW_MAX_PROCS];
} ngx_llmgw_shm_t;

typedef struct {
    ngx_llmgw_shm_t           *sh;
    ngx_slab_pool_t           *shpool;
} ngx_llmgw_shm_ctx_t;


typedef struct ngx_llmgw_ctx_s  ngx_llmgw_ctx_t;

struct ngx_llmgw_ctx_s {
    ngx_http_request_t        *request;
    u_char                     request_id[NGX_LLMGW_REQUEST_ID_LEN + 1];

    llmgw_endpoint_t           endpoint;
    llmgw_troute_t             troute;       /* a task route */
    void                      *task;         /* its runner */
    llmgw_token_t             *token;
    llmgw_req_t               *req;
    llmgw_snapshot_t          *snapshot;     /* a reference held while used */
    llmgw_resp_t              *resp;

    ngx_str_t                  model;        /* the client's name */
    ngx_str_t                  upstream_model;
    ngx_str_t                  group;
    double                     group_ratio;
    char                       key_hash[65];
    ngx_str_t                  query_key;    /* ?key=, copied: it is masked */
    ngx_str_t                  args;         /* the query before, if so */

    /* routing and tries */
    const llmgw_channel_t     *channels[NGX_LLMGW_MAX_TRIES];
    ngx_uint_t                 nchannels;
    ngx_int_t                  current;      /* index into channels, -1 */
    ngx_uint_t                 tried;
    ngx_uint_t                 tries_left;
    int64_t                    tried_ids[NGX_LLMGW_MAX_TRIES];
    int                        usage_injected;

    /* upstream response */
    ngx_http_chunked_t         chunked;
    ngx_http_status_t          status_line;  /* kept across reads */
    off_t                      length;       /* upstream body left, -1 */
    ngx_uint_t                 status;
    ngx_uint_t                 end_status;   /* 499, 502, 504: cut short */
    ngx_buf_t                 *error_body;   /* kept to rewrite an error */
    ngx_table_elt_t           *content_type; /* the upstream's, as passed */
    ngx_str_t                  answer;       /* a held answer, checked */
    ngx_str_t                  last_error;   /* a try's upstream error */
    ngx_uint_t                 last_error_status;
    ngx_str_t                  pending;      /* held bytes still to send */
    ngx_msec_t                 start_msec;
    ngx_msec_t                 upstream_start;

    /* the answer sent */
    ngx_str_t                  own_body;     /* rewritten error page */
    void                      *admin;        /* an admin answer waiting */
    void                      *hold;         /* this request's reservation */
    llmgw_price_t              price;
    ngx_uint_t                 rl_held;      /* admitted by the limiter */
    int64_t                    rl_reserved;  /* its success slot, or -1 */
    int64_t                    user_id;
    int64_t                    token_id;
    ngx_str_t                  body;         /* the client's body */
    ngx_str_t                  market_key;   /* a marketplace install's */
    ngx_str_t                  market_version;
    ngx_queue_t                admit_queue;  /* waiting for ledger room */
    ngx_http_request_t        *admit_r;      /* set while waiting */
    ngx_msec_t                 admit_until;
    unsigned                   responded:1;  /* a body was sent by us */
    unsigned                   upstream_header:1;
    unsigned                   error_mode:1;
    unsigned                   whole_for_stream:1;  /* JSON, stream asked */
    unsigned                   event_stream:1;      /* upstream said SSE */
    unsigned                   holding:1;    /* reading an answer whole */
    unsigned                   sniffed:1;    /* its first bytes were seen */
    unsigned                   interim:1;    /* skipping a 1xx head */
    unsigned                   bad_answer:1; /* a 2xx that was no answer */
    unsigned                   bad_status:1; /* a status that is no answer
                                                (304) */
    unsigned                   too_large:1;  /* an answer too large to
                                                convert */
    unsigned                   next_after:1; /* an error nginx would not
                                                retry: held, then the next
                                                channel */
    unsigned                   errpage:1;
    unsigned                   errpage_sent:1;
    unsigned                   waiting:1;
    unsigned                   logged:1;
    unsigned                   stream_started:1;
    unsigned                   retry_same:1;
    unsigned                   config_waited:1;
    unsigned                   query_key_taken:1;
    unsigned                   signed_link:1; /* content by a signed link */
    unsigned                   model_priced:1;
};


extern ngx_module_t  ngx_http_llmgw_module;


/* ngx_llmgw_module.c */
extern ngx_connection_t  ngx_llmgw_no_connection;
ngx_llmgw_ctx_t *ngx_llmgw_get_ctx(ngx_http_request_t *r);
ngx_int_t ngx_llmgw_send_error(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx,
    const llmgw_verdict_t *v);
ngx_int_t ngx_llmgw_send_json(ngx_http_request_t *r, ngx_uint_t status,
    u_char *data, size_t len);
ngx_int_t ngx_llmgw_read_body(ngx_http_request_t *r, ngx_str_t *body);
ngx_int_t ngx_llmgw_allow_header(ngx_http_request_t *r, const char *message);
ngx_int_t ngx_llmgw_out_header(ngx_http_request_t *r, ngx_str_t *key,
    u_char *value, size_t len);

/* ngx_llmgw_pg.c */
typedef void (*ngx_llmgw_pg_handler_pt)(void *data, PGresult *res,
    const char *err);
typedef void (*ngx_llmgw_pg_notify_pt)(const char *channel,
    const char *payload);

ngx_int_t ngx_llmgw_pg_init_process(ngx_cycle_t *cycle,
    ngx_llmgw_main_conf_t *mcf, ngx_llmgw_pg_notify_pt notify);
void ngx_llmgw_pg_exit_process(ngx_cycle_t *cycle);
ngx_int_t ngx_llmgw_pg_query(const char *sql, int nparams,
    const char *const *params, const int *lengths,
    ngx_llmgw_pg_handler_pt handler, void *data);
ngx_uint_t ngx_llmgw_pg_failing(ngx_msec_t ms);
/*
 * While a handler is called with err: the SQLSTATE the server answered
 * ("22P05"), or "" when the statement did not reach it or got no answer.
 */
const char *ngx_llmgw_pg_error_state(void);
/* One blocking statement at worker exit only, never while serving. */
ngx_int_t ngx_llmgw_pg_exec_at_exit(const char *sql, const char *param,
    const u_char *copy, size_t len, ngx_llmgw_pg_handler_pt handler,
    void *data);
/* A simple-query statement with COPY ... FROM STDIN: copy is its data. */
ngx_int_t ngx_llmgw_pg_copy(const char *sql, const u_char *copy, size_t len,
    ngx_llmgw_pg_handler_pt handler, void *data);

/* ngx_llmgw_cache.c */
ngx_int_t ngx_llmgw_cache_init_process(ngx_cycle_t *cycle,
    ngx_llmgw_main_conf_t *mcf);
void ngx_llmgw_cache_exit_process(ngx_cycle_t *cycle);
llmgw_snapshot_t *ngx_llmgw_cache_snapshot(void);
void ngx_llmgw_cache_release(llmgw_snapshot_t *s);
/* One more reference to a snapshot that is referenced already. */
void ngx_llmgw_cache_ref(llmgw_snapshot_t *s);
/* rc: NGX_OK (token set, maybe NULL for unknown), NGX_AGAIN (resumes). */
typedef void (*ngx_llmgw_token_handler_pt)(ngx_http_request_t *r,
    llmgw_token_t *t, const char *err);
ngx_int_t ngx_llmgw_cache_token(ngx_http_request_t *r, const char *hash,
    llmgw_token_t **t, ngx_llmgw_token_handler_pt handler);
void ngx_llmgw_cache_on_notify(const char *channel, const char *payload);
typedef void (*ngx_llmgw_refresh_handler_pt)(ngx_http_request_t *r);
ngx_int_t ngx_llmgw_cache_refresh_now(ngx_http_request_t *r,
    ngx_llmgw_refresh_handler_pt handler);
/*
 * Before this worker's first configuration: NGX_AGAIN, and handler(r) runs
 * once the load under way (or one started now) has ended, well or not;
 * NGX_OK when a configuration is loaded.
 */
ngx_int_t ngx_llmgw_cache_wait_first(ngx_http_request_t *r,
    ngx_llmgw_refresh_handler_pt handler);

/* ngx_llmgw_gateway.c */
ngx_int_t ngx_llmgw_gateway_handler(ngx_http_request_t *r);
ngx_int_t ngx_llmgw_post_read(ngx_http_request_t *r);
void ngx_llmgw_mask_query_key(ngx_http_request_t *r);
void ngx_llmgw_admit_cancel(ngx_llmgw_ctx_t *ctx);
void ngx_llmgw_gateway_log(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx);
ngx_uint_t ngx_llmgw_succeeded(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx);

/* ngx_llmgw_upstream.c */
ngx_int_t ngx_llmgw_upstream_start(ngx_http_request_t *r,
    ngx_llmgw_ctx_t *ctx);
void ngx_llmgw_keepalive_init_process(ngx_cycle_t *cycle,
    ngx_llmgw_main_conf_t *mcf);
char *ngx_llmgw_upstream_merge(ngx_conf_t *cf, ngx_llmgw_loc_conf_t *prev,
    ngx_llmgw_loc_conf_t *conf);

/* ngx_llmgw_ratelimit.c */
ngx_int_t ngx_llmgw_shm_init_zone(ngx_shm_zone_t *zone, void *data);
ngx_llmgw_shm_ctx_t *ngx_llmgw_shm(void);
void *ngx_llmgw_shm_alloc_locked(ngx_llmgw_shm_ctx_t *ctx, size_t size);
void ngx_llmgw_shm_attach(ngx_shm_zone_t *zone);
/*
 * The node of a zone tree whose key is key and for which match() says yes.
 * Nodes with one key may sit on both sides of each other once the tree
 * rotates, so all of them are searched, not only a right-hand chain.
 */
ngx_rbtree_node_t *ngx_llmgw_rbtree_find(ngx_rbtree_t *tree,
    ngx_rbtree_key_t key,
    ngx_int_t (*match)(ngx_rbtree_node_t *node, const void *data),
    const void *data);
/* NGX_OK, or NGX_DECLINED with retry-after seconds in *retry. */
ngx_int_t ngx_llmgw_rl_acquire(ngx_llmgw_ctx_t *ctx,
    const llmgw_rate_limit_t *rl, int64_t user_id, int *which,
    ngx_uint_t *retry);
void ngx_llmgw_rl_done(ngx_llmgw_ctx_t *ctx, ngx_uint_t success);
uint64_t ngx_llmgw_rl_group(ngx_str_t *group);
void ngx_llmgw_rl_release_locked(ngx_llmgw_shm_ctx_t *ctx, int64_t user_id,
    uint64_t group, int64_t reserved);

/* ngx_llmgw_metrics.c */
void ngx_llmgw_metrics_record(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx);
void ngx_llmgw_metrics_retry(void);
void ngx_llmgw_metrics_rate_limited(void);
void ngx_llmgw_metrics_ledger_wait(ngx_uint_t refused);
ngx_int_t ngx_llmgw_metrics_handler(ngx_http_request_t *r);

/* ngx_llmgw_admin.c */
ngx_int_t ngx_llmgw_admin_handler(ngx_http_request_t *r);
ngx_int_t ngx_llmgw_admin_upload(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx,
    const char *key, const char *version);

/* ngx_llmgw_market.c */
void ngx_llmgw_market_start(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx);

/* ngx_llmgw_billing.c */
ngx_int_t ngx_llmgw_billing_init_process(ngx_cycle_t *cycle);
void ngx_llmgw_billing_exit_process(ngx_cycle_t *cycle);
/* Releases what dead processes held; the zone mutex is held. */
void ngx_llmgw_billing_reap_locked(ngx_llmgw_shm_ctx_t *shm);
ngx_llmgw_proc_t *ngx_llmgw_billing_me(void);
/* 401 for a key spent in the zone, before its record shows it. */
ngx_int_t ngx_llmgw_billing_key_check(ngx_llmgw_ctx_t *ctx,
    llmgw_verdict_t *v);
ngx_int_t ngx_llmgw_billing_reserve(ngx_llmgw_ctx_t *ctx, int64_t amount,
    llmgw_verdict_t *v);
/* Ends the reservation; a charge moves the balances and queues its row. */
ngx_int_t ngx_llmgw_billing_settle(ngx_llmgw_ctx_t *ctx, int64_t quota,
    u_char *row, size_t len);
/* A written row no longer counts as pending; the zone mutex is held. */
void ngx_llmgw_billing_written_locked(ngx_llmgw_shm_ctx_t *shm,
    int64_t token_id, int64_t user_id, int64_t quota);
void ngx_llmgw_billing_learned_locked(ngx_llmgw_shm_ctx_t *shm, int is_user,
    int64_t id, int64_t balance, int64_t rev);
void ngx_llmgw_billing_stale(int is_user, int64_t id);
/* Balances a statement answered with ({"tokens": {..}, "users": {..}}). */
void ngx_llmgw_billing_learn(const char *json, size_t len);
void ngx_llmgw_billing_learned(void *arg, int is_user, int64_t id,
    int64_t balance, int64_t rev);
/* Ends a request's reservation without a ledger row (the task engine
 * charges in the database itself). */
void ngx_llmgw_billing_release(ngx_llmgw_ctx_t *ctx);

/* ngx_llmgw_ledger.c */
typedef struct {
    ngx_queue_t                queue;
    int64_t                    token_id;
    int64_t                    user_id;
    int64_t                    quota;
    ngx_uint_t                 again;   /* its batch may have been written */
    size_t                     len;
    u_char                     data[1];  /* a line of COPY text */
} ngx_llmgw_row_t;

ngx_int_t ngx_llmgw_ledger_init_process(ngx_cycle_t *cycle,
    ngx_llmgw_main_conf_t *mcf);
void ngx_llmgw_ledger_exit_process(ngx_cycle_t *cycle);
void ngx_llmgw_ledger_record(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx);
ngx_int_t ngx_llmgw_ledger_has_room(void);
ngx_uint_t ngx_llmgw_admit_waiters(void);
void ngx_llmgw_ledger_wake(void);

/* ngx_llmgw_v8host.c */
/*
 * rc: NGX_OK with the reply body, else the reason and NGX_ERROR (the call
 * failed), NGX_ETIMEDOUT, NGX_DECLINED (the helper is not running), or
 * NGX_ABORT (the reply was over llmgw_v8host_max_frame: what the call
 * returned was too large).
 */
typedef void (*ngx_llmgw_v8_handler_pt)(void *data, ngx_int_t rc,
    u_char *body, size_t len);

ngx_int_t ngx_llmgw_v8host_init_process(ngx_cycle_t *cycle,
    ngx_llmgw_main_conf_t *mcf);
void ngx_llmgw_v8host_exit_process(ngx_cycle_t *cycle);
ngx_uint_t ngx_llmgw_v8host_enabled(void);
/* NGX_OK (answered later), NGX_BUSY (too many calls), NGX_DECLINED (no
 * helper configured), NGX_ABORT (the body is over llmgw_v8host_max_frame),
 * NGX_ERROR. */
ngx_int_t ngx_llmgw_v8_call(ngx_uint_t type, u_char *body, size_t len,
    ngx_llmgw_v8_handler_pt handler, void *data);
/* A CALL of a published source: loads it into the helper when needed;
 * *hookp (when not NULL) names it for ngx_llmgw_hook_cancel() until its
 * handler runs. */
typedef struct ngx_llmgw_hook_s  ngx_llmgw_hook_t;
ngx_int_t ngx_llmgw_hook(const char *sha, u_char *body, size_t len,
    ngx_llmgw_v8_handler_pt handler, void *data, ngx_llmgw_hook_t **hookp);
/* The hook's handler is never called; its result, if any, is dropped. */
void ngx_llmgw_hook_cancel(ngx_llmgw_hook_t *h);

/* ngx_llmgw_task.c */
ngx_int_t ngx_llmgw_task_init_process(ngx_cycle_t *cycle,
    ngx_llmgw_main_conf_t *mcf);
void ngx_llmgw_task_exit_process(ngx_cycle_t *cycle);
/* Runs a task route's request once its body is read. */
void ngx_llmgw_task_start(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx);
/* A refusal on a plugin's native route, through its native.error:
   NGX_DONE (answered later), or NGX_DECLINED (not shaped). */
ngx_int_t ngx_llmgw_task_refuse(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx,
    const llmgw_verdict_t *v);

/* ngx_llmgw_errpage.c */
ngx_int_t ngx_llmgw_errpage_init(ngx_conf_t *cf);


#endif /* NGX_LLMGW_H */
