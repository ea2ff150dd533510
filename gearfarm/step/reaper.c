/* The job supervisor: gearfarm.hosts.process.run_logged starts one per catalog command, as
 * `gearfarm-reaper WORKER_PID STATUS_FD TIMEOUT`, with the command's argv, environment and stage
 * on stdin (process.reaper_input, the one definition of that format: NUL-terminated strings,
 * the argv's count and items, the environment's count and KEY=VALUE items, then "0", or "1",
 * the stage's top, the count of its sources and each source; see stage(); then the count of the
 * cgroup.procs files the command joins and each file, see join()). It runs the command
 * and, when the command exits, when the timeout passes, when it is told to stop
 * (SIGTERM/SIGINT/SIGHUP) or when the worker dies (even by kill -9), kills every process the
 * command started -- grandchildren that left the process group or were daemonised included --
 * reaps them, reports "<reason> <wait status>" on STATUS_FD and exits.
 *
 * Hand-written because no existing tool or library does all of it: tini and dumb-init (made to
 * be a container's PID 1) forward signals to one child or its process group and exit when that
 * child exits, leaving setsid'd or daemonised descendants behind, with no timeout; systemd-run
 * scopes need a systemd with cgroup delegation, which workers in containers do not have; psutil
 * can walk a tree but cannot learn that the worker died. The kernel pieces are
 * PR_SET_CHILD_SUBREAPER (orphaned descendants become our children instead of init's, so they
 * can always be found and reaped) and PR_SET_PDEATHSIG (we hear of the worker's death).
 *
 * C, not Python: it starts once per command, and a Python interpreter's start (with ctypes for
 * prctl, unshare and mount) was 14-21 ms of CPU and of wall per command, half of everything a
 * job's command cost beyond its own work (docs/speed.md, twenty-second round); this starts in
 * about a millisecond. The worker compiles it on first use (process.reaper_command). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* What a process that left the command's group gets between SIGTERM and SIGKILL. wineserver
 * saves and exits in well under it; one of wine's own services (winedevice.exe) ignores SIGTERM,
 * so every wine job pays the whole grace: keep it short. */
#define TERM_GRACE 1.0
/* How long to keep killing descendants that do not die (uninterruptible sleep on a dead NFS
 * server, say) before reporting anyway: the worker must not hang with them. */
#define KILL_PATIENCE 10.0
/* The worker's death is signalled with SIGUSR1, not SIGTERM, because the kernel also sends it
 * when merely the worker *thread* that started us exits (PDEATHSIG follows the parent thread;
 * we are then reparented to a sibling thread and the signal stays armed). So the signal only
 * means "look": getppid() no longer being the worker is what says the worker is gone. */
#define PARENT_DIED SIGUSR1
/* /proc's processes looked at once, and descendants killed, at most. */
#define MAX_PROCS 65536

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static char *input;
static size_t input_len, pos;

static const char *next_str(void) {
    if (pos >= input_len) return NULL;
    const char *s = input + pos;
    size_t n = strnlen(s, input_len - pos);
    if (pos + n >= input_len) return NULL;
    pos += n + 1;
    return s;
}

/* The next count of strings and as many strings, as a NULL-terminated array (its count in *n);
 * NULL for a count that is not one or that the input cannot hold, or a string cut short: a
 * torn or foreign input runs nothing. */
static char **next_strs(int *n) {
    const char *count = next_str();
    char *end;
    if (!count) return NULL;
    long got = strtol(count, &end, 10);
    if (*count == 0 || *end != 0 || got < 0 || (size_t)got > input_len) return NULL;
    char **out = calloc((size_t)got + 1, sizeof *out);
    if (!out) return NULL;
    for (long i = 0; i < got; i++)
        if (!(out[i] = (char *)next_str())) return NULL;
    *n = (int)got;
    return out;
}

static int read_all(int fd) {
    size_t cap = 1 << 16;
    input = malloc(cap);
    if (!input) return -1;
    for (;;) {
        if (input_len == cap) {
            cap *= 2;
            char *p = realloc(input, cap);
            if (!p) return -1;
            input = p;
        }
        ssize_t r = read(fd, input + input_len, cap - input_len);
        if (r < 0) { if (errno == EINTR) continue; return -1; }
        if (r == 0) return 0;
        input_len += (size_t)r;
    }
}

static void report(int fd, const char *text) {
    ssize_t unused = write(fd, text, strlen(text));
    (void)unused;
    close(fd);
}

/* In a mount namespace of this process's own (so of the command's alone), a small tmpfs at top
 * and each of sources bound at top/0, top/1, ...: a root worker's job directories lie under its
 * own private ones (its state directory is 0700), and there the job's uid finds them to bind
 * into its sandbox (gearfarm/step/sandbox.py); nothing else of the host becomes reachable that
 * way. What util-linux's `unshare --mount --propagation private` and `mount` do. Propagation is
 * made private first: with the host's mounts shared (systemd's default) the stage's mounts would
 * otherwise appear in the host's own namespace. The errno of a failure, what failed in what. */
static int stage(const char *top, char **sources, int n, char *what, size_t whatlen) {
    int err;
    if (unshare(CLONE_NEWNS) != 0) {
        err = errno; snprintf(what, whatlen, "unshare(CLONE_NEWNS): %s", strerror(err)); return err; }
    if (mount("none", "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) {
        err = errno; snprintf(what, whatlen, "making / private: %s", strerror(err)); return err; }
    if (mount("gearfarm-stage", top, "tmpfs", 0, "mode=0711,size=64k") != 0) {
        err = errno; snprintf(what, whatlen, "mounting a tmpfs at %s: %s", top, strerror(err)); return err; }
    for (int i = 0; i < n; i++) {
        char point[4096];
        snprintf(point, sizeof point, "%s/%d", top, i);
        if (mkdir(point, 0711) != 0) {
            err = errno; snprintf(what, whatlen, "making %s: %s", point, strerror(err)); return err; }
        if (mount(sources[i], point, NULL, MS_BIND, NULL) != 0) {
            err = errno; snprintf(what, whatlen, "binding %s at %s: %s", sources[i], point, strerror(err)); return err; }
    }
    return 0;
}

/* Move this process (the command, before it stages or execs) into each of the job's cgroups
 * (gearfarm/hosts/cgroup.py): the command and everything it starts are bounded from their first
 * instruction, and the reaper itself stays outside them, so a job at its process or memory limit
 * cannot keep its supervisor from killing it. "0" is the writing process, in v1 and v2. */
static int join(char **procs, int n, char *what, size_t whatlen) {
    for (int i = 0; i < n; i++) {
        int fd = open(procs[i], O_WRONLY | O_CLOEXEC);
        if (fd < 0 || write(fd, "0", 1) != 1) {
            int err = errno;
            if (fd >= 0) close(fd);
            snprintf(what, whatlen, "joining the job's cgroup %s: %s", procs[i], strerror(err));
            return err;
        }
        close(fd);
    }
    return 0;
}

/* execve through the command's own PATH (glibc's execvpe searches the reaper's); the first
 * error other than "not there" wins, as in Popen. Returns only on failure, errno set. */
static void exec_path(char **argv, char **envp) {
    if (strchr(argv[0], '/')) { execve(argv[0], argv, envp); return; }
    const char *path = "/bin:/usr/bin";
    for (char **e = envp; *e; e++) if (strncmp(*e, "PATH=", 5) == 0) { path = *e + 5; break; }
    int first = 0;
    char buf[4096];
    const char *p = path;
    for (;;) {
        const char *end = strchr(p, ':');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        snprintf(buf, sizeof buf, "%.*s/%s", (int)len, len ? p : ".", argv[0]);
        execve(buf, argv, envp);
        if (errno != ENOENT && errno != ENOTDIR && !first) first = errno;
        if (!end) break;
        p = end + 1;
    }
    errno = first ? first : ENOENT;
}

/* fork+exec the command in its own process group (inside our session), so that killpg() spares
 * us, with the signal mask and dispositions it would have had under Popen (SIGPIPE and SIGXFSZ
 * at their defaults), in its cgroups (join()), staged first if top says where (stage()). A failure to stage or exec
 * comes back through a close-on-exec pipe ("errno what"; EOF means the exec succeeded). */
static pid_t spawn(char **argv, char **envp, const sigset_t *mask, const char *top, char **sources, int n,
                   char **procs, int nprocs, char *err, size_t errlen) {
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) { snprintf(err, errlen, "%d pipe", errno); return -1; }
    pid_t pid = fork();
    if (pid < 0) { snprintf(err, errlen, "%d fork", errno); close(p[0]); close(p[1]); return -1; }
    if (pid == 0) {
        char what[8192] = "";
        close(p[0]);
        setpgid(0, 0);
        signal(SIGPIPE, SIG_DFL);
        signal(SIGXFSZ, SIG_DFL);
        sigprocmask(SIG_SETMASK, mask, NULL);
        int code = join(procs, nprocs, what, sizeof what);
        if (code == 0 && top) code = stage(top, sources, n, what, sizeof what);
        if (code == 0) { exec_path(argv, envp); code = errno; what[0] = 0; }
        char msg[8300];
        int len = snprintf(msg, sizeof msg, "%d %s", code, what);
        ssize_t unused = write(p[1], msg, (size_t)len);
        (void)unused;
        _exit(127);
    }
    close(p[1]);
    setpgid(pid, pid);
    char buf[8300];
    size_t got = 0;
    for (;;) {
        ssize_t r = read(p[0], buf + got, sizeof buf - 1 - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(p[0]);
    if (got) {
        buf[got] = 0;
        waitpid(pid, NULL, 0);
        snprintf(err, errlen, "%s", buf);
        return -1;
    }
    return pid;
}

/* Reap every exited child except the command, which is left a zombie: while it is one, its pid
 * -- and so its process group id -- cannot be reused, and killpg(cmd) stays safe. 1 when the
 * command exited. */
static int exited(pid_t cmd) {
    for (;;) {
        siginfo_t info;
        memset(&info, 0, sizeof info);
        if (waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0) return errno == ECHILD;
        if (info.si_pid == 0) return 0;
        if (info.si_pid == cmd) return 1;
        waitpid(info.si_pid, NULL, 0);
    }
}

static const char *watch(pid_t cmd, pid_t worker, double deadline, const sigset_t *wake) {
    for (;;) {
        if (exited(cmd)) return "exit";
        if (getppid() != worker) return "orphaned";
        double left = deadline - now();
        if (left <= 0) return "timeout";
        if (left > 3600) left = 3600;
        struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
        int sig = sigtimedwait(wake, NULL, &ts);
        if (sig == SIGTERM || sig == SIGINT || sig == SIGHUP) return "terminated";
    }
}

/* Every process whose parent chain leads to root, from /proc (kernels without
 * CONFIG_PROC_CHILDREN have no cheaper list). */
static int descendants(pid_t root, pid_t *out, int max) {
    static pid_t pids[MAX_PROCS], ppids[MAX_PROCS];
    int n = 0;
    DIR *d = opendir("/proc");
    if (!d) return 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < MAX_PROCS) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        char path[300], stat[1024];
        snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        ssize_t r = read(fd, stat, sizeof stat - 1);
        close(fd);
        if (r <= 0) continue;
        stat[r] = 0;
        char *rp = strrchr(stat, ')');
        if (!rp) continue;
        char state;
        int ppid;
        if (sscanf(rp + 2, "%c %d", &state, &ppid) != 2) continue;
        pids[n] = atoi(e->d_name);
        ppids[n] = ppid;
        n++;
    }
    closedir(d);
    int found = 0, done = 0;
    static pid_t todo[MAX_PROCS];
    int ntodo = 0;
    todo[ntodo++] = root;
    while (done < ntodo) {
        pid_t parent = todo[done++];
        for (int i = 0; i < n; i++)
            if (ppids[i] == parent && found < max && ntodo < MAX_PROCS) { out[found++] = pids[i]; todo[ntodo++] = pids[i]; }
    }
    return found;
}

/* Kill the command's process group and every other descendant, reap them all; 1 with the
 * command's raw wait status in status_out (0: it could not be killed). The group gets SIGKILL at
 * once. Processes that left it are mostly daemons, and some must be asked first: wineserver
 * saves the wine prefix's registry on SIGTERM and loses it on SIGKILL. They get SIGTERM,
 * TERM_GRACE to go, then SIGKILL. */
static int kill_tree(pid_t cmd, int *status_out) {
    kill(-cmd, SIGKILL);
    int have = 0;
    double started = now();
    static pid_t asked[MAX_PROCS];
    int nasked = 0;
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    for (;;) {
        for (;;) {
            int st;
            pid_t pid = waitpid(-1, &st, WNOHANG);
            /* As a subreaper we inherit every orphaned descendant, so having no child left means
             * no descendant is left: done, usually without reading /proc. */
            if (pid < 0) return have;
            if (pid == 0) break;
            if (pid == cmd) { *status_out = st; have = 1; }
        }
        static pid_t left[MAX_PROCS];
        int nleft = descendants(getpid(), left, MAX_PROCS);
        double waited = now() - started;
        for (int i = 0; i < nleft; i++) {
            int seen = 0;
            for (int j = 0; j < nasked; j++) if (asked[j] == left[i]) { seen = 1; break; }
            if (waited < TERM_GRACE && seen) continue;
            if (!seen && nasked < MAX_PROCS) asked[nasked++] = left[i];
            kill(left[i], waited < TERM_GRACE ? SIGTERM : SIGKILL);
        }
        if (waited > TERM_GRACE + KILL_PATIENCE) {
            fprintf(stderr, "gearfarm reaper: %d processes of the job did not die within %.0fs; leaving them\n",
                    nleft, TERM_GRACE + KILL_PATIENCE);
            return have;
        }
        struct timespec ts = {0, 50000000};
        sigtimedwait(&chld, NULL, &ts);
    }
}

int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: reaper WORKER_PID STATUS_FD TIMEOUT (the job on stdin)\n"); return 2; }
    pid_t worker = (pid_t)atol(argv[1]);
    int status_fd = atoi(argv[2]);
    double timeout = atof(argv[3]);
    sigset_t wake, mask;
    sigemptyset(&wake);
    sigaddset(&wake, SIGTERM); sigaddset(&wake, SIGINT); sigaddset(&wake, SIGHUP);
    sigaddset(&wake, SIGCHLD); sigaddset(&wake, PARENT_DIED);
    sigprocmask(SIG_BLOCK, &wake, &mask);
    signal(SIGCHLD, SIG_DFL);
    if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0 || prctl(PR_SET_PDEATHSIG, PARENT_DIED, 0, 0, 0) != 0) {
        perror("prctl"); return 1; }
    if (getppid() != worker) return 0;  /* the worker died before the signal was armed: run nothing */
    if (read_all(0) != 0) return 0;  /* the worker died while handing the job over: run nothing */
    int cargc, envc, nsrc = 0, nprocs = 0;
    char **cargv = next_strs(&cargc), **envp = cargv ? next_strs(&envc) : NULL, **sources = NULL, **procs;
    const char *staged = envp ? next_str() : NULL, *top = NULL;
    if (!staged || cargc < 1) return 0;
    if (strcmp(staged, "0") != 0) {
        top = next_str();
        sources = top ? next_strs(&nsrc) : NULL;
        if (!sources) return 0;
    }
    if (!(procs = next_strs(&nprocs))) return 0;
    int devnull = open("/dev/null", O_RDONLY);  /* the command's stdin */
    dup2(devnull, 0);
    close(devnull);
    fcntl(status_fd, F_SETFD, FD_CLOEXEC);
    char err[8400];
    pid_t cmd = spawn(cargv, envp, &mask, top, sources, nsrc, procs, nprocs, err, sizeof err);
    if (cmd < 0) {
        char msg[8500];
        int code = atoi(err);
        const char *what = strchr(err, ' ');
        what = what ? what + 1 : "";
        if (*what) snprintf(msg, sizeof msg, "error [Errno %d] cannot %s: %s", code,
                            strncmp(what, "joining", 7) == 0 ? "start the job in its cgroup" : "stage the job's directories",
                            what);
        else snprintf(msg, sizeof msg, "error [Errno %d] %s: '%s'", code, strerror(code), cargv[0]);
        report(status_fd, msg);
        return 0;
    }
    const char *reason = watch(cmd, worker, now() + timeout, &wake);
    int status = 0;
    char msg[128];
    if (kill_tree(cmd, &status)) snprintf(msg, sizeof msg, "%s %d", reason, status);
    else snprintf(msg, sizeof msg, "%s None", reason);
    report(status_fd, msg);
    return 0;
}
