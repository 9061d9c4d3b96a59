# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False
"""The compiled combiner: str keys folded into one open partial state per ring token
(count, sum, min, max as int64), and a token's partial states taken out as one batch
payload (format 2 columns, or format 1 msgpack) without a Python object per tuple.

Each key is read as its UTF-8 bytes in place (an ASCII str's own buffer), hashed once
(MurmurHash3 x64_128 low 64 bits, seed 0: its ring position), routed to the first token
at or after its position (the first token past the last), and folded into that token's
open-addressing table of (position, key bytes) -> int64 state, entries in first-seen
order. `fold` stops and says why at the first tuple it cannot take whole: a full token
(the caller seals it), a sum leaving int64 (the caller seals the token and folds on),
a key that is not str, not UTF-8 or too long (the caller's checks say what is wrong).
The pure-Python module pycombine has the same interface.
"""

from libc.stdint cimport uint32_t, uint64_t, int64_t, int32_t
from libc.string cimport memcmp, memcpy, memset
from cpython.mem cimport PyMem_Malloc, PyMem_Realloc, PyMem_Free
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING

cdef extern from "Python.h":
    ctypedef struct PyObject
    PyObject *_list_item "PyList_GET_ITEM" (object, Py_ssize_t)
    int _is_str "PyUnicode_CheckExact" (PyObject *)
    int _is_ascii "PyUnicode_IS_ASCII" (PyObject *)
    void *_str_data "PyUnicode_DATA" (PyObject *)
    Py_ssize_t _str_len "PyUnicode_GET_LENGTH" (PyObject *)
    const char *_utf8 "PyUnicode_AsUTF8AndSize" (PyObject *, Py_ssize_t *)
    void PyErr_Clear()

cdef extern from "_murmur3.h" nogil:
    uint64_t floe_murmur3_64(const unsigned char *data, size_t len, uint32_t seed)

cdef extern from *:
    """
    static inline int floe_add_overflow64(int64_t a, int64_t b, int64_t *r) {
        return __builtin_add_overflow(a, b, r);
    }
    """
    int floe_add_overflow64(int64_t a, int64_t b, int64_t *r) nogil

# "append": no combining, every tuple an entry of its own with its seq (every tuple sent).
OPS = {"count": 0, "sum": 1, "min": 2, "max": 3, "append": 4}
cdef enum:
    BUCKET_BITS = 12
    APPEND = 4
# What fold() says when it stops.
DONE, FULL, OVERFLOW, BAD_KEY, LONG_KEY, NOT_STR = 0, 1, 2, 3, 4, 5
# What a part's entry costs in a batch beside its key's bytes (format 2: its offset,
# position and value), counted towards a fold's `max_bytes`.
cdef enum:
    C_ENTRY_BYTES = 24
ENTRY_BYTES = C_ENTRY_BYTES


ctypedef struct Entry:      # 32 bytes: what a lookup reads, on one cache line
    uint64_t pos
    int64_t val
    uint32_t off            # the key's bytes: data[off:off + len]
    uint32_t len
    uint64_t seq            # (append only) the tuple's seq


ctypedef struct Part:
    Entry *ent              # in first-seen order
    unsigned char *data
    uint32_t *index         # 0 empty, else entry + 1
    Py_ssize_t n, cap
    size_t dlen, dcap
    uint64_t mask           # index slots - 1 (no index while 0)
    int64_t inputs          # tuples folded in
    bint opened


cdef void _free(Part *p) noexcept:
    PyMem_Free(p.ent)
    PyMem_Free(p.data)
    PyMem_Free(p.index)
    memset(p, 0, sizeof(Part))


cdef void _reset(Part *p) noexcept:
    p.n = 0
    p.dlen = 0
    p.inputs = 0
    p.opened = 0
    if p.index != NULL:
        memset(p.index, 0, (p.mask + 1) * sizeof(uint32_t))


cdef int _grow_entries(Part *p) noexcept:
    cdef Py_ssize_t cap = p.cap * 2 if p.cap else 64
    cdef void *a = PyMem_Realloc(p.ent, cap * sizeof(Entry))
    if a == NULL:
        return -1
    p.ent = <Entry *>a
    p.cap = cap
    return 0


cdef int _grow_index(Part *p) noexcept:
    """Twice the slots (at least two per entry the part has room for), the entries
    placed again."""
    cdef uint64_t slots = (p.mask + 1) * 2 if p.mask else 128
    while slots < <uint64_t>(2 * p.cap):
        slots *= 2
    cdef uint32_t *index = <uint32_t *>PyMem_Malloc(slots * sizeof(uint32_t))
    if index == NULL:
        return -1
    memset(index, 0, slots * sizeof(uint32_t))
    cdef uint64_t mask = slots - 1, s
    cdef Py_ssize_t i
    for i in range(p.n):
        s = p.ent[i].pos & mask
        while index[s]:
            s = (s + 1) & mask
        index[s] = <uint32_t>(i + 1)
    PyMem_Free(p.index)
    p.index = index
    p.mask = mask
    return 0


cdef Py_ssize_t _push(Part *p, uint64_t h, const unsigned char *s, size_t ln,
                      int64_t v, uint64_t seq) noexcept:
    """Append a new entry (not indexed); -1 when out of memory or past 4 GiB of keys."""
    cdef size_t need
    cdef void *a
    if p.dlen + ln >= 0xFFFFFFFF:
        return -1
    if p.n == p.cap:
        if _grow_entries(p) < 0:
            return -1
    if p.dlen + ln > p.dcap:
        need = p.dcap * 2 if p.dcap else 1024
        while need < p.dlen + ln:
            need *= 2
        a = PyMem_Realloc(p.data, need)
        if a == NULL:
            return -1
        p.data = <unsigned char *>a
        p.dcap = need
    cdef Py_ssize_t i = p.n
    if ln:
        memcpy(p.data + p.dlen, s, ln)
    p.dlen += ln
    p.ent[i].pos = h
    p.ent[i].val = v
    p.ent[i].off = <uint32_t>(p.dlen - ln)
    p.ent[i].len = <uint32_t>ln
    p.ent[i].seq = seq
    p.n = i + 1
    return i


cdef Py_ssize_t _add(Part *p, uint64_t h, const unsigned char *s, size_t ln,
                     int64_t v, uint64_t slot) noexcept:
    """A new entry at the empty index `slot`; -1 when out of memory."""
    cdef Py_ssize_t i = _push(p, h, s, ln, v, 0)
    if i < 0:
        return -1
    p.index[slot] = <uint32_t>(i + 1)
    if <uint64_t>(2 * p.n) > p.mask:         # keep the index at most half full
        if _grow_index(p) < 0:
            return -1
    return i


cdef inline bint _over(const Part *p, Py_ssize_t max_bytes) noexcept:
    """Whether part p's batch reached `max_bytes` (0: no byte bound)."""
    return max_bytes > 0 and p.dlen + <size_t>C_ENTRY_BYTES * p.n >= <size_t>max_bytes


cdef inline Py_ssize_t _find(const Part *p, uint64_t h, const unsigned char *s, size_t ln,
                             uint64_t *slot) noexcept:
    """The entry of (h, key bytes), or -1 with *slot its empty index slot."""
    cdef uint64_t k = h & p.mask
    cdef uint32_t e
    cdef const Entry *en
    while True:
        e = p.index[k]
        if e == 0:
            slot[0] = k
            return -1
        en = &p.ent[e - 1]
        if en.pos == h and en.len == ln and memcmp(p.data + en.off, s, ln) == 0:
            return e - 1
        k = (k + 1) & p.mask


cdef inline Py_ssize_t _token_index(const uint64_t *tokens, Py_ssize_t n,
                                    const uint32_t *bucket, uint64_t h) noexcept:
    """The first token at or after position h (the first token past the last one),
    searched from the first token of h's bucket (its top BUCKET_BITS bits) on."""
    cdef Py_ssize_t t = bucket[h >> (64 - BUCKET_BITS)]
    while t < n and tokens[t] < h:
        t += 1
    return 0 if t == n else t


cdef inline size_t _bin_head(unsigned char *w, size_t n) noexcept:
    """A msgpack bin header for n bytes at w; its size (w NULL: only the size)."""
    if n < 256:
        if w != NULL:
            w[0] = 0xC4
            w[1] = <unsigned char>n
        return 2
    if n < 65536:
        if w != NULL:
            w[0] = 0xC5
            w[1] = <unsigned char>(n >> 8)
            w[2] = <unsigned char>n
        return 3
    if w != NULL:
        w[0] = 0xC6
        _be(w + 1, n, 4)
    return 5


cdef inline void _be(unsigned char *w, uint64_t v, int size) noexcept:
    cdef int k
    for k in range(size):
        w[k] = <unsigned char>(v >> (8 * (size - 1 - k)))


cdef inline size_t _head(unsigned char *w, size_t n, unsigned char fix, unsigned char fixmax,
                         unsigned char b8, unsigned char b16) noexcept:
    """A msgpack str (fix 0xa0) or array (fix 0x90) header for n; b8 0 when the type
    has no 8-bit form. Its size; w NULL: only the size."""
    if n < fixmax:
        if w != NULL:
            w[0] = fix | <unsigned char>n
        return 1
    if b8 and n < 256:
        if w != NULL:
            w[0] = b8
            w[1] = <unsigned char>n
        return 2
    if n < 65536:
        if w != NULL:
            w[0] = b16
            _be(w + 1, n, 2)
        return 3
    if w != NULL:
        w[0] = b16 + 1
        _be(w + 1, n, 4)
    return 5


cdef inline size_t _int(unsigned char *w, int64_t v) noexcept:
    """msgpack's smallest encoding of v; its size (w NULL: only the size)."""
    cdef uint64_t u
    cdef unsigned char code
    cdef int size
    if 0 <= v < 128 or -32 <= v < 0:
        if w != NULL:
            w[0] = <unsigned char>v
        return 1
    if v > 0:
        u = <uint64_t>v
        if u < 256:
            code, size = 0xCC, 1
        elif u < 65536:
            code, size = 0xCD, 2
        elif u < 4294967296:
            code, size = 0xCE, 4
        else:
            code, size = 0xCF, 8
    else:
        u = <uint64_t>v
        if v >= -128:
            code, size = 0xD0, 1
        elif v >= -32768:
            code, size = 0xD1, 2
        elif v >= -2147483648:
            code, size = 0xD2, 4
        else:
            code, size = 0xD3, 8
    if w != NULL:
        w[0] = code
        _be(w + 1, u, size)
    return 1 + size


cdef inline size_t _uint(unsigned char *w, uint64_t u) noexcept:
    """msgpack's smallest encoding of an unsigned u; its size (w NULL: only the size)."""
    cdef unsigned char code
    cdef int size
    if u < 128:
        if w != NULL:
            w[0] = <unsigned char>u
        return 1
    if u < 256:
        code, size = 0xCC, 1
    elif u < 65536:
        code, size = 0xCD, 2
    elif u < 4294967296:
        code, size = 0xCE, 4
    else:
        code, size = 0xCF, 8
    if w != NULL:
        w[0] = code
        _be(w + 1, u, size)
    return 1 + size


cdef object _bytes_view(obj):
    """A byte view of a buffer (bytes, an Arrow buffer; None: no bytes)."""
    if obj is None:
        return b""
    view = memoryview(obj)
    return view if view.format == "B" else view.cast("B")


cdef object _int64_view(obj):
    """An int64 view of a buffer of native int64s (bytes as take_columns gives them)."""
    view = memoryview(obj)
    return view if view.format in ("q", "l") else view.cast("B").cast("q")


cdef inline bint _utf8_ok(const unsigned char *s, Py_ssize_t n) noexcept:
    """Whether s[:n] is UTF-8 as Python's strict decoder takes it (no surrogates, no
    overlong forms, nothing past U+10FFFF)."""
    cdef Py_ssize_t i = 0
    cdef unsigned char c, c1
    while i < n:
        c = s[i]
        if c < 0x80:
            i += 1
            continue
        if c < 0xC2 or c > 0xF4:
            return 0
        if c < 0xE0:
            if i + 1 >= n or (s[i + 1] & 0xC0) != 0x80:
                return 0
            i += 2
            continue
        if i + 1 >= n:
            return 0
        c1 = s[i + 1]
        if (c1 & 0xC0) != 0x80 or (c == 0xE0 and c1 < 0xA0) or (c == 0xED and c1 > 0x9F) \
                or (c == 0xF0 and c1 < 0x90) or (c == 0xF4 and c1 > 0x8F):
            return 0
        if c < 0xF0:
            if i + 2 >= n or (s[i + 2] & 0xC0) != 0x80:
                return 0
            i += 3
            continue
        if i + 3 >= n or (s[i + 2] & 0xC0) != 0x80 or (s[i + 3] & 0xC0) != 0x80:
            return 0
        i += 4
    return 1


def check_keys(list keys, Py_ssize_t max_key_bytes):
    """(i, status) of the first key of `keys` a fold stops at for the key itself:
    NOT_STR, BAD_KEY (not UTF-8), LONG_KEY (over max_key_bytes of UTF-8); (len(keys),
    DONE) when every key is a str fold takes. One pass, nothing folded: a caller
    refuses a list whole before any of it is folded."""
    cdef Py_ssize_t i, ln, n = len(keys)
    cdef PyObject *key
    for i in range(n):
        key = _list_item(keys, i)
        if not _is_str(key):
            return i, NOT_STR
        if _is_ascii(key):
            ln = _str_len(key)
        elif _utf8(key, &ln) == NULL:
            PyErr_Clear()
            return i, BAD_KEY
        if ln > max_key_bytes:
            return i, LONG_KEY
    return n, DONE


cdef class Combiner:
    """Open partial states per token of `tokens` (the ring's, sorted) for reducer `op`.

    `opened`: the indexes of tokens whose part went from empty to holding a key, in
    that order, appended by fold (the caller empties it)."""

    cdef int op
    cdef uint64_t *tok
    cdef uint32_t *bucket     # the first token index at or after each bucket's start
    cdef Py_ssize_t ntok
    cdef Part *parts
    cdef size_t max_key_bytes
    cdef readonly tuple tokens
    cdef readonly list opened

    def __cinit__(self, str op, tokens, Py_ssize_t max_key_bytes):
        if op not in OPS:
            raise ValueError(f"no combining for reducer {op!r}: one of {sorted(OPS)}")
        self.op = OPS[op]
        self.tokens = tuple(tokens)
        self.ntok = len(self.tokens)
        if self.ntok == 0:
            raise ValueError("a ring has at least one token")
        self.tok = <uint64_t *>PyMem_Malloc(self.ntok * sizeof(uint64_t))
        self.parts = <Part *>PyMem_Malloc(self.ntok * sizeof(Part))
        self.bucket = <uint32_t *>PyMem_Malloc((1 << BUCKET_BITS) * sizeof(uint32_t))
        if self.tok == NULL or self.parts == NULL or self.bucket == NULL:
            raise MemoryError()
        memset(self.parts, 0, self.ntok * sizeof(Part))
        cdef Py_ssize_t i, t = 0
        for i in range(self.ntok):
            self.tok[i] = self.tokens[i]
            if i and self.tok[i] <= self.tok[i - 1]:
                raise ValueError("ring tokens must be increasing")
        for i in range(1 << BUCKET_BITS):
            while t < self.ntok and self.tok[t] < (<uint64_t>i << (64 - BUCKET_BITS)):
                t += 1
            self.bucket[i] = <uint32_t>t
        self.max_key_bytes = max_key_bytes
        self.opened = []

    def __dealloc__(self):
        cdef Py_ssize_t i
        if self.parts != NULL:
            for i in range(self.ntok):
                _free(&self.parts[i])
            PyMem_Free(self.parts)
        PyMem_Free(self.tok)
        PyMem_Free(self.bucket)

    def count(self, Py_ssize_t t):
        """(keys, tuples folded in) of token index t's part."""
        return self.parts[t].n, self.parts[t].inputs

    def fold(self, list keys, Py_ssize_t start, int64_t value, values, Py_ssize_t size,
             int64_t most, uint64_t seq0=0, Py_ssize_t max_bytes=0):
        """Fold keys[start:] (each with `value`, or values[i] from an int64 buffer of
        len(keys)) until a part holds `size` keys or `most` tuples, or (`max_bytes` > 0)
        its keys' bytes and ENTRY_BYTES an entry reach `max_bytes`. Returns (i, t,
        status): tuples before i are folded; status FULL: token t's part is full (i is
        past its last tuple); OVERFLOW: key i's sum would leave int64 in part t; BAD_KEY,
        LONG_KEY, NOT_STR: key i is not UTF-8, too long, not a str; DONE: all folded.
        "append": every tuple is an entry of its own, tuple i's seq seq0 + i."""
        cdef const int64_t[::1] vals
        cdef const int64_t *vp = NULL
        cdef Py_ssize_t n = len(keys)
        if values is not None:
            vals = values
            if vals.shape[0] != n:
                raise ValueError(f"{n} keys but {vals.shape[0]} values")
            if n:
                vp = &vals[0]
        return self._fold(keys, start, n, value, vp, size, most, seq0, max_bytes)

    cdef tuple _fold(self, list keys, Py_ssize_t start, Py_ssize_t n, int64_t value,
                     const int64_t *vp, Py_ssize_t size, int64_t most, uint64_t seq0,
                     Py_ssize_t max_bytes):
        cdef PyObject *key
        cdef const unsigned char *s
        cdef Py_ssize_t ln, i, t, e
        cdef uint64_t h, slot
        cdef int64_t v, r
        cdef Part *p
        cdef int op = self.op
        for i in range(start, n):
            key = _list_item(keys, i)
            if not _is_str(key):
                return i, -1, NOT_STR
            if _is_ascii(key):
                s = <const unsigned char *>_str_data(key)
                ln = _str_len(key)
            else:
                s = <const unsigned char *>_utf8(key, &ln)
                if s == NULL:
                    PyErr_Clear()
                    return i, -1, BAD_KEY
            if <size_t>ln > self.max_key_bytes:
                return i, -1, LONG_KEY
            h = floe_murmur3_64(s, ln, 0)
            t = _token_index(self.tok, self.ntok, self.bucket, h)
            p = &self.parts[t]
            v = vp[i] if vp != NULL else value
            if op == APPEND:
                if not p.opened:
                    p.opened = 1
                    self.opened.append(t)
                if _push(p, h, s, ln, v, seq0 + i) < 0:
                    raise MemoryError()
                p.inputs += 1
                if p.n >= size or _over(p, max_bytes):
                    return i + 1, t, FULL
                continue
            if p.index == NULL and _grow_index(p) < 0:
                raise MemoryError()
            e = _find(p, h, s, ln, &slot)
            if e >= 0:
                if op <= 1:
                    if floe_add_overflow64(p.ent[e].val, v, &r):
                        return i, t, OVERFLOW
                    p.ent[e].val = r
                elif op == 2:
                    if v < p.ent[e].val:
                        p.ent[e].val = v
                elif v > p.ent[e].val:
                    p.ent[e].val = v
            else:
                if not p.opened:
                    p.opened = 1
                    self.opened.append(t)
                if _add(p, h, s, ln, v, slot) < 0:
                    raise MemoryError()
            p.inputs += 1
            if p.n >= size or p.inputs >= most or _over(p, max_bytes):
                return i + 1, t, FULL
        return n, -1, DONE

    def fold_utf8(self, data, offsets, int width, Py_ssize_t start, Py_ssize_t stop,
                  int64_t value, values, Py_ssize_t size, int64_t most, uint64_t seq0=0,
                  Py_ssize_t max_bytes=0):
        """fold() over keys given as UTF-8 bytes, as an Arrow string array holds them:
        key i is data[offsets[i]:offsets[i + 1]], `offsets` little-endian integers of
        `width` bytes (4: Arrow's string, 8: large_string), keys start..stop-1 folded.
        No Python object per key. Returns (i, t, status) as fold does (NOT_STR never;
        BAD_KEY also for offsets that leave the data); values[i] (an int64 buffer) or
        `value` for key i; "append": tuple i's seq seq0 + i."""
        cdef const unsigned char[::1] d = _bytes_view(data)
        cdef const unsigned char[::1] o = _bytes_view(offsets)
        cdef const int64_t[::1] vals
        cdef const int64_t *vp = NULL
        if width != 4 and width != 8:
            raise ValueError("offsets are 4 or 8 bytes wide")
        if start < 0 or stop < start or <size_t>o.shape[0] < <size_t>(stop + 1) * width:
            raise ValueError(f"{o.shape[0]} bytes of offsets for keys {start}..{stop}")
        if values is not None:
            vals = _int64_view(values)
            if vals.shape[0] < stop:
                raise ValueError(f"{stop} keys but {vals.shape[0]} values")
            if stop:
                vp = &vals[0]
        if stop == start:
            return stop, -1, DONE
        return self._fold_utf8(&d[0] if d.shape[0] else NULL, d.shape[0], &o[0], width,
                               start, stop, value, vp, size, most, seq0, max_bytes)

    cdef tuple _fold_utf8(self, const unsigned char *data, Py_ssize_t dlen,
                          const unsigned char *offs, int width, Py_ssize_t start,
                          Py_ssize_t stop, int64_t value, const int64_t *vp,
                          Py_ssize_t size, int64_t most, uint64_t seq0,
                          Py_ssize_t max_bytes):
        cdef const unsigned char *s
        cdef Py_ssize_t ln, i, t, e
        cdef int64_t a, b, v, r
        cdef int32_t a32, b32
        cdef uint64_t h, slot
        cdef Part *p
        cdef int op = self.op
        for i in range(start, stop):
            if width == 4:
                memcpy(&a32, offs + 4 * i, 4)
                memcpy(&b32, offs + 4 * (i + 1), 4)
                a, b = a32, b32
            else:
                memcpy(&a, offs + 8 * i, 8)
                memcpy(&b, offs + 8 * (i + 1), 8)
            if a < 0 or b < a or b > dlen:
                return i, -1, BAD_KEY
            s = data + a
            ln = b - a
            if <size_t>ln > self.max_key_bytes:
                return i, -1, LONG_KEY
            if not _utf8_ok(s, ln):
                return i, -1, BAD_KEY
            h = floe_murmur3_64(s, ln, 0)
            t = _token_index(self.tok, self.ntok, self.bucket, h)
            p = &self.parts[t]
            v = vp[i] if vp != NULL else value
            if op == APPEND:
                if not p.opened:
                    p.opened = 1
                    self.opened.append(t)
                if _push(p, h, s, ln, v, seq0 + i) < 0:
                    raise MemoryError()
                p.inputs += 1
                if p.n >= size or _over(p, max_bytes):
                    return i + 1, t, FULL
                continue
            if p.index == NULL and _grow_index(p) < 0:
                raise MemoryError()
            e = _find(p, h, s, ln, &slot)
            if e >= 0:
                if op <= 1:
                    if floe_add_overflow64(p.ent[e].val, v, &r):
                        return i, t, OVERFLOW
                    p.ent[e].val = r
                elif op == 2:
                    if v < p.ent[e].val:
                        p.ent[e].val = v
                elif v > p.ent[e].val:
                    p.ent[e].val = v
            else:
                if not p.opened:
                    p.opened = 1
                    self.opened.append(t)
                if _add(p, h, s, ln, v, slot) < 0:
                    raise MemoryError()
            p.inputs += 1
            if p.n >= size or p.inputs >= most or _over(p, max_bytes):
                return i + 1, t, FULL
        return stop, -1, DONE

    def take_columns(self, Py_ssize_t t):
        """Token index t's entries, first-seen order, as (key data, offsets, values):
        bytes, little-endian int64 offsets (one more than the keys), int64 values (what
        fold_utf8 takes back with width 8); the part is emptied."""
        if not 0 <= t < self.ntok:
            raise IndexError(t)
        cdef Part *p = &self.parts[t]
        cdef Py_ssize_t n = p.n, i
        data = PyBytes_FromStringAndSize(<const char *>p.data if p.dlen else NULL, p.dlen)
        offsets = PyBytes_FromStringAndSize(NULL, 8 * (n + 1))
        vals = PyBytes_FromStringAndSize(NULL, 8 * n)
        cdef unsigned char *w = <unsigned char *>PyBytes_AS_STRING(offsets)
        cdef unsigned char *x = <unsigned char *>PyBytes_AS_STRING(vals)
        cdef uint64_t word = 0
        memcpy(w, &word, 8)
        for i in range(n):
            word = <uint64_t>p.ent[i].off + p.ent[i].len
            memcpy(w + 8 * (i + 1), &word, 8)
            memcpy(x + 8 * i, &p.ent[i].val, 8)
        _reset(p)
        return data, offsets, vals

    def take_seqs(self, Py_ssize_t t):
        """(append) The first and last seqs of token index t's part and its seqs as a
        batch carries them: b"" when contiguous, else their msgpack array. Before
        take(), which empties the part."""
        if not 0 <= t < self.ntok:
            raise IndexError(t)
        cdef Part *p = &self.parts[t]
        if p.n == 0:
            raise ValueError("no tuple in this part")
        first, last = p.ent[0].seq, p.ent[p.n - 1].seq
        if p.ent[p.n - 1].seq - p.ent[0].seq + 1 == <uint64_t>p.n:
            return first, last, b""
        cdef size_t total = _head(NULL, p.n, 0x90, 16, 0, 0xDC)
        cdef Py_ssize_t i
        for i in range(p.n):
            total += _uint(NULL, p.ent[i].seq)
        out = PyBytes_FromStringAndSize(NULL, total)
        cdef unsigned char *w = <unsigned char *>PyBytes_AS_STRING(out)
        w += _head(w, p.n, 0x90, 16, 0, 0xDC)
        for i in range(p.n):
            w += _uint(w, p.ent[i].seq)
        return first, last, out

    def take(self, Py_ssize_t t, int form=2):
        """Token index t's partial states as a batch payload (`form` 2: columns, 1:
        msgpack [keys, values]), and (keys, tuples folded in); the part is emptied."""
        if not 0 <= t < self.ntok:
            raise IndexError(t)
        cdef Part *p = &self.parts[t]
        out = _columns(p) if form == 2 else _msgpack(p)
        counts = (p.n, p.inputs)
        _reset(p)
        return out, counts[0], counts[1]


cdef bytes _columns(const Part *p):
    """HEADER (0xc1 0x02) + msgpack [kinds, key_data, offsets, positions, values]."""
    cdef size_t n = p.n
    cdef size_t sizes[5]
    sizes[0] = 1
    sizes[1] = p.dlen
    sizes[2] = 8 * (n + 1)
    sizes[3] = 8 * n
    sizes[4] = 8 * n
    cdef size_t total = 3, k
    for k in range(5):
        total += _bin_head(NULL, sizes[k]) + sizes[k]
    out = PyBytes_FromStringAndSize(NULL, total)
    cdef unsigned char *w = <unsigned char *>PyBytes_AS_STRING(out)
    w[0] = 0xC1
    w[1] = 0x02
    w[2] = 0x95
    w += 3
    w += _bin_head(w, 1)
    w[0] = 0                        # one kind for all: str
    w += 1
    w += _bin_head(w, sizes[1])
    if p.dlen:
        memcpy(w, p.data, p.dlen)
    w += p.dlen
    cdef size_t i
    cdef uint64_t zero = 0, word
    w += _bin_head(w, sizes[2])     # little-endian hosts only, as the hash
    memcpy(w, &zero, 8)             # (memcpy: the columns need not be aligned)
    for i in range(n):
        word = <uint64_t>p.ent[i].off + p.ent[i].len
        memcpy(w + 8 * (i + 1), &word, 8)
    w += sizes[2]
    w += _bin_head(w, sizes[3])
    for i in range(n):
        memcpy(w + 8 * i, &p.ent[i].pos, 8)
    w += sizes[3]
    w += _bin_head(w, sizes[4])
    for i in range(n):
        memcpy(w + 8 * i, &p.ent[i].val, 8)
    return out


cdef bytes _msgpack(const Part *p):
    """msgpack [keys, values], keys as str."""
    cdef Py_ssize_t n = p.n, i
    cdef size_t total = 1 + 2 * _head(NULL, n, 0x90, 16, 0, 0xDC), ln
    for i in range(n):
        ln = p.ent[i].len
        total += _head(NULL, ln, 0xA0, 32, 0xD9, 0xDA) + ln + _int(NULL, p.ent[i].val)
    out = PyBytes_FromStringAndSize(NULL, total)
    cdef unsigned char *w = <unsigned char *>PyBytes_AS_STRING(out)
    w[0] = 0x92
    w += 1
    w += _head(w, n, 0x90, 16, 0, 0xDC)
    for i in range(n):
        ln = p.ent[i].len
        w += _head(w, ln, 0xA0, 32, 0xD9, 0xDA)
        if ln:
            memcpy(w, p.data + p.ent[i].off, ln)
        w += ln
    w += _head(w, n, 0x90, 16, 0, 0xDC)
    for i in range(n):
        w += _int(w, p.ent[i].val)
    return out


# The default map step (mapper/words.py: `[a-z]+(?:'[a-z]+)*` over the lower-cased
# line) on UTF-8 bytes. Lower-casing maps only two non-ASCII characters to ASCII
# letters: U+0130 to "i" + U+0307 (a letter, then a character no word holds) and the
# Kelvin sign U+212A to "k"; every other non-ASCII character ends a word (a test checks
# every code point against split_words).
cdef inline int _unit(const unsigned char *s, Py_ssize_t n, Py_ssize_t *p,
                      int *mark) noexcept:
    """The next character of s lower-cased, at *p (advanced past it): its ASCII letter,
    39 for an apostrophe, 0 for anything else."""
    cdef unsigned char c
    if mark[0]:
        mark[0] = 0                 # the U+0307 after the "i" of a U+0130
        return 0
    c = s[p[0]]
    if c < 0x80:
        p[0] += 1
        if 65 <= c <= 90:
            return c + 32
        if 97 <= c <= 122 or c == 39:
            return c
        return 0
    if c == 0xC4 and p[0] + 1 < n and s[p[0] + 1] == 0xB0:
        p[0] += 2
        mark[0] = 1
        return 105
    if c == 0xE2 and p[0] + 2 < n and s[p[0] + 1] == 0x84 and s[p[0] + 2] == 0xAA:
        p[0] += 3
        return 107
    p[0] += 1                       # a lead or continuation byte: never a letter
    return 0


cdef int _out_grow(unsigned char **out, size_t *cap, size_t need) noexcept:
    cdef size_t c = cap[0] if cap[0] else 4096
    while c < need:
        c *= 2
    cdef void *a = PyMem_Realloc(out[0], c)
    if a == NULL:
        return -1
    out[0] = <unsigned char *>a
    cap[0] = c
    return 0


def split_words(data, offsets, int width, Py_ssize_t start, Py_ssize_t stop,
                validity=None, Py_ssize_t bit_offset=0):
    """The words of lines start..stop-1 of an Arrow string array (data, `width`-byte
    offsets; line i data[offsets[i]:offsets[i + 1]]; `validity` its null bitmap, line i
    at bit bit_offset + i), in order, as mapper.words.split_words gives them: (word
    data, int64 offsets, words), what fold_utf8 takes with width 8."""
    cdef const unsigned char[::1] d = _bytes_view(data)
    cdef const unsigned char[::1] o = _bytes_view(offsets)
    cdef const unsigned char[::1] v
    cdef const unsigned char *valid = NULL
    if width != 4 and width != 8:
        raise ValueError("offsets are 4 or 8 bytes wide")
    if start < 0 or stop < start or <size_t>o.shape[0] < <size_t>(stop + 1) * width:
        raise ValueError(f"{o.shape[0]} bytes of offsets for lines {start}..{stop}")
    if validity is not None:
        v = _bytes_view(validity)
        if bit_offset < 0 or v.shape[0] * 8 < bit_offset + stop:
            raise ValueError("the null bitmap is shorter than the lines")
        valid = &v[0]
    cdef const unsigned char *base = &d[0] if d.shape[0] else NULL
    cdef const unsigned char *offs = &o[0]
    cdef Py_ssize_t dlen = d.shape[0], i, p, n, q, bit
    cdef int64_t a, b
    cdef int32_t a32, b32
    cdef unsigned char *out = NULL
    cdef int64_t *ends = NULL
    cdef size_t ocap = 0, ecap = 0, olen = 0, nwords = 0
    cdef int u, mark, peek
    cdef const unsigned char *s
    try:
        for i in range(start, stop):
            bit = bit_offset + i
            if valid != NULL and not (valid[bit >> 3] >> (bit & 7)) & 1:
                continue
            if width == 4:
                memcpy(&a32, offs + 4 * i, 4)
                memcpy(&b32, offs + 4 * (i + 1), 4)
                a, b = a32, b32
            else:
                memcpy(&a, offs + 8 * i, 8)
                memcpy(&b, offs + 8 * (i + 1), 8)
            if a < 0 or b < a or b > dlen:
                raise ValueError(f"line {i}'s offsets leave the data")
            s = base + a
            n = b - a
            # a line of n bytes makes at most n bytes of words, n // 2 + 1 words
            if olen + n > ocap and _out_grow(&out, &ocap, olen + n) < 0:
                raise MemoryError()
            if (nwords + n // 2 + 2) * 8 > ecap and \
                    _out_grow(<unsigned char **>&ends, &ecap, (nwords + n // 2 + 2) * 8) < 0:
                raise MemoryError()
            p = 0
            mark = 0
            u = 0
            while p < n or mark:
                u = _unit(s, n, &p, &mark)
                while u > 39:               # a word starts: its letters, then 'letters...
                    out[olen] = <unsigned char>u
                    olen += 1
                    u = _unit(s, n, &p, &mark) if (p < n or mark) else 0
                    if u == 39:
                        q = p
                        peek = mark
                        if (p < n or mark) and _unit(s, n, &q, &peek) > 39:
                            out[olen] = 39
                            olen += 1
                            u = _unit(s, n, &p, &mark)
                        else:
                            u = 0           # the apostrophe ends the word (as a non-letter)
                    if u <= 39:
                        ends[nwords] = <int64_t>olen
                        nwords += 1
        words = PyBytes_FromStringAndSize(<const char *>out if olen else NULL, olen)
        offsets_out = PyBytes_FromStringAndSize(NULL, 8 * (nwords + 1))
        w = <unsigned char *>PyBytes_AS_STRING(offsets_out)
        memset(w, 0, 8)
        if nwords:
            memcpy(w + 8, ends, 8 * nwords)
        return words, offsets_out, nwords
    finally:
        PyMem_Free(out)
        PyMem_Free(ends)
