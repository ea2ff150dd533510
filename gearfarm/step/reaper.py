"""The job supervisor: process.run_logged starts one per catalog command, as
``python -I -S reaper.py WORKER_PID STATUS_FD TIMEOUT`` (or importing it, see
process.REAPER_COMMAND) with the command's argv, environment and stage marshalled on stdin
(the stage: None, or where to bind which of the job's directories in a mount namespace of the
command's own, see stage()). It runs the command and, when the command exits, when the
timeout passes, when it is told to stop (SIGTERM/SIGINT/SIGHUP) or when the worker dies
(even by kill -9), kills every process the command started -- grandchildren that left the
process group or were daemonised included -- reaps them, reports "<reason> <wait status>"
on STATUS_FD and exits.

Hand-written because no existing tool or library does all of it: tini and dumb-init (made to
be a container's PID 1) forward signals to one child or its process group and exit when that
child exits, leaving setsid'd or daemonised descendants behind, with no timeout; systemd-run
scopes need a systemd with cgroup delegation, which workers in containers do not have; psutil
can walk a tree but cannot learn that the worker died. The kernel pieces are PR_SET_CHILD_SUBREAPER (orphaned
descendants become our children instead of init's, so they can always be found and reaped)
and PR_SET_PDEATHSIG (we hear of the worker's death).

Kept to builtin and tiny stdlib modules and started with -I -S (no site, no gearfarm package,
no PYTHON* variables): it starts once per job, and interpreter startup is most of its cost."""

import _signal as signal  # the C module: the signal wrapper imports enum, a third of our startup
import ctypes
import marshal
import os
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
# <sched.h>, <sys/mount.h>
CLONE_NEWNS = 0x00020000
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
# The worker's death is signalled with SIGUSR1, not SIGTERM, because the kernel also sends it
# when merely the worker *thread* that started us exits (PDEATHSIG follows the parent thread;
# we are then reparented to a sibling thread and the signal stays armed). So the signal only
# means "look": getppid() no longer being the worker is what says the worker is gone.
PARENT_DIED = signal.SIGUSR1
STOP = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
# Blocked for the whole life of the reaper and taken with sigtimedwait(): no handler runs at
# an awkward moment, and a signal that arrives before we wait is kept pending, not lost.
WAKE = STOP | {signal.SIGCHLD, PARENT_DIED}
# Python ignores these at startup; the command must get them at their defaults, as
# subprocess.Popen's restore_signals gives them. (Not os.posix_spawn: glibc's leaves its
# internal signals 32 and 33 ignored across exec, which Popen does not.)
RESET = [s for s in (signal.SIGPIPE, getattr(signal, "SIGXFSZ", None)) if s is not None]
# What a process that left the command's group gets between SIGTERM and SIGKILL. wineserver
# saves and exits in well under it; one of wine's own services (winedevice.exe) ignores
# SIGTERM, so every wine job pays the whole grace: keep it short.
TERM_GRACE = 1.0
# How long to keep killing descendants that do not die (uninterruptible sleep on a dead NFS
# server, say) before reporting anyway: the worker must not hang with them.
KILL_PATIENCE = 10.0


def checked(result: int, what: str) -> None:
    """A libc call's result as Python's own calls report one: OSError with errno set."""
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def prctl(libc: ctypes.CDLL, option: int, arg: int) -> None:
    checked(libc.prctl(ctypes.c_int(option), ctypes.c_ulong(arg), ctypes.c_ulong(0), ctypes.c_ulong(0),
                       ctypes.c_ulong(0)), f"prctl({option})")


def read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


def stage(libc: ctypes.CDLL, top: str, sources: list[str]) -> None:
    """In a mount namespace of this process's own (so of the command's alone), a small tmpfs at
    ``top`` and each of ``sources`` bound at top/0, top/1, ...: a root worker's job directories
    lie under its own private ones (its state directory is 0700), and there the job's uid finds
    them to bind into its sandbox (gearfarm/step/sandbox.py); nothing else of the host becomes
    reachable that way. What util-linux's ``unshare --mount --propagation private`` and
    ``mount`` do, with system calls instead of a shell and a dozen programs per command.
    Propagation is made private first: with the host's mounts shared (systemd's default) the
    stage's mounts would otherwise appear in the host's own namespace."""
    def mount(source: str, target: str, fstype: bytes | None, flags: int, data: bytes | None, what: str) -> None:
        checked(libc.mount(os.fsencode(source), os.fsencode(target), fstype, ctypes.c_ulong(flags), data), what)

    checked(libc.unshare(ctypes.c_int(CLONE_NEWNS)), "unshare(CLONE_NEWNS)")
    mount("none", "/", None, MS_REC | MS_PRIVATE, None, "making / private")
    mount("gearfarm-stage", top, b"tmpfs", 0, b"mode=0711,size=64k", f"mounting a tmpfs at {top}")
    for n, source in enumerate(sources):
        point = f"{top}/{n}"
        try:
            os.mkdir(point, 0o711)
        except OSError as e:
            raise OSError(e.errno, f"making {point}: {e.strerror}") from None
        mount(source, point, None, MS_BIND, None, f"binding {source} at {point}")


def spawn(argv: list[str], env: dict[str, str], mask: set[int], staged: tuple[str, list[str]] | None,
          libc: ctypes.CDLL) -> int:
    """fork+exec the command in its own process group (inside our session), so that killpg()
    spares us, with the signal mask and dispositions it would have had under Popen, staged
    first if ``staged`` says where (stage()). Exec and staging failures are raised here, as
    Popen raises its exec failures."""
    err_r, err_w = os.pipe()  # close-on-exec: EOF means the exec succeeded
    pid = os.fork()
    if pid == 0:
        staging = False
        try:
            os.close(err_r)
            os.setpgid(0, 0)
            for s in RESET:
                signal.signal(s, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            if staged is not None:
                staging = True
                stage(libc, *staged)
                staging = False
            execvpe(argv, env)
        except BaseException as e:
            what = (getattr(e, "strerror", None) or str(e)) if staging else ""
            os.write(err_w, f"{getattr(e, 'errno', None) or 0} {what}".encode(errors="replace"))
        finally:
            os._exit(127)
    os.close(err_w)
    try:
        os.setpgid(pid, pid)  # also here, so the group exists whichever of us runs first
    except OSError:
        pass  # it already exec'd (EACCES) or died
    err = read_all(err_r)
    os.close(err_r)
    if err:
        os.waitpid(pid, 0)
        number, _, what = err.decode(errors="replace").partition(" ")
        code = int(number)
        if what:  # the staging's own account of what failed
            raise OSError(code, f"cannot stage the job's directories: {what}")
        raise OSError(code, os.strerror(code) if code else "exec failed", argv[0])
    return pid


def execvpe(argv: list[str], env: dict[str, str]) -> None:
    """os.execvpe's search of the command's PATH, without the warnings module it imports;
    the first error other than "not there" wins, as in Popen."""
    if "/" in argv[0]:
        os.execve(argv[0], argv, env)
    first: OSError | None = None
    for d in env.get("PATH", os.defpath).split(os.pathsep):
        try:
            os.execve(os.path.join(d or ".", argv[0]), argv, env)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as e:
            first = first or e
    raise first or FileNotFoundError(2, "No such file or directory", argv[0])


def exited(cmd: int) -> bool:
    """Reap every exited child except the command, which is left a zombie: while it is one,
    its pid -- and so its process group id -- cannot be reused, and killpg(cmd) stays safe."""
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True
        if info is None:
            return False
        if info.si_pid == cmd:
            return True
        os.waitpid(info.si_pid, 0)


def watch(cmd: int, worker: int, deadline: float) -> str:
    while True:
        if exited(cmd):
            return "exit"
        if os.getppid() != worker:
            return "orphaned"
        left = deadline - time.monotonic()
        if left <= 0:
            return "timeout"
        info = signal.sigtimedwait(WAKE, min(left, 3600.0))
        if info is not None and info.si_signo in STOP:
            return "terminated"


def descendants(root: int) -> list[int]:
    """Every process whose parent chain leads to ``root``, from /proc (kernels without
    CONFIG_PROC_CHILDREN have no cheaper list)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # exited while we looked
        # The command name (field 2) may hold spaces and parentheses: parse after the last ")".
        ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(name))
    found: list[int] = []
    todo = [root]
    while todo:
        for pid in children.get(todo.pop(), ()):
            found.append(pid)
            todo.append(pid)
    return found


def kill_tree(cmd: int) -> int | None:
    """Kill the command's process group and every other descendant, reap them all; the
    command's raw wait status (None if it could not be killed).

    The group gets SIGKILL at once, as it always has. Processes that left it are mostly
    daemons, and some must be asked first: wineserver saves the wine prefix's registry on
    SIGTERM and loses it on SIGKILL. They get SIGTERM, TERM_GRACE to go, then SIGKILL."""
    try:
        os.killpg(cmd, signal.SIGKILL)
    except OSError:
        pass  # the group is empty but for the zombie, or gone
    status: int | None = None
    started = time.monotonic()
    asked: set[int] = set()
    while True:
        while True:
            try:
                pid, st = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                # As a subreaper we inherit every orphaned descendant, so having no child
                # left means no descendant is left: done, usually without reading /proc.
                return status
            if pid == 0:
                break
            if pid == cmd:
                status = st
        # Descendants whose parent is still alive are not our children yet: signal them where
        # they are (a setsid'd or double-forked process has left the command's group).
        left = descendants(os.getpid())
        waited = time.monotonic() - started
        for pid in left:
            if waited < TERM_GRACE and pid in asked:
                continue
            asked.add(pid)
            try:
                os.kill(pid, signal.SIGTERM if waited < TERM_GRACE else signal.SIGKILL)
            except OSError:
                pass
        if waited > TERM_GRACE + KILL_PATIENCE:
            print(f"gearfarm reaper: processes {left} of the job did not die within "
                  f"{TERM_GRACE + KILL_PATIENCE:.0f}s; leaving them", file=sys.stderr, flush=True)
            return status
        signal.sigtimedwait({signal.SIGCHLD}, 0.05)


def report(fd: int, text: str) -> None:
    try:
        os.write(fd, text.encode(errors="replace"))
        os.close(fd)
    except OSError:
        pass  # the worker is gone; nobody to tell


def main(args: list[str]) -> int:
    if len(args) != 3:
        print("usage: reaper.py WORKER_PID STATUS_FD TIMEOUT  (argv, env, stage marshalled on stdin)", file=sys.stderr)
        return 2
    worker, status_fd, timeout = int(args[0]), int(args[1]), float(args[2])
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, WAKE)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # an ignored SIGCHLD would auto-reap the command
    libc = ctypes.CDLL(None, use_errno=True)
    prctl(libc, PR_SET_CHILD_SUBREAPER, 1)
    prctl(libc, PR_SET_PDEATHSIG, PARENT_DIED)
    if os.getppid() != worker:
        return 0  # the worker died before the signal was armed: run nothing
    try:
        argv, env, staged = marshal.loads(read_all(0))
    except (EOFError, ValueError, TypeError):
        return 0  # the worker died while handing the job over: run nothing
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # the command's stdin, as before: /dev/null
    os.close(devnull)
    os.set_inheritable(status_fd, False)
    try:
        cmd = spawn(argv, env, mask, staged, libc)
    except OSError as e:
        report(status_fd, f"error {e}")
        return 0
    reason = "crashed"
    try:
        reason = watch(cmd, worker, time.monotonic() + timeout)
    finally:
        status = kill_tree(cmd)
        report(status_fd, f"{reason} {status}")
    return 0


if __name__ == "__main__":  # as a script; run_logged imports it instead, to use its .pyc
    sys.exit(main(sys.argv[1:]))
