/*
 * budget.h - the request-memory budget (--request-memory) that both front
 * ends draw from. Every byte held for a request - its message or body, its
 * parse, its results and the answer not yet sent - is taken from the one
 * budget before it is allocated, and given back when it is freed; a request
 * that cannot have it is refused (HTTP 503, gRPC RESOURCE_EXHAUSTED) instead
 * of the process growing until the kernel kills it.
 *
 * A request keeps its own count of what it holds (`held`, guarded by the
 * request's lock or owned by one thread), so it gives back exactly that.
 */
#ifndef FERRY_BUDGET_H
#define FERRY_BUDGET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint64_t limit;
    uint64_t used; /* atomic */
} req_budget;

void req_budget_init(req_budget *b, uint64_t limit);
/* Takes n bytes for a request holding *held; false (nothing taken) when the
 * budget cannot spare them. */
bool req_budget_take(req_budget *b, uint64_t *held, uint64_t n);
/* Takes n bytes even past the limit: for what is already allocated and
 * cannot be refused (the caller bounds how much that can be). */
void req_budget_force(req_budget *b, uint64_t *held, uint64_t n);
void req_budget_give(req_budget *b, uint64_t *held, uint64_t n);
uint64_t req_budget_used(const req_budget *b);
/* "server busy: N bytes of request memory in use, limit L (--request-memory)" */
void req_budget_busy_msg(const req_budget *b, char *msg, size_t cap);

#endif
