/*
 * util.c - see util.h.
 */
#define _GNU_SOURCE
#include "util.h"

#include "fault.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

ferry_status util_read_file(const char *path, char **out, size_t *len)
{
    *out = NULL;
    /* O_NONBLOCK: a FIFO in place of a config must not hang the open */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return ferry_fail(errno == ENOENT ? FERRY_ERR_NOT_FOUND : FERRY_ERR_IO, "%s: %s", path, strerror(errno));
    ferry_status st = util_read_fd(fd, path, out, len);
    close(fd);
    return st;
}

ferry_status util_read_fd(int fd, const char *path, char **out, size_t *len)
{
    *out = NULL;
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size > 100000000)
        return ferry_fail(FERRY_ERR_INVALID, "%s: not a regular file of at most 100 MB", path);
    char *buf = malloc((size_t)sb.st_size + 1);
    if (!buf) return ferry_fail(FERRY_ERR_NOMEM, "%s: out of memory", path);
    size_t got = 0;
    while (got < (size_t)sb.st_size) {
        ssize_t r = read(fd, buf + got, (size_t)sb.st_size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            ferry_status st = ferry_fail(FERRY_ERR_IO, "%s: read: %s", path, r < 0 ? strerror(errno) : "file shrank");
            free(buf);
            return st;
        }
        got += (size_t)r;
    }
    buf[got] = '\0';
    *out = buf;
    *len = got;
    return FERRY_OK;
}

ferry_status util_write_all(int fd, const char *path, const void *buf, size_t n)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        /* The hooks go on the result: the write really happened, but the
         * caller must behave as if the disk had filled up or failed. Both
         * count every write, so "the Nth write" means the same thing
         * whichever are armed together. */
        bool nospc = fault_hit(FAULT_WRITE_ENOSPC), eio = fault_hit(FAULT_WRITE_EIO);
        if (nospc || eio) {
            w = -1;
            errno = nospc ? ENOSPC : EIO;
        }
        if (w < 0) return ferry_fail(FERRY_ERR_IO, "%s: write: %s", path, strerror(errno));
        p += w;
        n -= (size_t)w;
    }
    return FERRY_OK;
}

ferry_status util_write_file_atomic(const char *path, const void *data, size_t len)
{
    size_t n = strlen(path);
    char *tmp = malloc(n + 32);
    if (!tmp) return ferry_fail(FERRY_ERR_NOMEM, "%s: out of memory", path);
    snprintf(tmp, n + 32, "%s.tmp.%ld", path, (long)getpid());
    ferry_status st = FERRY_OK;
    unlink(tmp); /* a leftover of a killed run with our pid */
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) {
        st = ferry_fail(FERRY_ERR_IO, "%s: %s", path, strerror(errno));
        free(tmp);
        return st;
    }
    st = util_write_all(fd, path, data, len);
    if (st == FERRY_OK && util_fsync(fd) != 0) st = ferry_fail(FERRY_ERR_IO, "%s: fsync: %s", path, strerror(errno));
    if (close(fd) != 0 && st == FERRY_OK) st = ferry_fail(FERRY_ERR_IO, "%s: close: %s", path, strerror(errno));
    if (st == FERRY_OK && rename(tmp, path) != 0) st = ferry_fail(FERRY_ERR_IO, "%s: rename: %s", path, strerror(errno));
    if (st == FERRY_OK) util_fsync_dir_of(path);
    if (st != FERRY_OK) unlink(tmp);
    free(tmp);
    return st;
}

/* Writes into what path is, in place: for files that must not be replaced. */
static ferry_status write_in_place(const char *path, const void *data, size_t len)
{
    int fd = open(path, O_WRONLY | O_NOCTTY | O_CLOEXEC); /* no O_CREAT, no O_TRUNC */
    if (fd < 0) return ferry_fail(FERRY_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || S_ISREG(sb.st_mode)) {
        /* it became a regular file since it was looked at: writing into it
         * would leave it half old, half new */
        close(fd);
        return ferry_fail(FERRY_ERR_IO, "%s: changed while it was being opened", path);
    }
    ferry_status st = util_write_all(fd, path, data, len);
    if (close(fd) != 0 && st == FERRY_OK) st = ferry_fail(FERRY_ERR_IO, "%s: close: %s", path, strerror(errno));
    return st;
}

ferry_status util_write_output(const char *path, const void *data, size_t len)
{
    struct stat sb;
    if (lstat(path, &sb) != 0) {
        if (errno == ENOENT) return util_write_file_atomic(path, data, len);
        return ferry_fail(FERRY_ERR_IO, "%s: %s", path, strerror(errno));
    }
    if (S_ISREG(sb.st_mode)) return util_write_file_atomic(path, data, len);
    if (S_ISDIR(sb.st_mode)) return ferry_fail(FERRY_ERR_INVALID, "%s: is a directory", path);
    if (!S_ISLNK(sb.st_mode)) return write_in_place(path, data, len);
    /* a symbolic link: the rules apply to where it leads */
    if (stat(path, &sb) != 0) {
        if (errno == ENOENT)
            return ferry_fail(FERRY_ERR_INVALID, "%s: a symbolic link to nothing (not followed)", path);
        return ferry_fail(FERRY_ERR_IO, "%s: %s", path, strerror(errno));
    }
    if (S_ISDIR(sb.st_mode)) return ferry_fail(FERRY_ERR_INVALID, "%s: leads to a directory", path);
    if (!S_ISREG(sb.st_mode)) return write_in_place(path, data, len);
    char *target = realpath(path, NULL);
    if (!target) return ferry_fail(FERRY_ERR_IO, "%s: %s", path, strerror(errno));
    ferry_status st = util_write_file_atomic(target, data, len);
    if (st != FERRY_OK) st = ferry_fail_context(st, "%s", path);
    free(target);
    return st;
}

int util_fsync(int fd)
{
    int r = fsync(fd);
    if (fault_hit(FAULT_FSYNC_EIO)) { /* on the result, as the write hooks */
        r = -1;
        errno = EIO;
    }
    return r;
}

void util_fsync_dir_of(const char *path)
{
    char *dir = strdup(path);
    if (!dir) return;
    char *slash = strrchr(dir, '/');
    if (slash == dir) slash[1] = '\0';
    else if (slash) *slash = '\0';
    else strcpy(dir, ".");
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        util_fsync(fd);
        close(fd);
    }
    free(dir);
}

char *util_path_join(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

ferry_status util_parse_size(const char *s, uint64_t *out)
{
    static const struct { const char *suffix; uint64_t mult; } units[] = {
        {"", 1}, {"B", 1},
        {"KiB", 1ull << 10}, {"MiB", 1ull << 20}, {"GiB", 1ull << 30}, {"TiB", 1ull << 40},
        {"K", 1ull << 10}, {"M", 1ull << 20}, {"G", 1ull << 30}, {"T", 1ull << 40},
        {"KB", 1000ull}, {"MB", 1000000ull}, {"GB", 1000000000ull}, {"TB", 1000000000000ull},
    };
    /* digits, optionally '.' and digits, then a unit: no signs, hex or exponents */
    const char *end = s;
    while (*end >= '0' && *end <= '9') end++;
    if (end == s) return ferry_fail(FERRY_ERR_INVALID, "bad size '%s' (expected e.g. 512MiB, 2GiB, 0)", s);
    if (*end == '.') {
        end++;
        if (*end < '0' || *end > '9') return ferry_fail(FERRY_ERR_INVALID, "bad size '%s'", s);
        while (*end >= '0' && *end <= '9') end++;
    }
    double v = strtod(s, NULL);
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcasecmp(end, units[i].suffix) == 0) {
            double bytes = v * (double)units[i].mult;
            if (bytes > 9.2e18) return ferry_fail(FERRY_ERR_INVALID, "size '%s' is too large", s);
            if (bytes != (double)(uint64_t)bytes)
                return ferry_fail(FERRY_ERR_INVALID, "size '%s' is not a whole number of bytes", s);
            *out = (uint64_t)bytes;
            return FERRY_OK;
        }
    }
    return ferry_fail(FERRY_ERR_INVALID, "bad size '%s' (unknown unit '%s'; use KiB, MiB, GiB)", s, end);
}

const char *util_fmt_bytes(uint64_t bytes, char *buf, size_t cap)
{
    static const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int i = 0;
    while (v >= 1024 && i < 4) {
        v /= 1024;
        i++;
    }
    if (i == 0) snprintf(buf, cap, "%llu B", (unsigned long long)bytes);
    else snprintf(buf, cap, "%.2f %s", v, u[i]);
    return buf;
}

double util_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double util_wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void *util_map_alloc(size_t n)
{
    void *p = mmap(NULL, n ? n : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

void util_map_free(void *p, size_t n)
{
    if (p) munmap(p, n ? n : 1);
}

size_t util_utf8_put(char *dst, uint32_t cp)
{
    if (cp < 0x80) {
        dst[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        dst[0] = (char)(0xC0 | (cp >> 6));
        dst[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        dst[0] = (char)(0xE0 | (cp >> 12));
        dst[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        dst[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    dst[0] = (char)(0xF0 | (cp >> 18));
    dst[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    dst[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    dst[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

uint64_t util_mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return UINT64_MAX;
    char line[256];
    unsigned long long kb = 0;
    bool found = false;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
            found = true;
            break;
        }
    fclose(f);
    return found ? kb * 1024ull : UINT64_MAX;
}

void util_fmt_double(double x, char *buf, size_t cap)
{
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, x);
        if (strtod(buf, NULL) == x) return;
    }
}
