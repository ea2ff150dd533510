/* bench.c - gfe-bench: iibench (insert-heavy, secondary indexes larger than
 * the cache), oltp (sysbench-like mix over client threads) and compress
 * (log-like data at both zlib levels).  Output is JSON lines: interval
 * objects while running and one summary object whose metric names the farm
 * stores, so do not rename them. */
#include "gfe.h"
#include "port.h"
#include "util.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct opts {
    long rows, batch, interval, seconds;
    int cache_mb, kind, compress, dur, node_kb;
    uint64_t seed;
    char threads[128], dir[1024];
} opts;

static int usage(const char *m)
{
    fprintf(stderr, "gfe-bench: %s\nusage: gfe-bench <iibench|oltp|compress> --dir SCRATCHDIR [--rows N] [--cache-mb M]\n"
                    "  [--index btree|betree] [--compress 0|1|2] [--seed S] [--batch N] [--interval K]\n"
                    "  [--threads T[,T2...]] [--seconds S] [--durability none|group|sync] [--node-kb K]\n", m);
    return 2;
}

static const char *kind_s(int k) { return k == GFE_BETREE ? "betree" : "btree"; }
static const char *dur_s(int d) { return d == GFE_DUR_SYNC ? "sync" : d == GFE_DUR_GROUP ? "group" : "none"; }

static gfe_db *bench_open(const opts *o, const char *name, char *path, size_t pn)
{
    char err[600];
    path_join(path, pn, o->dir, name);
    remove_db(path);
    gfe_options go;
    memset(&go, 0, sizeof go);
    go.create = 1;
    go.cache_bytes = (size_t)o->cache_mb << 20;
    go.checkpoint_wal_bytes = 64u << 20;
    gfe_db *db;
    if (gfe_open(path, &go, &db, err, sizeof err)) {
        fprintf(stderr, "gfe-bench: open %s: %s\n", path, err);
        exit(1);
    }
    return db;
}

static int bench_index(gfe_db *db, const opts *o, const char *name, int kind, int comp)
{
    gfe_index_options io = { kind, comp, o->node_kb ? (uint32_t)o->node_kb * 1024u : 0, 0 };
    int ix = gfe_index_create(db, name, &io);
    if (ix < 0) { fprintf(stderr, "gfe-bench: index: %s\n", gfe_errmsg(db)); exit(1); }
    return ix;
}

static void die_rc(gfe_db *db, int rc, const char *what)
{
    if (rc) { fprintf(stderr, "gfe-bench: %s: %s (%s)\n", what, gfe_strerror(rc), gfe_errmsg(db)); exit(1); }
}

static uint64_t db_bytes(const char *path)
{
    char w[1100];
    snprintf(w, sizeof w, "%s-wal", path);
    uint64_t t = 0;
    port_file *f;
    if (!port_open(path, 0, &f)) { t += (uint64_t)port_size(f); port_close(f); }
    if (!port_open(w, 0, &f)) { t += (uint64_t)port_size(f); port_close(f); }
    return t;
}

/* ---------------------------------------------------------------- iibench */

static int iibench(const opts *o)
{
    char path[1100];
    gfe_db *db = bench_open(o, "iibench.db", path, sizeof path);
    int pk = bench_index(db, o, "pk", o->kind, o->compress);
    int sx[3];
    const char *sn[3] = { "by_c1", "by_c2", "by_c3" };
    for (int i = 0; i < 3; i++) sx[i] = bench_index(db, o, sn[i], o->kind, o->compress);
    rng r;
    rng_seed(&r, o->seed);
    gfe_batch *b = gfe_batch_new();
    long interval = o->interval > 0 ? o->interval : (o->rows / 20 > 0 ? o->rows / 20 : 1);
    long last10 = o->rows - o->rows / 10;
    double t0 = now_sec(), tint = t0, t10 = t0;
    /* CPU time too: on a shared or loaded host it moves far less than wall time, so the
       farm can track a rate that other tenants' load does not drown. */
    clock_t c0 = clock();
    for (long id = 1; id <= o->rows; id++) {
        unsigned char row[8 + 24 + 40], k[16];
        put_be64(row, (uint64_t)id);
        for (int c = 0; c < 3; c++) put_be64(row + 8 + 8 * c, rng_next(&r));
        for (int i = 0; i < 40; i++) row[32 + i] = (unsigned char)('a' + rng_below(&r, 26));
        gfe_batch_put(b, pk, row, 8, row + 8, sizeof row - 8);
        for (int c = 0; c < 3; c++) {
            memcpy(k, row + 8 + 8 * c, 8);
            memcpy(k + 8, row, 8);
            gfe_batch_put(b, sx[c], k, 16, "", 0);
        }
        if (id % o->batch == 0 || id == o->rows) {
            die_rc(db, gfe_commit(db, b, o->dur, NULL), "commit");
            gfe_batch_clear(b);
        }
        if (id == last10) t10 = now_sec();
        if (id % interval == 0) {
            double t = now_sec();
            printf("{\"type\":\"interval\",\"bench\":\"iibench\",\"rows\":%ld,\"seconds\":%.3f,\"interval_rate\":%.1f,"
                   "\"overall_rate\":%.1f}\n", id, t - t0, (double)interval / (t - tint), (double)id / (t - t0));
            fflush(stdout);
            tint = t;
        }
    }
    double t1 = now_sec();
    double cpu = (double)(clock() - c0) / CLOCKS_PER_SEC;
    gfe_batch_free(b);
    gfe_stats st;
    gfe_stats_get(db, &st, 0);
    die_rc(db, gfe_close(db), "close");
    uint64_t fb = db_bytes(path);
    long n10 = o->rows - last10;
    printf("{\"type\":\"summary\",\"bench\":\"iibench\",\"params\":{\"rows\":%ld,\"cache_mb\":%d,\"index\":\"%s\","
           "\"compress\":%d,\"seed\":%llu,\"batch\":%ld,\"interval\":%ld,\"durability\":\"%s\",\"node_kb\":%d,"
           "\"node_reads\":%llu,\"node_writes\":%llu,\"checkpoints\":%llu},\"metrics\":{\"insert_rate\":%.1f,\"insert_rate_last10pct\":%.1f,"
           "\"seconds\":%.3f,\"file_bytes\":%llu,\"insert_rate_cpu\":%.1f,\"cpu_seconds\":%.3f}}\n",
           o->rows, o->cache_mb, kind_s(o->kind), o->compress, (unsigned long long)o->seed, o->batch, interval,
           dur_s(o->dur), o->node_kb, (unsigned long long)st.node_reads, (unsigned long long)st.node_writes,
           (unsigned long long)st.checkpoints, (double)o->rows / (t1 - t0), n10 > 0 ? (double)n10 / (t1 - t10) : 0.0, t1 - t0, (unsigned long long)fb,
           cpu > 0 ? (double)o->rows / cpu : 0.0, cpu);
    remove_db(path);
    return 0;
}

/* ------------------------------------------------------------------- oltp */

typedef struct oltp_ctx {
    gfe_db *db;
    int pk, kx, tid, nthreads;
    long rows;
    uint64_t seed;
    double until;
    _Atomic uint64_t *done;
    double *lat;
    size_t nlat, cap;
    int err;
} oltp_ctx;

static void make_row(rng *r, unsigned char *row, uint64_t k)
{
    put_be64(row, k);
    for (int i = 0; i < 90; i++) row[8 + i] = (unsigned char)('0' + rng_below(r, 10));
}

static void oltp_thread(void *p)
{
    oltp_ctx *c = p;
    rng r;
    rng_seed(&r, c->seed * 31 + (uint64_t)c->tid);
    gfe_batch *b = gfe_batch_new();
    gfe_cursor *cur;
    if (gfe_cursor_open(c->db, c->pk, &cur)) { c->err = 1; return; }
    while (now_sec() < c->until) {
        double t0 = now_sec();
        unsigned char key[8], sk[16], row[98];
        void *v;
        size_t vl;
        for (int i = 0; i < 10; i++) {
            put_be64(key, 1 + rng_below(&r, (uint64_t)c->rows));
            if (gfe_get(c->db, c->pk, key, 8, &v, &vl) == GFE_OK) gfe_free(v);
        }
        put_be64(key, 1 + rng_below(&r, (uint64_t)c->rows));
        gfe_cursor_seek(cur, key, 8, GFE_FORWARD);
        for (int i = 0; i < 10 && gfe_cursor_valid(cur); i++) gfe_cursor_next(cur);
        /* writes touch only this thread's ids so the secondary index stays exact */
        uint64_t id = 1 + rng_below(&r, (uint64_t)c->rows);
        id -= (id - 1) % (uint64_t)c->nthreads;
        id += (uint64_t)c->tid;
        if (id > (uint64_t)c->rows) id = 1 + (uint64_t)c->tid;
        put_be64(key, id);
        gfe_batch_clear(b);
        if (gfe_get(c->db, c->pk, key, 8, &v, &vl) == GFE_OK) {
            if (vl >= 8) {
                memcpy(sk, v, 8);
                memcpy(sk + 8, key, 8);
                gfe_batch_del(b, c->kx, sk, 16);
            }
            gfe_free(v);
        }
        uint64_t nk = rng_below(&r, (uint64_t)c->rows);
        make_row(&r, row, nk);
        gfe_batch_put(b, c->pk, key, 8, row, sizeof row);
        put_be64(sk, nk);
        memcpy(sk + 8, key, 8);
        gfe_batch_put(b, c->kx, sk, 16, "", 0);
        if (gfe_commit(c->db, b, GFE_DUR_GROUP, NULL)) { c->err = 1; break; }
        /* delete + insert of another own row */
        gfe_batch_clear(b);
        gfe_batch_del(b, c->pk, key, 8);
        gfe_batch_put(b, c->pk, key, 8, row, sizeof row);
        if (gfe_commit(c->db, b, GFE_DUR_GROUP, NULL)) { c->err = 1; break; }
        double dt = now_sec() - t0;
        if (c->nlat == c->cap) {
            c->cap = c->cap ? c->cap * 2 : 4096;
            c->lat = realloc(c->lat, c->cap * sizeof *c->lat);
            if (!c->lat) { c->err = 1; break; }
        }
        c->lat[c->nlat++] = dt;
        atomic_fetch_add(c->done, 1);
    }
    gfe_cursor_close(cur);
    gfe_batch_free(b);
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int oltp(const opts *o)
{
    char path[1100];
    gfe_db *db = bench_open(o, "oltp.db", path, sizeof path);
    int pk = bench_index(db, o, "sbtest", o->kind, o->compress);
    int kx = bench_index(db, o, "k_idx", o->kind, o->compress);
    rng r;
    rng_seed(&r, o->seed);
    gfe_batch *b = gfe_batch_new();
    double tp = now_sec();
    for (long id = 1; id <= o->rows; id++) {
        unsigned char key[8], row[98], sk[16];
        put_be64(key, (uint64_t)id);
        uint64_t k = rng_below(&r, (uint64_t)o->rows);
        make_row(&r, row, k);
        gfe_batch_put(b, pk, key, 8, row, sizeof row);
        put_be64(sk, k);
        memcpy(sk + 8, key, 8);
        gfe_batch_put(b, kx, sk, 16, "", 0);
        if (id % 1000 == 0 || id == o->rows) {
            die_rc(db, gfe_commit(db, b, GFE_DUR_NONE, NULL), "prepare");
            gfe_batch_clear(b);
        }
    }
    gfe_batch_free(b);
    die_rc(db, gfe_checkpoint(db), "checkpoint");
    printf("{\"type\":\"interval\",\"bench\":\"oltp\",\"phase\":\"prepare\",\"rows\":%ld,\"seconds\":%.3f}\n", o->rows,
           now_sec() - tp);
    char metrics[4096];
    size_t ml = 0;
    double last_tps = 0;
    int nt_list[32], nts = 0;
    char tl[128];
    snprintf(tl, sizeof tl, "%s", o->threads);
    for (char *s = tl; *s && nts < 32;) {
        nt_list[nts++] = atoi(s);
        char *c = strchr(s, ',');
        if (!c) break;
        s = c + 1;
    }
    for (int ti = 0; ti < nts; ti++) {
        int T = nt_list[ti];
        if (T < 1 || T > 256) return usage("bad --threads");
        _Atomic uint64_t done = 0;
        oltp_ctx *ctx = calloc((size_t)T, sizeof *ctx);
        port_thread **th = calloc((size_t)T, sizeof *th);
        double start = now_sec();
        for (int i = 0; i < T; i++) {
            ctx[i] = (oltp_ctx){ db, pk, kx, i, T, o->rows, o->seed, start + (double)o->seconds, &done, NULL, 0, 0, 0 };
            if (port_thread_start(&th[i], oltp_thread, &ctx[i])) { fprintf(stderr, "thread start failed\n"); return 1; }
        }
        uint64_t prev = 0;
        for (long sec = 1; sec <= o->seconds; sec++) {
            double wake = start + (double)sec;
            while (now_sec() < wake) port_sleep_ms(10);
            uint64_t d = atomic_load(&done);
            printf("{\"type\":\"interval\",\"bench\":\"oltp\",\"threads\":%d,\"second\":%ld,\"tps\":%.1f}\n", T, sec,
                   (double)(d - prev));
            fflush(stdout);
            prev = d;
        }
        size_t total = 0;
        int err = 0;
        for (int i = 0; i < T; i++) { port_thread_join(th[i]); total += ctx[i].nlat; err |= ctx[i].err; }
        double el = now_sec() - start;
        if (err) { fprintf(stderr, "gfe-bench: oltp worker error: %s\n", gfe_errmsg(db)); return 1; }
        double *all = malloc((total + 1) * sizeof *all);
        size_t n = 0;
        for (int i = 0; i < T; i++) {
            memcpy(all + n, ctx[i].lat, ctx[i].nlat * sizeof *all);
            n += ctx[i].nlat;
            free(ctx[i].lat);
        }
        qsort(all, n, sizeof *all, cmp_d);
        double p95 = n ? all[(size_t)((double)(n - 1) * 0.95)] * 1000 : 0, p99 = n ? all[(size_t)((double)(n - 1) * 0.99)] * 1000 : 0;
        last_tps = (double)n / el;
        ml += (size_t)snprintf(metrics + ml, sizeof metrics - ml, "\"tps_t%d\":%.1f,\"p95_ms_t%d\":%.3f,\"p99_ms_t%d\":%.3f,",
                               T, last_tps, T, p95, T, p99);
        free(all);
        free(ctx);
        free(th);
    }
    die_rc(db, gfe_close(db), "close");
    printf("{\"type\":\"summary\",\"bench\":\"oltp\",\"params\":{\"rows\":%ld,\"threads\":\"%s\",\"seconds\":%ld,"
           "\"cache_mb\":%d,\"index\":\"%s\",\"compress\":%d,\"seed\":%llu},\"metrics\":{%s\"tps\":%.1f}}\n",
           o->rows, o->threads, o->seconds, o->cache_mb, kind_s(o->kind), o->compress, (unsigned long long)o->seed,
           metrics, last_tps);
    remove_db(path);
    return 0;
}

/* --------------------------------------------------------------- compress */

static int compress_bench(const opts *o)
{
    static const char *jobs[] = { "nightly-build", "unit-tests", "model-tests", "recovery-tests", "iibench", "oltp",
                                  "compress", "fuzz-engine", "package", "upload-artifacts" };
    static const char *targets[] = { "linux-x86_64", "linux-i686", "linux-aarch64", "windows-x86_64" };
    double ratio[3] = { 0 }, rate[3] = { 0 };
    uint64_t bytes[3] = { 0 };
    for (int level = 1; level <= 2; level++) {
        char path[1100], name[32];
        snprintf(name, sizeof name, "compress-%d.db", level);
        gfe_db *db = bench_open(o, name, path, sizeof path);
        /* bigger nodes give zlib more context; default 64 KiB here */
        opts lo = *o;
        if (!lo.node_kb) lo.node_kb = 64;
        int ix = bench_index(db, &lo, "log", GFE_BTREE, level);
        rng r;
        rng_seed(&r, o->seed);
        gfe_batch *b = gfe_batch_new();
        uint64_t ts = 1795000000000ull;
        double t0 = now_sec();
        for (long i = 0; i < o->rows; i++) {
            unsigned char key[12];
            char v[256];
            ts += 1 + rng_below(&r, 5000);
            put_be64(key, ts);
            key[8] = (unsigned char)(i >> 24); key[9] = (unsigned char)(i >> 16);
            key[10] = (unsigned char)(i >> 8); key[11] = (unsigned char)i;
            unsigned j = (unsigned)rng_below(&r, 10), t = (unsigned)rng_below(&r, 4);
            int n = snprintf(v, sizeof v,
                             "name=%s target=%s start=%llu.%03u duration_ms=%llu rows=%llu status=%s worker=gearman-w%02u",
                             jobs[j], targets[t], (unsigned long long)(ts / 1000), (unsigned)(ts % 1000),
                             (unsigned long long)(100 + rng_below(&r, 100000)), (unsigned long long)rng_below(&r, 1000000),
                             rng_below(&r, 20) ? "ok" : "failed", (unsigned)rng_below(&r, 16));
            gfe_batch_put(b, ix, key, sizeof key, v, (size_t)n);
            if (gfe_batch_count(b) >= 500) {
                die_rc(db, gfe_commit(db, b, GFE_DUR_NONE, NULL), "commit");
                gfe_batch_clear(b);
            }
        }
        die_rc(db, gfe_commit(db, b, GFE_DUR_NONE, NULL), "commit");
        die_rc(db, gfe_checkpoint(db), "checkpoint");
        double el = now_sec() - t0;
        gfe_batch_free(b);
        gfe_stats st;
        die_rc(db, gfe_stats_get(db, &st, 1), "stats");
        ratio[level] = st.idx[0].stored_bytes ? (double)st.idx[0].raw_bytes / (double)st.idx[0].stored_bytes : 1.0;
        rate[level] = (double)o->rows / el;
        die_rc(db, gfe_close(db), "close");
        bytes[level] = db_bytes(path);
        printf("{\"type\":\"interval\",\"bench\":\"compress\",\"level\":\"%s\",\"rows\":%ld,\"seconds\":%.3f,"
               "\"ratio\":%.3f,\"bytes\":%llu,\"raw_bytes\":%llu}\n",
               level == 1 ? "standard" : "aggressive", o->rows, el, ratio[level], (unsigned long long)bytes[level],
               (unsigned long long)st.idx[0].raw_bytes);
        fflush(stdout);
        if (!getenv("GFE_BENCH_KEEP")) remove_db(path);
    }
    printf("{\"type\":\"summary\",\"bench\":\"compress\",\"params\":{\"rows\":%ld,\"seed\":%llu},\"metrics\":{"
           "\"ratio_standard\":%.3f,\"ratio_aggressive\":%.3f,\"load_rate_standard\":%.1f,\"load_rate_aggressive\":%.1f,"
           "\"bytes_standard\":%llu,\"bytes_aggressive\":%llu}}\n",
           o->rows, (unsigned long long)o->seed, ratio[1], ratio[2], rate[1], rate[2], (unsigned long long)bytes[1],
           (unsigned long long)bytes[2]);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) return usage("missing benchmark name");
    const char *which = argv[1];
    int bi = !strcmp(which, "iibench") ? 1 : !strcmp(which, "oltp") ? 2 : !strcmp(which, "compress") ? 3 : 0;
    if (!bi) return usage("unknown benchmark");
    opts o;
    memset(&o, 0, sizeof o);
    o.rows = bi == 1 ? 100000 : bi == 2 ? 10000 : 50000;
    o.batch = 100;
    o.seconds = 3;
    o.cache_mb = bi == 2 ? 16 : 4;
    o.kind = GFE_BETREE;
    o.dur = GFE_DUR_NONE;
    o.seed = 42;
    snprintf(o.threads, sizeof o.threads, "1,2,4");
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (i + 1 >= argc) return usage("option needs a value");
        const char *v = argv[++i];
        char *end = NULL;
        long n = strtol(v, &end, 10);
        int num = end && *end == 0;
        if (!strcmp(a, "--dir")) snprintf(o.dir, sizeof o.dir, "%s", v);
        else if (!strcmp(a, "--rows") && num && n > 0) o.rows = n;
        else if (!strcmp(a, "--cache-mb") && num && n > 0) o.cache_mb = (int)n;
        else if (!strcmp(a, "--index") && (!strcmp(v, "btree") || !strcmp(v, "betree"))) o.kind = !strcmp(v, "btree") ? GFE_BTREE : GFE_BETREE;
        else if (!strcmp(a, "--compress") && num && n >= 0 && n <= 2) o.compress = (int)n;
        else if (!strcmp(a, "--seed") && num) o.seed = (uint64_t)n;
        else if (!strcmp(a, "--batch") && num && n > 0) o.batch = n;
        else if (!strcmp(a, "--interval") && num && n > 0) o.interval = n;
        else if (!strcmp(a, "--seconds") && num && n > 0) o.seconds = n;
        else if (!strcmp(a, "--node-kb") && num && n >= 4 && n <= 4096) o.node_kb = (int)n;
        else if (!strcmp(a, "--threads") && strlen(v) < sizeof o.threads) snprintf(o.threads, sizeof o.threads, "%s", v);
        else if (!strcmp(a, "--durability") && (!strcmp(v, "none") || !strcmp(v, "group") || !strcmp(v, "sync")))
            o.dur = !strcmp(v, "sync") ? GFE_DUR_SYNC : !strcmp(v, "group") ? GFE_DUR_GROUP : GFE_DUR_NONE;
        else {
            char m[200];
            snprintf(m, sizeof m, "bad option %s %s", a, v);
            return usage(m);
        }
    }
    if (!o.dir[0]) return usage("--dir SCRATCHDIR is required");
    if (port_mkdir(o.dir)) return usage("cannot create --dir");
    if (bi == 1) return iibench(&o);
    if (bi == 2) return oltp(&o);
    return compress_bench(&o);
}
