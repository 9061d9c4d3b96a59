/* Key checks for the state table: a key's bytes must be what hashing.key_bytes gives
   for its kind (0 str: UTF-8 as Python's strict codec takes it; 1 bytes: any; 2 int:
   "\0i" and a canonical decimal of at most 4300 digits). */
#ifndef FLOE_KEYS_H
#define FLOE_KEYS_H
#include <stddef.h>
#include <stdint.h>

static int floe_valid_utf8(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c < 0x80) { i++; continue; }
        size_t need; uint32_t cp;
        if (c >= 0xC2 && c <= 0xDF) { need = 1; cp = c & 0x1F; }
        else if (c >= 0xE0 && c <= 0xEF) { need = 2; cp = c & 0x0F; }
        else if (c >= 0xF0 && c <= 0xF4) { need = 3; cp = c & 0x07; }
        else return 0;
        if (n - i <= need) return 0;
        for (size_t j = 1; j <= need; j++) {
            unsigned char d = s[i + j];
            if ((d & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (d & 0x3F);
        }
        if (need == 2 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) return 0;
        if (need == 3 && (cp < 0x10000 || cp > 0x10FFFF)) return 0;
        i += need + 1;
    }
    return 1;
}

static int floe_valid_key(unsigned char kind, const unsigned char *s, size_t n) {
    if (kind == 1) return 1;
    if (kind == 0) return floe_valid_utf8(s, n);
    if (kind != 2 || n < 3 || s[0] != 0 || s[1] != 'i') return 0;
    size_t i = 2;
    if (s[i] == '-') i++;
    size_t digits = n - i;
    if (digits == 0 || digits > 4300) return 0;
    if (s[i] == '0' && (digits > 1 || i == 3)) return 0;   /* leading zero, or "-0" */
    for (; i < n; i++) if (s[i] < '0' || s[i] > '9') return 0;
    return 1;
}
#endif
