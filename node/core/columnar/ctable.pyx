# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False
"""The compiled state table: per key int64 states of a built-in reducer (count, sum,
min, max) in open addressing, a batch folded in one call with the GIL released.

Keys are kept as (kind, key bytes, position) in dense 21-byte entries in insertion order
(position, state, and the key's arena offset with its kind and dirty bit), each key's
bytes in one arena after its length (a byte below 255, else 255 and a uint32); an index of uint32 slots (0 empty, else entry
index + 1) is probed linearly from position & mask. A batch prefetches the index slots
and entries of the tuples a few ahead of the one it folds. A batch that cannot be folded whole (a sum
beyond int64, a malformed key, a position that is not its key's hash) changes nothing:
what it did is undone in reverse before the error is raised.
"""

from libc.stdint cimport uint8_t, uint32_t, uint64_t, int64_t
from libc.string cimport memcmp, memcpy, memmove, memset
from libc.stdlib cimport qsort
from cpython.mem cimport PyMem_RawMalloc, PyMem_RawCalloc, PyMem_RawRealloc, PyMem_RawFree
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING
from cpython cimport array as carray
from cpython.pythread cimport (PyThread_type_lock, PyThread_allocate_lock, PyThread_free_lock,
                               PyThread_acquire_lock, PyThread_release_lock)
cimport cython
from array import array

from floering.node.core.columnar.buffers import (columns, decode_keys, key_parts, octets,
                                                 words)

cdef extern from "_murmur3.h" nogil:
    uint64_t floe_murmur3_64(const unsigned char *data, size_t len, uint32_t seed)

cdef extern from "_keys.h" nogil:
    int floe_valid_key(unsigned char kind, const unsigned char *s, size_t n)

cdef extern from *:
    """
    #define floe_prefetch(p) __builtin_prefetch((const void *)(p))
    static inline int floe_add_overflow(int64_t a, int64_t b, int64_t *r) {
        return __builtin_add_overflow(a, b, r);
    }
    """
    int floe_add_overflow(int64_t a, int64_t b, int64_t *r) nogil
    void floe_prefetch(const void *p) nogil

cdef extern from *:
    """
    #ifdef __GLIBC__
    #include <malloc.h>
    /* Blocks of 256 KiB and more get pages of their own, given back when freed and
       grown in place by mremap. glibc's default threshold rises to 32 MiB after the
       first such block is freed, so a table's arrays, grown a quarter at a time, would
       then be carved from the heap, whose freed holes stay resident (66 against 54 B
       of node RSS per key copy at 5 M keys). */
    static int floe_own_pages(void) { return mallopt(M_MMAP_THRESHOLD, 256 * 1024); }
    #else
    static int floe_own_pages(void) { return 0; }
    #endif
    """
    int floe_own_pages()

cdef enum:
    BLOCK = 4096        # keys install_parts hashes ahead of setting them
    MAXCUTS = 4         # cuts open on one table at once (StateTable.cut)
    DIRTY = 0x80
    KIND = 0x7F
    OK = 0
    E_NOMEM = -1
    E_OVERFLOW = -2
    E_KEY = -3
    E_POSITION = -4
    E_OFFSETS = -5
    E_KIND = -6
    E_ARENA = -7

OPS = {"count": 0, "sum": 1, "min": 2, "max": 3}
OWN_PAGES = bool(floe_own_pages())
cdef carray.array _U64 = array("Q")
cdef carray.array _I64 = array("q")

cdef const unsigned char _EMPTY = 0
cdef size_t _arena_limit = 0xFFFFFFFF      # an entry keeps its key's offset in 32 bits


def _set_arena_limit(size_t limit):
    """The most key bytes (with their lengths) a table holds; 4 GiB - 1 unless a test
    lowers it to reach the edge without allocating it. Returns the one it replaced."""
    global _arena_limit
    old, _arena_limit = _arena_limit, min(limit, 0xFFFFFFFF)
    return old


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


# -- frames of column states (node.core.state_wire): the columns' part of a frame --------

cdef inline void _put_le(unsigned char *p, uint64_t x, int w) noexcept nogil:
    cdef int b
    for b in range(w):
        p[b] = <unsigned char>(x >> (8 * b))


cdef inline uint64_t _get_le(const unsigned char *p, int w) noexcept nogil:
    cdef uint64_t x = 0
    cdef int b
    for b in range(w):
        x |= (<uint64_t>p[b]) << (8 * b)
    return x


def pack_frame_columns(kinds, key_data, offsets, values, Py_ssize_t start, Py_ssize_t end):
    """(width, body) of entries start to end of columns (kinds, key_data, offsets of
    n + 1, values): body is the kinds, the offsets from 0 as uint32, the key bytes and
    the values in `width` bytes each (the least of 1, 2, 4, 8 that holds them), all
    little-endian, as a frame of column states lays them out."""
    cdef const unsigned char[::1] kv = octets(kinds, "kinds")
    cdef const unsigned char[::1] dv = octets(key_data, "key_data")
    cdef const unsigned char[::1] ov = words(offsets, "offsets", signed=False)
    cdef const unsigned char[::1] vv = words(values, "values", signed=True)
    cdef Py_ssize_t n = kv.shape[0]
    if ov.shape[0] // 8 != n + 1 or vv.shape[0] // 8 != n:
        raise ValueError(f"offsets must hold n + 1 = {n + 1} entries and values n")
    if not 0 <= start <= end <= n:
        raise ValueError(f"entries {start} to {end} are outside the columns of {n}")
    cdef const uint64_t *off = <const uint64_t *>_ptr(ov)
    cdef const int64_t *val = <const int64_t *>_ptr(vv)
    cdef Py_ssize_t m = end - start, t
    cdef uint64_t base = off[start], dlen = dv.shape[0]
    cdef int64_t low = 0, high = 0
    cdef int bad = 0, width = 1
    with nogil:
        for t in range(start, end):
            if off[t] > off[t + 1]:
                bad = 1
                break
            if val[t] < low:
                low = val[t]
            elif val[t] > high:
                high = val[t]
    if bad or off[end] > dlen:
        raise ValueError("offsets must not decrease nor pass the end of key_data")
    cdef uint64_t nkeys = off[end] - base
    if nkeys >= (<uint64_t>1) << 32:
        raise OverflowError("a frame's keys are 4 GiB or more: cut it smaller")
    if low < -2147483648LL or high > 2147483647LL:
        width = 8
    elif low < -32768 or high > 32767:
        width = 4
    elif low < -128 or high > 127:
        width = 2
    body = PyBytes_FromStringAndSize(NULL, m + 4 * (m + 1) + nkeys + width * m)
    cdef unsigned char *w = <unsigned char *>PyBytes_AS_STRING(body)
    cdef const unsigned char *k = _ptr(kv)
    cdef const unsigned char *d = _ptr(dv)
    with nogil:
        memcpy(w, k + start, m)
        w += m
        for t in range(start, end + 1):
            _put_le(w, off[t] - base, 4)
            w += 4
        memcpy(w, d + base, nkeys)
        w += nkeys
        for t in range(start, end):
            _put_le(w, <uint64_t>val[t], width)
            w += width
    return width, body


def unpack_frame_columns(frame, Py_ssize_t at, Py_ssize_t n, uint64_t nkeys, int width):
    """The columns of a frame whose header says `n` entries, `nkeys` key bytes and
    values `width` bytes wide, read from byte `at`: (kinds, key_data, offsets as uint64
    n + 1, values as int64), checked (ValueError: a kind other than 0, 1, 2; offsets
    not 0 first, nkeys last, never decreasing; a frame too short) before any is read."""
    cdef const unsigned char[::1] fv = octets(frame, "frame")
    if width not in (1, 2, 4, 8):
        raise ValueError(f"value width {width}: 1, 2, 4 or 8 bytes")
    cdef uint64_t size = fv.shape[0]
    if n < 0 or at < 0 or <uint64_t>n > size or nkeys > size or \
            size < <uint64_t>at + (5 + <uint64_t>width) * <uint64_t>n + 4 + nkeys:
        raise ValueError(f"the frame is shorter than its {n} entries and {nkeys} key bytes")
    cdef const unsigned char *f = _ptr(fv) + at
    cdef const unsigned char *o = f + n
    cdef Py_ssize_t t
    cdef int bad = 0
    cdef uint64_t prev = 0, x
    with nogil:
        for t in range(n):
            if f[t] > 2:
                bad = 1
                break
        if not bad:
            if _get_le(o, 4) != 0 or _get_le(o + 4 * n, 4) != nkeys:
                bad = 2
            for t in range(n + 1):
                x = _get_le(o + 4 * t, 4)
                if x < prev:
                    bad = 2
                    break
                prev = x
    if bad == 1:
        raise ValueError("a kind other than 0 (str), 1 (bytes) or 2 (int)")
    if bad == 2:
        raise ValueError(f"offsets must go from 0 to {nkeys} without decreasing")
    kinds = PyBytes_FromStringAndSize(<const char *>f, n)
    keys = PyBytes_FromStringAndSize(<const char *>(o + 4 * (n + 1)), nkeys)
    cdef carray.array offsets = carray.clone(_U64, n + 1, zero=False)
    cdef carray.array values = carray.clone(_I64, n, zero=False)
    cdef uint64_t *op = <uint64_t *>offsets.data.as_voidptr
    cdef int64_t *vp = <int64_t *>values.data.as_voidptr
    cdef const unsigned char *v = o + 4 * (n + 1) + nkeys
    cdef int shift = 64 - 8 * width
    with nogil:
        for t in range(n + 1):
            op[t] = _get_le(o + 4 * t, 4)
        for t in range(n):
            vp[t] = (<int64_t>(_get_le(v + width * t, width) << shift)) >> shift
    return kinds, keys, offsets, values


ctypedef packed struct Entry:
    uint64_t pos
    int64_t val
    uint32_t off        # of the key's length in the arena (so the arena is < 4 GiB)
    uint8_t flags       # DIRTY | kind


cdef inline uint64_t _meta(const Entry *x) noexcept nogil:
    """arena offset << 8 | DIRTY | kind"""
    return ((<uint64_t>x.off) << 8) | x.flags

ctypedef struct Sorted:
    uint64_t pos
    uint64_t i


# qsort has no context argument: the table being sorted, set with the GIL held.
cdef const Entry *_s_ent
cdef const unsigned char *_s_arena


cdef inline uint32_t _klen(const unsigned char *arena, uint64_t meta) noexcept nogil:
    cdef const unsigned char *h = arena + (meta >> 8)
    cdef uint32_t n
    if h[0] < 255:
        return h[0]
    memcpy(&n, h + 1, 4)
    return n


cdef inline const unsigned char *_key(const unsigned char *arena, uint64_t meta) noexcept nogil:
    cdef const unsigned char *h = arena + (meta >> 8)
    return h + 1 if h[0] < 255 else h + 5


cdef inline size_t _head(uint32_t klen) noexcept nogil:
    """The bytes of a key's length in the arena."""
    return 1 if klen < 255 else 5


cdef int _order(const void *a, const void *b) noexcept nogil:
    """Position, then kind, then key bytes: the order every export is in."""
    cdef const Sorted *x = <const Sorted *>a
    cdef const Sorted *y = <const Sorted *>b
    if x.pos != y.pos:
        return -1 if x.pos < y.pos else 1
    cdef uint64_t mi = _meta(&_s_ent[x.i]), mj = _meta(&_s_ent[y.i])
    cdef int ki = mi & KIND, kj = mj & KIND
    if ki != kj:
        return ki - kj
    cdef uint32_t li = _klen(_s_arena, mi), lj = _klen(_s_arena, mj)
    cdef int c = memcmp(_key(_s_arena, mi), _key(_s_arena, mj),
                        li if li < lj else lj)
    if c:
        return c
    return -1 if li < lj else (1 if li > lj else 0)


cdef int _sort(Sorted *sel, Py_ssize_t k) noexcept nogil:
    """Sort by position with a radix sort (8 passes of a byte), then each run of one
    position by kind and key bytes."""
    cdef Py_ssize_t i, j
    cdef Py_ssize_t count[256]
    cdef Py_ssize_t total
    cdef int shift
    cdef Sorted *tmp
    cdef Sorted *src = sel
    cdef Sorted *dst
    if k < 256:
        qsort(<void *>sel, k, sizeof(Sorted), _order)
        return OK
    tmp = <Sorted *>PyMem_RawMalloc(k * sizeof(Sorted))
    if tmp == NULL:
        return E_NOMEM
    dst = tmp
    for shift in range(0, 64, 8):
        memset(count, 0, sizeof(count))
        for i in range(k):
            count[(src[i].pos >> shift) & 0xFF] += 1
        if count[(src[0].pos >> shift) & 0xFF] == k:
            continue                    # every key has this byte alike: nothing moves
        total = 0
        for j in range(256):
            total, count[j] = total + count[j], total
        for i in range(k):
            j = (src[i].pos >> shift) & 0xFF
            dst[count[j]] = src[i]
            count[j] += 1
        src, dst = dst, src
    if src != sel:
        memcpy(sel, src, k * sizeof(Sorted))
    PyMem_RawFree(tmp)
    i = 0
    while i < k:
        j = i + 1
        while j < k and sel[j].pos == sel[i].pos:
            j += 1
        if j - i > 1:
            qsort(<void *>(sel + i), j - i, sizeof(Sorted), _order)
        i = j
    return OK


ctypedef struct Part:
    const uint8_t *kinds
    const unsigned char *data
    uint64_t dlen
    const uint64_t *off
    const int64_t *val
    Py_ssize_t base     # the part's first entry, counted across the parts


cdef size_t _key_bytes(const Part *ps, Py_ssize_t nparts) noexcept nogil:
    cdef size_t total = 0
    cdef Py_ssize_t j, n
    for j in range(nparts):
        n = ps[j + 1].base - ps[j].base     # (offsets are checked key by key later)
        if n > 0 and ps[j].off[0] <= ps[j].off[n] and ps[j].off[n] <= ps[j].dlen:
            total += ps[j].off[n] - ps[j].off[0]
    return total

cdef inline bint _in_range(uint64_t p, uint64_t lo, uint64_t hi) noexcept nogil:
    if lo < hi:
        return lo < p and p <= hi
    if lo > hi:
        return p > lo or p <= hi
    return True


ctypedef struct CutRec:
    bint open
    Py_ssize_t n        # entries it gives (all: the table's when it was cut)
    Py_ssize_t at       # the next it gives; those before are given already
    uint64_t *kept      # a bit per table entry: its state as of the cut is in `old`
    int64_t *old        # read only where its bit is set
    uint32_t *sel       # the entries it gives, in order (NULL: entries 0 to n)
    uint64_t *pending   # with sel, a bit per table entry: chosen, not given yet
    Py_ssize_t tn       # with sel, the table's entries when it was cut


cdef inline uint64_t _index_cap(Py_ssize_t keys) noexcept nogil:
    """The least index (a power of 2, 8 or more) that holds `keys` keys at most 0.7 full."""
    cdef uint64_t cap = 8
    while <Py_ssize_t>(cap * 7) < keys * 10:
        cap <<= 1
    return cap


cdef class StateTable:
    """int64 states of one built-in reducer, keyed by (kind, key bytes, position).

    A cut (`cut()`) is the table as it is at that call, given a slice at a time
    (TableCut.take) while batches keep changing the table: an entry of the cut not
    given yet keeps its state as of the cut the first time it changes (copy on
    write), entries added later are not in it. A lock guards the table's storage
    while a batch folds with the GIL released, so a cut may be read from another
    thread."""

    cdef readonly str op
    cdef int code
    cdef Entry *ent
    cdef Py_ssize_t n, dcap
    cdef unsigned char *arena
    cdef size_t alen, acap
    cdef uint32_t *index
    cdef uint64_t mask
    cdef uint32_t *nindex       # a larger index grow_index is filling, or NULL
    cdef uint64_t nmask
    cdef Py_ssize_t nplaced     # entries 0 to nplaced are in nindex
    cdef uint64_t nzeroed       # its slots cleared so far
    cdef uint32_t *dirty
    cdef Py_ssize_t ndirty, dirtycap
    cdef bint busy
    cdef PyThread_type_lock lock
    cdef CutRec cuts[MAXCUTS]
    cdef int ncuts

    def __cinit__(self, str op):
        if op not in OPS:
            raise ValueError(f"a state table's op is one of {', '.join(OPS)}, not {op!r}")
        self.op, self.code = op, OPS[op]
        memset(self.cuts, 0, sizeof(self.cuts))
        self.lock = PyThread_allocate_lock()
        if self.lock == NULL:
            raise MemoryError()
        self.index = <uint32_t *>PyMem_RawMalloc(8 * sizeof(uint32_t))
        if self.index == NULL:
            raise MemoryError()
        memset(self.index, 0, 8 * sizeof(uint32_t))
        self.mask = 7

    def __dealloc__(self):
        cdef int c
        for c in range(MAXCUTS):
            PyMem_RawFree(self.cuts[c].kept)
            PyMem_RawFree(self.cuts[c].old)
            PyMem_RawFree(self.cuts[c].sel)
            PyMem_RawFree(self.cuts[c].pending)
        if self.lock != NULL:
            PyThread_free_lock(self.lock)
        PyMem_RawFree(self.ent)
        PyMem_RawFree(self.arena)
        PyMem_RawFree(self.index)
        PyMem_RawFree(self.nindex)
        PyMem_RawFree(self.dirty)

    # -- storage -------------------------------------------------------------------

    cdef int _grow_dense(self, Py_ssize_t need) noexcept nogil:
        """Room for `need` keys; an eighth more at a time (realloc of a large block
        remaps pages rather than copying them, so small steps are cheap)."""
        if need <= self.dcap:
            return OK
        cdef Py_ssize_t cap = self.dcap + (self.dcap >> 3)
        if cap < need:
            cap = need
        if cap < 16:
            cap = 16
        if cap >= <Py_ssize_t>4294967295UL:
            return E_NOMEM
        cdef void *p = PyMem_RawRealloc(self.ent, cap * sizeof(Entry))
        if p == NULL:
            return E_NOMEM
        self.ent, self.dcap = <Entry *>p, cap
        return OK

    cdef int _grow_dirty(self) noexcept nogil:
        if self.ndirty < self.dirtycap:
            return OK
        cdef Py_ssize_t cap = self.dirtycap * 2 if self.dirtycap else 64
        cdef void *p = PyMem_RawRealloc(self.dirty, cap * sizeof(uint32_t))
        if p == NULL:
            return E_NOMEM
        self.dirty, self.dirtycap = <uint32_t *>p, cap
        return OK

    cdef int _grow_arena(self, size_t need) noexcept nogil:
        if need > _arena_limit:
            return E_ARENA
        if need <= self.acap:
            return OK
        cdef size_t cap = self.acap + (self.acap >> 3)
        if cap < need:
            cap = need
        if cap > _arena_limit:
            cap = _arena_limit
        if cap < 256:
            cap = 256
        cdef void *p = PyMem_RawRealloc(self.arena, cap)
        if p == NULL:
            return E_NOMEM
        self.arena, self.acap = <unsigned char *>p, cap
        return OK

    cdef int _rebuild_index(self, Py_ssize_t keys, bint force) noexcept nogil:
        """An index for `keys` keys at most 0.7 full (grown, or rebuilt when forced),
        holding the n keys there are."""
        cdef uint64_t cap = self.mask + 1
        if not force and keys * 10 <= <Py_ssize_t>(cap * 7):
            return OK
        self._drop_growing()
        cap = _index_cap(keys)
        cdef uint32_t *index = <uint32_t *>PyMem_RawMalloc(cap * sizeof(uint32_t))
        if index == NULL:
            return E_NOMEM
        memset(index, 0, cap * sizeof(uint32_t))
        cdef uint64_t mask = cap - 1, slot
        cdef Py_ssize_t i
        for i in range(self.n):
            slot = self.ent[i].pos & mask
            while index[slot]:
                slot = (slot + 1) & mask
            index[slot] = <uint32_t>(i + 1)
        PyMem_RawFree(self.index)
        self.index, self.mask = index, mask
        return OK

    cdef void _drop_growing(self) noexcept nogil:
        PyMem_RawFree(self.nindex)
        self.nindex, self.nplaced = NULL, 0

    cdef int _grow_index_some(self, Py_ssize_t keys, Py_ssize_t most) noexcept nogil:
        """grow_index's work: 1 when the index holds `keys` more keys already, 0 after
        a share of the work, else an error."""
        cdef Py_ssize_t need = self.n + keys, i, end
        if need * 10 <= <Py_ssize_t>((self.mask + 1) * 7):
            self._drop_growing()
            return 1
        cdef uint64_t cap = _index_cap(need), slot
        if self.nindex != NULL and (self.nmask + 1 < cap or self.nplaced > self.n):
            self._drop_growing()        # too small by now, or entries it placed are gone
        if self.nindex == NULL:
            self.nindex = <uint32_t *>PyMem_RawMalloc(cap * sizeof(uint32_t))
            if self.nindex == NULL:
                return E_NOMEM
            self.nmask, self.nplaced, self.nzeroed = cap - 1, 0, 0
        cdef uint64_t share = <uint64_t>most * 8, clear
        if self.nzeroed <= self.nmask:  # cleared a share a call (its pages touched then)
            clear = self.nmask + 1 - self.nzeroed
            clear = share if clear > share else clear
            memset(self.nindex + self.nzeroed, 0, clear * sizeof(uint32_t))
            self.nzeroed += clear
            if clear == share:
                return 0
        end = self.n if self.n - self.nplaced <= most else self.nplaced + most
        for i in range(self.nplaced, end):
            slot = self.ent[i].pos & self.nmask
            while self.nindex[slot]:
                slot = (slot + 1) & self.nmask
            self.nindex[slot] = <uint32_t>(i + 1)
        self.nplaced = end
        if end == self.n:
            PyMem_RawFree(self.index)
            self.index, self.mask = self.nindex, self.nmask
            self.nindex, self.nplaced = NULL, 0
        return 0

    cdef inline Py_ssize_t _find(self, uint8_t kind, const unsigned char *k, uint32_t klen,
                                 uint64_t p, uint64_t *slot) noexcept nogil:
        cdef uint64_t s = p & self.mask, meta
        cdef uint32_t e
        cdef const Entry *x
        while True:
            e = self.index[s]
            if e == 0:
                slot[0] = s
                return -1
            x = &self.ent[e - 1]
            if x.pos == p:
                meta = _meta(x)
                if (meta & KIND) == kind and _klen(self.arena, meta) == klen \
                        and memcmp(_key(self.arena, meta), k, klen) == 0:
                    return e - 1
            s = (s + 1) & self.mask

    cdef inline int _insert(self, uint8_t kind, const unsigned char *k, uint32_t klen,
                            uint64_t p, uint64_t slot, Py_ssize_t *at) noexcept nogil:
        """Add a key (state 0) at the empty `slot` _find gave; its index in at[0]."""
        cdef int err = OK
        if self.n == self.dcap:
            err = self._grow_dense(self.n + 1)
        cdef size_t head = _head(klen)
        if err == OK and self.alen + head + klen > self.acap:
            err = self._grow_arena(self.alen + head + klen)
        if err == OK and (self.n + 1) * 10 > <Py_ssize_t>((self.mask + 1) * 7):
            err = self._rebuild_index(self.n + 1, False)
            if err == OK:
                self._find(kind, k, klen, p, &slot)
        if err != OK:
            return err
        cdef Py_ssize_t i = self.n
        self.ent[i].pos, self.ent[i].val = p, 0
        self.ent[i].off, self.ent[i].flags = <uint32_t>self.alen, kind
        if head == 1:
            self.arena[self.alen] = <unsigned char>klen
        else:
            self.arena[self.alen] = 255
            memcpy(self.arena + self.alen + 1, &klen, 4)
        memcpy(self.arena + self.alen + head, k, klen)
        self.alen += head + klen
        self.index[slot] = <uint32_t>(i + 1)
        self.n = i + 1
        at[0] = i
        return OK

    cdef void _unwind(self, Py_ssize_t n0, Py_ssize_t nd0, const int64_t *old,
                      const uint32_t *idx, Py_ssize_t done) noexcept nogil:
        """Undo a batch's first `done` tuples: states, dirty marks, then new keys in the
        reverse of their insertion (which leaves every probe chain as it was)."""
        cdef Py_ssize_t t, i
        cdef uint64_t s
        for t in range(done - 1, -1, -1):
            self.ent[idx[t]].val = old[t]
        for t in range(nd0, self.ndirty):
            self.ent[self.dirty[t]].flags &= ~(<uint8_t>DIRTY)
        self.ndirty = nd0
        for i in range(self.n - 1, n0 - 1, -1):
            s = self.ent[i].pos & self.mask
            while self.index[s] != i + 1:
                s = (s + 1) & self.mask
            self.index[s] = 0
        if n0 < self.n:
            self.alen = self.ent[n0].off
        if self.nplaced > n0:           # it placed entries that are gone
            self._drop_growing()
        self.n = n0

    cdef inline int _mark(self, Py_ssize_t i) noexcept nogil:
        if not (self.ent[i].flags & DIRTY):
            if self.ndirty == self.dirtycap and self._grow_dirty() != OK:
                return E_NOMEM
            self.ent[i].flags |= DIRTY
            self.dirty[self.ndirty] = <uint32_t>i
            self.ndirty += 1
        return OK

    cdef inline void _keep(self, Py_ssize_t i) noexcept nogil:
        """Entry i is about to change: each open cut that has not given it yet and has
        not kept its state keeps it now (its state as of the cut)."""
        cdef int c
        cdef CutRec *r
        cdef uint64_t bit = (<uint64_t>1) << (i & 63)
        for c in range(MAXCUTS):
            r = &self.cuts[c]
            if not r.open:
                continue
            if r.sel == NULL:
                if i < r.at or i >= r.n:
                    continue
            elif i >= r.tn or not (r.pending[i >> 6] & bit):
                continue
            if not (r.kept[i >> 6] & bit):       # (bits sized for the table's entries)
                r.kept[i >> 6] |= bit
                r.old[i] = self.ent[i].val

    cdef inline void _prefetch(self, const uint64_t *posn, Py_ssize_t t,
                               Py_ssize_t m) noexcept nogil:
        """Index slot 16 tuples ahead, entry 8 ahead, key bytes 4 ahead."""
        cdef uint32_t e
        if t + 16 < m:
            floe_prefetch(&self.index[posn[t + 16] & self.mask])
        if t + 8 < m:
            e = self.index[posn[t + 8] & self.mask]
            if e:
                floe_prefetch(&self.ent[e - 1])
        if t + 4 < m:
            e = self.index[posn[t + 4] & self.mask]
            if e:
                floe_prefetch(self.arena + self.ent[e - 1].off)

    cdef int _fold(self, const uint8_t *kinds, const unsigned char *data, uint64_t dlen,
                   const uint64_t *off, const uint64_t *posn, const int64_t *vals,
                   Py_ssize_t start, Py_ssize_t m, bint overwrite, bint mark,
                   int64_t *old, uint32_t *idx, Py_ssize_t *at) noexcept nogil:
        cdef Py_ssize_t n0 = self.n, nd0 = self.ndirty, t, i, done = 0
        cdef uint64_t a, b, p, slot
        cdef int64_t v, r
        cdef uint8_t kind
        cdef int err = OK, code = self.code
        cdef bint fresh, changed
        cdef Entry *x
        for t in range(start, m):
            self._prefetch(posn, t, m)
            done = t - start
            kind, a, b = kinds[t], off[t], off[t + 1]
            if kind > 2:
                err = E_KIND
                break
            if a > b or b > dlen or b - a >= 0xFFFFFFFFUL:
                err = E_OFFSETS
                break
            p, v = posn[t], vals[t]
            i = self._find(kind, data + a, <uint32_t>(b - a), p, &slot)
            fresh = i < 0
            if fresh:
                if not floe_valid_key(kind, data + a, b - a):
                    err = E_KEY
                    break
                if floe_murmur3_64(data + a, b - a, 0) != p:
                    err = E_POSITION
                    break
                err = self._insert(kind, data + a, <uint32_t>(b - a), p, slot, &i)
                if err != OK:
                    break
            if self.ncuts:
                self._keep(i)           # a cut not given this entry yet keeps its state
            x = &self.ent[i]
            old[done], idx[done] = x.val, <uint32_t>i
            done += 1
            changed = True
            if overwrite or fresh:
                x.val = v
            elif code <= 1:
                if floe_add_overflow(x.val, v, &r):
                    err = E_OVERFLOW
                    break
                x.val = r
            elif (v < x.val) if code == 2 else (v > x.val):
                x.val = v
            else:
                changed = False
            if changed and mark:
                err = self._mark(i)
                if err != OK:
                    break
        else:
            done = m - start
        if err != OK:
            at[0] = t
            self._unwind(n0, nd0, old, idx, done)
        return err

    cdef _run(self, kinds, key_data, offsets, positions, values, Py_ssize_t start,
              bint overwrite, bint mark):
        if self.busy:
            raise RuntimeError("the state table is in use by another call")
        cols = columns(kinds, key_data, offsets, positions, values)
        cdef const unsigned char[::1] kv = cols[0], dv = cols[1], ov = cols[2]
        cdef const unsigned char[::1] pv = cols[3], vv = cols[4]
        cdef Py_ssize_t m = kv.shape[0], at = 0
        if not 0 <= start <= m:
            raise ValueError(f"start {start} is outside the batch of {m}")
        if start == m:
            return
        cdef int64_t *old = <int64_t *>PyMem_RawMalloc((m - start) * sizeof(int64_t))
        cdef uint32_t *idx = <uint32_t *>PyMem_RawMalloc((m - start) * sizeof(uint32_t))
        cdef int err
        cdef const uint8_t *k = _ptr(kv)
        cdef const unsigned char *d = _ptr(dv)
        cdef uint64_t dlen = dv.shape[0]
        cdef const uint64_t *o = <const uint64_t *>_ptr(ov)
        cdef const uint64_t *p = <const uint64_t *>_ptr(pv)
        cdef const int64_t *v = <const int64_t *>_ptr(vv)
        self.busy = True
        try:
            if old == NULL or idx == NULL:
                raise MemoryError()
            with nogil:
                PyThread_acquire_lock(self.lock, 1)
                err = OK
                if overwrite:       # a range taken over: room for all of it at once
                    err = self._grow_dense(self.n + m)
                    if err == OK:
                        err = self._grow_arena(self.alen + dlen + <size_t>m)
                    if err == OK:
                        err = self._rebuild_index(self.n + m, False)
                if err == OK:
                    err = self._fold(k, d, dlen, o, p, v, start, m, overwrite, mark,
                                     old, idx, &at)
                PyThread_release_lock(self.lock)
        finally:
            self.busy = False
            PyMem_RawFree(old)
            PyMem_RawFree(idx)
        if err != OK:
            _raise(err, at, self.op)

    def apply(self, kinds, key_data, offsets, positions, values, Py_ssize_t start=0):
        """Fold the batch's tuples from `start` on with the op: all of them, or (an
        error raised) none."""
        self._run(kinds, key_data, offsets, positions, values, start, False, True)

    def merge(self, buffers, bint mark_dirty=True):
        """Fold exported states in with the op (a count's state is its value)."""
        k, d, o, p, v = _five(buffers)
        self._run(k, d, o, p, v, 0, False, mark_dirty)

    def install(self, buffers, bint mark_dirty=False):
        """Set the states of the buffers' keys to theirs (a range taken over or
        restored); all or nothing as apply."""
        k, d, o, p, v = _five(buffers)
        self._run(k, d, o, p, v, 0, True, mark_dirty)

    def install_parts(self, parts, bint mark_dirty=False):
        """Set the states of the keys of `parts`, each (kinds, key_data, offsets of
        n + 1, values), as install does, in one call: the positions hashed here, room
        made once for all of them (the index grown once, not at each doubling as frames
        come one by one). A key given twice takes its later state. All or nothing:
        ValueError naming the entry (counted across the parts) for a bad kind, offsets
        or key bytes. Besides the table it holds a block's positions and, when the
        table was not empty, 12 bytes a key (to undo the states of keys it had)."""
        if self.busy:
            raise RuntimeError("the state table is in use by another call")
        held = []
        cdef Py_ssize_t m = 0, j, nparts = len(parts)
        for part in parts:
            if not isinstance(part, (tuple, list)) or len(part) != 4:
                raise TypeError("a part must be (kinds, key_data, offsets, values)")
            k, d = octets(part[0], "kinds"), octets(part[1], "key_data")
            o = words(part[2], "offsets", signed=False)
            v = words(part[3], "values", signed=True)
            if len(o) != 8 * (len(k) + 1) or len(v) != 8 * len(k):
                raise ValueError(f"a part of {len(k)} keys must hold n + 1 offsets and n "
                                 f"values, got {len(o) // 8} and {len(v) // 8}")
            held.append((k, d, o, v))
            m += len(k)
        if self.n + m >= <Py_ssize_t>4294967295UL:
            raise MemoryError("the state table could not grow")
        cdef Part *ps = <Part *>PyMem_RawMalloc((nparts + 1) * sizeof(Part))
        cdef Py_ssize_t had = m if self.n else 0      # undo records: keys it had
        cdef uint64_t *pos = <uint64_t *>PyMem_RawMalloc(BLOCK * sizeof(uint64_t))
        cdef int64_t *old = <int64_t *>PyMem_RawMalloc((had + 1) * sizeof(int64_t))
        cdef uint32_t *idx = <uint32_t *>PyMem_RawMalloc((had + 1) * sizeof(uint32_t))
        cdef const unsigned char[::1] kv, dv, ov, vv
        cdef Py_ssize_t base = 0, at = 0
        cdef int err = OK
        try:
            if ps == NULL or pos == NULL or old == NULL or idx == NULL:
                raise MemoryError()
            for j in range(nparts):
                kv, dv, ov, vv = held[j]
                ps[j].kinds, ps[j].data, ps[j].dlen = _ptr(kv), _ptr(dv), dv.shape[0]
                ps[j].off = <const uint64_t *>_ptr(ov)
                ps[j].val = <const int64_t *>_ptr(vv)
                ps[j].base = base
                base += kv.shape[0]
            ps[nparts].base = m
            self.busy = True
            with nogil:
                PyThread_acquire_lock(self.lock, 1)
                err = self._grow_dense(self.n + m)
                if err == OK:
                    err = self._grow_arena(self.alen + _key_bytes(ps, nparts) + <size_t>m)
                if err == OK:
                    err = self._rebuild_index(self.n + m, False)
                if err == OK:
                    err = self._install_in(ps, nparts, pos, mark_dirty, old, idx, &at)
                PyThread_release_lock(self.lock)
        finally:
            self.busy = False
            PyMem_RawFree(ps)
            PyMem_RawFree(pos)
            PyMem_RawFree(old)
            PyMem_RawFree(idx)
        if err != OK:
            _raise(err, at, self.op)

    cdef int _install_in(self, const Part *ps, Py_ssize_t nparts, uint64_t *pos,
                         bint mark, int64_t *old, uint32_t *idx,
                         Py_ssize_t *at) noexcept nogil:
        """Set the parts' keys' states, part after part, a block at a time: its kinds
        and offsets checked and positions hashed into `pos`, then its keys set. The
        states of keys the table had before are kept in old/idx; on an error all is
        undone and at[0] says where."""
        cdef Py_ssize_t n0 = self.n, nd0 = self.ndirty, i, j, e, done = 0, lo, hi, t
        cdef uint64_t a, b, p, slot
        cdef uint8_t kind
        cdef int err = OK
        cdef const Part *q
        for j in range(nparts):
            q = &ps[j]
            lo = 0
            while lo < ps[j + 1].base - q.base:
                hi = ps[j + 1].base - q.base
                hi = lo + BLOCK if lo + BLOCK < hi else hi
                for i in range(lo, hi):
                    a, b = q.off[i], q.off[i + 1]
                    if q.kinds[i] > 2:
                        err, at[0] = E_KIND, q.base + i
                        break
                    if a > b or b > q.dlen or b - a >= 0xFFFFFFFFUL:
                        err, at[0] = E_OFFSETS, q.base + i
                        break
                    pos[i - lo] = floe_murmur3_64(q.data + a, b - a, 0)
                if err != OK:
                    break
                for i in range(lo, hi):
                    t = i - lo
                    self._prefetch(pos, t, hi - lo)
                    kind, a, b, p = q.kinds[i], q.off[i], q.off[i + 1], pos[t]
                    e = self._find(kind, q.data + a, <uint32_t>(b - a), p, &slot)
                    if e < 0:
                        if not floe_valid_key(kind, q.data + a, b - a):
                            err, at[0] = E_KEY, q.base + i
                            break
                        err = self._insert(kind, q.data + a, <uint32_t>(b - a), p, slot, &e)
                        if err != OK:
                            at[0] = q.base + i
                            break
                    elif e < n0:                # a key the table had: its state kept
                        old[done], idx[done] = self.ent[e].val, <uint32_t>e
                        done += 1
                    if self.ncuts:
                        self._keep(e)
                    self.ent[e].val = q.val[i]
                    if mark:
                        err = self._mark(e)
                        if err != OK:
                            at[0] = q.base + i
                            break
                if err != OK:
                    break
                lo = hi
            if err != OK:
                break
        if err != OK:
            self._unwind(n0, nd0, old, idx, done)
        return err

    # -- reading ---------------------------------------------------------------------

    cdef tuple _export(self, Sorted *sel, Py_ssize_t k, bint ordered=True):
        global _s_ent, _s_arena
        _s_ent, _s_arena = self.ent, self.arena
        if ordered and _sort(sel, k) != OK:
            raise MemoryError()
        cdef Py_ssize_t t
        cdef uint64_t total = 0, w = 0, meta
        cdef uint32_t klen
        for t in range(k):
            total += _klen(self.arena, _meta(&self.ent[sel[t].i]))
        kinds = PyBytes_FromStringAndSize(NULL, k)
        data = PyBytes_FromStringAndSize(NULL, total)
        cdef carray.array offsets = carray.clone(_U64, k + 1, zero=False)
        cdef carray.array positions = carray.clone(_U64, k, zero=False)
        cdef carray.array values = carray.clone(_I64, k, zero=False)
        cdef uint8_t *kp = <uint8_t *>PyBytes_AS_STRING(kinds)
        cdef unsigned char *dp = <unsigned char *>PyBytes_AS_STRING(data)
        cdef uint64_t *op = <uint64_t *>offsets.data.as_voidptr
        cdef uint64_t *pp = <uint64_t *>positions.data.as_voidptr
        cdef int64_t *vp = <int64_t *>values.data.as_voidptr
        cdef const Entry *x
        op[0] = 0
        with nogil:
            for t in range(k):
                x = &self.ent[sel[t].i]
                meta = _meta(x)
                klen = _klen(self.arena, meta)
                memcpy(dp + w, _key(self.arena, meta), klen)
                w += klen
                kp[t], op[t + 1], pp[t], vp[t] = meta & KIND, w, x.pos, x.val
        return kinds, data, offsets, positions, values

    cdef tuple _export_where(self, bint every, const uint32_t *chosen, Py_ssize_t count,
                             uint64_t lo, uint64_t hi, bint ordered=True):
        """Export the `chosen` entries (every: all) whose positions are in (lo, hi]."""
        if self.busy:
            raise RuntimeError("the state table is in use by another call")
        cdef Py_ssize_t total = self.n if every else count
        cdef Sorted *sel = <Sorted *>PyMem_RawMalloc((total + 1) * sizeof(Sorted))
        if sel == NULL:
            raise MemoryError()
        cdef Py_ssize_t j, i, k = 0
        with nogil:
            for j in range(total):
                i = j if every else chosen[j]
                if _in_range(self.ent[i].pos, lo, hi):
                    sel[k].pos, sel[k].i = self.ent[i].pos, i
                    k += 1
        try:
            return self._export(sel, k, ordered)
        finally:
            PyMem_RawFree(sel)

    def export(self, uint64_t lo=0, uint64_t hi=0, bint ordered=True):
        """The keys at positions in (lo, hi] (lo == hi: all), in position order (not
        ordered: as they are kept, a copy at memory speed), as (kinds, key_data,
        offsets, positions, values)."""
        return self._export_where(True, NULL, 0, lo, hi, ordered)

    def take_dirty(self, bint ordered=True):
        """The keys changed since the previous take, as export gives them (not
        ordered: in the order each first changed); from now on none is changed (the
        fragment of an incremental checkpoint)."""
        if self.busy:
            raise RuntimeError("the state table is in use by another call")
        out = self._export_where(False, self.dirty, self.ndirty, 0, 0, ordered)
        cdef Py_ssize_t t
        for t in range(self.ndirty):
            self.ent[self.dirty[t]].flags &= ~(<uint8_t>DIRTY)
        self.ndirty = 0
        if self.dirtycap > 4096:        # a large fragment's list is not kept for the next
            PyMem_RawFree(self.dirty)
            self.dirty, self.dirtycap = NULL, 0
        return out

    @property
    def dirty_count(self):
        return self.ndirty

    def discard(self, uint64_t lo=0, uint64_t hi=0):
        """Remove the keys at positions in (lo, hi] (lo == hi: all)."""
        if self.busy:
            raise RuntimeError("the state table is in use by another call")
        if self.ncuts:
            raise RuntimeError("the state table has a cut open: its entries must stay")
        cdef Py_ssize_t i, j = 0
        cdef uint64_t w = 0, a, size
        for i in range(self.n):
            if _in_range(self.ent[i].pos, lo, hi):
                continue
            a = self.ent[i].off
            size = _klen(self.arena, _meta(&self.ent[i]))
            size += _head(<uint32_t>size)
            memmove(self.arena + w, self.arena + a, size)
            self.ent[j] = self.ent[i]
            self.ent[j].off = <uint32_t>w
            w += size
            j += 1
        self.n, self.alen, self.ndirty = j, w, 0
        for i in range(j):
            if self.ent[i].flags & DIRTY:
                self.dirty[self.ndirty] = <uint32_t>i
                self.ndirty += 1
        if self._rebuild_index(j, True) != OK:
            raise MemoryError()

    def reserve(self, Py_ssize_t keys, size_t key_bytes):
        """Room made now for `keys` more keys of `key_bytes` key bytes in all, the
        index sized for them: a range installed a few frames at a time then grows
        nothing (the index rebuilt at a doubling is a step of O(keys))."""
        if self.busy:
            raise RuntimeError("the state table is in use by another call")
        if keys < 0 or self.n + keys >= <Py_ssize_t>4294967295UL:
            raise ValueError(f"cannot reserve room for {keys} more keys")
        cdef int err
        with nogil:
            PyThread_acquire_lock(self.lock, 1)
            err = self._grow_dense(self.n + keys)
            if err == OK:
                err = self._grow_arena(self.alen + key_bytes + <size_t>keys)
            if err == OK:
                err = self._rebuild_index(self.n + keys, False)
            PyThread_release_lock(self.lock)
        if err != OK:
            _raise(err, 0, self.op)

    def grow_index(self, Py_ssize_t keys, Py_ssize_t most):
        """Grow the index to hold `keys` more keys than the table has, a share of the
        work a call (the larger index cleared `8 * most` slots a call, then `most` of
        the table's entries placed in it a call; rebuilt at a doubling, the index is
        one step of O(keys)): True when it holds them already (nothing done), False
        after a call that did a share (the larger index in use once it holds every
        entry). The table is read and changed as ever between calls: the larger index
        catches up with keys added meanwhile, and starts again when entries it held
        were removed."""
        if self.busy:
            raise RuntimeError("the state table is in use by another call")
        if keys < 0 or most < 1 or self.n + keys >= <Py_ssize_t>4294967295UL:
            raise ValueError(f"cannot grow the index for {keys} more keys, {most} a call")
        cdef int got
        with nogil:
            PyThread_acquire_lock(self.lock, 1)
            got = self._grow_index_some(keys, most)
            PyThread_release_lock(self.lock)
        if got < 0:
            _raise(got, 0, self.op)
        return got == 1

    # -- cuts -----------------------------------------------------------------------

    def cut(self):
        """A TableCut of the table as it is now (every key, as they are kept, as
        export(ordered=False) gives them), or None when MAXCUTS cuts are open."""
        return self._open_cut(False)

    def take_dirty_cut(self):
        """As take_dirty(ordered=False), as a TableCut: the keys changed since the
        previous take, in the order each first changed, with their states as of
        now; from now on none is changed. None (and nothing taken) when MAXCUTS cuts
        are open."""
        return self._open_cut(True)

    cdef object _open_cut(self, bint dirty):
        if self.busy:
            raise RuntimeError("the state table is in use by another call")
        cdef int c
        for c in range(MAXCUTS):
            if not self.cuts[c].open:
                break
        else:
            return None
        cdef Py_ssize_t n = self.n, t, k = self.ndirty if dirty else n
        cdef uint64_t *kept = <uint64_t *>PyMem_RawCalloc((n >> 6) + 1, sizeof(uint64_t))
        cdef int64_t *old = <int64_t *>PyMem_RawMalloc((n + 1) * sizeof(int64_t))
        cdef uint64_t *pending = NULL
        cdef uint32_t *sel = NULL
        cdef uint32_t i
        if dirty:
            pending = <uint64_t *>PyMem_RawCalloc((n >> 6) + 1, sizeof(uint64_t))
            sel = <uint32_t *>PyMem_RawMalloc((k + 1) * sizeof(uint32_t))
        if kept == NULL or old == NULL or (dirty and (pending == NULL or sel == NULL)):
            PyMem_RawFree(kept)
            PyMem_RawFree(old)
            PyMem_RawFree(pending)
            PyMem_RawFree(sel)
            raise MemoryError()
        with nogil:
            PyThread_acquire_lock(self.lock, 1)
            if dirty:               # the dirty list becomes the cut's; the marks go
                memcpy(sel, self.dirty, k * sizeof(uint32_t))
                for t in range(k):
                    i = sel[t]
                    self.ent[i].flags &= ~(<uint8_t>DIRTY)
                    pending[i >> 6] |= (<uint64_t>1) << (i & 63)
                self.ndirty = 0
                if self.dirtycap > 4096:    # a large fragment's list is not kept
                    PyMem_RawFree(self.dirty)
                    self.dirty, self.dirtycap = NULL, 0
            self.cuts[c].open, self.cuts[c].n, self.cuts[c].at = True, k, 0
            self.cuts[c].kept, self.cuts[c].old = kept, old
            self.cuts[c].sel, self.cuts[c].pending, self.cuts[c].tn = sel, pending, n
            self.ncuts += 1
            PyThread_release_lock(self.lock)
        return TableCut(self, c, k)

    cdef tuple _take(self, int c, Py_ssize_t most):
        """The cut's next `most` entries (fewer at its end) as export gives them. The
        lock is held to count their key bytes, then again to copy them; not while the
        output is made (an allocation may run the collector, whose finalizers may close
        a cut, which takes the lock)."""
        cdef CutRec *r = &self.cuts[c]
        cdef Py_ssize_t lo, hi, t, e
        cdef uint64_t total = 0, w = 0, meta, bit
        cdef uint32_t klen
        cdef const Entry *x
        with nogil:
            PyThread_acquire_lock(self.lock, 1)
            lo = r.at
            hi = r.n if most >= r.n - lo else lo + most
            for t in range(lo, hi):             # a key's bytes never change
                total += _klen(self.arena, _meta(&self.ent[t if r.sel == NULL else r.sel[t]]))
            PyThread_release_lock(self.lock)
        kinds = PyBytes_FromStringAndSize(NULL, hi - lo)
        data = PyBytes_FromStringAndSize(NULL, total)
        cdef carray.array offsets = carray.clone(_U64, hi - lo + 1, zero=False)
        cdef carray.array positions = carray.clone(_U64, hi - lo, zero=False)
        cdef carray.array values = carray.clone(_I64, hi - lo, zero=False)
        cdef uint8_t *kp = <uint8_t *>PyBytes_AS_STRING(kinds)
        cdef unsigned char *dp = <unsigned char *>PyBytes_AS_STRING(data)
        cdef uint64_t *op = <uint64_t *>offsets.data.as_voidptr
        cdef uint64_t *pp = <uint64_t *>positions.data.as_voidptr
        cdef int64_t *vp = <int64_t *>values.data.as_voidptr
        cdef bint raced = False
        op[0] = 0
        with nogil:
            PyThread_acquire_lock(self.lock, 1)
            if r.at != lo or not r.open:
                raced = True
            else:
                for t in range(lo, hi):
                    e = t if r.sel == NULL else r.sel[t]
                    x = &self.ent[e]
                    meta = _meta(x)
                    klen = _klen(self.arena, meta)
                    memcpy(dp + w, _key(self.arena, meta), klen)
                    w += klen
                    kp[t - lo], op[t - lo + 1], pp[t - lo] = meta & KIND, w, x.pos
                    bit = (<uint64_t>1) << (e & 63)
                    vp[t - lo] = r.old[e] if r.kept[e >> 6] & bit else x.val
                    if r.sel != NULL:
                        r.pending[e >> 6] &= ~bit
                r.at = hi
            PyThread_release_lock(self.lock)
        if raced:
            raise RuntimeError("a cut was taken from by two callers at once")
        return kinds, data, offsets, positions, values

    cdef void _close(self, int c):
        cdef CutRec *r = &self.cuts[c]
        with nogil:
            PyThread_acquire_lock(self.lock, 1)
            if r.open:
                PyMem_RawFree(r.kept)
                PyMem_RawFree(r.old)
                PyMem_RawFree(r.sel)
                PyMem_RawFree(r.pending)
                r.kept, r.old, r.sel, r.pending, r.open = NULL, NULL, NULL, NULL, False
                self.ncuts -= 1
            PyThread_release_lock(self.lock)

    def get(self, key, default=None):
        if self.busy:       # another thread is folding a batch with the GIL released
            raise RuntimeError("the state table is in use by another call")
        kind, data = key_parts(key)
        cdef const unsigned char[::1] kb = data
        cdef uint64_t slot, p = floe_murmur3_64(_ptr(kb), kb.shape[0], 0)
        if kb.shape[0] >= 0xFFFFFFFF:
            return default
        cdef Py_ssize_t i = self._find(kind, _ptr(kb), <uint32_t>kb.shape[0], p, &slot)
        return default if i < 0 else self.ent[i].val

    def __contains__(self, key):
        return self.get(key, _ABSENT) is not _ABSENT

    def items(self, uint64_t lo=0, uint64_t hi=0):
        """(key, state) pairs in position order."""
        kinds, data, offsets, _, values = self.export(lo, hi)
        return list(zip(decode_keys(kinds, data, offsets), values))

    def __len__(self):
        return self.n

    @property
    def nbytes(self):
        """Memory the table holds (allocated, not only used)."""
        return (self.dcap * sizeof(Entry) + self.acap + self.dirtycap * 4
                + (self.mask + 1) * sizeof(uint32_t)
                + ((self.nmask + 1) * sizeof(uint32_t) if self.nindex != NULL else 0))


@cython.no_gc_clear
cdef class TableCut:
    """A state table as it was at `StateTable.cut()`, given a slice at a time: take(k)
    gives its next k entries (kinds, key_data, offsets from 0, positions, values),
    each with its state as of the cut, whatever batches changed since; an empty slice
    once all were given. It closes (the table keeps no more states for it) once all
    were given, at close(), or when it is let go."""

    cdef StateTable table
    cdef int slot
    cdef readonly Py_ssize_t size
    cdef bint closed
    cdef list parts
    cdef PyThread_type_lock plock

    def __cinit__(self, StateTable table, int slot, Py_ssize_t size):
        self.table, self.slot, self.size, self.parts = table, slot, size, []
        self.plock = PyThread_allocate_lock()
        if self.plock == NULL:
            raise MemoryError()

    def part(self, Py_ssize_t i, Py_ssize_t most):
        """Slice i of the cut (take's, made once and kept: every reader of the cut
        reads the same slices, from any thread), slices made as needed of at most
        `most` entries each; None past the last."""
        if i < 0:
            raise ValueError("a slice's index is 0 or more")
        with nogil:
            PyThread_acquire_lock(self.plock, 1)
        try:
            while len(self.parts) <= i and not self.closed:
                got = self.take(most)
                if len(got[0]):
                    self.parts.append(got)
            return self.parts[i] if i < len(self.parts) else None
        finally:
            PyThread_release_lock(self.plock)

    def __len__(self):
        return self.size

    @property
    def taken(self):
        """Entries given so far."""
        return self.size if self.closed else self.table.cuts[self.slot].at

    def take(self, Py_ssize_t most):
        if most < 1:
            raise ValueError("a slice takes at least one entry")
        if self.closed:
            return _empty_export()
        out = self.table._take(self.slot, most)
        if self.table.cuts[self.slot].at >= self.size:
            self.close()
        return out

    def close(self):
        if not self.closed:
            self.closed = True
            self.table._close(self.slot)

    def __dealloc__(self):
        if not self.closed and self.table is not None:
            self.closed = True
            self.table._close(self.slot)
        if self.plock != NULL:
            PyThread_free_lock(self.plock)


def _empty_export():
    return b"", b"", array("Q", [0]), array("Q"), array("q")


_ABSENT = object()


def _five(buffers):
    if not isinstance(buffers, (tuple, list)) or len(buffers) != 5:
        raise TypeError("buffers must be (kinds, key_data, offsets, positions, values)")
    return buffers


cdef _raise(int err, Py_ssize_t at, str op):
    if err == E_NOMEM:
        raise MemoryError("the state table could not grow")
    if err == E_ARENA:
        raise OverflowError("the state table's key bytes would pass 4 GiB; the batch "
                            "changed nothing (cut the range smaller)")
    if err == E_OVERFLOW:
        raise OverflowError(f"{op} of key {at} goes beyond int64; the batch changed nothing")
    what = {E_KEY: "is not what its kind encodes (str: UTF-8; int: \\0i and a decimal)",
            E_POSITION: "has a position that is not its key's hash",
            E_OFFSETS: "has offsets that decrease or pass the end of key_data",
            E_KIND: "has a kind other than 0 (str), 1 (bytes) or 2 (int)"}[err]
    raise ValueError(f"key {at} {what}; the batch changed nothing")
