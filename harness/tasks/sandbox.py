"""Grade model-written Python without ever running it where the verdict is decided.

The program runs in a jail (harness/tasks/jail.py: bubblewrap, its own namespaces and uid, a
read-only /usr and nothing else) under wall, CPU, memory, file-size and process limits. The
dataset's checks (HumanEval's `check`, MBPP's asserts, code-synth's tests) run here, in the
trusted process, against proxies: calling `add(2, 3)` sends the arguments to the jail as plain
data and returns what the program's `add` returned, decoded into plain built-in values
(harness/tasks/candidate.py). Nothing the program does can skip, see or fake a check: there is
no pass marker to forge, no shared interpreter to `settrace`, no object whose `__eq__` lies,
no file of another sandbox to read (each has its own tmpfs), and no installed package to copy
answers from.

Statuses: passed | failed (an exception, a wrong value, the program exited) | timeout (wall
or CPU limit) | killed (another signal) | output_limit | error (the sandbox itself failed: never
the program's fault, never memoised).
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

import harness.tasks.candidate as candidate
from harness.tasks.jail import Jail, JailUnavailable, find_jail, prlimit, socket_filter  # noqa: F401 - re-exported

MAX_MESSAGE = 1 << 20  # one protocol line from the jail


@dataclass(frozen=True)
class SandboxLimits:
    wall_s: float = 10.0
    cpu_s: int = 8
    memory_mb: int = 1024  # address space
    file_size_mb: int = 4  # any file the program writes, its output included
    max_processes: int = 16  # per sandbox (its own uid when the harness runs as root)
    max_output_bytes: int = 64 * 1024
    call_s: Optional[float] = None  # each call of the program by the checks (one test) within this; None: unbounded


@dataclass
class RunResult:
    passed: bool
    status: str  # passed | failed | timeout | killed | output_limit | error
    returncode: Optional[int]
    stdout: str  # what the checks printed (trusted)
    stderr: str  # what the program printed (bounded)
    wall_s: float
    isolation: List[str] = field(default_factory=list)
    detail: str = ""

    @property
    def reason(self) -> str:
        return self.status + (f": {self.detail[:200]}" if self.detail and self.status != "passed" else "")


class ProgramError(Exception):
    """The program's function raised, or returned something that is not plain data."""


class _Stop(BaseException):
    """Ends the checks with a status (a BaseException: `except Exception` in a check cannot swallow it)."""

    def __init__(self, status: str, detail: str):
        super().__init__(detail)
        self.status, self.detail = status, detail


def encode(value: Any, depth: int = 0) -> list:
    """Plain data -> the protocol's tagged form (the same as the jailed side's)."""
    kind = type(value)
    if depth > 50:
        raise ValueError("argument nested too deeply")
    if value is None:
        return ["none"]
    if kind in (bool, int, str):
        return [kind.__name__, value]
    if kind is float:
        return ["float", repr(value)]
    if kind is bytes:
        return ["bytes", value.hex()]
    if kind in (list, tuple, set, frozenset):
        return [kind.__name__, [encode(v, depth + 1) for v in value]]
    if kind is dict:
        return ["dict", [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]]
    raise TypeError(f"cannot pass a {kind.__name__} to the sandboxed program")


_CONTAINERS = {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}


def decode(tagged: Any, depth: int = 0) -> Any:
    """The tagged form -> plain built-in values; anything else is the program's error."""
    if depth > 50 or not isinstance(tagged, list) or not tagged or not isinstance(tagged[0], str):
        raise ProgramError("malformed value from the sandbox")
    tag = tagged[0]
    if tag == "none":
        return None
    payload = tagged[1] if len(tagged) > 1 else None
    if tag == "bool" and type(payload) is bool:
        return payload
    if tag == "int" and type(payload) is int:
        return payload
    if tag == "str" and type(payload) is str:
        return payload
    if tag == "float" and type(payload) is str:
        try:
            return float(payload)
        except ValueError:
            raise ProgramError("malformed float from the sandbox") from None
    if tag == "bytes" and type(payload) is str:
        return bytes.fromhex(payload)
    if tag in _CONTAINERS and type(payload) is list:
        try:
            return _CONTAINERS[tag](decode(v, depth + 1) for v in payload)
        except TypeError as exc:  # an unhashable item in a set
            raise ProgramError(str(exc)) from None
    if tag == "dict" and type(payload) is list:
        try:
            return {decode(k, depth + 1): decode(v, depth + 1) for k, v in payload}
        except (TypeError, ValueError) as exc:
            raise ProgramError(str(exc)) from None
    raise ProgramError(f"malformed value from the sandbox ({tag})")


class _Channel:
    """Line-delimited JSON to and from the jailed interpreter, every read bounded by the deadline."""

    def __init__(self, proc: subprocess.Popen, deadline: float, call_s: Optional[float] = None):
        self.proc, self.deadline, self.call_s, self.buffer = proc, deadline, call_s, b""

    def send(self, message: dict) -> None:
        try:
            self.proc.stdin.write((json.dumps(message) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise self._ended() from None

    def receive(self, call: bool = False) -> dict:
        """The next message; `call`: a reply to one call of the program, also bounded by `call_s`."""
        fd = self.proc.stdout.fileno()
        deadline, why = self.deadline, "wall-clock limit"
        if call and self.call_s is not None and time.monotonic() + self.call_s < deadline:
            deadline, why = time.monotonic() + self.call_s, f"a test ran over {self.call_s:g} s"
        while b"\n" not in self.buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _Stop("timeout", why)
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                raise _Stop("timeout", why)
            chunk = os.read(fd, 65536)
            if not chunk:
                raise self._ended()
            self.buffer += chunk
            if len(self.buffer) > MAX_MESSAGE:
                raise _Stop("failed", "the program sent an oversized message")
        line, self.buffer = self.buffer.split(b"\n", 1)
        try:
            message = json.loads(line)
        except ValueError:
            raise _Stop("failed", "the program garbled the sandbox protocol") from None
        if not isinstance(message, dict):
            raise _Stop("failed", "the program garbled the sandbox protocol")
        return message

    def _ended(self) -> _Stop:
        try:
            code = self.proc.wait(timeout=max(0.1, min(2.0, self.deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            return _Stop("failed", "the program closed its channel")
        return _Stop(*_exit_status(code))


def _exit_status(code: int) -> tuple:
    """(status, detail) of a jail that ended before the checks did: a signal (directly, or 128+n as
    bubblewrap reports its child's) or an exit."""
    signo = -code if code < 0 else code - 128 if code > 128 else 0
    if signo == signal.SIGXCPU:
        return "timeout", "CPU-time limit"
    if signo == signal.SIGXFSZ:
        return "output_limit", "file-size limit"
    if signo:
        return "killed", f"killed by signal {signo}"
    return "failed", f"the program exited (code {code}) before the checks finished"


class _Proxy:
    """Stands for one of the program's functions in the checks' namespace."""

    def __init__(self, channel: _Channel, name: str):
        self._channel, self._name = channel, name
        self.__name__ = name

    def __call__(self, *args, **kwargs):
        try:
            request = {"name": self._name, "args": [encode(a) for a in args],
                       "kwargs": {str(k): encode(v) for k, v in kwargs.items()}}
        except (TypeError, ValueError) as exc:
            raise ProgramError(str(exc)) from None
        self._channel.send(request)
        reply = self._channel.receive(call=True)
        if reply.get("ok") is True:
            return decode(reply.get("value"))
        raise ProgramError(str(reply.get("error", "the program's function failed"))[:300])


def rlimit_command(limits: SandboxLimits, per_sandbox_uid: bool) -> List[str]:
    """util-linux's `prlimit` sets the limits on itself, then execs the jail. A command prefix, not
    a preexec_fn: with a preexec_fn Python must fork the whole trainer (torch and a model: ~50 ms a
    program); without one it vforks (~1 ms)."""
    memory, size = limits.memory_mb * 1024 * 1024, limits.file_size_mb * 1024 * 1024
    command = [prlimit() or "prlimit", f"--cpu={limits.cpu_s}:{limits.cpu_s + 1}",  # SIGXCPU first: a timeout
               f"--as={memory}", f"--fsize={size}", "--core=0"]
    if per_sandbox_uid:  # counted per user: only meaningful when the jail has a uid of its own
        command.append(f"--nproc={limits.max_processes}")
    return command + ["--"]


def _filter_file(directory: str):
    """An open file holding the seccomp program (bubblewrap reads it from the inherited fd), or None."""
    program = socket_filter()
    if program is None:
        return None
    handle = open(os.path.join(directory, "seccomp.bpf"), "w+b")
    handle.write(program)
    handle.flush()
    handle.seek(0)
    return handle


def _read_bounded(path: str, limit: int) -> tuple:
    size = os.path.getsize(path)
    with open(path, "rb") as handle:
        return handle.read(limit).decode("utf-8", errors="replace"), size


class Sandbox:
    def __init__(self, limits: SandboxLimits = SandboxLimits(), unsafe: bool = False, jail: Optional[Jail] = None):
        self.limits = limits
        self.jail = jail if jail is not None else find_jail(unsafe)  # JailUnavailable: fail closed

    def run(self, program: str, checks: str = "", limits: Optional[SandboxLimits] = None) -> RunResult:
        """Run `program` in the jail and `checks` (trusted test code) here, against its functions,
        within `limits` (default: the sandbox's)."""
        limits = limits or self.limits
        started = time.monotonic()
        deadline = started + limits.wall_s
        printed: List[str] = []
        status, detail, returncode = "passed", "", None
        with tempfile.TemporaryDirectory(prefix="marl-sbx-") as private:  # 0700: out of the program's reach
            err_path = os.path.join(private, "program-output")
            seccomp = _filter_file(private) if not self.jail.unsafe else None
            per_uid = not self.jail.unsafe and os.geteuid() == 0
            argv = rlimit_command(limits, per_uid) + self.jail.command(
                [self.jail.python, "-I", "-S", "-c", candidate.SOURCE],
                seccomp_fd=None if seccomp is None else seccomp.fileno())
            env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
            with open(err_path, "wb") as err:
                try:
                    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=env,
                                            cwd=private if self.jail.unsafe else "/", close_fds=True,
                                            pass_fds=() if seccomp is None else (seccomp.fileno(),),
                                            start_new_session=True)
                except OSError as exc:
                    return RunResult(False, "error", None, "", "", time.monotonic() - started,
                                     self.jail.isolation, f"the sandbox could not start: {exc}")
                finally:
                    if seccomp is not None:
                        seccomp.close()
            channel = _Channel(proc, deadline, limits.call_s)
            try:
                channel.send({"program": program})
                hello = channel.receive()
                if hello.get("ready") is not True:
                    raise _Stop("failed", str(hello.get("error", "the program did not load"))[:300])
                functions = hello.get("functions")
                if not isinstance(functions, list) or not all(isinstance(n, str) for n in functions):
                    raise _Stop("failed", "the program garbled the sandbox protocol")
                namespace: Dict[str, Any] = {"__name__": "__checks__"}
                namespace.update({name: _Proxy(channel, name) for name in functions if name.isidentifier()})
                namespace["print"] = lambda *a, sep=" ", end="\n", **_: printed.append(sep.join(map(str, a)) + end)
                exec(compile(checks, "checks.py", "exec"), namespace)  # trusted: the dataset's tests
            except _Stop as stop:
                status, detail = stop.status, stop.detail
            except Exception as exc:  # noqa: BLE001 - a failing check is the verdict, not a crash
                status, detail = "failed", f"{type(exc).__name__}: {str(exc)[:300]}"
            finally:
                _stop(proc)
                returncode = proc.returncode
            program_output, size = _read_bounded(err_path, limits.max_output_bytes)
        if status == "failed" and (size >= limits.file_size_mb * 1024 * 1024):
            status, detail = "output_limit", "file-size limit"
        if status == "failed" and program_output.startswith(("bwrap:", "setpriv:", "prlimit:")):
            status, detail = "error", program_output.strip().splitlines()[0][:300]  # the jail, not the program
        checks_output = "".join(printed)[: limits.max_output_bytes]
        return RunResult(status == "passed", status, returncode, checks_output, program_output,
                         time.monotonic() - started, self.jail.isolation, detail)

    def run_many(self, jobs: Sequence[tuple], max_workers: int = 2) -> List[RunResult]:
        """(program, checks) pairs, at most `max_workers` sandboxes at once, results in order."""
        with ThreadPoolExecutor(max_workers=max_workers) as pool:
            return list(pool.map(lambda job: self.run(*job), jobs))


def _stop(proc: subprocess.Popen) -> None:
    """End the jail: its session's group (bubblewrap's children die with it: --die-with-parent)."""
    for stream in (proc.stdin, proc.stdout):
        try:
            stream.close()
        except OSError:
            pass
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


__all__ = ["JailUnavailable", "ProgramError", "RunResult", "Sandbox", "SandboxLimits", "decode", "encode"]
