"""The native kernels of :mod:`alchemi_core.cpu_executor`: the caller's dispatch, a worker's loop
and a timed spin, each a Warp kernel of one thread whose body is C++ (``wp.func_native``).

The mailbox is an int64 array: word 0 the counter (generation << 48 | ranges << 32 | next
range), word 1 the ranges finished, word 2 the task table's address, word 3 the spin iterations
before a worker sleeps, word 4 nonzero to send every worker to sleep at once, and from word 8
one state word per worker (1 while its loop runs). A task
is ``(entry point, launch bounds, arguments)``: Warp's C entry point of a CPU kernel and the two
structures its ``invoke`` passes. (Warp's kernel annotations are its own language: mypy skips
this module.)
"""

from __future__ import annotations

import functools
from typing import Any

#: Where the mailbox's words are (see the module docstring).
COUNTER, FINISHED, TABLE, SPIN, STOP, STATE = 0, 1, 2, 3, 4, 8

_PAUSE = r"""
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
"""

# Run ranges of the current post until none is left (the caller and the workers alike). A range's
# index comes with the post's size in one atomic word, so a worker never pairs an index of one post
# with the size of the next, and the table it indexes stays until every range has finished.
_TAKE = r"""
typedef void (*entry_t)(void*, void*);
long long* mb = (long long*)mailbox.data;
auto take = [&]() -> bool {
    const long long r = __atomic_fetch_add(&mb[0], 1LL, __ATOMIC_ACQ_REL);
    const long long i = r & 0xffffffffLL;
    if (i >= ((r >> 32) & 0xffffLL)) return false;
    const long long* tb = (const long long*)__atomic_load_n(&mb[2], __ATOMIC_ACQUIRE);
    ((entry_t)tb[3 * i])((void*)tb[3 * i + 1], (void*)tb[3 * i + 2]);
    __atomic_fetch_add(&mb[1], 1LL, __ATOMIC_RELEASE);
    return true;
};
"""

# The caller: publish the table and a new generation's counter, take ranges, wait for the rest.
_DISPATCH = _TAKE + r"""
const long long n = table.shape[0];
const long long word = __atomic_load_n(&mb[0], __ATOMIC_RELAXED);
const long long generation = ((word >> 48) + 1) & 0x7fffLL;
__atomic_store_n(&mb[2], (long long)table.data, __ATOMIC_RELAXED);
__atomic_store_n(&mb[1], 0LL, __ATOMIC_RELAXED);
__atomic_store_n(&mb[0], (generation << 48) | (n << 32), __ATOMIC_SEQ_CST);
while (take()) {}
while (__atomic_load_n(&mb[1], __ATOMIC_ACQUIRE) < n) {
""" + _PAUSE + "}\n"

# A worker: take ranges whenever some are left; after ``limit`` idle pauses, say so and return.
_WORKER = _TAKE + r"""
__atomic_store_n(&mb[8 + worker], 1LL, __ATOMIC_SEQ_CST);
const long long limit = __atomic_load_n(&mb[3], __ATOMIC_RELAXED);
long long idle = 0;
while (idle < limit) {
    const long long word = __atomic_load_n(&mb[0], __ATOMIC_ACQUIRE);
    if ((word & 0xffffffffLL) < ((word >> 32) & 0xffffLL) && take()) {
        idle = 0;
        continue;
    }
""" + _PAUSE + r"""
    if (__atomic_load_n(&mb[4], __ATOMIC_RELAXED) != 0) break;
    ++idle;
}
__atomic_store_n(&mb[8 + worker], 0LL, __ATOMIC_SEQ_CST);
"""

# ``count`` idle pauses, as a worker makes them (to time one).
_SPIN = r"""
long long* mb = (long long*)mailbox.data;
for (long long k = 0; k < count; ++k) {
    if (__atomic_load_n(&mb[0], __ATOMIC_ACQUIRE) == -1LL) break;
""" + _PAUSE + "}\n"


def _stubs() -> tuple[Any, Any, Any]:
    """The native functions' typed signatures (the snippets are their bodies)."""

    def run_dispatch(mailbox, table): ...

    def run_worker(mailbox, worker): ...

    def run_spin(mailbox, count): ...

    return run_dispatch, run_worker, run_spin


@functools.cache
def kernels(wp: Any) -> Any:
    """``(dispatch, worker, spin)`` for the ``warp`` module ``wp``, built on first use (importing
    this module imports no Warp)."""
    mailbox_type, table_type = wp.array(dtype=wp.int64), wp.array2d(dtype=wp.int64)
    stubs = _stubs()
    # Set here, not as annotations: this module's annotations are strings, and these are values.
    for stub, second in zip(stubs, (table_type, int, wp.int64)):
        names = list(stub.__code__.co_varnames[: stub.__code__.co_argcount])
        stub.__annotations__ = {names[0]: mailbox_type, names[1]: second}
    run_dispatch = wp.func_native(_DISPATCH)(stubs[0])
    run_worker = wp.func_native(_WORKER)(stubs[1])
    run_spin = wp.func_native(_SPIN)(stubs[2])

    def dispatch(mailbox, table):
        run_dispatch(mailbox, table)

    def worker(mailbox, index):
        run_worker(mailbox, index)

    def spin(mailbox, count):
        run_spin(mailbox, count)

    for function, second in zip((dispatch, worker, spin), (("table", table_type), ("index", int), ("count", wp.int64))):
        function.__annotations__ = {"mailbox": mailbox_type, second[0]: second[1]}
    dispatch, worker, spin = wp.kernel(dispatch), wp.kernel(worker), wp.kernel(spin)
    return dispatch, worker, spin
