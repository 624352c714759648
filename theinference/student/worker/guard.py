"""A seccomp filter that forbids this process, and every thread it will have, to start another
process: fork, vfork and clone without CLONE_THREAD kill the whole process (SIGSYS, which the
grader sees from outside and no handler can catch); clone3 fails with ENOSYS so that libc falls
back to clone, whose flags a classic BPF filter can read. Threads still start.

Installed by the worker before any of the student's code is imported, only where the grader has
no CPU account that counts every process (no cgroup it can trust): a process started and reaped
unseen would carry CPU time no measure sees. Part of the worker: imports nothing of the grader.
The grader confirms the filter from /proc/<pid>/status (`Seccomp: 2`), never from this code.
"""

import ctypes
import errno
import platform
import struct

PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
CLONE_THREAD = 0x00010000
X32_SYSCALL_BIT = 0x40000000
RET_KILL_PROCESS, RET_ALLOW, RET_ERRNO = 0x80000000, 0x7FFF0000, 0x00050000
# classic BPF opcodes: load a word at an absolute offset, jump if equal / if >= / if bits set
LD_W_ABS, JEQ_K, JGE_K, JSET_K, RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
# struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6] (little-endian)
NR, ARCH, ARG0_LOW = 0, 4, 16
# per machine: its audit arch, and the numbers of fork, vfork, clone and clone3 (None: absent)
SYSCALLS = {
    "x86_64": (0xC000003E, 57, 58, 56, 435),
    "aarch64": (0xC00000B7, None, None, 220, 435),
}
MACHINES = {"amd64": "x86_64", "arm64": "aarch64"}


def program(machine: str) -> list[tuple[int, int, int, int]]:
    """The filter as (code, jump if true, jump if false, k) instructions: any other audit arch
    (a 32-bit or x32 entry into the kernel) is killed, as is a fork; clone3 gets ENOSYS; clone
    is allowed only for a thread."""
    arch, fork, vfork, clone, clone3 = SYSCALLS[machine]
    kill, allow = (RET_K, 0, 0, RET_KILL_PROCESS), (RET_K, 0, 0, RET_ALLOW)
    forks = [nr for nr in (fork, vfork) if nr is not None]
    body = [(LD_W_ABS, 0, 0, ARCH), (JEQ_K, 1, 0, arch), kill, (LD_W_ABS, 0, 0, NR)]
    if machine == "x86_64":  # x32 numbers reach the same entry: refused whole
        body += [(JGE_K, 0, 1, X32_SYSCALL_BIT), kill]
    for nr in forks:
        body += [(JEQ_K, 0, 1, nr), kill]
    body += [(JEQ_K, 0, 1, clone3), (RET_K, 0, 0, RET_ERRNO | errno.ENOSYS)]
    body += [(JEQ_K, 1, 0, clone), allow]  # anything else: allowed
    body += [(LD_W_ABS, 0, 0, ARG0_LOW), (JSET_K, 1, 0, CLONE_THREAD), kill, allow]
    return body


def install() -> str:
    """Install the filter on this process; "" when it is on, else why not (the grader reads
    /proc itself and does not trust the call without it)."""
    machine = MACHINES.get(platform.machine().lower(), platform.machine().lower())
    if machine not in SYSCALLS:
        return f"no seccomp filter is written for this machine ({machine})"
    code = b"".join(struct.pack("<HBBI", *insn) for insn in program(machine))
    filters = ctypes.create_string_buffer(code)

    class Program(ctypes.Structure):  # struct sock_fprog
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = Program(len(code) // 8, ctypes.addressof(filters))
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError as exc:
        return f"libc could not be loaded ({exc})"
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return f"prctl(PR_SET_NO_NEW_PRIVS) failed: {errno.errorcode.get(ctypes.get_errno())}"
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        return f"prctl(PR_SET_SECCOMP) failed: {errno.errorcode.get(ctypes.get_errno())}"
    return ""
