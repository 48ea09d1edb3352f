/* One string builder for all generated text: append with a format, indentation, and a sticky
 * out-of-memory flag checked once at the end. */
#ifndef TJ_STRBUF_H
#define TJ_STRBUF_H

#include <stddef.h>

typedef struct tj_strbuf {
    char *data;
    size_t len, cap;
    int indent; /* spaces written after each newline by tj_sb_line */
    int oom;    /* sticky: set by the first failed allocation */
} tj_strbuf;

void tj_sb_init(tj_strbuf *sb);
void tj_sb_free(tj_strbuf *sb);
void tj_sb_append(tj_strbuf *sb, const char *s, size_t n);
void tj_sb_puts(tj_strbuf *sb, const char *s);
void tj_sb_printf(tj_strbuf *sb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Indents, formats and ends the line. */
void tj_sb_line(tj_strbuf *sb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Hands the buffer (NUL-terminated) to the caller; NULL if out of memory. */
char *tj_sb_take(tj_strbuf *sb);

#endif
