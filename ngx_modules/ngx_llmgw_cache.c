/*
 * A worker's view of the configuration: the routing snapshot and the key
 * cache, kept fresh by LISTEN/NOTIFY and, as a safety net, by a revision
 * check every llmgw_refresh_interval.
 *
 * Notices arrive in commit order and carry the revision they made, so a
 * worker that sees every revision in turn drops exactly what changed; one
 * that finds a gap (a lost listener, a missed notice) drops every cached key
 * and reloads the snapshot.
 *
 * Every record read is also left in the shared zone, so that while the
 * database cannot be read a worker can serve a key another worker read.
 * Such a record counts only while no change of keys or users has been
 * learned since its read began (krec_gen), which no worker can miss: each
 * bumps the generation when it learns of one.
 */

#include "ngx_llmgw.h"


typedef struct ngx_llmgw_snap_holder_s  ngx_llmgw_snap_holder_t;

struct ngx_llmgw_snap_holder_s {
    llmgw_snapshot_t          *snapshot;
    ngx_uint_t                 refs;
    ngx_llmgw_snap_holder_t   *next;
};


/*
 * A key lookup that fails sooner than this is sent again, up to once per
 * pooled connection.
 */
#define NGX_LLMGW_LOOKUP_AGAIN_MS  1000
/* after a failure of the database, stale key records are used without
   trying to read them again for this long (longer than the 2 s between
   two tries to connect, so that a database that refuses connections is
   known to be down all along) */
#define NGX_LLMGW_STALE_AT_ONCE_MS 3000


/* the most records in the zone take an eighth of it, and one at most */
#define NGX_LLMGW_KREC_MAX_LEN     65536


/* A key record in the zone: its text as llmgw_token_lookup() gave it. */
typedef struct {
    u_char                         color;
    u_char                         hash[64];
    ngx_queue_t                    lru;
    ngx_atomic_uint_t              gen;
    ngx_msec_t                     loaded_at;
    size_t                         len;
    u_char                         text[1];
} ngx_llmgw_krec_t;


typedef struct {
    ngx_http_request_t            *request;
    ngx_llmgw_token_handler_pt     handler;
    char                           hash[65];
    ngx_uint_t                     epoch;
    ngx_atomic_uint_t              gen;     /* krec_gen when sent */
    ngx_msec_t                     sent;
    ngx_uint_t                     again;   /* times sent again */
} ngx_llmgw_lookup_t;


typedef struct ngx_llmgw_waiter_s  ngx_llmgw_waiter_t;

struct ngx_llmgw_waiter_s {
    ngx_http_request_t            *request;
    ngx_llmgw_refresh_handler_pt   handler;
    ngx_uint_t                     need;
    ngx_llmgw_waiter_t            *next;
};


static void ngx_llmgw_cache_load(void);
static void ngx_llmgw_cache_loaded(void *data, PGresult *res,
    const char *err);
static void ngx_llmgw_cache_tick(ngx_event_t *ev);
static void ngx_llmgw_cache_unloaded(ngx_event_t *ev);
static void ngx_llmgw_cache_run_waiters(ngx_uint_t done, ngx_uint_t all);
static void ngx_llmgw_cache_rev_checked(void *data, PGresult *res,
    const char *err);
static ngx_int_t ngx_llmgw_cache_lookup(ngx_llmgw_lookup_t *lk);
static ngx_uint_t ngx_llmgw_cache_stale(ngx_log_t *log, llmgw_token_t *t);
static void ngx_llmgw_cache_token_found(void *data, PGresult *res,
    const char *err);
static void ngx_llmgw_cache_invalidate_all(void);
static void ngx_llmgw_krec_put(const char *hash, ngx_atomic_uint_t gen,
    ngx_msec_t loaded_at, const char *text, size_t len);
static llmgw_token_t *ngx_llmgw_krec_get(const char *hash);
static void ngx_llmgw_krec_changed(void);


static ngx_llmgw_snap_holder_t  *ngx_llmgw_current;
static ngx_llmgw_snap_holder_t  *ngx_llmgw_retired;
static llmgw_tcache_t           *ngx_llmgw_tcache;
static ngx_uint_t                ngx_llmgw_epoch;
static int64_t                   ngx_llmgw_seen_rev;
static ngx_uint_t                ngx_llmgw_loading;
static ngx_uint_t                ngx_llmgw_load_again;
static ngx_uint_t                ngx_llmgw_load_failed;  /* retried by the tick */
static ngx_event_t               ngx_llmgw_unloaded_ev;
static ngx_uint_t                ngx_llmgw_loads_started;
static ngx_llmgw_waiter_t       *ngx_llmgw_waiters;
static ngx_event_t               ngx_llmgw_tick_ev;
static ngx_llmgw_main_conf_t    *ngx_llmgw_cache_mcf;
static ngx_log_t                *ngx_llmgw_cache_log;


ngx_int_t
ngx_llmgw_cache_init_process(ngx_cycle_t *cycle, ngx_llmgw_main_conf_t *mcf)
{
    ngx_llmgw_cache_mcf = mcf;
    ngx_llmgw_cache_log = cycle->log;

    ngx_llmgw_tcache = llmgw_tcache_new(mcf->key_cache_size);
    if (ngx_llmgw_tcache == NULL) {
        return NGX_ERROR;
    }

    ngx_llmgw_tick_ev.handler = ngx_llmgw_cache_tick;
    ngx_llmgw_tick_ev.data = &ngx_llmgw_no_connection;
    ngx_llmgw_tick_ev.log = cycle->log;
    ngx_llmgw_tick_ev.cancelable = 1;

    ngx_llmgw_unloaded_ev.handler = ngx_llmgw_cache_unloaded;
    ngx_llmgw_unloaded_ev.data = &ngx_llmgw_no_connection;
    ngx_llmgw_unloaded_ev.log = cycle->log;

    ngx_llmgw_cache_load();
    ngx_add_timer(&ngx_llmgw_tick_ev, mcf->refresh_interval);

    return NGX_OK;
}


void
ngx_llmgw_cache_exit_process(ngx_cycle_t *cycle)
{
    if (ngx_llmgw_tick_ev.timer_set) {
        ngx_del_timer(&ngx_llmgw_tick_ev);
    }
}


llmgw_snapshot_t *
ngx_llmgw_cache_snapshot(void)
{
    if (ngx_llmgw_current == NULL) {
        return NULL;
    }

    ngx_llmgw_current->refs++;

    return ngx_llmgw_current->snapshot;
}


static void
ngx_llmgw_holder_unref(ngx_llmgw_snap_holder_t *h)
{
    ngx_llmgw_snap_holder_t  **pp;

    if (--h->refs > 0) {
        return;
    }

    for (pp = &ngx_llmgw_retired; *pp; pp = &(*pp)->next) {
        if (*pp == h) {
            *pp = h->next;
            break;
        }
    }

    llmgw_snapshot_free(h->snapshot);
    ngx_free(h);
}


void
ngx_llmgw_cache_ref(llmgw_snapshot_t *s)
{
    ngx_llmgw_snap_holder_t  *h;

    if (ngx_llmgw_current && ngx_llmgw_current->snapshot == s) {
        ngx_llmgw_current->refs++;
        return;
    }

    for (h = ngx_llmgw_retired; h; h = h->next) {
        if (h->snapshot == s) {
            h->refs++;
            return;
        }
    }
}


void
ngx_llmgw_cache_release(llmgw_snapshot_t *s)
{
    ngx_llmgw_snap_holder_t  *h;

    if (ngx_llmgw_current && ngx_llmgw_current->snapshot == s) {
        ngx_llmgw_holder_unref(ngx_llmgw_current);
        return;
    }

    for (h = ngx_llmgw_retired; h; h = h->next) {
        if (h->snapshot == s) {
            ngx_llmgw_holder_unref(h);
            return;
        }
    }
}


ngx_int_t
ngx_llmgw_cache_token(ngx_http_request_t *r, const char *hash,
    llmgw_token_t **t, ngx_llmgw_token_handler_pt handler)
{
    ngx_llmgw_lookup_t  *lk;

    if (llmgw_tcache_get(ngx_llmgw_tcache, hash, t)) {

        /* a record older than llmgw_key_cache_ttl is read again, so that
         * what other nodes charged is learned; while the database has
         * just failed, a stale one is used as it is (see
         * ngx_llmgw_cache_stale()) */
        if (*t == NULL
            || ngx_current_msec - (ngx_msec_t) llmgw_token_loaded_at(*t)
               < ngx_llmgw_cache_mcf->key_cache_ttl
            || (ngx_llmgw_pg_failing(NGX_LLMGW_STALE_AT_ONCE_MS)
                && ngx_llmgw_cache_stale(r->connection->log, *t)))
        {
            return NGX_OK;
        }

        llmgw_token_free(*t);
        *t = NULL;
    }

    /* while the database has just failed, the record another worker read
       stands in at once, as this worker's own would */
    if (ngx_llmgw_pg_failing(NGX_LLMGW_STALE_AT_ONCE_MS)) {
        *t = ngx_llmgw_krec_get(hash);

        if (*t != NULL) {
            if (ngx_llmgw_cache_stale(r->connection->log, *t)) {
                return NGX_OK;
            }

            llmgw_token_free(*t);
            *t = NULL;
        }
    }

    lk = ngx_palloc(r->pool, sizeof(ngx_llmgw_lookup_t));
    if (lk == NULL) {
        return NGX_ERROR;
    }

    lk->request = r;
    lk->handler = handler;
    lk->epoch = ngx_llmgw_epoch;
    lk->gen = ngx_llmgw_shm()->sh->krec_gen;
    lk->sent = ngx_current_msec;
    lk->again = 0;
    ngx_memcpy(lk->hash, hash, 65);

    return ngx_llmgw_cache_lookup(lk) == NGX_OK ? NGX_AGAIN : NGX_ERROR;
}


/*
 * Whether a key record older than llmgw_key_cache_ttl may still be used
 * while the database cannot be read: up to llmgw_key_cache_stale old.
 * Its balances stay exact, as the zone keeps them that long (see
 * ngx_llmgw_bal_keep); what it cannot know is a change made through the
 * admin API meanwhile.  Said once a second at most.
 */
static ngx_uint_t
ngx_llmgw_cache_stale(ngx_log_t *log, llmgw_token_t *t)
{
    ngx_msec_t         age;
    static ngx_msec_t  said;

    age = ngx_current_msec - (ngx_msec_t) llmgw_token_loaded_at(t);

    if (age >= ngx_llmgw_cache_mcf->key_cache_ttl
                + ngx_llmgw_cache_mcf->key_cache_stale)
    {
        return 0;
    }

    if (said == 0 || ngx_current_msec - said >= 1000) {
        said = ngx_current_msec | 1;
        ngx_log_error(NGX_LOG_WARN, log, 0,
                      "llmgw: the database cannot be read: key %L is "
                      "served from its record of %M ms ago",
                      (long long) llmgw_token_id(t), age);
    }

    return 1;
}


static ngx_int_t
ngx_llmgw_cache_lookup(ngx_llmgw_lookup_t *lk)
{
    const char  *params[1];

    params[0] = lk->hash;

    return ngx_llmgw_pg_query("select llmgw_token_lookup($1)::text", 1,
                              params, NULL, ngx_llmgw_cache_token_found, lk);
}


static void
ngx_llmgw_cache_token_found(void *data, PGresult *res, const char *err)
{
    ngx_llmgw_lookup_t  *lk = data;

    llmgw_token_t       *t;
    ngx_connection_t    *c;
    ngx_http_request_t  *r;

    r = lk->request;
    c = r->connection;
    t = NULL;

    /*
     * A read that failed fast failed on its connection (one the server
     * had just ended, say), not on the database: it is sent again.  When
     * the server ended them all, each pooled connection can fail one try
     * before the next goes out on a new one.  A read that ran into
     * llmgw_pg_timeout is not sent again.
     */
    if (err != NULL && lk->again < ngx_llmgw_cache_mcf->pg_pool_size
        && ngx_current_msec - lk->sent
           < ngx_min(NGX_LLMGW_LOOKUP_AGAIN_MS,
                     ngx_llmgw_cache_mcf->pg_timeout))
    {
        lk->again++;

        if (ngx_llmgw_cache_lookup(lk) == NGX_OK) {
            return;
        }
    }

    /* the database failed: the record this worker last read, when it is
       not too old, stands in for the one it could not read */
    if (err != NULL && llmgw_tcache_get(ngx_llmgw_tcache, lk->hash, &t)) {
        if (t != NULL && ngx_llmgw_cache_stale(c->log, t)) {
            lk->handler(r, t, NULL);
            ngx_http_run_posted_requests(c);
            return;
        }

        llmgw_token_free(t);
        t = NULL;
    }

    /* ... and so does the one another worker read */
    if (err != NULL) {
        t = ngx_llmgw_krec_get(lk->hash);

        if (t != NULL) {
            if (ngx_llmgw_cache_stale(c->log, t)) {
                lk->handler(r, t, NULL);
                ngx_http_run_posted_requests(c);
                return;
            }

            llmgw_token_free(t);
            t = NULL;
        }
    }

    if (err == NULL && !PQgetisnull(res, 0, 0)) {
        t = llmgw_token_parse(PQgetvalue(res, 0, 0), PQgetlength(res, 0, 0));
        if (t == NULL) {
            err = "unreadable key record";
        } else {
            llmgw_token_set_loaded_at(t, lk->sent);
        }
    }

    /* a lookup that raced an invalidation is used, never cached */
    if (err == NULL && lk->epoch == ngx_llmgw_epoch) {
        llmgw_tcache_put(ngx_llmgw_tcache, lk->hash, t);

        if (t != NULL) {
            ngx_llmgw_krec_put(lk->hash, lk->gen, lk->sent,
                               PQgetvalue(res, 0, 0),
                               PQgetlength(res, 0, 0));
        }
    }

    lk->handler(r, t, err);

    ngx_http_run_posted_requests(c);
}


ngx_int_t
ngx_llmgw_cache_refresh_now(ngx_http_request_t *r,
    ngx_llmgw_refresh_handler_pt handler)
{
    ngx_llmgw_waiter_t  *w;

    w = ngx_palloc(r->pool, sizeof(ngx_llmgw_waiter_t));
    if (w == NULL) {
        return NGX_ERROR;
    }

    w->request = r;
    w->handler = handler;
    w->need = ngx_llmgw_loads_started + 1;
    w->next = ngx_llmgw_waiters;
    ngx_llmgw_waiters = w;

    /* what the admin changed also reached the keys cached here */
    ngx_llmgw_cache_invalidate_all();
    ngx_llmgw_cache_load();

    return NGX_AGAIN;
}


ngx_int_t
ngx_llmgw_cache_wait_first(ngx_http_request_t *r,
    ngx_llmgw_refresh_handler_pt handler)
{
    ngx_llmgw_waiter_t  *w;

    if (ngx_llmgw_current != NULL) {
        return NGX_OK;
    }

    w = ngx_palloc(r->pool, sizeof(ngx_llmgw_waiter_t));
    if (w == NULL) {
        return NGX_ERROR;
    }

    w->request = r;
    w->handler = handler;
    w->need = ngx_llmgw_loading ? ngx_llmgw_loads_started
                                : ngx_llmgw_loads_started + 1;
    w->next = ngx_llmgw_waiters;
    ngx_llmgw_waiters = w;

    if (!ngx_llmgw_loading) {
        ngx_llmgw_cache_load();
    }

    return NGX_AGAIN;
}


void
ngx_llmgw_cache_on_notify(const char *channel, const char *payload)
{
    llmgw_notice_t  n;

    if (payload == NULL
        || llmgw_notice_parse(payload, ngx_strlen(payload), &n) != 0)
    {
        ngx_llmgw_cache_invalidate_all();
        ngx_llmgw_cache_load();
        return;
    }

    if (n.rev <= ngx_llmgw_seen_rev) {
        return;
    }

    if (n.rev != ngx_llmgw_seen_rev + 1) {
        ngx_llmgw_seen_rev = n.rev;
        ngx_llmgw_cache_invalidate_all();
        ngx_llmgw_cache_load();
        return;
    }

    ngx_llmgw_seen_rev = n.rev;
    ngx_llmgw_epoch++;

    if (ngx_strcmp(n.kind, "token") == 0) {
        llmgw_tcache_drop_token(ngx_llmgw_tcache, n.id);
        ngx_llmgw_krec_changed();
        ngx_llmgw_billing_stale(0, n.id);

    } else if (ngx_strcmp(n.kind, "user") == 0) {
        llmgw_tcache_drop_user(ngx_llmgw_tcache, n.id);
        ngx_llmgw_krec_changed();
        ngx_llmgw_billing_stale(1, n.id);

    } else {
        ngx_llmgw_cache_load();
    }
}


static void
ngx_llmgw_cache_invalidate_all(void)
{
    ngx_llmgw_epoch++;
    llmgw_tcache_clear(ngx_llmgw_tcache);
    ngx_llmgw_krec_changed();
}


/* Records read before now no longer count. */
static void
ngx_llmgw_krec_changed(void)
{
    ngx_llmgw_shm_ctx_t  *shm;

    shm = ngx_llmgw_shm();

    if (shm != NULL) {
        (void) ngx_atomic_fetch_add(&shm->sh->krec_gen, 1);
    }
}


static ngx_llmgw_krec_t *
ngx_llmgw_krec_find_locked(ngx_llmgw_shm_t *sh, const char *hash)
{
    ngx_int_t           key;
    ngx_rbtree_node_t  *node, *sentinel;

    /* a digest is uniform: its first 15 hex digits are a hash already */
    key = ngx_hextoi((u_char *) hash, 15);
    if (key == NGX_ERROR) {
        return NULL;
    }

    node = sh->krec_tree.root;
    sentinel = sh->krec_tree.sentinel;

    while (node != sentinel) {
        if ((ngx_rbtree_key_t) key == node->key) {
            /* two digests alike in 60 bits: the one of the other is not
               this key's (and is replaced by a put) */
            return (ngx_llmgw_krec_t *) &node->color;
        }

        node = ((ngx_rbtree_key_t) key < node->key) ? node->left
                                                     : node->right;
    }

    return NULL;
}


static size_t
ngx_llmgw_krec_size(size_t len)
{
    return offsetof(ngx_rbtree_node_t, color)
           + offsetof(ngx_llmgw_krec_t, text) + len;
}


static void
ngx_llmgw_krec_drop_locked(ngx_llmgw_shm_ctx_t *shm, ngx_llmgw_krec_t *k)
{
    ngx_rbtree_node_t  *node;

    node = (ngx_rbtree_node_t *)
               ((u_char *) k - offsetof(ngx_rbtree_node_t, color));

    ngx_queue_remove(&k->lru);
    ngx_rbtree_delete(&shm->sh->krec_tree, node);
    shm->sh->krec_count--;
    shm->sh->krec_bytes -= ngx_llmgw_krec_size(k->len);
    ngx_slab_free_locked(shm->shpool, node);
}


static void
ngx_llmgw_krec_drop_oldest_locked(ngx_llmgw_shm_ctx_t *shm)
{
    ngx_queue_t  *q;

    q = ngx_queue_last(&shm->sh->krec_lru);
    ngx_llmgw_krec_drop_locked(shm,
                               ngx_queue_data(q, ngx_llmgw_krec_t, lru));
}


/*
 * Leaves a record read at loaded_at in the zone.  Records are a fallback:
 * they take at most llmgw_key_cache_size entries and an eighth of the
 * zone, never what rate limits, balances or the ledger need (a record that
 * finds no room is left out).
 */
static void
ngx_llmgw_krec_put(const char *hash, ngx_atomic_uint_t gen,
    ngx_msec_t loaded_at, const char *text, size_t len)
{
    size_t                size, limit;
    ngx_int_t             key;
    ngx_llmgw_krec_t     *k;
    ngx_rbtree_node_t    *node;
    ngx_llmgw_shm_ctx_t  *shm;

    shm = ngx_llmgw_shm();
    key = ngx_hextoi((u_char *) hash, 15);

    if (shm == NULL || key == NGX_ERROR || len > NGX_LLMGW_KREC_MAX_LEN
        || ngx_llmgw_cache_mcf->key_cache_stale == 0)
    {
        return;
    }

    size = ngx_llmgw_krec_size(len);
    limit = (size_t) ngx_llmgw_cache_mcf->shm_size / 8;

    ngx_shmtx_lock(&shm->shpool->mutex);

    k = ngx_llmgw_krec_find_locked(shm->sh, hash);
    if (k != NULL) {
        ngx_llmgw_krec_drop_locked(shm, k);
    }

    while (shm->sh->krec_count > 0
           && (shm->sh->krec_count >= ngx_llmgw_cache_mcf->key_cache_size
               || shm->sh->krec_bytes + size > limit))
    {
        ngx_llmgw_krec_drop_oldest_locked(shm);
    }

    node = (size <= limit) ? ngx_slab_alloc_locked(shm->shpool, size) : NULL;

    if (node != NULL) {
        node->key = (ngx_rbtree_key_t) key;
        k = (ngx_llmgw_krec_t *) &node->color;
        ngx_memcpy(k->hash, hash, 64);
        k->gen = gen;
        k->loaded_at = loaded_at;
        k->len = len;
        ngx_memcpy(k->text, text, len);

        ngx_rbtree_insert(&shm->sh->krec_tree, node);
        ngx_queue_insert_head(&shm->sh->krec_lru, &k->lru);
        shm->sh->krec_count++;
        shm->sh->krec_bytes += size;
    }

    ngx_shmtx_unlock(&shm->shpool->mutex);
}


/*
 * The record of this key another worker (or this one) read, when nothing
 * about keys or users changed since that read began; NULL otherwise.
 */
static llmgw_token_t *
ngx_llmgw_krec_get(const char *hash)
{
    u_char               *text;
    size_t                len;
    ngx_msec_t            loaded_at;
    llmgw_token_t        *t;
    ngx_llmgw_krec_t     *k;
    ngx_llmgw_shm_ctx_t  *shm;

    shm = ngx_llmgw_shm();
    if (shm == NULL) {
        return NULL;
    }

    text = NULL;
    len = 0;
    loaded_at = 0;

    ngx_shmtx_lock(&shm->shpool->mutex);

    k = ngx_llmgw_krec_find_locked(shm->sh, hash);

    if (k != NULL && ngx_memcmp(k->hash, hash, 64) == 0) {

        if (k->gen != shm->sh->krec_gen) {
            ngx_llmgw_krec_drop_locked(shm, k);

        } else {
            text = ngx_alloc(k->len, ngx_llmgw_cache_log);

            if (text != NULL) {
                len = k->len;
                loaded_at = k->loaded_at;
                ngx_memcpy(text, k->text, len);
                ngx_queue_remove(&k->lru);
                ngx_queue_insert_head(&shm->sh->krec_lru, &k->lru);
            }
        }
    }

    ngx_shmtx_unlock(&shm->shpool->mutex);

    if (text == NULL) {
        return NULL;
    }

    t = llmgw_token_parse((char *) text, len);
    ngx_free(text);

    if (t != NULL) {
        llmgw_token_set_loaded_at(t, loaded_at);
    }

    return t;
}


static void
ngx_llmgw_cache_load(void)
{
    if (ngx_llmgw_loading) {
        ngx_llmgw_load_again = 1;
        return;
    }

    /* set first: a failing query calls back before pg_query returns */
    ngx_llmgw_loading = 1;
    ngx_llmgw_loads_started++;

    if (ngx_llmgw_pg_query("select llmgw_snapshot()::text", 0, NULL, NULL,
                           ngx_llmgw_cache_loaded, NULL)
        != NGX_OK)
    {
        ngx_llmgw_loading = 0;
        ngx_llmgw_load_failed = 1;

        /* waiters are told from the event loop: refresh_now has not returned */
        if (!ngx_llmgw_unloaded_ev.posted) {
            ngx_post_event(&ngx_llmgw_unloaded_ev, &ngx_posted_events);
        }
    }
}


/* A load that could not start: its waiters are answered all the same. */
static void
ngx_llmgw_cache_unloaded(ngx_event_t *ev)
{
    if (!ngx_llmgw_loading) {
        ngx_llmgw_cache_run_waiters(ngx_llmgw_loads_started, 1);
    }
}


static void
ngx_llmgw_cache_run_waiters(ngx_uint_t done, ngx_uint_t all)
{
    ngx_connection_t     *c;
    ngx_llmgw_waiter_t   *w, **pp;

    pp = &ngx_llmgw_waiters;

    while (*pp) {
        w = *pp;

        if (!all && w->need > done) {
            pp = &w->next;
            continue;
        }

        *pp = w->next;
        c = w->request->connection;
        w->handler(w->request);
        ngx_http_run_posted_requests(c);
    }
}


static void
ngx_llmgw_cache_loaded(void *data, PGresult *res, const char *err)
{
    char                      errbuf[1024];
    ngx_uint_t                done;
    llmgw_snapshot_t         *s;
    ngx_llmgw_snap_holder_t  *h;

    ngx_llmgw_loading = 0;
    done = ngx_llmgw_loads_started;

    /* until a load succeeds, the tick tries again */
    ngx_llmgw_load_failed = 1;

    if (err != NULL) {
        ngx_log_error(NGX_LOG_ERR, ngx_llmgw_cache_log, 0,
                      "llmgw: loading the configuration failed: %s", err);
        goto next;
    }

    s = llmgw_snapshot_parse(PQgetvalue(res, 0, 0), PQgetlength(res, 0, 0),
                             errbuf, sizeof(errbuf));
    if (s == NULL) {
        ngx_log_error(NGX_LOG_ERR, ngx_llmgw_cache_log, 0,
                      "llmgw: unreadable configuration: %s", errbuf);
        goto next;
    }

    if (errbuf[0] != '\0') {
        ngx_log_error(NGX_LOG_ERR, ngx_llmgw_cache_log, 0,
                      "llmgw: configuration revision %L: %s",
                      llmgw_snapshot_revision(s), errbuf);
    }

    h = ngx_alloc(sizeof(ngx_llmgw_snap_holder_t), ngx_llmgw_cache_log);
    if (h == NULL) {
        llmgw_snapshot_free(s);
        goto next;
    }

    h->snapshot = s;
    h->refs = 1;
    h->next = NULL;

    if (ngx_llmgw_current) {
        ngx_llmgw_current->next = ngx_llmgw_retired;
        ngx_llmgw_retired = ngx_llmgw_current;
        ngx_llmgw_holder_unref(ngx_llmgw_current);
    }

    ngx_llmgw_current = h;
    ngx_llmgw_load_failed = 0;

    ngx_log_error(NGX_LOG_INFO, ngx_llmgw_cache_log, 0,
                  "llmgw: configuration revision %L loaded",
                  llmgw_snapshot_revision(s));

    /*
     * The snapshot may be newer than the notices seen: those of the
     * revisions it skips will be dropped as old, and a key change among
     * them would go unseen, so every cached key goes.
     */
    if (llmgw_snapshot_revision(s) > ngx_llmgw_seen_rev) {
        ngx_llmgw_seen_rev = llmgw_snapshot_revision(s);
        ngx_llmgw_cache_invalidate_all();
    }

next:

    if (ngx_llmgw_load_again) {
        ngx_llmgw_load_again = 0;
        ngx_llmgw_cache_load();
    }

    /* waiters are answered even after a failure: they report it */
    ngx_llmgw_cache_run_waiters(done, err != NULL);
}


static void
ngx_llmgw_cache_tick(ngx_event_t *ev)
{
    if (ngx_exiting || ngx_terminate) {
        return;
    }

    if (ngx_llmgw_current == NULL || ngx_llmgw_load_failed) {
        ngx_llmgw_cache_load();

    } else {
        (void) ngx_llmgw_pg_query("select rev from config_revision", 0, NULL,
                                  NULL, ngx_llmgw_cache_rev_checked, NULL);
    }

    ngx_add_timer(ev, ngx_llmgw_cache_mcf->refresh_interval);
}


static void
ngx_llmgw_cache_rev_checked(void *data, PGresult *res, const char *err)
{
    int64_t  rev;

    if (err != NULL || PQntuples(res) != 1) {
        return;
    }

    rev = ngx_atoof((u_char *) PQgetvalue(res, 0, 0),
                    PQgetlength(res, 0, 0));

    if (rev > ngx_llmgw_seen_rev) {
        /* a notice went missing: forget everything that may have moved */
        ngx_llmgw_seen_rev = rev;
        ngx_llmgw_cache_invalidate_all();
        ngx_llmgw_cache_load();
    }
}
