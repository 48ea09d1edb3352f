/* String builder used by the emitters, the pattern writer and the tuning records. */
#include "base/strbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void tj_sb_init(tj_strbuf *sb) { memset(sb, 0, sizeof *sb); }

void tj_sb_free(tj_strbuf *sb)
{
    free(sb->data);
    tj_sb_init(sb);
}

static int reserve(tj_strbuf *sb, size_t extra)
{
    if (sb->oom) return 0;
    if (sb->len + extra + 1 <= sb->cap) return 1;
    size_t cap = sb->cap ? sb->cap : 256;
    while (cap < sb->len + extra + 1) {
        if (cap > ((size_t)-1) / 2) { sb->oom = 1; return 0; }
        cap *= 2;
    }
    char *p = realloc(sb->data, cap);
    if (!p) { sb->oom = 1; return 0; }
    sb->data = p;
    sb->cap = cap;
    return 1;
}

void tj_sb_append(tj_strbuf *sb, const char *s, size_t n)
{
    if (!reserve(sb, n)) return;
    memcpy(sb->data + sb->len, s, n);
    sb->len += n;
    sb->data[sb->len] = '\0';
}

void tj_sb_puts(tj_strbuf *sb, const char *s) { tj_sb_append(sb, s, strlen(s)); }

static void vprintf_sb(tj_strbuf *sb, const char *fmt, va_list ap)
{
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    if (n < 0) { sb->oom = 1; return; }
    if (!reserve(sb, (size_t)n)) return;
    vsnprintf(sb->data + sb->len, (size_t)n + 1, fmt, ap);
    sb->len += (size_t)n;
}

void tj_sb_printf(tj_strbuf *sb, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vprintf_sb(sb, fmt, ap);
    va_end(ap);
}

void tj_sb_line(tj_strbuf *sb, const char *fmt, ...)
{
    for (int i = 0; i < sb->indent; i++) tj_sb_append(sb, " ", 1);
    va_list ap;
    va_start(ap, fmt);
    vprintf_sb(sb, fmt, ap);
    va_end(ap);
    tj_sb_append(sb, "\n", 1);
}

char *tj_sb_take(tj_strbuf *sb)
{
    if (sb->oom) { tj_sb_free(sb); return NULL; }
    if (!sb->data) {
        if (!reserve(sb, 0)) return NULL;
        sb->data[0] = '\0';
    }
    char *p = sb->data;
    tj_sb_init(sb);
    return p;
}
