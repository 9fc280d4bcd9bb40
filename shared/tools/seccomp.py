"""The ``run_python`` sandbox's seccomp filter, as the classic-BPF program bubblewrap loads
(``bwrap --seccomp FD``).

Namespaces already take the network, the host's processes and its files away; the filter
narrows the kernel surface the sandboxed code can reach on top of that: no debugging of other
processes (``ptrace``, ``process_vm_*``), no mounts or new namespaces, no kernel keyrings,
``bpf``, ``perf_event_open``, ``userfaultfd``, ``io_uring``, module loading, ``kexec``, swap,
reboot, accounting, clock setting, file-handle opens, ``personality``, and no sockets other
than ``AF_UNIX``. Denied calls fail with ``EPERM`` (``EAFNOSUPPORT`` for socket families,
``ENOSYS`` for ``clone3`` so the C library falls back to ``clone``, whose namespace flags
are checked). A call made under a foreign architecture (32-bit entry points on x86_64, the
x32 ABI) kills the process: its numbers would slip past the table.

Built by hand (a few dozen instructions) rather than through libseccomp so the sandbox needs
nothing beyond bubblewrap. Supported: x86_64 and aarch64; elsewhere ``program`` raises and
the sandbox is unavailable.
"""

from __future__ import annotations

import platform
import struct
import sys
from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["DENIED", "UnsupportedArch", "numbers", "program"]

# Syscall numbers (x86_64, aarch64), from <asm/unistd_64.h> and <asm-generic/unistd.h>; None:
# the call does not exist there. The last four have their own rules; the rest are denied.
_NUMBERS: dict[str, tuple[int, int | None]] = {
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271),
    "kcmp": (312, 272), "mount": (165, 40), "umount2": (166, 39), "pivot_root": (155, 41),
    "chroot": (161, 51), "open_tree": (428, 428), "move_mount": (429, 429), "fsopen": (430, 430),
    "fsconfig": (431, 431), "fsmount": (432, 432), "fspick": (433, 433),
    "mount_setattr": (442, 442), "setns": (308, 268), "unshare": (272, 97), "keyctl": (250, 219),
    "add_key": (248, 217), "request_key": (249, 218), "bpf": (321, 280),
    "perf_event_open": (298, 241), "userfaultfd": (323, 282), "io_uring_setup": (425, 425),
    "io_uring_enter": (426, 426), "io_uring_register": (427, 427), "kexec_load": (246, 104),
    "kexec_file_load": (320, 294), "init_module": (175, 105), "finit_module": (313, 273),
    "delete_module": (176, 106), "swapon": (167, 224), "swapoff": (168, 225), "reboot": (169, 142),
    "acct": (163, 89), "quotactl": (179, 60), "quotactl_fd": (443, 443),
    "lookup_dcookie": (212, 18), "open_by_handle_at": (304, 265), "name_to_handle_at": (303, 264),
    "fanotify_init": (300, 262), "personality": (135, 92), "syslog": (103, 116),
    "vhangup": (153, 58), "sethostname": (170, 161), "setdomainname": (171, 162),
    "settimeofday": (164, 170), "clock_settime": (227, 112), "clock_adjtime": (305, 266),
    "adjtimex": (159, 171), "iopl": (172, None), "ioperm": (173, None), "uselib": (134, None),
    "socket": (41, 198), "socketpair": (53, 199), "clone": (56, 220), "clone3": (435, 435),
}  # fmt: skip
_OWN_RULES = ("socket", "socketpair", "clone", "clone3")
DENIED = tuple(name for name in _NUMBERS if name not in _OWN_RULES)
_X86_64 = {name: x86 for name, (x86, _) in _NUMBERS.items()}
_AARCH64 = {name: arm for name, (_, arm) in _NUMBERS.items() if arm is not None}


@dataclass(frozen=True)
class _Arch:
    audit: int  # AUDIT_ARCH_* as the kernel reports it in seccomp_data.arch
    numbers: dict[str, int]
    foreign_bit: int | None = None  # x32 syscalls carry this bit on x86_64


_ARCHES = {
    "x86_64": _Arch(0xC000003E, _X86_64, foreign_bit=0x40000000),
    "amd64": _Arch(0xC000003E, _X86_64, foreign_bit=0x40000000),
    "aarch64": _Arch(0xC00000B7, _AARCH64),
    "arm64": _Arch(0xC00000B7, _AARCH64),
}

# classic BPF opcodes and seccomp return values (<linux/filter.h>, <linux/seccomp.h>)
_LD_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_JSET = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_RET = 0x06  # BPF_RET | BPF_K
_KILL_PROCESS = 0x80000000
_ERRNO = 0x00050000
_ALLOW = 0x7FFF0000
_EPERM, _ENOSYS, _EAFNOSUPPORT = 1, 38, 97
_AF_UNIX = 1
_NAMESPACE_FLAGS = (
    0x00020000  # CLONE_NEWNS
    | 0x02000000  # CLONE_NEWCGROUP
    | 0x04000000  # CLONE_NEWUTS
    | 0x08000000  # CLONE_NEWIPC
    | 0x10000000  # CLONE_NEWUSER
    | 0x20000000  # CLONE_NEWPID
    | 0x40000000  # CLONE_NEWNET
    | 0x00000080  # CLONE_NEWTIME
)
_NR, _ARCH = 0, 4  # offsets in struct seccomp_data
_ARG0_LOW = 16 if sys.byteorder == "little" else 20


class _Insn(NamedTuple):
    """One ``struct sock_filter``."""

    code: int
    jt: int
    jf: int
    k: int

    def pack(self) -> bytes:
        return struct.pack("=HBBI", self.code, self.jt, self.jf, self.k)


class UnsupportedArch(RuntimeError):
    """No syscall table for this machine: the sandbox must not run without its filter."""


def _ret(value: int) -> _Insn:
    return _Insn(_RET, 0, 0, value)


def _load(offset: int) -> _Insn:
    return _Insn(_LD_ABS, 0, 0, offset)


def _jump(code: int, k: int, jt: int, jf: int) -> _Insn:
    """As C's ``BPF_JUMP``: if the test holds skip ``jt`` instructions, else ``jf``."""
    return _Insn(code, jt, jf, k)


def _deny(nr: int, errno: int) -> list[_Insn]:
    return [_jump(_JEQ, nr, 0, 1), _ret(_ERRNO | errno)]


def _socket_family(nr: int) -> list[_Insn]:
    """``socket``/``socketpair``: AF_UNIX allowed, every other family refused."""
    return [
        _jump(_JEQ, nr, 0, 4),
        _load(_ARG0_LOW),
        _jump(_JEQ, _AF_UNIX, 0, 1),
        _ret(_ALLOW),
        _ret(_ERRNO | _EAFNOSUPPORT),
    ]


def _clone_flags(nr: int) -> list[_Insn]:
    """``clone`` with any namespace flag refused (threads and forks pass)."""
    return [
        _jump(_JEQ, nr, 0, 4),
        _load(_ARG0_LOW),
        _jump(_JSET, _NAMESPACE_FLAGS, 0, 1),
        _ret(_ERRNO | _EPERM),
        _ret(_ALLOW),
    ]


def _instructions(arch: _Arch) -> list[_Insn]:
    nums = arch.numbers
    out = [_load(_ARCH), _jump(_JEQ, arch.audit, 1, 0), _ret(_KILL_PROCESS), _load(_NR)]
    if arch.foreign_bit is not None:
        out += [_jump(_JGE, arch.foreign_bit, 0, 1), _ret(_KILL_PROCESS)]
    for name in DENIED:
        if name in nums:
            out += _deny(nums[name], _EPERM)
    out += _deny(nums["clone3"], _ENOSYS)
    out += _socket_family(nums["socket"])
    out += _socket_family(nums["socketpair"])  # a failed match leaves A = nr
    out += _clone_flags(nums["clone"])
    out.append(_ret(_ALLOW))
    return out


def _arch(machine: str | None) -> _Arch:
    name = (machine or platform.machine()).lower()
    arch = _ARCHES.get(name)
    if arch is None:
        raise UnsupportedArch(f"no seccomp syscall table for the {name!r} architecture")
    return arch


def numbers(machine: str | None = None) -> dict[str, int]:
    """The syscall numbers the filter knows on ``machine`` (default: this one)."""
    return dict(_arch(machine).numbers)


def program(machine: str | None = None) -> bytes:
    """The filter as the bytes of a ``struct sock_filter`` array (native byte order)."""
    return b"".join(insn.pack() for insn in _instructions(_arch(machine)))
