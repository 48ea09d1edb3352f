/* The persistent compiled-kernel cache (docs/formats.md): key bytes → blob, one file per entry under
 * $TILEJIT_CACHE_DIR, else $XDG_CACHE_HOME/tilejit, else ~/.cache/tilejit. Generic: the CUDA path
 * stores CUBINs, the CPU backend may store objects. Sits between the emitters and the compilers.
 *
 * Entries are a fixed header (magic, format version, payload length, the key's SHA-256, a 64-bit
 * checksum of the payload) and the payload, written to a temporary file in the same directory and
 * renamed into place, so readers in other processes see a whole entry or none. An entry that
 * fails any check is deleted and reported as a miss (the caller rebuilds and stores it again).
 * Temporary files of writers that died mid-write are removed after an hour. The directory is
 * kept under a size cap ($TILEJIT_CACHE_MAX_MB, default 2048 MiB; tj_cache_set_max_bytes) by
 * least-recently-used eviction: a hit refreshes its entry's modification time, and a store that
 * takes the directory over the cap deletes the oldest entries until it is under 90 % of it. A
 * handle lists the directory only at its first store, when its running size estimate (the last
 * listing's total plus its own stores since) crosses the cap, and every 64th store: entries other
 * processes add are seen at the next listing.
 * A directory that cannot be created or written turns caching (or storing) off and leaves one
 * warning for the caller; the library itself never prints. Thread-safe. */
#ifndef TJ_CACHE_H
#define TJ_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

/* SHA-256, also used to build keys. */
typedef struct tj_sha256 {
    uint32_t h[8];
    uint64_t len;
    uint8_t buf[64];
    size_t nbuf;
} tj_sha256;
void tj_sha256_init(tj_sha256 *s);
void tj_sha256_update(tj_sha256 *s, const void *data, size_t n);
void tj_sha256_final(tj_sha256 *s, uint8_t out[32]);

/* A key: the SHA-256 of everything that changes the blob. Build it with tj_cache_key_add for each
 * part (each is length-prefixed, so parts cannot run into each other), then tj_cache_key_end. */
typedef struct tj_cache_key {
    uint8_t hash[32];
    tj_sha256 st; /* in progress */
} tj_cache_key;
void tj_cache_key_begin(tj_cache_key *k);
void tj_cache_key_add(tj_cache_key *k, const void *data, size_t n);
void tj_cache_key_add_str(tj_cache_key *k, const char *s);
void tj_cache_key_end(tj_cache_key *k);
/* 64 hex digits and a NUL. */
void tj_cache_key_hex(const tj_cache_key *k, char out[65]);

typedef struct tj_cache tj_cache;

typedef enum tj_cache_result {
    TJ_CACHE_MISS = 0,
    TJ_CACHE_HIT,
    TJ_CACHE_DISCARDED, /* an entry existed but failed its integrity check: deleted, treat as miss */
    TJ_CACHE_DISABLED   /* no usable cache directory */
} tj_cache_result;

/* Opens (creating it if needed) the cache directory `dir`, or the default location when NULL.
 * Fails only when out of memory: an unusable directory gives a cache with caching off and a
 * warning (tj_cache_warning). */
tj_status tj_cache_open(const char *dir, tj_cache **out, tj_error *err);
void tj_cache_close(tj_cache *c);
/* The directory in use (borrowed; NULL when none could be determined). */
const char *tj_cache_dir(const tj_cache *c);
/* 1 when lookups may hit, 2 when entries are also stored. */
int tj_cache_mode(const tj_cache *c);
/* The first warning about the cache (directory unusable, an entry could not be written), once:
 * returns it and forgets it, so the caller shows it one time; NULL when none. Caller frees. */
char *tj_cache_take_warning(tj_cache *c);

/* Looks a key up. On TJ_CACHE_HIT *blob (malloc'ed, caller frees) and *len hold the payload.
 * Returns TJ_OK unless out of memory; *res says what happened. */
tj_status tj_cache_lookup(tj_cache *c, const tj_cache_key *k, void **blob, size_t *len, tj_cache_result *res,
                          tj_error *err);
/* Stores a payload. Failures to write are not errors: they leave a warning and return TJ_OK. */
tj_status tj_cache_store(tj_cache *c, const tj_cache_key *k, const void *blob, size_t len, tj_error *err);

/* Deletes the entry of a key, if any (an entry its user found unusable). */
void tj_cache_remove(tj_cache *c, const tj_cache_key *k);
/* The size cap in bytes (0: no cap). */
void tj_cache_set_max_bytes(tj_cache *c, uint64_t max_bytes);

/* Counters since open. */
typedef struct tj_cache_stats {
    int64_t hits, misses, discarded, stores, store_failures, evicted;
    int64_t scans; /* directory listings for the size cap */
} tj_cache_stats;
tj_cache_stats tj_cache_get_stats(tj_cache *c);

/* The default directory ($TILEJIT_CACHE_DIR, $XDG_CACHE_HOME/tilejit, ~/.cache/tilejit), malloc'ed;
 * NULL when none of them is set. */
char *tj_cache_default_dir(void);

#endif
