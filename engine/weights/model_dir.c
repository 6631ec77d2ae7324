/*
 * model_dir.c - the model directory's confinement rule and --model's
 * resolution in the Hugging Face cache. See model_dir.h.
 *
 * The cache layout (huggingface_hub's, read offline):
 *   <cache>/models--<org>--<name>/
 *       refs/<ref>                  the commit a branch or tag points at
 *       snapshots/<commit>/<file>   symlinks to ../../blobs/<sha256>
 *       blobs/<sha256>              the files' contents
 */
#define _GNU_SOURCE
#include "model_dir.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../base/json.h"
#include "../base/util.h"
#include "gguf_hf.h"

/* ---- the confinement rule ------------------------------------------------- */

static bool bare_name(const char *name)
{
    return *name && !strchr(name, '/') && strcmp(name, ".") != 0 && strcmp(name, "..") != 0;
}

/* The folder dir's files may resolve into, and whether dir is a cache
 * snapshot (.../models--org--name/snapshots/<rev>: the repository folder). */
static ferry_status confine_root(const char *dir, char root[PATH_MAX], bool *cache)
{
    if (!realpath(dir, root))
        return ferry_fail(errno == ENOENT ? FERRY_ERR_NOT_FOUND : FERRY_ERR_IO, "%s: %s", dir, strerror(errno));
    *cache = false;
    char *rev = strrchr(root, '/');
    if (!rev || rev == root) return FERRY_OK;
    *rev = '\0';
    char *snapshots = strrchr(root, '/');
    if (snapshots && snapshots != root && !strcmp(snapshots + 1, "snapshots")) {
        *snapshots = '\0';
        const char *repo = strrchr(root, '/');
        if (repo && !strncmp(repo + 1, "models--", 8)) {
            *cache = true;
            return FERRY_OK;
        }
        *snapshots = '/';
    }
    *rev = '/';
    return FERRY_OK;
}

/* Rule 2 for the resolved path `real` of `path`. */
static ferry_status check_inside(const char *path, const char *real, const char *root, bool cache)
{
    size_t n = strlen(root);
    if (n == 1) n = 0; /* the root directory: "/" + name */
    bool under = strncmp(real, root, n) == 0 && real[n] == '/';
    if (cache && under) return FERRY_OK;
    if (cache)
        return ferry_fail(FERRY_ERR_INVALID, "%s: leads to %s, outside its repository's folder in the Hugging Face "
                          "cache (%s)", path, real, root);
    if (under && !strchr(real + n + 1, '/')) return FERRY_OK;
    if (under)
        return ferry_fail(FERRY_ERR_INVALID, "%s: resolves to %s, in a subdirectory of the model directory (files "
                          "must be directly inside it)", path, real);
    return ferry_fail(FERRY_ERR_INVALID, "%s: resolves to %s, outside the model directory (%s)", path, real, root);
}

/* realpath failed for path, which exists: a link to nothing, most often. */
static ferry_status unresolved(const char *path, int err)
{
    char target[PATH_MAX];
    ssize_t n = readlink(path, target, sizeof target - 1);
    if (err == ENOENT && n > 0) {
        target[n] = '\0';
        return ferry_fail(FERRY_ERR_NOT_FOUND, "%s: a symbolic link to %s, which does not exist", path, target);
    }
    return ferry_fail(err == ENOENT ? FERRY_ERR_NOT_FOUND : FERRY_ERR_IO, "%s: %s", path, strerror(err));
}

/* A file a GGUF model stands for (gguf_hf.h), as an anonymous file. */
static ferry_status open_gguf_file(const char *model, const char *name, int *fd_out, char **path_out)
{
    char *text;
    size_t len;
    FERRY_TRY(gguf_hf_read(model, name, &text, &len));
    ferry_status st = FERRY_OK;
    int fd = memfd_create(name, MFD_CLOEXEC);
    if (fd < 0) st = ferry_fail(FERRY_ERR_IO, "%s: %s: memfd_create: %s", model, name, strerror(errno));
    else if ((st = util_write_all(fd, name, text, len)) == FERRY_OK && lseek(fd, 0, SEEK_SET) != 0)
        st = ferry_fail(FERRY_ERR_IO, "%s: %s: %s", model, name, strerror(errno));
    free(text);
    if (st == FERRY_OK && asprintf(path_out, "%s:%s", model, name) < 0) {
        *path_out = NULL;
        st = ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    }
    if (st != FERRY_OK) {
        if (fd >= 0) close(fd);
        return st;
    }
    *fd_out = fd;
    return FERRY_OK;
}

ferry_status model_dir_open(const char *dir, const char *name, int *fd_out, char **path_out)
{
    *fd_out = -1;
    *path_out = NULL;
    if (gguf_hf_is_model(dir)) {
        if (!gguf_hf_has(dir, name)) return ferry_fail(FERRY_ERR_NOT_FOUND, "%s: a GGUF model has no %s", dir, name);
        return open_gguf_file(dir, name, fd_out, path_out);
    }
    if (!bare_name(name))
        return ferry_fail(FERRY_ERR_INVALID, "%s: '%s' is not a bare file name (no '/', not '.' or '..')", dir, name);
    char *path = util_path_join(dir, name);
    if (!path) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    char root[PATH_MAX], real[PATH_MAX];
    bool cache = false;
    int fd = -1;
    struct stat sb, opened;
    ferry_status st = FERRY_OK;
    if (lstat(path, &sb) != 0) {
        st = ferry_fail(errno == ENOENT ? FERRY_ERR_NOT_FOUND : FERRY_ERR_IO, "%s: %s", path, strerror(errno));
        goto fail;
    }
    if (!realpath(path, real)) {
        st = unresolved(path, errno);
        goto fail;
    }
    if ((st = confine_root(dir, root, &cache)) != FERRY_OK) goto fail;
    if ((st = check_inside(path, real, root, cache)) != FERRY_OK) goto fail;
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        st = ferry_fail(errno == ENOENT ? FERRY_ERR_NOT_FOUND : FERRY_ERR_IO, "%s: %s", path, strerror(errno));
        goto fail;
    }
    /* rule 3: a link switched between the check and the open is caught here */
    if (fstat(fd, &opened) != 0 || stat(real, &sb) != 0 || opened.st_dev != sb.st_dev || opened.st_ino != sb.st_ino) {
        st = ferry_fail(FERRY_ERR_IO, "%s: changed while it was being opened", path);
        goto fail;
    }
    *fd_out = fd;
    *path_out = path;
    return FERRY_OK;
fail:
    if (fd >= 0) close(fd);
    free(path);
    return st;
}

ferry_status model_dir_read(const char *dir, const char *name, char **text, size_t *len)
{
    int fd;
    char *path;
    *text = NULL;
    if (gguf_hf_is_model(dir)) {
        if (!gguf_hf_has(dir, name)) return ferry_fail(FERRY_ERR_NOT_FOUND, "%s: a GGUF model has no %s", dir, name);
        return gguf_hf_read(dir, name, text, len);
    }
    FERRY_TRY(model_dir_open(dir, name, &fd, &path));
    ferry_status st = util_read_fd(fd, path, text, len);
    close(fd);
    free(path);
    return st;
}

bool model_dir_has(const char *dir, const char *name)
{
    if (gguf_hf_is_model(dir)) return gguf_hf_has(dir, name);
    char *path = util_path_join(dir, name);
    struct stat sb;
    bool has = path && lstat(path, &sb) == 0;
    free(path);
    return has;
}

/* ---- --model org/name[@revision] ----------------------------------------- */

#define REPO_ID_MAX 96 /* huggingface_hub's limit on a repo id */

static bool id_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
           c == '.';
}

/* huggingface_hub's validate_repo_id for one part: word characters, '-'
 * and '.', a word character at each end, no "--" or "..". */
static bool id_part(const char *s, size_t n)
{
    if (n == 0 || s[0] == '-' || s[0] == '.' || s[n - 1] == '-' || s[n - 1] == '.') return false;
    for (size_t i = 0; i < n; i++) {
        if (!id_char(s[i])) return false;
        if (i > 0 && (s[i] == '-' || s[i] == '.') && s[i - 1] == s[i]) return false;
    }
    return true;
}

/* A revision becomes a path under refs/: no empty, "." or ".." segment. */
static bool revision_ok(const char *r)
{
    size_t n = strlen(r);
    if (n == 0 || n > 255 || r[0] == '/' || r[n - 1] == '/') return false;
    for (const char *seg = r; *seg;) {
        size_t len = strcspn(seg, "/");
        if (len == 0 || (len == 1 && seg[0] == '.') || (len == 2 && seg[0] == '.' && seg[1] == '.')) return false;
        for (size_t i = 0; i < len; i++)
            if (!id_char(seg[i])) return false;
        seg += len + (seg[len] == '/');
    }
    return true;
}

static bool is_commit(const char *s)
{
    if (strlen(s) != 40) return false;
    for (int i = 0; i < 40; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return false;
    return true;
}

/* Splits "org/name[@revision]"; false when spec is not a repo id. */
static bool parse_repo_id(const char *spec, char org[REPO_ID_MAX + 1], char name[REPO_ID_MAX + 1], char rev[256])
{
    const char *at = strchr(spec, '@'), *slash = strchr(spec, '/');
    size_t id_len = at ? (size_t)(at - spec) : strlen(spec);
    if (!slash || (size_t)(slash - spec) >= id_len || memchr(slash + 1, '/', id_len - (size_t)(slash - spec) - 1) ||
        id_len > REPO_ID_MAX)
        return false;
    size_t org_len = (size_t)(slash - spec), name_len = id_len - org_len - 1;
    if (!id_part(spec, org_len) || !id_part(slash + 1, name_len)) return false;
    const char *r = at ? at + 1 : "main";
    if (!revision_ok(r)) return false;
    snprintf(org, REPO_ID_MAX + 1, "%.*s", (int)org_len, spec);
    snprintf(name, REPO_ID_MAX + 1, "%.*s", (int)name_len, slash + 1);
    snprintf(rev, 256, "%s", r);
    return true;
}

typedef struct {
    char path[PATH_MAX];
    const char *from; /* the setting that named it, for messages */
} hf_cache;

/* The caches huggingface_hub would use, in its order of precedence. */
static int cache_dirs(hf_cache out[3])
{
    int n = 0;
    const char *v;
    if ((v = getenv("HF_HUB_CACHE")) && *v) {
        snprintf(out[n].path, PATH_MAX, "%s", v);
        out[n++].from = "$HF_HUB_CACHE";
    }
    if ((v = getenv("HF_HOME")) && *v) {
        snprintf(out[n].path, PATH_MAX, "%s/hub", v);
        out[n++].from = "$HF_HOME/hub";
    }
    if ((v = getenv("XDG_CACHE_HOME")) && *v) {
        snprintf(out[n].path, PATH_MAX, "%s/huggingface/hub", v);
        out[n++].from = "$XDG_CACHE_HOME/huggingface/hub";
    } else {
        const char *home = getenv("HOME");
        struct passwd *pw;
        if ((!home || !*home) && (pw = getpwuid(getuid()))) home = pw->pw_dir;
        if (home && *home) {
            snprintf(out[n].path, PATH_MAX, "%s/.cache/huggingface/hub", home);
            out[n++].from = "~/.cache/huggingface/hub";
        }
    }
    for (int i = 1; i < n; i++) /* the same folder named twice is looked in once */
        if (!strcmp(out[i].path, out[i - 1].path)) {
            memmove(&out[i], &out[i + 1], (size_t)(n - i - 1) * sizeof *out);
            n--, i--;
        }
    return n;
}

static bool is_dir(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* The snapshot of `rev` in the repository folder `repo`. */
static ferry_status find_snapshot(const char *repo, const char *id, const char *rev, char **dir)
{
    char commit[41], *path = NULL, *text = NULL;
    ferry_status st = FERRY_OK;
    size_t len;
    if (is_commit(rev)) {
        memcpy(commit, rev, sizeof commit);
    } else {
        if (asprintf(&path, "%s/refs/%s", repo, rev) < 0) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
        st = util_read_file(path, &text, &len);
        if (st == FERRY_ERR_NOT_FOUND) {
            st = ferry_fail(st, "model '%s' revision '%s': no %s (not a ref of the cached repository, nor a "
                            "40-digit commit hash)", id, rev, path);
            goto out;
        }
        if (st != FERRY_OK) {
            st = ferry_fail_context(st, "model '%s' revision '%s'", id, rev);
            goto out;
        }
        while (len > 0 && (text[len - 1] == '\n' || text[len - 1] == '\r' || text[len - 1] == ' ')) text[--len] = '\0';
        if (!is_commit(text)) {
            st = ferry_fail(FERRY_ERR_INVALID, "model '%s' revision '%s': %s does not hold a commit hash", id, rev,
                            path);
            goto out;
        }
        memcpy(commit, text, sizeof commit);
        free(path);
    }
    if (asprintf(&path, "%s/snapshots/%s", repo, commit) < 0) {
        path = NULL;
        st = ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    } else if (!is_dir(path)) {
        st = ferry_fail(FERRY_ERR_NOT_FOUND, "model '%s' revision '%s': no snapshot %s (commit %s is not in the "
                        "cache)", id, rev, path, commit);
    } else {
        *dir = path;
        path = NULL;
    }
out:
    free(text);
    free(path);
    return st;
}

ferry_status model_dir_resolve(const char *spec, char **dir, char **repo_name)
{
    char org[REPO_ID_MAX + 1], name[REPO_ID_MAX + 1], rev[256];
    *dir = NULL;
    *repo_name = NULL;
    if (is_dir(spec) || !parse_repo_id(spec, org, name, rev)) {
        ferry_status st = is_dir(spec) ? gguf_hf_find_in_dir(spec, dir) : FERRY_ERR_NOT_FOUND;
        if (st != FERRY_ERR_NOT_FOUND) return st; /* the one GGUF file of a directory, or several */
        if (!(*dir = strdup(spec))) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
        return FERRY_OK;
    }
    char id[2 * REPO_ID_MAX + 2];
    snprintf(id, sizeof id, "%s/%s", org, name);
    hf_cache caches[3];
    int n = cache_dirs(caches);
    strbuf looked;
    sb_init(&looked);
    ferry_status st = FERRY_OK;
    bool found = false;
    for (int i = 0; i < n && !found; i++) {
        char *repo;
        if (asprintf(&repo, "%s/models--%s--%s", caches[i].path, org, name) < 0) {
            sb_free(&looked);
            return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
        }
        if ((found = is_dir(repo))) st = find_snapshot(repo, id, rev, dir);
        else sb_printf(&looked, "%s%s (%s)", i ? ", " : "", repo, caches[i].from);
        free(repo);
    }
    if (!found && n > 0)
        st = ferry_fail(FERRY_ERR_NOT_FOUND, "model '%s' (revision '%s'): '%s' is not a directory, and the Hugging "
                        "Face cache does not hold the repository: looked for %s", id, rev, spec,
                        looked.oom ? "(out of memory)" : looked.data);
    else if (!found)
        st = ferry_fail(FERRY_ERR_NOT_FOUND, "model '%s' (revision '%s'): '%s' is not a directory, and no Hugging "
                        "Face cache is known (set HF_HUB_CACHE or HF_HOME)", id, rev, spec);
    sb_free(&looked);
    if (st == FERRY_OK) { /* a repository of GGUF files: the snapshot's one .gguf */
        char *file = NULL, *checked = NULL;
        ferry_status g = gguf_hf_find_in_dir(*dir, &file);
        int fd = -1;
        /* the file as every file of a snapshot: its link must stay inside the repository */
        if (g == FERRY_OK && (g = model_dir_open(*dir, strrchr(file, '/') + 1, &fd, &checked)) != FERRY_OK) free(file);
        if (fd >= 0) close(fd);
        free(checked);
        if (g == FERRY_OK) {
            free(*dir);
            *dir = file;
        } else if (g != FERRY_ERR_NOT_FOUND) {
            free(*dir);
            *dir = NULL;
            st = g;
        }
    }
    if (st == FERRY_OK && !(*repo_name = strdup(name))) {
        free(*dir);
        *dir = NULL;
        st = ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    }
    return st;
}
