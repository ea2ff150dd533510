/* port.c - POSIX and Win32 implementations of port.h.  Keep every #ifdef
 * _WIN32 of the engine in this file. */
#ifndef _WIN32
#define _POSIX_C_SOURCE 200809L
#define _FILE_OFFSET_BITS 64 /* 64-bit off_t on linux-i686 */
#endif
#include "port.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef _WIN32
#define WIN32_LEAN_AND_MEAN
#include <windows.h>
#include <process.h>

struct port_file { HANDLE h; };
struct port_mutex { SRWLOCK l; };
struct port_cond { CONDITION_VARIABLE c; };
struct port_thread { HANDLE h; void (*fn)(void *); void *arg; };
struct port_proc { HANDLE h; };

static DWORD last_err;

const char *port_errstr(char *buf, size_t n)
{
    DWORD len = FormatMessageA(FORMAT_MESSAGE_FROM_SYSTEM | FORMAT_MESSAGE_IGNORE_INSERTS, NULL,
                               last_err, 0, buf, (DWORD)n, NULL);
    while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == '\r' || buf[len - 1] == '.'))
        buf[--len] = 0;
    if (len == 0) snprintf(buf, n, "win32 error %lu", (unsigned long)last_err);
    return buf;
}

int port_open(const char *path, int create, port_file **out)
{
    HANDLE h = CreateFileA(path, GENERIC_READ | GENERIC_WRITE,
                           FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE, NULL,
                           create ? OPEN_ALWAYS : OPEN_EXISTING, FILE_ATTRIBUTE_NORMAL, NULL);
    if (h == INVALID_HANDLE_VALUE) { last_err = GetLastError(); return -1; }
    port_file *f = malloc(sizeof *f);
    if (!f) { CloseHandle(h); return -1; }
    f->h = h;
    *out = f;
    return 0;
}

long port_pread(port_file *f, void *buf, size_t n, uint64_t off)
{
    size_t done = 0;
    while (done < n) {
        OVERLAPPED ov;
        memset(&ov, 0, sizeof ov);
        uint64_t o = off + done;
        ov.Offset = (DWORD)o;
        ov.OffsetHigh = (DWORD)(o >> 32);
        DWORD got = 0;
        if (!ReadFile(f->h, (char *)buf + done, (DWORD)(n - done), &got, &ov)) {
            last_err = GetLastError();
            if (last_err == ERROR_HANDLE_EOF) break;
            return -1;
        }
        if (got == 0) break;
        done += got;
    }
    return (long)done;
}

int port_pwrite(port_file *f, const void *buf, size_t n, uint64_t off)
{
    size_t done = 0;
    while (done < n) {
        OVERLAPPED ov;
        memset(&ov, 0, sizeof ov);
        uint64_t o = off + done;
        ov.Offset = (DWORD)o;
        ov.OffsetHigh = (DWORD)(o >> 32);
        DWORD put = 0;
        if (!WriteFile(f->h, (const char *)buf + done, (DWORD)(n - done), &put, &ov)) {
            last_err = GetLastError();
            return -1;
        }
        done += put;
    }
    return 0;
}

int port_sync(port_file *f)
{
    if (!FlushFileBuffers(f->h)) { last_err = GetLastError(); return -1; }
    return 0;
}

int port_trylock(port_file *f)
{
    OVERLAPPED ov;
    memset(&ov, 0, sizeof ov);
    ov.OffsetHigh = 0x40000000u; /* far beyond any data, so I/O is unaffected */
    if (!LockFileEx(f->h, LOCKFILE_EXCLUSIVE_LOCK | LOCKFILE_FAIL_IMMEDIATELY, 0, 1, 0, &ov)) {
        last_err = GetLastError();
        return -1;
    }
    return 0;
}

int64_t port_size(port_file *f)
{
    LARGE_INTEGER s;
    if (!GetFileSizeEx(f->h, &s)) { last_err = GetLastError(); return -1; }
    return (int64_t)s.QuadPart;
}

int port_truncate(port_file *f, uint64_t size)
{
    LARGE_INTEGER p;
    p.QuadPart = (LONGLONG)size;
    if (!SetFilePointerEx(f->h, p, NULL, FILE_BEGIN) || !SetEndOfFile(f->h)) {
        last_err = GetLastError();
        return -1;
    }
    return 0;
}

void port_close(port_file *f)
{
    if (f) { CloseHandle(f->h); free(f); }
}

int port_remove(const char *path)
{
    if (!DeleteFileA(path)) { last_err = GetLastError(); return -1; }
    return 0;
}

int port_exists(const char *path) { return GetFileAttributesA(path) != INVALID_FILE_ATTRIBUTES; }

int port_mkdir(const char *path)
{
    if (!CreateDirectoryA(path, NULL)) {
        last_err = GetLastError();
        return last_err == ERROR_ALREADY_EXISTS ? 0 : -1;
    }
    return 0;
}

port_mutex *port_mutex_new(void)
{
    port_mutex *m = malloc(sizeof *m);
    if (m) InitializeSRWLock(&m->l);
    return m;
}
void port_mutex_free(port_mutex *m) { free(m); }
void port_lock(port_mutex *m) { AcquireSRWLockExclusive(&m->l); }
void port_unlock(port_mutex *m) { ReleaseSRWLockExclusive(&m->l); }
port_cond *port_cond_new(void)
{
    port_cond *c = malloc(sizeof *c);
    if (c) InitializeConditionVariable(&c->c);
    return c;
}
void port_cond_free(port_cond *c) { free(c); }
void port_cond_wait(port_cond *c, port_mutex *m) { SleepConditionVariableSRW(&c->c, &m->l, INFINITE, 0); }
void port_cond_broadcast(port_cond *c) { WakeAllConditionVariable(&c->c); }

static unsigned __stdcall thread_tramp(void *p)
{
    port_thread *t = p;
    t->fn(t->arg);
    return 0;
}

int port_thread_start(port_thread **out, void (*fn)(void *), void *arg)
{
    port_thread *t = malloc(sizeof *t);
    if (!t) return -1;
    t->fn = fn;
    t->arg = arg;
    t->h = (HANDLE)_beginthreadex(NULL, 0, thread_tramp, t, 0, NULL);
    if (!t->h) { free(t); return -1; }
    *out = t;
    return 0;
}

void port_thread_join(port_thread *t)
{
    WaitForSingleObject(t->h, INFINITE);
    CloseHandle(t->h);
    free(t);
}

uint64_t port_now_ns(void)
{
    static LARGE_INTEGER freq;
    LARGE_INTEGER c;
    if (!freq.QuadPart) QueryPerformanceFrequency(&freq);
    QueryPerformanceCounter(&c);
    return (uint64_t)((double)c.QuadPart * 1e9 / (double)freq.QuadPart);
}

void port_sleep_ms(unsigned ms) { Sleep(ms); }
unsigned port_pid(void) { return (unsigned)GetCurrentProcessId(); }

/* Quote one argument by the MSVCRT command-line rules. */
static void append_arg(char *cmd, size_t cap, const char *a)
{
    size_t n = strlen(cmd);
    if (n && n + 1 < cap) cmd[n++] = ' ';
    if (n + 1 < cap) cmd[n++] = '"';
    for (const char *p = a; *p && n + 3 < cap; p++) {
        size_t bs = 0;
        while (*p == '\\') { bs++; p++; }
        if (!*p) { while (bs-- && n + 2 < cap) { cmd[n++] = '\\'; cmd[n++] = '\\'; } break; }
        if (*p == '"') { bs = bs * 2 + 1; }
        while (bs-- && n + 2 < cap) cmd[n++] = '\\';
        cmd[n++] = *p;
    }
    if (n + 1 < cap) cmd[n++] = '"';
    cmd[n] = 0;
}

int port_proc_spawn_self(int argc, char **argv, int (*fn)(int, char **), port_proc **out)
{
    (void)fn;
    char exe[MAX_PATH];
    if (!GetModuleFileNameA(NULL, exe, sizeof exe)) { last_err = GetLastError(); return -1; }
    char *cmd = calloc(1, 32768);
    if (!cmd) return -1;
    append_arg(cmd, 32768, exe);
    for (int i = 1; i < argc; i++) append_arg(cmd, 32768, argv[i]);
    STARTUPINFOA si;
    PROCESS_INFORMATION pi;
    memset(&si, 0, sizeof si);
    si.cb = sizeof si;
    BOOL ok = CreateProcessA(exe, cmd, NULL, NULL, FALSE, 0, NULL, NULL, &si, &pi);
    free(cmd);
    if (!ok) { last_err = GetLastError(); return -1; }
    CloseHandle(pi.hThread);
    port_proc *p = malloc(sizeof *p);
    if (!p) { TerminateProcess(pi.hProcess, 9); CloseHandle(pi.hProcess); return -1; }
    p->h = pi.hProcess;
    *out = p;
    return 0;
}

int port_proc_kill(port_proc *p)
{
    if (!TerminateProcess(p->h, 137)) { last_err = GetLastError(); return -1; }
    return 0;
}

int port_proc_wait(port_proc *p, int *code)
{
    DWORD c = 0;
    WaitForSingleObject(p->h, INFINITE);
    GetExitCodeProcess(p->h, &c);
    CloseHandle(p->h);
    free(p);
    if (code) *code = (int)c;
    return 0;
}

#else /* POSIX */

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct port_file { int fd; };
struct port_mutex { pthread_mutex_t m; };
struct port_cond { pthread_cond_t c; };
struct port_thread { pthread_t t; void (*fn)(void *); void *arg; };
struct port_proc { pid_t pid; };

static _Thread_local int last_errno;

const char *port_errstr(char *buf, size_t n)
{
    snprintf(buf, n, "%s", strerror(last_errno));
    return buf;
}

int port_open(const char *path, int create, port_file **out)
{
    int fd = open(path, O_RDWR | (create ? O_CREAT : 0), 0644);
    if (fd < 0) { last_errno = errno; return -1; }
    port_file *f = malloc(sizeof *f);
    if (!f) { close(fd); return -1; }
    f->fd = fd;
    *out = f;
    return 0;
}

long port_pread(port_file *f, void *buf, size_t n, uint64_t off)
{
    size_t done = 0;
    while (done < n) {
        ssize_t r = pread(f->fd, (char *)buf + done, n - done, (off_t)(off + done));
        if (r < 0) {
            if (errno == EINTR) continue;
            last_errno = errno;
            return -1;
        }
        if (r == 0) break;
        done += (size_t)r;
    }
    return (long)done;
}

int port_pwrite(port_file *f, const void *buf, size_t n, uint64_t off)
{
    size_t done = 0;
    while (done < n) {
        ssize_t r = pwrite(f->fd, (const char *)buf + done, n - done, (off_t)(off + done));
        if (r < 0) {
            if (errno == EINTR) continue;
            last_errno = errno;
            return -1;
        }
        done += (size_t)r;
    }
    return 0;
}

int port_sync(port_file *f)
{
    if (fsync(f->fd) != 0) { last_errno = errno; return -1; }
    return 0;
}

int port_trylock(port_file *f)
{
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    if (fcntl(f->fd, F_SETLK, &fl) != 0) { last_errno = errno; return -1; }
    return 0;
}

int64_t port_size(port_file *f)
{
    struct stat st;
    if (fstat(f->fd, &st) != 0) { last_errno = errno; return -1; }
    return (int64_t)st.st_size;
}

int port_truncate(port_file *f, uint64_t size)
{
    if (ftruncate(f->fd, (off_t)size) != 0) { last_errno = errno; return -1; }
    return 0;
}

void port_close(port_file *f)
{
    if (f) { close(f->fd); free(f); }
}

int port_remove(const char *path)
{
    if (unlink(path) != 0) { last_errno = errno; return -1; }
    return 0;
}

int port_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

int port_mkdir(const char *path)
{
    if (mkdir(path, 0755) != 0 && errno != EEXIST) { last_errno = errno; return -1; }
    return 0;
}

port_mutex *port_mutex_new(void)
{
    port_mutex *m = malloc(sizeof *m);
    if (m) pthread_mutex_init(&m->m, NULL);
    return m;
}
void port_mutex_free(port_mutex *m)
{
    if (m) { pthread_mutex_destroy(&m->m); free(m); }
}
void port_lock(port_mutex *m) { pthread_mutex_lock(&m->m); }
void port_unlock(port_mutex *m) { pthread_mutex_unlock(&m->m); }
port_cond *port_cond_new(void)
{
    port_cond *c = malloc(sizeof *c);
    if (c) pthread_cond_init(&c->c, NULL);
    return c;
}
void port_cond_free(port_cond *c)
{
    if (c) { pthread_cond_destroy(&c->c); free(c); }
}
void port_cond_wait(port_cond *c, port_mutex *m) { pthread_cond_wait(&c->c, &m->m); }
void port_cond_broadcast(port_cond *c) { pthread_cond_broadcast(&c->c); }

static void *thread_tramp(void *p)
{
    port_thread *t = p;
    t->fn(t->arg);
    return NULL;
}

int port_thread_start(port_thread **out, void (*fn)(void *), void *arg)
{
    port_thread *t = malloc(sizeof *t);
    if (!t) return -1;
    t->fn = fn;
    t->arg = arg;
    if (pthread_create(&t->t, NULL, thread_tramp, t) != 0) { free(t); return -1; }
    *out = t;
    return 0;
}

void port_thread_join(port_thread *t)
{
    pthread_join(t->t, NULL);
    free(t);
}

uint64_t port_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void port_sleep_ms(unsigned ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

unsigned port_pid(void) { return (unsigned)getpid(); }

int port_proc_spawn_self(int argc, char **argv, int (*fn)(int, char **), port_proc **out)
{
    port_proc *p = malloc(sizeof *p);
    if (!p) return -1;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) { last_errno = errno; free(p); return -1; }
    if (pid == 0) {
        int rc = fn(argc, argv);
        fflush(NULL);
        _exit(rc);
    }
    p->pid = pid;
    *out = p;
    return 0;
}

int port_proc_kill(port_proc *p)
{
    if (kill(p->pid, SIGKILL) != 0) { last_errno = errno; return -1; }
    return 0;
}

int port_proc_wait(port_proc *p, int *code)
{
    int st = 0;
    while (waitpid(p->pid, &st, 0) < 0 && errno == EINTR) {}
    free(p);
    if (code) *code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    return 0;
}

#endif
