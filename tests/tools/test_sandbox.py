"""run_python (SPEC T-1): bubblewrap isolation, limits, results; failures are tool results
and the run goes on (L-5). Real sandboxes: needs bubblewrap (CI installs it, see
.ci/system-deps.sh; elsewhere these tests skip with a message)."""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from shared.agent.spec import AgentSpec
from shared.engine import commands
from shared.engine.attachments import store_for
from shared.engine.catalog import build_catalog
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from shared.errors import CallCancelled, ToolError
from shared.llm.abort import Abort
from shared.store import calls as call_store
from shared.tools import ToolContext, sandbox, seccomp
from shared.tools.sandbox import RUN_PYTHON, Limits, SandboxResult, format_result, run_sandboxed
from tests.engine.helpers import call, run, transcript
from tests.support import need_service

LIMITS = Limits(wall_s=3, cpu_s=3)


@pytest.fixture(scope="module", autouse=True)
def bubblewrap() -> None:
    reason = sandbox.unavailable_reason()
    if reason:
        need_service("bubblewrap", RuntimeError(reason))


def py(code: str, files: list[tuple[str, bytes]] | None = None, **limits: Any) -> SandboxResult:
    return run_sandboxed(code, files or [], replace(LIMITS, **limits))


def _sandbox_processes() -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and b"/sandbox/" in (proc / "cmdline").read_bytes():
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def test_normal_code_returns_stdout_and_a_created_csv() -> None:
    code = (
        "import csv\n"
        "rows = list(csv.reader(open('prices.csv')))\n"
        "total = sum(float(r[1]) for r in rows[1:])\n"
        "print('total', total)\n"
        "with open('out.csv', 'w', newline='') as f:\n"
        "    csv.writer(f).writerows([['item', 'double'], *[[r[0], float(r[1]) * 2] "
        "for r in rows[1:]]])\n"
    )
    res = py(code, [("prices.csv", b"item,price\napple,1.5\npear,2\n")])
    assert (res.exit_code, res.timed_out, res.killed) == (0, False, None)
    assert res.stdout == "total 3.5\n"
    assert res.files == [
        {
            "path": "out.csv",
            "size": 34,
            "new": True,
            "text": "item,double\r\napple,3.0\r\npear,4.0\r\n",
            "text_truncated": False,
        }
    ]
    text = format_result(res, LIMITS)
    assert text.startswith("[exit code 0; ")
    assert "--- stdout ---\ntotal 3.5" in text and "out.csv (34 bytes)" in text
    assert "apple,3.0" in text


def test_network_access_fails() -> None:
    with socket.socket() as server:  # a listener on the host's loopback
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        code = (
            "import socket\n"
            f"for target in [('127.0.0.1', {port}), ('1.1.1.1', 80)]:\n"
            "    try:\n"
            "        socket.create_connection(target, timeout=2); print('CONNECTED', target)\n"
            "    except OSError as e: print('refused', target[0], e.errno)\n"
            "try:\n"
            "    socket.getaddrinfo('example.com', 80); print('RESOLVED')\n"
            "except OSError: print('no dns')\n"
        )
        res = py(code)
    assert res.exit_code == 0, res.stderr
    assert "CONNECTED" not in res.stdout and "RESOLVED" not in res.stdout
    assert "refused 127.0.0.1" in res.stdout and "refused 1.1.1.1" in res.stdout
    assert "no dns" in res.stdout


def test_writing_outside_the_work_dir_fails(tmp_path: Path) -> None:
    secret = tmp_path / "host-secret.txt"
    secret.write_text("top secret")
    code = (
        "import os\n"
        "for p in ['/x', '/usr/x', '/etc/x', '/sandbox/main.py', '/dev/x', '/proc/x',\n"
        "          '/tmp/x', '/work/../x']:\n"
        "    try:\n"
        "        open(p, 'w').write('1'); print('WROTE', p)\n"
        "    except OSError as e: print('denied', p)\n"
        f"print('host file visible:', os.path.exists({str(secret)!r}))\n"
        "open('/work/inside.txt', 'w').write('fine')\n"
    )
    res = py(code)
    assert res.exit_code == 0, res.stderr
    assert "WROTE" not in res.stdout
    assert res.stdout.count("denied") == 8
    assert "host file visible: False" in res.stdout
    assert [f["path"] for f in res.files] == ["inside.txt"]


_LEAK_PROBE = """
import json, os
found = {}
for pid in os.listdir('/proc'):
    for what in ('environ', 'cmdline'):
        try:
            raw = open(f'/proc/{pid}/{what}', 'rb').read()
            found[f'/proc/{pid}/{what}'] = raw.decode('latin-1')
        except OSError as e:
            found[f'/proc/{pid}/{what}'] = f'denied {e.errno}'
    for link in ('cwd', 'root', 'exe'):
        try:
            found[f'/proc/{pid}/{link}'] = os.readlink(f'/proc/{pid}/{link}')
        except OSError as e:
            found[f'/proc/{pid}/{link}'] = f'denied {e.errno}'
found['cwd visible'] = str(os.path.exists(CWD))
found['mounts'] = open('/proc/self/mountinfo').read()
print(json.dumps(found))
"""


def test_the_worker_environment_and_files_are_out_of_reach(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PID 1 inside is bubblewrap: it must carry no trace of the worker's environment."""
    secret = "s3cr3t-" + "b6d1f0a9c2e4"
    monkeypatch.setenv("TREADLE_TEST_PROVIDER_KEY", secret)
    monkeypatch.setenv("TREADLE_DATABASE_URL", f"postgresql://u:{secret}@db/x")
    res = py(_LEAK_PROBE.replace("CWD", repr(os.getcwd())))
    assert res.exit_code == 0, res.stderr
    found = json.loads(res.stdout)
    assert found["/proc/1/environ"] == ""
    env = dict(e.split("=", 1) for e in found["/proc/self/environ"].split("\0") if e)
    assert set(env) <= {*sandbox._ENV, "PWD"}
    assert found["cwd visible"] == "False"
    for path, text in found.items():
        assert secret not in text, path
        assert os.getcwd() not in text, path
    probed = {p.rsplit("/", 1)[-1] for p in found if p.startswith("/proc/1/")}
    assert probed == {"environ", "cmdline", "cwd", "root", "exe"}


def test_the_seccomp_filter_refuses_dangerous_calls() -> None:
    nums = seccomp.numbers()
    names = ["ptrace", "mount", "umount2", "keyctl", "add_key", "request_key", "bpf",
             "perf_event_open", "userfaultfd", "kexec_load", "init_module", "finit_module",
             "delete_module", "setns", "unshare", "pivot_root", "swapon", "swapoff", "reboot",
             "acct", "process_vm_readv", "process_vm_writev", "open_by_handle_at",
             "personality", "io_uring_setup"]  # fmt: skip
    code = (
        "import ctypes, errno, os, socket, subprocess, threading\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        f"for name, nr in {[(n, nums[n]) for n in names]!r}:\n"
        "    r = libc.syscall(nr, 0, 0, 0, 0, 0)\n"
        "    print(name, r, errno.errorcode.get(ctypes.get_errno()))\n"
        f"r = libc.syscall({nums['clone']}, 0x10000000, 0, 0, 0, 0)\n"
        "print('clone-newuser', r, errno.errorcode.get(ctypes.get_errno()))\n"
        "for fam in (socket.AF_INET, socket.AF_INET6, socket.AF_NETLINK, socket.AF_PACKET):\n"
        "    try: socket.socket(fam, socket.SOCK_RAW if fam == socket.AF_PACKET else 2)\n"
        "    except OSError as e: print('family', int(fam), errno.errorcode[e.errno])\n"
        "a, b = socket.socketpair(); a.send(b'unix ok'); print(b.recv(10).decode())\n"
        "t = threading.Thread(target=print, args=('thread ok',)); t.start(); t.join()\n"
        "print(subprocess.run(['echo', 'fork ok'], capture_output=True, text=True).stdout)\n"
    )
    res = py(code)
    assert res.exit_code == 0, res.stderr
    lines = res.stdout.splitlines()
    for name in names:
        assert f"{name} -1 EPERM" in lines, (name, res.stdout)
    assert "clone-newuser -1 EPERM" in lines
    assert sum(line.endswith("EAFNOSUPPORT") for line in lines) == 4
    assert {"unix ok", "thread ok", "fork ok"} <= set(lines)


def test_the_filter_is_refused_on_an_unknown_architecture() -> None:
    with pytest.raises(seccomp.UnsupportedArch):
        seccomp.program("riscv64")
    for machine in ("x86_64", "aarch64"):
        table = seccomp.numbers(machine)
        assert {"socket", "socketpair", "clone", "clone3"} <= set(table)
        assert len(seccomp.program(machine)) % 8 == 0
    assert set(seccomp.DENIED) <= set(seccomp.numbers("x86_64"))


def test_an_infinite_loop_is_killed_at_the_time_limit() -> None:
    started = time.monotonic()
    res = py("print('start', flush=True)\nwhile True:\n    pass\n", wall_s=2, cpu_s=10)
    elapsed = time.monotonic() - started
    assert res.timed_out and res.killed is None
    assert 2 <= elapsed < 2 + 3
    assert res.stdout == "start\n"  # output before the kill is kept
    assert format_result(res, replace(LIMITS, wall_s=2)).startswith(
        "[killed: wall time limit of 2s reached;"
    )


def test_cpu_limit_kills_a_busy_loop() -> None:
    res = py("while True:\n    pass\n", wall_s=10, cpu_s=1)
    assert res.exit_code is not None and res.exit_code < 0 and not res.timed_out
    assert "CPU time limit" in format_result(res, LIMITS)


def test_a_memory_bomb_is_killed() -> None:
    big = py("x = bytearray(4 * 1024 ** 3)\nprint('allocated')\n")
    assert big.exit_code == 1 and "MemoryError" in big.stderr and "allocated" not in big.stdout
    grow = py(
        "chunks = []\nwhile True:\n    chunks.append(b'x' * 10 ** 7)\n", memory_mb=128, wall_s=20
    )
    assert grow.exit_code == 1 and "MemoryError" in grow.stderr and not grow.timed_out


def test_a_fork_bomb_is_contained() -> None:
    count = (
        "import os, time\n"
        "n = 0\n"
        "try:\n"
        "    while True:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(30)\n"
        "            os._exit(0)\n"
        "        n += 1\n"
        "except OSError as e:\n"
        "    print('fork failed after', n, e.errno)\n"
    )
    res = py(count, nproc=32)
    assert res.exit_code == 0, res.stderr
    forked = int(res.stdout.split()[3])
    assert forked < 32 and "fork failed" in res.stdout
    bomb = py(
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
        wall_s=2,
    )
    assert bomb.timed_out or bomb.killed
    deadline = time.monotonic() + 5
    while _sandbox_processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _sandbox_processes() == []  # nothing outlives the sandbox


def test_output_is_capped() -> None:
    flood = py("while True:\n    print('x' * 1000)\n", wall_s=20)
    assert flood.killed is not None and flood.killed.startswith("output over")
    assert flood.stdout_truncated and len(flood.stdout) < LIMITS.output_chars + 200
    assert "bytes of output omitted" in flood.stdout
    some = py("for i in range(5000):\n    print(f'line {i:05d} ' + 'y' * 40)\n")
    assert some.exit_code == 0 and some.killed is None and some.stdout_truncated
    assert some.stdout.startswith("line 00000") and some.stdout.endswith(
        "line 04999 " + "y" * 40 + "\n"
    )


def test_file_size_and_created_file_listing() -> None:
    code = (
        "open('big.bin', 'wb').write(bytes(range(256)) * 10)\n"
        "open('long.txt', 'w').write('z' * 10000)\n"
        "try:\n"
        "    open('huge', 'wb').write(b'0' * (40 * 1024 * 1024))\n"
        "except OSError as e: print('too large', e.errno)\n"
    )
    res = py(code, [("input.txt", b"unchanged")])
    assert "too large 27" in res.stdout  # EFBIG: the file size limit
    files = {f["path"]: f for f in res.files}
    assert set(files) == {"big.bin", "long.txt", "huge"}  # not the unchanged input
    assert "text" not in files["big.bin"]
    assert files["long.txt"]["text_truncated"] and len(files["long.txt"]["text"]) == 4000


# --- the tool -------------------------------------------------------------------------------


class _Files:
    def __init__(self, data: dict[str, bytes]) -> None:
        self.data = data

    def read(self, file_id: str) -> bytes:
        return self.data[file_id]


def test_tool_copies_the_attachments_in_and_caps_the_timeout() -> None:
    ctx = ToolContext(
        run_id="r",
        call_id="c",
        attachments=({"id": "f1", "name": "data.txt"}, {"id": "f2", "name": "data.txt"}),
        files=_Files({"f1": b"one", "f2": b"two"}),
    )
    out = RUN_PYTHON.execute(
        {"code": "import os\nprint(sorted(os.listdir('.')))\nprint(open('data (2).txt').read())"},
        ctx,
    )
    assert "['data (2).txt', 'data.txt']" in out.text and "two" in out.text
    assert out.data is not None and out.data["exit_code"] == 0
    slow = RUN_PYTHON.execute({"code": "import time\ntime.sleep(60)", "timeout_s": 1.5}, ctx)
    assert slow.text.startswith("[killed: wall time limit of 1.5s reached;")
    assert RUN_PYTHON.read_only


@pytest.fixture
def no_bwrap(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    sandbox.unavailable_reason.cache_clear()
    yield
    monkeypatch.undo()
    sandbox.unavailable_reason.cache_clear()


def test_without_bubblewrap_the_tool_is_absent(
    no_bwrap: None, caplog: pytest.LogCaptureFixture
) -> None:
    spec = AgentSpec.model_validate(
        {"kind": "agent", "model": "demo", "tools": ["run_python", "calculator"]}
    )
    catalog = build_catalog(spec)
    assert "run_python" not in catalog.entries and "calculator" in catalog.entries
    assert catalog.warnings == (
        "tool 'run_python' is unavailable and was removed: bubblewrap (bwrap) is not installed",
    )
    with pytest.raises(ToolError, match="unavailable"):  # never run unsafely
        RUN_PYTHON.execute({"code": "print(1)"}, ToolContext(run_id="r", call_id="c"))
    with caplog.at_level(logging.WARNING, logger="treadle.sandbox"):
        sandbox.warn_if_unavailable()
    assert "run_python is disabled" in caplog.text


def test_a_run_goes_on_after_each_sandbox_failure(sqlite_rt: Runtime, stub: StubBroker) -> None:
    # through a run: each failure is the tool's result (L-5)
    ref = store_for(sqlite_rt).put("default", "nums.csv", b"n\n1\n2\n3\n").ref()
    replies = [
        {
            "tool_calls": [
                call(
                    "run_python",
                    {"code": "import socket\nsocket.create_connection(('1.1.1.1', 80), 2)"},
                    "net",
                )
            ]
        },
        {"tool_calls": [call("run_python", {"code": "while True: pass", "timeout_s": 1}, "loop")]},
        {"tool_calls": [call("run_python", {"code": "open('/usr/x', 'w')"}, "ro")]},
        {
            "tool_calls": [
                call(
                    "run_python",
                    {
                        "code": "import csv\n"
                        "vals = [int(r['n']) for r in csv.DictReader(open('nums.csv'))]\n"
                        "print(sum(vals))\nopen('sum.csv', 'w').write(f'sum\\n{sum(vals)}\\n')"
                    },
                    "ok",
                )
            ]
        },
        {"text": "The sum is 6."},
    ]
    spec = AgentSpec.model_validate(
        {
            "kind": "agent",
            "tools": ["run_python"],
            "model": {"provider": "scripted", "replies": replies},
        }
    )
    row, _ = commands.submit_run(
        sqlite_rt,
        commands.RunInput(
            agent=spec, input="Sum the numbers.", inputs={"attachments": [ref["id"]]}
        ),
    )
    stub.drain(sqlite_rt)
    r = run(sqlite_rt, row["id"])
    assert (r["status"], r["result"]["text"]) == ("completed", "The sum is 6.")
    tools = [text for role, text, _ in transcript(sqlite_rt, row["id"]) if role == "tool"]
    assert tools[0].startswith("[exit code 1;") and "Address family not supported" in tools[0]
    # the wall and CPU limits are both 1 s: whichever fires first stops the loop
    assert tools[1].startswith(("[killed: wall time limit of 1s reached;", "[killed by SIGXCPU"))
    assert tools[2].startswith("[exit code 1;") and "Read-only file system" in tools[2]
    assert tools[3].startswith("[exit code 0;") and "--- stdout ---\n6" in tools[3]
    assert "--- file sum.csv (6 bytes) ---\nsum\n6" in tools[3]
    with sqlite_rt.engine.connect() as conn:
        calls = call_store.list_tool_calls(conn, row["id"])
    assert [c["read_only"] for c in calls] == [True] * 4


def test_an_abort_kills_the_sandbox() -> None:
    abort = Abort()
    threading.Timer(0.8, abort.cancel).start()
    started = time.monotonic()
    with pytest.raises(CallCancelled):
        run_sandboxed("import time\ntime.sleep(30)", [], replace(LIMITS, wall_s=30), abort=abort)
    assert time.monotonic() - started < 0.8 + 1.0
    deadline = time.monotonic() + 5
    while _sandbox_processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _sandbox_processes() == []
