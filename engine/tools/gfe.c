/* gfe.c - the command-line tool: `gfe stats DBFILE` and `gfe check DBFILE`
 * print JSON on stdout; problems are reported as {"ok":false,"error":...}
 * plus a plain line on stderr so both farm scripts and humans can use it. */
#include "gfe.h"
#include "util.h"

#include <stdio.h>
#include <string.h>

static void json_str(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c < 0x20) printf("\\u%04x", c);
        else putchar(c);
    }
    putchar('"');
}

static const char *kind_name(int k) { return k == GFE_BETREE ? "betree" : "btree"; }
static const char *comp_name(int c) { return c == 2 ? "aggressive" : c == 1 ? "standard" : "none"; }

static int fail(const char *what, const char *msg)
{
    printf("{\"ok\":false,\"error\":");
    json_str(msg);
    printf("}\n");
    fprintf(stderr, "gfe %s: %s\n", what, msg);
    return 1;
}

int main(int argc, char **argv)
{
    if (argc != 3 || (strcmp(argv[1], "stats") != 0 && strcmp(argv[1], "check") != 0)) {
        fprintf(stderr, "usage: gfe stats DBFILE | gfe check DBFILE\n");
        return 2;
    }
    const char *cmd = argv[1], *path = argv[2];
    char err[600];
    gfe_db *db;
    gfe_options o;
    memset(&o, 0, sizeof o);
    o.cache_bytes = 16u << 20;
    int rc = gfe_open(path, &o, &db, err, sizeof err);
    if (rc) return fail(cmd, err);
    if (strcmp(cmd, "check") == 0) {
        rc = gfe_verify(db, err, sizeof err);
        if (rc) { gfe_close(db); return fail(cmd, err); }
    }
    gfe_stats st;
    rc = gfe_stats_get(db, &st, 1);
    if (rc) {
        snprintf(err, sizeof err, "%s", gfe_errmsg(db));
        gfe_close(db);
        return fail(cmd, err);
    }
    uint64_t raw = 0, stored = 0;
    printf("{\"ok\":true,\"file\":");
    json_str(path);
    printf(",\"page_size\":4096,\"file_bytes\":%llu,\"wal_bytes\":%llu,\"on_disk_bytes\":%llu,"
           "\"pages_total\":%llu,\"pages_used\":%llu,\"last_batch\":%llu,\"indexes\":[",
           (unsigned long long)st.file_bytes, (unsigned long long)st.wal_bytes,
           (unsigned long long)(st.file_bytes + st.wal_bytes), (unsigned long long)st.blocks_total,
           (unsigned long long)st.blocks_used, (unsigned long long)st.last_seq);
    for (int i = 0; i < st.nindexes; i++) {
        gfe_index_stats *x = &st.idx[i];
        raw += x->raw_bytes;
        stored += x->stored_bytes;
        printf("%s{\"name\":", i ? "," : "");
        json_str(x->name);
        printf(",\"kind\":\"%s\",\"compression\":\"%s\",\"depth\":%d,\"nodes\":%llu,\"leaves\":%llu,"
               "\"entries\":%llu,\"pending_messages\":%llu,\"raw_bytes\":%llu,\"stored_bytes\":%llu,"
               "\"disk_bytes\":%llu,\"compression_ratio\":%.3f}",
               kind_name(x->kind), comp_name(x->compress), x->depth, (unsigned long long)x->nodes,
               (unsigned long long)x->leaves, (unsigned long long)x->entries, (unsigned long long)x->messages,
               (unsigned long long)x->raw_bytes, (unsigned long long)x->stored_bytes,
               (unsigned long long)x->disk_bytes, x->stored_bytes ? (double)x->raw_bytes / (double)x->stored_bytes : 1.0);
    }
    printf("],\"raw_bytes\":%llu,\"stored_bytes\":%llu,\"compression_ratio\":%.3f}\n", (unsigned long long)raw,
           (unsigned long long)stored, stored ? (double)raw / (double)stored : 1.0);
    rc = gfe_close(db);
    return rc ? 1 : 0;
}
