/*
 * check.h - the few assertion macros ferry's C unit tests share.
 *
 * A failed check prints "file:line: what was expected, what was got" to
 * stderr and counts a failure; the test goes on so that one run shows every
 * broken case. main ends with `return check_report();`, which prints a
 * summary and returns non-zero when anything failed (what `make unit` needs).
 */
#ifndef FERRY_TEST_CHECK_H
#define FERRY_TEST_CHECK_H

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "../../engine/base/status.h"

static int check_failures;
static int check_count;

#define CHECK_FAIL_(...)                                                     \
    do {                                                                     \
        fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);                      \
        fprintf(stderr, __VA_ARGS__);                                        \
        fputc('\n', stderr);                                                 \
        check_failures++;                                                    \
    } while (0)

#define CHECK(cond)                                                          \
    do {                                                                     \
        check_count++;                                                       \
        if (!(cond)) CHECK_FAIL_("expected %s", #cond);                      \
    } while (0)

#define CHECK_EQ_INT(got, want)                                              \
    do {                                                                     \
        long long g_ = (long long)(got), w_ = (long long)(want);             \
        check_count++;                                                       \
        if (g_ != w_) CHECK_FAIL_("%s: expected %lld (%s), got %lld", #got, w_, #want, g_); \
    } while (0)

#define CHECK_EQ_U64(got, want)                                              \
    do {                                                                     \
        uint64_t g_ = (uint64_t)(got), w_ = (uint64_t)(want);                \
        check_count++;                                                       \
        if (g_ != w_)                                                        \
            CHECK_FAIL_("%s: expected %" PRIu64 " (%s), got %" PRIu64, #got, w_, #want, g_); \
    } while (0)

#define CHECK_EQ_STR(got, want)                                              \
    do {                                                                     \
        const char *g_ = (got), *w_ = (want);                                \
        check_count++;                                                       \
        if (!g_ || !w_ || strcmp(g_, w_) != 0)                               \
            CHECK_FAIL_("%s: expected \"%s\", got \"%s\"", #got, w_ ? w_ : "(null)", g_ ? g_ : "(null)"); \
    } while (0)

/* Evaluates expr once; on a mismatch shows both status names and the
 * message the call left behind. */
#define CHECK_STATUS(expr, want)                                             \
    do {                                                                     \
        ferry_status g_ = (expr), w_ = (want);                               \
        check_count++;                                                       \
        if (g_ != w_)                                                        \
            CHECK_FAIL_("%s: expected status '%s', got '%s' (message: \"%s\")", #expr, \
                        ferry_status_name(w_), ferry_status_name(g_), ferry_errmsg()); \
    } while (0)

/* The last error message of this thread contains `sub`. */
#define CHECK_MSG_HAS(sub)                                                   \
    do {                                                                     \
        const char *m_ = ferry_errmsg(), *s_ = (sub);                        \
        check_count++;                                                       \
        if (!strstr(m_, s_))                                                 \
            CHECK_FAIL_("expected the error message to contain \"%s\", got \"%s\"", s_, m_); \
    } while (0)

static inline int check_report(void)
{
    if (check_failures)
        fprintf(stderr, "FAILED: %d of %d checks\n", check_failures, check_count);
    else
        printf("ok: %d checks\n", check_count);
    return check_failures != 0;
}

#endif
