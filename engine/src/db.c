/* db.c - the database handle: file layout, block allocation, the
 * write-ahead log, checkpoints, recovery, batches, cursors and stats.
 *
 * Crash safety works by never overwriting anything the last checkpoint can
 * reach: every node write goes to a free extent (copy-on-write), and a
 * checkpoint flips between two header slots only after the new nodes are
 * synced.  Batches are redo-logged before they are applied in memory; after
 * a crash the newest valid header plus a replay of the log's later records
 * rebuilds exactly the committed batches, and no page can be torn because
 * no live page was being written. */
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

struct gfe_batch {
    unsigned char *buf;
    size_t len, cap;
    uint32_t n;
};

struct gfe_cursor {
    gfe_db *db;
    int idx, dir, valid;
    item **items;
    uint32_t n, pos;
    item *resume;
    int rmode, has_resume;
};

int db_fail(gfe_db *db, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(db->err, sizeof db->err, fmt, ap);
    va_end(ap);
    return rc;
}

const char *gfe_strerror(int rc)
{
    switch (rc) {
    case GFE_OK: return "ok";
    case GFE_NOTFOUND: return "not found";
    case GFE_EINVAL: return "invalid argument";
    case GFE_EIO: return "I/O error";
    case GFE_ECORRUPT: return "corrupt database";
    case GFE_ENOMEM: return "out of memory";
    case GFE_EEXIST: return "already exists";
    case GFE_ENOINDEX: return "no such index";
    default: return "unknown error";
    }
}

const char *gfe_errmsg(gfe_db *db) { return db->err; }
void gfe_free(void *p) { free(p); }

/* ---- block bitmaps ---- */

static int bm_reserve(gfe_db *db, uint64_t nblocks)
{
    uint64_t words = (nblocks + 63) / 64;
    if (words <= db->bm_words) return 0;
    uint64_t nw = db->bm_words ? db->bm_words : 64;
    while (nw < words) nw *= 2;
    uint64_t *a = realloc(db->bm_now, nw * 8), *b;
    if (!a) return -1;
    db->bm_now = a;
    b = realloc(db->bm_ckpt, nw * 8);
    if (!b) return -1;
    db->bm_ckpt = b;
    memset(a + db->bm_words, 0, (nw - db->bm_words) * 8);
    memset(b + db->bm_words, 0, (nw - db->bm_words) * 8);
    db->bm_words = nw;
    return 0;
}

static int bit(const uint64_t *bm, uint64_t b) { return (int)(bm[b >> 6] >> (b & 63)) & 1; }
static void bits_set(uint64_t *bm, uint64_t b, uint64_t n) { for (uint64_t i = b; i < b + n; i++) bm[i >> 6] |= 1ull << (i & 63); }
static void bits_clear(uint64_t *bm, uint64_t b, uint64_t n) { for (uint64_t i = b; i < b + n; i++) bm[i >> 6] &= ~(1ull << (i & 63)); }

static int used(const gfe_db *db, uint64_t b) { return bit(db->bm_now, b) | bit(db->bm_ckpt, b); }

/* Lowest-address first fit, so live data stays packed at the front and a
 * checkpoint can truncate the free tail.  Per-size hints keep repeated
 * scans over small holes from making allocation quadratic. */
static void hints_lower(gfe_db *db, uint64_t b)
{
    for (int i = 0; i <= 64; i++)
        if (db->hint[i] > b) db->hint[i] = b;
}

static uint64_t alloc_extent(gfe_db *db, uint32_t n)
{
    int hi = n > 64 ? 64 : (int)n;
    uint64_t b = db->hint[hi] < 2 ? 2 : db->hint[hi];
    while (b + n <= db->nblocks) {
        if ((b & 63) == 0 && (db->bm_now[b >> 6] | db->bm_ckpt[b >> 6]) == ~0ull) { b += 64; continue; }
        if (used(db, b)) { b++; continue; }
        uint32_t k = 1;
        while (k < n && !used(db, b + k)) k++;
        if (k == n) {
            bits_set(db->bm_now, b, n);
            if (n <= 64) db->hint[hi] = b + n;
            return b;
        }
        b += k + 1;
    }
    if (bm_reserve(db, db->nblocks + n)) return 0;
    b = db->nblocks;
    db->nblocks += n;
    bits_set(db->bm_now, b, n);
    if (n <= 64) db->hint[hi] = db->nblocks;
    return b;
}

static int grow(unsigned char **buf, size_t *cap, size_t want)
{
    if (want <= *cap) return 0;
    size_t c = *cap ? *cap : 65536;
    while (c < want) c *= 2;
    unsigned char *p = realloc(*buf, c);
    if (!p) return -1;
    *buf = p;
    *cap = c;
    return 0;
}

/* ---- node I/O ---- */

static int read_extent(gfe_db *db, uint64_t blk, uint32_t nblk, const char *what)
{
    char e[128];
    size_t len = (size_t)nblk * BLOCK;
    if (grow(&db->iobuf, &db->iocap, len)) return db_fail(db, GFE_ENOMEM, "out of memory");
    long got = port_pread(db->f, db->iobuf, len, blk * BLOCK);
    if (got < 0) return db_fail(db, GFE_EIO, "%s: %s page %llu: read failed: %s", db->path, what,
                                (unsigned long long)blk, port_errstr(e, sizeof e));
    if ((size_t)got != len)
        return db_fail(db, GFE_ECORRUPT, "%s: %s page %llu: file ends inside the node (truncated file)", db->path,
                       what, (unsigned long long)blk);
    db->st.node_reads++;
    db->st.bytes_read += len;
    return GFE_OK;
}

static node *decode_extent(gfe_db *db, tree *t, uint64_t blk, uint32_t nblk, uint32_t *raw, uint32_t *stored)
{
    char e[256];
    node *n = node_decode(db->iobuf, (size_t)nblk * BLOCK, blk, (uint32_t)t->id, db->nblocks, e, sizeof e, raw,
                          stored);
    if (!n) {
        db_fail(db, GFE_ECORRUPT, "%s: index '%s': %s [node extent: pages %llu-%llu]", db->path, t->name, e,
                (unsigned long long)blk, (unsigned long long)(blk + nblk - 1));
        return NULL;
    }
    n->t = t;
    n->blk = blk;
    n->nblk = nblk;
    return n;
}

int db_read_node(gfe_db *db, tree *t, uint64_t blk, uint32_t nblk, node **out)
{
    int rc = read_extent(db, blk, nblk, t->name);
    if (rc) return rc;
    node *n = decode_extent(db, t, blk, nblk, NULL, NULL);
    if (!n) return GFE_ECORRUPT;
    *out = n;
    return GFE_OK;
}

int db_write_node(gfe_db *db, node *n)
{
    char e[128];
    tree *t = n->t;
    if (grow(&db->zbuf, &db->zcap, n->bytes + 64)) return db_fail(db, GFE_ENOMEM, "out of memory");
    size_t raw = node_encode_raw(n, db->zbuf);
    if (raw > MAX_RAW) return db_fail(db, GFE_EINVAL, "index '%s': node of %zu bytes is too large", t->name, raw);
    size_t bound = compressBound((uLong)raw);
    if (grow(&db->iobuf, &db->iocap, NODE_HDR + bound + raw + BLOCK)) return db_fail(db, GFE_ENOMEM, "out of memory");
    unsigned char *o = db->iobuf;
    uint32_t stored = 0;
    int comp = 0;
    if (t->compress && raw > 64) {
        uLongf dl = (uLongf)bound;
        int level = t->compress == GFE_COMPRESS_AGGRESSIVE ? Z_BEST_COMPRESSION : Z_BEST_SPEED;
        if (compress2(o + NODE_HDR, &dl, db->zbuf, (uLong)raw, level) == Z_OK && dl < raw) {
            stored = (uint32_t)dl;
            comp = 1;
        }
    }
    if (!comp) {
        memcpy(o + NODE_HDR, db->zbuf, raw);
        stored = (uint32_t)raw;
    }
    uint32_t nblk = (uint32_t)((NODE_HDR + stored + BLOCK - 1) / BLOCK);
    uint64_t blk = alloc_extent(db, nblk);
    if (!blk) return db_fail(db, GFE_ENOMEM, "out of memory");
    put32(o, NODE_MAGIC);
    o[8] = n->leaf ? 1 : 2;
    o[9] = (unsigned char)comp;
    o[10] = n->level;
    o[11] = 0;
    put32(o + 12, (uint32_t)t->id);
    put32(o + 16, stored);
    put32(o + 20, (uint32_t)raw);
    put32(o + 24, n->leaf ? n->n : n->nk);
    put32(o + 28, (uint32_t)blk);
    put32(o + 4, crc32_buf(o + 8, NODE_HDR - 8 + (size_t)stored));
    memset(o + NODE_HDR + stored, 0, (size_t)nblk * BLOCK - NODE_HDR - stored);
    if (port_pwrite(db->f, o, (size_t)nblk * BLOCK, blk * BLOCK))
        return db_fail(db, GFE_EIO, "%s: write of page %llu failed: %s", db->path, (unsigned long long)blk,
                       port_errstr(e, sizeof e));
    if (n->blk) {
        bits_clear(db->bm_now, n->blk, n->nblk);
        if (bit(db->bm_ckpt, n->blk)) db->pending_free += n->nblk;
        else hints_lower(db, n->blk);
    }
    n->blk = blk;
    n->nblk = nblk;
    n->dirty = 0;
    if (n->parent) {
        node *p = n->parent;
        for (uint32_t i = 0; i < p->nk; i++)
            if (p->kids[i].ptr == n) {
                p->kids[i].blk = blk;
                p->kids[i].nblk = nblk;
                break;
            }
        p->dirty = 1;
    }
    db->st.node_writes++;
    db->st.bytes_written += (uint64_t)nblk * BLOCK;
    return GFE_OK;
}

/* ---- tree walk: open-time allocation map, verification, deep stats ---- */

typedef struct walkctx {
    uint64_t *bm;
    int read_leaves;
    gfe_index_stats *st;
} walkctx;

static int in_bounds(const item *x, const item *lo, const item *hi)
{
    if (lo && key_cmp(x->d, x->klen, lo->d, lo->klen) < 0) return 0;
    if (hi && key_cmp(x->d, x->klen, hi->d, hi->klen) >= 0) return 0;
    return 1;
}

static int walk(gfe_db *db, walkctx *w, tree *t, uint64_t blk, uint32_t nblk, int level, const item *lo,
                const item *hi)
{
    if (blk < 2 || nblk < 1 || blk + nblk > db->nblocks)
        return db_fail(db, GFE_ECORRUPT, "%s: index '%s': pointer to page %llu+%u outside the file (%llu pages)",
                       db->path, t->name, (unsigned long long)blk, nblk, (unsigned long long)db->nblocks);
    for (uint64_t b = blk; b < blk + nblk; b++)
        if (bit(w->bm, b))
            return db_fail(db, GFE_ECORRUPT, "%s: index '%s': page %llu is referenced twice", db->path, t->name,
                           (unsigned long long)b);
    bits_set(w->bm, blk, nblk);
    if (w->st) w->st->disk_bytes += (uint64_t)nblk * BLOCK;
    if (level == 0 && !w->read_leaves) return GFE_OK;
    int rc = read_extent(db, blk, nblk, t->name);
    if (rc) return rc;
    uint32_t raw, stored;
    node *n = decode_extent(db, t, blk, nblk, &raw, &stored);
    if (!n) return GFE_ECORRUPT;
    if (level >= 0 && n->level != level) {
        rc = db_fail(db, GFE_ECORRUPT, "%s: index '%s': page %llu has level %u, expected %d", db->path, t->name,
                     (unsigned long long)blk, n->level, level);
        goto out;
    }
    for (uint32_t i = 0; i < n->n; i++)
        if (!in_bounds(n->it[i], lo, hi)) {
            rc = db_fail(db, GFE_ECORRUPT, "%s: index '%s': page %llu: key %u lies outside the range its parent assigns",
                         db->path, t->name, (unsigned long long)blk, i);
            goto out;
        }
    for (uint32_t i = 0; i + 1 < n->nk; i++)
        if (!in_bounds(n->piv[i], lo, hi)) {
            rc = db_fail(db, GFE_ECORRUPT, "%s: index '%s': page %llu: pivot %u outside its range", db->path,
                         t->name, (unsigned long long)blk, i);
            goto out;
        }
    if (w->st) {
        gfe_index_stats *s = w->st;
        s->nodes++;
        if (n->leaf) { s->leaves++; s->entries += n->n; } else s->messages += n->n;
        s->raw_bytes += raw + NODE_HDR;
        s->stored_bytes += stored + NODE_HDR;
        if (n->level + 1 > s->depth) s->depth = n->level + 1;
    }
    for (uint32_t i = 0; i < n->nk; i++) {
        rc = walk(db, w, t, n->kids[i].blk, n->kids[i].nblk, n->level - 1, i ? n->piv[i - 1] : lo,
                  i + 1 < n->nk ? n->piv[i] : hi);
        if (rc) break;
    }
out:
    node_free_mem(n);
    return rc;
}

/* ---- header, log, checkpoint ---- */

static int wal_reset(gfe_db *db)
{
    char e[128];
    unsigned char h[WAL_FILE_HDR];
    memset(h, 0, sizeof h);
    put32(h, WALH_MAGIC);
    put32(h + 4, 1);
    put64(h + 8, db->gen);
    put64(h + 16, db->seq);
    put32(h + 24, crc32_buf(h, 24));
    if (port_truncate(db->wal, 0) || port_pwrite(db->wal, h, sizeof h, 0))
        return db_fail(db, GFE_EIO, "%s: log reset failed: %s", db->walpath, port_errstr(e, sizeof e));
    db->wal_off = WAL_FILE_HDR;
    port_lock(db->wmu);
    db->wal_synced = db->wal_total;
    port_unlock(db->wmu);
    return GFE_OK;
}

static int checkpoint_locked(gfe_db *db)
{
    char e[128];
    int rc;
    if (db->broken) return db_fail(db, GFE_EIO, "database is unusable after an earlier error: %s", db->err);
    for (int i = 0; i < db->ntrees; i++)
        if ((rc = tree_write_dirty(db->trees[i]))) { db->broken = 1; return rc; }
    if (port_sync(db->f)) goto ioerr;
    /* the file can shrink to the last live block once the new header is
     * durable; the header already records the smaller size */
    uint64_t keep = db->nblocks;
    while (keep > 2 && !bit(db->bm_now, keep - 1)) keep--;
    hdr h;
    memset(&h, 0, sizeof h);
    h.gen = db->gen + 1;
    h.seq = db->seq;
    h.nblocks = keep;
    h.nidx = (uint32_t)db->ntrees;
    for (int i = 0; i < db->ntrees; i++) {
        tree *t = db->trees[i];
        hdr_index *x = &h.idx[i];
        snprintf(x->name, sizeof x->name, "%s", t->name);
        x->kind = t->kind;
        x->compress = t->compress;
        x->node_size = t->node_size;
        x->fanout = t->fanout;
        x->root_blk = t->root->blk;
        x->root_nblk = t->root->nblk;
    }
    unsigned char buf[BLOCK];
    hdr_encode(&h, buf);
    if (port_pwrite(db->f, buf, BLOCK, (h.gen & 1) * BLOCK) || port_sync(db->f)) goto ioerr;
    db->gen = h.gen;
    db->ckpt_seq = h.seq;
    memcpy(db->bm_ckpt, db->bm_now, db->bm_words * 8);
    db->pending_free = 0;
    hints_lower(db, 2);
    if (keep < db->nblocks) {
        db->nblocks = keep;
        if (port_truncate(db->f, keep * BLOCK)) goto ioerr;
    }
    db->st.checkpoints++;
    return wal_reset(db);
ioerr:
    db->broken = 1;
    return db_fail(db, GFE_EIO, "%s: checkpoint failed: %s", db->path, port_errstr(e, sizeof e));
}

int gfe_checkpoint(gfe_db *db)
{
    port_lock(db->mu);
    int rc = checkpoint_locked(db);
    port_unlock(db->mu);
    return rc;
}

static tree *tree_new(gfe_db *db, int id, const char *name, int kind, int compress, uint32_t ns, uint32_t fanout)
{
    tree *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->db = db;
    t->id = id;
    snprintf(t->name, sizeof t->name, "%s", name);
    t->kind = kind;
    t->compress = compress;
    t->node_size = ns;
    t->fanout = fanout;
    return t;
}

static int apply_ops(gfe_db *db, const wal_op *ops, uint32_t nops)
{
    for (uint32_t i = 0; i < nops; i++) {
        int rc = tree_apply(db->trees[ops[i].idx], ops[i].k, ops[i].kl, ops[i].v, ops[i].vl, ops[i].type);
        if (rc) return rc;
    }
    return GFE_OK;
}

static int check_ops(gfe_db *db, const wal_op *ops, uint32_t nops)
{
    for (uint32_t i = 0; i < nops; i++) {
        if ((int)ops[i].idx >= db->ntrees) return db_fail(db, GFE_ENOINDEX, "operation %u: no index %u", i, ops[i].idx);
        tree *t = db->trees[ops[i].idx];
        if ((size_t)ops[i].kl + ops[i].vl + 16 > t->node_size / 4)
            return db_fail(db, GFE_EINVAL, "operation %u: key+value of %u bytes exceeds the limit %u of index '%s'",
                           i, ops[i].kl + ops[i].vl, t->node_size / 4 - 16, t->name);
    }
    return GFE_OK;
}

static int valid_record_after(const unsigned char *buf, size_t from, size_t size)
{
    char e[64];
    for (size_t p = from; p + WAL_REC_HDR <= size; p++) {
        if (get32(buf + p) != WAL_MAGIC) continue;
        uint64_t seq;
        wal_op *ops;
        uint32_t nops;
        if (wal_decode(buf + p, size - p, &seq, &ops, &nops, e, sizeof e) > 0) {
            free(ops);
            return 1;
        }
    }
    return 0;
}

static int recover_wal(gfe_db *db, int *need_ckpt)
{
    char e[256];
    int64_t size = port_size(db->wal);
    if (size < 0) return db_fail(db, GFE_EIO, "%s: %s", db->walpath, port_errstr(e, sizeof e));
    if (size < (int64_t)WAL_FILE_HDR) { *need_ckpt = 1; return GFE_OK; } /* new, or torn during a reset */
    unsigned char *buf = malloc((size_t)size);
    if (!buf) return db_fail(db, GFE_ENOMEM, "out of memory reading the log");
    int rc = GFE_OK;
    if (port_pread(db->wal, buf, (size_t)size, 0) != (long)size) {
        rc = db_fail(db, GFE_EIO, "%s: read failed", db->walpath);
        goto out;
    }
    if (get32(buf) != WALH_MAGIC || get32(buf + 24) != crc32_buf(buf, 24)) {
        rc = db_fail(db, GFE_ECORRUPT, "%s: log header is corrupt (bad magic or checksum)", db->walpath);
        goto out;
    }
    uint64_t wgen = get64(buf + 8);
    if (wgen > db->gen) {
        rc = db_fail(db, GFE_ECORRUPT,
                     "%s: log follows checkpoint generation %llu but the newest valid header is generation %llu: "
                     "the current header slot is corrupt",
                     db->path, (unsigned long long)wgen, (unsigned long long)db->gen);
        goto out;
    }
    if (wgen != db->gen) *need_ckpt = 1;
    size_t off = WAL_FILE_HDR;
    while (off < (size_t)size) {
        uint64_t seq = 0;
        wal_op *ops;
        uint32_t nops = 0;
        long len = wal_decode(buf + off, (size_t)size - off, &seq, &ops, &nops, e, sizeof e);
        if (len <= 0) {
            /* A crash can only tear the last record.  If an intact record
             * follows, this one was damaged later: refuse to drop data. */
            if (valid_record_after(buf, off + 1, (size_t)size)) {
                rc = db_fail(db, GFE_ECORRUPT, "%s: record at offset %zu: %s, yet intact records follow it: the log is corrupt",
                             db->walpath, off, len == 0 ? "length runs past the end of the file" : e);
                goto out;
            }
            *need_ckpt = 1; /* torn tail: that batch never committed */
            break;
        }
        if (seq > db->ckpt_seq) {
            if (seq != db->seq + 1) {
                free(ops);
                rc = db_fail(db, GFE_ECORRUPT, "%s: record at offset %zu has batch %llu, expected %llu (log records missing)",
                             db->walpath, off, (unsigned long long)seq, (unsigned long long)(db->seq + 1));
                goto out;
            }
            if ((rc = check_ops(db, ops, nops)) != GFE_OK) {
                free(ops);
                rc = db_fail(db, GFE_ECORRUPT, "%s: record at offset %zu: %s", db->walpath, off, db->err);
                goto out;
            }
            rc = apply_ops(db, ops, nops);
            free(ops);
            if (rc) goto out;
            db->seq = seq;
            *need_ckpt = 1;
            cache_evict(db);
        } else {
            free(ops);
        }
        off += (size_t)len;
    }
    db->wal_off = off;
out:
    free(buf);
    return rc;
}

static void db_free(gfe_db *db)
{
    for (int i = 0; i < db->ntrees; i++) {
        cache_drop_tree(db->trees[i]);
        free(db->trees[i]);
    }
    port_close(db->f);
    port_close(db->wal);
    port_mutex_free(db->mu);
    port_mutex_free(db->wmu);
    port_cond_free(db->wcv);
    free(db->bm_now);
    free(db->bm_ckpt);
    free(db->iobuf);
    free(db->zbuf);
    free(db->path);
    free(db->walpath);
    free(db);
}

int gfe_open(const char *path, const gfe_options *opt, gfe_db **out, char *err, size_t errlen)
{
    gfe_options dflt;
    char e[256], e0[200], e1[200];
    int rc = GFE_OK;
    if (!opt) { memset(&dflt, 0, sizeof dflt); opt = &dflt; }
    *out = NULL;
    gfe_db *db = calloc(1, sizeof *db);
    if (!db) { snprintf(err, errlen, "out of memory"); return GFE_ENOMEM; }
    size_t pl = strlen(path);
    db->path = malloc(pl + 1);
    db->walpath = malloc(pl + 5);
    db->mu = port_mutex_new();
    db->wmu = port_mutex_new();
    db->wcv = port_cond_new();
    if (!db->path || !db->walpath || !db->mu || !db->wmu || !db->wcv) { rc = db_fail(db, GFE_ENOMEM, "out of memory"); goto fail; }
    memcpy(db->path, path, pl + 1);
    memcpy(db->walpath, path, pl);
    memcpy(db->walpath + pl, "-wal", 5);
    db->cache_cap = opt->cache_bytes ? opt->cache_bytes : 8u << 20;
    db->wal_limit = opt->checkpoint_wal_bytes ? opt->checkpoint_wal_bytes : 32u << 20;
    db->st.cache_bytes = db->cache_cap;
    if (!opt->create && !port_exists(path)) { rc = db_fail(db, GFE_EIO, "%s: no such database file", path); goto fail; }
    if (port_open(path, opt->create, &db->f)) {
        rc = db_fail(db, GFE_EIO, "%s: cannot open: %s", path, port_errstr(e, sizeof e));
        goto fail;
    }
    if (port_trylock(db->f)) {
        rc = db_fail(db, GFE_EIO, "%s: database is in use by another process", path);
        goto fail;
    }
    if (port_open(db->walpath, 1, &db->wal)) {
        rc = db_fail(db, GFE_EIO, "%s: cannot open: %s", db->walpath, port_errstr(e, sizeof e));
        goto fail;
    }
    int64_t size = port_size(db->f);
    if (size < 0) { rc = db_fail(db, GFE_EIO, "%s: %s", path, port_errstr(e, sizeof e)); goto fail; }
    if (size == 0) {
        db->nblocks = 2;
        if (bm_reserve(db, 2)) { rc = db_fail(db, GFE_ENOMEM, "out of memory"); goto fail; }
        bits_set(db->bm_now, 0, 2);
        if ((rc = checkpoint_locked(db))) goto fail;
        *out = db;
        return GFE_OK;
    }
    unsigned char slot[2][BLOCK];
    hdr h[2];
    int ok[2];
    memset(slot, 0, sizeof slot);
    for (int i = 0; i < 2; i++) {
        long got = port_pread(db->f, slot[i], BLOCK, (uint64_t)i * BLOCK);
        if (got != (long)BLOCK) {
            snprintf(i ? e1 : e0, sizeof e0, "file too short for the header");
            ok[i] = 0;
        } else {
            ok[i] = hdr_decode(slot[i], &h[i], i ? e1 : e0, sizeof e0) == 0;
        }
    }
    if (!ok[0] && !ok[1]) {
        rc = db_fail(db, GFE_ECORRUPT, "%s: not a valid gfe database: header page 0: %s; header page 1: %s", path, e0, e1);
        goto fail;
    }
    hdr *H = (ok[0] && (!ok[1] || h[0].gen > h[1].gen)) ? &h[0] : &h[1];
    if ((uint64_t)size < H->nblocks * BLOCK) {
        rc = db_fail(db, GFE_ECORRUPT, "%s: database file is truncated: header generation %llu expects %llu pages "
                     "(%llu bytes) but the file has %lld bytes", path, (unsigned long long)H->gen,
                     (unsigned long long)H->nblocks, (unsigned long long)(H->nblocks * BLOCK), (long long)size);
        goto fail;
    }
    db->gen = H->gen;
    db->seq = db->ckpt_seq = H->seq;
    db->nblocks = H->nblocks;
    if (bm_reserve(db, db->nblocks)) { rc = db_fail(db, GFE_ENOMEM, "out of memory"); goto fail; }
    bits_set(db->bm_now, 0, 2);
    for (uint32_t i = 0; i < H->nidx; i++) {
        hdr_index *x = &H->idx[i];
        tree *t = tree_new(db, (int)i, x->name, x->kind, x->compress, x->node_size, x->fanout);
        if (!t) { rc = db_fail(db, GFE_ENOMEM, "out of memory"); goto fail; }
        db->trees[db->ntrees++] = t;
        walkctx w = { db->bm_now, !opt->fast_open, NULL };
        if ((rc = walk(db, &w, t, x->root_blk, x->root_nblk, -1, NULL, NULL))) goto fail;
        if ((rc = db_read_node(db, t, x->root_blk, x->root_nblk, &t->root))) goto fail;
        lru_add(db, t->root);
    }
    memcpy(db->bm_ckpt, db->bm_now, db->bm_words * 8);
    int need = 0;
    if ((rc = recover_wal(db, &need))) goto fail;
    if (need && (rc = checkpoint_locked(db))) goto fail;
    *out = db;
    return GFE_OK;
fail:
    snprintf(err, errlen, "%s", db->err[0] ? db->err : gfe_strerror(rc));
    db_free(db);
    return rc ? rc : GFE_EIO;
}

int gfe_close(gfe_db *db)
{
    if (!db) return GFE_OK;
    int rc = GFE_OK;
    port_lock(db->mu);
    if (!db->broken) rc = checkpoint_locked(db);
    port_unlock(db->mu);
    db_free(db);
    return rc;
}

int gfe_index_find(gfe_db *db, const char *name)
{
    port_lock(db->mu);
    int r = GFE_ENOINDEX;
    for (int i = 0; i < db->ntrees; i++)
        if (strcmp(db->trees[i]->name, name) == 0) r = i;
    port_unlock(db->mu);
    return r;
}

int gfe_index_create(gfe_db *db, const char *name, const gfe_index_options *o)
{
    gfe_index_options d = { GFE_BTREE, 0, 0, 0 };
    if (!o) o = &d;
    size_t nl = strlen(name);
    if (nl == 0 || nl > GFE_MAX_NAME) return db_fail(db, GFE_EINVAL, "index name must be 1..%d bytes", GFE_MAX_NAME);
    if (o->kind != GFE_BTREE && o->kind != GFE_BETREE) return db_fail(db, GFE_EINVAL, "unknown index kind %d", o->kind);
    if (o->compress < 0 || o->compress > 2) return db_fail(db, GFE_EINVAL, "unknown compression %d", o->compress);
    uint32_t ns = o->node_size ? o->node_size : (o->kind == GFE_BTREE ? 8192u : 65536u);
    uint32_t fan = o->fanout ? o->fanout : 16u;
    if (ns < 4096 || ns > MAX_RAW / 4) return db_fail(db, GFE_EINVAL, "node size %u out of range", ns);
    if (fan < 3 || fan > 65536) return db_fail(db, GFE_EINVAL, "fanout %u out of range", fan);
    port_lock(db->mu);
    int rc;
    if (db->broken) { rc = GFE_EIO; goto out; }
    for (int i = 0; i < db->ntrees; i++)
        if (strcmp(db->trees[i]->name, name) == 0) { rc = db_fail(db, GFE_EEXIST, "index '%s' exists", name); goto out; }
    if (db->ntrees >= GFE_MAX_INDEXES) { rc = db_fail(db, GFE_EINVAL, "too many indexes"); goto out; }
    tree *t = tree_new(db, db->ntrees, name, o->kind, o->compress, ns, fan);
    node *r = t ? node_alloc(t, 1) : NULL;
    if (!r) { free(t); rc = db_fail(db, GFE_ENOMEM, "out of memory"); goto out; }
    r->dirty = 1;
    t->root = r;
    lru_add(db, r);
    db->trees[db->ntrees++] = t;
    rc = checkpoint_locked(db);
    if (!rc) rc = t->id;
out:
    port_unlock(db->mu);
    return rc;
}

/* ---- batches and commit ---- */

gfe_batch *gfe_batch_new(void)
{
    gfe_batch *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    b->len = WAL_REC_HDR;
    return b;
}

static int batch_add(gfe_batch *b, uint8_t type, int idx, const void *k, size_t kl, const void *v, size_t vl)
{
    if (idx < 0 || idx >= GFE_MAX_INDEXES || kl > GFE_MAX_KEY || vl > MAX_RAW) return GFE_EINVAL;
    if (grow(&b->buf, &b->cap, b->len + 32 + kl + vl)) return GFE_ENOMEM;
    unsigned char *p = b->buf + b->len;
    *p++ = type;
    p += varint_put(p, (uint64_t)idx);
    p += varint_put(p, kl);
    if (type == MSG_PUT) p += varint_put(p, vl);
    if (kl) memcpy(p, k, kl);
    p += kl;
    if (vl) memcpy(p, v, vl);
    p += vl;
    b->len = (size_t)(p - b->buf);
    b->n++;
    return GFE_OK;
}

int gfe_batch_put(gfe_batch *b, int idx, const void *k, size_t kl, const void *v, size_t vl)
{
    return batch_add(b, MSG_PUT, idx, k, kl, v, vl);
}
int gfe_batch_del(gfe_batch *b, int idx, const void *k, size_t kl) { return batch_add(b, MSG_DEL, idx, k, kl, NULL, 0); }
size_t gfe_batch_count(const gfe_batch *b) { return b->n; }
void gfe_batch_clear(gfe_batch *b) { b->len = WAL_REC_HDR; b->n = 0; }
void gfe_batch_free(gfe_batch *b)
{
    if (b) { free(b->buf); free(b); }
}

static int wal_group_sync(gfe_db *db, uint64_t target)
{
    int rc = GFE_OK;
    port_lock(db->wmu);
    while (db->wal_synced < target) {
        if (!db->wal_syncing) {
            db->wal_syncing = 1;
            uint64_t upto = db->wal_total;
            port_unlock(db->wmu);
            int r = port_sync(db->wal);
            port_lock(db->wmu);
            db->wal_syncing = 0;
            db->st.wal_syncs++;
            if (r) rc = GFE_EIO;
            else if (upto > db->wal_synced) db->wal_synced = upto;
            port_cond_broadcast(db->wcv);
            if (rc) break;
        } else {
            port_cond_wait(db->wcv, db->wmu);
        }
    }
    port_unlock(db->wmu);
    return rc;
}

int gfe_commit(gfe_db *db, gfe_batch *b, int durability, uint64_t *seq_out)
{
    char e[256];
    int rc;
    wal_op *ops = NULL;
    uint32_t nops = 0;
    if (b->n == 0) return GFE_OK;
    if (!b->buf && grow(&b->buf, &b->cap, WAL_REC_HDR)) return GFE_ENOMEM;
    port_lock(db->mu);
    if (db->broken) { rc = db_fail(db, GFE_EIO, "database is unusable after an earlier error"); goto out; }
    uint64_t seq = db->seq + 1;
    unsigned char *h = b->buf;
    uint32_t len = (uint32_t)(b->len - WAL_REC_HDR);
    put32(h, WAL_MAGIC);
    put32(h + 4, len);
    put64(h + 8, seq);
    put32(h + 20, b->n);
    uint32_t c = crc32_buf(h + 4, 12);
    c = (uint32_t)crc32(c, h + 20, 4 + len);
    put32(h + 16, c);
    uint64_t s2;
    if (wal_decode(b->buf, b->len, &s2, &ops, &nops, e, sizeof e) <= 0) {
        rc = db_fail(db, GFE_EINVAL, "bad batch: %s", e);
        goto out;
    }
    if ((rc = check_ops(db, ops, nops))) goto out;
    if (port_pwrite(db->wal, b->buf, b->len, db->wal_off)) {
        db->broken = 1;
        rc = db_fail(db, GFE_EIO, "%s: append failed: %s", db->walpath, port_errstr(e, sizeof e));
        goto out;
    }
    db->wal_off += b->len;
    port_lock(db->wmu);
    db->wal_total += b->len;
    uint64_t target = db->wal_total;
    port_unlock(db->wmu);
    if (durability == GFE_DUR_SYNC) {
        if (port_sync(db->wal)) {
            db->broken = 1;
            rc = db_fail(db, GFE_EIO, "%s: sync failed: %s", db->walpath, port_errstr(e, sizeof e));
            goto out;
        }
        port_lock(db->wmu);
        if (target > db->wal_synced) db->wal_synced = target;
        db->st.wal_syncs++;
        port_unlock(db->wmu);
    }
    if ((rc = apply_ops(db, ops, nops))) { db->broken = 1; goto out; }
    db->seq = seq;
    db->st.commits++;
    if (seq_out) *seq_out = seq;
    cache_evict(db);
    if (db->broken) { rc = GFE_EIO; goto out; }
    /* copy-on-write keeps old node versions until the next checkpoint, so
     * checkpoint early when they would bloat the file */
    if (db->wal_off > db->wal_limit || (db->pending_free > 2048 && db->pending_free > db->nblocks / 4))
        rc = checkpoint_locked(db);
    port_unlock(db->mu);
    free(ops);
    if (!rc && durability == GFE_DUR_GROUP) rc = wal_group_sync(db, target);
    return rc;
out:
    port_unlock(db->mu);
    free(ops);
    return rc;
}

int gfe_put(gfe_db *db, int idx, const void *k, size_t kl, const void *v, size_t vl, int durability)
{
    gfe_batch b = { NULL, 0, 0, 0 };
    b.len = WAL_REC_HDR;
    int rc = gfe_batch_put(&b, idx, k, kl, v, vl);
    if (!rc) rc = gfe_commit(db, &b, durability, NULL);
    free(b.buf);
    return rc;
}

int gfe_del(gfe_db *db, int idx, const void *k, size_t kl, int durability)
{
    gfe_batch b = { NULL, 0, 0, 0 };
    b.len = WAL_REC_HDR;
    int rc = gfe_batch_del(&b, idx, k, kl);
    if (!rc) rc = gfe_commit(db, &b, durability, NULL);
    free(b.buf);
    return rc;
}

int gfe_get(gfe_db *db, int idx, const void *k, size_t kl, void **v, size_t *vl)
{
    if (kl > GFE_MAX_KEY) return GFE_NOTFOUND;
    port_lock(db->mu);
    int rc;
    if (idx < 0 || idx >= db->ntrees) rc = GFE_ENOINDEX;
    else {
        rc = tree_get(db->trees[idx], k, (uint32_t)kl, v, vl);
        cache_evict(db);
    }
    port_unlock(db->mu);
    return rc;
}

/* ---- cursors ---- */

int gfe_cursor_open(gfe_db *db, int idx, gfe_cursor **out)
{
    if (idx < 0 || idx >= db->ntrees) return GFE_ENOINDEX;
    gfe_cursor *c = calloc(1, sizeof *c);
    if (!c) return GFE_ENOMEM;
    c->db = db;
    c->idx = idx;
    *out = c;
    return GFE_OK;
}

static void cursor_clear(gfe_cursor *c)
{
    for (uint32_t i = 0; i < c->n; i++) free(c->items[i]);
    free(c->items);
    c->items = NULL;
    c->n = c->pos = 0;
    c->valid = 0;
}

static int cursor_fill(gfe_cursor *c, const void *k, uint32_t kl, int mode)
{
    item *own = NULL;
    for (;;) {
        cursor_clear(c);
        item *res = NULL;
        port_lock(c->db->mu);
        int rc = tree_collect(c->db->trees[c->idx], k, kl, mode, &c->items, &c->n, &res, &c->rmode, &c->has_resume);
        cache_evict(c->db);
        port_unlock(c->db->mu);
        free(own);
        own = NULL;
        free(c->resume);
        c->resume = res;
        if (rc) { c->has_resume = 0; return rc; }
        if (c->n > 0) { c->valid = 1; return GFE_OK; }
        if (!c->has_resume) return GFE_OK;
        own = c->resume;
        c->resume = NULL;
        k = own->d;
        kl = own->klen;
        mode = c->rmode;
    }
}

int gfe_cursor_seek(gfe_cursor *c, const void *k, size_t kl, int dir)
{
    if (k && kl > GFE_MAX_KEY) kl = GFE_MAX_KEY + 1;
    c->dir = dir;
    if (dir == GFE_FORWARD) return cursor_fill(c, k ? k : "", k ? (uint32_t)kl : 0, 0);
    return cursor_fill(c, k, k ? (uint32_t)kl : 0, 2);
}

int gfe_cursor_valid(const gfe_cursor *c) { return c->valid; }

int gfe_cursor_next(gfe_cursor *c)
{
    if (!c->valid) return GFE_NOTFOUND;
    if (++c->pos < c->n) return GFE_OK;
    if (!c->has_resume) { cursor_clear(c); return GFE_NOTFOUND; }
    item *r = c->resume;
    c->resume = NULL;
    int rc = cursor_fill(c, r->d, r->klen, c->rmode);
    free(r);
    if (rc) return rc;
    return c->valid ? GFE_OK : GFE_NOTFOUND;
}

const void *gfe_cursor_key(const gfe_cursor *c, size_t *kl)
{
    if (!c->valid) { *kl = 0; return NULL; }
    *kl = c->items[c->pos]->klen;
    return c->items[c->pos]->d;
}

const void *gfe_cursor_value(const gfe_cursor *c, size_t *vl)
{
    if (!c->valid) { *vl = 0; return NULL; }
    const item *it = c->items[c->pos];
    *vl = it->vlen;
    return it->d + it->klen;
}

void gfe_cursor_close(gfe_cursor *c)
{
    if (!c) return;
    cursor_clear(c);
    free(c->resume);
    free(c);
}

/* ---- stats and verification ---- */

static int walk_all(gfe_db *db, gfe_stats *st)
{
    uint64_t *bm = calloc(db->bm_words ? db->bm_words : 1, 8);
    if (!bm) return db_fail(db, GFE_ENOMEM, "out of memory");
    bits_set(bm, 0, 2);
    int rc = GFE_OK;
    for (int i = 0; i < db->ntrees && !rc; i++) {
        tree *t = db->trees[i];
        walkctx w = { bm, 1, st ? &st->idx[i] : NULL };
        rc = walk(db, &w, t, t->root->blk, t->root->nblk, t->root->level, NULL, NULL);
    }
    free(bm);
    return rc;
}

int gfe_stats_get(gfe_db *db, gfe_stats *st, int deep)
{
    int rc = GFE_OK;
    port_lock(db->mu);
    *st = db->st;
    if (deep) rc = checkpoint_locked(db);
    st->cache_bytes = db->cache_cap;
    st->cache_used = db->cache_used;
    st->nindexes = db->ntrees;
    for (int i = 0; i < db->ntrees; i++) {
        gfe_index_stats *x = &st->idx[i];
        memset(x, 0, sizeof *x);
        snprintf(x->name, sizeof x->name, "%s", db->trees[i]->name);
        x->kind = db->trees[i]->kind;
        x->compress = db->trees[i]->compress;
    }
    if (deep && !rc) rc = walk_all(db, st);
    int64_t fs = port_size(db->f), ws = port_size(db->wal);
    st->file_bytes = fs > 0 ? (uint64_t)fs : 0;
    st->wal_bytes = ws > 0 ? (uint64_t)ws : 0;
    st->blocks_total = db->nblocks;
    uint64_t u = 0;
    for (uint64_t b = 0; b < db->nblocks; b++) u += (uint64_t)bit(db->bm_now, b);
    st->blocks_used = u;
    st->checkpoints = db->st.checkpoints;
    st->last_seq = db->seq;
    port_unlock(db->mu);
    return rc;
}

int gfe_verify(gfe_db *db, char *msg, size_t n)
{
    port_lock(db->mu);
    int rc = checkpoint_locked(db);
    if (!rc) rc = walk_all(db, NULL);
    if (msg && n) snprintf(msg, n, "%s", rc ? db->err : "ok");
    port_unlock(db->mu);
    return rc;
}
