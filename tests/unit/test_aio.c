/*
 * test_aio.c - asynchronous reads (engine/aio.h) and the fault hooks that
 * exercise their error paths (engine/base/fault.h).
 *
 * One file of 20 MiB + 4096 bytes of a known pattern, in a fresh directory
 * under /tmp (ext4 here, so O_DIRECT works). It is read whole as several
 * reads in flight at once - one of a single block, one of exactly one chunk,
 * one spanning four chunks - at queue depths 1 and 8, through O_DIRECT and
 * plain descriptors, and again with every completion made short. Then the
 * failures: reads past the end of the file, EIO on one completion (exactly
 * that read fails, after its other chunks drain, and the aio stays usable),
 * a bad descriptor, offsets that are not valid off_t values, misaligned
 * O_DIRECT reads. Finally the whole suite runs again in a child process
 * whose seccomp filter refuses io_uring_setup, which must select the pread
 * fallback with one warning and behave the same.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdlib.h>
#include <unistd.h>

#include "../../engine/io/aio.h"
#include "../../engine/base/fault.h"
#include "../../engine/base/util.h"
#include "check.h"
#include "seccomp_child.h"

#define MiB (1u << 20)
#define FILE_LEN (20 * MiB + 4096)

static char *g_dir, *g_path;
static uint8_t *g_buf; /* [FILE_LEN + 8192], 4096-aligned */

/* ---- the pattern ---------------------------------------------------------- */

static uint8_t pattern_byte(uint64_t off)
{
    uint64_t w = (off / 8 + 1) * 0x9E3779B97F4A7C15ull;
    w ^= w >> 29;
    return (uint8_t)(w >> (8 * (off % 8)));
}

static void make_file(void)
{
    char tmpl[] = "/tmp/ferry-test-aio-XXXXXX";
    if (!mkdtemp(tmpl)) {
        perror("mkdtemp");
        exit(2);
    }
    g_dir = strdup(tmpl);
    g_path = util_path_join(g_dir, "data.bin");
    uint8_t *chunk = malloc(MiB);
    int fd = open(g_path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    if (!chunk || fd < 0) {
        perror(g_path);
        exit(2);
    }
    for (uint64_t off = 0; off < FILE_LEN; off += MiB) {
        size_t n = FILE_LEN - off < MiB ? (size_t)(FILE_LEN - off) : MiB;
        for (size_t k = 0; k < n; k++) chunk[k] = pattern_byte(off + k);
        if (write(fd, chunk, n) != (ssize_t)n) {
            perror(g_path);
            exit(2);
        }
    }
    close(fd);
    free(chunk);
}

/* True when buf[0..len) holds the file's bytes from off; names the first
 * difference otherwise. */
static bool matches(const uint8_t *buf, uint64_t off, size_t len, int line)
{
    for (size_t k = 0; k < len; k++)
        if (buf[k] != pattern_byte(off + k)) {
            fprintf(stderr, "%s:%d: byte at file offset %llu: expected %u, got %u\n", __FILE__, line,
                    (unsigned long long)(off + k), pattern_byte(off + k), buf[k]);
            return false;
        }
    return true;
}

static void set_fault(const char *spec)
{
    if (spec) setenv("FERRY_FAULT", spec, 1);
    else unsetenv("FERRY_FAULT");
    fault_reset();
}

static int open_data(bool direct)
{
    int fd = open(g_path, O_RDONLY | O_CLOEXEC | (direct ? O_DIRECT : 0));
    if (fd < 0) {
        perror(g_path);
        exit(2);
    }
    return fd;
}

/* Reaps until nothing is pending; at most `max` reports are kept. */
static int reap_all(aio *a, aio_done *out, int max)
{
    int n = 0;
    aio_done spill;
    while (aio_pending(a) > 0) {
        int got = n < max ? aio_reap(a, out + n, max - n, true) : aio_reap(a, &spill, 1, true);
        if (got <= 0) {
            fprintf(stderr, "aio_reap returned %d with %u pending\n", got, aio_pending(a));
            check_failures++;
            break;
        }
        n += got;
    }
    return n;
}

/* ---- reading the whole file ------------------------------------------------ */

/* Pieces of the file, read at once: one block, exactly one chunk, a small
 * one, four chunks, and the rest. */
static const struct {
    uint64_t off, len;
} g_segs[] = {
    {0, 4096},
    {4096, 4 * MiB},
    {4096 + 4 * MiB, 8192},
    {12288 + 4 * MiB, 13 * MiB},
    {12288 + 17 * MiB, FILE_LEN - 12288 - 17 * MiB},
};
#define NSEG ((int)(sizeof g_segs / sizeof g_segs[0]))

/* Reads the file whole through a; returns the number of reads that failed
 * (with their reports in fails[]), checking that each tag is reported
 * exactly once and that every successful read has the right bytes. */
static int read_whole(aio *a, int fd, aio_done *fails, int line)
{
    memset(g_buf, 0xA5, FILE_LEN);
    for (int s = 0; s < NSEG; s++)
        CHECK_STATUS(aio_read(a, fd, g_path, g_segs[s].off, g_buf + g_segs[s].off, g_segs[s].len, 100 + (uint64_t)s),
                     FERRY_OK);
    CHECK_EQ_INT(aio_pending(a), NSEG);
    aio_done done[NSEG + 4];
    int n = reap_all(a, done, NSEG + 4);
    CHECK_EQ_INT(n, NSEG);
    int seen[NSEG] = {0}, failed = 0;
    for (int k = 0; k < n && k < NSEG + 4; k++) {
        int s = (int)done[k].tag - 100;
        if (s < 0 || s >= NSEG) {
            fprintf(stderr, "%s:%d: unknown tag %llu\n", __FILE__, line, (unsigned long long)done[k].tag);
            check_failures++;
            continue;
        }
        seen[s]++;
        if (done[k].st != FERRY_OK) {
            fails[failed++] = done[k];
            continue;
        }
        check_count++;
        if (!matches(g_buf + g_segs[s].off, g_segs[s].off, g_segs[s].len, line)) check_failures++;
    }
    for (int s = 0; s < NSEG; s++) {
        check_count++;
        if (seen[s] != 1) {
            fprintf(stderr, "%s:%d: read %d reported %d times\n", __FILE__, line, s, seen[s]);
            check_failures++;
        }
    }
    CHECK_EQ_INT(aio_pending(a), 0);
    return failed;
}

static void test_whole(bool expect_uring)
{
    const char *faults[] = {NULL, "read_short=1", "read_short=3"};
    for (int f = 0; f < 3; f++) {
        set_fault(faults[f]);
        for (unsigned depth = 1; depth <= 8; depth += 7) {
            for (int direct = 0; direct <= 1; direct++) {
                aio *a = NULL;
                CHECK_STATUS(aio_create(depth, &a), FERRY_OK);
                if (!a) continue;
                CHECK_EQ_INT(aio_is_uring(a), expect_uring);
                int fd = open_data(direct);
                aio_done fails[NSEG + 4];
                int failed = read_whole(a, fd, fails, __LINE__);
                if (failed) fprintf(stderr, "  (depth %u, direct %d, fault %s): %s\n", depth, direct,
                                    faults[f] ? faults[f] : "none", fails[0].msg);
                CHECK_EQ_INT(failed, 0);
                close(fd);
                aio_free(a);
            }
        }
    }
    set_fault(NULL);

    /* A plain descriptor takes any offset, length and buffer address, and
     * short reads of those still land where they should. */
    set_fault("read_short=1");
    aio *a = NULL;
    CHECK_STATUS(aio_create(4, &a), FERRY_OK);
    int fd = open_data(false);
    memset(g_buf, 0, 6 * MiB);
    CHECK_STATUS(aio_read(a, fd, g_path, 3, g_buf + 5, 5 * MiB + 11, 7), FERRY_OK);
    CHECK_STATUS(aio_read(a, fd, g_path, 1, g_buf + 5 * MiB + 100, 0, 8), FERRY_OK); /* empty: done at once */
    aio_done done[4];
    CHECK_EQ_INT(reap_all(a, done, 4), 2);
    CHECK(done[0].st == FERRY_OK && done[1].st == FERRY_OK);
    CHECK(matches(g_buf + 5, 3, 5 * MiB + 11, __LINE__));
    close(fd);
    aio_free(a);
    set_fault(NULL);
}

/* ---- failures --------------------------------------------------------------- */

static void test_eof(void)
{
    aio *a = NULL;
    CHECK_STATUS(aio_create(8, &a), FERRY_OK);
    for (int direct = 0; direct <= 1; direct++) {
        int fd = open_data(direct);
        aio_done done[4];
        /* Half of it exists: the first completion is short, the second 0. */
        CHECK_STATUS(aio_read(a, fd, g_path, FILE_LEN - 4096, g_buf, 8192, 1), FERRY_OK);
        /* None of it exists. */
        CHECK_STATUS(aio_read(a, fd, g_path, 32 * MiB, g_buf + 8192, 4096, 2), FERRY_OK);
        int n = reap_all(a, done, 4);
        CHECK_EQ_INT(n, 2);
        for (int k = 0; k < n; k++) {
            CHECK_EQ_INT(done[k].st, FERRY_ERR_IO);
            CHECK(strstr(done[k].msg, g_path) != NULL);
            CHECK(strstr(done[k].msg, "unexpected end of file") != NULL);
            char want[64];
            snprintf(want, sizeof want, "at %u", done[k].tag == 1 ? FILE_LEN : 32 * MiB);
            CHECK(strstr(done[k].msg, want) != NULL);
        }
        /* The aio is still good for the bytes that do exist. */
        CHECK_STATUS(aio_read(a, fd, g_path, FILE_LEN - 8192, g_buf, 8192, 3), FERRY_OK);
        CHECK_EQ_INT(reap_all(a, done, 4), 1);
        CHECK(done[0].tag == 3 && done[0].st == FERRY_OK);
        CHECK(matches(g_buf, FILE_LEN - 8192, 8192, __LINE__));
        close(fd);
    }
    aio_free(a);
}

static void test_eio(void)
{
    for (unsigned depth = 1; depth <= 8; depth += 7) {
        aio *a = NULL;
        CHECK_STATUS(aio_create(depth, &a), FERRY_OK);
        int fd = open_data(true);
        /* The third completion fails: exactly one read, named, and the
         * others intact. At depth 1 completions come in order, so it is
         * the third read. */
        set_fault("read_eio=3");
        aio_done fails[NSEG + 4];
        int failed = read_whole(a, fd, fails, __LINE__);
        CHECK_EQ_INT(failed, 1);
        if (failed == 1) {
            CHECK_EQ_INT(fails[0].st, FERRY_ERR_IO);
            CHECK(strstr(fails[0].msg, g_path) != NULL);
            CHECK(strstr(fails[0].msg, "read at ") != NULL);
            CHECK(strstr(fails[0].msg, "Input/output error") != NULL);
            if (depth == 1) CHECK_EQ_U64(fails[0].tag, 102);
        }
        /* It fired once: the same aio now reads the whole file. */
        CHECK_EQ_INT(read_whole(a, fd, fails, __LINE__), 0);

        /* The first completion of a read with four chunks in flight fails:
         * reported once, only after the others drained. */
        set_fault("read_eio=1");
        CHECK_STATUS(aio_read(a, fd, g_path, 0, g_buf, 16 * MiB, 42), FERRY_OK);
        aio_done done[4];
        CHECK_EQ_INT(reap_all(a, done, 4), 1);
        CHECK(done[0].tag == 42 && done[0].st == FERRY_ERR_IO);
        CHECK(strstr(done[0].msg, "Input/output error") != NULL);
        CHECK_EQ_INT(aio_reap(a, done, 4, true), 0);
        set_fault(NULL);
        CHECK_EQ_INT(read_whole(a, fd, fails, __LINE__), 0);
        close(fd);
        aio_free(a);
    }
}

static void test_bad_args(void)
{
    aio *a = NULL;
    CHECK_STATUS(aio_create(0, &a), FERRY_ERR_INVALID);
    CHECK(a == NULL);
    CHECK_STATUS(aio_create(4, &a), FERRY_OK);
    aio_done done[4];

    /* A descriptor that is not open fails the read, not the process. */
    CHECK_STATUS(aio_read(a, -1, "nowhere.bin", 0, g_buf, 4096, 9), FERRY_OK);
    CHECK_EQ_INT(reap_all(a, done, 4), 1);
    CHECK(done[0].tag == 9 && done[0].st == FERRY_ERR_IO);
    CHECK(strstr(done[0].msg, "nowhere.bin: read at 0: Bad file descriptor") != NULL);

    /* Offsets that are not valid off_t values never reach the kernel (to
     * io_uring, -1 means "the current position"). */
    int fd = open_data(false);
    CHECK_STATUS(aio_read(a, fd, g_path, (uint64_t)-4096, g_buf, 4096, 10), FERRY_ERR_INVALID);
    CHECK_MSG_HAS(g_path);
    CHECK_STATUS(aio_read(a, fd, g_path, (uint64_t)-1, g_buf, 4096, 10), FERRY_ERR_INVALID);
    CHECK_STATUS(aio_read(a, fd, g_path, (uint64_t)INT64_MAX - 100, g_buf, 4096, 10), FERRY_ERR_INVALID);
    CHECK_STATUS(aio_read(a, fd, g_path, 0, NULL, 4096, 10), FERRY_ERR_INVALID);
    close(fd);

    /* O_DIRECT reads must be aligned in buffer, offset and length. */
    fd = open_data(true);
    CHECK_STATUS(aio_read(a, fd, g_path, 0, g_buf + 1, 4096, 11), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("aligned");
    CHECK_STATUS(aio_read(a, fd, g_path, 512, g_buf, 4096, 11), FERRY_ERR_INVALID);
    CHECK_STATUS(aio_read(a, fd, g_path, 0, g_buf, 4097, 11), FERRY_ERR_INVALID);
    CHECK_EQ_INT(aio_pending(a), 0);
    CHECK_EQ_INT(aio_reap(a, done, 4, true), 0);
    CHECK_EQ_INT(aio_reap(a, done, 4, false), 0);

    /* Freed with reads in flight: they are drained, not abandoned. */
    CHECK_STATUS(aio_read(a, fd, g_path, 0, g_buf, 8 * MiB, 12), FERRY_OK);
    close(fd);
    aio_free(a);
}

static void run_suite(bool expect_uring)
{
    test_whole(expect_uring);
    test_eof();
    test_eio();
    test_bad_args();
}

/* ---- the pread fallback ------------------------------------------------------ */

/* In a child whose seccomp filter answers io_uring_setup with ENOSYS (as a
 * container runtime's might): aio_create must warn once and fall back. */
static void fallback_body(void)
{
    /* The warning, captured. */
    char *log = util_path_join(g_dir, "stderr.txt");
    int logfd = open(log, O_CREAT | O_TRUNC | O_RDWR, 0644);
    int saved = dup(2);
    dup2(logfd, 2);
    aio *a = NULL;
    ferry_status st = aio_create(8, &a);
    fflush(stderr);
    dup2(saved, 2);
    CHECK_STATUS(st, FERRY_OK);
    char text[512] = {0};
    CHECK(pread(logfd, text, sizeof text - 1, 0) > 0);
    CHECK(strstr(text, "ferry: warning: io_uring unavailable (Function not implemented); using synchronous reads\n") ==
          text);
    CHECK(strchr(text, '\n') == text + strlen(text) - 1); /* one line */
    CHECK(a && !aio_is_uring(a));
    aio_free(a);
    close(logfd);
    unlink(log);
    free(log);
    /* The same again, with every aio_create's warning filtered out of
     * what the suite says. */
    FILE *quiet = tmpfile();
    fflush(stderr);
    dup2(fileno(quiet), 2);
    run_suite(false);
    fflush(stderr);
    dup2(saved, 2);
    rewind(quiet);
    char line[1024];
    while (fgets(line, sizeof line, quiet))
        if (!strstr(line, "io_uring unavailable")) fputs(line, stderr);
    fclose(quiet);
}

static void test_fallback(void)
{
    struct sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    run_in_seccomp_child(filter, sizeof filter / sizeof filter[0], "test_aio fallback", fallback_body);
}

int main(void)
{
    make_file();
    if (posix_memalign((void **)&g_buf, 4096, FILE_LEN + 8192) != 0) return 2;
    set_fault(NULL);
    run_suite(true);
    test_fallback();
    unlink(g_path);
    rmdir(g_dir);
    free(g_path);
    free(g_dir);
    free(g_buf);
    return check_report();
}
