/*
 * test_model_dir.c - weights/model_dir.h on a scratch tree: the confinement
 * rule (bare names; links inside a plain model directory, into a
 * subdirectory, out of it; a cache snapshot's links into its repository's
 * blobs and out of them; a link to nothing), and what --model resolves to
 * (directories, strings that are not repo ids, repo ids with and without a
 * revision, the order of the caches, the errors).
 * tests/integration/test_hf_cache.py runs the same through the binary.
 */
#define _GNU_SOURCE
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../engine/weights/model_dir.h"
#include "check.h"

static char g_root[PATH_MAX];

static void mkdirs(const char *rel)
{
    char path[PATH_MAX * 2];
    snprintf(path, sizeof path, "%s/%s", g_root, rel);
    for (char *p = path + strlen(g_root) + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            mkdir(path, 0755);
            *p = '/';
        }
    mkdir(path, 0755);
}

static void put(const char *rel, const char *text)
{
    char path[PATH_MAX * 2];
    snprintf(path, sizeof path, "%s/%s", g_root, rel);
    FILE *f = fopen(path, "w");
    FERRY_ASSERT(f);
    fputs(text, f);
    fclose(f);
}

static void link_to(const char *target, const char *rel)
{
    char path[PATH_MAX * 2];
    snprintf(path, sizeof path, "%s/%s", g_root, rel);
    unlink(path);
    FERRY_ASSERT(symlink(target, path) == 0);
}

static const char *at(const char *rel)
{
    static char path[4][PATH_MAX * 2];
    static int k;
    k = (k + 1) % 4;
    snprintf(path[k], sizeof path[k], "%s/%s", g_root, rel);
    return path[k];
}

/* model_dir_read(dir, name): the status, and on success the text. */
static void check_read(const char *dir, const char *name, ferry_status want, const char *needle, int line)
{
    char *text = NULL;
    size_t len;
    ferry_status st = model_dir_read(at(dir), name, &text, &len);
    check_count++;
    if (st != want)
        CHECK_FAIL_("line %d: %s/%s: expected %s, got %s (%s)", line, dir, name, ferry_status_name(want),
                    ferry_status_name(st), ferry_errmsg());
    else if (st == FERRY_OK && strcmp(text, needle) != 0)
        CHECK_FAIL_("line %d: %s/%s read \"%s\", expected \"%s\"", line, dir, name, text, needle);
    else if (st != FERRY_OK && !strstr(ferry_errmsg(), needle))
        CHECK_FAIL_("line %d: %s/%s: message \"%s\" lacks \"%s\"", line, dir, name, ferry_errmsg(), needle);
    free(text);
}

static void test_confinement(void)
{
    /* a plain directory */
    mkdirs("plain/sub");
    put("plain/config.json", "plain");
    put("plain/sub/deep.json", "deep");
    put("outside.json", "outside");
    link_to("config.json", "plain/alias.json");
    link_to("sub/deep.json", "plain/deep.json");
    link_to("../outside.json", "plain/out.json");
    link_to("nothing.json", "plain/dangling.json");
    check_read("plain", "config.json", FERRY_OK, "plain", __LINE__);
    check_read("plain", "alias.json", FERRY_OK, "plain", __LINE__);
    check_read("plain", "deep.json", FERRY_ERR_INVALID, "in a subdirectory of the model directory", __LINE__);
    check_read("plain", "out.json", FERRY_ERR_INVALID, "outside the model directory", __LINE__);
    check_read("plain", "out.json", FERRY_ERR_INVALID, "outside.json", __LINE__);
    check_read("plain", "dangling.json", FERRY_ERR_NOT_FOUND, "a symbolic link to nothing.json, which does not exist",
               __LINE__);
    check_read("plain", "missing.json", FERRY_ERR_NOT_FOUND, "missing.json", __LINE__);
    check_read("plain", "sub/deep.json", FERRY_ERR_INVALID, "not a bare file name", __LINE__);
    check_read("plain", "..", FERRY_ERR_INVALID, "not a bare file name", __LINE__);
    check_read("plain", "", FERRY_ERR_INVALID, "not a bare file name", __LINE__);
    CHECK(model_dir_has(at("plain"), "dangling.json"));
    CHECK(!model_dir_has(at("plain"), "missing.json"));

    /* a cache snapshot: links into its repository's folder are fine, out of it not */
    mkdirs("hub/models--o--n/blobs");
    mkdirs("hub/models--o--n/snapshots/abc");
    mkdirs("hub/models--x--y/blobs");
    put("hub/models--o--n/blobs/111", "blob");
    put("hub/models--o--n/elsewhere.json", "in repo");
    put("hub/models--x--y/blobs/222", "other repo");
    link_to("../../blobs/111", "hub/models--o--n/snapshots/abc/config.json");
    link_to("../../elsewhere.json", "hub/models--o--n/snapshots/abc/e.json");
    link_to("../../../models--x--y/blobs/222", "hub/models--o--n/snapshots/abc/x.json");
    link_to("/etc/passwd", "hub/models--o--n/snapshots/abc/etc.json");
    link_to("../../blobs/333", "hub/models--o--n/snapshots/abc/partial.json");
    const char *snap = "hub/models--o--n/snapshots/abc";
    check_read(snap, "config.json", FERRY_OK, "blob", __LINE__);
    check_read(snap, "e.json", FERRY_OK, "in repo", __LINE__);
    check_read(snap, "x.json", FERRY_ERR_INVALID, "outside its repository's folder in the Hugging Face cache",
               __LINE__);
    check_read(snap, "x.json", FERRY_ERR_INVALID, "models--x--y/blobs/222", __LINE__);
    check_read(snap, "etc.json", FERRY_ERR_INVALID, "leads to /etc/passwd", __LINE__);
    check_read(snap, "partial.json", FERRY_ERR_NOT_FOUND, "../../blobs/333, which does not exist", __LINE__);
    /* the same layout reached through a link to the snapshot */
    link_to(at(snap), "snaplink");
    check_read("snaplink", "config.json", FERRY_OK, "blob", __LINE__);
    check_read("snaplink", "etc.json", FERRY_ERR_INVALID, "/etc/passwd", __LINE__);
    /* "snapshots" under a folder that is not a repository's: the plain rule */
    mkdirs("notrepo/snapshots/abc");
    put("notrepo/blob", "b");
    link_to("../../blob", "notrepo/snapshots/abc/config.json");
    check_read("notrepo/snapshots/abc", "config.json", FERRY_ERR_INVALID, "outside the model directory", __LINE__);
}

/* model_dir_resolve(spec) with the environment given: the directory (relative
 * to g_root) and name it gives, or the error. */
static void check_resolve(const char *spec, const char *want_dir, const char *want_name, int line)
{
    char *dir, *name;
    ferry_status st = model_dir_resolve(spec, &dir, &name);
    check_count++;
    if (st != FERRY_OK) {
        CHECK_FAIL_("line %d: %s: %s", line, spec, ferry_errmsg());
        return;
    }
    const char *wd = want_dir[0] == '/' || !want_name ? want_dir : at(want_dir);
    if (strcmp(dir, wd) != 0 || (want_name ? !name || strcmp(name, want_name) : name != NULL))
        CHECK_FAIL_("line %d: %s resolved to %s (%s), expected %s (%s)", line, spec, dir, name ? name : "NULL", wd,
                    want_name ? want_name : "NULL");
    free(dir);
    free(name);
}

static void check_resolve_fails(const char *spec, ferry_status want, const char *needle, int line)
{
    char *dir, *name;
    ferry_status st = model_dir_resolve(spec, &dir, &name);
    check_count++;
    if (st != want) CHECK_FAIL_("line %d: %s: expected %s, got %s (%s)", line, spec, ferry_status_name(want),
                                ferry_status_name(st), ferry_errmsg());
    else if (!strstr(ferry_errmsg(), needle))
        CHECK_FAIL_("line %d: %s: message \"%s\" lacks \"%s\"", line, spec, ferry_errmsg(), needle);
}

static void test_resolve(void)
{
    static const char c1[] = "1111111111111111111111111111111111111111";
    static const char c2[] = "2222222222222222222222222222222222222222";
    char snap1[256], snap2[256];
    snprintf(snap1, sizeof snap1, "hub/models--org--m.v1/snapshots/%s", c1);
    snprintf(snap2, sizeof snap2, "hub/models--org--m.v1/snapshots/%s", c2);
    mkdirs(snap1);
    mkdirs(snap2);
    mkdirs("hub/models--org--m.v1/refs/pr");
    put("hub/models--org--m.v1/refs/main", c1);
    put("hub/models--org--m.v1/refs/pr/1", c2);
    put("hub/models--org--m.v1/refs/bad", "nope\n");
    mkdirs("home/.cache/huggingface");
    setenv("HOME", at("home"), 1);
    unsetenv("HF_HOME");
    unsetenv("XDG_CACHE_HOME");
    setenv("HF_HUB_CACHE", at("hub"), 1);

    check_resolve("org/m.v1", snap1, "m.v1", __LINE__);
    check_resolve("org/m.v1@main", snap1, "m.v1", __LINE__);
    check_resolve("org/m.v1@pr/1", snap2, "m.v1", __LINE__);
    check_resolve("org/m.v1@2222222222222222222222222222222222222222", snap2, "m.v1", __LINE__);
    /* directories and what cannot be a repo id stay as they are */
    check_resolve(at("hub"), at("hub"), NULL, __LINE__);
    check_resolve("/no/such/dir", "/no/such/dir", NULL, __LINE__);
    check_resolve("a/b/c", "a/b/c", NULL, __LINE__);
    check_resolve("org/-x", "org/-x", NULL, __LINE__);
    check_resolve("org/a..b", "org/a..b", NULL, __LINE__);
    check_resolve("org/m@", "org/m@", NULL, __LINE__);
    check_resolve("org/m@../x", "org/m@../x", NULL, __LINE__);
    check_resolve("justaname", "justaname", NULL, __LINE__);

    check_resolve_fails("org/m.v1@bad", FERRY_ERR_INVALID, "does not hold a commit hash", __LINE__);
    check_resolve_fails("org/m.v1@v9", FERRY_ERR_NOT_FOUND, "models--org--m.v1/refs/v9", __LINE__);
    check_resolve_fails("org/m.v1@3333333333333333333333333333333333333333", FERRY_ERR_NOT_FOUND,
                        "no snapshot", __LINE__);
    setenv("HF_HOME", at("hfhome"), 1);
    check_resolve_fails("org/none", FERRY_ERR_NOT_FOUND, "hfhome/hub/models--org--none ($HF_HOME/hub)", __LINE__);
    check_resolve_fails("org/none", FERRY_ERR_NOT_FOUND, "hub/models--org--none ($HF_HUB_CACHE)", __LINE__);
    check_resolve_fails("org/none", FERRY_ERR_NOT_FOUND, ".cache/huggingface/hub/models--org--none", __LINE__);
    check_resolve_fails("org/none@v1", FERRY_ERR_NOT_FOUND, "revision 'v1'", __LINE__);

    /* the caches' order: $HF_HUB_CACHE, $HF_HOME/hub, then XDG or ~/.cache */
    unsetenv("HF_HUB_CACHE");
    check_resolve_fails("org/m.v1", FERRY_ERR_NOT_FOUND, "models--org--m.v1", __LINE__);
    link_to(at("hub"), "home/.cache/huggingface/hub");
    check_resolve("org/m.v1", "home/.cache/huggingface/hub/models--org--m.v1/snapshots/"
                  "1111111111111111111111111111111111111111", "m.v1", __LINE__);
    setenv("XDG_CACHE_HOME", at("xdg"), 1);
    check_resolve_fails("org/m.v1", FERRY_ERR_NOT_FOUND, "xdg/huggingface/hub/models--org--m.v1", __LINE__);
    mkdirs("hfhome");
    link_to(at("hub"), "hfhome/hub");
    check_resolve("org/m.v1", "hfhome/hub/models--org--m.v1/snapshots/1111111111111111111111111111111111111111",
                  "m.v1", __LINE__);
}

int main(void)
{
    char tmpl[] = "/tmp/ferry-test-model-dir-XXXXXX";
    FERRY_ASSERT(mkdtemp(tmpl));
    FERRY_ASSERT(realpath(tmpl, g_root));
    test_confinement();
    test_resolve();
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_root);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_root);
    return check_report();
}
