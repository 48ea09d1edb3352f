/* Host emulation of the generated CUDA kernels (no GPU, no NVRTC): reads back what the emitter
 * baked into the source text (work items, kept-row words in table and unrolled form, warp split),
 * then re-runs the kernels' index arithmetic in C — cp.async gathers with zero-fill, shared-memory
 * layout, ldmatrix.x4.trans and mma.m16n8k16 fragment layouts as the PTX ISA defines them, the
 * epilogue scatter, tj_fill and tj_ew — on the packed data of tj_cuda_pack, and compares with the
 * reference. It catches decoding and indexing mistakes; it says nothing about timing or races. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gen/emit_cuda.h"
#include "runtime/model.h"
#include "pattern/random.h"
#include "tj_test.h"

/* ---- what the source says ---- */

typedef struct baked {
    tj_cuda_item *items;
    int64_t nitems;
    uint64_t *words;
    int64_t nwords;
    uint32_t *bases; /* per chunk: 0xffffffff (wide) or a narrow chunk's base */
    int64_t nbases;
    int warps_n, warps_m, ofs_bits;
} baked;

static int define_int(const char *src, const char *name)
{
    char pat[64];
    snprintf(pat, sizeof pat, "#define %s ", name);
    const char *p = strstr(src, pat);
    return p ? atoi(p + strlen(pat)) : -1;
}

static int parse_baked(const char *src, baked *b)
{
    memset(b, 0, sizeof *b);
    b->warps_n = define_int(src, "TJ_WARPS_N");
    b->warps_m = define_int(src, "TJ_WARPS_M");
    b->ofs_bits = define_int(src, "TJ_OFS_BITS");
    int64_t cap = 1024;
    b->items = calloc((size_t)cap, sizeof *b->items);
    const char *p = strstr(src, "tj_item tj_items[");
    if (!p) return 0;
    p = strchr(p, '\n');
    while (p && strncmp(p + 1, "};", 2) != 0) {
        long long wofs;
        int v[6];
        if (sscanf(p + 1, " {%lld, %d, %d, %d, %d, %d, %d}", &wofs, &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]) == 7 &&
            strstr(src, "/* no tiles */") == NULL) {
            if (b->nitems == cap) b->items = realloc(b->items, (size_t)(cap *= 2) * sizeof *b->items);
            tj_cuda_item *it = &b->items[b->nitems++];
            it->wofs = wofs;
            it->ld = v[0]; it->nrows = v[1]; it->fbase = v[2]; it->width = v[3]; it->wcol = v[4]; it->cbase = v[5];
        }
        p = strchr(p + 1, '\n');
    }
    int wpc = define_int(src, "TJ_BK") / (64 / b->ofs_bits);
    int64_t wcap = 1024 * wpc, bcap = 1024;
    b->words = calloc((size_t)wcap, sizeof *b->words);
    b->bases = calloc((size_t)bcap, sizeof *b->bases);
    const char *tab = strstr(src, "unsigned long long tj_ofs_tab[");
    const char *imm = strstr(src, "#define TJ_BASE");
    if (tab) { /* table: wide chunks of wpc words */
        const char *end = strstr(tab, "};");
        for (const char *q = strstr(tab, "= {"); q && (q = strstr(q, "0x")) && q < end; q += 2) {
            if (b->nwords == wcap) b->words = realloc(b->words, (size_t)(wcap *= 2) * sizeof *b->words);
            b->words[b->nwords++] = strtoull(q, NULL, 16);
        }
        b->nbases = b->nwords / wpc;
        b->bases = realloc(b->bases, (size_t)(b->nbases + 1) * sizeof *b->bases);
        for (int64_t i = 0; i < b->nbases; i++) b->bases[i] = 0xffffffffu;
    } else if (imm) { /* unrolled: one case per chunk, in chunk order: TJ_BASE, then TJ_IMM4 / TJ_IMM2 */
        for (const char *q = imm; (q = strstr(q, "    case ")) != NULL;) {
            const char *end = strstr(q, "break;");
            if (!end) break;
            unsigned base;
            const char *bp = strstr(q, "TJ_BASE(");
            if (!bp || bp > end || sscanf(bp, "TJ_BASE(0x%x)", &base) != 1) return 0;
            if (b->nbases == bcap) b->bases = realloc(b->bases, (size_t)(bcap *= 2) * sizeof *b->bases);
            if (b->nwords + wpc > wcap) b->words = realloc(b->words, (size_t)(wcap *= 2) * sizeof *b->words);
            uint64_t *w = b->words + b->nwords;
            memset(w, 0, (size_t)wpc * sizeof *w);
            for (const char *t = bp; (t = strstr(t, "TJ_IMM")) != NULL && t < end; t += 6) {
                int idx;
                unsigned long long v[4];
                if (sscanf(t, "TJ_IMM4(%d, 0x%llx, 0x%llx, 0x%llx, 0x%llx)", &idx, &v[0], &v[1], &v[2], &v[3]) == 5)
                    for (int i = 0; i < 4 && idx + i < wpc; i++) w[idx + i] = v[i];
                else if (sscanf(t, "TJ_IMM2(%d, 0x%llx, 0x%llx)", &idx, &v[0], &v[1]) == 3)
                    for (int i = 0; i < 2 && idx + i < wpc; i++) w[idx + i] = v[i];
            }
            b->bases[b->nbases++] = base;
            b->nwords += wpc;
            q = end;
        }
    }
    return 1;
}

static void baked_free(baked *b)
{
    free(b->items);
    free(b->bases);
    free(b->words);
}

/* ---- device memory as the kernels see it ---- */

typedef struct dev {
    const tj_layer *l;
    const tj_cuda_config *c;
    const baked *bk;
    const tj_cuda_host_data *h;
    const uint16_t *x;
    int64_t ldx, ldy;
    int m;
    float *y;     /* emulated output (fp32 view; fp16/bf16 outputs are rounded on store) */
    int *writes;  /* stores per element by tj_tiles + tj_fill */
} dev;

static float in16(const dev *d, uint16_t v) { return d->c->dtype == TJ_BF16 ? tj_bf16_to_f32(v) : tj_f16_to_f32(v); }

static int64_t xi(const dev *d, int64_t k, int64_t m) { return d->c->x_fm ? k * d->ldx + m : m * d->ldx + k; }
static int64_t yi(const dev *d, int64_t n, int64_t m) { return d->c->y_fm ? n * d->ldy + m : m * d->ldy + n; }

static float round_out(const dev *d, float v)
{
    if (d->c->out == TJ_F16) return tj_f16_to_f32(tj_f32_to_f16(v));
    if (d->c->out == TJ_BF16) return tj_bf16_to_f32(tj_f32_to_bf16(v));
    return v;
}

static int defer_act(const dev *d, int n)
{
    return d->h->ew_ptr && d->l->act != TJ_ACT_NONE && d->h->ew_ptr[n + 1] > d->h->ew_ptr[n];
}

static void finish(dev *d, int n, int64_t m, float acc)
{
    float v = acc + (d->h->bias ? d->h->bias[n] : 0.0f);
    if (!defer_act(d, n)) v = tj_activate(d->l->act, v);
    d->y[yi(d, n, m)] = round_out(d, v);
    d->writes[yi(d, n, m)]++;
}

static int kept_row(const dev *d, int64_t chunk, int r)
{
    int per = 64 / d->bk->ofs_bits, wpc = d->c->bk / per;
    if (d->bk->bases[chunk] != 0xffffffffu) /* narrow chunk: base + byte r */
        return (int)(d->bk->bases[chunk] + ((d->bk->words[chunk * wpc + r / 8] >> (8 * (r % 8))) & 0xff));
    uint64_t w = d->bk->words[chunk * wpc + r / per];
    return (int)((w >> ((r % per) * d->bk->ofs_bits)) & ((1ull << d->bk->ofs_bits) - 1ull));
}

static int col_of(const dev *d, int j) { return d->h->cols ? d->h->cols[j] : j; }

/* ---- tj_tiles, mma template ---- */

#define POISON 0x7e00u /* NaN in fp16 and a huge value in bf16: unwritten shared memory shows */

/* ldmatrix.m8n8.x4.trans: matrix j's row i starts at the address given by lane 8j + i; with .trans
 * lane L receives, for each matrix j, elements (row 2(L%4), col L/4) and (row 2(L%4)+1, col L/4). */
static void ldsm_x4_trans(const uint16_t *smem, const int *row_addr /* [32] element offsets */, uint16_t regs[32][4][2])
{
    for (int L = 0; L < 32; L++)
        for (int j = 0; j < 4; j++)
            for (int e = 0; e < 2; e++) regs[L][j][e] = smem[row_addr[8 * j + 2 * (L % 4) + e] + L / 4];
}

static void tiles_mma(dev *d, const tj_cuda_item *it, int m0)
{
    const tj_cuda_config *c = d->c;
    int threads = 32 * c->warps, bm = c->bm, bn = c->bn, bkk = c->bk;
    int WN = d->bk->warps_n, WM = d->bk->warps_m, WTN = bn / WN, WTM = bm / WM, MI = WTN / 16, NI = WTM / 8;
    int XSEG = bm / 8, WSEG = bn / 8;
    int XRP = threads / XSEG < bkk ? threads / XSEG : bkk, WRP = threads / WSEG < bkk ? threads / WSEG : bkk;
    int wsld = bn + 8, xsld = bm + 8;
    uint16_t *ws = malloc((size_t)bkk * wsld * 2), *xs = malloc((size_t)bkk * xsld * 2);
    float *acc = calloc((size_t)c->warps * 32 * MI * NI * 4, sizeof *acc);
#define ACC(w, L, i, j, e) acc[((((size_t)(w) * 32 + (L)) * MI + (i)) * NI + (j)) * 4 + (e)]
    int nch = (it->nrows + bkk - 1) / bkk;
    for (int ch = 0; ch < nch; ch++) {
        for (int i = 0; i < bkk * wsld; i++) ws[i] = POISON;
        for (int i = 0; i < bkk * xsld; i++) xs[i] = POISON;
        for (int tid = 0; tid < threads; tid++) {
            int q = tid / XSEG, seg = tid % XSEG;
            if (XRP * XSEG == threads || tid < XRP * XSEG)
                for (int p = 0; p < bkk / XRP; p++) {
                    int lr = p * XRP + q, rok = ch * bkk + lr < it->nrows;
                    int k = kept_row(d, it->cbase + ch, lr), mm = m0 + seg * 8;
                    uint16_t *dst = xs + lr * xsld + seg * 8;
                    for (int e = 0; e < 8; e++) {
                        int valid;
                        if (c->x_fm) {
                            int left = d->m - mm, bytes = rok && left > 0 ? (left >= 8 ? 16 : 2 * left) : 0;
                            valid = 2 * e < bytes;
                        } else {
                            valid = rok && mm + e < d->m;
                        }
                        dst[e] = valid ? d->x[xi(d, k, mm + e)] : 0;
                    }
                }
            int wq = tid / WSEG, wseg = tid % WSEG;
            if (WRP * WSEG == threads || tid < WRP * WSEG)
                for (int p = 0; p < bkk / WRP; p++) {
                    int lr = p * WRP + wq, r = ch * bkk + lr, col = it->wcol + wseg * 8;
                    int bytes = r < it->nrows && col < it->ld ? 16 : 0;
                    for (int e = 0; e < 8; e++)
                        ws[lr * wsld + wseg * 8 + e] = 2 * e < bytes ? d->h->w[it->wofs + (int64_t)r * it->ld + col + e] : 0;
                }
        }
        for (int warp = 0; warp < c->warps; warp++) {
            int wn = warp % WN, wm = warp / WN;
            for (int kk = 0; kk < bkk; kk += 16) {
                static uint16_t af[16][32][4][2], bf[32][32][4][2];
                int addr[32];
                for (int i = 0; i < MI; i++) {
                    for (int L = 0; L < 32; L++)
                        addr[L] = (kk + (L & 7) + ((L >> 4) << 3)) * wsld + wn * WTN + i * 16 + ((L >> 3) & 1) * 8;
                    ldsm_x4_trans(ws, addr, af[i]);
                }
                for (int j = 0; j < NI; j += 2) {
                    for (int L = 0; L < 32; L++)
                        addr[L] = (kk + (L & 7) + ((L >> 3) & 1) * 8) * xsld + wm * WTM + j * 8 + (L >> 4) * 8;
                    ldsm_x4_trans(xs, addr, bf[j / 2]);
                }
                for (int i = 0; i < MI; i++)
                    for (int j = 0; j < NI; j++) {
                        /* Rebuild A (16x16) and B (16x8) from the lanes' registers (PTX ISA layouts). */
                        float A[16][16], B[16][8];
                        for (int L = 0; L < 32; L++) {
                            int g = L >> 2, t = L & 3;
                            for (int e = 0; e < 2; e++) {
                                A[g][2 * t + e] = in16(d, af[i][L][0][e]);
                                A[g + 8][2 * t + e] = in16(d, af[i][L][1][e]);
                                A[g][2 * t + 8 + e] = in16(d, af[i][L][2][e]);
                                A[g + 8][2 * t + 8 + e] = in16(d, af[i][L][3][e]);
                                /* the kernel's b of n8 block j: registers r[0],r[1] or r[2],r[3] of pair j/2 */
                                int base = (j & 1) * 2;
                                B[2 * t + e][g] = in16(d, bf[j / 2][L][base][e]);
                                B[2 * t + 8 + e][g] = in16(d, bf[j / 2][L][base + 1][e]);
                            }
                        }
                        for (int L = 0; L < 32; L++) {
                            int g = L >> 2, t = L & 3;
                            for (int e = 0; e < 4; e++) {
                                int row = g + (e >= 2 ? 8 : 0), col = 2 * t + (e & 1);
                                float s = 0;
                                for (int k = 0; k < 16; k++) s += A[row][k] * B[k][col];
                                ACC(warp, L, i, j, e) += s;
                            }
                        }
                    }
            }
        }
    }
    for (int warp = 0; warp < c->warps; warp++) {
        int wn = warp % WN, wm = warp / WN;
        for (int L = 0; L < 32; L++)
            for (int i = 0; i < MI; i++)
                for (int h2 = 0; h2 < 2; h2++) {
                    int f = wn * WTN + i * 16 + (L >> 2) + h2 * 8;
                    if (f >= it->width) continue;
                    int n = col_of(d, it->fbase + f);
                    for (int j = 0; j < NI; j++) {
                        int m = m0 + wm * WTM + j * 8 + (L & 3) * 2;
                        if (m < d->m) finish(d, n, m, ACC(warp, L, i, j, 2 * h2));
                        if (m + 1 < d->m) finish(d, n, m + 1, ACC(warp, L, i, j, 2 * h2 + 1));
                    }
                }
    }
#undef ACC
    free(ws);
    free(xs);
    free(acc);
}

/* ---- tj_tiles, simt template ---- */

static void tiles_simt(dev *d, const tj_cuda_item *it, int m0)
{
    const tj_cuda_config *c = d->c;
    int threads = 32 * c->warps, FG = threads / c->bm, FPT = c->bn / FG;
    int nch = (it->nrows + c->bk - 1) / c->bk;
    for (int tid = 0; tid < threads; tid++) {
        int tx = tid % c->bm, ty = tid / c->bm;
        int64_t m = m0 + tx;
        int mok = m < d->m;
        float acc[64] = {0};
        for (int ch = 0; ch < nch; ch++)
            for (int rr = 0; rr < c->bk && rr < it->nrows - ch * c->bk; rr++) {
                int k = kept_row(d, it->cbase + ch, rr);
                float xv = mok ? in16(d, d->x[xi(d, k, m)]) : 0.0f;
                const uint16_t *wr = d->h->w + it->wofs + (int64_t)(ch * c->bk + rr) * it->ld + it->wcol;
                for (int f = 0; f < FPT; f++) {
                    int col = ty + f * FG;
                    if (col < it->width) acc[f] = fmaf(in16(d, wr[col]), xv, acc[f]);
                }
            }
        if (!mok) continue;
        for (int f = 0; f < FPT; f++) {
            int col = ty + f * FG;
            if (col < it->width) finish(d, col_of(d, it->fbase + col), m, acc[f]);
        }
    }
}

/* ---- the launch sequence, from tj_cuda_geometry ---- */

static void run_layer(dev *d)
{
    tj_cuda_launch ln[TJ_CUDA_MAX_LAUNCHES];
    int count = 0;
    tj_error err = {0};
    CHECK_OK(tj_cuda_geometry(d->l, d->c, d->m, ln, &count, &err), &err);
    for (int li = 0; li < count; li++) {
        int aux = TJ_CUDA_AUX_THREADS;
        if (strcmp(ln[li].kernel, "tj_tiles") == 0) {
            CHECK((int)ln[li].block[0] == 32 * d->c->warps);
            CHECK(ln[li].smem == (uint32_t)tj_cuda_smem_bytes(d->c));
            int mblocks = (d->m + d->c->bm - 1) / d->c->bm;
            CHECK((int64_t)ln[li].grid[0] == d->bk->nitems * mblocks);
            for (uint32_t b = 0; b < ln[li].grid[0]; b++) {
                const tj_cuda_item *it = &d->bk->items[b / mblocks];
                int m0 = (int)(b % mblocks) * d->c->bm;
                if (d->c->tmpl == TJ_CUDA_TEMPLATE_MMA) tiles_mma(d, it, m0);
                else tiles_simt(d, it, m0);
            }
        } else if (strcmp(ln[li].kernel, "tj_fill") == 0) {
            int mblocks = (d->m + aux - 1) / aux;
            for (uint32_t b = 0; b < ln[li].grid[0]; b++)
                for (int t = 0; t < aux; t++) {
                    int i = (int)(b / mblocks);
                    int64_t m = (int64_t)(b % mblocks) * aux + t;
                    if (i >= d->h->n_fill || m >= d->m) continue;
                    finish(d, d->h->fill_rows[i], m, 0.0f);
                }
        } else {
            int mblocks = (d->m + aux - 1) / aux;
            for (uint32_t b = 0; b < ln[li].grid[0]; b++)
                for (int t = 0; t < aux; t++) {
                    int i = (int)(b / mblocks);
                    int64_t m = (int64_t)(b % mblocks) * aux + t;
                    if (i >= d->h->n_ew_rows || m >= d->m) continue;
                    int n = d->h->ew_rows[i];
                    float v = d->y[yi(d, n, m)];
                    for (int j = d->h->ew_ptr[n]; j < d->h->ew_ptr[n + 1]; j++)
                        v = fmaf(d->h->ew_val[j], in16(d, d->x[xi(d, d->h->ew_idx[j], m)]), v);
                    d->y[yi(d, n, m)] = round_out(d, tj_activate(d->l->act, v));
                }
        }
    }
}

/* ---- cases ---- */

static int g_cases = 0;
static int64_t g_narrow = 0, g_wide = 0; /* unrolled chunks of each form seen */

static void check_case(const tj_random_spec *spec, const char *cfg_json, int m)
{
    tj_error err = {0};
    tj_layer l;
    CHECK_OK(tj_random_layer(spec, "emu", &l, &err), &err);
    tj_cuda_config c = tj_cuda_config_default(&l);
    tj_status st = tj_cuda_config_from_json(cfg_json, &c, &err);
    CHECKF(st == TJ_OK, "%s: %s", cfg_json, err.msg);
    if (st) { tj_layer_free(&l); return; }
    char *src = NULL;
    CHECK_OK(tj_cuda_emit(&l, &c, &src, &err), &err);
    baked bk;
    CHECK(src && parse_baked(src, &bk));
    if (!src) { tj_layer_free(&l); return; }

    /* The baked data equals the emitter's own layout (so the emulation below runs on the text). */
    tj_plan plan;
    tj_cuda_layout lay;
    CHECK_OK(tj_plan_build(&l, TJ_CUDA_PACK_PAD, &plan, &err), &err);
    CHECK_OK(tj_cuda_layout_build(&l, &plan, &c, &lay, &err), &err);
    CHECKF(bk.nitems == lay.nitems, "items %lld vs %lld", (long long)bk.nitems, (long long)lay.nitems);
    CHECKF(bk.nwords == lay.nchunks * lay.words_per_chunk, "words %lld vs %lld", (long long)bk.nwords,
           (long long)(lay.nchunks * lay.words_per_chunk));
    if (bk.nwords == lay.nchunks * lay.words_per_chunk && bk.nbases == lay.nchunks) {
        CHECK(memcmp(bk.words, lay.words, (size_t)bk.nwords * sizeof *bk.words) == 0);
        CHECK(lay.nchunks == 0 || memcmp(bk.bases, lay.bases, (size_t)lay.nchunks * sizeof *lay.bases) == 0);
    }
    for (int64_t ch = 0; ch < lay.nchunks; ch++) {
        g_narrow += lay.bases[ch] != TJ_CUDA_OFS_WIDE;
        g_wide += lay.bases[ch] == TJ_CUDA_OFS_WIDE && c.offsets == TJ_CUDA_OFFSETS_UNROLLED;
    }
    /* Every tile's kept rows decode back, in order, from its chunks. */
    for (int64_t i = 0; i < lay.nitems && bk.nitems == lay.nitems; i++) {
        const tj_cuda_item *it = &bk.items[i];
        int64_t t = lay.items[i].tile;
        CHECK(it->nrows == tj_tile_nrows(&l, t));
        for (int r = 0; r < it->nrows; r++)
            if (tj_cuda_layout_row(&lay, it->cbase + r / c.bk, r % c.bk) != l.tile_rows[l.tile_ptr[t] + r]) {
                CHECKF(0, "tile %lld row %d decodes wrong", (long long)t, r);
                break;
            }
    }
    /* Heaviest first. */
    for (int64_t i = 1; i < lay.nitems; i++) {
        int64_t a = lay.items[i - 1].tile, b = lay.items[i].tile;
        CHECK(tj_tile_nrows(&l, a) * tj_tile_width(&l, a) >= tj_tile_nrows(&l, b) * tj_tile_width(&l, b));
    }
    tj_cuda_layout_free(&lay);
    tj_plan_free(&plan);

    /* Data: weights and inputs exactly representable in the input dtype. */
    tj_rng rng = {spec->seed * 7919 + (uint64_t)m};
    int64_t nk = l.n * l.k;
    uint16_t *w16 = malloc((size_t)nk * 2);
    float *bias = malloc((size_t)l.n * 4), *x32 = malloc((size_t)m * l.k * 4);
    for (int64_t i = 0; i < nk; i++) {
        float v = tj_rng_uniform(&rng);
        w16[i] = c.dtype == TJ_BF16 ? tj_f32_to_bf16(v) : tj_f32_to_f16(v);
    }
    for (int64_t i = 0; i < l.n; i++) bias[i] = tj_rng_uniform(&rng);
    int64_t ldx = c.x_fm ? ((m + 7) / 8 * 8 + 8) : l.k + 3;
    int64_t ldy = c.y_fm ? m + 5 : l.n + 1;
    uint16_t *x = calloc((size_t)(c.x_fm ? l.k * ldx : m * ldx), 2);
    for (int64_t i = 0; i < m; i++)
        for (int64_t k = 0; k < l.k; k++) {
            uint16_t h = c.dtype == TJ_BF16 ? tj_f32_to_bf16(tj_rng_uniform(&rng)) : tj_f32_to_f16(tj_rng_uniform(&rng));
            x[c.x_fm ? k * ldx + i : i * ldx + k] = h;
            x32[i * l.k + k] = c.dtype == TJ_BF16 ? tj_bf16_to_f32(h) : tj_f16_to_f32(h);
        }
    tj_cuda_host_data h;
    CHECK_OK(tj_cuda_pack(&l, &c, w16, c.dtype, bias, TJ_F32, &h, &err), &err);

    /* The argument block a launch would use passes tj_cuda_args_check; broken ones do not. */
    {
        void *ydev = malloc(16);
        tj_cuda_args a = {x, ydev, h.w, h.bias, h.cols, h.fill_rows, h.ew_ptr, h.ew_idx, h.ew_val, h.ew_rows,
                          ldx, ldy, m, (int32_t)h.n_fill, (int32_t)h.n_ew_rows, 0};
        CHECK_OK(tj_cuda_args_check(&l, &c, &a, &err), &err);
        tj_cuda_args bad = a;
        bad.ldx = c.x_fm ? m - 1 : l.k - 1;
        CHECK(tj_cuda_args_check(&l, &c, &bad, &err) == TJ_ERR_INVALID_ARGUMENT);
        bad = a;
        bad.y = (char *)ydev + 1; /* not aligned to any output element */
        CHECK(tj_cuda_args_check(&l, &c, &bad, &err) == TJ_ERR_INVALID_ARGUMENT);
        bad = a;
        bad.n_fill = a.n_fill + 1;
        CHECK(tj_cuda_args_check(&l, &c, &bad, &err) == TJ_ERR_INVALID_ARGUMENT);
        if (c.tmpl == TJ_CUDA_TEMPLATE_MMA && c.x_fm) {
            bad = a;
            bad.ldx = ldx + 4;
            CHECK(tj_cuda_args_check(&l, &c, &bad, &err) == TJ_ERR_INVALID_ARGUMENT && strstr(err.msg, "multiple of 8"));
        }
        free(ydev);
    }

    int64_t ysize = c.y_fm ? l.n * ldy : m * ldy;
    float *y = malloc((size_t)ysize * 4), *ref = malloc((size_t)m * l.n * 4);
    int *writes = calloc((size_t)ysize, sizeof *writes);
    for (int64_t i = 0; i < ysize; i++) y[i] = NAN; /* poison */
    dev d = {&l, &c, &bk, &h, x, ldx, ldy, m, y, writes};
    run_layer(&d);

    tj_layer_weights lw = {w16, c.dtype, bias, TJ_F32};
    tj_reference_linear(&l, &lw, x32, m, ref);
    float *got = malloc((size_t)m * l.n * 4);
    int64_t bad_writes = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t n = 0; n < l.n; n++) {
            got[i * l.n + n] = y[c.y_fm ? n * ldy + i : i * ldy + n];
            bad_writes += writes[c.y_fm ? n * ldy + i : i * ldy + n] != 1;
        }
    double rel = tj_test_relerr(got, ref, m * l.n);
    double tol = c.out == TJ_F32 ? 1e-5 : c.out == TJ_F16 ? 2e-3 : 1e-2;
    CHECKF(tj_test_all_finite(got, m * l.n) && rel < tol, "%lldx%lld g%lld mode%d ew%.2f %s M=%d: rel err %.3g",
           (long long)l.n, (long long)l.k, (long long)l.g, spec->mode, spec->ew_fraction, cfg_json, m, rel);
    CHECKF(bad_writes == 0, "%s M=%d: %lld outputs not written exactly once by tj_tiles + tj_fill", cfg_json, m,
           (long long)bad_writes);
    g_cases++;

    free(got);
    free(writes);
    free(y);
    free(ref);
    tj_cuda_host_data_free(&h);
    free(x);
    free(x32);
    free(bias);
    free(w16);
    baked_free(&bk);
    free(src);
    tj_layer_free(&l);
}

int main(void)
{
    static const char *configs[] = {
        "{}",
        "{\"offsets\":\"unrolled\"}",
        "{\"bm\":64,\"bn\":32,\"bk\":16,\"warps\":2,\"stages\":2,\"out\":\"f16\"}",
        "{\"bm\":16,\"bn\":64,\"bk\":64,\"warps\":4,\"offsets\":\"unrolled\",\"layout\":\"rm\"}",
        "{\"bm\":256,\"bn\":64,\"bk\":32,\"warps\":16,\"dtype\":\"bf16\",\"out\":\"bf16\",\"layout\":\"fm_rm\"}",
        "{\"bm\":32,\"bn\":16,\"warps\":1,\"layout\":\"rm_fm\",\"stages\":4}",
        "{\"template\":\"simt\",\"bm\":32,\"bn\":64,\"warps\":4}",
        "{\"template\":\"simt\",\"bm\":64,\"bn\":16,\"warps\":4,\"offsets\":\"unrolled\",\"layout\":\"rm\",\"dtype\":\"bf16\"}",
    };
    static const tj_random_spec specs[] = {
        {.n = 200, .k = 96, .g = 64, .sparsity = 0.5, .mode = 1, .seed = 1, .act = TJ_ACT_GELU},
        {.n = 130, .k = 70, .g = 32, .sparsity = 0.75, .mode = 2, .seed = 2, .ew_fraction = 0.03, .act = TJ_ACT_RELU},
        {.n = 96, .k = 40, .g = 48, .sparsity = 0.6, .mode = 1, .seed = 3, .ew_fraction = 0.02,
         .empty_tile_fraction = 0.4},
        {.n = 48, .k = 70000, .g = 16, .sparsity = 0.998, .mode = 1, .seed = 4}, /* 32-bit row indices */
        {.n = 64, .k = 2000, .g = 32, .sparsity = 0.87, .mode = 1, .seed = 5}, /* narrow and wide chunks mixed */
    };
    static const int ms[] = {1, 37, 130};
    for (size_t s = 0; s < sizeof specs / sizeof *specs; s++)
        for (size_t c = 0; c < sizeof configs / sizeof *configs; c++)
            for (size_t i = 0; i < sizeof ms / sizeof *ms; i++) {
                if (specs[s].k > 10000 && i == 2) continue; /* keep the big-k case quick */
                check_case(&specs[s], configs[c], ms[i]);
            }
    printf("%d emulated cases; unrolled chunks: %lld narrow, %lld wide\n", g_cases, (long long)g_narrow, (long long)g_wide);
    CHECK(g_narrow > 0 && g_wide > 0);
    return tj_test_end();
}
