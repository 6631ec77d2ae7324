/*
 * test_budget.c - the request-memory budget both front ends share
 * (server/budget.c): takes within the limit succeed and count toward the
 * request that made them, a take past it fails and changes nothing, gives
 * return exactly what was taken, a forced take may pass the limit, and
 * threads taking and giving at once never let the total pass the limit nor
 * lose a byte.
 */
#include <pthread.h>

#include "../../server/budget.h"
#include "check.h"

static void test_take_give(void)
{
    req_budget b;
    req_budget_init(&b, 1000);
    uint64_t r1 = 0, r2 = 0;
    CHECK(req_budget_take(&b, &r1, 600));
    CHECK(!req_budget_take(&b, &r2, 401)); /* 600 + 401 > 1000 */
    CHECK_EQ_U64(r2, 0);
    CHECK_EQ_U64(req_budget_used(&b), 600);
    CHECK(req_budget_take(&b, &r2, 400)); /* exactly the limit */
    CHECK(!req_budget_take(&b, &r2, 1));
    CHECK(!req_budget_take(&b, &r2, UINT64_MAX)); /* no wrap-around */
    req_budget_give(&b, &r1, 600);
    CHECK_EQ_U64(r1, 0);
    CHECK_EQ_U64(req_budget_used(&b), 400);
    req_budget_force(&b, &r1, 2000); /* already allocated: counted past the limit */
    CHECK_EQ_U64(req_budget_used(&b), 2400);
    CHECK(!req_budget_take(&b, &r2, 1)); /* and nothing more until it is given back */
    req_budget_give(&b, &r1, 2000);
    req_budget_give(&b, &r2, 400);
    CHECK_EQ_U64(req_budget_used(&b), 0);
    char msg[160];
    req_budget_busy_msg(&b, msg, sizeof msg);
    CHECK(strstr(msg, "--request-memory") && strstr(msg, "limit 1000"));
}

enum { THREADS = 4, ROUNDS = 200000, LIMIT = 1000 };

static req_budget g_b;
static uint64_t g_peak_seen;

static void *hammer(void *arg)
{
    uint64_t held = 0, seed = (uint64_t)(uintptr_t)arg * 2654435761u + 1;
    for (int i = 0; i < ROUNDS; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        uint64_t n = 1 + (seed >> 33) % 300;
        if (req_budget_take(&g_b, &held, n)) {
            uint64_t used = req_budget_used(&g_b);
            if (used > __atomic_load_n(&g_peak_seen, __ATOMIC_RELAXED))
                __atomic_store_n(&g_peak_seen, used, __ATOMIC_RELAXED);
            req_budget_give(&g_b, &held, n);
        }
    }
    return (void *)(uintptr_t)held;
}

static void test_threads(void)
{
    req_budget_init(&g_b, LIMIT);
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, hammer, (void *)(uintptr_t)(i + 1));
    for (int i = 0; i < THREADS; i++) {
        void *left;
        pthread_join(t[i], &left);
        CHECK_EQ_U64((uint64_t)(uintptr_t)left, 0);
    }
    CHECK_EQ_U64(req_budget_used(&g_b), 0);
    CHECK(g_peak_seen <= LIMIT);
}

int main(void)
{
    test_take_give();
    test_threads();
    return check_report();
}
