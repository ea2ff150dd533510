/* tree.c - the two index kinds and the page cache they share.
 * A B+tree applies each change to its leaf at once.  A B-epsilon tree puts
 * changes (puts and delete tombstones) into the root's message buffer; a full
 * buffer is flushed in one batch to the child that would receive the most
 * bytes, so one leaf read+write is paid for many inserts.  Both kinds use
 * the same nodes: a B+tree is a B-epsilon tree whose buffers stay empty.
 * Nodes are loaded on demand and evicted leaf-first (a node is evictable
 * only when none of its children is loaded), which keeps parent pointers
 * valid and lets a dirty child's new disk address be stored in its parent. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 64

static void set_bytes(node *n, size_t b, size_t mb)
{
    gfe_db *db = n->t->db;
    db->cache_used = db->cache_used - n->bytes + b;
    n->bytes = b;
    n->msgbytes = mb;
}

static void recount(node *n)
{
    size_t ob = n->bytes;
    node_recount(n);
    size_t nb = n->bytes;
    n->t->db->cache_used = n->t->db->cache_used - ob + nb;
}

void lru_add(gfe_db *db, node *n)
{
    n->prev = NULL;
    n->next = db->lru_head;
    if (db->lru_head) db->lru_head->prev = n;
    db->lru_head = n;
    if (!db->lru_tail) db->lru_tail = n;
    db->cache_used += n->bytes;
}

static void lru_unlink(gfe_db *db, node *n)
{
    if (n->prev) n->prev->next = n->next; else db->lru_head = n->next;
    if (n->next) n->next->prev = n->prev; else db->lru_tail = n->prev;
    n->prev = n->next = NULL;
}

void lru_touch(gfe_db *db, node *n)
{
    if (db->lru_head == n) return;
    lru_unlink(db, n);
    n->next = db->lru_head;
    if (db->lru_head) db->lru_head->prev = n;
    db->lru_head = n;
    if (!db->lru_tail) db->lru_tail = n;
}

static uint32_t kid_index(const node *p, const node *c)
{
    for (uint32_t i = 0; i < p->nk; i++)
        if (p->kids[i].ptr == c) return i;
    return UINT32_MAX;
}

static void evict_one(gfe_db *db, node *n)
{
    node *p = n->parent;
    uint32_t i = kid_index(p, n);
    p->kids[i].ptr = NULL;
    p->nloaded--;
    lru_unlink(db, n);
    db->cache_used -= n->bytes;
    node_free_mem(n);
}

void cache_evict(gfe_db *db)
{
    for (int pass = 0; pass < 8 && db->cache_used > db->cache_cap; pass++) {
        int any = 0;
        node *n = db->lru_tail;
        while (n && db->cache_used > db->cache_cap) {
            node *prev = n->prev;
            if (n->parent && n->nloaded == 0) {
                if (n->dirty && db_write_node(db, n) != GFE_OK) { db->broken = 1; return; }
                evict_one(db, n);
                any = 1;
            }
            n = prev;
        }
        if (!any) break;
    }
}

static void free_rec(gfe_db *db, node *n)
{
    if (!n->leaf)
        for (uint32_t i = 0; i < n->nk; i++)
            if (n->kids[i].ptr) free_rec(db, n->kids[i].ptr);
    lru_unlink(db, n);
    db->cache_used -= n->bytes;
    node_free_mem(n);
}

void cache_drop_tree(tree *t)
{
    if (t->root) free_rec(t->db, t->root);
    t->root = NULL;
}

static int load_kid(node *p, uint32_t i, node **out)
{
    gfe_db *db = p->t->db;
    kid *k = &p->kids[i];
    if (k->ptr) {
        db->st.cache_hits++;
        lru_touch(db, k->ptr);
        *out = k->ptr;
        return GFE_OK;
    }
    node *c;
    int rc = db_read_node(db, p->t, k->blk, k->nblk, &c);
    if (rc) return rc;
    if (c->level + 1 != p->level)
        return db_fail(db, GFE_ECORRUPT, "%s: index '%s': page %llu has level %u under a level-%u node",
                       db->path, p->t->name, (unsigned long long)k->blk, c->level, p->level);
    db->st.cache_misses++;
    c->parent = p;
    p->nloaded++;
    k->ptr = c;
    lru_add(db, c);
    *out = c;
    return GFE_OK;
}

/* First item >= key. */
static uint32_t lower_bound(item **a, uint32_t n, const void *k, uint32_t kl)
{
    uint32_t lo = 0, hi = n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (item_cmp(a[mid], k, kl) < 0) lo = mid + 1; else hi = mid;
    }
    return lo;
}

/* First item > key. */
static uint32_t upper_bound(item **a, uint32_t n, const void *k, uint32_t kl)
{
    uint32_t lo = 0, hi = n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (item_cmp(a[mid], k, kl) <= 0) lo = mid + 1; else hi = mid;
    }
    return lo;
}

static uint32_t child_for(const node *n, const void *k, uint32_t kl)
{
    return upper_bound(n->piv, n->nk - 1, k, kl);
}

static int ensure_kids(node *n, uint32_t want)
{
    if (want <= n->kcap) return 0;
    uint32_t c = n->kcap ? n->kcap : 8;
    while (c < want) c *= 2;
    kid *k = realloc(n->kids, (size_t)c * sizeof *k);
    item **p = k ? realloc(n->piv, (size_t)c * sizeof *p) : NULL;
    if (k) n->kids = k;
    if (!p) return -1;
    n->piv = p;
    n->kcap = c;
    return 0;
}

static size_t isize(const node *n, const item *it) { return n->leaf ? item_leaf_size(it) : item_msg_size(it); }

/* Puts one change into a node: a leaf applies it, an internal node keeps it
 * as the newest message for that key. */
static int node_put_item(node *n, item *m)
{
    uint32_t pos = lower_bound(n->it, n->n, m->d, m->klen);
    int found = pos < n->n && item_cmp(n->it[pos], m->d, m->klen) == 0;
    size_t b = n->bytes, mb = n->msgbytes;
    if (found) {
        size_t old = isize(n, n->it[pos]);
        b -= old;
        if (!n->leaf) mb -= old;
        free(n->it[pos]);
        if (n->leaf && m->type == MSG_DEL) {
            memmove(n->it + pos, n->it + pos + 1, (n->n - pos - 1) * sizeof *n->it);
            n->n--;
            free(m);
        } else {
            n->it[pos] = m;
            b += isize(n, m);
            if (!n->leaf) mb += isize(n, m);
        }
    } else if (n->leaf && m->type == MSG_DEL) {
        free(m);
    } else {
        if (node_reserve(n, n->n + 1)) { free(m); return GFE_ENOMEM; }
        memmove(n->it + pos + 1, n->it + pos, (n->n - pos) * sizeof *n->it);
        n->it[pos] = m;
        n->n++;
        b += isize(n, m);
        if (!n->leaf) mb += isize(n, m);
    }
    n->dirty = 1;
    set_bytes(n, b, mb);
    return GFE_OK;
}

/* Merges a sorted run of messages (ownership passes) into node c. */
static int node_merge(node *c, item **m, uint32_t cnt)
{
    if (cnt <= 2) {
        for (uint32_t i = 0; i < cnt; i++) {
            int rc = node_put_item(c, m[i]);
            if (rc) { for (uint32_t j = i + 1; j < cnt; j++) free(m[j]); return rc; }
        }
        return GFE_OK;
    }
    uint32_t total = c->n + cnt;
    item **out = malloc((size_t)total * sizeof *out);
    if (!out) { for (uint32_t j = 0; j < cnt; j++) free(m[j]); return GFE_ENOMEM; }
    uint32_t i = 0, j = 0, o = 0;
    while (i < c->n || j < cnt) {
        int cmp;
        if (i == c->n) cmp = 1;
        else if (j == cnt) cmp = -1;
        else cmp = key_cmp(c->it[i]->d, c->it[i]->klen, m[j]->d, m[j]->klen);
        if (cmp < 0) { out[o++] = c->it[i++]; continue; }
        if (cmp == 0) free(c->it[i++]);
        if (c->leaf && m[j]->type == MSG_DEL) free(m[j]);
        else out[o++] = m[j];
        j++;
    }
    free(c->it);
    c->it = out;
    c->n = o;
    c->cap = total;
    c->dirty = 1;
    recount(c);
    return GFE_OK;
}

/* Payload budget: a full node plus its header fills node_size exactly. */
static size_t cap_of(const tree *t) { return t->node_size - NODE_HDR; }

static int needs_split(const node *c)
{
    if (c->leaf) return c->n >= 2 && c->bytes > cap_of(c->t);
    if (c->nk < 3) return 0;
    if (c->t->kind == GFE_BETREE && c->nk > c->t->fanout) return 1;
    return c->bytes - c->msgbytes > cap_of(c->t);
}

/* Splits loaded child j of p in two; the right half becomes child j+1. */
static int split_child(node *p, uint32_t j)
{
    gfe_db *db = p->t->db;
    node *c = p->kids[j].ptr;
    node *r = node_alloc(c->t, c->leaf);
    item *pivot;
    if (!r || ensure_kids(p, p->nk + 1)) { free(r); return GFE_ENOMEM; }
    r->level = c->level;
    if (c->leaf) {
        /* splitting the tree's rightmost leaf means keys arrive in order
         * (auto-increment, timestamps): leave it nearly full instead of half */
        int rightmost = 1;
        for (node *x = c, *q = p; q && rightmost; x = q, q = q->parent)
            rightmost = q->kids[q->nk - 1].ptr == x;
        size_t half = rightmost ? c->bytes / 10 * 9 : c->bytes / 2, acc = 0;
        uint32_t m = 0;
        while (m < c->n - 1 && acc < half) acc += item_leaf_size(c->it[m++]);
        if (m == 0) m = 1;
        if (node_reserve(r, c->n - m)) { free(r); return GFE_ENOMEM; }
        memcpy(r->it, c->it + m, (c->n - m) * sizeof *r->it);
        r->n = c->n - m;
        c->n = m;
        pivot = item_new(r->it[0]->d, r->it[0]->klen, NULL, 0, 0);
        if (!pivot) return GFE_ENOMEM;
    } else {
        uint32_t m = c->nk / 2;
        if (ensure_kids(r, c->nk - m)) { free(r); return GFE_ENOMEM; }
        memcpy(r->kids, c->kids + m, (c->nk - m) * sizeof *r->kids);
        if (c->nk - m > 1) memcpy(r->piv, c->piv + m, (c->nk - m - 1) * sizeof *r->piv);
        r->nk = c->nk - m;
        pivot = c->piv[m - 1];
        c->nk = m;
        for (uint32_t i = 0; i < r->nk; i++)
            if (r->kids[i].ptr) {
                r->kids[i].ptr->parent = r;
                r->nloaded++;
                c->nloaded--;
            }
        uint32_t s = lower_bound(c->it, c->n, pivot->d, pivot->klen);
        if (node_reserve(r, c->n - s)) return GFE_ENOMEM;
        if (c->n > s) memcpy(r->it, c->it + s, (c->n - s) * sizeof *r->it);
        r->n = c->n - s;
        c->n = s;
    }
    r->t = c->t;
    r->parent = p;
    r->dirty = 1;
    c->dirty = 1;
    memmove(p->kids + j + 2, p->kids + j + 1, (p->nk - j - 1) * sizeof *p->kids);
    memmove(p->piv + j + 1, p->piv + j, (p->nk - 1 - j) * sizeof *p->piv);
    p->kids[j + 1].ptr = r;
    p->kids[j + 1].blk = 0;
    p->kids[j + 1].nblk = 0;
    p->piv[j] = pivot;
    p->nk++;
    p->nloaded++;
    p->dirty = 1;
    recount(c);
    node_recount(r);
    lru_add(db, r);
    recount(p);
    return GFE_OK;
}

/* Splits child i (and the pieces it splits into) until all fit. */
static int fix_child(node *p, uint32_t i)
{
    uint32_t j = i, last = i;
    while (j <= last) {
        node *c = p->kids[j].ptr;
        if (c && needs_split(c)) {
            int rc = split_child(p, j);
            if (rc) return rc;
            last++;
        } else {
            j++;
        }
    }
    return GFE_OK;
}

static int grow_root(tree *t)
{
    while (needs_split(t->root)) {
        node *old = t->root, *nr = node_alloc(t, 0);
        if (!nr || ensure_kids(nr, 2)) { free(nr); return GFE_ENOMEM; }
        nr->level = (uint8_t)(old->level + 1);
        if (nr->level >= MAX_DEPTH) return db_fail(t->db, GFE_EINVAL, "tree too deep");
        nr->kids[0].ptr = old;
        nr->kids[0].blk = old->blk;
        nr->kids[0].nblk = old->nblk;
        nr->nk = 1;
        nr->nloaded = 1;
        nr->dirty = 1;
        node_recount(nr);
        old->parent = nr;
        t->root = nr;
        lru_add(t->db, nr);
        int rc = fix_child(nr, 0);
        if (rc) return rc;
    }
    return GFE_OK;
}

/* Moves buffered messages down until n fits its node size again. */
static int flush_node(node *n)
{
    tree *t = n->t;
    while (n->bytes > cap_of(t) && n->n > 0) {
        uint32_t best = 0, bs = 0, be = 0, s = 0;
        size_t bestb = 0;
        for (uint32_t i = 0; i < n->nk; i++) {
            uint32_t e = i + 1 < n->nk ? lower_bound(n->it, n->n, n->piv[i]->d, n->piv[i]->klen) : n->n;
            if (e < s) e = s;
            size_t b = 0;
            for (uint32_t k = s; k < e; k++) b += item_msg_size(n->it[k]);
            if (b > bestb) { bestb = b; best = i; bs = s; be = e; }
            s = e;
        }
        if (bestb == 0) break;
        node *c;
        int rc = load_kid(n, best, &c);
        if (rc) return rc;
        uint32_t cnt = be - bs;
        item **moved = malloc(cnt * sizeof *moved);
        if (!moved) return GFE_ENOMEM;
        memcpy(moved, n->it + bs, cnt * sizeof *moved);
        memmove(n->it + bs, n->it + be, (n->n - be) * sizeof *n->it);
        n->n -= cnt;
        n->dirty = 1;
        set_bytes(n, n->bytes - bestb, n->msgbytes - bestb);
        rc = node_merge(c, moved, cnt);
        free(moved);
        if (rc) return rc;
        if (!c->leaf && c->bytes > cap_of(t)) {
            rc = flush_node(c);
            if (rc) return rc;
        }
        rc = fix_child(n, best);
        if (rc) return rc;
    }
    return GFE_OK;
}

int tree_apply(tree *t, const void *k, uint32_t kl, const void *v, uint32_t vl, uint8_t type)
{
    item *m = item_new(k, kl, v, type == MSG_PUT ? vl : 0, type);
    if (!m) return GFE_ENOMEM;
    node *n = t->root;
    int rc;
    lru_touch(t->db, n);
    if (t->kind == GFE_BETREE && !n->leaf) {
        rc = node_put_item(n, m);
        if (!rc && n->bytes > cap_of(t)) rc = flush_node(n);
    } else {
        while (!n->leaf) {
            rc = load_kid(n, child_for(n, k, kl), &n);
            if (rc) { free(m); return rc; }
        }
        rc = node_put_item(n, m);
        for (node *c = n; !rc && c->parent; c = c->parent) {
            if (!needs_split(c)) continue;
            rc = fix_child(c->parent, kid_index(c->parent, c));
        }
    }
    if (!rc) rc = grow_root(t);
    return rc;
}

int tree_get(tree *t, const void *k, uint32_t kl, void **v, size_t *vl)
{
    node *n = t->root;
    lru_touch(t->db, n);
    for (;;) {
        uint32_t pos = lower_bound(n->it, n->n, k, kl);
        if (pos < n->n && item_cmp(n->it[pos], k, kl) == 0) {
            item *it = n->it[pos];
            if (it->type == MSG_DEL) return GFE_NOTFOUND;
            *v = malloc(it->vlen ? it->vlen : 1);
            if (!*v) return GFE_ENOMEM;
            memcpy(*v, it->d + it->klen, it->vlen);
            *vl = it->vlen;
            return GFE_OK;
        }
        if (n->leaf) return GFE_NOTFOUND;
        int rc = load_kid(n, child_for(n, k, kl), &n);
        if (rc) return rc;
    }
}

/* Keeps b's entries, overridden by the newer messages in m (both sorted);
 * deletes drop out. */
static item **merge_over(item **b, uint32_t nb, item **m, uint32_t nm, uint32_t *nout)
{
    item **out = malloc(((size_t)nb + nm + 1) * sizeof *out);
    if (!out) return NULL;
    uint32_t i = 0, j = 0, o = 0;
    while (i < nb || j < nm) {
        int cmp = i == nb ? 1 : j == nm ? -1 : key_cmp(b[i]->d, b[i]->klen, m[j]->d, m[j]->klen);
        if (cmp < 0) { out[o++] = b[i++]; continue; }
        if (cmp == 0) i++;
        if (m[j]->type != MSG_DEL) out[o++] = m[j];
        j++;
    }
    *nout = o;
    return out;
}

/* Index range [s,e) of items in a within bounds lo <= key < hi, further cut
 * by the cursor key k (mode 0 >=, 1 >, 2 <=, 3 <; k NULL = unbounded). */
static void range_of(item **a, uint32_t n, const item *lo, const item *hi, const void *k, uint32_t kl, int mode,
                     uint32_t *s, uint32_t *e)
{
    uint32_t a0 = lo ? lower_bound(a, n, lo->d, lo->klen) : 0;
    uint32_t a1 = hi ? lower_bound(a, n, hi->d, hi->klen) : n;
    if (k) {
        if (mode == 0) { uint32_t x = lower_bound(a, n, k, kl); if (x > a0) a0 = x; }
        if (mode == 1) { uint32_t x = upper_bound(a, n, k, kl); if (x > a0) a0 = x; }
        if (mode == 2) { uint32_t x = upper_bound(a, n, k, kl); if (x < a1) a1 = x; }
        if (mode == 3) { uint32_t x = lower_bound(a, n, k, kl); if (x < a1) a1 = x; }
    }
    if (a1 < a0) a1 = a0;
    *s = a0;
    *e = a1;
}

int tree_collect(tree *t, const void *k, uint32_t kl, int mode, item ***out, uint32_t *nout, item **resume,
                 int *resume_mode, int *has_resume)
{
    node *path[MAX_DEPTH];
    int depth = 0;
    const item *lo = NULL, *hi = NULL;
    node *n = t->root;
    *out = NULL;
    *nout = 0;
    *has_resume = 0;
    *resume = NULL;
    lru_touch(t->db, n);
    while (!n->leaf) {
        uint32_t i;
        if (!k) i = mode >= 2 ? n->nk - 1 : 0;
        else if (mode == 3) i = lower_bound(n->piv, n->nk - 1, k, kl);
        else i = child_for(n, k, kl);
        if (i > 0) lo = n->piv[i - 1];
        if (i + 1 < n->nk) hi = n->piv[i];
        path[depth++] = n;
        int rc = load_kid(n, i, &n);
        if (rc) return rc;
    }
    uint32_t s, e, cnt;
    range_of(n->it, n->n, NULL, NULL, k, kl, mode, &s, &e);
    item **cur = malloc(((size_t)(e - s) + 1) * sizeof *cur);
    if (!cur) return GFE_ENOMEM;
    if (e > s) memcpy(cur, n->it + s, (e - s) * sizeof *cur);
    cnt = e - s;
    for (int d = depth - 1; d >= 0; d--) {
        node *p = path[d];
        range_of(p->it, p->n, lo, hi, k, kl, mode, &s, &e);
        if (s == e) continue;
        uint32_t nn;
        item **m = merge_over(cur, cnt, p->it + s, e - s, &nn);
        free(cur);
        if (!m) return GFE_ENOMEM;
        cur = m;
        cnt = nn;
    }
    item **res = malloc(((size_t)cnt + 1) * sizeof *res);
    if (!res) { free(cur); return GFE_ENOMEM; }
    for (uint32_t i = 0; i < cnt; i++) {
        const item *x = cur[mode >= 2 ? cnt - 1 - i : i];
        res[i] = item_new(x->d, x->klen, x->d + x->klen, x->vlen, MSG_PUT);
        if (!res[i]) {
            for (uint32_t j = 0; j < i; j++) free(res[j]);
            free(res);
            free(cur);
            return GFE_ENOMEM;
        }
    }
    free(cur);
    const item *r = mode >= 2 ? lo : hi;
    if (r) {
        *resume = item_new(r->d, r->klen, NULL, 0, 0);
        if (!*resume) {
            for (uint32_t j = 0; j < cnt; j++) free(res[j]);
            free(res);
            return GFE_ENOMEM;
        }
        *resume_mode = mode >= 2 ? 3 : 0;
        *has_resume = 1;
    }
    *out = res;
    *nout = cnt;
    return GFE_OK;
}

static int write_rec(gfe_db *db, node *n)
{
    if (!n->leaf)
        for (uint32_t i = 0; i < n->nk; i++)
            if (n->kids[i].ptr) {
                int rc = write_rec(db, n->kids[i].ptr);
                if (rc) return rc;
            }
    return n->dirty ? db_write_node(db, n) : GFE_OK;
}

int tree_write_dirty(tree *t) { return write_rec(t->db, t->root); }
