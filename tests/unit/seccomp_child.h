/*
 * seccomp_child.h - runs part of a unit test in a forked child under a
 * seccomp filter, to reach paths a healthy machine never takes (no
 * io_uring, no O_DIRECT). The child counts its own checks and exits with
 * check_report(); the parent records one check on its exit status. Where
 * seccomp is unavailable the child says so and the part is skipped.
 */
#ifndef FERRY_TEST_SECCOMP_CHILD_H
#define FERRY_TEST_SECCOMP_CHILD_H

#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

static void run_in_seccomp_child(struct sock_filter *filter, unsigned short n, const char *what, void (*body)(void))
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        check_failures++;
        return;
    }
    if (pid == 0) {
        check_count = check_failures = 0; /* the parent reports its own */
        struct sock_fprog prog = {.len = n, .filter = filter};
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) {
            fprintf(stderr, "%s: seccomp unavailable (%s); not tested\n", what, strerror(errno));
            _exit(0);
        }
        body();
        int rc = check_report();
        fflush(stdout);
        _exit(rc);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

#endif
