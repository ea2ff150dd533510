/* util.c - implementation of the tools' shared helpers (see util.h). */
#include "util.h"
#include "port.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

void rng_seed(rng *r, uint64_t seed) { r->s = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull; }

uint64_t rng_next(rng *r)
{
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint64_t rng_below(rng *r, uint64_t n) { return n ? rng_next(r) % n : 0; }

double now_sec(void) { return (double)port_now_ns() / 1e9; }

void junit_init(junit *j, const char *suite)
{
    memset(j, 0, sizeof *j);
    j->suite = suite;
    j->t0 = now_sec();
}

static char *dupstr(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

void junit_add(junit *j, const char *name, double secs, const char *fail)
{
    if (j->n == j->cap) {
        j->cap = j->cap ? j->cap * 2 : 32;
        j->c = realloc(j->c, (size_t)j->cap * sizeof *j->c);
        if (!j->c) { perror("realloc"); exit(2); }
    }
    tcase *c = &j->c[j->n++];
    c->name = dupstr(name);
    c->fail = fail ? dupstr(fail) : NULL;
    c->secs = secs;
    if (fail) j->failures++;
    printf("%s %s.%s (%.3fs)%s%s\n", fail ? "FAIL" : "ok  ", j->suite, name, secs, fail ? ": " : "", fail ? fail : "");
    fflush(stdout);
}

static void xml_esc(FILE *f, const char *s)
{
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        switch (ch) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&apos;", f); break;
        default:
            if (ch < 0x20 && ch != '\n' && ch != '\t') fprintf(f, "?");
            else fputc(ch, f);
        }
    }
}

int junit_write(const junit *j, const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites>\n");
    fprintf(f, "  <testsuite name=\"%s\" tests=\"%d\" failures=\"%d\" errors=\"0\" time=\"%.3f\">\n", j->suite, j->n,
            j->failures, now_sec() - j->t0);
    for (int i = 0; i < j->n; i++) {
        fprintf(f, "    <testcase classname=\"engine.%s\" name=\"", j->suite);
        xml_esc(f, j->c[i].name);
        fprintf(f, "\" time=\"%.3f\"", j->c[i].secs);
        if (j->c[i].fail) {
            fprintf(f, ">\n      <failure message=\"");
            xml_esc(f, j->c[i].fail);
            fprintf(f, "\">");
            xml_esc(f, j->c[i].fail);
            fprintf(f, "</failure>\n    </testcase>\n");
        } else {
            fprintf(f, "/>\n");
        }
    }
    fprintf(f, "  </testsuite>\n</testsuites>\n");
    return fclose(f) == 0 ? 0 : -1;
}

int bytes_cmp(const void *a, size_t al, const void *b, size_t bl)
{
    size_t m = al < bl ? al : bl;
    int c = m ? memcmp(a, b, m) : 0;
    if (c) return c;
    return al < bl ? -1 : al > bl;
}

size_t model_find(const model *m, const void *k, size_t kl, int *found)
{
    size_t lo = 0, hi = m->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (bytes_cmp(m->e[mid].k, m->e[mid].kl, k, kl) < 0) lo = mid + 1; else hi = mid;
    }
    *found = lo < m->n && bytes_cmp(m->e[lo].k, m->e[lo].kl, k, kl) == 0;
    return lo;
}

static unsigned char *dupb(const void *p, size_t n)
{
    unsigned char *d = malloc(n ? n : 1);
    if (!d) { perror("malloc"); exit(2); }
    if (n) memcpy(d, p, n);
    return d;
}

void model_put(model *m, const void *k, size_t kl, const void *v, size_t vl)
{
    int f;
    size_t i = model_find(m, k, kl, &f);
    if (f) {
        free(m->e[i].v);
        m->e[i].v = dupb(v, vl);
        m->e[i].vl = vl;
        return;
    }
    if (m->n == m->cap) {
        m->cap = m->cap ? m->cap * 2 : 64;
        m->e = realloc(m->e, m->cap * sizeof *m->e);
        if (!m->e) { perror("realloc"); exit(2); }
    }
    memmove(m->e + i + 1, m->e + i, (m->n - i) * sizeof *m->e);
    m->e[i].k = dupb(k, kl);
    m->e[i].kl = kl;
    m->e[i].v = dupb(v, vl);
    m->e[i].vl = vl;
    m->n++;
}

void model_del(model *m, const void *k, size_t kl)
{
    int f;
    size_t i = model_find(m, k, kl, &f);
    if (!f) return;
    free(m->e[i].k);
    free(m->e[i].v);
    memmove(m->e + i, m->e + i + 1, (m->n - i - 1) * sizeof *m->e);
    m->n--;
}

void model_free(model *m)
{
    for (size_t i = 0; i < m->n; i++) { free(m->e[i].k); free(m->e[i].v); }
    free(m->e);
    memset(m, 0, sizeof *m);
}

void path_join(char *out, size_t n, const char *dir, const char *name)
{
    size_t dl = strlen(dir);
    if (dl && (dir[dl - 1] == '/' || dir[dl - 1] == '\\')) snprintf(out, n, "%s%s", dir, name);
    else snprintf(out, n, "%s/%s", dir, name);
}

void remove_db(const char *path)
{
    char w[1100];
    snprintf(w, sizeof w, "%s-wal", path);
    if (port_exists(path)) port_remove(path);
    if (port_exists(w)) port_remove(w);
}

void put_be64(unsigned char *p, uint64_t v)
{
    for (int i = 7; i >= 0; i--) { p[i] = (unsigned char)v; v >>= 8; }
}

uint64_t get_be64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = v << 8 | p[i];
    return v;
}

void fmt_hex(char *out, size_t n, const void *p, size_t len)
{
    const unsigned char *b = p;
    size_t o = 0;
    for (size_t i = 0; i < len && o + 3 < n; i++) o += (size_t)snprintf(out + o, n - o, "%02x", b[i]);
    if (n) out[o < n ? o : n - 1] = 0;
}

void sfmt(char *out, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out, n, fmt, ap);
    va_end(ap);
}

void junit_free(junit *j)
{
    for (int i = 0; i < j->n; i++) { free(j->c[i].name); free(j->c[i].fail); }
    free(j->c);
    j->c = NULL;
    j->n = j->cap = 0;
}
