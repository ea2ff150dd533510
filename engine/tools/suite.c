/* suite.c - gfe-suite: the engine's test suites (unit, model, recovery).
 * Each check prints a human line and becomes a JUnit <testcase>; the exit
 * code is 0 when all checks pass, 1 when some fail, 2 on a usage error.
 * The recovery suite re-runs this program as `recovery-writer` and kills it
 * at random moments; the writer reports each batch number only after the
 * commit returned, so the parent knows what must have survived. */
#include "gfe.h"
#include "port.h"
#include "util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char g_dir[1024] = "";
static uint64_t g_seed;
static long g_ops = 5000, g_kills = 100;
static char g_fail[2048];

#define CHECK(cond, ...) do { if (!(cond)) { snprintf(g_fail, sizeof g_fail, __VA_ARGS__); goto fail; } } while (0)

static void dbpath(char *out, size_t n, const char *name) { path_join(out, n, g_dir, name); }

static gfe_db *open_db(const char *path, size_t cache, int create, char *err, size_t errlen)
{
    gfe_db *db = NULL;
    gfe_options o;
    memset(&o, 0, sizeof o);
    o.cache_bytes = cache;
    o.create = create;
    if (gfe_open(path, &o, &db, err, errlen) != GFE_OK) return NULL;
    return db;
}

static int mkidx(gfe_db *db, const char *name, int kind, int comp, uint32_t ns, uint32_t fan)
{
    gfe_index_options io = { kind, comp, ns, fan };
    return gfe_index_create(db, name, &io);
}

static void key_of(char *k, unsigned v) { snprintf(k, 16, "key%07u", v); }

/* ------------------------------------------------------------------ unit */

static const char *t_crud(int kind)
{
    char p[1100], err[600], k[16];
    void *v = NULL;
    size_t vl;
    dbpath(p, sizeof p, "crud.db");
    remove_db(p);
    gfe_db *db = open_db(p, 1 << 20, 1, err, sizeof err);
    CHECK(db, "open: %s", err);
    int ix = mkidx(db, "i", kind, 0, 0, 0);
    CHECK(ix == 0, "create index: %d", ix);
    CHECK(gfe_put(db, ix, "a", 1, "1", 1, GFE_DUR_NONE) == 0, "put");
    CHECK(gfe_get(db, ix, "a", 1, &v, &vl) == GFE_OK && vl == 1 && memcmp(v, "1", 1) == 0, "get after put");
    gfe_free(v); v = NULL;
    CHECK(gfe_put(db, ix, "a", 1, "22", 2, GFE_DUR_SYNC) == 0, "overwrite");
    CHECK(gfe_get(db, ix, "a", 1, &v, &vl) == GFE_OK && vl == 2 && memcmp(v, "22", 2) == 0, "get after overwrite");
    gfe_free(v); v = NULL;
    CHECK(gfe_get(db, ix, "b", 1, &v, &vl) == GFE_NOTFOUND, "missing key found");
    CHECK(gfe_put(db, ix, "", 0, "empty", 5, GFE_DUR_NONE) == 0, "empty key put");
    CHECK(gfe_get(db, ix, "", 0, &v, &vl) == GFE_OK && vl == 5, "empty key get");
    gfe_free(v); v = NULL;
    for (unsigned i = 0; i < 3000; i++) {
        key_of(k, i);
        CHECK(gfe_put(db, ix, k, 10, k, 10, GFE_DUR_NONE) == 0, "bulk put %u", i);
    }
    for (unsigned i = 0; i < 3000; i += 2) {
        key_of(k, i);
        CHECK(gfe_del(db, ix, k, 10, GFE_DUR_NONE) == 0, "del %u", i);
    }
    CHECK(gfe_del(db, ix, "a", 1, GFE_DUR_GROUP) == 0, "del a");
    CHECK(gfe_get(db, ix, "a", 1, &v, &vl) == GFE_NOTFOUND, "deleted key still found");
    for (unsigned i = 0; i < 3000; i++) {
        key_of(k, i);
        int rc = gfe_get(db, ix, k, 10, &v, &vl);
        CHECK(rc == (i % 2 ? GFE_OK : GFE_NOTFOUND), "key %u: rc %d", i, rc);
        if (rc == GFE_OK) CHECK(vl == 10 && memcmp(v, k, 10) == 0, "key %u: wrong value", i);
        gfe_free(v); v = NULL;
    }
    gfe_close(db);
    return NULL;
fail:
    gfe_free(v);
    if (db) gfe_close(db);
    return g_fail;
}
static const char *t_crud_btree(void) { return t_crud(GFE_BTREE); }
static const char *t_crud_betree(void) { return t_crud(GFE_BETREE); }

static const char *t_cursor(int kind)
{
    char p[1100], err[600], k[16];
    gfe_cursor *c = NULL;
    dbpath(p, sizeof p, "cursor.db");
    remove_db(p);
    gfe_db *db = open_db(p, 256 << 10, 1, err, sizeof err);
    CHECK(db, "open: %s", err);
    int ix = mkidx(db, "i", kind, 1, 4096, 4);
    CHECK(ix >= 0, "create index");
    for (unsigned i = 0; i < 4000; i++) {
        key_of(k, i * 2);
        CHECK(gfe_put(db, ix, k, 10, k, 10, GFE_DUR_NONE) == 0, "put");
    }
    CHECK(gfe_cursor_open(db, ix, &c) == 0, "cursor open");
    unsigned n = 0;
    for (gfe_cursor_seek(c, NULL, 0, GFE_FORWARD); gfe_cursor_valid(c); gfe_cursor_next(c)) {
        size_t kl;
        const void *kk = gfe_cursor_key(c, &kl);
        key_of(k, n * 2);
        CHECK(kl == 10 && memcmp(kk, k, 10) == 0, "forward scan position %u: wrong key", n);
        n++;
    }
    CHECK(n == 4000, "forward scan saw %u keys, expected 4000", n);
    n = 0;
    for (gfe_cursor_seek(c, NULL, 0, GFE_BACKWARD); gfe_cursor_valid(c); gfe_cursor_next(c)) {
        size_t kl;
        const void *kk = gfe_cursor_key(c, &kl);
        key_of(k, (3999 - n) * 2);
        CHECK(kl == 10 && memcmp(kk, k, 10) == 0, "backward scan position %u: wrong key", n);
        n++;
    }
    CHECK(n == 4000, "backward scan saw %u keys", n);
    key_of(k, 1001); /* between keys */
    gfe_cursor_seek(c, k, 10, GFE_FORWARD);
    size_t kl;
    char want[16];
    key_of(want, 1002);
    CHECK(gfe_cursor_valid(c) && memcmp(gfe_cursor_key(c, &kl), want, 10) == 0, "seek forward between keys");
    gfe_cursor_seek(c, k, 10, GFE_BACKWARD);
    key_of(want, 1000);
    CHECK(gfe_cursor_valid(c) && memcmp(gfe_cursor_key(c, &kl), want, 10) == 0, "seek backward between keys");
    gfe_cursor_seek(c, "zzz", 3, GFE_FORWARD);
    CHECK(!gfe_cursor_valid(c), "seek past end should be invalid");
    gfe_cursor_seek(c, "a", 1, GFE_BACKWARD);
    CHECK(!gfe_cursor_valid(c), "seek before start backward should be invalid");
    gfe_cursor_close(c);
    gfe_close(db);
    return NULL;
fail:
    gfe_cursor_close(c);
    if (db) gfe_close(db);
    return g_fail;
}
static const char *t_cursor_btree(void) { return t_cursor(GFE_BTREE); }
static const char *t_cursor_betree(void) { return t_cursor(GFE_BETREE); }

static const char *t_batch_atomic(void)
{
    char p[1100], err[600], k[16];
    void *v = NULL;
    size_t vl;
    gfe_batch *b = gfe_batch_new();
    dbpath(p, sizeof p, "batch.db");
    remove_db(p);
    gfe_db *db = open_db(p, 1 << 20, 1, err, sizeof err);
    CHECK(db, "open: %s", err);
    int a = mkidx(db, "a", GFE_BTREE, 0, 0, 0), c = mkidx(db, "b", GFE_BETREE, 2, 0, 0);
    CHECK(a == 0 && c == 1, "create indexes");
    CHECK(mkidx(db, "a", GFE_BTREE, 0, 0, 0) == GFE_EEXIST, "duplicate index name accepted");
    CHECK(gfe_index_find(db, "b") == 1 && gfe_index_find(db, "zz") == GFE_ENOINDEX, "index_find");
    for (unsigned i = 0; i < 500; i++) {
        key_of(k, i);
        gfe_batch_put(b, a, k, 10, "A", 1);
        gfe_batch_put(b, c, k, 10, "B", 1);
    }
    gfe_batch_del(b, a, "key0000007", 10);
    uint64_t seq = 0;
    CHECK(gfe_commit(db, b, GFE_DUR_SYNC, &seq) == 0 && seq > 0, "commit");
    gfe_batch_clear(b);
    gfe_batch_put(b, a, "x", 1, "1", 1);
    gfe_batch_put(b, 7, "x", 1, "1", 1);
    CHECK(gfe_commit(db, b, GFE_DUR_SYNC, NULL) == GFE_ENOINDEX, "batch naming a missing index must fail");
    CHECK(gfe_get(db, a, "x", 1, &v, &vl) == GFE_NOTFOUND, "failed batch was partly applied");
    gfe_close(db);
    db = open_db(p, 1 << 20, 0, err, sizeof err);
    CHECK(db, "reopen: %s", err);
    for (unsigned i = 0; i < 500; i++) {
        key_of(k, i);
        int ra = gfe_get(db, a, k, 10, &v, &vl);
        gfe_free(v); v = NULL;
        int rb = gfe_get(db, c, k, 10, &v, &vl);
        gfe_free(v); v = NULL;
        CHECK(ra == (i == 7 ? GFE_NOTFOUND : GFE_OK) && rb == GFE_OK, "key %u after reopen: %d %d", i, ra, rb);
    }
    gfe_batch_free(b);
    gfe_close(db);
    return NULL;
fail:
    gfe_batch_free(b);
    if (db) gfe_close(db);
    return g_fail;
}

static const char *t_limits(void)
{
    char p[1100], err[600];
    static char big[70000];
    dbpath(p, sizeof p, "limits.db");
    remove_db(p);
    gfe_db *db = open_db(p, 1 << 20, 1, err, sizeof err);
    CHECK(db, "open: %s", err);
    int ix = mkidx(db, "i", GFE_BTREE, 0, 8192, 0);
    CHECK(ix == 0, "create");
    CHECK(gfe_put(db, ix, big, GFE_MAX_KEY + 1, "v", 1, GFE_DUR_NONE) == GFE_EINVAL, "oversized key accepted");
    CHECK(gfe_put(db, ix, "k", 1, big, 5000, GFE_DUR_NONE) == GFE_EINVAL, "oversized value accepted");
    CHECK(gfe_put(db, ix, "k", 1, big, 1500, GFE_DUR_NONE) == GFE_OK, "1500-byte value rejected");
    CHECK(gfe_put(db, 5, "k", 1, "v", 1, GFE_DUR_NONE) == GFE_ENOINDEX, "unknown index accepted");
    CHECK(mkidx(db, "", GFE_BTREE, 0, 0, 0) == GFE_EINVAL, "empty index name accepted");
    CHECK(mkidx(db, "j", 9, 0, 0, 0) == GFE_EINVAL, "bad kind accepted");
    gfe_close(db);
    return NULL;
fail:
    if (db) gfe_close(db);
    return g_fail;
}

static const char *t_cache_io(void)
{
    char p[1100], err[600], k[16], v[100];
    dbpath(p, sizeof p, "cache.db");
    remove_db(p);
    gfe_db *db = open_db(p, 128 << 10, 1, err, sizeof err);
    CHECK(db, "open: %s", err);
    int ix = mkidx(db, "i", GFE_BTREE, 0, 4096, 0);
    rng r;
    rng_seed(&r, 7);
    memset(v, 'x', sizeof v);
    for (unsigned i = 0; i < 20000; i++) {
        key_of(k, (unsigned)rng_below(&r, 10000000));
        CHECK(gfe_put(db, ix, k, 10, v, sizeof v, GFE_DUR_NONE) == 0, "put: %s", gfe_errmsg(db));
    }
    gfe_stats st;
    gfe_stats_get(db, &st, 0);
    CHECK(st.cache_used <= st.cache_bytes + 64 * 1024, "cache holds %llu bytes, budget %llu",
          (unsigned long long)st.cache_used, (unsigned long long)st.cache_bytes);
    CHECK(st.node_reads > 100 && st.node_writes > 100, "data 15x the cache did little I/O (reads %llu writes %llu)",
          (unsigned long long)st.node_reads, (unsigned long long)st.node_writes);
    gfe_close(db);
    return NULL;
fail:
    if (db) gfe_close(db);
    return g_fail;
}

static const char *t_betree_messages(void)
{
    char p[1100], err[600], k[16];
    void *v = NULL;
    size_t vl;
    dbpath(p, sizeof p, "msgs.db");
    remove_db(p);
    gfe_db *db = open_db(p, 256 << 10, 1, err, sizeof err);
    CHECK(db, "open: %s", err);
    int ix = mkidx(db, "i", GFE_BETREE, 0, 8192, 4);
    rng r;
    rng_seed(&r, 3);
    for (unsigned i = 0; i < 5000; i++) {
        key_of(k, i);
        CHECK(gfe_put(db, ix, k, 10, "value-value", 11, GFE_DUR_NONE) == 0, "put");
    }
    for (unsigned i = 0; i < 5000; i += 3) {
        key_of(k, i);
        CHECK(gfe_del(db, ix, k, 10, GFE_DUR_NONE) == 0, "del");
    }
    gfe_stats st;
    CHECK(gfe_stats_get(db, &st, 1) == 0, "deep stats: %s", gfe_errmsg(db));
    CHECK(st.idx[0].depth >= 3, "tree depth %d, expected >= 3", st.idx[0].depth);
    CHECK(st.idx[0].messages > 0, "no buffered messages in internal nodes");
    for (unsigned i = 0; i < 5000; i++) {
        key_of(k, i);
        int rc = gfe_get(db, ix, k, 10, &v, &vl);
        gfe_free(v); v = NULL;
        CHECK(rc == (i % 3 ? GFE_OK : GFE_NOTFOUND), "key %u rc %d", i, rc);
    }
    gfe_close(db);
    return NULL;
fail:
    if (db) gfe_close(db);
    return g_fail;
}

static const char *t_compression(void)
{
    char p[1100], err[600], k[16], v[200];
    dbpath(p, sizeof p, "comp.db");
    remove_db(p);
    gfe_db *db = open_db(p, 1 << 20, 1, err, sizeof err);
    CHECK(db, "open: %s", err);
    int ix[3];
    for (int c = 0; c < 3; c++) {
        char name[8];
        snprintf(name, sizeof name, "c%d", c);
        ix[c] = mkidx(db, name, GFE_BTREE, c, 16384, 0);
    }
    for (unsigned i = 0; i < 5000; i++) {
        key_of(k, i);
        int n = snprintf(v, sizeof v, "{\"job\":\"nightly-build-%u\",\"status\":\"passed\",\"duration_ms\":%u,\"host\":\"worker-%u\"}",
                         i % 40, i * 37 % 10000, i % 7);
        for (int c = 0; c < 3; c++) CHECK(gfe_put(db, ix[c], k, 10, v, (size_t)n, GFE_DUR_NONE) == 0, "put");
    }
    gfe_stats st;
    CHECK(gfe_stats_get(db, &st, 1) == 0, "deep stats: %s", gfe_errmsg(db));
    double r[3];
    for (int c = 0; c < 3; c++) r[c] = (double)st.idx[c].raw_bytes / (double)st.idx[c].stored_bytes;
    CHECK(r[0] > 0.99 && r[0] < 1.01, "uncompressed ratio %.2f", r[0]);
    CHECK(r[1] > 2.0, "standard ratio %.2f too low", r[1]);
    CHECK(r[2] >= r[1], "aggressive ratio %.2f below standard %.2f", r[2], r[1]);
    CHECK(st.idx[1].disk_bytes < st.idx[0].disk_bytes, "compressed index does not use fewer pages");
    gfe_close(db);
    return NULL;
fail:
    if (db) gfe_close(db);
    return g_fail;
}

typedef struct gc_arg { gfe_db *db; int ix, id, fails; } gc_arg;
static void gc_thread(void *p)
{
    gc_arg *a = p;
    char k[32];
    for (int i = 0; i < 100; i++) {
        snprintf(k, sizeof k, "t%d-%04d", a->id, i);
        if (gfe_put(a->db, a->ix, k, strlen(k), "v", 1, GFE_DUR_GROUP) != 0) a->fails++;
    }
}

static const char *t_durability(void)
{
    char p[1100], err[600];
    dbpath(p, sizeof p, "dur.db");
    remove_db(p);
    gfe_db *db = open_db(p, 1 << 20, 1, err, sizeof err);
    CHECK(db, "open: %s", err);
    int ix = mkidx(db, "i", GFE_BETREE, 0, 0, 0);
    CHECK(gfe_put(db, ix, "s", 1, "1", 1, GFE_DUR_SYNC) == 0, "sync commit");
    CHECK(gfe_put(db, ix, "n", 1, "1", 1, GFE_DUR_NONE) == 0, "none commit");
    gc_arg args[4];
    port_thread *th[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (gc_arg){ db, ix, i, 0 };
        CHECK(port_thread_start(&th[i], gc_thread, &args[i]) == 0, "thread start");
    }
    for (int i = 0; i < 4; i++) port_thread_join(th[i]);
    for (int i = 0; i < 4; i++) CHECK(args[i].fails == 0, "group commit failures in thread %d", i);
    gfe_stats st;
    gfe_stats_get(db, &st, 0);
    CHECK(st.commits == 402, "commits %llu, expected 402", (unsigned long long)st.commits);
    gfe_cursor *c;
    gfe_cursor_open(db, ix, &c);
    unsigned n = 0;
    for (gfe_cursor_seek(c, NULL, 0, GFE_FORWARD); gfe_cursor_valid(c); gfe_cursor_next(c)) n++;
    gfe_cursor_close(c);
    CHECK(n == 402, "found %u keys", n);
    gfe_close(db);
    return NULL;
fail:
    if (db) gfe_close(db);
    return g_fail;
}

static int copy_file(const char *from, const char *to)
{
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    char buf[65536];
    size_t n;
    int rc = a && b ? 0 : -1;
    while (!rc && (n = fread(buf, 1, sizeof buf, a)) > 0)
        if (fwrite(buf, 1, n, b) != n) rc = -1;
    if (a) fclose(a);
    if (b && fclose(b)) rc = -1;
    return rc;
}

static int patch_file(const char *path, long off, int whence, unsigned char x)
{
    FILE *f = fopen(path, "r+b");
    if (!f) return -1;
    int c;
    if (fseek(f, off, whence) || (c = fgetc(f)) == EOF || fseek(f, -1, SEEK_CUR) || fputc(c ^ x, f) == EOF) {
        fclose(f);
        return -1;
    }
    return fclose(f);
}

static long file_size(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    long s = ftell(f);
    fclose(f);
    return s;
}

static int truncate_file(const char *path, long size)
{
    port_file *f;
    if (port_open(path, 0, &f)) return -1;
    int rc = port_truncate(f, (uint64_t)size);
    port_close(f);
    return rc;
}

/* Builds a small database and returns its path; kept open-and-copied
 * variants simulate a crash (log not yet checkpointed). */
static const char *make_sample(char *p, size_t n, const char *name, int crash_copy)
{
    char err[600], k[16], tmp[1100];
    dbpath(p, n, name);
    remove_db(p);
    snprintf(tmp, sizeof tmp, "%s.live", p);
    remove_db(tmp);
    gfe_options o;
    memset(&o, 0, sizeof o);
    o.create = 1;
    o.cache_bytes = 1 << 20;
    o.checkpoint_wal_bytes = 1u << 30;
    gfe_db *db;
    if (gfe_open(crash_copy ? tmp : p, &o, &db, err, sizeof err)) return "open failed";
    int ix = mkidx(db, "i", GFE_BTREE, 0, 4096, 0);
    for (unsigned i = 0; i < 2000; i++) {
        key_of(k, i);
        gfe_put(db, ix, k, 10, "some value text", 15, GFE_DUR_NONE);
        if (i == 1000 && !crash_copy) gfe_checkpoint(db);
    }
    if (crash_copy) {
        char w1[1100], w2[1100];
        sfmt(w1, sizeof w1, "%s-wal", tmp);
        snprintf(w2, sizeof w2, "%s-wal", p);
        if (copy_file(tmp, p) || copy_file(w1, w2)) { gfe_close(db); return "copy failed"; }
    }
    gfe_close(db);
    if (crash_copy) remove_db(tmp);
    return NULL;
}

static int expect_open_error(const char *p, const char *needle, char *err, size_t n)
{
    gfe_db *db = open_db(p, 1 << 20, 0, err, n);
    if (db) { gfe_close(db); snprintf(err, n, "(opened without error)"); return 0; }
    return strstr(err, needle) != NULL;
}

static const char *t_corrupt_header(void)
{
    char p[1100], err[600];
    const char *e = make_sample(p, sizeof p, "hdr.db", 0);
    CHECK(!e, "%s", e);
    CHECK(patch_file(p, 100, SEEK_SET, 0x40) == 0 && patch_file(p, 4096 + 100, SEEK_SET, 0x40) == 0, "patch");
    CHECK(expect_open_error(p, "header page 0: checksum mismatch", err, sizeof err), "unexpected error: %s", err);
    e = make_sample(p, sizeof p, "hdr.db", 0);
    CHECK(!e, "%s", e);
    /* damage only the newest slot: the log still names that generation */
    gfe_db *db = open_db(p, 1 << 20, 0, err, sizeof err);
    CHECK(db, "open: %s", err);
    gfe_stats st;
    gfe_stats_get(db, &st, 0);
    gfe_close(db);
    FILE *f = fopen(p, "rb");
    unsigned char s0[32], s1[32];
    CHECK(f && fread(s0, 1, 32, f) == 32 && fseek(f, 4096, SEEK_SET) == 0 && fread(s1, 1, 32, f) == 32, "read slots");
    fclose(f);
    uint64_t g0 = 0, g1 = 0;
    for (int i = 7; i >= 0; i--) { g0 = g0 << 8 | s0[16 + i]; g1 = g1 << 8 | s1[16 + i]; }
    CHECK(patch_file(p, (g0 > g1 ? 0 : 4096) + 50, SEEK_SET, 0x01) == 0, "patch");
    CHECK(expect_open_error(p, "current header slot is corrupt", err, sizeof err), "unexpected error: %s", err);
    return NULL;
fail:
    return g_fail;
}

static const char *t_truncated(void)
{
    char p[1100], err[600];
    const char *e = make_sample(p, sizeof p, "trunc.db", 0);
    CHECK(!e, "%s", e);
    long s = file_size(p);
    CHECK(s > 16384 && truncate_file(p, s / 2) == 0, "truncate");
    CHECK(expect_open_error(p, "truncated", err, sizeof err), "unexpected error: %s", err);
    CHECK(truncate_file(p, 100) == 0, "truncate");
    CHECK(expect_open_error(p, "not a valid gfe database", err, sizeof err), "unexpected error: %s", err);
    return NULL;
fail:
    return g_fail;
}

static const char *t_corrupt_page(void)
{
    char p[1100], err[600];
    const char *e = make_sample(p, sizeof p, "page.db", 0);
    CHECK(!e, "%s", e);
    /* find a live leaf: gfe check must pass first, then flip one payload byte
     * in every page that looks like a leaf */
    FILE *f = fopen(p, "rb");
    CHECK(f, "open file");
    long s = file_size(p), hits = 0;
    unsigned char b[64];
    long target = -1;
    for (long off = 8192; off + 64 <= s; off += 4096) {
        if (fseek(f, off, SEEK_SET) || fread(b, 1, 64, f) != 64) break;
        if (b[0] == 'G' && b[1] == 'F' && b[2] == 'E' && b[3] == 'N' && b[8] == 1) { target = off; hits++; }
    }
    fclose(f);
    CHECK(target > 0, "no leaf page found");
    gfe_db *db = open_db(p, 1 << 20, 0, err, sizeof err);
    CHECK(db, "open: %s", err);
    gfe_close(db);
    /* flip a byte in every leaf-looking page so a live one is hit */
    f = fopen(p, "rb");
    for (long off = 8192; f && off + 64 <= s; off += 4096) {
        if (fseek(f, off, SEEK_SET) || fread(b, 1, 64, f) != 64) break;
        if (b[0] == 'G' && b[1] == 'F' && b[2] == 'E' && b[3] == 'N' && b[8] == 1) patch_file(p, off + 40, SEEK_SET, 0x10);
    }
    if (f) fclose(f);
    CHECK(expect_open_error(p, "checksum mismatch", err, sizeof err), "unexpected error: %s", err);
    CHECK(strstr(err, "page ") != NULL, "error does not name the page: %s", err);
    return NULL;
fail:
    return g_fail;
}

static const char *t_wal_damage(void)
{
    char p[1100], err[600], w[1100], k[16];
    void *v = NULL;
    size_t vl;
    const char *e = make_sample(p, sizeof p, "wal.db", 1);
    CHECK(!e, "%s", e);
    sfmt(w, sizeof w, "%s-wal", p);
    long ws = file_size(w);
    CHECK(ws > 2000, "log too small (%ld)", ws);
    /* torn tail: the last batch is dropped, everything before survives */
    CHECK(truncate_file(w, ws - 5) == 0, "truncate log");
    gfe_db *db = open_db(p, 1 << 20, 0, err, sizeof err);
    CHECK(db, "open with torn log tail failed: %s", err);
    key_of(k, 1998);
    CHECK(gfe_get(db, 0, k, 10, &v, &vl) == GFE_OK, "batch before the torn one lost");
    gfe_free(v); v = NULL;
    key_of(k, 1999);
    CHECK(gfe_get(db, 0, k, 10, &v, &vl) == GFE_NOTFOUND, "torn batch was applied");
    gfe_close(db);
    e = make_sample(p, sizeof p, "wal.db", 1);
    CHECK(!e, "%s", e);
    CHECK(patch_file(w, file_size(w) / 2, SEEK_SET, 0x20) == 0, "patch log");
    CHECK(expect_open_error(p, "record at offset", err, sizeof err), "unexpected error: %s", err);
    /* a damaged length field must not pass for a torn tail */
    e = make_sample(p, sizeof p, "wal.db", 1);
    CHECK(!e, "%s", e);
    CHECK(patch_file(w, 32 + 4 + 3, SEEK_SET, 0x7f) == 0, "patch log");
    CHECK(expect_open_error(p, "intact records follow", err, sizeof err), "unexpected error: %s", err);
    return NULL;
fail:
    return g_fail;
}

static const char *t_reopen_large(void)
{
    char p[1100], err[600], k[16], v[64];
    void *got = NULL;
    size_t gl;
    dbpath(p, sizeof p, "reopen.db");
    remove_db(p);
    gfe_db *db = open_db(p, 256 << 10, 1, err, sizeof err);
    CHECK(db, "open: %s", err);
    int a = mkidx(db, "bt", GFE_BTREE, 1, 4096, 0), b = mkidx(db, "be", GFE_BETREE, 1, 8192, 4);
    for (unsigned i = 0; i < 6000; i++) {
        key_of(k, i * 7919 % 6000);
        snprintf(v, sizeof v, "value-%u", i);
        CHECK(gfe_put(db, a, k, 10, v, strlen(v), GFE_DUR_NONE) == 0 && gfe_put(db, b, k, 10, v, strlen(v), GFE_DUR_NONE) == 0,
              "put");
    }
    CHECK(gfe_verify(db, err, sizeof err) == 0, "verify: %s", err);
    gfe_close(db);
    db = open_db(p, 256 << 10, 0, err, sizeof err);
    CHECK(db, "reopen: %s", err);
    for (unsigned i = 0; i < 6000; i++) {
        key_of(k, i * 7919 % 6000);
        snprintf(v, sizeof v, "value-%u", i);
        for (int x = 0; x < 2; x++) {
            CHECK(gfe_get(db, x, k, 10, &got, &gl) == GFE_OK && gl == strlen(v) && memcmp(got, v, gl) == 0,
                  "index %d key %u wrong after reopen", x, i);
            gfe_free(got); got = NULL;
        }
    }
    gfe_close(db);
    return NULL;
fail:
    if (db) gfe_close(db);
    return g_fail;
}

/* Child side of the lock test: 5 if the database is refused as in use. */
static int lock_probe_main(int argc, char **argv)
{
    char err[600];
    if (argc < 3) return 2;
    gfe_db *db = open_db(argv[2], 1 << 20, 0, err, sizeof err);
    if (db) { gfe_close(db); return 0; }
    return strstr(err, "in use") ? 5 : 6;
}

static const char *t_single_process_lock(void)
{
    char p[1100], err[600];
    dbpath(p, sizeof p, "lock.db");
    remove_db(p);
    gfe_db *db = open_db(p, 1 << 20, 1, err, sizeof err);
    CHECK(db, "open: %s", err);
    char *args[] = { "gfe-suite", "lock-probe", p, NULL };
    port_proc *pr;
    int code = -1;
    CHECK(port_proc_spawn_self(3, args, lock_probe_main, &pr) == 0, "spawn");
    port_proc_wait(pr, &code);
    CHECK(code == 5, "second process opening the database got exit %d, expected refusal (5)", code);
    gfe_close(db);
    CHECK(port_proc_spawn_self(3, args, lock_probe_main, &pr) == 0, "spawn");
    port_proc_wait(pr, &code);
    CHECK(code == 0, "open after close failed in the child (exit %d)", code);
    return NULL;
fail:
    if (db) gfe_close(db);
    return g_fail;
}

typedef struct ucase { const char *name; const char *(*fn)(void); } ucase;
static const ucase units[] = {
    { "crud_btree", t_crud_btree },
    { "crud_betree", t_crud_betree },
    { "cursor_btree", t_cursor_btree },
    { "cursor_betree", t_cursor_betree },
    { "batch_atomic_multi_index", t_batch_atomic },
    { "limits_and_bad_arguments", t_limits },
    { "cache_bounded_and_evicts", t_cache_io },
    { "betree_buffers_messages", t_betree_messages },
    { "compression_levels", t_compression },
    { "durability_modes_group_commit", t_durability },
    { "reopen_larger_than_cache", t_reopen_large },
    { "corrupt_header_detected", t_corrupt_header },
    { "truncated_file_detected", t_truncated },
    { "corrupt_page_detected", t_corrupt_page },
    { "log_torn_tail_and_corruption", t_wal_damage },
    { "single_process_lock", t_single_process_lock },
};

/* --only NAME (repeatable): the unit tests to run, none meaning all. A bisection runs only the
   test it bisects (the farm's catalog passes its name); names are checked before anything runs. */
#define MAX_ONLY 16
static const char *g_only[MAX_ONLY];
static int g_n_only;

static int unit_selected(const char *name)
{
    if (!g_n_only) return 1;
    for (int i = 0; i < g_n_only; i++)
        if (!strcmp(g_only[i], name)) return 1;
    return 0;
}

static const char *unknown_unit(void)
{
    for (int i = 0; i < g_n_only; i++) {
        size_t k = 0;
        while (k < sizeof units / sizeof units[0] && strcmp(units[k].name, g_only[i])) k++;
        if (k == sizeof units / sizeof units[0]) return g_only[i];
    }
    return NULL;
}

static void run_unit(junit *j)
{
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (!unit_selected(units[i].name)) continue;
        double t0 = now_sec();
        const char *f = units[i].fn();
        junit_add(j, units[i].name, now_sec() - t0, f);
    }
}

/* ----------------------------------------------------------------- model */

/* Checks the whole index against the model in both directions. */
static int full_compare(gfe_db *db, int ix, const model *m, char *msg, size_t n)
{
    gfe_cursor *c;
    if (gfe_cursor_open(db, ix, &c)) { snprintf(msg, n, "cursor open failed"); return 0; }
    for (int dir = 0; dir < 2; dir++) {
        size_t i = 0;
        int rc = gfe_cursor_seek(c, NULL, 0, dir);
        for (; rc == 0 && gfe_cursor_valid(c); rc = gfe_cursor_next(c), i++) {
            size_t kl, vl;
            const void *k = gfe_cursor_key(c, &kl), *v = gfe_cursor_value(c, &vl);
            if (i >= m->n) { snprintf(msg, n, "scan dir %d: extra entries beyond %zu", dir, m->n); goto bad; }
            const mentry *e = &m->e[dir ? m->n - 1 - i : i];
            if (bytes_cmp(k, kl, e->k, e->kl) || bytes_cmp(v, vl, e->v, e->vl)) {
                char h[80];
                fmt_hex(h, sizeof h, e->k, e->kl);
                snprintf(msg, n, "scan dir %d position %zu: expected key %s, got different key or value", dir, i, h);
                goto bad;
            }
        }
        if (rc != 0 && rc != GFE_NOTFOUND) { snprintf(msg, n, "scan error %d: %s", rc, gfe_errmsg(db)); goto bad; }
        if (i != m->n) { snprintf(msg, n, "scan dir %d saw %zu entries, model has %zu", dir, i, m->n); goto bad; }
    }
    gfe_cursor_close(c);
    return 1;
bad:
    gfe_cursor_close(c);
    return 0;
}

static void rand_key(rng *r, unsigned char *k, size_t *kl, unsigned space)
{
    unsigned x = (unsigned)rng_below(r, space);
    /* mix short keys sharing prefixes with a few long ones */
    int n = snprintf((char *)k, 64, "%c%06u", 'a' + (int)(x % 3), x);
    if (x % 17 == 0) n += snprintf((char *)k + n, 64, "-long-suffix-%u", x % 1000);
    *kl = (size_t)n;
}

static void rand_val(rng *r, unsigned char *v, size_t *vl, uint64_t tag)
{
    size_t n = (size_t)rng_below(r, 5) == 0 ? (size_t)rng_below(r, 600) : (size_t)rng_below(r, 40);
    for (size_t i = 0; i < n; i++) v[i] = (unsigned char)('a' + (tag + i) % 26);
    if (n >= 8) put_be64(v, tag);
    *vl = n;
}

static const char *model_run(const char *name, int kinds[3], int comps[3], uint64_t seed, long ops)
{
    char p[1100], err[600], msg[600];
    unsigned char k[80], v[700];
    size_t kl, vl;
    model m[3];
    memset(m, 0, sizeof m);
    rng r;
    rng_seed(&r, seed);
    gfe_batch *b = gfe_batch_new();
    dbpath(p, sizeof p, name);
    remove_db(p);
    size_t cache = 64 << 10;
    gfe_db *db = open_db(p, cache, 1, err, sizeof err);
    long op = 0;
    CHECK(db, "seed=%llu: open: %s", (unsigned long long)seed, err);
    for (int i = 0; i < 3; i++) {
        char in[8];
        snprintf(in, sizeof in, "m%d", i);
        CHECK(mkidx(db, in, kinds[i], comps[i], kinds[i] == GFE_BTREE ? 4096 : 8192, 4) == i, "create");
    }
    unsigned space = 2000 + (unsigned)rng_below(&r, 3000);
    for (op = 0; op < ops; op++) {
        int ix = (int)rng_below(&r, 3);
        unsigned what = (unsigned)rng_below(&r, 1000);
        if (what < 450) {
            rand_key(&r, k, &kl, space);
            rand_val(&r, v, &vl, (uint64_t)op);
            CHECK(gfe_put(db, ix, k, kl, v, vl, rng_below(&r, 50) == 0 ? GFE_DUR_SYNC : GFE_DUR_NONE) == 0,
                  "put: %s", gfe_errmsg(db));
            model_put(&m[ix], k, kl, v, vl);
        } else if (what < 650) {
            rand_key(&r, k, &kl, space);
            CHECK(gfe_del(db, ix, k, kl, GFE_DUR_NONE) == 0, "del: %s", gfe_errmsg(db));
            model_del(&m[ix], k, kl);
        } else if (what < 800) {
            rand_key(&r, k, &kl, space);
            void *got = NULL;
            size_t gl;
            int f, rc = gfe_get(db, ix, k, kl, &got, &gl);
            size_t at = model_find(&m[ix], k, kl, &f);
            int okk = f ? rc == GFE_OK && bytes_cmp(got, gl, m[ix].e[at].v, m[ix].e[at].vl) == 0 : rc == GFE_NOTFOUND;
            gfe_free(got);
            CHECK(okk, "get of key '%.*s' in index %d: rc %d, model says %s", (int)kl, (char *)k, ix, rc,
                  f ? "present" : "absent");
        } else if (what < 880) {
            /* atomic batch across indexes, applied to the model in order */
            int nb = 1 + (int)rng_below(&r, 40);
            gfe_batch_clear(b);
            struct { int ix, del; unsigned char k[80], v[700]; size_t kl, vl; } *bo = malloc(sizeof *bo * (size_t)nb);
            CHECK(bo, "malloc");
            for (int i = 0; i < nb; i++) {
                bo[i].ix = (int)rng_below(&r, 3);
                bo[i].del = rng_below(&r, 4) == 0;
                rand_key(&r, bo[i].k, &bo[i].kl, space);
                rand_val(&r, bo[i].v, &bo[i].vl, (uint64_t)op * 100 + (uint64_t)i);
                if (bo[i].del) gfe_batch_del(b, bo[i].ix, bo[i].k, bo[i].kl);
                else gfe_batch_put(b, bo[i].ix, bo[i].k, bo[i].kl, bo[i].v, bo[i].vl);
            }
            int rc = gfe_commit(db, b, (int)rng_below(&r, 3) == 0 ? GFE_DUR_GROUP : GFE_DUR_NONE, NULL);
            for (int i = 0; i < nb && rc == 0; i++) {
                if (bo[i].del) model_del(&m[bo[i].ix], bo[i].k, bo[i].kl);
                else model_put(&m[bo[i].ix], bo[i].k, bo[i].kl, bo[i].v, bo[i].vl);
            }
            free(bo);
            CHECK(rc == 0, "commit: %s", gfe_errmsg(db));
        } else if (what < 990) {
            /* short range scan from a random key in a random direction */
            rand_key(&r, k, &kl, space);
            int dir = (int)rng_below(&r, 2), f;
            size_t at = model_find(&m[ix], k, kl, &f);
            long pos = dir == 0 ? (long)at : (f ? (long)at : (long)at - 1);
            gfe_cursor *c;
            CHECK(gfe_cursor_open(db, ix, &c) == 0, "cursor");
            int rc = gfe_cursor_seek(c, k, kl, dir);
            int steps = (int)rng_below(&r, 60), bad = 0;
            for (int s = 0; s < steps && !bad; s++) {
                int mvalid = pos >= 0 && pos < (long)m[ix].n;
                if (rc != 0 && rc != GFE_NOTFOUND) { bad = 1; snprintf(msg, sizeof msg, "cursor error %s", gfe_errmsg(db)); break; }
                if (mvalid != gfe_cursor_valid(c)) {
                    bad = 1;
                    snprintf(msg, sizeof msg, "step %d: cursor valid=%d, model valid=%d", s, gfe_cursor_valid(c), mvalid);
                    break;
                }
                if (!mvalid) break;
                size_t ckl, cvl;
                const void *ck = gfe_cursor_key(c, &ckl), *cv = gfe_cursor_value(c, &cvl);
                const mentry *e = &m[ix].e[pos];
                if (bytes_cmp(ck, ckl, e->k, e->kl) || bytes_cmp(cv, cvl, e->v, e->vl)) {
                    bad = 1;
                    snprintf(msg, sizeof msg, "step %d: expected key '%.*s', got '%.*s'", s, (int)e->kl, (char *)e->k,
                             (int)ckl, (const char *)ck);
                }
                rc = gfe_cursor_next(c);
                pos += dir ? -1 : 1;
            }
            gfe_cursor_close(c);
            CHECK(!bad, "scan of index %d from '%.*s' dir %d: %s", ix, (int)kl, (char *)k, dir, msg);
        } else if (what < 995) {
            CHECK(gfe_checkpoint(db) == 0, "checkpoint: %s", gfe_errmsg(db));
        } else {
            CHECK(gfe_close(db) == 0, "close");
            cache = (size_t)(32 + rng_below(&r, 256)) << 10;
            db = open_db(p, cache, 0, err, sizeof err);
            CHECK(db, "reopen: %s", err);
        }
    }
    for (int i = 0; i < 3; i++) CHECK(full_compare(db, i, &m[i], msg, sizeof msg), "final scan index %d: %s", i, msg);
    CHECK(gfe_verify(db, msg, sizeof msg) == 0, "verify: %s", msg);
    gfe_close(db);
    db = open_db(p, cache, 0, err, sizeof err);
    CHECK(db, "final reopen: %s", err);
    for (int i = 0; i < 3; i++) CHECK(full_compare(db, i, &m[i], msg, sizeof msg), "after reopen index %d: %s", i, msg);
    gfe_close(db);
    for (int i = 0; i < 3; i++) model_free(&m[i]);
    gfe_batch_free(b);
    remove_db(p);
    return NULL;
fail:
    {
        char tmp[2048];
        sfmt(tmp, sizeof tmp, "%s [op %ld; replay with --seed %llu --ops %ld]", g_fail, op, (unsigned long long)seed, ops);
        sfmt(g_fail, sizeof g_fail, "%s", tmp);
    }
    if (db) gfe_close(db);
    for (int i = 0; i < 3; i++) model_free(&m[i]);
    gfe_batch_free(b);
    return g_fail;
}

static void run_model(junit *j)
{
    static const struct { const char *name; int kinds[3], comps[3]; } cases[] = {
        { "random_ops_btree", { GFE_BTREE, GFE_BTREE, GFE_BTREE }, { 0, 0, 1 } },
        { "random_ops_betree", { GFE_BETREE, GFE_BETREE, GFE_BETREE }, { 0, 2, 0 } },
        { "random_ops_mixed_compressed", { GFE_BTREE, GFE_BETREE, GFE_BETREE }, { 1, 1, 2 } },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        double t0 = now_sec();
        int kinds[3], comps[3];
        memcpy(kinds, cases[i].kinds, sizeof kinds);
        memcpy(comps, cases[i].comps, sizeof comps);
        char dbn[64];
        snprintf(dbn, sizeof dbn, "model-%zu.db", i);
        /* every case uses the run's seed, so --seed replays any failure */
        const char *f = model_run(dbn, kinds, comps, g_seed, g_ops);
        char name[128];
        snprintf(name, sizeof name, "%s_seed%llu", cases[i].name, (unsigned long long)g_seed);
        junit_add(j, name, now_sec() - t0, f);
    }
}

/* -------------------------------------------------------------- recovery */

enum { RIX_A, RIX_B, RIX_META };

/* Batch n of the recovery workload, the same in writer and checker. */
typedef void (*op_fn)(void *ctx, int ix, int del, const void *k, size_t kl, const void *v, size_t vl);
static void gen_batch(uint64_t seed, uint64_t n, op_fn fn, void *ctx)
{
    rng r;
    rng_seed(&r, seed * 1000003u + n);
    int nops = 1 + (int)rng_below(&r, 12);
    char k[32];
    unsigned char v[400];
    for (int i = 0; i < nops; i++) {
        int ix = (int)rng_below(&r, 2);
        int kn = snprintf(k, sizeof k, "r%05u", (unsigned)rng_below(&r, 2500));
        if (rng_below(&r, 10) < 3) {
            fn(ctx, ix, 1, k, (size_t)kn, NULL, 0);
        } else {
            size_t vl = 8 + (size_t)rng_below(&r, rng_below(&r, 8) == 0 ? 390 : 40);
            for (size_t x = 0; x < vl; x++) v[x] = (unsigned char)(n + x);
            put_be64(v, n);
            fn(ctx, ix, 0, k, (size_t)kn, v, vl);
        }
    }
    unsigned char nb[8];
    put_be64(nb, n);
    fn(ctx, RIX_META, 0, "batch", 5, nb, 8);
}

static void to_batch(void *ctx, int ix, int del, const void *k, size_t kl, const void *v, size_t vl)
{
    if (del) gfe_batch_del(ctx, ix, k, kl);
    else gfe_batch_put(ctx, ix, k, kl, v, vl);
}

static void to_model(void *ctx, int ix, int del, const void *k, size_t kl, const void *v, size_t vl)
{
    model *m = ctx;
    if (ix == RIX_META) return;
    if (del) model_del(&m[ix], k, kl);
    else model_put(&m[ix], k, kl, v, vl);
}

static int read_meta(gfe_db *db, uint64_t *n)
{
    void *v = NULL;
    size_t vl;
    int rc = gfe_get(db, RIX_META, "batch", 5, &v, &vl);
    *n = 0;
    if (rc == GFE_NOTFOUND) return 0;
    if (rc || vl != 8) { gfe_free(v); return -1; }
    *n = get_be64(v);
    gfe_free(v);
    return 0;
}

static int writer_main(int argc, char **argv)
{
    const char *dir = NULL;
    uint64_t seed = 1;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--dir")) dir = argv[i + 1];
        else if (!strcmp(argv[i], "--seed")) seed = strtoull(argv[i + 1], NULL, 10);
    }
    if (!dir) return 2;
    char p[1100], prog[1100], err[600];
    path_join(p, sizeof p, dir, "recovery.db");
    path_join(prog, sizeof prog, dir, "progress");
    gfe_options o;
    memset(&o, 0, sizeof o);
    o.cache_bytes = 96 << 10;
    o.checkpoint_wal_bytes = 48 << 10;
    gfe_db *db;
    if (gfe_open(p, &o, &db, err, sizeof err)) { fprintf(stderr, "writer: open: %s\n", err); return 3; }
    uint64_t n;
    if (read_meta(db, &n)) { fprintf(stderr, "writer: meta unreadable\n"); return 3; }
    port_file *pf;
    if (port_open(prog, 1, &pf)) return 3;
    uint64_t off = 0;
    gfe_batch *b = gfe_batch_new();
    /* the parent kills us within seconds; the deadline only stops an orphan
     * whose parent died (e.g. the farm's own timeout) */
    double deadline = now_sec() + 120;
    for (uint64_t j = n + 1; now_sec() < deadline; j++) {
        gfe_batch_clear(b);
        gen_batch(seed, j, to_batch, b);
        int dur = j % 3 == 0 ? GFE_DUR_SYNC : j % 3 == 1 ? GFE_DUR_GROUP : GFE_DUR_NONE;
        if (gfe_commit(db, b, dur, NULL)) { fprintf(stderr, "writer: commit: %s\n", gfe_errmsg(db)); return 3; }
        char line[32];
        int ln = snprintf(line, sizeof line, "%llu\n", (unsigned long long)j);
        if (port_pwrite(pf, line, (size_t)ln, off)) return 3;
        off += (uint64_t)ln;
    }
    gfe_batch_free(b);
    port_close(pf);
    gfe_close(db);
    return 4;
}

static uint64_t last_ack(const char *prog, uint64_t dflt)
{
    FILE *f = fopen(prog, "rb");
    if (!f) return dflt;
    char buf[64];
    uint64_t last = dflt, cur = 0;
    int have = 0;
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        for (size_t i = 0; i < n; i++) {
            if (buf[i] >= '0' && buf[i] <= '9') { cur = cur * 10 + (uint64_t)(buf[i] - '0'); have = 1; }
            else if (buf[i] == '\n' && have) { last = cur; cur = 0; have = 0; }
            else { cur = 0; have = 0; }
        }
    fclose(f);
    return last;
}

static void run_recovery(junit *j, int argc0, char **argv0)
{
    (void)argc0;
    char p[1100], prog[1100], err[600], msg[600], seedbuf[32];
    model m[2];
    memset(m, 0, sizeof m);
    path_join(p, sizeof p, g_dir, "recovery.db");
    path_join(prog, sizeof prog, g_dir, "progress");
    remove_db(p);
    double t0 = now_sec();
    gfe_db *db = open_db(p, 1 << 20, 1, err, sizeof err);
    int ok = db && mkidx(db, "a", GFE_BTREE, 1, 4096, 0) == RIX_A && mkidx(db, "b", GFE_BETREE, 2, 8192, 4) == RIX_B &&
             mkidx(db, "meta", GFE_BTREE, 0, 4096, 0) == RIX_META;
    if (db) gfe_close(db);
    junit_add(j, "setup", now_sec() - t0, ok ? NULL : "cannot create the recovery database");
    if (!ok) return;
    rng r;
    rng_seed(&r, g_seed);
    snprintf(seedbuf, sizeof seedbuf, "%llu", (unsigned long long)g_seed);
    uint64_t applied = 0;
    int failures = 0;
    for (long kill = 1; kill <= g_kills && failures < 3; kill++) {
        t0 = now_sec();
        char name[64], *fail = NULL;
        snprintf(name, sizeof name, "kill_%04ld", kill);
        if (port_exists(prog)) port_remove(prog);
        char *args[] = { argv0[0], "recovery-writer", "--dir", g_dir, "--seed", seedbuf, NULL };
        port_proc *pr;
        if (port_proc_spawn_self(6, args, writer_main, &pr)) {
            junit_add(j, name, 0, "cannot start the writer process");
            return;
        }
        unsigned mode = (unsigned)rng_below(&r, 4);
        if (mode == 0) {
            port_sleep_ms((unsigned)rng_below(&r, 6)); /* likely inside the writer's own recovery */
        } else {
            double until = now_sec() + 20;
            while (last_ack(prog, 0) == 0 && now_sec() < until) port_sleep_ms(1);
            port_sleep_ms((unsigned)rng_below(&r, 25));
        }
        port_proc_kill(pr);
        int code;
        port_proc_wait(pr, &code);
        if (code != 137 && code != 128 + 9 && code != 9) {
            snprintf(msg, sizeof msg, "writer exited with %d before it was killed", code);
            fail = msg;
        }
        uint64_t ack = last_ack(prog, applied), got = 0;
        if (!fail) {
            db = open_db(p, 256 << 10, 0, err, sizeof err);
            if (!db) {
                sfmt(msg, sizeof msg, "reopen after kill failed: %s", err);
                fail = msg;
            } else if (read_meta(db, &got)) {
                snprintf(msg, sizeof msg, "batch marker unreadable: %s", gfe_errmsg(db));
                fail = msg;
            } else if (got < ack || got > ack + 1 || got < applied) {
                snprintf(msg, sizeof msg, "recovered batch %llu but writer acknowledged %llu (previous state %llu)",
                         (unsigned long long)got, (unsigned long long)ack, (unsigned long long)applied);
                fail = msg;
            } else {
                for (uint64_t n = applied + 1; n <= got; n++) gen_batch(g_seed, n, to_model, m);
                applied = got;
                for (int i = 0; i < 2 && !fail; i++)
                    if (!full_compare(db, i, &m[i], err, sizeof err)) {
                        sfmt(msg, sizeof msg, "index %d differs from the committed state at batch %llu: %s", i,
                                 (unsigned long long)got, err);
                        fail = msg;
                    }
            }
            if (db) gfe_close(db);
        }
        if (fail) {
            char tmp[700];
            sfmt(tmp, sizeof tmp, "%s [seed %llu]", fail, (unsigned long long)g_seed);
            sfmt(msg, sizeof msg, "%s", tmp);
            failures++;
        }
        junit_add(j, name, now_sec() - t0, fail ? msg : NULL);
    }
    t0 = now_sec();
    db = open_db(p, 1 << 20, 0, err, sizeof err);
    const char *f = NULL;
    if (!db) f = err;
    else if (gfe_verify(db, msg, sizeof msg)) f = msg;
    if (db) gfe_close(db);
    char fin[64];
    snprintf(fin, sizeof fin, "final_verify_after_%llu_batches", (unsigned long long)applied);
    junit_add(j, fin, now_sec() - t0, f);
    for (int i = 0; i < 2; i++) model_free(&m[i]);
}

/* ------------------------------------------------------------------ main */

static int usage(const char *msg)
{
    fprintf(stderr, "gfe-suite: %s\nusage: gfe-suite <unit|model|recovery> --junit FILE [--dir SCRATCHDIR] [--seed N] "
                    "[--ops N] [--kills N] [--only UNIT-TEST]...\n", msg);
    return 2;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "recovery-writer") == 0) return writer_main(argc, argv);
    if (argc >= 2 && strcmp(argv[1], "lock-probe") == 0) return lock_probe_main(argc, argv);
    if (argc < 2) return usage("missing suite name");
    const char *suite = argv[1], *jpath = NULL;
    if (strcmp(suite, "unit") && strcmp(suite, "model") && strcmp(suite, "recovery")) return usage("unknown suite");
    int have_seed = 0;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (i + 1 >= argc) return usage("option needs a value");
        const char *v = argv[++i];
        char *end;
        if (!strcmp(a, "--junit")) jpath = v;
        else if (!strcmp(a, "--dir")) snprintf(g_dir, sizeof g_dir, "%s", v);
        else if (!strcmp(a, "--seed")) { g_seed = strtoull(v, &end, 10); have_seed = 1; if (*end) return usage("bad --seed"); }
        else if (!strcmp(a, "--ops")) { g_ops = strtol(v, &end, 10); if (*end || g_ops < 1) return usage("bad --ops"); }
        else if (!strcmp(a, "--kills")) { g_kills = strtol(v, &end, 10); if (*end || g_kills < 1) return usage("bad --kills"); }
        else if (!strcmp(a, "--only")) {
            if (g_n_only == MAX_ONLY) return usage("at most 16 --only");
            g_only[g_n_only++] = v;
        }
        else return usage("unknown option");
    }
    if (!jpath) return usage("--junit FILE is required");
    if (g_n_only && strcmp(suite, "unit")) return usage("--only selects unit tests: it applies to the unit suite only");
    const char *unknown = unknown_unit();
    if (unknown) {
        fprintf(stderr, "gfe-suite: no unit test named '%s'; the unit tests are:", unknown);
        for (size_t k = 0; k < sizeof units / sizeof units[0]; k++) fprintf(stderr, " %s", units[k].name);
        fprintf(stderr, "\n");
        return 2;
    }
    if (!have_seed) g_seed = (port_now_ns() ^ ((uint64_t)port_pid() << 32)) % 1000000007u;
    if (!g_dir[0]) {
        const char *t = getenv("TMPDIR");
        if (!t || !*t) t = getenv("TEMP");
        if (!t || !*t) t = port_exists("/tmp") ? "/tmp" : ".";
        char name[64];
        snprintf(name, sizeof name, "gfe-suite-%u", port_pid());
        path_join(g_dir, sizeof g_dir, t, name);
    }
    if (port_mkdir(g_dir)) return usage("cannot create the scratch directory");
    printf("gfe-suite %s: seed %llu, scratch %s\n", suite, (unsigned long long)g_seed, g_dir);
    junit j;
    junit_init(&j, suite);
    if (!strcmp(suite, "unit")) run_unit(&j);
    else if (!strcmp(suite, "model")) run_model(&j);
    else run_recovery(&j, argc, argv);
    if (junit_write(&j, jpath)) { fprintf(stderr, "gfe-suite: cannot write %s\n", jpath); return 1; }
    printf("%s: %d checks, %d failed, %.1fs\n", suite, j.n, j.failures, now_sec() - j.t0);
    int rc = j.failures ? 1 : 0;
    junit_free(&j);
    return rc;
}
