/*
 * util.h - small helpers shared by the engine and the front ends: files,
 * paths, sizes written like "512MiB", a monotonic clock, and SplitMix64.
 */
#ifndef FERRY_UTIL_H
#define FERRY_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

/* Reads a whole small file (<= 100 MB: configs, indexes) into a NUL-terminated
 * malloc'd buffer. */
ferry_status util_read_file(const char *path, char **out, size_t *len);
/* The same for a file already open (read from its position; fd stays open);
 * errors name path. */
ferry_status util_read_fd(int fd, const char *path, char **out, size_t *len);

/* Writes all of buf to fd at its position, retrying short writes and EINTR;
 * errors name path. Honours the write_enospc and write_eio faults (fault.h):
 * every write of ferry's goes through here. */
ferry_status util_write_all(int fd, const char *path, const void *buf, size_t n);

/* Writes data to path atomically: a temporary file in the same directory,
 * fsync'd, then renamed over path. Nothing half-written is ever left. */
ferry_status util_write_file_atomic(const char *path, const void *data, size_t len);

/* Writes data to a file the user named (--dump-logits FILE): never replaces
 * anything that is not a regular file.
 *   - nothing there: a new file, written atomically (as above);
 *   - a regular file: replaced atomically;
 *   - a symbolic link: followed - the file it leads to is what is written
 *     (by these rules), the link stays; a link to nothing is refused;
 *   - anything else (a FIFO, a character device such as /dev/full, a pipe
 *     named /dev/stdout): opened for writing as it is - no create, no
 *     truncate, no rename - and written in place; a FIFO waits for its
 *     reader. A write that fails (/dev/full: ENOSPC) fails the call.
 * Errors name path. */
ferry_status util_write_output(const char *path, const void *data, size_t len);

/* fsync(fd), honouring the fsync_eio fault (fault.h): every fsync of
 * ferry's goes through here. */
int util_fsync(int fd);

/* fsyncs the directory holding path, so that a rename into it is durable.
 * A failure is not reported: the rename it is for has happened. */
void util_fsync_dir_of(const char *path);

/* dir + "/" + name, malloc'd (NULL when out of memory). */
char *util_path_join(const char *dir, const char *name);

/* Parses "0", "4096", "64KiB", "512MiB", "2GiB", "1TiB" (also KB/MB/GB as
 * powers of 1000). */
ferry_status util_parse_size(const char *s, uint64_t *out);

/* Formats bytes as "1.50 GiB" into buf. */
const char *util_fmt_bytes(uint64_t bytes, char *buf, size_t cap);

/* Seconds on a monotonic clock. */
double util_now(void);

/* Memory the OS says can be had without swapping (MemAvailable in
 * /proc/meminfo), in bytes; UINT64_MAX when it does not say. */
uint64_t util_mem_available(void);

/* x in the shortest form that reads back exactly ("0.7", not
 * "0.69999999999999996"). */
void util_fmt_double(double x, char *buf, size_t cap);
/* Seconds since the epoch (the wall clock: for reports, never for intervals). */
double util_wall_now(void);

/* n bytes of zeroed, page-aligned memory mapped for this buffer alone, so
 * that util_map_free gives it back to the system: for the large buffers of
 * a job that runs now and then in a long-lived server (an export), which
 * malloc would keep in its arenas after they are freed. NULL when out of
 * memory. */
void *util_map_alloc(size_t n);
void util_map_free(void *p, size_t n);

/* Writes code point cp (<= U+10FFFF) as UTF-8 at dst (room for 4 bytes);
 * returns the bytes written. */
size_t util_utf8_put(char *dst, uint32_t cp);

/* SplitMix64 (Steele, Lea and Flood, 2014; Vigna's splitmix64.c): the
 * generator that seeds the sampler's xoshiro256**, draws mkmodel's weights
 * and mixes ids and seeds. util_mix64 is its output function, a bijection
 * of 64 bits whose every output bit depends on every input bit;
 * util_splitmix64 advances *state by the golden-ratio gamma and mixes it.
 * Seeded outputs (a sampled text, a generated checkpoint) depend on these
 * exact constants. */
static inline uint64_t util_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

#define UTIL_SPLITMIX64_GAMMA 0x9e3779b97f4a7c15ull

static inline uint64_t util_splitmix64(uint64_t *state) { return util_mix64(*state += UTIL_SPLITMIX64_GAMMA); }

#endif
