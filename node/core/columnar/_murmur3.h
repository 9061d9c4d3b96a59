/* MurmurHash3_x64_128 (Austin Appleby, public domain), the low 64 bits of the
   digest: what mmh3.hash64(data, seed, x64arch=True, signed=False)[0] returns. */
#ifndef FLOE_MURMUR3_H
#define FLOE_MURMUR3_H
#include <stdint.h>
#include <string.h>

static inline uint64_t floe_rotl64(uint64_t x, int8_t r) { return (x << r) | (x >> (64 - r)); }

static inline uint64_t floe_fmix64(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ULL;
    k ^= k >> 33;
    return k;
}

static inline uint64_t floe_murmur3_64(const unsigned char *data, size_t len, uint32_t seed) {
    const size_t nblocks = len / 16;
    uint64_t h1 = seed, h2 = seed;
    const uint64_t c1 = 0x87c37b91114253d5ULL, c2 = 0x4cf5ad432745937fULL;
    for (size_t i = 0; i < nblocks; i++) {
        uint64_t k1, k2;
        memcpy(&k1, data + i * 16, 8);      /* little-endian hosts only (x86-64, arm64) */
        memcpy(&k2, data + i * 16 + 8, 8);
        k1 *= c1; k1 = floe_rotl64(k1, 31); k1 *= c2; h1 ^= k1;
        h1 = floe_rotl64(h1, 27); h1 += h2; h1 = h1 * 5 + 0x52dce729;
        k2 *= c2; k2 = floe_rotl64(k2, 33); k2 *= c1; h2 ^= k2;
        h2 = floe_rotl64(h2, 31); h2 += h1; h2 = h2 * 5 + 0x38495ab5;
    }
    const unsigned char *tail = data + nblocks * 16;
    uint64_t k1 = 0, k2 = 0;
    switch (len & 15) {
    case 15: k2 ^= ((uint64_t)tail[14]) << 48; /* fall through */
    case 14: k2 ^= ((uint64_t)tail[13]) << 40; /* fall through */
    case 13: k2 ^= ((uint64_t)tail[12]) << 32; /* fall through */
    case 12: k2 ^= ((uint64_t)tail[11]) << 24; /* fall through */
    case 11: k2 ^= ((uint64_t)tail[10]) << 16; /* fall through */
    case 10: k2 ^= ((uint64_t)tail[9]) << 8;   /* fall through */
    case 9:  k2 ^= ((uint64_t)tail[8]);
             k2 *= c2; k2 = floe_rotl64(k2, 33); k2 *= c1; h2 ^= k2;
             /* fall through */
    case 8:  k1 ^= ((uint64_t)tail[7]) << 56; /* fall through */
    case 7:  k1 ^= ((uint64_t)tail[6]) << 48; /* fall through */
    case 6:  k1 ^= ((uint64_t)tail[5]) << 40; /* fall through */
    case 5:  k1 ^= ((uint64_t)tail[4]) << 32; /* fall through */
    case 4:  k1 ^= ((uint64_t)tail[3]) << 24; /* fall through */
    case 3:  k1 ^= ((uint64_t)tail[2]) << 16; /* fall through */
    case 2:  k1 ^= ((uint64_t)tail[1]) << 8;  /* fall through */
    case 1:  k1 ^= ((uint64_t)tail[0]);
             k1 *= c1; k1 = floe_rotl64(k1, 31); k1 *= c2; h1 ^= k1;
    }
    h1 ^= (uint64_t)len; h2 ^= (uint64_t)len;
    h1 += h2; h2 += h1;
    h1 = floe_fmix64(h1); h2 = floe_fmix64(h2);
    h1 += h2;
    return h1;
}
#endif
