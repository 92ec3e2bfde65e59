#include "balances_seen.h"


void
seen(void *arg, int is_user, int64_t id, int64_t balance, int64_t rev)
{
    seen_t *s = arg;

    if (s->n < 8) {
        s->is_user[s->n] = is_user;
        s->id[s->n] = id;
        s->balance[s->n] = balance;
        s->rev[s->n] = rev;
    }
    s->n++;
}
