/* node.c - on-disk formats: node extents, header slots and log records.
 * The decoders here are the engine's only parsers of untrusted bytes; they
 * check every length and ordering so a damaged file yields an error message
 * naming the page and the problem instead of a crash (see fuzz/). */
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

void put32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)v; p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16); p[3] = (unsigned char)(v >> 24);
}
void put64(unsigned char *p, uint64_t v) { put32(p, (uint32_t)v); put32(p + 4, (uint32_t)(v >> 32)); }
uint32_t get32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
uint64_t get64(const unsigned char *p) { return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32; }

uint32_t crc32_buf(const void *p, size_t n)
{
    uLong c = crc32(0L, Z_NULL, 0);
    const unsigned char *b = p;
    while (n > 0) { /* zlib takes uInt lengths */
        uInt chunk = n > (1u << 30) ? (1u << 30) : (uInt)n;
        c = crc32(c, b, chunk);
        b += chunk;
        n -= chunk;
    }
    return (uint32_t)c;
}

size_t varint_put(unsigned char *p, uint64_t v)
{
    size_t n = 0;
    while (v >= 0x80) { p[n++] = (unsigned char)(v | 0x80); v >>= 7; }
    p[n++] = (unsigned char)v;
    return n;
}

int varint_get(const unsigned char **pp, const unsigned char *end, uint64_t *v)
{
    const unsigned char *p = *pp;
    uint64_t r = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (p >= end) return -1;
        unsigned char b = *p++;
        r |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) { *v = r; *pp = p; return 0; }
    }
    return -1;
}

static size_t vlen(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) { v >>= 7; n++; }
    return n;
}

item *item_new(const void *k, uint32_t kl, const void *v, uint32_t vl, uint8_t type)
{
    item *it = malloc(sizeof *it + (size_t)kl + vl);
    if (!it) return NULL;
    it->klen = kl;
    it->vlen = vl;
    it->type = type;
    if (kl) memcpy(it->d, k, kl);
    if (vl) memcpy(it->d + kl, v, vl);
    return it;
}

int key_cmp(const void *a, uint32_t al, const void *b, uint32_t bl)
{
    uint32_t m = al < bl ? al : bl;
    int c = m ? memcmp(a, b, m) : 0;
    if (c) return c;
    return al < bl ? -1 : al > bl;
}

int item_cmp(const item *a, const void *k, uint32_t kl) { return key_cmp(a->d, a->klen, k, kl); }

/* Upper bound of the prefix-compressed leaf encoding (see node_encode_raw). */
size_t item_leaf_size(const item *it) { return 1 + vlen(it->klen) + vlen(it->vlen) + it->klen + it->vlen; }
size_t item_msg_size(const item *it) { return 1 + vlen(it->klen) + vlen(it->vlen) + it->klen + it->vlen; }
size_t item_piv_size(const item *it) { return vlen(it->klen) + it->klen; }

node *node_alloc(tree *t, int leaf)
{
    node *n = calloc(1, sizeof *n);
    if (!n) return NULL;
    n->t = t;
    n->leaf = (uint8_t)leaf;
    n->bytes = leaf ? 0 : 4;
    return n;
}

void node_free_mem(node *n)
{
    if (!n) return;
    for (uint32_t i = 0; i < n->n; i++) free(n->it[i]);
    free(n->it);
    if (n->piv) {
        for (uint32_t i = 0; i + 1 < n->nk; i++) free(n->piv[i]);
        free(n->piv);
    }
    free(n->kids);
    free(n);
}

void node_recount(node *n)
{
    size_t b = 0, m = 0;
    if (n->leaf) {
        for (uint32_t i = 0; i < n->n; i++) b += item_leaf_size(n->it[i]);
    } else {
        b = 4 + 12 * (size_t)n->nk;
        for (uint32_t i = 0; i + 1 < n->nk; i++) b += item_piv_size(n->piv[i]);
        for (uint32_t i = 0; i < n->n; i++) m += item_msg_size(n->it[i]);
        b += m;
    }
    n->bytes = b;
    n->msgbytes = m;
}

/* Leaves store each key as (bytes shared with the previous key, suffix):
 * sorted secondary-index keys share long prefixes, and this helps even when
 * compression is off. */
size_t node_encode_raw(const node *n, unsigned char *out)
{
    unsigned char *p = out;
    if (n->leaf) {
        const item *prev = NULL;
        for (uint32_t i = 0; i < n->n; i++) {
            const item *it = n->it[i];
            uint32_t s = 0;
            if (prev) {
                uint32_t m = prev->klen < it->klen ? prev->klen : it->klen;
                while (s < m && prev->d[s] == it->d[s]) s++;
            }
            p += varint_put(p, s);
            p += varint_put(p, it->klen - s);
            p += varint_put(p, it->vlen);
            memcpy(p, it->d + s, it->klen - s);
            p += it->klen - s;
            memcpy(p, it->d + it->klen, it->vlen);
            p += it->vlen;
            prev = it;
        }
    } else {
        for (uint32_t i = 0; i < n->nk; i++) {
            put64(p, n->kids[i].blk);
            put32(p + 8, n->kids[i].nblk);
            p += 12;
        }
        for (uint32_t i = 0; i + 1 < n->nk; i++) {
            p += varint_put(p, n->piv[i]->klen);
            memcpy(p, n->piv[i]->d, n->piv[i]->klen);
            p += n->piv[i]->klen;
        }
        put32(p, n->n);
        p += 4;
        for (uint32_t i = 0; i < n->n; i++) {
            const item *it = n->it[i];
            *p++ = it->type;
            p += varint_put(p, it->klen);
            p += varint_put(p, it->vlen);
            memcpy(p, it->d, (size_t)it->klen + it->vlen);
            p += it->klen + it->vlen;
        }
    }
    return (size_t)(p - out);
}

static void errf(char *err, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
}

/* Room for `want` item pointers in n->it, doubling from 16: decoding a page and the tree's
 * inserts and splits share it. 0, or -1 when out of memory (n is unchanged). */
int node_reserve(node *n, uint32_t want)
{
    if (want <= n->cap) return 0;
    uint32_t c = n->cap ? n->cap : 16;
    while (c < want) c *= 2;
    item **p = realloc(n->it, (size_t)c * sizeof *p);
    if (!p) return -1;
    n->it = p;
    n->cap = c;
    return 0;
}

#define BAD(...) do { errf(err, errlen, __VA_ARGS__); goto fail; } while (0)

node *node_decode(const unsigned char *buf, size_t len, uint64_t blk, uint32_t idx_id,
                  uint64_t nblocks, char *err, size_t errlen, uint32_t *raw_out, uint32_t *stored_out)
{
    unsigned char *raw = NULL;
    node *n = NULL;
    if (len < NODE_HDR) BAD("page %llu: extent shorter than a node header", (unsigned long long)blk);
    if (get32(buf) != NODE_MAGIC) BAD("page %llu: bad node magic 0x%08x (not a node, or overwritten)",
                                      (unsigned long long)blk, get32(buf));
    uint32_t stored = get32(buf + 16), rawlen = get32(buf + 20), count = get32(buf + 24);
    uint8_t type = buf[8], comp = buf[9];
    if (stored > len - NODE_HDR)
        BAD("page %llu: node claims %u payload bytes but its extent holds %u", (unsigned long long)blk,
            stored, (unsigned)(len - NODE_HDR));
    uint32_t want = get32(buf + 4), got = crc32_buf(buf + 8, NODE_HDR - 8 + (size_t)stored);
    if (want != got) BAD("page %llu: checksum mismatch (stored 0x%08x, computed 0x%08x): torn or corrupt page",
                         (unsigned long long)blk, want, got);
    if (type != 1 && type != 2) BAD("page %llu: unknown node type %u", (unsigned long long)blk, type);
    if ((type == 1) != (buf[10] == 0) || buf[10] > 64)
        BAD("page %llu: node type %u with level %u", (unsigned long long)blk, type, buf[10]);
    if (get32(buf + 12) != idx_id)
        BAD("page %llu: node belongs to index %u, expected %u", (unsigned long long)blk, get32(buf + 12), idx_id);
    if (get32(buf + 28) != (uint32_t)blk)
        BAD("page %llu: node was written for page %u (misdirected write)", (unsigned long long)blk, get32(buf + 28));
    if (rawlen > MAX_RAW) BAD("page %llu: raw size %u too large", (unsigned long long)blk, rawlen);
    const unsigned char *p = buf + NODE_HDR, *end;
    if (comp == 1) {
        raw = malloc(rawlen ? rawlen : 1);
        if (!raw) BAD("page %llu: out of memory", (unsigned long long)blk);
        uLongf dl = rawlen;
        int zr = uncompress(raw, &dl, p, stored);
        if (zr != Z_OK || dl != rawlen)
            BAD("page %llu: compressed payload does not inflate to %u bytes (zlib %d)", (unsigned long long)blk,
                rawlen, zr);
        p = raw;
    } else if (comp == 0) {
        if (rawlen != stored) BAD("page %llu: raw and stored sizes differ in an uncompressed node",
                                  (unsigned long long)blk);
    } else {
        BAD("page %llu: unknown compression %u", (unsigned long long)blk, comp);
    }
    end = p + rawlen;
    n = node_alloc(NULL, type == 1);
    if (!n) BAD("page %llu: out of memory", (unsigned long long)blk);
    n->level = buf[10];
    if (type == 1) {
        if (count > rawlen / 3) BAD("page %llu: leaf claims %u entries in %u bytes", (unsigned long long)blk,
                                    count, rawlen);
        if (node_reserve(n, count)) BAD("page %llu: out of memory", (unsigned long long)blk);
        const item *prev = NULL;
        for (uint32_t i = 0; i < count; i++) {
            uint64_t s, sl, vl;
            if (varint_get(&p, end, &s) || varint_get(&p, end, &sl) || varint_get(&p, end, &vl))
                BAD("page %llu: entry %u: truncated length fields", (unsigned long long)blk, i);
            if (s > (prev ? prev->klen : 0) || s + sl > GFE_MAX_KEY)
                BAD("page %llu: entry %u: bad key length", (unsigned long long)blk, i);
            if (sl > (uint64_t)(end - p) || vl > (uint64_t)(end - p) - sl)
                BAD("page %llu: entry %u: runs past the end of the node", (unsigned long long)blk, i);
            item *it = malloc(sizeof *it + s + sl + vl);
            if (!it) BAD("page %llu: out of memory", (unsigned long long)blk);
            it->klen = (uint32_t)(s + sl);
            it->vlen = (uint32_t)vl;
            it->type = MSG_PUT;
            if (s) memcpy(it->d, prev->d, s);
            memcpy(it->d + s, p, sl + vl);
            p += sl + vl;
            n->it[n->n++] = it;
            if (prev && key_cmp(prev->d, prev->klen, it->d, it->klen) >= 0)
                BAD("page %llu: entry %u: keys out of order", (unsigned long long)blk, i);
            prev = it;
        }
    } else {
        if (count < 1 || count > 65536 || (uint64_t)count * 12 + 4 > rawlen)
            BAD("page %llu: internal node claims %u children", (unsigned long long)blk, count);
        n->kids = calloc(count, sizeof *n->kids);
        n->piv = calloc(count, sizeof *n->piv);
        if (!n->kids || !n->piv) BAD("page %llu: out of memory", (unsigned long long)blk);
        n->kcap = count;
        for (uint32_t i = 0; i < count; i++) {
            uint64_t cb = get64(p);
            uint32_t cn = get32(p + 8);
            p += 12;
            if (cb < 2 || cn < 1 || cn > MAX_NODE_BLOCKS || (nblocks && cb + cn > nblocks))
                BAD("page %llu: child %u points to invalid extent %llu+%u", (unsigned long long)blk, i,
                    (unsigned long long)cb, cn);
            n->kids[i].blk = cb;
            n->kids[i].nblk = cn;
        }
        n->nk = count;
        for (uint32_t i = 0; i + 1 < count; i++) {
            uint64_t kl;
            if (varint_get(&p, end, &kl) || kl > GFE_MAX_KEY || kl > (uint64_t)(end - p))
                BAD("page %llu: pivot %u: bad length", (unsigned long long)blk, i);
            n->piv[i] = item_new(p, (uint32_t)kl, NULL, 0, 0);
            if (!n->piv[i]) { n->nk = i + 1; BAD("page %llu: out of memory", (unsigned long long)blk); }
            p += kl;
            if (i && key_cmp(n->piv[i - 1]->d, n->piv[i - 1]->klen, n->piv[i]->d, n->piv[i]->klen) >= 0) {
                n->nk = i + 2;
                BAD("page %llu: pivots out of order", (unsigned long long)blk);
            }
        }
        if (end - p < 4) BAD("page %llu: missing message count", (unsigned long long)blk);
        uint32_t nm = get32(p);
        p += 4;
        if (nm > (uint64_t)(end - p) / 3) BAD("page %llu: claims %u messages", (unsigned long long)blk, nm);
        if (node_reserve(n, nm)) BAD("page %llu: out of memory", (unsigned long long)blk);
        for (uint32_t i = 0; i < nm; i++) {
            uint64_t kl, vl;
            if (p >= end) BAD("page %llu: message %u truncated", (unsigned long long)blk, i);
            uint8_t mt = *p++;
            if (mt != MSG_PUT && mt != MSG_DEL) BAD("page %llu: message %u: bad type %u", (unsigned long long)blk, i, mt);
            if (varint_get(&p, end, &kl) || varint_get(&p, end, &vl) || kl > GFE_MAX_KEY ||
                kl > (uint64_t)(end - p) || vl > (uint64_t)(end - p) - kl)
                BAD("page %llu: message %u: bad lengths", (unsigned long long)blk, i);
            item *it = item_new(p, (uint32_t)kl, p + kl, (uint32_t)vl, mt);
            if (!it) BAD("page %llu: out of memory", (unsigned long long)blk);
            p += kl + vl;
            n->it[n->n++] = it;
            if (i && key_cmp(n->it[i - 1]->d, n->it[i - 1]->klen, it->d, it->klen) >= 0)
                BAD("page %llu: message %u out of order", (unsigned long long)blk, i);
        }
    }
    if (p != end) BAD("page %llu: %ld trailing bytes after node contents", (unsigned long long)blk, (long)(end - p));
    free(raw);
    node_recount(n);
    if (raw_out) *raw_out = rawlen;
    if (stored_out) *stored_out = stored;
    return n;
fail:
    free(raw);
    node_free_mem(n);
    return NULL;
}

void hdr_encode(const hdr *h, unsigned char *b)
{
    memset(b, 0, BLOCK);
    memcpy(b, HDR_MAGIC, 8);
    put32(b + 8, HDR_VERSION);
    put32(b + 12, BLOCK);
    put64(b + 16, h->gen);
    put64(b + 24, h->seq);
    put64(b + 32, h->nblocks);
    put32(b + 40, h->nidx);
    for (uint32_t i = 0; i < h->nidx; i++) {
        unsigned char *e = b + HDR_IDX_OFF + i * HDR_IDX_SIZE;
        memcpy(e, h->idx[i].name, strlen(h->idx[i].name));
        e[32] = (unsigned char)h->idx[i].kind;
        e[33] = (unsigned char)h->idx[i].compress;
        put32(e + 36, h->idx[i].node_size);
        put32(e + 40, h->idx[i].fanout);
        put32(e + 44, h->idx[i].root_nblk);
        put64(e + 48, h->idx[i].root_blk);
    }
    put32(b + BLOCK - 4, crc32_buf(b, BLOCK - 4));
}

int hdr_decode(const unsigned char *b, hdr *h, char *err, size_t errlen)
{
    memset(h, 0, sizeof *h);
    if (memcmp(b, HDR_MAGIC, 8) != 0) { errf(err, errlen, "bad magic (not a gfe database)"); return -1; }
    uint32_t want = get32(b + BLOCK - 4), got = crc32_buf(b, BLOCK - 4);
    if (want != got) {
        errf(err, errlen, "checksum mismatch (stored 0x%08x, computed 0x%08x)", want, got);
        return -1;
    }
    if (get32(b + 8) != HDR_VERSION) { errf(err, errlen, "unsupported version %u", get32(b + 8)); return -1; }
    if (get32(b + 12) != BLOCK) { errf(err, errlen, "unsupported page size %u", get32(b + 12)); return -1; }
    h->gen = get64(b + 16);
    h->seq = get64(b + 24);
    h->nblocks = get64(b + 32);
    h->nidx = get32(b + 40);
    if (h->nidx > GFE_MAX_INDEXES) { errf(err, errlen, "%u indexes (max %d)", h->nidx, GFE_MAX_INDEXES); return -1; }
    if (h->nblocks < 2) { errf(err, errlen, "block count %llu too small", (unsigned long long)h->nblocks); return -1; }
    for (uint32_t i = 0; i < h->nidx; i++) {
        const unsigned char *e = b + HDR_IDX_OFF + i * HDR_IDX_SIZE;
        hdr_index *x = &h->idx[i];
        memcpy(x->name, e, 32);
        x->name[GFE_MAX_NAME] = 0;
        x->kind = e[32];
        x->compress = e[33];
        x->node_size = get32(e + 36);
        x->fanout = get32(e + 40);
        x->root_nblk = get32(e + 44);
        x->root_blk = get64(e + 48);
        if (!x->name[0] || (x->kind != GFE_BTREE && x->kind != GFE_BETREE) || x->compress > 2 ||
            x->node_size < 1024 || x->node_size > MAX_RAW / 4 || x->fanout < 3 || x->fanout > 65536 ||
            x->root_blk < 2 || x->root_nblk < 1 || x->root_nblk > MAX_NODE_BLOCKS ||
            x->root_blk + x->root_nblk > h->nblocks) {
            errf(err, errlen, "index entry %u is invalid", i);
            return -1;
        }
    }
    return 0;
}

long wal_decode(const unsigned char *b, size_t avail, uint64_t *seq, wal_op **ops_out, uint32_t *nops_out,
                char *err, size_t errlen)
{
    *ops_out = NULL;
    if (avail < WAL_REC_HDR) return 0;
    if (get32(b) != WAL_MAGIC) { errf(err, errlen, "bad record magic"); return -1; }
    uint32_t len = get32(b + 4), nops = get32(b + 20);
    if (len > 256u * 1024 * 1024) { errf(err, errlen, "record length %u is implausible", len); return -1; }
    if ((size_t)len > avail - WAL_REC_HDR) return 0;
    uint32_t c = crc32_buf(b + 4, 12);
    c = (uint32_t)crc32(c, b + 20, 4 + len);
    if (c != get32(b + 16)) { errf(err, errlen, "checksum mismatch"); return -1; }
    *seq = get64(b + 8);
    if (nops > len / 3 + 1) { errf(err, errlen, "claims %u operations in %u bytes", nops, len); return -1; }
    wal_op *ops = calloc(nops ? nops : 1, sizeof *ops);
    if (!ops) { errf(err, errlen, "out of memory"); return -1; }
    const unsigned char *p = b + WAL_REC_HDR, *end = p + len;
    for (uint32_t i = 0; i < nops; i++) {
        uint64_t idx, kl, vl = 0;
        if (p >= end) goto bad;
        ops[i].type = *p++;
        if (ops[i].type != MSG_PUT && ops[i].type != MSG_DEL) goto bad;
        if (varint_get(&p, end, &idx) || varint_get(&p, end, &kl) || idx >= GFE_MAX_INDEXES || kl > GFE_MAX_KEY)
            goto bad;
        if (ops[i].type == MSG_PUT && varint_get(&p, end, &vl)) goto bad;
        if (kl > (uint64_t)(end - p) || vl > (uint64_t)(end - p) - kl) goto bad;
        ops[i].idx = (uint32_t)idx;
        ops[i].k = p;
        ops[i].kl = (uint32_t)kl;
        ops[i].v = p + kl;
        ops[i].vl = (uint32_t)vl;
        p += kl + vl;
    }
    if (p != end) goto bad;
    *ops_out = ops;
    *nops_out = nops;
    return (long)(WAL_REC_HDR + len);
bad:
    free(ops);
    errf(err, errlen, "malformed operation list");
    return -1;
}
