/* util.h - helpers shared by the command-line tools: a deterministic PRNG,
 * JUnit XML output, an in-memory ordered map used as the test oracle, and
 * small file/argument helpers. */
#ifndef GFE_UTIL_H
#define GFE_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct rng { uint64_t s; } rng;
void rng_seed(rng *r, uint64_t seed);
uint64_t rng_next(rng *r);
uint64_t rng_below(rng *r, uint64_t n);

double now_sec(void);

typedef struct tcase { char *name, *fail; double secs; } tcase;
typedef struct junit {
    const char *suite;
    tcase *c;
    int n, cap, failures;
    double t0;
} junit;
void junit_init(junit *j, const char *suite);
/* Records one check and prints a human line; fail == NULL means passed. */
void junit_add(junit *j, const char *name, double secs, const char *fail);
int junit_write(const junit *j, const char *path);
void junit_free(junit *j);

typedef struct mentry { unsigned char *k, *v; size_t kl, vl; } mentry;
typedef struct model { mentry *e; size_t n, cap; } model;
size_t model_find(const model *m, const void *k, size_t kl, int *found);
void model_put(model *m, const void *k, size_t kl, const void *v, size_t vl);
void model_del(model *m, const void *k, size_t kl);
void model_free(model *m);
int bytes_cmp(const void *a, size_t al, const void *b, size_t bl);

/* Joins dir and name into a static-lifetime-free buffer. */
void path_join(char *out, size_t n, const char *dir, const char *name);
void remove_db(const char *path);
void put_be64(unsigned char *p, uint64_t v);
uint64_t get_be64(const unsigned char *p);
/* snprintf that may truncate silently (messages only). */
void sfmt(char *out, size_t n, const char *fmt, ...);
void fmt_hex(char *out, size_t n, const void *p, size_t len);

#endif
