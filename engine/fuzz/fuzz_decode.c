/* fuzz_decode.c - fuzz target for the engine's decoders of untrusted bytes:
 * node extents, header slots and log records.  The first input byte picks
 * the decoder; odd selectors first repair the checksum so the fuzzer gets
 * past it and exercises the parsers behind it.  Built with libFuzzer
 * (clang -fsanitize=fuzzer); with -DFUZZ_STANDALONE it instead runs each
 * file named on the command line, or mutates them randomly for N seconds
 * (`fuzz_decode -t 60 seeds...`), for machines without clang. */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > MAX_RAW) return 0;
    unsigned sel = data[0] % 6;
    data++;
    size--;
    char err[256];
    if (sel <= 1) {
        unsigned char *b = malloc(size + 1);
        if (!b) return 0;
        memcpy(b, data, size);
        if (sel == 1 && size >= NODE_HDR) {
            uint32_t stored = get32(b + 16);
            if (stored <= size - NODE_HDR) put32(b + 4, crc32_buf(b + 8, NODE_HDR - 8 + (size_t)stored));
        }
        uint64_t blk = size >= NODE_HDR ? get32(b + 28) : 2;
        uint32_t idx = size >= NODE_HDR ? get32(b + 12) : 0;
        node *n = node_decode(b, size, blk, idx, 1u << 20, err, sizeof err, NULL, NULL);
        if (n) {
            /* a decoded node must re-encode within its size bound */
            unsigned char *out = malloc(n->bytes + 64);
            if (out) {
                size_t len = node_encode_raw(n, out);
                if (len > n->bytes + 64) abort();
                free(out);
            }
            node_free_mem(n);
        }
        free(b);
    } else if (sel <= 3) {
        unsigned char b[BLOCK];
        memset(b, 0, sizeof b);
        memcpy(b, data, size < BLOCK ? size : BLOCK);
        if (sel == 3) put32(b + BLOCK - 4, crc32_buf(b, BLOCK - 4));
        hdr h;
        if (hdr_decode(b, &h, err, sizeof err) == 0) {
            unsigned char again[BLOCK];
            hdr h2;
            hdr_encode(&h, again);
            if (hdr_decode(again, &h2, err, sizeof err) != 0) abort();
        }
    } else {
        unsigned char *b = malloc(size + 1);
        if (!b) return 0;
        memcpy(b, data, size);
        size_t off = 0;
        while (off < size) {
            if (sel == 5 && size - off >= WAL_REC_HDR) {
                uint32_t len = get32(b + off + 4);
                if (len <= size - off - WAL_REC_HDR) {
                    uint32_t c = crc32_buf(b + off + 4, 12);
                    c = (uint32_t)crc32(c, b + off + 20, 4 + len);
                    put32(b + off + 16, c);
                }
            }
            uint64_t seq;
            wal_op *ops;
            uint32_t nops;
            long r = wal_decode(b + off, size - off, &seq, &ops, &nops, err, sizeof err);
            if (r <= 0) break;
            for (uint32_t i = 0; i < nops; i++)
                if (ops[i].k + ops[i].kl > b + size || ops[i].v + ops[i].vl > b + size) abort();
            free(ops);
            off += (size_t)r;
        }
        free(b);
    }
    return 0;
}

#ifdef FUZZ_STANDALONE
#include <time.h>
static unsigned char *slurp(const char *p, size_t *n)
{
    FILE *f = fopen(p, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long s = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)s + 1);
    if (b && fread(b, 1, (size_t)s, f) != (size_t)s) { free(b); b = NULL; }
    fclose(f);
    *n = (size_t)s;
    return b;
}

int main(int argc, char **argv)
{
    int secs = 0, first = 1;
    if (argc > 2 && strcmp(argv[1], "-t") == 0) { secs = atoi(argv[2]); first = 3; }
    size_t nseeds = (size_t)(argc - first);
    unsigned char **seed = calloc(nseeds + 1, sizeof *seed);
    size_t *len = calloc(nseeds + 1, sizeof *len);
    for (size_t i = 0; i < nseeds; i++) {
        seed[i] = slurp(argv[first + (int)i], &len[i]);
        if (seed[i]) LLVMFuzzerTestOneInput(seed[i], len[i]);
    }
    unsigned char *buf = malloc(MAX_RAW);
    time_t end = time(NULL) + secs;
    unsigned long long x = 88172645463325252ull, runs = 0;
    while (secs && nseeds && buf && time(NULL) < end) {
        for (int k = 0; k < 200; k++, runs++) {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            size_t s = x % nseeds;
            if (!seed[s] || !len[s]) continue;
            size_t n = len[s];
            memcpy(buf, seed[s], n);
            int muts = 1 + (int)(x >> 40) % 8;
            for (int m = 0; m < muts; m++) {
                x ^= x << 13; x ^= x >> 7; x ^= x << 17;
                size_t at = 1 + (size_t)(x % (n > 1 ? n - 1 : 1));
                switch ((x >> 32) % 4) {
                case 0: buf[at] ^= (unsigned char)(1u << ((x >> 20) % 8)); break;
                case 1: buf[at] = (unsigned char)(x >> 24); break;
                case 2: if (n > 2) n = 1 + (size_t)((x >> 16) % (n - 1)); break;
                default: buf[at] = (unsigned char)((x >> 8) % 3 == 0 ? 0xff : 0); break;
                }
            }
            LLVMFuzzerTestOneInput(buf, n);
        }
    }
    printf("fuzz_decode: %llu executions in %d s, no crashes\n", runs, secs);
    for (size_t i = 0; i < nseeds; i++) free(seed[i]);
    free(seed);
    free(len);
    free(buf);
    return 0;
}
#endif
