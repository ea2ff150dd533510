/* gfe.h - public API of libgfe, the gearfarm storage engine: one database
 * file with several named ordered indexes (B+tree or B-epsilon tree), atomic
 * multi-index write batches, a write-ahead log and checkpoints.
 * All calls on one gfe_db are serialized by a db-wide mutex, so a handle may
 * be shared between threads. */
#ifndef GFE_H
#define GFE_H

#include <stddef.h>
#include <stdint.h>

#define GFE_OK 0
#define GFE_NOTFOUND 1
#define GFE_EINVAL (-1)
#define GFE_EIO (-2)
#define GFE_ECORRUPT (-3)
#define GFE_ENOMEM (-4)
#define GFE_EEXIST (-5)
#define GFE_ENOINDEX (-6)

#define GFE_MAX_INDEXES 32
#define GFE_MAX_NAME 31
#define GFE_MAX_KEY 1024

enum { GFE_BTREE = 1, GFE_BETREE = 2 };
enum { GFE_COMPRESS_NONE = 0, GFE_COMPRESS_STANDARD = 1, GFE_COMPRESS_AGGRESSIVE = 2 };
enum { GFE_DUR_NONE = 0, GFE_DUR_GROUP = 1, GFE_DUR_SYNC = 2 };
enum { GFE_FORWARD = 0, GFE_BACKWARD = 1 };

typedef struct gfe_db gfe_db;
typedef struct gfe_batch gfe_batch;
typedef struct gfe_cursor gfe_cursor;

typedef struct gfe_options {
    size_t cache_bytes;            /* page cache budget; 0 = 8 MiB */
    int create;                    /* create the file if missing */
    int fast_open;                 /* skip reading every leaf at open (internal nodes are always checked) */
    uint64_t checkpoint_wal_bytes; /* checkpoint when the log grows past this; 0 = 32 MiB */
} gfe_options;

typedef struct gfe_index_options {
    int kind;           /* GFE_BTREE or GFE_BETREE */
    int compress;       /* GFE_COMPRESS_* */
    uint32_t node_size; /* logical node bytes; 0 = 8 KiB (btree) / 64 KiB (betree) */
    uint32_t fanout;    /* betree max children; 0 = 16 */
} gfe_index_options;

typedef struct gfe_index_stats {
    char name[GFE_MAX_NAME + 1];
    int kind, compress, depth;
    uint64_t nodes, leaves, entries, messages;
    uint64_t raw_bytes, stored_bytes; /* node payload before / after compression */
    uint64_t disk_bytes;              /* whole blocks occupied */
} gfe_index_stats;

typedef struct gfe_stats {
    uint64_t file_bytes, wal_bytes, blocks_total, blocks_used;
    uint64_t cache_bytes, cache_used, cache_hits, cache_misses;
    uint64_t node_reads, node_writes, bytes_read, bytes_written;
    uint64_t commits, checkpoints, last_seq, wal_syncs;
    int nindexes;
    gfe_index_stats idx[GFE_MAX_INDEXES];
} gfe_stats;

/* Opens (and recovers) a database.  On failure returns an error code and puts
 * a one-line explanation (which file/page/record, what is wrong) in err. */
int gfe_open(const char *path, const gfe_options *opt, gfe_db **out, char *err, size_t errlen);
int gfe_close(gfe_db *db);
const char *gfe_errmsg(gfe_db *db);
const char *gfe_strerror(int rc);

/* Returns the new index id (>= 0) or an error; GFE_EEXIST if the name exists. */
int gfe_index_create(gfe_db *db, const char *name, const gfe_index_options *opt);
int gfe_index_find(gfe_db *db, const char *name);

int gfe_put(gfe_db *db, int idx, const void *k, size_t kl, const void *v, size_t vl, int durability);
int gfe_del(gfe_db *db, int idx, const void *k, size_t kl, int durability);
/* GFE_OK with *v malloc'd (free with gfe_free), or GFE_NOTFOUND. */
int gfe_get(gfe_db *db, int idx, const void *k, size_t kl, void **v, size_t *vl);
void gfe_free(void *p);

gfe_batch *gfe_batch_new(void);
int gfe_batch_put(gfe_batch *b, int idx, const void *k, size_t kl, const void *v, size_t vl);
int gfe_batch_del(gfe_batch *b, int idx, const void *k, size_t kl);
size_t gfe_batch_count(const gfe_batch *b);
void gfe_batch_clear(gfe_batch *b);
void gfe_batch_free(gfe_batch *b);
/* Applies all operations atomically.  *seq (optional) gets the batch number. */
int gfe_commit(gfe_db *db, gfe_batch *b, int durability, uint64_t *seq);

int gfe_checkpoint(gfe_db *db);

/* Cursors copy a leaf's worth of entries at a time; they see later writes
 * but never a half-applied batch. */
int gfe_cursor_open(gfe_db *db, int idx, gfe_cursor **out);
/* Forward: first key >= k; backward: last key <= k.  k == NULL: start/end. */
int gfe_cursor_seek(gfe_cursor *c, const void *k, size_t kl, int dir);
int gfe_cursor_valid(const gfe_cursor *c);
int gfe_cursor_next(gfe_cursor *c); /* moves in the seek direction */
const void *gfe_cursor_key(const gfe_cursor *c, size_t *kl);
const void *gfe_cursor_value(const gfe_cursor *c, size_t *vl);
void gfe_cursor_close(gfe_cursor *c);

/* deep != 0 checkpoints and walks every node on disk (sizes, ratio). */
int gfe_stats_get(gfe_db *db, gfe_stats *st, int deep);
/* Reads and verifies every reachable node; GFE_OK or GFE_ECORRUPT with msg. */
int gfe_verify(gfe_db *db, char *msg, size_t n);

#endif
