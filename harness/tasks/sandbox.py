"""Run untrusted, model-written Python in a separate process that cannot harm the harness.

Each program gets: its own process group and, where the harness runs as root with util-linux,
new network and PID namespaces (no network at all; the program is PID 1 of its own tree and
cannot see or signal the harness) and an unprivileged user (nobody); wall and CPU time limits,
an address-space limit, a file-size limit, a process-count limit, no core dumps; a throw-away
working directory; a scrubbed environment; and captured output bounded in size. Where namespaces
are not available, an audit hook installed before the program runs refuses sockets, signals to
other processes and subprocesses instead, and `isolation` in the result says so.

A program passes only if it exits 0 *and* prints the run's random sentinel after its checks:
exiting early (`os._exit(0)`, `sys.exit(0)`) is a failure, not a pass.
"""
from __future__ import annotations

import os
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import List, Optional, Sequence

NOBODY = 65534


@dataclass(frozen=True)
class SandboxLimits:
    wall_s: float = 10.0
    cpu_s: int = 8
    memory_mb: int = 1024  # address space
    file_size_mb: int = 4  # any file the program writes, stdout/stderr included
    max_processes: int = 16
    max_output_bytes: int = 64 * 1024


@dataclass
class RunResult:
    passed: bool
    status: str  # passed | failed | timeout | killed | output_limit | error
    returncode: Optional[int]
    stdout: str
    stderr: str
    wall_s: float
    isolation: List[str] = field(default_factory=list)

    @property
    def reason(self) -> str:
        tail = self.stderr.strip().splitlines()[-1:] if self.stderr.strip() else []
        return f"{self.status}" + (f": {tail[0][:200]}" if tail and self.status != "passed" else "")


# The trusted bootstrap: reads the sentinel and the program from files and deletes both before
# the program runs (a program that reads its own source finds neither), runs program + checks in
# a fresh namespace, and prints the sentinel only if they returned. Without namespaces it first
# installs an audit hook, which the program cannot remove, refusing the network, signals to other
# processes and new processes. Residual risk, documented: code that walks the interpreter's frames
# could still find the sentinel in the bootstrap's locals.
_BOOTSTRAP = r'''
import os, sys
def _marl_guard(event, args):
    if event.startswith("socket.") and event != "socket.gethostname":
        raise PermissionError("sandbox: no network")
    if event in ("os.kill", "os.killpg") and args and args[0] not in (0, os.getpid()):
        raise PermissionError("sandbox: no signals to other processes")
    if event in ("os.system", "os.posix_spawn", "os.exec", "os.fork", "os.forkpty", "subprocess.Popen"):
        raise PermissionError("sandbox: no new processes")
def _marl_main():
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, ".sentinel")) as f:
        sentinel = f.read()
    with open(os.path.join(here, "program.py")) as f:
        source = f.read()
    guard = os.path.exists(os.path.join(here, ".guard"))
    for name in (".sentinel", "program.py", ".guard"):
        if os.path.exists(os.path.join(here, name)):
            os.remove(os.path.join(here, name))
    if guard:
        sys.addaudithook(_marl_guard)
    code = compile(source, "program.py", "exec")
    exec(code, {"__name__": "__candidate__", "__builtins__": __builtins__})
    print(sentinel, flush=True)
_marl_main()
'''


@lru_cache(maxsize=1)
def namespaces_available() -> bool:
    """New net+PID namespaces and a drop to nobody work here (root with util-linux)."""
    if os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("setpriv")):
        return False
    try:
        probe = subprocess.run(_wrapper() + [sys.executable, "-I", "-c", "import os; print(os.getuid(), os.getpid())"],
                               capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0 and probe.stdout.split() == [str(NOBODY), "1"]


def _wrapper() -> List[str]:
    return ["unshare", "--net", "--pid", "--fork", "--kill-child", "setpriv", f"--reuid={NOBODY}",
            f"--regid={NOBODY}", "--clear-groups", "--"]


def _limits(limits: SandboxLimits):
    def apply() -> None:
        os.setsid()
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s))
        memory = limits.memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        size = limits.file_size_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
        resource.setrlimit(resource.RLIMIT_NPROC, (limits.max_processes, limits.max_processes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return apply


class Sandbox:
    def __init__(self, limits: SandboxLimits = SandboxLimits(), use_namespaces: Optional[bool] = None,
                 tmp_root: Optional[str] = None):
        self.limits = limits
        self.use_namespaces = namespaces_available() if use_namespaces is None else use_namespaces
        self.tmp_root = tmp_root  # where working dirs are made (default: the system's temp dir)

    def run(self, program: str, checks: str = "") -> RunResult:
        """Run `program` then `checks` (trusted test code) in one fresh sandboxed interpreter."""
        sentinel = f"__marl_sandbox_ok_{secrets.token_hex(16)}__"
        workdir = Path(tempfile.mkdtemp(prefix="marl-sbx-", dir=self.tmp_root))
        capture = Path(tempfile.mkdtemp(prefix="marl-sbx-out-", dir=self.tmp_root))  # 0700: out of the program's reach
        started = time.perf_counter()
        try:
            (workdir / "main.py").write_text(_BOOTSTRAP)
            (workdir / "program.py").write_text(program + "\n\n" + checks + "\n")
            (workdir / ".sentinel").write_text(sentinel)
            if not self.use_namespaces:
                (workdir / ".guard").write_text("")
            os.chmod(workdir, 0o777)  # the program runs as nobody: its working dir is its own
            env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(workdir), "TMPDIR": str(workdir),
                   "PYTHONDONTWRITEBYTECODE": "1"}
            command = [sys.executable, "-I", "main.py"]
            if self.use_namespaces:
                command = _wrapper() + command
            with open(capture / "out", "wb") as out, open(capture / "err", "wb") as err:
                proc = subprocess.Popen(command, cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                        stderr=err, preexec_fn=_limits(self.limits), close_fds=True)
                try:
                    returncode = proc.wait(timeout=self.limits.wall_s)
                    timed_out = False
                except subprocess.TimeoutExpired:
                    _kill_group(proc)
                    returncode, timed_out = proc.wait(), True
            stdout, out_size = _read_bounded(capture / "out", self.limits.max_output_bytes)
            stderr, _ = _read_bounded(capture / "err", self.limits.max_output_bytes)
        finally:
            _kill_group_quietly(locals().get("proc"))
            shutil.rmtree(workdir, ignore_errors=True)
            shutil.rmtree(capture, ignore_errors=True)
        wall = time.perf_counter() - started
        isolation = ["process-group", "rlimits", "tmp-workdir", "clean-env"] + \
                    (["net-namespace", "pid-namespace", "user-nobody"] if self.use_namespaces else ["audit-hook"])
        passed = not timed_out and returncode == 0 and sentinel in stdout.splitlines()
        if passed:
            status = "passed"
        elif timed_out:
            status = "timeout"
        elif returncode is not None and returncode < 0 and -returncode == signal.SIGXFSZ or \
                out_size >= self.limits.file_size_mb * 1024 * 1024:
            status = "output_limit"
        elif returncode is not None and returncode < 0:
            status = "killed"
        else:
            status = "failed"
        return RunResult(passed, status, returncode, stdout.replace(sentinel, "<sentinel>"), stderr, wall, isolation)

    def run_many(self, jobs: Sequence[tuple], max_workers: int = 2) -> List[RunResult]:
        """(program, checks) pairs, at most `max_workers` sandboxes at once, results in order."""
        with ThreadPoolExecutor(max_workers=max_workers) as pool:
            return list(pool.map(lambda job: self.run(*job), jobs))


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _kill_group_quietly(proc) -> None:
    if proc is not None and proc.poll() is None:
        _kill_group(proc)
        proc.wait()


def _read_bounded(path: Path, limit: int) -> tuple:
    size = path.stat().st_size if path.exists() else 0
    with open(path, "rb") as handle:
        data = handle.read(limit)
    return data.decode("utf-8", errors="replace"), size
