/*
 * standalone_main.c - runs a libFuzzer target without libFuzzer.
 *
 * Linked with any fuzz_*.c instead of clang's -fsanitize=fuzzer runtime, so
 * that the targets build with the regular compiler and `make test` keeps
 * them compiling and exercised: it calls LLVMFuzzerInitialize (when the
 * target has one), then LLVMFuzzerTestOneInput once on an empty input and
 * once on every file named on the command line, directories read in name
 * order (a seed corpus). Each input is passed in a buffer of exactly its
 * size, so AddressSanitizer sees a read past the end. A broken promise
 * aborts, as under libFuzzer; the exit status is non-zero when an input
 * cannot be read or none was given.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
__attribute__((weak)) int LLVMFuzzerInitialize(int *argc, char ***argv);

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "%s: %s\n", path, strerror(errno));
        return -1;
    }
    size_t cap = 4096, len = 0, n;
    uint8_t *buf = malloc(cap);
    while (buf && (n = fread(buf + len, 1, cap - len, f)) > 0) {
        len += n;
        if (len == cap) buf = realloc(buf, cap *= 2);
    }
    int err = !buf || ferror(f);
    fclose(f);
    if (err) {
        fprintf(stderr, "%s: read failed\n", path);
        free(buf);
        return -1;
    }
    uint8_t *exact = malloc(len ? len : 1); /* no slack after the input */
    if (!exact) abort();
    memcpy(exact, buf, len);
    free(buf);
    LLVMFuzzerTestOneInput(exact, len);
    free(exact);
    return 1;
}

static int not_hidden(const struct dirent *e) { return e->d_name[0] != '.'; }

/* Runs every regular file of dir; the number run, or -1. */
static int run_dir(const char *dir)
{
    struct dirent **names;
    int n = scandir(dir, &names, not_hidden, alphasort);
    if (n < 0) {
        fprintf(stderr, "%s: %s\n", dir, strerror(errno));
        return -1;
    }
    int ran = 0;
    for (int i = 0; i < n; i++) {
        char path[4096];
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", dir, names[i]->d_name);
        if (ran >= 0 && stat(path, &sb) == 0 && S_ISREG(sb.st_mode)) {
            int r = run_file(path);
            ran = r < 0 ? -1 : ran + r;
        }
        free(names[i]);
    }
    free(names);
    return ran;
}

int main(int argc, char **argv)
{
    if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
    static const uint8_t empty[1];
    LLVMFuzzerTestOneInput(empty, 0);
    int total = 0;
    for (int i = 1; i < argc; i++) {
        struct stat sb;
        if (stat(argv[i], &sb) != 0) {
            fprintf(stderr, "%s: %s\n", argv[i], strerror(errno));
            return 1;
        }
        int r = S_ISDIR(sb.st_mode) ? run_dir(argv[i]) : run_file(argv[i]);
        if (r < 0) return 1;
        total += r;
    }
    printf("%s: %d inputs ran\n", argv[0], total);
    return total > 0 ? 0 : 1;
}
