/* internal.h - shared structures of the engine: in-memory nodes, trees, the
 * page cache and the database handle.  Not installed; tools use gfe.h. */
#ifndef GFE_INTERNAL_H
#define GFE_INTERNAL_H

#include "gfe.h"
#include "port.h"

#include <stddef.h>
#include <stdint.h>

#define BLOCK 4096u
#define NODE_HDR 32u
#define MAX_NODE_BLOCKS 4096u           /* 16 MiB: decoders refuse anything larger */
#define MAX_RAW (MAX_NODE_BLOCKS * BLOCK)
#define NODE_MAGIC 0x4e454647u          /* "GFEN" */
#define WAL_MAGIC 0x57454647u           /* "GFEW" */
#define WALH_MAGIC 0x48574647u          /* "GFWH" */
#define WAL_REC_HDR 24u
#define WAL_FILE_HDR 32u
#define HDR_MAGIC "GFEDB\0v1"
#define HDR_VERSION 1u
#define HDR_IDX_OFF 64u
#define HDR_IDX_SIZE 64u

enum { MSG_PUT = 1, MSG_DEL = 2 };

/* One key/value (or message) in a node; key bytes then value bytes. */
typedef struct item {
    uint32_t klen, vlen;
    uint8_t type;
    unsigned char d[];
} item;

typedef struct node node;
typedef struct kid {
    uint64_t blk;   /* on-disk extent, 0 if never written */
    uint32_t nblk;
    node *ptr;      /* loaded child, or NULL */
} kid;

/* A leaf holds sorted entries in it[]; an internal node holds children, the
 * pivots between them and (B-epsilon only) a sorted buffer of pending
 * messages in it[], at most one per key, newer than anything below. */
struct node {
    node *parent, *prev, *next;
    struct tree *t;
    uint64_t blk;
    uint32_t nblk;
    uint8_t leaf, dirty, level;  /* level 0 = leaf */
    uint32_t nloaded;   /* loaded children: only nodes with none may be evicted */
    size_t bytes;       /* encoded payload size (upper bound) */
    size_t msgbytes;    /* part of bytes taken by it[] in internal nodes */
    item **it;
    uint32_t n, cap;
    item **piv;         /* nk - 1 pivots; child i holds keys in [piv[i-1], piv[i]) */
    kid *kids;
    uint32_t nk, kcap;
};

typedef struct tree {
    struct gfe_db *db;
    int id;
    char name[GFE_MAX_NAME + 1];
    int kind, compress;
    uint32_t node_size, fanout;
    node *root;
} tree;

/* Decoded header slot. */
typedef struct hdr_index {
    char name[GFE_MAX_NAME + 1];
    int kind, compress;
    uint32_t node_size, fanout;
    uint64_t root_blk;
    uint32_t root_nblk;
} hdr_index;

typedef struct hdr {
    uint64_t gen, seq, nblocks;
    uint32_t nidx;
    hdr_index idx[GFE_MAX_INDEXES];
} hdr;

typedef struct wal_op {
    uint8_t type;
    uint32_t idx;
    const unsigned char *k, *v;
    uint32_t kl, vl;
} wal_op;

struct gfe_db {
    port_mutex *mu;
    char *path, *walpath;
    port_file *f, *wal;
    int ntrees;
    tree *trees[GFE_MAX_INDEXES];
    /* allocation: bm_now = used by current trees, bm_ckpt = used by the last
     * durable checkpoint (must not be overwritten until the next one) */
    uint64_t nblocks, bm_words;
    uint64_t hint[65]; /* hint[n]: no free run of n blocks starts below it */
    uint64_t pending_free; /* blocks freed since the last checkpoint but still held by it */
    uint64_t *bm_now, *bm_ckpt;
    uint64_t gen, seq, ckpt_seq;
    uint64_t wal_off, wal_limit;
    /* group commit: offsets count bytes ever appended, so a WAL reset does not
     * confuse waiters */
    port_mutex *wmu;
    port_cond *wcv;
    uint64_t wal_total, wal_base, wal_synced;
    int wal_syncing;
    /* cache */
    size_t cache_cap, cache_used;
    node *lru_head, *lru_tail;
    unsigned char *iobuf, *zbuf;
    size_t iocap, zcap;
    gfe_stats st;
    int broken;
    char err[512];
};

/* node.c: items, encoding and the decoders the fuzz target exercises */
item *item_new(const void *k, uint32_t kl, const void *v, uint32_t vl, uint8_t type);
int item_cmp(const item *a, const void *k, uint32_t kl);
int key_cmp(const void *a, uint32_t al, const void *b, uint32_t bl);
size_t item_leaf_size(const item *it);
size_t item_msg_size(const item *it);
size_t item_piv_size(const item *it);
node *node_alloc(tree *t, int leaf);
void node_free_mem(node *n);
int node_reserve(node *n, uint32_t want);
void node_recount(node *n);
size_t node_encode_raw(const node *n, unsigned char *out);
/* Decodes one stored node extent; on error fills err and returns NULL.
 * nblocks bounds child pointers (0 = unchecked). */
node *node_decode(const unsigned char *buf, size_t len, uint64_t blk, uint32_t idx_id,
                  uint64_t nblocks, char *err, size_t errlen, uint32_t *raw_len, uint32_t *stored_len);
int hdr_decode(const unsigned char *buf, hdr *h, char *err, size_t errlen);
void hdr_encode(const hdr *h, unsigned char *buf);
/* Parses a log record at buf (avail bytes).  Returns record length, 0 if the
 * bytes run out (torn tail), -1 if malformed (err filled). */
long wal_decode(const unsigned char *buf, size_t avail, uint64_t *seq, wal_op **ops, uint32_t *nops,
                char *err, size_t errlen);
size_t varint_put(unsigned char *p, uint64_t v);
int varint_get(const unsigned char **p, const unsigned char *end, uint64_t *v);
void put32(unsigned char *p, uint32_t v);
void put64(unsigned char *p, uint64_t v);
uint32_t get32(const unsigned char *p);
uint64_t get64(const unsigned char *p);
uint32_t crc32_buf(const void *p, size_t n);

/* tree.c */
int tree_get(tree *t, const void *k, uint32_t kl, void **v, size_t *vl);
int tree_apply(tree *t, const void *k, uint32_t kl, const void *v, uint32_t vl, uint8_t type);
/* Collects one leaf's worth of live entries for a cursor.  mode: 0 >=, 1 >,
 * 2 <=, 3 <.  On return *out holds copies in cursor order and *resume/
 * *resume_mode tell where to continue (*has_resume = 0 at the end). */
int tree_collect(tree *t, const void *k, uint32_t kl, int mode, item ***out, uint32_t *nout,
                 item **resume, int *resume_mode, int *has_resume);
int tree_write_dirty(tree *t);
void cache_evict(gfe_db *db);
void cache_drop_tree(tree *t);
void lru_touch(gfe_db *db, node *n);
void lru_add(gfe_db *db, node *n);
int db_read_node(gfe_db *db, tree *t, uint64_t blk, uint32_t nblk, node **out);
int db_write_node(gfe_db *db, node *n);
int db_fail(gfe_db *db, int rc, const char *fmt, ...);

#endif
