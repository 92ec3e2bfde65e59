/*
 * llmgw: the module definition, directives, per-request context, variables
 * and the helpers that answer in the error contract.
 */

#include "ngx_llmgw.h"
#include <libpq-fe.h>

#include <openssl/rand.h>


static ngx_int_t ngx_llmgw_add_variables(ngx_conf_t *cf);
static ngx_int_t ngx_llmgw_postconfiguration(ngx_conf_t *cf);
static void *ngx_llmgw_create_main_conf(ngx_conf_t *cf);
static char *ngx_llmgw_init_main_conf(ngx_conf_t *cf, void *conf);
static void *ngx_llmgw_create_loc_conf(ngx_conf_t *cf);
static char *ngx_llmgw_merge_loc_conf(ngx_conf_t *cf, void *parent,
    void *child);
static char *ngx_llmgw_role(ngx_conf_t *cf, ngx_command_t *cmd, void *conf);
static char *ngx_llmgw_database(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_llmgw_zone_size(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_llmgw_v8host(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_llmgw_content_allow_private(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
static void ngx_llmgw_iplist_cleanup(void *data);
static ngx_int_t ngx_llmgw_init_process(ngx_cycle_t *cycle);
static void ngx_llmgw_exit_process(ngx_cycle_t *cycle);
static ngx_int_t ngx_llmgw_log_handler(ngx_http_request_t *r);
static ngx_int_t ngx_llmgw_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data);
static void ngx_llmgw_ctx_cleanup(void *data);


static char *ngx_llmgw_check_bounds(ngx_conf_t *cf, void *post, void *data);
static char *ngx_llmgw_check_size(ngx_conf_t *cf, void *post, void *data);
static char *ngx_llmgw_check_range(ngx_conf_t *cf,
    ngx_conf_num_bounds_t *bounds, ngx_int_t n, ngx_uint_t size);
static u_char *ngx_llmgw_print_bound(u_char *p, u_char *last, ngx_int_t n,
    ngx_uint_t size);
static char *ngx_llmgw_check_interval(ngx_conf_t *cf, void *post, void *data);
static char *ngx_llmgw_check_age(ngx_conf_t *cf, void *post, void *data);
static char *ngx_llmgw_check_header_name(ngx_conf_t *cf, void *post,
    void *data);
static char *ngx_llmgw_check_ca_file(ngx_conf_t *cf, void *post, void *data);
static char *ngx_llmgw_check_secret(ngx_conf_t *cf, void *post, void *data);
static char *ngx_llmgw_check_address(ngx_conf_t *cf, void *post, void *data);
static char *ngx_llmgw_set_thread_pool(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);


static ngx_conf_num_bounds_t  ngx_llmgw_tries_bounds = {
    ngx_llmgw_check_bounds, 1, NGX_LLMGW_MAX_TRIES
};

static ngx_conf_num_bounds_t  ngx_llmgw_pool_bounds = {
    ngx_llmgw_check_bounds, 1, 64
};

static ngx_conf_num_bounds_t  ngx_llmgw_count_bounds = {
    ngx_llmgw_check_bounds, 1, 100000
};

static ngx_conf_num_bounds_t  ngx_llmgw_keepalive_bounds = {
    ngx_llmgw_check_bounds, 0, 10000
};

static ngx_conf_num_bounds_t  ngx_llmgw_reserve_bounds = {
    ngx_llmgw_check_bounds, 0, 10000000
};

static ngx_conf_num_bounds_t  ngx_llmgw_backlog_bounds = {
    ngx_llmgw_check_bounds, 1, 100000000
};

/* The upstream's whole response header must fit: vendors behind
 * Cloudflare send about 2k of it. */
/* every request to a channel takes one, for the answer's head and each
   read of its body: past 1m a larger read buys nothing */
static ngx_conf_num_bounds_t  ngx_llmgw_buffer_bounds = {
    ngx_llmgw_check_size, 4096, 1024 * 1024
};

/* A runtime frame carries a hook's input (a client request, a vendor's
 * answer) with its context, and a task's vendor answer is read whole: below
 * 64k ordinary ones would not fit. */
static ngx_conf_num_bounds_t  ngx_llmgw_frame_bounds = {
    ngx_llmgw_check_size, 64 * 1024, LLMGW_FRAME_MAX_BODY
};

static ngx_conf_num_bounds_t  ngx_llmgw_answer_bounds = {
    ngx_llmgw_check_size, 64 * 1024, NGX_MAX_SIZE_T_VALUE
};

/* The core reads 0 as its default (64m), not as "no files". */
static ngx_conf_num_bounds_t  ngx_llmgw_file_bounds = {
    ngx_llmgw_check_size, 1024, NGX_MAX_SIZE_T_VALUE
};

/* Durations that drive a timer or a deadline: 0 would spin or expire at
 * once. */
static ngx_conf_post_t  ngx_llmgw_interval_bounds = {
    ngx_llmgw_check_interval
};

/* An age a timer never waits for: 0 (none) up to a year. */
static ngx_conf_post_t  ngx_llmgw_age_bounds = {
    ngx_llmgw_check_age
};

static ngx_conf_post_t  ngx_llmgw_header_name = {
    ngx_llmgw_check_header_name
};

static ngx_conf_post_t  ngx_llmgw_ca_file = {
    ngx_llmgw_check_ca_file
};

static ngx_conf_post_t  ngx_llmgw_secret = {
    ngx_llmgw_check_secret
};

static ngx_conf_post_t  ngx_llmgw_address = {
    ngx_llmgw_check_address
};


static ngx_command_t  ngx_llmgw_commands[] = {

    { ngx_string("llmgw_database"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_llmgw_database,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("llmgw_pg_pool_size"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_num_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_llmgw_main_conf_t, pg_pool_size),
      &ngx_llmgw_pool_bounds },

    { ngx_string("llmgw_pg_timeout"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_llmgw_main_conf_t, pg_timeout),
      &ngx_llmgw_interval_bounds },

    { ngx_string("llmgw_flush_interval"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_llmgw_main_conf_t, flush_interval),
      &ngx_llmgw_interval_bounds },

    { ngx_string("llmgw_ledger_backlog"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_num_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_llmgw_main_conf_t, ledger_backlog),
      &ngx_llmgw_backlog_bounds },

    { ngx_string("llmgw_ledger_wait"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_llmgw_main_conf_t, ledger_wait),
      NULL },

    { ngx_string("llmgw_offload_size"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_size_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_llmgw_main_conf_t, offload_size),
      NULL },

    { ngx_string("llmgw_thread_pool"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_llmgw_set_thread_pool,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("llmgw_refresh_interval"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_llmgw_main_conf_t, refresh_interval),
      &ngx_llmgw_interval_bounds },

    { ngx_string("llmgw_key_cache_size"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_num_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_llmgw_main_conf_t, key_cache_size),
      NULL },

    { ngx_string("llmgw_key_cache_ttl"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_llmgw_main_conf_t, key_cache_ttl),
      NULL },

    { ngx_string("llmgw_key_cache_stale"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_llmgw_main_conf_t, key_cache_stale),
      &ngx_llmgw_age_bounds },

    { ngx_string("llmgw_zone_size"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_llmgw_zone_size,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("llmgw_keepalive"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_num_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_llmgw_main_conf_t, keepalive),
      &ngx_llmgw_keepalive_bounds },

    { ngx_string("llmgw_keepalive_timeout"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_llmgw_main_conf_t, keepalive_timeout),
      NULL },

    { ngx_string("llmgw_v8host"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_llmgw_v8host,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("llmgw_v8host_connections"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_num_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_llmgw_main_conf_t, v8host_connections),
      &ngx_llmgw_pool_bounds },

    { ngx_string("llmgw_v8host_timeout"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_llmgw_main_conf_t, v8host_timeout),
      &ngx_llmgw_interval_bounds },

    { ngx_string("llmgw_v8host_max_inflight"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_num_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_llmgw_main_conf_t, v8host_max_inflight),
      &ngx_llmgw_count_bounds },

    { ngx_string("llmgw_v8host_max_frame"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_size_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_llmgw_main_conf_t, v8host_max_frame),
      &ngx_llmgw_frame_bounds },

    { ngx_string("llmgw_task_poll_interval"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_llmgw_main_conf_t, task_poll_interval),
      &ngx_llmgw_interval_bounds },

    { ngx_string("llmgw_task_poll_batch"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_num_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_llmgw_main_conf_t, task_poll_batch),
      &ngx_llmgw_count_bounds },

    { ngx_string("llmgw_task_batch_size"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_num_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_llmgw_main_conf_t, task_batch_size),
      &ngx_llmgw_count_bounds },

    { ngx_string("llmgw_task_poll_concurrency"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_num_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_llmgw_main_conf_t, task_poll_concurrency),
      &ngx_llmgw_count_bounds },

    { ngx_string("llmgw_task_poll_max_failures"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_num_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_llmgw_main_conf_t, task_poll_max_failures),
      &ngx_llmgw_count_bounds },

    { ngx_string("llmgw_task_timeout"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_llmgw_main_conf_t, task_timeout),
      &ngx_llmgw_interval_bounds },

    { ngx_string("llmgw_task_lease"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_llmgw_main_conf_t, task_lease),
      &ngx_llmgw_interval_bounds },

    { ngx_string("llmgw_task_wait_timeout"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_llmgw_main_conf_t, task_wait_timeout),
      &ngx_llmgw_interval_bounds },

    { ngx_string("llmgw_task_http_timeout"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_llmgw_main_conf_t, task_http_timeout),
      &ngx_llmgw_interval_bounds },

    { ngx_string("llmgw_task_sse_idle_timeout"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_llmgw_main_conf_t, task_sse_idle_timeout),
      &ngx_llmgw_interval_bounds },

    { ngx_string("llmgw_task_max_response"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_size_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_llmgw_main_conf_t, task_max_response),
      &ngx_llmgw_answer_bounds },

    { ngx_string("llmgw_task_max_file_size"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_size_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_llmgw_main_conf_t, task_max_file_size),
      &ngx_llmgw_file_bounds },

    { ngx_string("llmgw_task_max_files_total"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_size_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_llmgw_main_conf_t, task_max_files_total),
      &ngx_llmgw_file_bounds },

    { ngx_string("llmgw_task_ssl_verify"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_FLAG,
      ngx_conf_set_flag_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_llmgw_main_conf_t, task_ssl_verify),
      NULL },

    { ngx_string("llmgw_task_ssl_trusted_certificate"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_str_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_llmgw_main_conf_t, task_ssl_trusted_certificate),
      &ngx_llmgw_ca_file },

    { ngx_string("llmgw_content_allow_private"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_1MORE,
      ngx_llmgw_content_allow_private,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("llmgw_crypto_secret"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_str_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_llmgw_main_conf_t, crypto_secret),
      &ngx_llmgw_secret },

    { ngx_string("llmgw_task_public_address"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_str_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_llmgw_main_conf_t, task_public_address),
      &ngx_llmgw_address },

    { ngx_string("llmgw_server_address"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_str_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_llmgw_main_conf_t, server_address),
      &ngx_llmgw_address },

    { ngx_string("llmgw_artifact_link_ttl"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_llmgw_main_conf_t, artifact_link_ttl),
      &ngx_llmgw_interval_bounds },

    { ngx_string("llmgw_gateway"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS,
      ngx_llmgw_role,
      NGX_HTTP_LOC_CONF_OFFSET,
      NGX_LLMGW_ROLE_GATEWAY,
      NULL },

    { ngx_string("llmgw_admin"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS,
      ngx_llmgw_role,
      NGX_HTTP_LOC_CONF_OFFSET,
      NGX_LLMGW_ROLE_ADMIN,
      NULL },

    { ngx_string("llmgw_metrics"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS,
      ngx_llmgw_role,
      NGX_HTTP_LOC_CONF_OFFSET,
      NGX_LLMGW_ROLE_METRICS,
      NULL },

    { ngx_string("llmgw_max_tries"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_num_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_llmgw_loc_conf_t, max_tries),
      &ngx_llmgw_tries_bounds },

    { ngx_string("llmgw_reserve_tokens"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_num_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_llmgw_loc_conf_t, reserve_tokens),
      &ngx_llmgw_reserve_bounds },

    { ngx_string("llmgw_request_id_header"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_str_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_llmgw_loc_conf_t, request_id_header),
      &ngx_llmgw_header_name },

    { ngx_string("llmgw_connect_timeout"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_llmgw_loc_conf_t, upstream.connect_timeout),
      &ngx_llmgw_interval_bounds },

    { ngx_string("llmgw_send_timeout"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_llmgw_loc_conf_t, upstream.send_timeout),
      &ngx_llmgw_interval_bounds },

    { ngx_string("llmgw_read_timeout"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_llmgw_loc_conf_t, upstream.read_timeout),
      &ngx_llmgw_interval_bounds },

    { ngx_string("llmgw_buffer_size"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_size_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_llmgw_loc_conf_t, upstream.buffer_size),
      &ngx_llmgw_buffer_bounds },

    { ngx_string("llmgw_ssl_verify"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_FLAG,
      ngx_conf_set_flag_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_llmgw_loc_conf_t, ssl_verify),
      NULL },

    { ngx_string("llmgw_ssl_trusted_certificate"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_str_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_llmgw_loc_conf_t, ssl_trusted_certificate),
      &ngx_llmgw_ca_file },

    { ngx_string("llmgw_ssl_verify_depth"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_num_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_llmgw_loc_conf_t, ssl_verify_depth),
      NULL },

      ngx_null_command
};


static ngx_http_module_t  ngx_llmgw_module_ctx = {
    ngx_llmgw_add_variables,               /* preconfiguration */
    ngx_llmgw_postconfiguration,           /* postconfiguration */

    ngx_llmgw_create_main_conf,            /* create main configuration */
    ngx_llmgw_init_main_conf,              /* init main configuration */

    NULL,                                  /* create server configuration */
    NULL,                                  /* merge server configuration */

    ngx_llmgw_create_loc_conf,             /* create location configuration */
    ngx_llmgw_merge_loc_conf               /* merge location configuration */
};


ngx_module_t  ngx_http_llmgw_module = {
    NGX_MODULE_V1,
    &ngx_llmgw_module_ctx,                 /* module context */
    ngx_llmgw_commands,                    /* module directives */
    NGX_HTTP_MODULE,                       /* module type */
    NULL,                                  /* init master */
    NULL,                                  /* init module */
    ngx_llmgw_init_process,                /* init process */
    NULL,                                  /* init thread */
    NULL,                                  /* exit thread */
    ngx_llmgw_exit_process,                /* exit process */
    NULL,                                  /* exit master */
    NGX_MODULE_V1_PADDING
};


enum {
    NGX_LLMGW_VAR_REQUEST_ID = 0,
    NGX_LLMGW_VAR_MODEL,
    NGX_LLMGW_VAR_UPSTREAM_MODEL,
    NGX_LLMGW_VAR_CHANNEL,
    NGX_LLMGW_VAR_KEY_ID,
    NGX_LLMGW_VAR_USER_ID,
    NGX_LLMGW_VAR_TRIES
};


static ngx_http_variable_t  ngx_llmgw_vars[] = {

    { ngx_string("llmgw_request_id"), NULL, ngx_llmgw_variable,
      NGX_LLMGW_VAR_REQUEST_ID, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("llmgw_model"), NULL, ngx_llmgw_variable,
      NGX_LLMGW_VAR_MODEL, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("llmgw_upstream_model"), NULL, ngx_llmgw_variable,
      NGX_LLMGW_VAR_UPSTREAM_MODEL, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("llmgw_channel"), NULL, ngx_llmgw_variable,
      NGX_LLMGW_VAR_CHANNEL, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("llmgw_key_id"), NULL, ngx_llmgw_variable,
      NGX_LLMGW_VAR_KEY_ID, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("llmgw_user_id"), NULL, ngx_llmgw_variable,
      NGX_LLMGW_VAR_USER_ID, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("llmgw_tries"), NULL, ngx_llmgw_variable,
      NGX_LLMGW_VAR_TRIES, NGX_HTTP_VAR_NOCACHEABLE, 0 },

      ngx_http_null_variable
};


static ngx_int_t ngx_llmgw_content_handler(ngx_http_request_t *r);


/* A request that came before the worker's first configuration, again. */
static void
ngx_llmgw_config_ready(ngx_http_request_t *r)
{
    ngx_http_finalize_request(r, ngx_llmgw_content_handler(r));
}


static ngx_int_t
ngx_llmgw_content_handler(ngx_http_request_t *r)
{
    ngx_llmgw_ctx_t       *ctx;
    ngx_llmgw_loc_conf_t  *lcf;

    lcf = ngx_http_get_module_loc_conf(r, ngx_http_llmgw_module);

    /*
     * A worker new from a start or a reload loads its configuration first:
     * a request that comes before waits for that load (bounded by
     * llmgw_pg_timeout) instead of being refused, once.
     */
    if (lcf->role != NGX_LLMGW_ROLE_METRICS) {
        ctx = ngx_llmgw_get_ctx(r);

        if (ctx != NULL && !ctx->config_waited) {
            ctx->config_waited = 1;

            if (ngx_llmgw_cache_wait_first(r, ngx_llmgw_config_ready)
                == NGX_AGAIN)
            {
                r->main->count++;
                return NGX_DONE;
            }
        }
    }

    switch (lcf->role) {

    case NGX_LLMGW_ROLE_ADMIN:
        return ngx_llmgw_admin_handler(r);

    case NGX_LLMGW_ROLE_METRICS:
        return ngx_llmgw_metrics_handler(r);

    default:
        return ngx_llmgw_gateway_handler(r);
    }
}


static u_char      ngx_llmgw_rid_prefix[6];
static ngx_uint_t  ngx_llmgw_rid_ready;
static uint32_t    ngx_llmgw_rid_counter;
static uint64_t    ngx_llmgw_rid_msec;


/* nginx's debug log names an event by the fd of the connection in its
   data ("event timer add: <fd>: ..."): the module's own timers, which
   belong to no connection, point at this one instead of at nothing */
ngx_connection_t  ngx_llmgw_no_connection = { .fd = (ngx_socket_t) -1 };


ngx_llmgw_ctx_t *
ngx_llmgw_get_ctx(ngx_http_request_t *r)
{
    size_t               i;
    u_char               rnd[NGX_LLMGW_REQUEST_ID_LEN / 2];
    uint64_t             msec;
    ngx_time_t          *tp;
    ngx_llmgw_ctx_t     *ctx;
    ngx_pool_cleanup_t  *cln;

    ctx = ngx_http_get_module_ctx(r->main, ngx_http_llmgw_module);
    if (ctx != NULL) {
        return ctx;
    }

    ctx = ngx_pcalloc(r->main->pool, sizeof(ngx_llmgw_ctx_t));
    if (ctx == NULL) {
        return NULL;
    }

    cln = ngx_pool_cleanup_add(r->main->pool, 0);
    if (cln == NULL) {
        return NULL;
    }

    cln->handler = ngx_llmgw_ctx_cleanup;
    cln->data = ctx;

    ctx->request = r->main;
    ctx->current = -1;
    ctx->length = -1;
    ctx->start_msec = ngx_current_msec;

    /*
     * The time in milliseconds, a random part per process and a counter:
     * unique across workers and nodes without a random draw per request,
     * and ordered by time, so that every writer adds its ledger rows at
     * the right edge of the request id index instead of at a place of its
     * own in the middle.  The time never goes back within a process (a
     * clock set back keeps the last one), and moves on by itself should
     * the counter come round within one millisecond.
     */
    if (!ngx_llmgw_rid_ready) {
        if (RAND_bytes(ngx_llmgw_rid_prefix, sizeof(ngx_llmgw_rid_prefix))
            != 1)
        {
            ngx_memcpy(ngx_llmgw_rid_prefix, &ngx_pid,
                       ngx_min(sizeof(ngx_pid),
                               sizeof(ngx_llmgw_rid_prefix)));
        }
        ngx_llmgw_rid_ready = 1;
    }

    tp = ngx_timeofday();
    msec = (uint64_t) tp->sec * 1000 + tp->msec;

    if (msec > ngx_llmgw_rid_msec) {
        ngx_llmgw_rid_msec = msec;
    }

    if (++ngx_llmgw_rid_counter == 0) {
        ngx_llmgw_rid_msec++;
    }

    for (i = 0; i < 6; i++) {
        rnd[i] = (u_char) (ngx_llmgw_rid_msec >> (8 * (5 - i)));
    }

    ngx_memcpy(&rnd[6], ngx_llmgw_rid_prefix, sizeof(ngx_llmgw_rid_prefix));

    for (i = 0; i < 4; i++) {
        rnd[12 + i] = (u_char) (ngx_llmgw_rid_counter >> (8 * (3 - i)));
    }

    ngx_hex_dump(ctx->request_id, rnd, sizeof(rnd));
    ctx->request_id[NGX_LLMGW_REQUEST_ID_LEN] = '\0';

    ngx_http_set_ctx(r->main, ctx, ngx_http_llmgw_module);

    return ctx;
}


static void
ngx_llmgw_ctx_cleanup(void *data)
{
    ngx_llmgw_ctx_t  *ctx = data;

    ngx_llmgw_admit_cancel(ctx);

    /*
     * A request that ends without its log phase (an internal redirect to
     * an error_page clears the module contexts) still gives its
     * reservation back.
     */
    ngx_llmgw_billing_release(ctx);

    llmgw_token_free(ctx->token);
    llmgw_req_free(ctx->req);
    llmgw_resp_free(ctx->resp);

    if (ctx->snapshot) {
        ngx_llmgw_cache_release(ctx->snapshot);
    }

    ctx->token = NULL;
    ctx->req = NULL;
    ctx->resp = NULL;
    ctx->snapshot = NULL;
}


ngx_int_t
ngx_llmgw_send_json(ngx_http_request_t *r, ngx_uint_t status, u_char *data,
    size_t len)
{
    ngx_int_t         rc;
    ngx_buf_t        *b;
    ngx_chain_t       out;
    ngx_llmgw_ctx_t  *ctx;

    ctx = ngx_llmgw_get_ctx(r);
    if (ctx == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ctx->responded = 1;

    if (ngx_http_discard_request_body(r) != NGX_OK) {
        r->keepalive = 0;
    }

    /* an empty body is a buffer with no memory: nginx refuses an empty
       temporary one ("zero size buf") */
    b = (len > 0) ? ngx_create_temp_buf(r->pool, len) : ngx_calloc_buf(r->pool);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (len > 0) {
        b->last = ngx_cpymem(b->pos, data, len);
    }
    b->last_buf = (r == r->main) ? 1 : 0;
    b->last_in_chain = 1;

    r->headers_out.status = status;
    r->headers_out.content_length_n = len;

    /* recorded before the answer leaves: a worker killed now loses no row */
    ngx_llmgw_gateway_log(r, ctx);

    ngx_str_set(&r->headers_out.content_type, "application/json");
    r->headers_out.content_type_len = r->headers_out.content_type.len;
    r->headers_out.content_type_lowcase = NULL;

    rc = ngx_http_send_header(r);

    if (rc == NGX_ERROR || rc > NGX_OK || r->header_only) {
        return rc;
    }

    out.buf = b;
    out.next = NULL;

    return ngx_http_output_filter(r, &out);
}


ngx_int_t
ngx_llmgw_send_error(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx,
    const llmgw_verdict_t *v)
{
    ngx_int_t    rc;
    llmgw_buf_t  body;

    if (v->status == NGX_HTTP_NOT_ALLOWED
        && ngx_llmgw_allow_header(r, v->message) != NGX_OK)
    {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    /* a plugin's native route: its native.error shapes the body */
    rc = ngx_llmgw_task_refuse(r, ctx, v);
    if (rc != NGX_DECLINED) {
        return rc;
    }

    body = llmgw_error_json(
        (llmgw_str_t) { v->message, ngx_strlen(v->message) },
        (llmgw_str_t) { v->type, ngx_strlen(v->type) },
        (llmgw_str_t) { v->code, ngx_strlen(v->code) },
        (llmgw_str_t) { (char *) ctx->request_id, NGX_LLMGW_REQUEST_ID_LEN });

    if (body.data == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    rc = ngx_llmgw_send_json(r, v->status, (u_char *) body.data, body.len);
    llmgw_buf_free(&body);

    return rc;
}


/*
 * A 405 names the methods the path takes: its message ends with
 * " (allowed: GET, POST)", which the gateway or the admin API appended
 * after the path the client sent; those go in its Allow header too (RFC
 * 9110 15.5.6).  Only that end of the message is read, and only method
 * names and ", ": the path before it is the client's text.
 */
ngx_int_t
ngx_llmgw_allow_header(ngx_http_request_t *r, const char *message)
{
    size_t            len;
    u_char           *p, *end;
    static ngx_str_t  allow = ngx_string("Allow");

    len = ngx_strlen(message);

    if (len < sizeof("(allowed: X)") - 1 || message[len - 1] != ')') {
        return NGX_OK;
    }

    end = (u_char *) message + len - 1;

    for (p = end; p > (u_char *) message; p--) {
        if (!((p[-1] >= 'A' && p[-1] <= 'Z') || p[-1] == ',' || p[-1] == ' '))
        {
            break;
        }
    }

    if (p == end
        || (size_t) (p - (u_char *) message) < sizeof("(allowed:") - 1
        || ngx_strncmp(p - (sizeof("(allowed:") - 1), "(allowed:",
                       sizeof("(allowed:") - 1) != 0)
    {
        return NGX_OK;
    }

    while (p < end && *p == ' ') {
        p++;
    }

    if (p == end) {
        return NGX_OK;
    }

    return ngx_llmgw_out_header(r, &allow, p, end - p);
}


/* A response header; the value is copied into the request's pool. */
ngx_int_t
ngx_llmgw_out_header(ngx_http_request_t *r, ngx_str_t *key, u_char *value,
    size_t len)
{
    ngx_table_elt_t  *h;

    h = ngx_list_push(&r->headers_out.headers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    h->hash = 1;
    h->key = *key;
    h->value.len = len;
    h->value.data = ngx_pnalloc(r->pool, len);
    if (h->value.data == NULL) {
        h->hash = 0;                    /* not sent */
        return NGX_ERROR;
    }
    ngx_memcpy(h->value.data, value, len);

    return NGX_OK;
}


/* The whole client body as one piece (it may sit in a temp file). */
ngx_int_t
ngx_llmgw_read_body(ngx_http_request_t *r, ngx_str_t *body)
{
    off_t         len;
    u_char       *p;
    ssize_t       n;
    ngx_buf_t    *b;
    ngx_chain_t  *cl;

    ngx_str_null(body);

    if (r->request_body == NULL || r->request_body->bufs == NULL) {
        return NGX_OK;
    }

    len = 0;

    for (cl = r->request_body->bufs; cl; cl = cl->next) {
        len += ngx_buf_size(cl->buf);
    }

    if (len == 0) {
        return NGX_OK;
    }

    cl = r->request_body->bufs;

    if (cl->next == NULL && !cl->buf->in_file) {
        body->data = cl->buf->pos;
        body->len = cl->buf->last - cl->buf->pos;
        return NGX_OK;
    }

    p = ngx_pnalloc(r->pool, len);
    if (p == NULL) {
        return NGX_ERROR;
    }

    body->data = p;

    for (; cl; cl = cl->next) {
        b = cl->buf;

        if (b->in_file) {
            n = ngx_read_file(b->file, p, b->file_last - b->file_pos,
                              b->file_pos);
            if (n == NGX_ERROR) {
                return NGX_ERROR;
            }
            p += n;

        } else {
            p = ngx_cpymem(p, b->pos, b->last - b->pos);
        }
    }

    body->len = p - body->data;

    return NGX_OK;
}


static ngx_int_t
ngx_llmgw_variable(ngx_http_request_t *r, ngx_http_variable_value_t *v,
    uintptr_t data)
{
    u_char           *p;
    int64_t           n;
    ngx_llmgw_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r->main, ngx_http_llmgw_module);

    if (ctx == NULL) {
        v->not_found = 1;
        return NGX_OK;
    }

    v->valid = 1;
    v->no_cacheable = 1;
    v->not_found = 0;

    switch (data) {

    case NGX_LLMGW_VAR_REQUEST_ID:
        v->data = ctx->request_id;
        v->len = NGX_LLMGW_REQUEST_ID_LEN;
        return NGX_OK;

    case NGX_LLMGW_VAR_MODEL:
        v->data = ctx->model.data;
        v->len = ctx->model.len;
        break;

    case NGX_LLMGW_VAR_UPSTREAM_MODEL:
        v->data = ctx->upstream_model.data;
        v->len = ctx->upstream_model.len;
        break;

    default:
        switch (data) {
        case NGX_LLMGW_VAR_CHANNEL:
            n = ctx->current >= 0 ? ctx->channels[ctx->current]->id : 0;
            break;
        case NGX_LLMGW_VAR_KEY_ID:
            n = ctx->token_id;
            break;
        case NGX_LLMGW_VAR_USER_ID:
            n = ctx->user_id;
            break;
        default:
            n = ctx->tried;
        }

        p = ngx_pnalloc(r->pool, NGX_INT64_LEN);
        if (p == NULL) {
            return NGX_ERROR;
        }

        v->data = p;
        v->len = ngx_sprintf(p, "%L", n) - p;
        return NGX_OK;
    }

    if (v->len == 0) {
        v->data = (u_char *) "-";
        v->len = 1;
    }

    return NGX_OK;
}


static ngx_int_t
ngx_llmgw_add_variables(ngx_conf_t *cf)
{
    ngx_http_variable_t  *var, *v;

    for (v = ngx_llmgw_vars; v->name.len; v++) {
        var = ngx_http_add_variable(cf, &v->name, v->flags);
        if (var == NULL) {
            return NGX_ERROR;
        }

        var->get_handler = v->get_handler;
        var->data = v->data;
    }

    return NGX_OK;
}


/* Settlement, the ledger row, metrics and the rate limiter's success log. */
static ngx_int_t
ngx_llmgw_log_handler(ngx_http_request_t *r)
{
    ngx_llmgw_ctx_t       *ctx;
    ngx_llmgw_loc_conf_t  *lcf;

    ctx = ngx_http_get_module_ctx(r, ngx_http_llmgw_module);
    lcf = ngx_http_get_module_loc_conf(r, ngx_http_llmgw_module);

    /* an llmgw location, or an error made before any location; not
       another location whose ?key= was only masked (ngx_llmgw_post_read) */
    if (ctx != NULL && r == r->main
        && (lcf->role != NGX_LLMGW_ROLE_NONE || lcf->server_errors))
    {
        ngx_llmgw_gateway_log(r, ctx);
    }

    return NGX_OK;
}


/*
 * The first log handler: in a server with llmgw locations a ?key= is
 * masked before any log reads the request, whatever location served it,
 * also in a request nginx refused while reading its head (a header that
 * is bad or too large, a URI too long, a head that did not arrive in
 * time), which no phase handler saw.
 */
static ngx_int_t
ngx_llmgw_log_mask(ngx_http_request_t *r)
{
    ngx_llmgw_loc_conf_t       *slcf;
    ngx_http_core_srv_conf_t   *cscf;

    /* the server's own configuration, as ngx_llmgw_post_read reads it */
    cscf = ngx_http_get_module_srv_conf(r, ngx_http_core_module);
    slcf = cscf->ctx->loc_conf[ngx_http_llmgw_module.ctx_index];

    if (r == r->main && slcf->server_errors) {
        ngx_llmgw_mask_query_key(r);
    }

    return NGX_OK;
}


static ngx_int_t
ngx_llmgw_postconfiguration(ngx_conf_t *cf)
{
    ngx_array_t                *log;
    ngx_http_handler_pt        *h;
    ngx_llmgw_main_conf_t      *mcf;
    ngx_http_core_loc_conf_t   *clcf;
    ngx_http_core_main_conf_t  *cmcf;

    cmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_core_module);
    log = &cmcf->phases[NGX_HTTP_LOG_PHASE].handlers;

    /* nginx runs the log handlers in the array's order, and the access
       log's (a module before this one) is in it already */
    h = ngx_array_push(log);
    if (h == NULL) {
        return NGX_ERROR;
    }

    h = log->elts;
    ngx_memmove(&h[1], &h[0],
                (log->nelts - 1) * sizeof(ngx_http_handler_pt));
    h[0] = ngx_llmgw_log_mask;

    h = ngx_array_push(log);
    if (h == NULL) {
        return NGX_ERROR;
    }

    *h = ngx_llmgw_log_handler;

    h = ngx_array_push(&cmcf->phases[NGX_HTTP_POST_READ_PHASE].handlers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    *h = ngx_llmgw_post_read;

    /* The task engine's HTTP client runs outside any request: it uses the
     * resolver of the http{} block. */
    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);
    mcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_llmgw_module);
    mcf->resolver = clcf->resolver;
    mcf->resolver_timeout = clcf->resolver_timeout == NGX_CONF_UNSET_MSEC
                            ? 30000 : clcf->resolver_timeout;

    return ngx_llmgw_errpage_init(cf);
}


static void *
ngx_llmgw_create_main_conf(ngx_conf_t *cf)
{
    ngx_llmgw_main_conf_t  *mcf;

    mcf = ngx_pcalloc(cf->pool, sizeof(ngx_llmgw_main_conf_t));
    if (mcf == NULL) {
        return NULL;
    }

    mcf->pg_pool_size = NGX_CONF_UNSET_UINT;
    mcf->pg_timeout = NGX_CONF_UNSET_MSEC;
    mcf->flush_interval = NGX_CONF_UNSET_MSEC;
    mcf->ledger_backlog = NGX_CONF_UNSET_UINT;
    mcf->ledger_wait = NGX_CONF_UNSET_MSEC;
    mcf->offload_size = NGX_CONF_UNSET_SIZE;
    mcf->refresh_interval = NGX_CONF_UNSET_MSEC;
    mcf->key_cache_size = NGX_CONF_UNSET_UINT;
    mcf->key_cache_ttl = NGX_CONF_UNSET_MSEC;
    mcf->key_cache_stale = NGX_CONF_UNSET_MSEC;
    mcf->shm_size = NGX_CONF_UNSET;
    mcf->keepalive = NGX_CONF_UNSET_UINT;
    mcf->keepalive_timeout = NGX_CONF_UNSET_MSEC;
    mcf->v8host_connections = NGX_CONF_UNSET_UINT;
    mcf->v8host_timeout = NGX_CONF_UNSET_MSEC;
    mcf->v8host_max_inflight = NGX_CONF_UNSET_UINT;
    mcf->v8host_max_frame = NGX_CONF_UNSET_SIZE;
    mcf->task_poll_interval = NGX_CONF_UNSET_MSEC;
    mcf->task_poll_batch = NGX_CONF_UNSET_UINT;
    mcf->task_batch_size = NGX_CONF_UNSET_UINT;
    mcf->task_poll_concurrency = NGX_CONF_UNSET_UINT;
    mcf->task_poll_max_failures = NGX_CONF_UNSET_UINT;
    mcf->task_timeout = NGX_CONF_UNSET_MSEC;
    mcf->task_lease = NGX_CONF_UNSET_MSEC;
    mcf->task_wait_timeout = NGX_CONF_UNSET_MSEC;
    mcf->artifact_link_ttl = NGX_CONF_UNSET_MSEC;
    mcf->task_http_timeout = NGX_CONF_UNSET_MSEC;
    mcf->task_sse_idle_timeout = NGX_CONF_UNSET_MSEC;
    mcf->task_max_response = NGX_CONF_UNSET_SIZE;
    mcf->task_max_file_size = NGX_CONF_UNSET_SIZE;
    mcf->task_max_files_total = NGX_CONF_UNSET_SIZE;
    mcf->task_ssl_verify = NGX_CONF_UNSET;

    return mcf;
}


/* llmgw_thread_pool: the pool is looked up where the directive stands, so
   that an unknown name is reported at this line. */
static char *
ngx_llmgw_set_thread_pool(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_llmgw_main_conf_t *mcf = conf;

    ngx_str_t  *value;

    if (mcf->thread_pool_name.data != NULL) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (value[1].len == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"llmgw_thread_pool\" needs a pool name");
        return NGX_CONF_ERROR;
    }

    mcf->thread_pool_name = value[1];

#if (NGX_THREADS)
    mcf->thread_pool = ngx_thread_pool_add(cf, &value[1]);
    if (mcf->thread_pool == NULL) {
        return NGX_CONF_ERROR;
    }
#endif

    return NGX_CONF_OK;
}


static char *
ngx_llmgw_init_main_conf(ngx_conf_t *cf, void *conf)
{
    ngx_llmgw_main_conf_t *mcf = conf;

    static ngx_str_t  zone_name = ngx_string("llmgw");

    /* keys, channels and the ledger live in the database: a gateway
       without one could only fail every request */
    if (mcf->needs_database && mcf->database.len == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"llmgw_gateway\" and \"llmgw_admin\" need "
                           "\"llmgw_database\"");
        return NGX_CONF_ERROR;
    }

    ngx_conf_init_uint_value(mcf->pg_pool_size, 4);
    ngx_conf_init_msec_value(mcf->pg_timeout, 5000);
    ngx_conf_init_msec_value(mcf->flush_interval, 1000);
    ngx_conf_init_uint_value(mcf->ledger_backlog, 30000);
    ngx_conf_init_msec_value(mcf->ledger_wait, 2000);
    ngx_conf_init_size_value(mcf->offload_size, 128 * 1024);
    ngx_conf_init_msec_value(mcf->refresh_interval, 1000);
    ngx_conf_init_uint_value(mcf->key_cache_size, 100000);
    ngx_conf_init_msec_value(mcf->key_cache_ttl, 10000);
    ngx_conf_init_msec_value(mcf->key_cache_stale, 600000);
    if (mcf->shm_size == NGX_CONF_UNSET) {
        mcf->shm_size = 64 * 1024 * 1024;
    }
    ngx_conf_init_uint_value(mcf->keepalive, 64);
    ngx_conf_init_msec_value(mcf->keepalive_timeout, 60000);
    ngx_conf_init_uint_value(mcf->v8host_connections, 8);
    ngx_conf_init_msec_value(mcf->v8host_timeout, 10000);
    ngx_conf_init_uint_value(mcf->v8host_max_inflight, 1024);
    ngx_conf_init_size_value(mcf->v8host_max_frame, LLMGW_FRAME_MAX_BODY);
    ngx_conf_init_msec_value(mcf->task_poll_interval, 15000);
    ngx_conf_init_uint_value(mcf->task_poll_batch, 1000);
    ngx_conf_init_uint_value(mcf->task_batch_size, 100);
    ngx_conf_init_uint_value(mcf->task_poll_concurrency, 8);
    ngx_conf_init_uint_value(mcf->task_poll_max_failures, 20);
    ngx_conf_init_msec_value(mcf->task_timeout, 24 * 3600 * 1000);
    ngx_conf_init_msec_value(mcf->task_lease, 60000);
    ngx_conf_init_msec_value(mcf->task_wait_timeout,
                             LLMGW_TASK_WAIT_DEFAULT_MS);
    ngx_conf_init_msec_value(mcf->artifact_link_ttl, 3600 * 1000);
    ngx_conf_init_msec_value(mcf->task_http_timeout, 60000);
    ngx_conf_init_msec_value(mcf->task_sse_idle_timeout, 30000);
    ngx_conf_init_size_value(mcf->task_max_response, 16 * 1024 * 1024);
    ngx_conf_init_size_value(mcf->task_max_file_size, 64 * 1024 * 1024);
    ngx_conf_init_size_value(mcf->task_max_files_total, 64 * 1024 * 1024);
    ngx_conf_init_value(mcf->task_ssl_verify, 1);

    /* large request bodies are read and converted in a thread pool (the
       default pool unless llmgw_thread_pool named another) */
#if (NGX_THREADS)
    if (mcf->offload_size == 0 || !mcf->needs_database) {
        mcf->thread_pool = NULL;

    } else if (mcf->thread_pool == NULL) {
        mcf->thread_pool = ngx_thread_pool_add(cf, NULL);
        if (mcf->thread_pool == NULL) {
            return NGX_CONF_ERROR;
        }
    }
#else
    mcf->offload_size = 0;
#endif

    mcf->shm_zone = ngx_shared_memory_add(cf, &zone_name, mcf->shm_size,
                                          &ngx_http_llmgw_module);
    if (mcf->shm_zone == NULL) {
        return NGX_CONF_ERROR;
    }

    mcf->shm_zone->init = ngx_llmgw_shm_init_zone;
    mcf->shm_zone->data = mcf;

    return NGX_CONF_OK;
}


static void *
ngx_llmgw_create_loc_conf(ngx_conf_t *cf)
{
    ngx_llmgw_loc_conf_t  *conf;

    conf = ngx_pcalloc(cf->pool, sizeof(ngx_llmgw_loc_conf_t));
    if (conf == NULL) {
        return NULL;
    }

    conf->role = NGX_CONF_UNSET_UINT;
    conf->max_tries = NGX_CONF_UNSET_UINT;
    conf->reserve_tokens = NGX_CONF_UNSET_UINT;
    conf->ssl_verify = NGX_CONF_UNSET;
    conf->ssl_verify_depth = NGX_CONF_UNSET_UINT;

    conf->upstream.connect_timeout = NGX_CONF_UNSET_MSEC;
    conf->upstream.send_timeout = NGX_CONF_UNSET_MSEC;
    conf->upstream.read_timeout = NGX_CONF_UNSET_MSEC;
    conf->upstream.buffer_size = NGX_CONF_UNSET_SIZE;
    conf->upstream.hide_headers = NGX_CONF_UNSET_PTR;
    conf->upstream.pass_headers = NGX_CONF_UNSET_PTR;

    return conf;
}


static char *
ngx_llmgw_merge_loc_conf(ngx_conf_t *cf, void *parent, void *child)
{
    ngx_llmgw_loc_conf_t *prev = parent;
    ngx_llmgw_loc_conf_t *conf = child;

    ngx_http_core_loc_conf_t  *clcf;

    ngx_conf_merge_uint_value(conf->role, prev->role, NGX_LLMGW_ROLE_NONE);

    if (conf->role != NGX_LLMGW_ROLE_NONE || conf->server_errors) {
        /*
         * Every answer of an llmgw location keeps the JSON error contract
         * (and its request keeps its ledger row): an error_page, inherited
         * or not, would send the client to another location instead.  So
         * do errors nginx makes before any location in a server with llmgw
         * locations (the server's own configuration, server_errors).
         * nginx merges its core module first, at every level, so this is
         * the final value, and the server's other locations keep the
         * error pages they inherited.
         */
        clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);
        clcf->error_pages = NULL;
    }
    ngx_conf_merge_uint_value(conf->max_tries, prev->max_tries, 3);
    ngx_conf_merge_uint_value(conf->reserve_tokens, prev->reserve_tokens,
                              1024);
    ngx_conf_merge_str_value(conf->request_id_header,
                             prev->request_id_header, "X-Request-Id");
    ngx_conf_merge_value(conf->ssl_verify, prev->ssl_verify, 1);
    ngx_conf_merge_str_value(conf->ssl_trusted_certificate,
                             prev->ssl_trusted_certificate,
                             "/etc/ssl/certs/ca-certificates.crt");
    ngx_conf_merge_uint_value(conf->ssl_verify_depth, prev->ssl_verify_depth,
                              4);

    ngx_conf_merge_msec_value(conf->upstream.connect_timeout,
                              prev->upstream.connect_timeout, 10000);
    ngx_conf_merge_msec_value(conf->upstream.send_timeout,
                              prev->upstream.send_timeout, 60000);
    ngx_conf_merge_msec_value(conf->upstream.read_timeout,
                              prev->upstream.read_timeout, 300000);
    ngx_conf_merge_size_value(conf->upstream.buffer_size,
                              prev->upstream.buffer_size,
                              (size_t) ngx_pagesize * 4);

    return ngx_llmgw_upstream_merge(cf, prev, conf);
}


static char *
ngx_llmgw_role(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_llmgw_loc_conf_t *lcf = conf;

    ngx_llmgw_loc_conf_t      *slcf;
    ngx_llmgw_main_conf_t     *mcf;
    ngx_http_core_loc_conf_t  *clcf;
    ngx_http_core_srv_conf_t  *cscf;

    if (lcf->role != NGX_CONF_UNSET_UINT) {
        return "is duplicate, or the location already has another llmgw role";
    }

    lcf->role = cmd->offset;

    if (lcf->role != NGX_LLMGW_ROLE_METRICS) {
        mcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_llmgw_module);
        mcf->needs_database = 1;
    }

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);
    clcf->handler = ngx_llmgw_content_handler;

    cscf = ngx_http_conf_get_module_srv_conf(cf, ngx_http_core_module);
    slcf = cscf->ctx->loc_conf[ngx_http_llmgw_module.ctx_index];
    slcf->server_errors = 1;

    return NGX_CONF_OK;
}


static char *
ngx_llmgw_database(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_llmgw_main_conf_t *mcf = conf;

    char               *err = NULL;
    ngx_str_t          *value;
    ngx_uint_t          bare;
    PQconninfoOption   *opts;

    if (mcf->database.data) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (value[1].len == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"llmgw_database\" needs a libpq connection "
                           "string such as \"host=/run/postgresql "
                           "dbname=llmgw\"");
        return NGX_CONF_ERROR;
    }

    /* what libpq would refuse at the first connection, refused here; its
       message is quoted only when it names an option (another may quote a
       piece of the string, a password say) */
    /* a bare name is a database's (the pool expands it as libpq does) */
    bare = ngx_strlchr(value[1].data, value[1].data + value[1].len, '=')
               == NULL
           && ngx_strncmp(value[1].data, "postgres://", 11) != 0
           && ngx_strncmp(value[1].data, "postgresql://", 13) != 0;

    opts = bare ? NULL : PQconninfoParse((char *) value[1].data, &err);

    if (!bare && opts == NULL) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"llmgw_database\" is not a connection string "
                           "libpq accepts%s%s",
                           err && ngx_strstr(err, "invalid connection option")
                           ? ": " : "",
                           err && ngx_strstr(err, "invalid connection option")
                           ? err : "");
        if (err) {
            PQfreemem(err);
        }
        return NGX_CONF_ERROR;
    }

    if (opts != NULL) {
        PQconninfoFree(opts);
    }

    mcf->database = value[1];

    return NGX_CONF_OK;
}


static char *
ngx_llmgw_zone_size(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_llmgw_main_conf_t *mcf = conf;

    ngx_str_t              *value;
    ngx_conf_num_bounds_t   bounds;

    if (mcf->shm_size != NGX_CONF_UNSET) {
        return "is duplicate";
    }

    value = cf->args->elts;

    mcf->shm_size = ngx_parse_size(&value[1]);

    if (mcf->shm_size == NGX_ERROR) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid \"llmgw_zone_size\" value \"%V\"",
                           &value[1]);
        return NGX_CONF_ERROR;
    }

    /* as limit_req_zone: the slab allocator keeps pages for itself */
    bounds.post_handler = NULL;
    bounds.low = 8 * ngx_pagesize;
    bounds.high = NGX_MAX_SIZE_T_VALUE;

    return ngx_llmgw_check_range(cf, &bounds, mcf->shm_size, 1);
}


/* As ngx_conf_check_num_bounds, but nginx's message names the directive. */
static char *
ngx_llmgw_check_bounds(ngx_conf_t *cf, void *post, void *data)
{
    ngx_int_t  *np = data;

    return ngx_llmgw_check_range(cf, post, *np, 0);
}


/* The same for a size, whose bounds the message writes as sizes (64k). */
static char *
ngx_llmgw_check_size(ngx_conf_t *cf, void *post, void *data)
{
    size_t  *sp = data;

    return ngx_llmgw_check_range(cf, post, (ngx_int_t) *sp, 1);
}


static u_char *
ngx_llmgw_print_bound(u_char *p, u_char *last, ngx_int_t n, ngx_uint_t size)
{
    if (size && n > 0 && n % (1024 * 1024) == 0) {
        return ngx_slprintf(p, last, "%im", n / (1024 * 1024));
    }

    if (size && n > 0 && n % 1024 == 0) {
        return ngx_slprintf(p, last, "%ik", n / 1024);
    }

    return ngx_slprintf(p, last, "%i", n);
}


/* NGX_CONF_OK, or the message; a high of NGX_MAX_SIZE_T_VALUE is none. */
static char *
ngx_llmgw_check_range(ngx_conf_t *cf, ngx_conf_num_bounds_t *bounds,
    ngx_int_t n, ngx_uint_t size)
{
    u_char  *p, *q, *last;

    if (n >= bounds->low && n <= bounds->high) {
        return NGX_CONF_OK;
    }

    p = ngx_pnalloc(cf->pool, 64);
    if (p == NULL) {
        return NGX_CONF_ERROR;
    }

    last = p + 63;

    if (bounds->high == NGX_MAX_SIZE_T_VALUE) {
        q = ngx_slprintf(p, last, "must be at least ");
        q = ngx_llmgw_print_bound(q, last, bounds->low, size);

    } else {
        q = ngx_slprintf(p, last, "must be between ");
        q = ngx_llmgw_print_bound(q, last, bounds->low, size);
        q = ngx_slprintf(q, last, " and ");
        q = ngx_llmgw_print_bound(q, last, bounds->high, size);
    }

    *q = '\0';

    return (char *) p;
}


/* A duration between 1ms and a year (a longer timer would not fit). */
static char *
ngx_llmgw_check_interval(ngx_conf_t *cf, void *post, void *data)
{
    ngx_msec_t  *mp = data;

    if (*mp >= 1 && *mp <= (ngx_msec_t) 366 * 24 * 3600 * 1000) {
        return NGX_CONF_OK;
    }

    return "must be between 1ms and 366d";
}


static char *
ngx_llmgw_check_age(ngx_conf_t *cf, void *post, void *data)
{
    ngx_msec_t  *mp = data;

    if (*mp <= (ngx_msec_t) 366 * 24 * 3600 * 1000) {
        return NGX_CONF_OK;
    }

    return "must be between 0 and 366d";
}


/*
 * The name goes as it is into the header of every answer: an RFC 9110
 * token, so that it cannot end the header line or the header block.
 */
static char *
ngx_llmgw_check_header_name(ngx_conf_t *cf, void *post, void *data)
{
    ngx_str_t  *name = data;

    u_char      c;
    ngx_uint_t  i;

    if (name->len == 0) {
        return "must not be empty";
    }

    for (i = 0; i < name->len; i++) {
        c = name->data[i];

        if ((c >= '0' && c <= '9')
            || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z')
            || (c != '\0' && ngx_strchr("!#$%&'*+-.^_`|~", c) != NULL))
        {
            continue;
        }

        return "must be a header name such as \"X-Request-Id\"";
    }

    return NGX_CONF_OK;
}


/*
 * A CA bundle is read here, so that nginx -t refuses a missing or broken
 * one at its directive, whether verification is on or not; the gateway
 * loads it again per location, the task client in each worker.
 */
/* Artifact links are only as strong as the key they are signed with. */
static char *
ngx_llmgw_check_secret(ngx_conf_t *cf, void *post, void *data)
{
    ngx_str_t  *secret = data;

    if (secret->len < 32) {
        return "must be at least 32 characters long";
    }

    if (secret->len > 1024) {
        return "must be at most 1024 characters long";
    }

    return NGX_CONF_OK;
}


/* The address clients reach the gateway at: http(s)://host[:port][/path]. */
static char *
ngx_llmgw_check_address(ngx_conf_t *cf, void *post, void *data)
{
    ngx_str_t  *a = data;

    size_t   i, start;

    if (a->len > 7 && ngx_strncasecmp(a->data, (u_char *) "http://", 7) == 0)
    {
        start = 7;

    } else if (a->len > 8
               && ngx_strncasecmp(a->data, (u_char *) "https://", 8) == 0)
    {
        start = 8;

    } else {
        return "must be an http:// or https:// address";
    }

    if (a->data[start] == '/' || a->len > 2048) {
        return "must be an http:// or https:// address with a host";
    }

    for (i = start; i < a->len; i++) {
        if (a->data[i] <= ' ' || a->data[i] == 0x7f || a->data[i] == '?'
            || a->data[i] == '#' || a->data[i] == '"' || a->data[i] == '\\')
        {
            return "must be an address without spaces, query or fragment";
        }
    }

    /* links are made by appending "/v1/...": no slash at the end */
    while (a->len > start && a->data[a->len - 1] == '/') {
        a->len--;
    }

    return NGX_CONF_OK;
}


static char *
ngx_llmgw_check_ca_file(ngx_conf_t *cf, void *post, void *data)
{
    ngx_str_t  *file = data;

    ngx_fd_t        fd;
    ngx_str_t      *value, path;
    const char     *reason;
    X509_STORE     *store;
    unsigned long   err;

    if (file->len == 0) {
        return "must name a file";
    }

    value = cf->args->elts;
    path = *file;

    if (ngx_conf_full_name(cf->cycle, &path, 1) != NGX_OK) {
        return NGX_CONF_ERROR;
    }

    fd = ngx_open_file(path.data, NGX_FILE_RDONLY, NGX_FILE_OPEN, 0);

    if (fd == NGX_INVALID_FILE) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, ngx_errno,
                           "\"%V\" cannot open \"%s\"", &value[0], path.data);
        return NGX_CONF_ERROR;
    }

    ngx_close_file(fd);

    store = X509_STORE_new();
    if (store == NULL) {
        return NGX_CONF_ERROR;
    }

    if (X509_STORE_load_locations(store, (char *) path.data, NULL) == 1) {
        X509_STORE_free(store);
        return NGX_CONF_OK;
    }

    err = ERR_peek_last_error();
    reason = ERR_reason_error_string(err);
    ERR_clear_error();
    X509_STORE_free(store);

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "\"%V\" cannot load \"%s\" as PEM certificates (%s)",
                       &value[0], path.data, reason ? reason : "unknown");

    return NGX_CONF_ERROR;
}


static char *
ngx_llmgw_v8host(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_llmgw_main_conf_t *mcf = conf;

    ngx_str_t  *value;
    ngx_url_t   u;

    if (mcf->v8host.data) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (value[1].len <= 5
        || ngx_strncmp(value[1].data, "unix:", 5) != 0)
    {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"llmgw_v8host\" needs the helper's socket as "
                           "\"unix:/path\", not \"%V\"", &value[1]);
        return NGX_CONF_ERROR;
    }

    ngx_memzero(&u, sizeof(ngx_url_t));
    u.url = value[1];
    u.no_resolve = 1;

    if (ngx_parse_url(cf->pool, &u) != NGX_OK || u.naddrs != 1) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid \"llmgw_v8host\" socket \"%V\"%s%s",
                           &value[1], u.err ? ": " : "",
                           u.err ? u.err : "");
        return NGX_CONF_ERROR;
    }

    mcf->v8host = value[1];
    mcf->v8host_addr = u.addrs[0];

    return NGX_CONF_OK;
}


/*
 * llmgw_content_allow_private on | off | address[/prefix] ...: the
 * loopback, private, link-local and other special addresses a content
 * fetch to a URL a plugin chose may reach ("on": all of them).
 */
static char *
ngx_llmgw_content_allow_private(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_llmgw_main_conf_t *mcf = conf;

    size_t               bad, n;
    ngx_str_t           *value;
    ngx_uint_t           i;
    llmgw_str_t         *words;
    ngx_pool_cleanup_t  *cln;

    static llmgw_str_t   all[] = { { "0.0.0.0/0", sizeof("0.0.0.0/0") - 1 },
                                   { "::/0", sizeof("::/0") - 1 } };

    if (mcf->content_allow_set) {
        return "is duplicate";
    }

    mcf->content_allow_set = 1;
    value = cf->args->elts;
    n = cf->args->nelts - 1;

    if (n == 1 && ngx_strcmp(value[1].data, "off") == 0) {
        return NGX_CONF_OK;
    }

    if (n == 1 && ngx_strcmp(value[1].data, "on") == 0) {
        words = all;
        n = sizeof(all) / sizeof(all[0]);

    } else {
        words = ngx_palloc(cf->temp_pool, n * sizeof(llmgw_str_t));
        if (words == NULL) {
            return NGX_CONF_ERROR;
        }

        for (i = 0; i < n; i++) {
            words[i].data = (const char *) value[i + 1].data;
            words[i].len = value[i + 1].len;
        }
    }

    cln = ngx_pool_cleanup_add(cf->pool, 0);
    if (cln == NULL) {
        return NGX_CONF_ERROR;
    }

    mcf->content_allow = llmgw_iplist_from(words, n, &bad);

    if (mcf->content_allow == NULL) {
        if (bad < n) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid address \"%V\" in \"%V\": on, off "
                               "or addresses and CIDRs",
                               &value[bad + 1], &value[0]);
        }
        return NGX_CONF_ERROR;
    }

    cln->handler = ngx_llmgw_iplist_cleanup;
    cln->data = mcf->content_allow;

    return NGX_CONF_OK;
}


static void
ngx_llmgw_iplist_cleanup(void *data)
{
    llmgw_iplist_free(data);
}


static ngx_int_t
ngx_llmgw_init_process(ngx_cycle_t *cycle)
{
    ngx_llmgw_main_conf_t  *mcf;

    if (ngx_process != NGX_PROCESS_WORKER
        && ngx_process != NGX_PROCESS_SINGLE)
    {
        return NGX_OK;
    }

    mcf = ngx_http_cycle_get_module_main_conf(cycle, ngx_http_llmgw_module);

    if (mcf == NULL || mcf->database.len == 0) {
        return NGX_OK;
    }

    ngx_llmgw_shm_attach(mcf->shm_zone);

    if (ngx_llmgw_billing_init_process(cycle) != NGX_OK) {
        return NGX_ERROR;
    }

    if (ngx_llmgw_pg_init_process(cycle, mcf, ngx_llmgw_cache_on_notify)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    if (ngx_llmgw_cache_init_process(cycle, mcf) != NGX_OK) {
        return NGX_ERROR;
    }

    if (ngx_llmgw_ledger_init_process(cycle, mcf) != NGX_OK) {
        return NGX_ERROR;
    }

    ngx_llmgw_keepalive_init_process(cycle, mcf);

    if (ngx_llmgw_v8host_init_process(cycle, mcf) != NGX_OK) {
        return NGX_ERROR;
    }

    if (ngx_llmgw_task_init_process(cycle, mcf) != NGX_OK) {
        return NGX_ERROR;
    }

    return NGX_OK;
}


static void
ngx_llmgw_exit_process(ngx_cycle_t *cycle)
{
    ngx_llmgw_main_conf_t  *mcf;

    mcf = ngx_http_cycle_get_module_main_conf(cycle, ngx_http_llmgw_module);

    if (mcf == NULL || mcf->database.len == 0) {
        return;
    }

    /*
     * The pool's connections close first: a COPY cut off halfway keeps its
     * transaction open, with rows the exit-time writes below would wait on
     * for ever; closed, the server rolls it back.
     */
    ngx_llmgw_pg_exit_process(cycle);
    ngx_llmgw_task_exit_process(cycle);
    ngx_llmgw_v8host_exit_process(cycle);
    ngx_llmgw_ledger_exit_process(cycle);
    ngx_llmgw_billing_exit_process(cycle);
    ngx_llmgw_cache_exit_process(cycle);
}
