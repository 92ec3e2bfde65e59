/*
 * PostgreSQL on nginx's event loop: a small per-worker pool of non-blocking
 * libpq connections, a queue of statements with deadlines, and one
 * connection that LISTENs for configuration notices.
 *
 * libpq's own non-blocking interface is used throughout (PQconnectStart,
 * PQsendQueryParams, PQflush, PQconsumeInput): a worker never waits for the
 * database.  The socket is registered level-triggered, because
 * PQconsumeInput does not promise to drain it.
 */

#include "ngx_llmgw.h"

#include <sys/stat.h>


#define NGX_LLMGW_PG_QUEUE_MAX        10000
#define NGX_LLMGW_PG_CONNECT_TIMEOUT  10000     /* ms */


typedef enum {
    NGX_LLMGW_PG_DOWN = 0,
    NGX_LLMGW_PG_CONNECTING,
    NGX_LLMGW_PG_IDLE,
    NGX_LLMGW_PG_BUSY
} ngx_llmgw_pg_state_e;


typedef struct {
    ngx_queue_t                queue;
    char                      *sql;
    int                        nparams;
    char                     **params;
    int                       *lengths;
    char                      *copy;       /* COPY ... FROM STDIN data */
    size_t                     copy_len;
    ngx_llmgw_pg_handler_pt    handler;
    void                      *data;
    ngx_event_t                timer;
    unsigned                   queued:1;
} ngx_llmgw_pg_query_t;


typedef struct {
    PGconn                    *conn;
    ngx_connection_t          *c;
    ngx_llmgw_pg_state_e       state;
    ngx_llmgw_pg_query_t      *query;
    PGresult                  *result;
    ngx_event_t                retry;
    ngx_msec_t                 backoff;
    ino_t                      sock_ino;    /* the socket being watched */
    unsigned                   listen:1;
    unsigned                   flushing:1;
} ngx_llmgw_pg_conn_t;


static void ngx_llmgw_pg_connect(ngx_llmgw_pg_conn_t *pc);
static ngx_int_t ngx_llmgw_pg_watch(ngx_llmgw_pg_conn_t *pc, ngx_socket_t fd);
static void ngx_llmgw_pg_event(ngx_event_t *ev);
static void ngx_llmgw_pg_drive(ngx_llmgw_pg_conn_t *pc);
static void ngx_llmgw_pg_fail(ngx_llmgw_pg_conn_t *pc, const char *why);
static void ngx_llmgw_pg_release(ngx_llmgw_pg_conn_t *pc, ngx_uint_t closed);
static void ngx_llmgw_pg_dispatch(void);
static void ngx_llmgw_pg_finish_query(ngx_llmgw_pg_query_t *q, PGresult *res,
    const char *err);
static void ngx_llmgw_pg_query_timeout(ngx_event_t *ev);
static void ngx_llmgw_pg_retry(ngx_event_t *ev);
static ngx_uint_t ngx_llmgw_pg_may_retry(void);
static ngx_uint_t ngx_llmgw_pg_all_down(void);
static void ngx_llmgw_pg_give_up(ngx_event_t *ev);
static void ngx_llmgw_pg_wake(void);
static ngx_int_t ngx_llmgw_pg_want_write(ngx_llmgw_pg_conn_t *pc,
    ngx_uint_t on);
static ngx_int_t ngx_llmgw_pg_flush(ngx_llmgw_pg_conn_t *pc);
static ngx_int_t ngx_llmgw_pg_enqueue(const char *sql, int nparams,
    const char *const *params, const int *lengths, const u_char *copy,
    size_t copy_len, ngx_llmgw_pg_handler_pt handler, void *data);
static ngx_int_t ngx_llmgw_pg_put_copy(PGconn *conn, ngx_llmgw_pg_query_t *q);


static ngx_llmgw_pg_conn_t     *ngx_llmgw_pg_conns;
static ngx_uint_t               ngx_llmgw_pg_nconns;
static ngx_queue_t              ngx_llmgw_pg_pending;
static ngx_uint_t               ngx_llmgw_pg_npending;
static ngx_event_t              ngx_llmgw_pg_give_up_ev;
static ngx_llmgw_main_conf_t   *ngx_llmgw_pg_mcf;
static ngx_llmgw_pg_notify_pt   ngx_llmgw_pg_notify;
static char                    *ngx_llmgw_pg_conninfo;
static ngx_log_t               *ngx_llmgw_pg_log;
/* when a connection or statement last failed on the database, 0 once one
   has succeeded since */
static ngx_msec_t               ngx_llmgw_pg_failed_at;
/* the SQLSTATE of the failed statement whose handler runs, else "" */
static char                     ngx_llmgw_pg_state[6];


ngx_int_t
ngx_llmgw_pg_init_process(ngx_cycle_t *cycle, ngx_llmgw_main_conf_t *mcf,
    ngx_llmgw_pg_notify_pt notify)
{
    ngx_uint_t  i;

    ngx_llmgw_pg_mcf = mcf;
    ngx_llmgw_pg_notify = notify;
    ngx_llmgw_pg_log = cycle->log;

    ngx_llmgw_pg_conninfo = ngx_alloc(mcf->database.len + 1, cycle->log);
    if (ngx_llmgw_pg_conninfo == NULL) {
        return NGX_ERROR;
    }

    ngx_memcpy(ngx_llmgw_pg_conninfo, mcf->database.data, mcf->database.len);
    ngx_llmgw_pg_conninfo[mcf->database.len] = '\0';

    ngx_queue_init(&ngx_llmgw_pg_pending);

    ngx_llmgw_pg_give_up_ev.handler = ngx_llmgw_pg_give_up;
    ngx_llmgw_pg_give_up_ev.log = cycle->log;

    /* the pool, plus one listener */
    ngx_llmgw_pg_nconns = mcf->pg_pool_size + 1;
    ngx_llmgw_pg_conns = ngx_calloc(ngx_llmgw_pg_nconns
                                    * sizeof(ngx_llmgw_pg_conn_t),
                                    cycle->log);
    if (ngx_llmgw_pg_conns == NULL) {
        return NGX_ERROR;
    }

    for (i = 0; i < ngx_llmgw_pg_nconns; i++) {
        ngx_llmgw_pg_conns[i].listen = (i == 0);
        ngx_llmgw_pg_conns[i].retry.handler = ngx_llmgw_pg_retry;
        ngx_llmgw_pg_conns[i].retry.data = &ngx_llmgw_pg_conns[i];
        ngx_llmgw_pg_conns[i].retry.log = cycle->log;
        ngx_llmgw_pg_conns[i].retry.cancelable = 1;
        ngx_llmgw_pg_conns[i].backoff = 100;
        ngx_llmgw_pg_connect(&ngx_llmgw_pg_conns[i]);
    }

    return NGX_OK;
}


void
ngx_llmgw_pg_exit_process(ngx_cycle_t *cycle)
{
    ngx_uint_t  i;

    if (ngx_llmgw_pg_give_up_ev.posted) {
        ngx_delete_posted_event(&ngx_llmgw_pg_give_up_ev);
    }

    for (i = 0; i < ngx_llmgw_pg_nconns; i++) {
        if (ngx_llmgw_pg_conns[i].retry.timer_set) {
            ngx_del_timer(&ngx_llmgw_pg_conns[i].retry);
        }
        ngx_llmgw_pg_release(&ngx_llmgw_pg_conns[i], 0);
    }

    ngx_llmgw_pg_nconns = 0;
}


ngx_int_t
ngx_llmgw_pg_query(const char *sql, int nparams, const char *const *params,
    const int *lengths, ngx_llmgw_pg_handler_pt handler, void *data)
{
    return ngx_llmgw_pg_enqueue(sql, nparams, params, lengths, NULL, 0,
                                handler, data);
}


ngx_int_t
ngx_llmgw_pg_copy(const char *sql, const u_char *copy, size_t len,
    ngx_llmgw_pg_handler_pt handler, void *data)
{
    return ngx_llmgw_pg_enqueue(sql, 0, NULL, NULL, copy, len, handler, data);
}


static ngx_int_t
ngx_llmgw_pg_enqueue(const char *sql, int nparams, const char *const *params,
    const int *lengths, const u_char *copy, size_t copy_len,
    ngx_llmgw_pg_handler_pt handler, void *data)
{
    int                    i;
    size_t                 len, size;
    u_char                *p;
    ngx_llmgw_pg_query_t  *q;

    if (ngx_llmgw_pg_nconns == 0
        || ngx_llmgw_pg_npending >= NGX_LLMGW_PG_QUEUE_MAX)
    {
        return NGX_DECLINED;
    }

    /* one allocation holds the query, its SQL, parameters and COPY data */
    size = sizeof(ngx_llmgw_pg_query_t) + strlen(sql) + 1
           + nparams * (sizeof(char *) + sizeof(int)) + copy_len;

    for (i = 0; i < nparams; i++) {
        size += (lengths ? (size_t) lengths[i] : strlen(params[i])) + 1;
    }

    q = ngx_calloc(size, ngx_llmgw_pg_log);
    if (q == NULL) {
        return NGX_ERROR;
    }

    p = (u_char *) (q + 1);

    q->params = (char **) p;
    p += nparams * sizeof(char *);
    q->lengths = (int *) p;
    p += nparams * sizeof(int);

    for (i = 0; i < nparams; i++) {
        len = lengths ? (size_t) lengths[i] : strlen(params[i]);
        q->params[i] = (char *) p;
        q->lengths[i] = (int) len;
        p = ngx_cpymem(p, params[i], len);
        *p++ = '\0';
    }

    if (copy) {
        q->copy = (char *) p;
        q->copy_len = copy_len;
        p = ngx_cpymem(p, copy, copy_len);
    }

    q->sql = (char *) p;
    ngx_memcpy(p, sql, strlen(sql) + 1);

    q->nparams = nparams;
    q->handler = handler;
    q->data = data;

    q->timer.handler = ngx_llmgw_pg_query_timeout;
    q->timer.data = q;
    q->timer.log = ngx_llmgw_pg_log;
    ngx_add_timer(&q->timer, ngx_llmgw_pg_mcf->pg_timeout);

    ngx_queue_insert_tail(&ngx_llmgw_pg_pending, &q->queue);
    q->queued = 1;
    ngx_llmgw_pg_npending++;

    if (ngx_llmgw_pg_all_down()) {
        if (!ngx_terminate) {
            ngx_llmgw_pg_wake();
        }
        return NGX_OK;
    }

    ngx_llmgw_pg_dispatch();

    return NGX_OK;
}


/*
 * At exit, where nothing else runs and blocking is allowed: one statement
 * on a connection of its own, with one text parameter (param) or COPY data
 * (copy, when not NULL).
 */
ngx_int_t
ngx_llmgw_pg_exec_at_exit(const char *sql, const char *param,
    const u_char *copy, size_t len, ngx_llmgw_pg_handler_pt handler,
    void *data)
{
    PGconn          *conn;
    PGresult        *res, *next;
    ngx_int_t        rc;
    const char      *values[1];
    const char *const keys[] = { "dbname", "connect_timeout", NULL };
    const char       *vals[] = { ngx_llmgw_pg_conninfo, "3", NULL };

    if (ngx_llmgw_pg_conninfo == NULL) {
        return NGX_ERROR;
    }

    conn = PQconnectdbParams(keys, vals, 1);

    if (PQstatus(conn) != CONNECTION_OK) {
        ngx_log_error(NGX_LOG_ERR, ngx_llmgw_pg_log, 0,
                      "llmgw: database unreachable at exit: %s",
                      PQerrorMessage(conn));
        PQfinish(conn);
        return NGX_ERROR;
    }

    /*
     * An exiting worker must not wait for ever on a lock: what it cannot
     * write is left in the zone, where another worker reaps it.
     */
    res = PQexec(conn, "SET lock_timeout = '5s'; SET statement_timeout = '30s'");
    PQclear(res);

    if (copy == NULL) {
        values[0] = param;
        res = PQexecParams(conn, sql, 1, NULL, values, NULL, NULL, 0);

    } else {
        res = PQexec(conn, sql);

        if (PQresultStatus(res) == PGRES_COPY_IN) {
            PQclear(res);
            res = NULL;

            if ((len > 0 && PQputCopyData(conn, (const char *) copy, (int) len)
                            != 1)
                || PQputCopyEnd(conn, NULL) != 1)
            {
                ngx_log_error(NGX_LOG_ERR, ngx_llmgw_pg_log, 0,
                              "llmgw: COPY failed at exit: %s",
                              PQerrorMessage(conn));
                PQfinish(conn);
                return NGX_ERROR;
            }

            /* the last result tells; an error stops the rest */
            while ((next = PQgetResult(conn)) != NULL) {
                if (res != NULL && PQresultStatus(res) == PGRES_FATAL_ERROR) {
                    PQclear(next);
                    continue;
                }

                PQclear(res);
                res = next;
            }
        }
    }

    rc = (PQresultStatus(res) == PGRES_TUPLES_OK
          || PQresultStatus(res) == PGRES_COMMAND_OK) ? NGX_OK : NGX_ERROR;

    if (rc != NGX_OK) {
        ngx_log_error(NGX_LOG_ERR, ngx_llmgw_pg_log, 0,
                      "llmgw: statement failed at exit: %s",
                      res ? PQresultErrorMessage(res) : PQerrorMessage(conn));

    } else if (handler != NULL && PQresultStatus(res) == PGRES_TUPLES_OK) {
        handler(data, res, NULL);
    }

    PQclear(res);
    PQfinish(conn);

    return rc;
}


/* The inode of a socket: tells a new socket from an old one of one fd. */
static ino_t
ngx_llmgw_pg_sock_ino(ngx_socket_t fd)
{
    struct stat  st;

    return fstat(fd, &st) == 0 ? st.st_ino : 0;
}


/*
 * Watches libpq's current socket for reading, under a connect deadline
 * (libpq enforces none in non-blocking mode).
 */
static ngx_int_t
ngx_llmgw_pg_watch(ngx_llmgw_pg_conn_t *pc, ngx_socket_t fd)
{
    ngx_connection_t  *c;

    c = ngx_get_connection(fd, ngx_llmgw_pg_log);
    if (c == NULL) {
        ngx_llmgw_pg_fail(pc, "no free nginx connection");
        return NGX_ERROR;
    }

    c->data = pc;
    c->read->handler = ngx_llmgw_pg_event;
    c->write->handler = ngx_llmgw_pg_event;
    c->read->log = ngx_llmgw_pg_log;
    c->write->log = ngx_llmgw_pg_log;

    pc->c = c;
    pc->sock_ino = ngx_llmgw_pg_sock_ino(fd);

    if (ngx_add_event(c->read, NGX_READ_EVENT, 0) != NGX_OK) {
        ngx_llmgw_pg_fail(pc, "cannot watch the socket");
        return NGX_ERROR;
    }

    /* the statements waiting for it have timers of their own: a connection
       being made keeps no stopping worker alive by itself */
    c->read->cancelable = 1;
    ngx_add_timer(c->read, NGX_LLMGW_PG_CONNECT_TIMEOUT);

    return NGX_OK;
}


static void
ngx_llmgw_pg_connect(ngx_llmgw_pg_conn_t *pc)
{
    ngx_socket_t       fd;
    const char *const  keys[] = { "dbname", "application_name", NULL };
    const char        *vals[] = { ngx_llmgw_pg_conninfo, "llmgw", NULL };

    pc->conn = PQconnectStartParams(keys, vals, 1);

    if (pc->conn == NULL || PQstatus(pc->conn) == CONNECTION_BAD) {
        ngx_llmgw_pg_fail(pc, pc->conn ? PQerrorMessage(pc->conn)
                                       : "out of memory");
        return;
    }

    fd = PQsocket(pc->conn);

    if (fd == (ngx_socket_t) -1) {
        ngx_llmgw_pg_fail(pc, "no socket");
        return;
    }

    pc->state = NGX_LLMGW_PG_CONNECTING;

    if (ngx_llmgw_pg_watch(pc, fd) != NGX_OK) {
        return;
    }

    /* a fresh socket is writable: this starts PQconnectPoll */
    if (ngx_llmgw_pg_want_write(pc, 1) != NGX_OK) {
        ngx_llmgw_pg_fail(pc, "cannot watch the socket");
        return;
    }
}


static ngx_int_t
ngx_llmgw_pg_want_write(ngx_llmgw_pg_conn_t *pc, ngx_uint_t on)
{
    ngx_event_t  *wev = pc->c->write;

    if (on && !wev->active) {
        return ngx_add_event(wev, NGX_WRITE_EVENT, 0);
    }

    if (!on && wev->active) {
        return ngx_del_event(wev, NGX_WRITE_EVENT, 0);
    }

    return NGX_OK;
}


static void
ngx_llmgw_pg_event(ngx_event_t *ev)
{
    ngx_connection_t     *c = ev->data;
    ngx_llmgw_pg_conn_t  *pc = c->data;

    if (ev->timedout) {
        ev->timedout = 0;

        if (pc->state == NGX_LLMGW_PG_CONNECTING) {
            ngx_llmgw_pg_fail(pc, "connecting timed out");
            return;
        }
    }

    ngx_llmgw_pg_drive(pc);
}


static void
ngx_llmgw_pg_connecting(ngx_llmgw_pg_conn_t *pc)
{
    ngx_socket_t                  fd;
    PostgresPollingStatusType     st;

    st = PQconnectPoll(pc->conn);
    fd = PQsocket(pc->conn);

    if (st == PGRES_POLLING_FAILED) {
        ngx_llmgw_pg_fail(pc, PQerrorMessage(pc->conn));
        return;
    }

    /*
     * libpq moved to another address (or dropped SSL): a new socket, which
     * the kernel often gives the old one's number.  The old one's watch
     * went with it; the new one is watched.
     */
    if (fd != pc->c->fd || ngx_llmgw_pg_sock_ino(fd) != pc->sock_ino) {
        ngx_llmgw_pg_release(pc, 1);

        if (ngx_llmgw_pg_watch(pc, fd) != NGX_OK) {
            return;
        }
    }

    switch (st) {

    case PGRES_POLLING_WRITING:
        ngx_llmgw_pg_want_write(pc, 1);
        return;

    case PGRES_POLLING_OK:
        break;

    default:
        ngx_llmgw_pg_want_write(pc, 0);
        return;
    }

    ngx_llmgw_pg_want_write(pc, 0);

    if (pc->c->read->timer_set) {
        ngx_del_timer(pc->c->read);
    }

    if (PQsetnonblocking(pc->conn, 1) != 0) {
        ngx_llmgw_pg_fail(pc, PQerrorMessage(pc->conn));
        return;
    }

    pc->backoff = 100;
    pc->state = NGX_LLMGW_PG_IDLE;
    ngx_llmgw_pg_failed_at = 0;

    ngx_log_error(NGX_LOG_INFO, ngx_llmgw_pg_log, 0,
                  "llmgw: database connection %s ready",
                  pc->listen ? "(listener)" : "");

    if (pc->listen) {
        if (!PQsendQuery(pc->conn, "LISTEN llmgw_config")) {
            ngx_llmgw_pg_fail(pc, PQerrorMessage(pc->conn));
            return;
        }
        pc->state = NGX_LLMGW_PG_BUSY;
        pc->flushing = 1;

        if (ngx_llmgw_pg_flush(pc) != NGX_OK) {
            ngx_llmgw_pg_fail(pc, PQerrorMessage(pc->conn));
            return;
        }

        /* notices sent while this listener was down were missed */
        ngx_llmgw_pg_notify("llmgw_config", NULL);
        return;
    }

    ngx_llmgw_pg_dispatch();
}


static void
ngx_llmgw_pg_drive(ngx_llmgw_pg_conn_t *pc)
{
    PGresult              *res;
    PGnotify              *n;
    ngx_llmgw_pg_query_t  *q;

    if (pc->state == NGX_LLMGW_PG_CONNECTING) {
        ngx_llmgw_pg_connecting(pc);
        return;
    }

    if (pc->state == NGX_LLMGW_PG_DOWN) {
        return;
    }

    if (ngx_llmgw_pg_flush(pc) != NGX_OK) {
        ngx_llmgw_pg_fail(pc, PQerrorMessage(pc->conn));
        return;
    }

    if (pc->flushing) {
        return;
    }

    if (!PQconsumeInput(pc->conn)) {
        ngx_llmgw_pg_fail(pc, PQerrorMessage(pc->conn));
        return;
    }

    while ((n = PQnotifies(pc->conn)) != NULL) {
        ngx_llmgw_pg_notify(n->relname, n->extra);
        PQfreemem(n);
    }

    if (pc->state != NGX_LLMGW_PG_BUSY) {
        return;
    }

    while (!PQisBusy(pc->conn)) {
        res = PQgetResult(pc->conn);

        if (res == NULL) {
            /*
             * The statement is complete.  The connection is free before
             * the handler runs: the handler may send the next statement
             * on this very connection.
             */
            res = pc->result;
            q = pc->query;
            pc->result = NULL;
            pc->query = NULL;
            pc->state = NGX_LLMGW_PG_IDLE;
            ngx_llmgw_pg_failed_at = 0;

            if (q) {
                ngx_llmgw_pg_finish_query(q, res, NULL);
            }

            PQclear(res);
            ngx_llmgw_pg_dispatch();
            return;
        }

        if (PQresultStatus(res) == PGRES_COPY_IN) {
            PQclear(res);

            /* the data goes out with the event loop, like a statement */
            if (ngx_llmgw_pg_put_copy(pc->conn, pc->query) != NGX_OK) {
                ngx_llmgw_pg_fail(pc, PQerrorMessage(pc->conn));
                return;
            }

            pc->flushing = 1;

            if (ngx_llmgw_pg_flush(pc) != NGX_OK) {
                ngx_llmgw_pg_fail(pc, PQerrorMessage(pc->conn));
                return;
            }

            if (pc->flushing) {
                return;
            }

            continue;
        }

        /* keep the last result of the statement */
        PQclear(pc->result);
        pc->result = res;
    }
}


/*
 * Queues a query's COPY data and its end in libpq's buffer (which grows to
 * take it; PQflush sends it).  A COPY without data (a statement that was
 * not sent as one) is ended with an error, so the server rolls it back.
 */
static ngx_int_t
ngx_llmgw_pg_put_copy(PGconn *conn, ngx_llmgw_pg_query_t *q)
{
    if (q == NULL || q->copy == NULL) {
        return PQputCopyEnd(conn, "unexpected COPY") == 1 ? NGX_OK
                                                          : NGX_ERROR;
    }

    if (q->copy_len > 0
        && PQputCopyData(conn, q->copy, (int) q->copy_len) != 1)
    {
        return NGX_ERROR;
    }

    return PQputCopyEnd(conn, NULL) == 1 ? NGX_OK : NGX_ERROR;
}


static void
ngx_llmgw_pg_dispatch(void)
{
    ngx_uint_t             i;
    ngx_queue_t           *qq;
    ngx_llmgw_pg_conn_t   *pc;
    ngx_llmgw_pg_query_t  *q;

    for (i = 1; i < ngx_llmgw_pg_nconns; i++) {

        if (ngx_queue_empty(&ngx_llmgw_pg_pending)) {
            return;
        }

        pc = &ngx_llmgw_pg_conns[i];

        if (pc->state != NGX_LLMGW_PG_IDLE) {
            continue;
        }

        qq = ngx_queue_head(&ngx_llmgw_pg_pending);
        ngx_queue_remove(qq);
        ngx_llmgw_pg_npending--;

        q = ngx_queue_data(qq, ngx_llmgw_pg_query_t, queue);
        q->queued = 0;

        if (!(q->copy
              ? PQsendQuery(pc->conn, q->sql)
              : PQsendQueryParams(pc->conn, q->sql, q->nparams, NULL,
                                  (const char *const *) q->params,
                                  q->lengths, NULL, 0)))
        {
            /* the statement waits for another connection */
            ngx_queue_insert_head(&ngx_llmgw_pg_pending, &q->queue);
            q->queued = 1;
            ngx_llmgw_pg_npending++;
            ngx_llmgw_pg_fail(pc, PQerrorMessage(pc->conn));
            continue;
        }

        pc->query = q;
        pc->state = NGX_LLMGW_PG_BUSY;
        pc->flushing = 1;

        /*
         * Only send here.  The answer is read from the event handler even
         * if it is already there: a caller is never called back before
         * ngx_llmgw_pg_query() returns.
         */
        if (ngx_llmgw_pg_flush(pc) != NGX_OK) {
            /*
             * Not failed here: that would answer the caller, whose
             * ngx_llmgw_pg_query() has not returned yet.  The event loop
             * flushes again, and fails the connection there.
             */
            ngx_post_event(pc->c->write, &ngx_posted_events);
        }
    }
}


static ngx_int_t
ngx_llmgw_pg_flush(ngx_llmgw_pg_conn_t *pc)
{
    int  rc;

    if (!pc->flushing) {
        return NGX_OK;
    }

    rc = PQflush(pc->conn);

    if (rc < 0) {
        return NGX_ERROR;
    }

    if (rc == 1) {
        return ngx_llmgw_pg_want_write(pc, 1);
    }

    pc->flushing = 0;

    return ngx_llmgw_pg_want_write(pc, 0);
}


const char *
ngx_llmgw_pg_error_state(void)
{
    return ngx_llmgw_pg_state;
}


static void
ngx_llmgw_pg_finish_query(ngx_llmgw_pg_query_t *q, PGresult *res,
    const char *err)
{
    char            *state;
    ExecStatusType   st;

    if (q->timer.timer_set) {
        ngx_del_timer(&q->timer);
    }

    if (q->handler) {
        if (err == NULL && res != NULL) {
            st = PQresultStatus(res);
            if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) {
                err = PQresultErrorMessage(res);
                state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
                if (state != NULL) {
                    ngx_cpystrn((u_char *) ngx_llmgw_pg_state,
                                (u_char *) state, sizeof(ngx_llmgw_pg_state));
                }
                res = NULL;
            }
        }

        if (err == NULL && res == NULL) {
            err = "no result";
        }

        q->handler(q->data, err ? NULL : res, err);
        ngx_llmgw_pg_state[0] = '\0';
    }

    ngx_free(q);
}


static void
ngx_llmgw_pg_query_timeout(ngx_event_t *ev)
{
    ngx_llmgw_pg_query_t  *q = ev->data;

    ngx_llmgw_pg_failed_at = ngx_current_msec | 1;

    if (q->queued) {
        ngx_queue_remove(&q->queue);
        ngx_llmgw_pg_npending--;
        ngx_llmgw_pg_finish_query(q, NULL, "the database did not answer "
                                  "in time");
        return;
    }

    /*
     * Running on a connection: the blocking PQcancel is not an option, so
     * the caller is answered now and the result dropped when it comes.
     */
    q->handler(q->data, NULL, "the database did not answer in time");
    q->handler = NULL;
}


static void
ngx_llmgw_pg_fail(ngx_llmgw_pg_conn_t *pc, const char *why)
{
    ngx_llmgw_pg_query_t  *q;

    ngx_log_error(NGX_LOG_ERR, ngx_llmgw_pg_log, 0,
                  "llmgw: database connection failed: %s", why);

    ngx_llmgw_pg_failed_at = ngx_current_msec | 1;

    q = pc->query;
    pc->query = NULL;

    ngx_llmgw_pg_release(pc, 0);

    if (q) {
        ngx_llmgw_pg_finish_query(q, NULL, "the database connection failed");
    }

    /* a stopping worker waits for no database that refuses it: what waits
       is answered (the ledger writes its rows at exit), from an event of
       its own, since this may run inside ngx_llmgw_pg_query() */
    if (ngx_exiting && ngx_llmgw_pg_all_down()
        && !ngx_llmgw_pg_give_up_ev.posted)
    {
        ngx_post_event(&ngx_llmgw_pg_give_up_ev, &ngx_posted_events);
    }

    if (ngx_llmgw_pg_may_retry() && !pc->retry.timer_set) {
        ngx_add_timer(&pc->retry, pc->backoff);
        pc->backoff = ngx_min(pc->backoff * 2, 2000);
    }
}


static void
ngx_llmgw_pg_give_up(ngx_event_t *ev)
{
    ngx_queue_t            failed;
    ngx_llmgw_pg_query_t  *q;

    if (!ngx_exiting || !ngx_llmgw_pg_all_down()
        || ngx_queue_empty(&ngx_llmgw_pg_pending))
    {
        return;
    }

    /* the ones queued now: a handler may queue another */
    ngx_queue_init(&failed);
    ngx_queue_add(&failed, &ngx_llmgw_pg_pending);
    ngx_queue_init(&ngx_llmgw_pg_pending);
    ngx_llmgw_pg_npending = 0;

    while (!ngx_queue_empty(&failed)) {
        q = ngx_queue_data(ngx_queue_head(&failed), ngx_llmgw_pg_query_t,
                           queue);
        ngx_queue_remove(&q->queue);
        q->queued = 0;
        ngx_llmgw_pg_finish_query(q, NULL, "the database connection failed");
    }
}


/*
 * A statement queued while no connection is up or on its way: connections
 * that stopped trying (a stopping worker with nothing queued) try again,
 * from their timers (a connect that fails at once must not answer the
 * caller inside ngx_llmgw_pg_query()).
 */
static void
ngx_llmgw_pg_wake(void)
{
    ngx_uint_t  i;

    for (i = 1; i < ngx_llmgw_pg_nconns; i++) {
        if (ngx_llmgw_pg_conns[i].state == NGX_LLMGW_PG_DOWN
            && !ngx_llmgw_pg_conns[i].retry.timer_set)
        {
            ngx_add_timer(&ngx_llmgw_pg_conns[i].retry, 1);
        }
    }
}


/*
 * Whether the database failed (a connection, or a statement that did not
 * answer in time) within the last ms milliseconds, with nothing
 * succeeding since.
 */
ngx_uint_t
ngx_llmgw_pg_failing(ngx_msec_t ms)
{
    return ngx_llmgw_pg_failed_at != 0
           && ngx_current_msec - ngx_llmgw_pg_failed_at < ms;
}


/* no connection of the pool is up or on its way up */
static ngx_uint_t
ngx_llmgw_pg_all_down(void)
{
    ngx_uint_t  i;

    for (i = 1; i < ngx_llmgw_pg_nconns; i++) {
        if (ngx_llmgw_pg_conns[i].state != NGX_LLMGW_PG_DOWN) {
            return 0;
        }
    }

    return 1;
}


/* closed: libpq already closed the socket, so only forget it */
static void
ngx_llmgw_pg_release(ngx_llmgw_pg_conn_t *pc, ngx_uint_t closed)
{
    ngx_uint_t         flags;
    ngx_connection_t  *c = pc->c;

    if (c) {
        if (c->read->timer_set) {
            ngx_del_timer(c->read);
        }

        if (c->write->timer_set) {
            ngx_del_timer(c->write);
        }

        /*
         * libpq closes the socket itself when the server hangs up
         * ("server closed the connection unexpectedly"): the closed file
         * left epoll already, and removing it again would fail.
         */
        flags = (closed || pc->conn == NULL || PQsocket(pc->conn) != c->fd)
                ? NGX_CLOSE_EVENT : 0;

        if (c->read->active) {
            ngx_del_event(c->read, NGX_READ_EVENT, flags);
        }

        if (c->write->active) {
            ngx_del_event(c->write, NGX_WRITE_EVENT, flags);
        }

        if (c->read->posted) {
            ngx_delete_posted_event(c->read);
        }

        if (c->write->posted) {
            ngx_delete_posted_event(c->write);
        }

        c->fd = (ngx_socket_t) -1;
        ngx_free_connection(c);
        pc->c = NULL;
    }

    if (closed) {
        return;
    }

    PQclear(pc->result);
    pc->result = NULL;

    if (pc->conn) {
        PQfinish(pc->conn);
        pc->conn = NULL;
    }

    pc->state = NGX_LLMGW_PG_DOWN;
    pc->flushing = 0;
}


static void
ngx_llmgw_pg_retry(ngx_event_t *ev)
{
    ngx_llmgw_pg_conn_t  *pc = ev->data;

    if (!ngx_llmgw_pg_may_retry()) {
        return;
    }

    ngx_llmgw_pg_connect(pc);
}


/*
 * A stopping worker still connects while statements wait: their timers
 * keep it from exiting, and a request waiting on a key lookup is answered
 * rather than left to time out.  With nothing waiting it stops trying.
 */
static ngx_uint_t
ngx_llmgw_pg_may_retry(void)
{
    return !ngx_terminate && (!ngx_exiting || ngx_llmgw_pg_npending > 0);
}
