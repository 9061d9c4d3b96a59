# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False
"""The compiled state table: per key int64 states of a built-in reducer (count, sum,
min, max) in open addressing, a batch folded in one call with the GIL released.

Keys are kept as (kind, key bytes, position) in dense arrays in insertion order, key
bytes end to end in one arena; an index of uint32 slots (0 empty, else dense index + 1)
is probed linearly from position & mask. A batch that cannot be folded whole (a sum
beyond int64, a malformed key, a position that is not its key's hash) changes nothing:
what it did is undone in reverse before the error is raised.
"""

from libc.stdint cimport uint8_t, uint32_t, uint64_t, int64_t
from libc.string cimport memcmp, memcpy, memset
from libc.stdlib cimport qsort
from cpython.mem cimport PyMem_RawMalloc, PyMem_RawRealloc, PyMem_RawFree
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING
from cpython cimport array as carray
from array import array

from floering.node.core.columnar.buffers import (columns, decode_keys, key_parts, octets,
                                                 words)

cdef extern from "_murmur3.h" nogil:
    uint64_t floe_murmur3_64(const unsigned char *data, size_t len, uint32_t seed)

cdef extern from "_keys.h" nogil:
    int floe_valid_key(unsigned char kind, const unsigned char *s, size_t n)

cdef extern from *:
    """
    static inline int floe_add_overflow(int64_t a, int64_t b, int64_t *r) {
        return __builtin_add_overflow(a, b, r);
    }
    """
    int floe_add_overflow(int64_t a, int64_t b, int64_t *r) nogil

DEF DIRTY = 0x80
DEF KIND = 0x7F
DEF OK = 0
DEF E_NOMEM = -1
DEF E_OVERFLOW = -2
DEF E_KEY = -3
DEF E_POSITION = -4
DEF E_OFFSETS = -5
DEF E_KIND = -6

OPS = {"count": 0, "sum": 1, "min": 2, "max": 3}
cdef carray.array _U64 = array("Q")
cdef carray.array _I64 = array("q")

cdef const unsigned char _EMPTY = 0


cdef inline const unsigned char *_ptr(const unsigned char[::1] view) noexcept:
    return &view[0] if view.shape[0] else &_EMPTY


def hash_positions(key_data, offsets):
    """The ring position of each key in `key_data` cut at `offsets` (n + 1 entries):
    MurmurHash3 x64_128's low 64 bits, seed 0, as hashing.position gives."""
    cdef const unsigned char[::1] data = octets(key_data, "key_data")
    cdef const unsigned char[::1] ov = words(offsets, "offsets", signed=False)
    cdef Py_ssize_t n = ov.shape[0] // 8 - 1
    if n < 0:
        raise ValueError("offsets must hold n + 1 entries")
    cdef carray.array out = carray.clone(_U64, n, zero=False)
    cdef uint64_t *res = <uint64_t *>out.data.as_voidptr
    cdef const uint64_t *off = <const uint64_t *>_ptr(ov)
    cdef const unsigned char *d = _ptr(data)
    cdef uint64_t total = data.shape[0]
    cdef Py_ssize_t i
    cdef int bad = 0
    with nogil:
        for i in range(n):
            if off[i] > off[i + 1] or off[i + 1] > total:
                bad = 1
                break
            res[i] = floe_murmur3_64(d + off[i], off[i + 1] - off[i], 0)
    if bad:
        raise ValueError(f"offsets must not decrease nor pass the end of key_data (key {i})")
    return out
