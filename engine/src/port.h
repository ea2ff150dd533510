/* port.h - the engine's only portability layer: files, locks, threads, time
 * and child processes.  Everything OS-specific lives behind these calls so the
 * rest of the engine is plain C11. */
#ifndef GFE_PORT_H
#define GFE_PORT_H

#include <stddef.h>
#include <stdint.h>

typedef struct port_file port_file;
typedef struct port_mutex port_mutex;
typedef struct port_cond port_cond;
typedef struct port_thread port_thread;
typedef struct port_proc port_proc;

/* Files: positional I/O only, so callers never share a file offset. */
int port_open(const char *path, int create, port_file **out);
long port_pread(port_file *f, void *buf, size_t n, uint64_t off);
int port_pwrite(port_file *f, const void *buf, size_t n, uint64_t off);
int port_sync(port_file *f);
/* Exclusive advisory lock held until close or process death; -1 if taken. */
int port_trylock(port_file *f);
int64_t port_size(port_file *f);
int port_truncate(port_file *f, uint64_t size);
void port_close(port_file *f);
int port_remove(const char *path);
int port_exists(const char *path);
int port_mkdir(const char *path);
/* Human-readable text for the last failed port_* call on this thread. */
const char *port_errstr(char *buf, size_t n);

port_mutex *port_mutex_new(void);
void port_mutex_free(port_mutex *m);
void port_lock(port_mutex *m);
void port_unlock(port_mutex *m);
port_cond *port_cond_new(void);
void port_cond_free(port_cond *c);
void port_cond_wait(port_cond *c, port_mutex *m);
void port_cond_broadcast(port_cond *c);

int port_thread_start(port_thread **t, void (*fn)(void *), void *arg);
void port_thread_join(port_thread *t);

uint64_t port_now_ns(void);  /* monotonic */
void port_sleep_ms(unsigned ms);
unsigned port_pid(void);

/* Start a copy of this program running fn(argc, argv).  POSIX forks and
 * calls fn directly (works under qemu-user, which cannot exec a foreign
 * binary without binfmt_misc); Windows re-runs the executable with argv,
 * whose main() must dispatch argv[1] to fn. */
int port_proc_spawn_self(int argc, char **argv, int (*fn)(int, char **), port_proc **out);
int port_proc_kill(port_proc *p);               /* SIGKILL / TerminateProcess */
int port_proc_wait(port_proc *p, int *exit_code); /* reaps; frees p */

#endif
