/*
 * The node-wide shared zone and the per-user rate limiter kept in it.
 *
 * Each user has one node per group its keys are limited under (a key's
 * group may be another than its user's): an rbtree entry on the zone's
 * slab holding the sliding logs that llmgw_rl_* maintain, sized for that
 * group's limit.  A changed limit moves the history into a node of the new
 * sizes, so that a lowered limit applies to what was already used.  All of it is
 * touched under the zone mutex, so the limit is exact across the workers
 * of one node.  Nodes idle for longer than their window (their group's in
 * force, or the one they were last used with when longer) are freed; when
 * the slab is full the least recently used ones go, as limit_req does, and the
 * loss of a window still running is logged.
 */

#include "ngx_llmgw.h"


typedef struct {
    u_char                     color;
    u_char                     dummy[3];
    ngx_queue_t                queue;
    ngx_msec_t                 last;
    int64_t                    user_id;
    uint64_t                   group;       /* ngx_llmgw_rl_group() */
    int64_t                    window_ms;
    uint32_t                   total;
    uint32_t                   success;
    /* the llmgw_rl_* memory follows, 8-byte aligned */
    int64_t                    data[1];
} ngx_llmgw_rl_node_t;


static ngx_llmgw_shm_ctx_t  *ngx_llmgw_shm_ctx;


static void
ngx_llmgw_rl_insert(ngx_rbtree_node_t *temp, ngx_rbtree_node_t *node,
    ngx_rbtree_node_t *sentinel)
{
    ngx_rbtree_node_t  **p;

    for ( ;; ) {
        p = (node->key < temp->key) ? &temp->left : &temp->right;

        if (*p == sentinel) {
            break;
        }

        temp = *p;
    }

    *p = node;
    node->parent = temp;
    node->left = sentinel;
    node->right = sentinel;
    ngx_rbt_red(node);
}


static ngx_llmgw_shm_ctx_t  ngx_llmgw_shm_ctx_storage;


ngx_int_t
ngx_llmgw_shm_init_zone(ngx_shm_zone_t *zone, void *data)
{
    void  *octx = data;

    ngx_uint_t            i;
    ngx_llmgw_shm_ctx_t  *ctx;

    /*
     * Not from a pool: on a reload this runs while ngx_cycle is still the
     * old cycle, whose pool the master destroys as soon as the new cycle is
     * made.  There is one zone, so one static context serves every cycle.
     */
    ctx = &ngx_llmgw_shm_ctx_storage;
    ngx_memzero(ctx, sizeof(ngx_llmgw_shm_ctx_t));

    ngx_llmgw_shm_ctx = ctx;
    ctx->shpool = (ngx_slab_pool_t *) zone->shm.addr;

    /* on reload the zone, its counters and its limits are kept */
    if (octx || zone->shm.exists || ctx->shpool->data) {
        ctx->sh = ctx->shpool->data;

        if (ctx->sh->layout != NGX_LLMGW_ZONE_LAYOUT) {
            ngx_log_error(NGX_LOG_EMERG, zone->shm.log, 0,
                          "llmgw: the shared zone \"%V\" was made by another "
                          "build of the module; restart nginx instead of "
                          "reloading it", &zone->shm.name);
            return NGX_ERROR;
        }

        zone->data = ctx;
        return NGX_OK;
    }

    ctx->sh = ngx_slab_calloc(ctx->shpool, sizeof(ngx_llmgw_shm_t));
    if (ctx->sh == NULL) {
        return NGX_ERROR;
    }

    ctx->shpool->data = ctx->sh;
    ctx->sh->layout = NGX_LLMGW_ZONE_LAYOUT;

    ngx_rbtree_init(&ctx->sh->rl_tree, &ctx->sh->rl_sentinel,
                    ngx_llmgw_rl_insert);
    ngx_queue_init(&ctx->sh->rl_lru);
    ngx_rbtree_init(&ctx->sh->m_tree, &ctx->sh->m_sentinel,
                    ngx_rbtree_insert_value);
    ngx_rbtree_init(&ctx->sh->bal_tree, &ctx->sh->bal_sentinel,
                    ngx_rbtree_insert_value);
    ngx_queue_init(&ctx->sh->bal_lru);
    ngx_rbtree_init(&ctx->sh->krec_tree, &ctx->sh->krec_sentinel,
                    ngx_rbtree_insert_value);
    ngx_queue_init(&ctx->sh->krec_lru);
    ngx_queue_init(&ctx->sh->ledger);

    for (i = 0; i < NGX_LLMGW_MAX_PROCS; i++) {
        ngx_queue_init(&ctx->sh->procs[i].holds);
        ngx_queue_init(&ctx->sh->procs[i].batch);
    }

    ctx->shpool->log_ctx = (u_char *) " in llmgw zone";
    /* a full zone is handled (and said) where it matters, not per failed
       allocation */
    ctx->shpool->log_nomem = 0;
    zone->data = ctx;

    return NGX_OK;
}


ngx_llmgw_shm_ctx_t *
ngx_llmgw_shm(void)
{
    return ngx_llmgw_shm_ctx;
}


/*
 * A worker takes the zone of its own cycle: a reload that failed after
 * its zones were made left the context pointing at a zone it freed.
 */
void
ngx_llmgw_shm_attach(ngx_shm_zone_t *zone)
{
    ngx_slab_pool_t  *shpool;

    if (zone == NULL || zone->shm.addr == NULL) {
        return;
    }

    shpool = (ngx_slab_pool_t *) zone->shm.addr;

    ngx_llmgw_shm_ctx_storage.shpool = shpool;
    ngx_llmgw_shm_ctx_storage.sh = shpool->data;
    ngx_llmgw_shm_ctx = &ngx_llmgw_shm_ctx_storage;
}


/* Groups are told apart by a hash of their name. */
uint64_t
ngx_llmgw_rl_group(ngx_str_t *group)
{
    return llmgw_rl_group_hash((llmgw_str_t) { (char *) group->data,
                                               group->len });
}


typedef struct {
    int64_t                    user_id;
    uint64_t                   group;
} ngx_llmgw_rl_want_t;


static uint64_t
ngx_llmgw_rl_key(const ngx_llmgw_rl_want_t *w)
{
    return (uint64_t) w->user_id * 0x9e3779b97f4a7c15ULL
           ^ w->group * 0xbf58476d1ce4e5b9ULL;
}


static ngx_int_t
ngx_llmgw_rl_match(ngx_rbtree_node_t *node, const void *data)
{
    const ngx_llmgw_rl_want_t  *w = data;
    ngx_llmgw_rl_node_t        *n;

    n = (ngx_llmgw_rl_node_t *) &node->color;

    return n->user_id == w->user_id && n->group == w->group;
}


static ngx_llmgw_rl_node_t *
ngx_llmgw_rl_lookup(ngx_llmgw_shm_t *sh, const ngx_llmgw_rl_want_t *w)
{
    ngx_rbtree_node_t  *node;

    node = ngx_llmgw_rbtree_find(&sh->rl_tree,
                                 (ngx_rbtree_key_t) ngx_llmgw_rl_key(w),
                                 ngx_llmgw_rl_match, w);

    return node ? (ngx_llmgw_rl_node_t *) &node->color : NULL;
}


static ngx_rbtree_node_t *
ngx_llmgw_rl_rbnode(ngx_llmgw_rl_node_t *n)
{
    return (ngx_rbtree_node_t *)
               ((u_char *) n - offsetof(ngx_rbtree_node_t, color));
}


static ngx_rbtree_node_t *
ngx_llmgw_rbtree_find_in(ngx_rbtree_node_t *node, ngx_rbtree_node_t *sentinel,
    ngx_rbtree_key_t key,
    ngx_int_t (*match)(ngx_rbtree_node_t *node, const void *data),
    const void *data)
{
    ngx_rbtree_node_t  *found;

    while (node != sentinel) {
        if (key != node->key) {
            node = (key < node->key) ? node->left : node->right;
            continue;
        }

        if (match(node, data)) {
            return node;
        }

        /* equal keys: both sides (the depth is bounded by the tree's) */
        found = ngx_llmgw_rbtree_find_in(node->left, sentinel, key, match,
                                         data);
        if (found) {
            return found;
        }

        node = node->right;
    }

    return NULL;
}


ngx_rbtree_node_t *
ngx_llmgw_rbtree_find(ngx_rbtree_t *tree, ngx_rbtree_key_t key,
    ngx_int_t (*match)(ngx_rbtree_node_t *node, const void *data),
    const void *data)
{
    return ngx_llmgw_rbtree_find_in(tree->root, tree->sentinel, key, match,
                                    data);
}


/*
 * Frees least recently used nodes idle longer than their window: the one
 * they were last used with, or the one their group's limit has in the
 * snapshot when longer (a raised window counts requests made under the
 * old one, also when none was made since); with force, the least recently
 * used one in any case (the slab is full).
 */
static void
ngx_llmgw_rl_expire(ngx_llmgw_shm_ctx_t *ctx, ngx_uint_t force,
    const llmgw_snapshot_t *snapshot)
{
    int64_t               window;
    ngx_uint_t            n;
    ngx_queue_t          *q;
    ngx_msec_int_t        idle;
    ngx_llmgw_rl_node_t  *rn;

    static ngx_msec_t     warned;

    for (n = 0; n < 3; n++) {
        if (ngx_queue_empty(&ctx->sh->rl_lru)) {
            return;
        }

        q = ngx_queue_last(&ctx->sh->rl_lru);
        rn = ngx_queue_data(q, ngx_llmgw_rl_node_t, queue);
        idle = (ngx_msec_int_t) (ngx_current_msec - rn->last);
        window = rn->window_ms;

        if (snapshot != NULL) {
            window = ngx_max(window,
                llmgw_snapshot_rate_limit_window(snapshot, rn->group));
        }

        if (!force && idle < window) {
            return;
        }

        /* at most one line a minute from each worker */
        if (idle < window
            && (warned == 0 || ngx_current_msec - warned > 60000))
        {
            warned = ngx_current_msec;
            ngx_log_error(NGX_LOG_WARN, ngx_cycle->log, 0,
                          "llmgw: the shared zone is full: the rate limit "
                          "window of user %L was dropped while it ran; "
                          "raise llmgw_zone_size", rn->user_id);
        }

        force = 0;
        ngx_queue_remove(q);

        ngx_rbtree_delete(&ctx->sh->rl_tree, ngx_llmgw_rl_rbnode(rn));
        ngx_slab_free_locked(ctx->shpool, ngx_llmgw_rl_rbnode(rn));
    }
}


/*
 * Memory for billing (holds, balances, ledger rows) in a full zone: rate
 * limit logs are given up for it, least recently used first, as a request
 * that was served must have its row, and a limit window is only the
 * lesser loss.  Under the mutex; NULL when no log is left to free.
 */
void *
ngx_llmgw_shm_alloc_locked(ngx_llmgw_shm_ctx_t *ctx, size_t size)
{
    void  *p;

    for ( ;; ) {
        p = ngx_slab_alloc_locked(ctx->shpool, size);

        if (p != NULL || ngx_queue_empty(&ctx->sh->rl_lru)) {
            return p;
        }

        ngx_llmgw_rl_expire(ctx, 1, NULL);
    }
}


/*
 * A node for a limit, on the slab, its rings at least as large as old's
 * (a limit raised again still finds what a lowered one kept); NULL when
 * the zone has no room.
 */
static ngx_llmgw_rl_node_t *
ngx_llmgw_rl_alloc(ngx_llmgw_shm_ctx_t *ctx, const ngx_llmgw_rl_want_t *w,
    const llmgw_rate_limit_t *rl, const ngx_llmgw_rl_node_t *old)
{
    size_t                size;
    uint32_t              total, success;
    ngx_rbtree_node_t    *node;
    ngx_llmgw_rl_node_t  *n;

    total = rl->total;
    success = rl->success;

    if (old != NULL) {
        total = ngx_max(total, old->total);
        success = ngx_max(success, old->success);
    }

    size = offsetof(ngx_rbtree_node_t, color)
           + offsetof(ngx_llmgw_rl_node_t, data)
           + llmgw_rl_size(total, success);

    node = ngx_slab_alloc_locked(ctx->shpool, size);

    if (node == NULL) {
        ngx_llmgw_rl_expire(ctx, 1, NULL);
        node = ngx_slab_alloc_locked(ctx->shpool, size);
    }

    if (node == NULL) {
        return NULL;
    }

    node->key = (ngx_rbtree_key_t) ngx_llmgw_rl_key(w);
    n = (ngx_llmgw_rl_node_t *) &node->color;
    n->user_id = w->user_id;
    n->group = w->group;
    n->window_ms = rl->window_ms;
    n->total = total;
    n->success = success;
    llmgw_rl_init(n->data, total, success);
    (void) llmgw_rl_limit(n->data, rl->total, rl->success);

    return n;
}


/*
 * The limiter of a user and group, made when missing or moved to the sizes
 * of a changed limit, at the head of the LRU and marked used now (expiry
 * keeps a node a window past its last use, so what it records still
 * counts).  NULL when the zone has no room.  Under the mutex.
 */
static ngx_llmgw_rl_node_t *
ngx_llmgw_rl_node(ngx_llmgw_shm_ctx_t *ctx, const ngx_llmgw_rl_want_t *w,
    const llmgw_rate_limit_t *rl)
{
    ngx_llmgw_rl_node_t  *n, *old;

    old = ngx_llmgw_rl_lookup(ctx->sh, w);

    if (old != NULL) {
        /* out of the LRU while a new node may have to make room */
        ngx_queue_remove(&old->queue);

        /* the log holds times: another window reads them as well */
        old->window_ms = rl->window_ms;
    }

    if (old != NULL
        && llmgw_rl_limit(old->data, rl->total, rl->success) == 0)
    {
        /* within its rings (a lowered limit keeps them, and their log) */
        n = old;

    } else {
        n = ngx_llmgw_rl_alloc(ctx, w, rl, old);

        if (n == NULL && old != NULL) {
            /* no room for the new sizes: the old ones limit meanwhile */
            n = old;

        } else if (n == NULL) {
            return NULL;

        } else {
            if (old != NULL) {
                llmgw_rl_copy(n->data, old->data);
                ngx_rbtree_delete(&ctx->sh->rl_tree,
                                  ngx_llmgw_rl_rbnode(old));
                ngx_slab_free_locked(ctx->shpool, ngx_llmgw_rl_rbnode(old));
            }

            ngx_rbtree_insert(&ctx->sh->rl_tree, ngx_llmgw_rl_rbnode(n));
        }
    }

    ngx_queue_insert_head(&ctx->sh->rl_lru, &n->queue);
    n->last = ngx_current_msec;

    return n;
}


ngx_int_t
ngx_llmgw_rl_acquire(ngx_llmgw_ctx_t *rctx, const llmgw_rate_limit_t *rl,
    int64_t user_id, int *which, ngx_uint_t *retry)
{
    int64_t                after, reserved;
    ngx_llmgw_shm_ctx_t   *ctx;
    ngx_llmgw_rl_node_t   *n;
    ngx_llmgw_rl_want_t    w;

    ctx = ngx_llmgw_shm_ctx;
    w.user_id = user_id;
    w.group = ngx_llmgw_rl_group(&rctx->group);

    ngx_shmtx_lock(&ctx->shpool->mutex);

    ngx_llmgw_rl_expire(ctx, 0, rctx->snapshot);

    n = ngx_llmgw_rl_node(ctx, &w, rl);

    if (n == NULL) {
        ngx_shmtx_unlock(&ctx->shpool->mutex);
        ngx_log_error(NGX_LOG_ALERT, ngx_cycle->log, 0,
                      "llmgw: the shared zone is full; raise "
                      "llmgw_zone_size (the request was admitted)");
        return NGX_OK;
    }

    *which = llmgw_rl_acquire(n->data, (int64_t) ngx_current_msec,
                              rl->window_ms, &after, &reserved);

    ngx_shmtx_unlock(&ctx->shpool->mutex);

    if (*which != LLMGW_RL_OK) {
        *retry = (ngx_uint_t) ((after + 999) / 1000);
        if (*retry == 0) {
            *retry = 1;
        }
        return NGX_DECLINED;
    }

    rctx->rl_held = 1;
    rctx->rl_reserved = reserved;

    return NGX_OK;
}


/* A success slot given back; its log may be gone.  Under the mutex. */
void
ngx_llmgw_rl_release_locked(ngx_llmgw_shm_ctx_t *ctx, int64_t user_id,
    uint64_t group, int64_t reserved)
{
    ngx_llmgw_rl_node_t  *n;
    ngx_llmgw_rl_want_t   w;

    w.user_id = user_id;
    w.group = group;

    n = ngx_llmgw_rl_lookup(ctx->sh, &w);

    if (n != NULL) {
        llmgw_rl_release(n->data, reserved);
    }
}


/*
 * The request ended: a success keeps the slot it took when admitted, any
 * other end gives it back.
 */
void
ngx_llmgw_rl_done(ngx_llmgw_ctx_t *rctx, ngx_uint_t success)
{
    ngx_llmgw_shm_ctx_t  *ctx;

    if (!rctx->rl_held || success || rctx->rl_reserved < 0) {
        return;
    }

    rctx->rl_held = 0;
    ctx = ngx_llmgw_shm_ctx;

    ngx_shmtx_lock(&ctx->shpool->mutex);
    ngx_llmgw_rl_release_locked(ctx, rctx->user_id,
                                ngx_llmgw_rl_group(&rctx->group),
                                rctx->rl_reserved);
    ngx_shmtx_unlock(&ctx->shpool->mutex);
}
