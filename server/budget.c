/*
 * budget.c - the request-memory budget; see budget.h.
 */
#include "budget.h"

#include <stdio.h>

void req_budget_init(req_budget *b, uint64_t limit)
{
    b->limit = limit;
    b->used = 0;
}

bool req_budget_take(req_budget *b, uint64_t *held, uint64_t n)
{
    uint64_t used = __atomic_load_n(&b->used, __ATOMIC_RELAXED);
    do {
        if (used > b->limit || n > b->limit - used) return false; /* a forced take may have passed it */
    } while (!__atomic_compare_exchange_n(&b->used, &used, used + n, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    *held += n;
    return true;
}

void req_budget_force(req_budget *b, uint64_t *held, uint64_t n)
{
    __atomic_fetch_add(&b->used, n, __ATOMIC_RELAXED);
    *held += n;
}

void req_budget_give(req_budget *b, uint64_t *held, uint64_t n)
{
    *held -= n;
    __atomic_fetch_sub(&b->used, n, __ATOMIC_RELAXED);
}

uint64_t req_budget_used(const req_budget *b) { return __atomic_load_n(&b->used, __ATOMIC_RELAXED); }

void req_budget_busy_msg(const req_budget *b, char *msg, size_t cap)
{
    snprintf(msg, cap, "server busy: %llu bytes of request memory in use, limit %llu (--request-memory)",
             (unsigned long long)req_budget_used(b), (unsigned long long)b->limit);
}
