/*
 * Balances of keys and users in the node's shared zone.
 *
 * For each key and user the zone keeps what PostgreSQL last said the
 * balance was (known), what requests in flight have reserved (hold) and
 * what was charged here but is not yet written (pending).  What a request
 * may still spend is known - hold - pending.  A reservation is checked and
 * taken under the zone mutex, so the workers of a node never overspend
 * between them; across nodes the overshoot is bounded by what the other
 * nodes charged since this one last learned the balance (a flush answer or
 * a key lookup brings it back).
 *
 * Every process has a slot listing its reservations.  A process that died
 * (kill -9, a crash) is found by any worker, and its reservations are
 * released: they were never charged.
 */

#include "ngx_llmgw.h"

#include <signal.h>


enum {
    NGX_LLMGW_BAL_TOKEN = 0,
    NGX_LLMGW_BAL_USER
};


typedef struct {
    u_char                     color;
    u_char                     kind;
    u_char                     unlimited;
    u_char                     stale;
    uint32_t                   refs;        /* holds that point here */
    ngx_queue_t                lru;
    int64_t                    id;
    int64_t                    known;
    int64_t                    hold;
    int64_t                    pending;
    int64_t                    rev;         /* bal_rev of known */
    ngx_msec_t                 changed;     /* a charge written or a
                                             * balance learned, last */
} ngx_llmgw_bal_t;


typedef struct {
    ngx_queue_t                queue;
    ngx_llmgw_bal_t           *token;
    ngx_llmgw_bal_t           *user;
    int64_t                    amount;
    /* the request's rate limit success slot: a dead worker's go back too */
    int64_t                    rl_user;
    uint64_t                   rl_group;
    int64_t                    rl_reserved;  /* -1: none */
} ngx_llmgw_hold_t;


static ngx_llmgw_proc_t  *ngx_llmgw_me;


static ngx_rbtree_key_t
ngx_llmgw_bal_key(ngx_uint_t kind, int64_t id)
{
    return (ngx_rbtree_key_t) ((uint64_t) id * 2 + kind);
}


static ngx_llmgw_bal_t *
ngx_llmgw_bal_find(ngx_llmgw_shm_t *sh, ngx_uint_t kind, int64_t id)
{
    ngx_rbtree_key_t    key;
    ngx_rbtree_node_t  *node, *sentinel;

    key = ngx_llmgw_bal_key(kind, id);
    node = sh->bal_tree.root;
    sentinel = sh->bal_tree.sentinel;

    while (node != sentinel) {
        if (key == node->key) {
            return (ngx_llmgw_bal_t *) &node->color;
        }

        node = (key < node->key) ? node->left : node->right;
    }

    return NULL;
}


/*
 * How long a balance is kept after its last change although idle: a
 * worker's cached key record is at most llmgw_key_cache_ttl old (read
 * within llmgw_pg_timeout; llmgw_key_cache_stale more while the database
 * cannot be read), and one read before a charge was written would
 * bring the balance from before that charge back into a new entry, which
 * has no revision left to tell.
 */
static ngx_msec_t  ngx_llmgw_bal_keep;


/*
 * Frees idle balances to make room: nothing held, nothing pending, no hold
 * pointing at them (a free request holds 0 and still points here), and
 * unchanged for longer than any cached reading of them can be old.
 */
static void
ngx_llmgw_bal_expire(ngx_llmgw_shm_ctx_t *shm, ngx_uint_t n)
{
    ngx_queue_t        *q, *prev;
    ngx_llmgw_bal_t    *b;
    ngx_rbtree_node_t  *node;

    for (q = ngx_queue_last(&shm->sh->bal_lru);
         q != ngx_queue_sentinel(&shm->sh->bal_lru) && n;
         q = prev)
    {
        prev = ngx_queue_prev(q);
        b = ngx_queue_data(q, ngx_llmgw_bal_t, lru);

        if (b->hold != 0 || b->pending != 0 || b->refs != 0
            || ngx_current_msec - b->changed <= ngx_llmgw_bal_keep)
        {
            continue;
        }

        ngx_queue_remove(q);
        node = (ngx_rbtree_node_t *)
                   ((u_char *) b - offsetof(ngx_rbtree_node_t, color));
        ngx_rbtree_delete(&shm->sh->bal_tree, node);
        ngx_slab_free_locked(shm->shpool, node);
        n--;
    }
}


/*
 * The balance of a key or user, created from the record a lookup read, and
 * brought up to date when that record is newer than what the zone knows.
 */
static ngx_llmgw_bal_t *
ngx_llmgw_bal_get(ngx_llmgw_shm_ctx_t *shm, ngx_uint_t kind, int64_t id,
    int64_t balance, ngx_uint_t unlimited, int64_t rev)
{
    size_t              size;
    ngx_llmgw_bal_t    *b;
    ngx_rbtree_node_t  *node;

    b = ngx_llmgw_bal_find(shm->sh, kind, id);

    if (b == NULL) {
        size = offsetof(ngx_rbtree_node_t, color) + sizeof(ngx_llmgw_bal_t);

        node = ngx_slab_alloc_locked(shm->shpool, size);

        if (node == NULL) {
            ngx_llmgw_bal_expire(shm, 16);
            node = ngx_llmgw_shm_alloc_locked(shm, size);
            if (node == NULL) {
                return NULL;
            }
        }

        node->key = ngx_llmgw_bal_key(kind, id);
        b = (ngx_llmgw_bal_t *) &node->color;
        ngx_memzero(&b->kind, sizeof(ngx_llmgw_bal_t)
                              - offsetof(ngx_llmgw_bal_t, kind));
        b->kind = (u_char) kind;
        b->id = id;
        b->known = balance;
        b->unlimited = (u_char) unlimited;
        b->rev = rev;
        b->changed = ngx_current_msec;

        ngx_rbtree_insert(&shm->sh->bal_tree, node);

    } else {
        ngx_queue_remove(&b->lru);

        /*
         * A reading of a later revision replaces it (or one of the same
         * after an admin change).  An earlier one would bring back a
         * balance from before a write whose charge has already left
         * pending: it is what overspending is made of.
         */
        if (rev > b->rev || (b->stale && rev == b->rev)) {
            b->known = balance;
            b->unlimited = (u_char) unlimited;
            b->rev = rev;
            b->stale = 0;
            b->changed = ngx_current_msec;
        }
    }

    ngx_queue_insert_head(&shm->sh->bal_lru, &b->lru);

    return b;
}


ngx_int_t
ngx_llmgw_billing_init_process(ngx_cycle_t *cycle)
{
    ngx_uint_t              i;
    ngx_llmgw_shm_ctx_t    *shm;
    ngx_llmgw_main_conf_t  *mcf;

    shm = ngx_llmgw_shm();
    if (shm == NULL) {
        return NGX_ERROR;
    }

    mcf = ngx_http_cycle_get_module_main_conf(cycle, ngx_http_llmgw_module);
    ngx_llmgw_bal_keep = mcf->key_cache_ttl + mcf->key_cache_stale
                         + mcf->pg_timeout;

    ngx_shmtx_lock(&shm->shpool->mutex);

    /* a slot of a process that died is emptied before it is reused */
    ngx_llmgw_billing_reap_locked(shm);

    for (i = 0; i < NGX_LLMGW_MAX_PROCS; i++) {
        if (shm->sh->procs[i].pid == 0) {
            ngx_llmgw_me = &shm->sh->procs[i];
            ngx_llmgw_me->pid = ngx_pid;
            break;
        }
    }

    ngx_shmtx_unlock(&shm->shpool->mutex);

    if (ngx_llmgw_me == NULL) {
        ngx_log_error(NGX_LOG_EMERG, cycle->log, 0,
                      "llmgw: more than %d processes share the zone",
                      NGX_LLMGW_MAX_PROCS);
        return NGX_ERROR;
    }

    return NGX_OK;
}


void
ngx_llmgw_billing_exit_process(ngx_cycle_t *cycle)
{
    ngx_llmgw_shm_ctx_t  *shm;

    shm = ngx_llmgw_shm();

    if (shm == NULL || ngx_llmgw_me == NULL) {
        return;
    }

    ngx_shmtx_lock(&shm->shpool->mutex);

    /* as if this process had died: its holds go, its batch is requeued */
    ngx_llmgw_me->pid = -1;
    ngx_llmgw_billing_reap_locked(shm);
    ngx_llmgw_me = NULL;

    ngx_shmtx_unlock(&shm->shpool->mutex);
}


ngx_llmgw_proc_t *
ngx_llmgw_billing_me(void)
{
    return ngx_llmgw_me;
}


static void
ngx_llmgw_release_locked(ngx_llmgw_shm_ctx_t *shm, ngx_llmgw_hold_t *h)
{
    ngx_queue_remove(&h->queue);

    h->token->hold -= h->amount;
    h->user->hold -= h->amount;
    h->token->refs--;
    h->user->refs--;

    ngx_slab_free_locked(shm->shpool, h);
}


void
ngx_llmgw_billing_reap_locked(ngx_llmgw_shm_ctx_t *shm)
{
    ngx_uint_t         i;
    ngx_queue_t       *q;
    ngx_llmgw_proc_t  *p;
    ngx_llmgw_hold_t  *h;

    for (i = 0; i < NGX_LLMGW_MAX_PROCS; i++) {
        p = &shm->sh->procs[i];

        /*
         * A slot with this process's pid that is not its own belonged to
         * a process that died before this one was given the same pid.
         */
        if (p->pid == 0
            || (p->pid > 0 && ((p->pid == ngx_pid && p == ngx_llmgw_me)
                               || (p->pid != ngx_pid
                                   && (kill(p->pid, 0) == 0
                                       || ngx_errno != NGX_ESRCH)))))
        {
            continue;
        }

        while (!ngx_queue_empty(&p->holds)) {
            q = ngx_queue_head(&p->holds);
            h = ngx_queue_data(q, ngx_llmgw_hold_t, queue);

            if (h->rl_reserved >= 0) {
                ngx_llmgw_rl_release_locked(shm, h->rl_user, h->rl_group,
                                            h->rl_reserved);
            }

            ngx_llmgw_release_locked(shm, h);
        }

        /*
         * rows it was writing go back first in line, to be written the
         * idempotent way: the batch may have been written
         */
        while (!ngx_queue_empty(&p->batch)) {
            q = ngx_queue_last(&p->batch);
            ngx_queue_remove(q);
            (ngx_queue_data(q, ngx_llmgw_row_t, queue))->again = 1;
            ngx_queue_insert_head(&shm->sh->ledger, q);
            shm->sh->ledger_rows++;
        }

        p->batch_rows = 0;
        p->pid = 0;
    }
}


/* The key's balance in the zone, from the record its lookup read. */
static ngx_llmgw_bal_t *
ngx_llmgw_bal_token(ngx_llmgw_shm_ctx_t *shm, ngx_llmgw_ctx_t *ctx)
{
    llmgw_token_t  *t;

    t = ctx->token;

    return ngx_llmgw_bal_get(shm, NGX_LLMGW_BAL_TOKEN, ctx->token_id,
                             llmgw_token_remain_quota(t),
                             llmgw_token_unlimited(t),
                             llmgw_token_bal_rev(t));
}


/*
 * Spent (charges not yet written count): an exhausted key, refused as the
 * key lookup refuses one whose record says so.  What requests under way
 * hold is not spent: their failures give it back.
 */
static ngx_int_t
ngx_llmgw_bal_spent(ngx_llmgw_bal_t *b, llmgw_verdict_t *v)
{
    if (b->unlimited || b->known - b->pending > 0) {
        return NGX_OK;
    }

    llmgw_verdict_set(v, NGX_HTTP_UNAUTHORIZED, "gateway_error",
                      "invalid_token", "Invalid token");

    return NGX_DECLINED;
}


/*
 * A key spent within llmgw_key_cache_ttl, whose record still shows a
 * balance: refused with the key checks, before the rate limit counts the
 * request.  The reservation checks again, under the same lock as it takes
 * its amount: requests of the key may spend it in between.
 */
ngx_int_t
ngx_llmgw_billing_key_check(ngx_llmgw_ctx_t *ctx, llmgw_verdict_t *v)
{
    ngx_int_t             rc;
    ngx_llmgw_bal_t      *tok;
    ngx_llmgw_shm_ctx_t  *shm;

    shm = ngx_llmgw_shm();
    rc = NGX_OK;

    ngx_shmtx_lock(&shm->shpool->mutex);

    /* a zone without room for the balance: the reservation says so */
    tok = ngx_llmgw_bal_token(shm, ctx);

    if (tok != NULL) {
        rc = ngx_llmgw_bal_spent(tok, v);

    } else if (!llmgw_token_unlimited(ctx->token)
               && llmgw_token_remain_quota(ctx->token) <= 0)
    {
        llmgw_verdict_set(v, NGX_HTTP_UNAUTHORIZED, "gateway_error",
                          "invalid_token", "Invalid token");
        rc = NGX_DECLINED;
    }

    ngx_shmtx_unlock(&shm->shpool->mutex);

    return rc;
}


ngx_int_t
ngx_llmgw_billing_reserve(ngx_llmgw_ctx_t *ctx, int64_t amount,
    llmgw_verdict_t *v)
{
    int64_t               avail;
    llmgw_token_t        *t;
    ngx_llmgw_bal_t      *tok, *usr;
    ngx_llmgw_hold_t     *h;
    ngx_llmgw_shm_ctx_t  *shm;

    shm = ngx_llmgw_shm();
    t = ctx->token;

    if (amount < 0) {
        amount = 0;
    }

    ngx_shmtx_lock(&shm->shpool->mutex);

    tok = ngx_llmgw_bal_token(shm, ctx);

    /* the key's balance is not freed to make room for the user's */
    if (tok) {
        tok->refs++;
    }

    usr = ngx_llmgw_bal_get(shm, NGX_LLMGW_BAL_USER, ctx->user_id,
                            llmgw_token_user_quota(t), 0,
                            llmgw_token_user_bal_rev(t));

    if (tok) {
        tok->refs--;
    }

    h = NULL;

    if (tok && usr) {
        h = ngx_llmgw_shm_alloc_locked(shm, sizeof(ngx_llmgw_hold_t));
    }

    if (h == NULL) {
        ngx_shmtx_unlock(&shm->shpool->mutex);
        ngx_log_error(NGX_LOG_ALERT, ngx_cycle->log, 0,
                      "llmgw: the shared zone is full; raise "
                      "llmgw_zone_size");
        llmgw_verdict_set(v, NGX_HTTP_SERVICE_UNAVAILABLE, "gateway_error",
                          "service_unavailable", "the gateway is out of "
                          "shared memory; retry shortly");
        return NGX_DECLINED;
    }

    if (!tok->unlimited) {
        avail = tok->known - tok->hold - tok->pending;

        if (ngx_llmgw_bal_spent(tok, v) != NGX_OK) {
            ngx_slab_free_locked(shm->shpool, h);
            ngx_shmtx_unlock(&shm->shpool->mutex);
            return NGX_DECLINED;
        }

        if (amount > avail) {
            ngx_slab_free_locked(shm->shpool, h);
            ngx_shmtx_unlock(&shm->shpool->mutex);
            llmgw_verdict_set(v, NGX_HTTP_FORBIDDEN, "gateway_error",
                              "pre_consume_token_quota_failed",
                              "the key's remaining quota (%lld) is below "
                              "this request's reservation (%lld); raise the "
                              "key quota or make it unlimited",
                              (long long) avail, (long long) amount);
            return NGX_DECLINED;
        }
    }

    avail = usr->known - usr->hold - usr->pending;

    /* a free request needs no balance; a priced one needs enough of it */
    if (amount > 0 && amount > avail) {
        ngx_slab_free_locked(shm->shpool, h);
        ngx_shmtx_unlock(&shm->shpool->mutex);
        llmgw_verdict_set(v, NGX_HTTP_FORBIDDEN, "gateway_error",
                          "insufficient_user_quota",
                          "the account's quota (%lld) is below this "
                          "request's reservation (%lld); top up",
                          (long long) avail, (long long) amount);
        return NGX_DECLINED;
    }

    h->token = tok;
    h->user = usr;
    h->amount = amount;
    h->rl_user = ctx->user_id;
    h->rl_group = ngx_llmgw_rl_group(&ctx->group);
    h->rl_reserved = ctx->rl_held ? ctx->rl_reserved : -1;
    tok->hold += amount;
    usr->hold += amount;
    tok->refs++;
    usr->refs++;
    ngx_queue_insert_tail(&ngx_llmgw_me->holds, &h->queue);

    ngx_shmtx_unlock(&shm->shpool->mutex);

    ctx->hold = h;

    return NGX_OK;
}


ngx_int_t
ngx_llmgw_billing_settle(ngx_llmgw_ctx_t *ctx, int64_t quota, u_char *row,
    size_t len)
{
    ngx_int_t             rc;
    ngx_llmgw_row_t      *r;
    ngx_llmgw_hold_t     *h;
    ngx_llmgw_shm_ctx_t  *shm;

    shm = ngx_llmgw_shm();
    h = ctx->hold;
    ctx->hold = NULL;
    rc = NGX_OK;

    ngx_shmtx_lock(&shm->shpool->mutex);

    r = ngx_llmgw_shm_alloc_locked(shm, offsetof(ngx_llmgw_row_t, data) + len);

    if (r == NULL) {
        rc = NGX_ERROR;

    } else {
        r->token_id = ctx->token_id;
        r->user_id = ctx->user_id;
        r->quota = quota;
        r->again = 0;
        r->len = len;
        ngx_memcpy(r->data, row, len);

        ngx_queue_insert_tail(&shm->sh->ledger, &r->queue);
        shm->sh->ledger_rows++;
        shm->sh->ledger_held++;

        if (quota != 0 && h != NULL) {
            h->token->pending += quota;
            h->user->pending += quota;
        }
    }

    if (h != NULL) {
        ngx_llmgw_release_locked(shm, h);
    }

    ngx_shmtx_unlock(&shm->shpool->mutex);

    return rc;
}


void
ngx_llmgw_billing_written_locked(ngx_llmgw_shm_ctx_t *shm, int64_t token_id,
    int64_t user_id, int64_t quota)
{
    ngx_llmgw_bal_t  *b;

    if (quota == 0) {
        return;
    }

    b = ngx_llmgw_bal_find(shm->sh, NGX_LLMGW_BAL_TOKEN, token_id);
    if (b) {
        b->pending -= quota;
        b->changed = ngx_current_msec;
    }

    b = ngx_llmgw_bal_find(shm->sh, NGX_LLMGW_BAL_USER, user_id);
    if (b) {
        b->pending -= quota;
        b->changed = ngx_current_msec;
    }
}


void
ngx_llmgw_billing_learned_locked(ngx_llmgw_shm_ctx_t *shm, int is_user,
    int64_t id, int64_t balance, int64_t rev)
{
    ngx_llmgw_bal_t  *b;

    b = ngx_llmgw_bal_find(shm->sh, is_user ? NGX_LLMGW_BAL_USER
                                            : NGX_LLMGW_BAL_TOKEN, id);

    if (b == NULL) {
        return;
    }

    b->changed = ngx_current_msec;

    if (rev < 0) {
        /* a reading without a revision can only lower the balance: what
           it says may be older than what is known */
        b->known = ngx_min(b->known, balance);

    } else if (rev > b->rev) {
        b->known = balance;
        b->rev = rev;
    }
}


/* An admin change: the next lookup's reading replaces the balance. */
void
ngx_llmgw_billing_stale(int is_user, int64_t id)
{
    ngx_llmgw_bal_t      *b;
    ngx_llmgw_shm_ctx_t  *shm;

    shm = ngx_llmgw_shm();
    if (shm == NULL) {
        return;
    }

    ngx_shmtx_lock(&shm->shpool->mutex);

    b = ngx_llmgw_bal_find(shm->sh, is_user ? NGX_LLMGW_BAL_USER
                                            : NGX_LLMGW_BAL_TOKEN, id);
    if (b) {
        b->stale = 1;
    }

    ngx_shmtx_unlock(&shm->shpool->mutex);
}


static void
ngx_llmgw_billing_learn_one(void *arg, int is_user, int64_t id,
    int64_t balance, int64_t rev)
{
    ngx_llmgw_billing_learned_locked(arg, is_user, id, balance, rev);
}


/* One balance a statement answered, with its revision (-1: none). */
void
ngx_llmgw_billing_learned(void *arg, int is_user, int64_t id,
    int64_t balance, int64_t rev)
{
    ngx_llmgw_shm_ctx_t  *shm;

    shm = ngx_llmgw_shm();

    ngx_shmtx_lock(&shm->shpool->mutex);
    ngx_llmgw_billing_learned_locked(shm, is_user, id, balance, rev);
    ngx_shmtx_unlock(&shm->shpool->mutex);
}


void
ngx_llmgw_billing_learn(const char *json, size_t len)
{
    ngx_llmgw_shm_ctx_t  *shm;

    shm = ngx_llmgw_shm();

    ngx_shmtx_lock(&shm->shpool->mutex);
    (void) llmgw_flush_answer(json, len, ngx_llmgw_billing_learn_one, shm);
    ngx_shmtx_unlock(&shm->shpool->mutex);
}


void
ngx_llmgw_billing_release(ngx_llmgw_ctx_t *ctx)
{
    ngx_llmgw_hold_t     *h;
    ngx_llmgw_shm_ctx_t  *shm;

    if (ctx == NULL || ctx->hold == NULL) {
        return;
    }

    shm = ngx_llmgw_shm();
    h = ctx->hold;
    ctx->hold = NULL;

    ngx_shmtx_lock(&shm->shpool->mutex);
    ngx_llmgw_release_locked(shm, h);
    ngx_shmtx_unlock(&shm->shpool->mutex);
}
