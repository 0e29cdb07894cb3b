"""The jail that model-written code runs in: bubblewrap (Debian's `bubblewrap`).

Inside: new user, mount, PID, network, IPC and UTS namespaces; a read-only root holding only
/usr (the system interpreter and its standard library; no venv, no project, no data, no /run,
no host /tmp, the system's site-packages hidden); a private tmpfs /tmp as working directory; no
environment; no network but its own loopback; `--die-with-parent`, so nothing outlives the run.
As root, bubblewrap itself is started under a fresh unprivileged uid per sandbox (setpriv), so
concurrent sandboxes are different users outside too and per-user limits (processes) are per
sandbox; as another user it runs rootless under that user.

A seccomp filter (bubblewrap's --seccomp) makes socket(2) fail: the network namespace already
has nothing to reach, and a program that cannot open a socket cannot reach an abstract Unix
socket either.

Where no jail works, code tasks refuse to run (`JailUnavailable`) unless the user opts in with
`sandbox.unsafe=true`: then the program runs under the harness's own interpreter with rlimits
only, and every result says `isolation: unsafe`.
"""
from __future__ import annotations

import itertools
import os
import platform
import shutil
import struct
import subprocess
import threading
from dataclasses import dataclass
from functools import lru_cache
from typing import List, Optional

JAIL_PYTHON = "/usr/bin/python3"  # the system interpreter: its stdlib only
UID_BASE, UID_SPAN = 200_000, 800_000  # unprivileged uids for jails started by root (no passwd entry needed)
_uids = itertools.count()
_uid_lock = threading.Lock()


# seccomp: the syscall number of socket(2) and the audit arch per machine (linux/audit.h)
_SOCKET = {"x86_64": (41, 0xC000003E), "aarch64": (198, 0xC00000B7)}


def socket_filter() -> Optional[bytes]:
    """A classic-BPF seccomp program that makes socket(2) fail with EPERM (and kills a process that
    uses another syscall ABI), for bubblewrap's --seccomp; None on a machine it does not know."""
    known = _SOCKET.get(platform.machine())
    if known is None:
        return None
    nr, arch = known
    ld_abs, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    allow, eperm, kill = 0x7FFF0000, 0x00050000 | 1, 0x80000000
    program = [
        (ld_abs, 0, 0, 4),             # 0: arch
        (jeq, 0, 5, arch),             # 1: other arch -> 7
        (ld_abs, 0, 0, 0),             # 2: syscall number
        (jge, 3, 0, 0x40000000),       # 3: x32 ABI -> 7
        (jeq, 1, 0, nr),               # 4: socket -> 6
        (ret, 0, 0, allow),            # 5
        (ret, 0, 0, eperm),            # 6
        (ret, 0, 0, kill),             # 7
    ]
    return b"".join(struct.pack("HBBI", *insn) for insn in program)


class JailUnavailable(RuntimeError):
    """No jail can run model-written code here; the message says what is missing."""


@dataclass(frozen=True)
class Jail:
    unsafe: bool = False  # no jail: rlimits only (sandbox.unsafe=true)
    python: str = JAIL_PYTHON

    @property
    def isolation(self) -> List[str]:
        if self.unsafe:
            return ["unsafe", "rlimits", "clean-env"]
        return ["bubblewrap", "user-namespace", "mount-namespace", "pid-namespace", "net-namespace",
                "ipc-namespace", "ro-usr-only", "private-tmp", "clean-env", "rlimits",
                "distinct-uid" if os.geteuid() == 0 else "rootless"] + (["seccomp-no-socket"] if socket_filter() else [])

    def command(self, argv: List[str], seccomp_fd: Optional[int] = None) -> List[str]:
        """The command line that runs `argv` (an interpreter call) in a fresh jail; `seccomp_fd`, an
        open file holding `socket_filter()`, passed on to the child (pass_fds)."""
        if self.unsafe:
            return argv
        prefix: List[str] = []
        if os.geteuid() == 0:
            with _uid_lock:
                uid = UID_BASE + (os.getpid() * 4096 + next(_uids)) % UID_SPAN
            prefix = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all"]
        hidden = [p for p in ("/usr/lib/python3/dist-packages", "/usr/local") if os.path.isdir(p)]
        return prefix + [
            "bwrap", "--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
            "--symlink", "usr/bin", "/bin", *[a for p in hidden for a in ("--tmpfs", p)],
            "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--chdir", "/tmp",
            "--unshare-all", "--die-with-parent", "--new-session", "--clearenv",
            *(["--seccomp", str(seccomp_fd)] if seccomp_fd is not None else []),
            "--setenv", "PATH", "/usr/bin", "--setenv", "HOME", "/tmp", "--setenv", "LANG", "C.UTF-8",
            "--", *argv]


@lru_cache(maxsize=1)
def prlimit() -> Optional[str]:
    """util-linux's prlimit, which sets the sandbox's rlimits and execs the jail: the system's own
    (like JAIL_PYTHON), whatever the harness's PATH holds."""
    return shutil.which("prlimit", path="/usr/bin:/bin")


@lru_cache(maxsize=1)
def jail_problem() -> Optional[str]:
    """None when the jail works here, else what is missing."""
    if not shutil.which("bwrap"):
        return "bubblewrap (bwrap) is not installed"
    if not os.path.exists(JAIL_PYTHON):
        return f"{JAIL_PYTHON} (the system interpreter the jail runs) is missing"
    if os.geteuid() == 0 and not shutil.which("setpriv"):
        return "setpriv (util-linux) is missing"
    if prlimit() is None:
        return "prlimit (util-linux) is missing from /usr/bin"
    try:
        probe = subprocess.run(Jail().command([JAIL_PYTHON, "-I", "-c", "import os; print(len(os.listdir('/tmp')))"]),
                               capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap could not start ({exc})"
    if probe.returncode != 0 or probe.stdout.strip() != "0":
        return f"bubblewrap could not create its namespaces here ({(probe.stderr.strip() or probe.stdout.strip())[:200]})"
    return None


def find_jail(unsafe: bool = False) -> Jail:
    """The jail to use, or JailUnavailable naming what is missing (fail closed)."""
    if unsafe:
        if prlimit() is None:  # the limits are all an unjailed program has
            raise JailUnavailable("no limits for model-written code: prlimit (util-linux) is missing from /usr/bin")
        return Jail(unsafe=True, python=os.environ.get("MARL_UNSAFE_PYTHON", JAIL_PYTHON if os.path.exists(JAIL_PYTHON)
                                                      else "python3"))
    problem = jail_problem()
    if problem:
        raise JailUnavailable(f"no jail for model-written code: {problem}. Install bubblewrap (Debian/Ubuntu: "
                              f"apt-get install bubblewrap; `make setup` does it as root), or set sandbox.unsafe=true "
                              f"to run code without a jail (never for RL on a model you do not trust)")
    return Jail()
