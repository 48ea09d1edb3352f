{{BANNER}}
/* ---- prelude.cu: types, conversions, activation, the argument block, the work-item table ---- */
#define TJ_BM {{BM}}            /* tokens per block */
#define TJ_BN {{BN}}            /* output features per block (<= g) */
#define TJ_BK {{BK}}            /* kept rows per pipeline chunk */
#define TJ_STAGES {{STAGES}}
#define TJ_THREADS {{THREADS}}
#define TJ_WARPS_N {{WARPS_N}}  /* warps along features */
#define TJ_WARPS_M {{WARPS_M}}  /* warps along tokens */
#define TJ_IN_BF16 {{IN_BF16}}  /* 0: x and w are fp16, 1: bf16 */
#define TJ_OUT_KIND {{OUT_KIND}} /* 0: fp32, 1: fp16, 2: bf16 */
#define TJ_X_FM {{X_FM}}        /* 1: x is feature-major [K x ldx]; 0: row-major [M x ldx] */
#define TJ_Y_FM {{Y_FM}}        /* 1: y is feature-major [N x ldy]; 0: row-major [M x ldy] */
#define TJ_ACT {{ACT}}          /* 0 none, 1 relu, 2 gelu (exact erf) */
#define TJ_HAS_COLS {{HAS_COLS}}
#define TJ_HAS_EW {{HAS_EW}}
#define TJ_NITEMS {{NITEMS}}
#define TJ_OFS_BITS {{OFS_BITS}} /* bits per kept-row index in a packed 64-bit word */
#define TJ_OFS_PER_WORD (64 / TJ_OFS_BITS)
#define TJ_OFS_WORDS (TJ_BK / TJ_OFS_PER_WORD) /* packed words per chunk */

typedef unsigned short tj_raw16;   /* fp16 or bf16 bits; no cuda_fp16.h needed */

/* Mirrors struct tj_cuda_args of gen/emit_cuda.h byte for byte (one kernel parameter). */
struct tj_args {
    const tj_raw16 *x;
    void *y;
    const tj_raw16 *w;
    const float *bias;
    const int *cols;
    const int *fill_rows;
    const int *ew_ptr;
    const int *ew_idx;
    const float *ew_val;
    const int *ew_rows;
    long long ldx;
    long long ldy;
    int m;
    int n_fill;
    int n_ew_rows;
    int reserved;
};

/* One work item = one block column: BN features of one tile, all its kept rows. */
struct tj_item {
    long long wofs; /* element offset of the tile's packed block */
    int ld;         /* row stride of the packed block (tile width padded to 8) */
    int nrows;      /* kept rows of the tile */
    int fbase;      /* first kept-column index of the item (tile * g + BN * part) */
    int width;      /* valid features in the item (<= BN) */
    int wcol;       /* first column of the item inside the packed block */
    int cbase;      /* first chunk of the tile in the offset stream */
};

/* Packed kept-row indices of one chunk. base == TJ_OFS_WIDE: TJ_BK indices of TJ_OFS_BITS bits,
 * TJ_OFS_PER_WORD per 64-bit word; otherwise (a narrow chunk, unrolled mode only) index r is
 * base + byte r of w[0 .. TJ_BK / 8): half the immediates when the chunk spans < 256 rows. */
#define TJ_OFS_WIDE 0xffffffffu
struct tj_ofs {
    unsigned long long w[TJ_OFS_WORDS];
    unsigned base;
};

/* Each inline PTX statement sits alone in a small helper; under TJ_HOST_EXEC (the host executor,
 * templates/host/cuda_host.h) the helper calls the instruction's host twin instead, with the same
 * operands in the same order, so everything around the instruction is the code that runs. */
static __device__ __forceinline__ float tj_f16_to_f32(tj_raw16 h)
{
#ifdef TJ_HOST_EXEC
    return tj_hx_cvt_f32_f16(h);
#else
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
#endif
}

static __device__ __forceinline__ tj_raw16 tj_cvt_rn_f16(float v)
{
#ifdef TJ_HOST_EXEC
    return tj_hx_cvt_rn_f16_f32(v);
#else
    tj_raw16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    return h;
#endif
}

static __device__ __forceinline__ tj_raw16 tj_cvt_rn_bf16(float v)
{
#ifdef TJ_HOST_EXEC
    return tj_hx_cvt_rn_bf16_f32(v);
#else
    tj_raw16 h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
    return h;
#endif
}

/* cvt.rn.{f16x2,bf16x2}.f32 d, a, b: a goes to the upper half of d, b to the lower half. */
static __device__ __forceinline__ unsigned tj_cvt_rn_f16x2(float hi, float lo)
{
#ifdef TJ_HOST_EXEC
    return tj_hx_cvt_rn_f16x2_f32(hi, lo);
#else
    unsigned u;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(u) : "f"(hi), "f"(lo));
    return u;
#endif
}

static __device__ __forceinline__ unsigned tj_cvt_rn_bf16x2(float hi, float lo)
{
#ifdef TJ_HOST_EXEC
    return tj_hx_cvt_rn_bf16x2_f32(hi, lo);
#else
    unsigned u;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(u) : "f"(hi), "f"(lo));
    return u;
#endif
}

static __device__ __forceinline__ float tj_bf16_to_f32(tj_raw16 h) { return __uint_as_float(((unsigned)h) << 16); }

/* An element of x or w. */
static __device__ __forceinline__ float tj_in_to_f32(tj_raw16 h)
{
#if TJ_IN_BF16
    return tj_bf16_to_f32(h);
#else
    return tj_f16_to_f32(h);
#endif
}

static __device__ __forceinline__ void tj_store_out(void *y, long long i, float v)
{
#if TJ_OUT_KIND == 0
    ((float *)y)[i] = v;
#elif TJ_OUT_KIND == 1
    ((tj_raw16 *)y)[i] = tj_cvt_rn_f16(v);
#else
    ((tj_raw16 *)y)[i] = tj_cvt_rn_bf16(v);
#endif
}

static __device__ __forceinline__ float tj_load_out(const void *y, long long i)
{
#if TJ_OUT_KIND == 0
    return ((const float *)y)[i];
#else
    const tj_raw16 h = ((const tj_raw16 *)y)[i];
    return TJ_OUT_KIND == 1 ? tj_f16_to_f32(h) : tj_bf16_to_f32(h);
#endif
}

static __device__ __forceinline__ float tj_act(float v)
{
#if TJ_ACT == 1
    return v > 0.0f ? v : 0.0f;
#elif TJ_ACT == 2
    return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
#else
    return v;
#endif
}

/* Element (k, m) of the activations. */
static __device__ __forceinline__ long long tj_x_index(const tj_args &a, long long k, long long m)
{
#if TJ_X_FM
    return k * a.ldx + m;
#else
    return m * a.ldx + k;
#endif
}

/* Element (n, m) of the output. */
static __device__ __forceinline__ long long tj_y_index(const tj_args &a, long long n, long long m)
{
#if TJ_Y_FM
    return n * a.ldy + m;
#else
    return m * a.ldy + n;
#endif
}

/* Output feature of kept column j (the scatter to `cols`). */
static __device__ __forceinline__ int tj_col(const tj_args &a, int j)
{
#if TJ_HAS_COLS
    return a.cols[j];
#else
    (void)a;
    return j;
#endif
}

/* Whether feature n's activation is deferred to tj_ew (it has ew entries and an activation). */
static __device__ __forceinline__ bool tj_defer_act(const tj_args &a, int n)
{
#if TJ_HAS_EW && TJ_ACT != 0
    return a.ew_ptr[n + 1] > a.ew_ptr[n];
#else
    (void)a; (void)n;
    return false;
#endif
}

/* Epilogue of one output element: bias, activation (unless deferred), store. */
static __device__ __forceinline__ void tj_finish(const tj_args &a, int n, long long m, float acc)
{
    float v = acc + (a.bias ? a.bias[n] : 0.0f);
    if (!tj_defer_act(a, n)) v = tj_act(v);
    tj_store_out(a.y, tj_y_index(a, n, m), v);
}

/* Two neighbouring tokens m, m + 1 (m even) of feature n: one 8-byte (fp32) or 4-byte (fp16/bf16)
 * store when y is feature-major with an even ldy and y is aligned to the pair; y may be any view
 * aligned to its element (a slice at an odd offset takes the scalar stores: a uniform branch). */
static __device__ __forceinline__ void tj_finish2(const tj_args &a, int n, int m, float acc0, float acc1)
{
#if TJ_Y_FM
    const unsigned long long pair = TJ_OUT_KIND == 0 ? 8ull : 4ull;
    if (m + 1 < a.m && (a.ldy & 1) == 0 && ((unsigned long long)a.y & (pair - 1ull)) == 0) {
        const float b = a.bias ? a.bias[n] : 0.0f;
        float v0 = acc0 + b, v1 = acc1 + b;
        if (!tj_defer_act(a, n)) {
            v0 = tj_act(v0);
            v1 = tj_act(v1);
        }
        const long long i = (long long)n * a.ldy + m;
#if TJ_OUT_KIND == 0
        *(float2 *)((float *)a.y + i) = make_float2(v0, v1);
#else
        /* token m + 1 in the upper half */
        *(unsigned *)((tj_raw16 *)a.y + i) = TJ_OUT_KIND == 1 ? tj_cvt_rn_f16x2(v1, v0) : tj_cvt_rn_bf16x2(v1, v0);
#endif
        return;
    }
#endif
    if (m < a.m) tj_finish(a, n, m, acc0);
    if (m + 1 < a.m) tj_finish(a, n, m + 1, acc1);
}

/* Index k of kept row r (0 <= r < TJ_BK) of a chunk; r may vary per thread. */
static __device__ __forceinline__ int tj_ofs_get(const tj_ofs &o, int r)
{
    if (o.base != TJ_OFS_WIDE) { /* uniform per chunk: no divergence */
        unsigned long long b = o.w[0];
#pragma unroll
        for (int i = 1; i < TJ_BK / 8; ++i)
            if (r / 8 == i) b = o.w[i];
        return (int)(o.base + (unsigned)((b >> ((r % 8) * 8)) & 0xffull));
    }
    unsigned long long w = o.w[0];
#pragma unroll
    for (int i = 1; i < TJ_OFS_WORDS; ++i)
        if (r / TJ_OFS_PER_WORD == i) w = o.w[i];
    return (int)((w >> ((r % TJ_OFS_PER_WORD) * TJ_OFS_BITS)) & ((1ull << TJ_OFS_BITS) - 1ull));
}

/* Shared-memory PTX on 32-bit shared-window addresses: a block computes its base once
 * (tj_smem_base) and every later address is that plus offsets, so no 64-bit generic pointer
 * arithmetic or cvta is left in the main loop. Under TJ_HOST_EXEC (the CPU executor) each
 * helper calls its instruction's host twin with the same operands. */
static __device__ __forceinline__ unsigned tj_smem_base(const void *p)
{
#ifdef TJ_HOST_EXEC
    return tj_hx_cvta_to_shared(p);
#else
    unsigned s;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(s) : "l"(p));
    return s;
#endif
}

/* cp.async.cg 16 bytes global -> shared [dst]; bytes < 16 zero-fills the rest (0: src unread). */
static __device__ __forceinline__ void tj_cp16_s(unsigned dst, const void *src, int bytes)
{
#ifdef TJ_HOST_EXEC
    tj_hx_cp_async_cg_16(dst, src, bytes);
#else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
#endif
}

/* cp.async groups: close this thread's copies issued so far into a group; wait until at most N
 * groups are still in flight. */
static __device__ __forceinline__ void tj_cp_commit()
{
#ifdef TJ_HOST_EXEC
    tj_hx_cp_async_commit_group();
#else
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N> static __device__ __forceinline__ void tj_cp_wait()
{
#ifdef TJ_HOST_EXEC
    tj_hx_cp_async_wait_group(N);
#else
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

/* ldmatrix .x4 .trans from shared [addr] (each lane gives one 16-byte row address). */
static __device__ __forceinline__ void tj_ldsm_x4_t_s(unsigned r[4], unsigned addr)
{
#ifdef TJ_HOST_EXEC
    tj_hx_ldmatrix_x4_trans(r, addr);
#else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
#endif
}

/* ---- generated: work items, heaviest first ---- */
{{ITEMS}}
/* ---- generated: kept-row offsets ({{OFFSET_MODE}}) ---- */
{{OFFSETS}}
