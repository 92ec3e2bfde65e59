/*
 * A llmgw_balance_cb that records the balances it is given, for the tests
 * of the answers that report balances (flushes, task claims).
 */

#ifndef BALANCES_SEEN_H
#define BALANCES_SEEN_H

#include <stdint.h>

typedef struct {
    int      n;             /* the balances given, at most 8 recorded */
    int      is_user[8];
    int64_t  id[8], balance[8], rev[8];
} seen_t;

void seen(void *arg, int is_user, int64_t id, int64_t balance, int64_t rev);

#endif
