/* The host executor's launch: every block of the grid in turn, each block's threads as fibers
 * scheduled round-robin until they block at a rendezvous (__syncthreads, a .sync.aligned warp
 * collective) or exit; the PTX twins' semantics at those meeting points (hx_ptx.c); and the
 * checks behind every memory access of kernel code (bounds, alignment, shared-memory races by
 * barrier interval, cp.async data in flight, uninitialised shared memory, global write races). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/strbuf.h"
#include "hx_fiber.h"
#include "hx_internal.h"
#include "hx_ptx.h"

#define HX_STACK_BYTES (256 * 1024) /* per thread; AddressSanitizer's frames are large */
#define HX_GUARD_BYTES 4096
#define HX_MAX_THREADS 1024
#define HX_MAX_REPORTS 64           /* distinct (kind, place) reports kept per launch */
#define HX_ERR_REPORTS 3            /* of them in the tj_error */
#define HX_NOBODY 0xffffu
#define HX_MAX_MBAR 32              /* mbarriers per block */
#define HX_MAX_WG (HX_MAX_THREADS / 128)

enum { T_RUN, T_BAR, T_WARP, T_DONE, T_MBAR, T_WG };
enum { OP_LDMATRIX = 1, OP_MMA, OP_WG_FENCE, OP_WG_MMA, OP_WG_COMMIT, OP_WG_WAIT };
enum {
    R_FAULT = 1,     /* ends the launch */
    R_RACE,          /* two threads, one barrier interval, at least one write */
    R_PENDING,       /* shared memory touched while a cp.async to it is in flight */
    R_UNINIT,        /* shared memory read that no thread of the block wrote */
    R_GLOBAL_RACE,   /* two threads of one launch on the same global byte, one writing */
    R_BARRIER_SITE,  /* threads of one barrier at different __syncthreads */
    R_MBAR,          /* bulk-copy data read by a thread that has not waited for its mbarrier phase */
    R_PROXY,         /* wgmma reads generic-proxy writes that no fence.proxy.async ordered */
    R_WGMMA,         /* wgmma protocol: results never waited for, mma_async without wgmma.fence */
};

typedef struct hx_bulk { /* one cp.async.bulk landing when its mbarrier phase completes */
    uint32_t dst, n, at; /* shared offset, bytes, offset of the data in the barrier's arena */
    uint16_t tid;
    uint32_t pc;
} hx_bulk;

typedef struct hx_mbar {
    uint32_t off;
    int used;
    uint32_t count, pending; /* arrivals per phase, still missing in the current one */
    int64_t tx;              /* transaction bytes of the current phase (expect_tx up, complete_tx down) */
    uint32_t phase;          /* completed phases */
    int init_tid;            /* the thread that initialised it, and its fence.proxy.async count then */
    uint32_t init_fseq;
    hx_bulk *bulk;
    int nbulk, bulkcap;
    uint8_t *data;
    size_t ndata, datacap;
} hx_mbar;

typedef struct hx_wg { /* a warpgroup's rendezvous at wgmma.* */
    int arrived, op, fenced;
    uintptr_t pc;
    uint32_t committed; /* commit_group count: the open group has this number */
    uint32_t done;      /* groups below this number are complete (the last wait_group said so) */
} hx_wg;

typedef struct hx_cp { /* one cp.async in flight */
    uint32_t off, group;
    uint8_t n, data[16];
    uintptr_t pc;
} hx_cp;

typedef struct hx_thread {
    tj_hx_fiber fb;
    struct tj_hx_exec *e;
    int tid, lane, warp, state;
    uintptr_t stack_lo, stack_hi;
    hx_cp *cp;
    int ncp, cpcap, cphead;
    uint32_t committed; /* cp.async groups committed so far; the open group has this number */
    /* operands of the warp collective this thread waits in */
    unsigned *ld_out;
    unsigned ld_addr;
    int ld_num, ld_trans;
    float *mma_d;
    const unsigned *mma_a, *mma_b;
    /* Hopper state */
    uint32_t fences;                /* fence.proxy.async executed */
    uint32_t mb_seen[HX_MAX_MBAR];  /* phases of each mbarrier this thread has seen complete */
    int mb_wait;                    /* the mbarrier a T_MBAR thread waits on */
    float *wg_d;                    /* operands of the wgmma.mma_async it waits in */
    int wg_n, wg_scale, wg_bf16, wg_ta, wg_tb, wg_waitn;
    uint64_t wg_da, wg_db;
    float wg_acc[128];              /* results in flight: land in *wg_acc_ptr at wgmma.wait_group */
    float *wg_acc_ptr;
    uint32_t wg_acc_group;
    int wg_acc_pending;
} hx_thread;

typedef struct hx_warp {
    int arrived, nlanes, ndone, nbar, op, bf16;
    uintptr_t pc;
} hx_warp;

/* Shadow of one shared-memory byte. Epochs count barrier intervals from 1 at block start; 0:
 * never. pcs are offsets into the module image. */
typedef struct hx_sbyte {
    uint32_t w_epoch, r_epoch;
    uint32_t w_pc, r_pc, p_pc;
    uint16_t w_tid, r_tid, p_tid;
    uint8_t r_multi, pend;
    uint8_t mb;        /* 1 + the mbarrier whose phase landed this byte (a bulk copy); 0: a generic write */
    uint32_t mb_phase; /* that phase, counted from 1 */
    uint32_t w_fseq;   /* the writer's fence.proxy.async count at the write */
    uint8_t wg_rd;     /* 1 + the warpgroup whose wgmma read this byte last; 0: none */
    uint32_t wg_group; /* that wgmma's group: the read lasts until a wait_group completes it */
} hx_sbyte;

/* Shadow of one byte of a writable global buffer: the last writer within the current launch. */
typedef struct hx_gbyte {
    uint32_t launch, block, pc;
    uint16_t tid;
} hx_gbyte;

typedef struct hx_buffer {
    char name[32];
    uintptr_t lo, hi;
    int writable;
    hx_gbyte *shadow;
} hx_buffer;

typedef struct hx_report {
    int kind;
    uintptr_t pc[2];
    int npc;
    int64_t count;
    char *msg;
} hx_report;

struct tj_hx_exec {
    tj_hx_api api;
    hx_buffer *buf;
    int nbuf, bufcap;
    const char *const *origin_names;
    const char *const *origin_texts;
    int norigins;
    char *stacks;
    size_t stacks_bytes;
    int nstacks;
    hx_thread *threads;
    hx_warp *warps;
    hx_sbyte *shadow;
    tj_hx_fiber sched;
    /* the launch */
    tj_hx_module *m;
    const char *kernel;
    void (*fn)(void);
    tj_hx_invoke invoke;
    const void *params;
    tj_hx_dim3 grid, block, bidx;
    unsigned smem_bytes;
    uint32_t launch_seq, block_linear, epoch;
    int nthreads, ndone, bar_arrived, abort;
    uintptr_t bar_pc;
    hx_thread *cur;
    hx_mbar mbar[HX_MAX_MBAR];
    hx_wg wg[HX_MAX_WG];
    tj_hx_launch_stats stats;
    hx_report rep[HX_MAX_REPORTS];
    int nrep;
    int64_t nrep_total;
    tj_strbuf text;
};

/* ---- reports ---- */

static uint32_t pc_off(const tj_hx_exec *e, const void *pc) { return (uint32_t)((uintptr_t)pc - e->m->image_lo); }

/* tid: the thread the report is about (-1: the running one). */
static void vreport(tj_hx_exec *e, int kind, int tid, const void *pc0, const void *pc1, const char *fmt, va_list ap)
{
    e->nrep_total++;
    for (int i = 0; i < e->nrep; i++)
        if (e->rep[i].kind == kind && e->rep[i].pc[0] == (uintptr_t)pc0) {
            e->rep[i].count++;
            return;
        }
    if (e->nrep == HX_MAX_REPORTS) return;
    hx_report *r = &e->rep[e->nrep++];
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->count = 1;
    r->pc[0] = (uintptr_t)pc0;
    r->pc[1] = (uintptr_t)pc1;
    r->npc = pc0 ? (pc1 ? 2 : 1) : 0;
    char body[512], head[160];
    vsnprintf(body, sizeof body, fmt, ap);
    const hx_thread *t = tid >= 0 ? &e->threads[tid] : e->cur;
    if (t)
        snprintf(head, sizeof head, "%s block (%u,%u,%u) thread %d (warp %d lane %d): ", e->kernel, e->bidx.x, e->bidx.y,
                 e->bidx.z, t->tid, t->warp, t->lane);
    else
        snprintf(head, sizeof head, "%s block (%u,%u,%u): ", e->kernel, e->bidx.x, e->bidx.y, e->bidx.z);
    size_t n = strlen(head) + strlen(body) + 1;
    r->msg = malloc(n);
    if (r->msg) snprintf(r->msg, n, "%s%s", head, body);
}

static void report_by(tj_hx_exec *e, int kind, int tid, const void *pc0, const void *pc1, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static void report_by(tj_hx_exec *e, int kind, int tid, const void *pc0, const void *pc1, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vreport(e, kind, tid, pc0, pc1, fmt, ap);
    va_end(ap);
}
#define report(e, kind, ...) report_by(e, kind, -1, __VA_ARGS__)
/* A fault: reported, and the launch ends here (the thread is abandoned, never resumed). */
static void fault(tj_hx_exec *e, const void *pc0, const void *pc1, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void fault(tj_hx_exec *e, const void *pc0, const void *pc1, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vreport(e, R_FAULT, -1, pc0, pc1, fmt, ap);
    va_end(ap);
    e->abort = 1;
    hx_thread *t = e->cur;
    if (t) tj_hx_fiber_switch(&t->fb, &e->sched, 1);
}

static const void *image_pc(const tj_hx_exec *e, uint32_t off) { return (const void *)(e->m->image_lo + off); }

/* ---- shared memory ---- */

/* One access of thread `tid` to shared bytes [off, off + n) (n > 0, in bounds). */
static void shared_touch(tj_hx_exec *e, int tid, uint32_t off, size_t n, int kind, const void *pc)
{
    int told = 0;
    for (size_t i = 0; i < n; i++) {
        hx_sbyte *s = &e->shadow[off + i];
        uint32_t b = off + (uint32_t)i;
        if (kind == TJ_HX_READ) {
            if (!told) {
                told = 1;
                if (s->pend)
                    report_by(e, R_PENDING, tid, pc, image_pc(e, s->p_pc),
                           "reads shared byte %u while thread %u's cp.async to it is in flight (no cp.async.wait_group "
                           "or mbarrier phase covered it yet)", b, s->p_tid);
                else if (s->mb && e->threads[tid].mb_seen[s->mb - 1] < s->mb_phase)
                    report_by(e, R_MBAR, tid, pc, image_pc(e, s->w_pc),
                              "reads shared byte %u landed by a bulk copy that completed phase %u of the mbarrier at "
                              "shared %u, which this thread has not waited for (it saw %u phases)",
                              b, s->mb_phase, e->mbar[s->mb - 1].off, e->threads[tid].mb_seen[s->mb - 1]);
                else if (s->mb)
                    told = 0; /* ordered by the mbarrier wait, whatever the barrier interval */
                else if (!s->w_epoch)
                    report_by(e, R_UNINIT, tid, pc, NULL, "reads shared byte %u that no thread of the block wrote", b);
                else if (s->w_epoch == e->epoch && s->w_tid != tid)
                    report_by(e, R_RACE, tid, pc, image_pc(e, s->w_pc),
                           "race: reads shared byte %u written by thread %u in the same barrier interval", b, s->w_tid);
                else
                    told = 0;
            }
            if (s->r_epoch != e->epoch) {
                s->r_epoch = e->epoch;
                s->r_tid = (uint16_t)tid;
                s->r_multi = 0;
                s->r_pc = pc_off(e, pc);
            } else if (s->r_tid != tid) {
                s->r_multi = 1;
            }
        } else {
            if (!told) {
                told = 1;
                if (s->pend)
                    report_by(e, R_PENDING, tid, pc, image_pc(e, s->p_pc),
                           "writes shared byte %u while thread %u's cp.async to it is in flight", b, s->p_tid);
                else if (s->w_epoch == e->epoch && s->w_tid != tid)
                    report_by(e, R_RACE, tid, pc, image_pc(e, s->w_pc),
                           "race: writes shared byte %u written by thread %u in the same barrier interval", b, s->w_tid);
                else if (s->r_epoch == e->epoch && (s->r_multi || s->r_tid != tid))
                    report_by(e, R_RACE, tid, pc, image_pc(e, s->r_pc),
                           "race: writes shared byte %u read by thread %u in the same barrier interval", b,
                           s->r_tid != tid ? s->r_tid : HX_NOBODY);
                else if (s->wg_rd && e->wg[s->wg_rd - 1].done <= s->wg_group)
                    report_by(e, R_WGMMA, tid, pc, image_pc(e, s->r_pc),
                              "writes shared byte %u that warpgroup %d's wgmma (group %u) may still be reading: no "
                              "wgmma.wait_group completed that group", b, s->wg_rd - 1, s->wg_group);
                else
                    told = 0;
            }
            s->w_epoch = e->epoch;
            s->w_tid = (uint16_t)tid;
            s->w_pc = pc_off(e, pc);
            s->mb = 0;
            s->w_fseq = e->threads[tid].fences;
        }
    }
}

static void shared_bounds(tj_hx_exec *e, uint32_t off, size_t n, const char *what, const void *pc)
{
    if ((uint64_t)off + n > e->smem_bytes)
        fault(e, pc, NULL, "%s of %zu bytes at shared offset %u is outside the launch's %u bytes of shared memory", what,
              n, off, e->smem_bytes);
}

/* ---- global memory ---- */

static hx_buffer *buffer_of(tj_hx_exec *e, uintptr_t a, size_t n)
{
    for (int i = 0; i < e->nbuf; i++)
        if (a >= e->buf[i].lo && a + n <= e->buf[i].hi) return &e->buf[i];
    return NULL;
}

static void out_of_bounds(tj_hx_exec *e, uintptr_t a, size_t n, int kind, const void *pc)
{
    for (int i = 0; i < e->nthreads; i++)
        if (a >= e->threads[i].stack_lo && a < e->threads[i].stack_hi)
            fault(e, pc, NULL, "%s the local memory of thread %d", kind == TJ_HX_READ ? "reads" : "writes", i);
    /* name the nearest buffer */
    const hx_buffer *best = NULL;
    uintptr_t bd = UINTPTR_MAX;
    for (int i = 0; i < e->nbuf; i++) {
        const hx_buffer *b = &e->buf[i];
        uintptr_t d = a < b->lo ? b->lo - a : a >= b->hi ? a - b->hi + 1 : 0;
        if (a < b->hi && a + n > b->hi) d = 0;
        if (d < bd) {
            bd = d;
            best = b;
        }
    }
    if (best && bd < ((uintptr_t)1 << 20)) {
        long long rel = (long long)(a - best->lo);
        fault(e, pc, NULL, "out-of-bounds global %s of %zu bytes at byte %lld of '%s' (%lld bytes long)",
              kind == TJ_HX_READ ? "read" : "write", n, rel, best->name, (long long)(best->hi - best->lo));
    }
    fault(e, pc, NULL, "global %s of %zu bytes at %p: no buffer of the launch holds it",
          kind == TJ_HX_READ ? "read" : "write", n, (void *)a);
}

static void global_touch(tj_hx_exec *e, uintptr_t a, size_t n, int kind, const void *pc)
{
    hx_buffer *b = buffer_of(e, a, n);
    if (!b) {
        out_of_bounds(e, a, n, kind, pc);
        return;
    }
    if (kind == TJ_HX_WRITE && !b->writable)
        fault(e, pc, NULL, "writes %zu bytes into read-only buffer '%s' (byte %lld)", n, b->name, (long long)(a - b->lo));
    if (!b->shadow) return;
    int tid = e->cur->tid;
    for (size_t i = 0; i < n; i++) {
        hx_gbyte *g = &b->shadow[a - b->lo + i];
        int other = g->launch == e->launch_seq && (g->block != e->block_linear || g->tid != tid);
        if (other) {
            report(e, R_GLOBAL_RACE, pc, image_pc(e, g->pc),
                   "race: %s byte %lld of '%s', written in this launch by block %u thread %u",
                   kind == TJ_HX_READ ? "reads" : "writes", (long long)(a - b->lo + i), b->name, g->block, g->tid);
            break;
        }
        if (kind == TJ_HX_WRITE) {
            g->launch = e->launch_seq;
            g->block = e->block_linear;
            g->tid = (uint16_t)tid;
            g->pc = pc_off(e, pc);
        }
    }
}

/* ---- the hooks behind every access of kernel code ---- */

static int in_image(const tj_hx_exec *e, uintptr_t a) { return a >= e->m->image_lo && a < e->m->image_hi; }
static int in_smem_window(const tj_hx_exec *e, uintptr_t a)
{
    return a >= (uintptr_t)e->m->smem && a < (uintptr_t)e->m->smem + HX_SMEM_CAPACITY;
}

static void touch(tj_hx_exec *e, uintptr_t a, size_t n, int kind, int aligned, const void *pc)
{
    hx_thread *t = e->cur;
    if (!t || n == 0) return;
    if (a >= t->stack_lo && a + n <= t->stack_hi) return; /* the thread's local memory */
    if (aligned && (n == 2 || n == 4 || n == 8 || n == 16) && a % n)
        fault(e, pc, NULL, "misaligned %zu-byte %s at %p (the GPU needs %zu-byte alignment)", n,
              kind == TJ_HX_READ ? "load" : "store", (void *)a, n);
    if (in_smem_window(e, a)) {
        uint32_t off = (uint32_t)(a - (uintptr_t)e->m->smem);
        shared_bounds(e, off, n, kind == TJ_HX_READ ? "a load" : "a store", pc);
        shared_touch(e, t->tid, off, n, kind, pc);
        return;
    }
    if (in_image(e, a)) {
        if (kind == TJ_HX_WRITE) fault(e, pc, NULL, "writes the module's constant memory at %p", (void *)a);
        return;
    }
    global_touch(e, a, n, kind, pc);
}

static void hx_access(void *ctx, const void *addr, size_t size, int kind, const void *pc)
{
    tj_hx_exec *e = ctx;
    e->stats.accesses++;
    touch(e, (uintptr_t)addr, size, kind, 1, pc);
}

static void hx_copy(void *ctx, void *dst, const void *src, size_t n, const void *pc)
{
    tj_hx_exec *e = ctx;
    touch(e, (uintptr_t)src, n, TJ_HX_READ, 0, pc);
    touch(e, (uintptr_t)dst, n, TJ_HX_WRITE, 0, pc);
    memmove(dst, src, n);
}

static void hx_fill(void *ctx, void *dst, int c, size_t n, const void *pc)
{
    tj_hx_exec *e = ctx;
    touch(e, (uintptr_t)dst, n, TJ_HX_WRITE, 0, pc);
    memset(dst, c, n);
}

/* ---- rendezvous ---- */

static void yield(tj_hx_exec *e, hx_thread *t)
{
    e->stats.switches++;
    tj_hx_fiber_switch(&t->fb, &e->sched, 0);
}

static const char *op_name(int op) { return op == OP_LDMATRIX ? "ldmatrix" : op == OP_MMA ? "mma.sync" : "?"; }

static void run_ldmatrix(tj_hx_exec *e, hx_warp *w, int warp)
{
    hx_thread *lanes = &e->threads[warp * 32];
    int num = lanes[0].ld_num, trans = lanes[0].ld_trans;
    uint16_t rows[4][8][8];
    memset(rows, 0, sizeof rows);
    for (int j = 0; j < num; j++)
        for (int i = 0; i < 8; i++) {
            hx_thread *src = &lanes[8 * j + i];
            uint32_t a = src->ld_addr;
            if (a % 16)
                fault(e, (void *)w->pc, NULL, "ldmatrix: lane %d's row address %u (matrix %d row %d) is not 16-byte aligned",
                      8 * j + i, a, j, i);
            shared_bounds(e, a, 16, "ldmatrix row", (void *)w->pc);
            shared_touch(e, src->tid, a, 16, TJ_HX_READ, (void *)w->pc);
            memcpy(rows[j][i], e->m->smem + a, 16);
        }
    uint32_t out[32][4];
    tj_hx_ptx_ldmatrix(rows, num, trans, out);
    for (int l = 0; l < w->nlanes; l++)
        for (int j = 0; j < num; j++) lanes[l].ld_out[j] = out[l][j];
}

static void run_mma(tj_hx_exec *e, hx_warp *w, int warp)
{
    hx_thread *lanes = &e->threads[warp * 32];
    uint32_t a[32][4], b[32][2];
    float cd[32][4];
    for (int l = 0; l < 32; l++) {
        memcpy(a[l], lanes[l].mma_a, sizeof a[l]);
        memcpy(b[l], lanes[l].mma_b, sizeof b[l]);
        memcpy(cd[l], lanes[l].mma_d, sizeof cd[l]);
    }
    tj_hx_ptx_mma_m16n8k16(a, b, cd, w->bf16);
    for (int l = 0; l < 32; l++) memcpy(lanes[l].mma_d, cd[l], sizeof cd[l]);
}

/* A .sync.aligned instruction: every lane of the warp must reach the same one (same pc). */
static void warp_collective(tj_hx_exec *e, hx_thread *t, int op, const void *pc, int bf16)
{
    hx_warp *w = &e->warps[t->warp];
    if (w->nlanes != 32)
        fault(e, pc, NULL, "%s needs a full warp; warp %d has %d threads", op_name(op), t->warp, w->nlanes);
    if (w->ndone)
        fault(e, pc, NULL, "%s reached after %d lane(s) of warp %d exited (a .sync.aligned instruction needs all 32)",
              op_name(op), w->ndone, t->warp);
    if (w->nbar)
        fault(e, pc, (void *)e->bar_pc, "%s reached while %d lane(s) of warp %d wait at __syncthreads", op_name(op),
              w->nbar, t->warp);
    if (w->arrived == 0) {
        w->op = op;
        w->pc = (uintptr_t)pc;
        w->bf16 = bf16;
    } else if (w->op != op || w->pc != (uintptr_t)pc) {
        fault(e, pc, (void *)w->pc, "warp divergence at a .sync.aligned instruction: this lane reached %s while %d lane(s) "
              "wait at %s (second location)", op_name(op), w->arrived, op_name(w->op));
    }
    t->state = T_WARP;
    if (++w->arrived < w->nlanes) {
        yield(e, t);
        return;
    }
    if (op == OP_LDMATRIX) run_ldmatrix(e, w, t->warp);
    else run_mma(e, w, t->warp);
    e->stats.collectives++;
    w->arrived = 0;
    for (int l = 0; l < 32; l++) e->threads[t->warp * 32 + l].state = T_RUN;
}

static void hx_bar_sync(void *ctx, const void *pc)
{
    tj_hx_exec *e = ctx;
    hx_thread *t = e->cur;
    hx_warp *w = &e->warps[t->warp];
    if (w->arrived)
        fault(e, pc, (void *)w->pc, "__syncthreads reached while %d lane(s) of warp %d wait at %s (second location): "
              "deadlock", w->arrived, t->warp, op_name(w->op));
    if (e->ndone)
        fault(e, pc, NULL, "__syncthreads reached after %d thread(s) of the block exited: they never arrive", e->ndone);
    if (e->bar_arrived == 0) e->bar_pc = (uintptr_t)pc;
    else if (e->bar_pc != (uintptr_t)pc)
        report(e, R_BARRIER_SITE, pc, (void *)e->bar_pc,
               "threads of one barrier wait at different __syncthreads (other: second location)");
    t->state = T_BAR;
    w->nbar++;
    if (++e->bar_arrived < e->nthreads) {
        yield(e, t);
        return;
    }
    e->epoch++;
    e->stats.barriers++;
    e->bar_arrived = 0;
    for (int i = 0; i < e->nthreads; i++) e->threads[i].state = T_RUN;
    for (int i = 0; i < (e->nthreads + 31) / 32; i++) e->warps[i].nbar = 0;
}

static void hx_ldmatrix(void *ctx, unsigned *r, int num, int trans, unsigned addr, const void *pc)
{
    tj_hx_exec *e = ctx;
    hx_thread *t = e->cur;
    if (num != 1 && num != 2 && num != 4) fault(e, pc, NULL, "ldmatrix: .x%d does not exist", num);
    t->ld_out = r;
    t->ld_addr = addr;
    t->ld_num = num;
    t->ld_trans = trans;
    warp_collective(e, t, OP_LDMATRIX, pc, 0);
}

static void hx_mma(void *ctx, float d[4], const unsigned a[4], const unsigned b[2], int bf16, const void *pc)
{
    tj_hx_exec *e = ctx;
    hx_thread *t = e->cur;
    t->mma_d = d;
    t->mma_a = a;
    t->mma_b = b;
    warp_collective(e, t, OP_MMA, pc, bf16);
}

/* ---- cp.async ---- */

static void async_dst_claim(tj_hx_exec *e, hx_thread *t, uint32_t dst, uint32_t n, const char *what, const void *pc);

static unsigned hx_cvta_to_shared(void *ctx, const void *p, const void *pc)
{
    tj_hx_exec *e = ctx;
    if (!in_smem_window(e, (uintptr_t)p))
        fault(e, pc, NULL, "cvta.to.shared of %p, which is not a shared-memory address", p);
    return (unsigned)((uintptr_t)p - (uintptr_t)e->m->smem);
}

static void hx_cp_async(void *ctx, unsigned dst, const void *src, int cp_size, int src_size, const void *pc)
{
    tj_hx_exec *e = ctx;
    hx_thread *t = e->cur;
    if (cp_size != 4 && cp_size != 8 && cp_size != 16) fault(e, pc, NULL, "cp.async: cp-size %d is not 4, 8 or 16", cp_size);
    if (src_size < 0 || src_size > cp_size)
        fault(e, pc, NULL, "cp.async: src-size %d outside [0, cp-size %d]", src_size, cp_size);
    if (dst % (unsigned)cp_size || (uintptr_t)src % (uintptr_t)cp_size)
        fault(e, pc, NULL, "cp.async: shared %u or global %p is not %d-byte aligned", dst, src, cp_size);
    shared_bounds(e, dst, (size_t)cp_size, "cp.async destination", pc);
    uintptr_t s = (uintptr_t)src;
    if (src_size > 0) {
        if (in_smem_window(e, s) || (s >= t->stack_lo && s < t->stack_hi))
            fault(e, pc, NULL, "cp.async source %p is not global memory", src);
        if (!in_image(e, s)) global_touch(e, s, (size_t)src_size, TJ_HX_READ, pc);
    }
    /* The write may land any time until the wait: it conflicts with what others did in this interval. */
    async_dst_claim(e, t, dst, (uint32_t)cp_size, "cp.async", pc);
    if (t->ncp == t->cpcap) {
        int cap = t->cpcap ? 2 * t->cpcap : 64;
        hx_cp *n = realloc(t->cp, (size_t)cap * sizeof *n);
        if (!n) fault(e, pc, NULL, "host executor: out of memory for cp.async");
        t->cp = n;
        t->cpcap = cap;
    }
    hx_cp *c = &t->cp[t->ncp++];
    c->off = dst;
    c->group = t->committed;
    c->n = (uint8_t)cp_size;
    c->pc = (uintptr_t)pc;
    memset(c->data, 0, sizeof c->data);
    if (src_size > 0) memcpy(c->data, src, (size_t)src_size); /* the zero fill: src-size < cp-size */
}

static void hx_cp_commit(void *ctx, const void *pc)
{
    (void)pc;
    tj_hx_exec *e = ctx;
    e->cur->committed++;
}

/* cp.async.wait_group n: all but the n most recent committed groups are complete; their data
 * lands now, as writes by this thread in the current barrier interval. */
static void hx_cp_wait(void *ctx, int n, const void *pc)
{
    tj_hx_exec *e = ctx;
    hx_thread *t = e->cur;
    if (n < 0) fault(e, pc, NULL, "cp.async.wait_group %d", n);
    uint32_t done = t->committed >= (uint32_t)n ? t->committed - (uint32_t)n : 0;
    while (t->cphead < t->ncp && t->cp[t->cphead].group < done) {
        hx_cp *c = &t->cp[t->cphead++];
        memcpy(e->m->smem + c->off, c->data, c->n);
        for (int i = 0; i < c->n; i++) {
            hx_sbyte *sb = &e->shadow[c->off + (unsigned)i];
            sb->pend--;
            if (!sb->pend) sb->p_tid = HX_NOBODY;
        }
        /* landing = a write now: readers of this interval raced with it */
        shared_touch(e, t->tid, c->off, c->n, TJ_HX_WRITE, (void *)c->pc);
    }
    if (t->cphead == t->ncp) t->cphead = t->ncp = 0;
}

/* ---- mbarriers and bulk copies (sm_90) ----
 * An mbarrier is an object at a shared offset: arrivals expected per phase, a transaction count,
 * and the number of completed phases. A phase completes when its last arrival has come and its
 * transaction count is back to 0; the bulk copies that completed bytes on it land only then
 * (their bytes are in flight until that moment), and a thread may read them only once it has
 * seen that phase complete through try_wait.parity. */

static hx_mbar *mbar_find(tj_hx_exec *e, unsigned off, const char *what, const void *pc)
{
    for (int i = 0; i < HX_MAX_MBAR; i++)
        if (e->mbar[i].used && e->mbar[i].off == off) return &e->mbar[i];
    fault(e, pc, NULL, "%s on shared %u, which holds no initialised mbarrier", what, off);
    return NULL;
}

static void mbar_complete_if_done(tj_hx_exec *e, hx_mbar *b)
{
    if (b->pending || b->tx) return;
    int idx = (int)(b - e->mbar);
    for (int i = 0; i < b->nbulk; i++) {
        hx_bulk *c = &b->bulk[i];
        memcpy(e->m->smem + c->dst, b->data + c->at, c->n);
        for (uint32_t k = 0; k < c->n; k++) {
            hx_sbyte *sb = &e->shadow[c->dst + k];
            sb->pend--;
            if (!sb->pend) sb->p_tid = HX_NOBODY;
            sb->w_epoch = e->epoch;
            sb->w_tid = c->tid;
            sb->w_pc = c->pc;
            sb->mb = (uint8_t)(idx + 1);
            sb->mb_phase = b->phase + 1;
        }
    }
    b->nbulk = 0;
    b->ndata = 0;
    b->phase++;
    b->pending = b->count;
    for (int i = 0; i < e->nthreads; i++) {
        hx_thread *t = &e->threads[i];
        if (t->state == T_MBAR && t->mb_wait == idx) {
            t->state = T_RUN;
            t->mb_seen[idx] = b->phase;
        }
    }
}

static void hx_mbar_init(void *ctx, unsigned bar, unsigned count, const void *pc)
{
    tj_hx_exec *e = ctx;
    if (bar % 8) fault(e, pc, NULL, "mbarrier.init: shared %u is not 8-byte aligned", bar);
    shared_bounds(e, bar, 8, "mbarrier", pc);
    if (count < 1 || count > (1u << 20) - 1) fault(e, pc, NULL, "mbarrier.init: count %u outside [1, 2^20 - 1]", count);
    hx_mbar *b = NULL;
    for (int i = 0; i < HX_MAX_MBAR && !b; i++)
        if (e->mbar[i].used && e->mbar[i].off == bar) b = &e->mbar[i];
    for (int i = 0; i < HX_MAX_MBAR && !b; i++)
        if (!e->mbar[i].used) b = &e->mbar[i];
    if (!b) fault(e, pc, NULL, "more than %d mbarriers in one block (the executor's limit)", HX_MAX_MBAR);
    if (b->nbulk) fault(e, pc, NULL, "mbarrier.init on shared %u while bulk copies on it are in flight", bar);
    b->used = 1;
    b->off = bar;
    b->count = b->pending = count;
    b->tx = 0;
    b->phase = 0;
    b->init_tid = e->cur->tid;
    b->init_fseq = e->cur->fences;
    for (int i = 0; i < e->nthreads; i++) e->threads[i].mb_seen[b - e->mbar] = 0;
}

static void hx_mbar_arrive(void *ctx, unsigned bar, unsigned tx, const void *pc)
{
    tj_hx_exec *e = ctx;
    hx_mbar *b = mbar_find(e, bar, "mbarrier.arrive", pc);
    if (!b->pending)
        fault(e, pc, NULL, "mbarrier.arrive on shared %u: phase %u already has its %u arrivals", bar, b->phase, b->count);
    b->tx += tx;
    b->pending--;
    mbar_complete_if_done(e, b);
}

static int hx_mbar_try_wait(void *ctx, unsigned bar, unsigned parity, const void *pc)
{
    tj_hx_exec *e = ctx;
    hx_thread *t = e->cur;
    hx_mbar *b = mbar_find(e, bar, "mbarrier.try_wait.parity", pc);
    int idx = (int)(b - e->mbar);
    if (parity > 1) fault(e, pc, NULL, "mbarrier.try_wait.parity: parity %u is not 0 or 1", parity);
    /* The current phase (number b->phase) is incomplete; the one of the other parity before it is
     * complete (for phase 0, as the ISA has it, too: a wrong parity passes at once). */
    if ((b->phase & 1u) != parity) {
        if (t->mb_seen[idx] < b->phase) t->mb_seen[idx] = b->phase;
        return 1;
    }
    t->state = T_MBAR;
    t->mb_wait = idx;
    yield(e, t);
    return 1;
}

/* A write of [dst, dst + n) by the async unit on behalf of the running thread, landing later:
 * it conflicts with what other threads did to those bytes in this barrier interval and with
 * copies still in flight; the bytes are in flight from now on. */
static void async_dst_claim(tj_hx_exec *e, hx_thread *t, uint32_t dst, uint32_t n, const char *what, const void *pc)
{
    for (uint32_t i = 0; i < n; i++) {
        hx_sbyte *sb = &e->shadow[dst + i];
        if (sb->pend) {
            report(e, R_PENDING, pc, image_pc(e, sb->p_pc),
                   "%s to shared byte %u while thread %u's earlier copy to it is in flight", what, dst + i, sb->p_tid);
            break;
        }
        if (sb->w_epoch == e->epoch && sb->w_tid != t->tid && !sb->mb) {
            report(e, R_RACE, pc, image_pc(e, sb->w_pc),
                   "race: %s to shared byte %u written by thread %u in the same barrier interval", what, dst + i, sb->w_tid);
            break;
        }
        if (sb->r_epoch == e->epoch && (sb->r_multi || sb->r_tid != t->tid)) {
            report(e, R_RACE, pc, image_pc(e, sb->r_pc),
                   "race: %s to shared byte %u read by another thread in the same barrier interval (a "
                   "__syncthreads between their reads and this refill is missing)", what, dst + i);
            break;
        }
        if (sb->wg_rd && e->wg[sb->wg_rd - 1].done <= sb->wg_group) {
            report(e, R_WGMMA, pc, image_pc(e, sb->r_pc),
                   "%s to shared byte %u that warpgroup %d's wgmma (group %u) may still be reading: no "
                   "wgmma.wait_group completed that group", what, dst + i, sb->wg_rd - 1, sb->wg_group);
            break;
        }
    }
    for (uint32_t i = 0; i < n; i++) {
        hx_sbyte *sb = &e->shadow[dst + i];
        sb->pend++;
        sb->p_tid = (uint16_t)t->tid;
        sb->p_pc = pc_off(e, pc);
    }
}

static void hx_cp_bulk(void *ctx, unsigned dst, const void *src, unsigned size, unsigned bar, const void *pc)
{
    tj_hx_exec *e = ctx;
    hx_thread *t = e->cur;
    if (size == 0 || size % 16) fault(e, pc, NULL, "cp.async.bulk: size %u is not a positive multiple of 16", size);
    if (dst % 16 || (uintptr_t)src % 16)
        fault(e, pc, NULL, "cp.async.bulk: shared %u or global %p is not 16-byte aligned", dst, src);
    shared_bounds(e, dst, size, "cp.async.bulk destination", pc);
    uintptr_t sp = (uintptr_t)src;
    if (in_smem_window(e, sp) || (sp >= t->stack_lo && sp < t->stack_hi))
        fault(e, pc, NULL, "cp.async.bulk source %p is not global memory", src);
    if (!in_image(e, sp)) global_touch(e, sp, size, TJ_HX_READ, pc);
    hx_mbar *b = mbar_find(e, bar, "cp.async.bulk completing", pc);
    if (e->threads[b->init_tid].fences <= b->init_fseq)
        report(e, R_PROXY, pc, NULL,
               "cp.async.bulk completes on the mbarrier at shared %u, whose mbarrier.init (by thread %d) no "
               "fence.proxy.async made visible to the async proxy", bar, b->init_tid);
    async_dst_claim(e, t, dst, size, "cp.async.bulk", pc);
    if (b->nbulk == b->bulkcap) {
        int cap = b->bulkcap ? 2 * b->bulkcap : 64;
        hx_bulk *n = realloc(b->bulk, (size_t)cap * sizeof *n);
        if (!n) fault(e, pc, NULL, "host executor: out of memory for cp.async.bulk");
        b->bulk = n;
        b->bulkcap = cap;
    }
    if (b->ndata + size > b->datacap) {
        size_t cap = b->datacap ? 2 * b->datacap : 65536;
        while (cap < b->ndata + size) cap *= 2;
        uint8_t *n = realloc(b->data, cap);
        if (!n) fault(e, pc, NULL, "host executor: out of memory for cp.async.bulk");
        b->data = n;
        b->datacap = cap;
    }
    hx_bulk *c = &b->bulk[b->nbulk++];
    c->dst = dst;
    c->n = size;
    c->at = (uint32_t)b->ndata;
    c->tid = (uint16_t)t->tid;
    c->pc = pc_off(e, pc);
    memcpy(b->data + b->ndata, src, size); /* read at issue */
    b->ndata += size;
    /* the copy's complete_tx: the executor lets it finish as soon as it is issued */
    b->tx -= size;
    mbar_complete_if_done(e, b);
}

static void hx_fence_proxy_async(void *ctx, const void *pc)
{
    (void)pc;
    tj_hx_exec *e = ctx;
    e->cur->fences++;
}

/* ---- wgmma: collectives of the 128 threads of a warpgroup ---- */

static void run_wgmma(tj_hx_exec *e, hx_wg *w, int g)
{
    hx_thread *th = &e->threads[g * 128];
    const void *pc = (const void *)w->pc;
    for (int i = 1; i < 128; i++)
        if (th[i].wg_da != th[0].wg_da || th[i].wg_db != th[0].wg_db || th[i].wg_n != th[0].wg_n ||
            th[i].wg_scale != th[0].wg_scale || th[i].wg_bf16 != th[0].wg_bf16 || th[i].wg_ta != th[0].wg_ta ||
            th[i].wg_tb != th[0].wg_tb)
            fault(e, pc, NULL, "wgmma.mma_async: thread %d's descriptors or immediates differ from thread %d's", th[i].tid,
                  th[0].tid);
    int n = th[0].wg_n;
    if (n < 8 || n > 256 || n % 8) fault(e, pc, NULL, "wgmma.mma_async: n %d is not a multiple of 8 in [8, 256]", n);
    if (!w->fenced)
        report_by(e, R_WGMMA, th[0].tid, pc, NULL,
                  "wgmma.mma_async without a wgmma.fence since the warpgroup's accumulators were last touched");
    static uint16_t a[64][16], b[16][256];
    static float cd[128][128];
    for (int op = 0; op < 2; op++) {
        uint64_t desc = op ? th[0].wg_db : th[0].wg_da;
        int trans = op ? th[0].wg_tb : th[0].wg_ta, mns = op ? n : 64;
        for (int mn = 0; mn < mns; mn++)
            for (int k = 0; k < 16; k++) {
                int base = 0;
                uint32_t addr = tj_hx_ptx_wgmma_addr(desc, trans, mn, k, &base);
                if (base) fault(e, pc, NULL, "wgmma descriptor with base offset %d (the executor models 0 only)", base);
                shared_bounds(e, addr, 2, op ? "wgmma operand B" : "wgmma operand A", pc);
                shared_touch(e, th[0].tid, addr, 2, TJ_HX_READ, pc);
                for (uint32_t q = 0; q < 2; q++) { /* read until the group completes */
                    e->shadow[addr + q].wg_rd = (uint8_t)(g + 1);
                    e->shadow[addr + q].wg_group = w->committed;
                }
                for (uint32_t q = 0; q < 2; q++) {
                    const hx_sbyte *s = &e->shadow[addr + q];
                    if (s->w_epoch && !s->mb && s->w_tid != HX_NOBODY && e->threads[s->w_tid].fences <= s->w_fseq) {
                        report_by(e, R_PROXY, th[0].tid, pc, image_pc(e, s->w_pc),
                                  "wgmma reads shared byte %u (operand %c) written through the generic proxy by thread %u "
                                  "with no fence.proxy.async after the write (second location)",
                                  addr + q, op ? 'B' : 'A', s->w_tid);
                        break;
                    }
                }
                uint16_t v;
                memcpy(&v, e->m->smem + addr, 2);
                if (op) b[k][mn] = v;
                else a[mn][k] = v;
            }
    }
    for (int i = 0; i < 128; i++) {
        hx_thread *t = &th[i];
        const float *c = t->wg_acc_pending && t->wg_acc_ptr == t->wg_d ? t->wg_acc : t->wg_d;
        for (int r = 0; r < n / 2; r++) cd[i][r] = th[0].wg_scale ? c[r] : 0.0f;
    }
    tj_hx_ptx_wgmma(a, b, n, th[0].wg_bf16, cd);
    for (int i = 0; i < 128; i++) {
        hx_thread *t = &th[i];
        memcpy(t->wg_acc, cd[i], (size_t)(n / 2) * sizeof(float));
        t->wg_acc_ptr = t->wg_d;
        t->wg_acc_group = w->committed;
        t->wg_acc_pending = n / 2;
    }
}

static const char *wg_op_name(int op)
{
    return op == OP_WG_FENCE ? "wgmma.fence" : op == OP_WG_MMA ? "wgmma.mma_async" : op == OP_WG_COMMIT ? "wgmma.commit_group"
                                                                                                      : "wgmma.wait_group";
}

static void wg_collective(tj_hx_exec *e, hx_thread *t, int op, const void *pc)
{
    if (e->nthreads % 128)
        fault(e, pc, NULL, "%s needs whole warpgroups; the block has %d threads", wg_op_name(op), e->nthreads);
    int g = t->tid / 128;
    hx_wg *w = &e->wg[g];
    if (w->arrived == 0) {
        w->op = op;
        w->pc = (uintptr_t)pc;
    } else if (w->op != op || w->pc != (uintptr_t)pc) {
        fault(e, pc, (void *)w->pc, "warpgroup divergence: this thread reached %s while %d thread(s) of warpgroup %d wait at "
              "%s (second location)", wg_op_name(op), w->arrived, g, wg_op_name(w->op));
    }
    t->state = T_WG;
    if (++w->arrived < 128) {
        yield(e, t);
        return;
    }
    hx_thread *th = &e->threads[g * 128];
    if (op == OP_WG_FENCE) {
        w->fenced = 1;
    } else if (op == OP_WG_MMA) {
        run_wgmma(e, w, g);
    } else if (op == OP_WG_COMMIT) {
        w->committed++;
    } else {
        uint32_t n = (uint32_t)th[0].wg_waitn;
        if (w->committed >= n && w->committed - n > w->done) w->done = w->committed - n;
        for (int i = 0; i < 128; i++) {
            hx_thread *u = &th[i];
            if (u->wg_acc_pending && u->wg_acc_group + (uint32_t)u->wg_waitn < w->committed) {
                memcpy(u->wg_acc_ptr, u->wg_acc, (size_t)u->wg_acc_pending * sizeof(float));
                u->wg_acc_pending = 0;
                w->fenced = 0; /* the accumulators were written: the next mma_async needs a fence */
            }
        }
    }
    e->stats.collectives++;
    w->arrived = 0;
    for (int i = 0; i < 128; i++) th[i].state = T_RUN;
}

static void hx_wgmma_fence(void *ctx, const void *pc) { tj_hx_exec *e = ctx; wg_collective(e, e->cur, OP_WG_FENCE, pc); }
static void hx_wgmma_commit(void *ctx, const void *pc) { tj_hx_exec *e = ctx; wg_collective(e, e->cur, OP_WG_COMMIT, pc); }
static void hx_wgmma_wait(void *ctx, int n, const void *pc)
{
    tj_hx_exec *e = ctx;
    if (n < 0 || n > 7) fault(e, pc, NULL, "wgmma.wait_group %d: N must be in [0, 7]", n);
    e->cur->wg_waitn = n;
    wg_collective(e, e->cur, OP_WG_WAIT, pc);
}
static void hx_wgmma_mma(void *ctx, float *d, int n, unsigned long long da, unsigned long long db, int scale_d, int bf16,
                         int ta, int tb, const void *pc)
{
    tj_hx_exec *e = ctx;
    hx_thread *t = e->cur;
    t->wg_d = d;
    t->wg_n = n;
    t->wg_da = da;
    t->wg_db = db;
    t->wg_scale = scale_d;
    t->wg_bf16 = bf16;
    t->wg_ta = ta;
    t->wg_tb = tb;
    wg_collective(e, t, OP_WG_MMA, pc);
}

/* ---- conversions: pure ---- */

static float cvt_f32_f16(unsigned short h) { return tj_hx_ptx_cvt_f32_f16(h); }
static unsigned short cvt_rn_f16_f32(float f) { return tj_hx_ptx_cvt_rn_f16_f32(f); }
static unsigned short cvt_rn_bf16_f32(float f) { return tj_hx_ptx_cvt_rn_bf16_f32(f); }
static unsigned cvt_rn_f16x2_f32(float a, float b) { return tj_hx_ptx_cvt_rn_f16x2_f32(a, b); }
static unsigned cvt_rn_bf16x2_f32(float a, float b) { return tj_hx_ptx_cvt_rn_bf16x2_f32(a, b); }

/* ---- threads and blocks ---- */

static void thread_main(void *arg)
{
    hx_thread *t = arg;
    tj_hx_exec *e = t->e;
    e->invoke(e->fn, e->params);
    hx_warp *w = &e->warps[t->warp];
    t->state = T_DONE;
    e->ndone++;
    w->ndone++;
    if (w->arrived)
        fault(e, (void *)w->pc, NULL, "thread exited while %d lane(s) of its warp wait for it at %s", w->arrived,
              op_name(w->op));
    if (e->bar_arrived)
        fault(e, (void *)e->bar_pc, NULL, "thread exited while %d thread(s) wait for it at __syncthreads",
              e->bar_arrived);
    if (t->wg_acc_pending)
        report(e, R_WGMMA, NULL, NULL, "thread exited with wgmma.mma_async results that no wgmma.wait_group landed");
    tj_hx_fiber_switch(&t->fb, &e->sched, 1);
}

static tj_status ensure_threads(tj_hx_exec *e, int n, tj_error *err)
{
    if (n <= e->nstacks) return TJ_OK;
    if (e->stacks) munmap(e->stacks, e->stacks_bytes);
    for (int i = 0; e->threads && i < e->nstacks; i++) free(e->threads[i].cp);
    free(e->threads);
    free(e->warps);
    e->stacks = NULL;
    e->threads = NULL;
    e->warps = NULL;
    e->nstacks = 0;
    size_t per = HX_STACK_BYTES + HX_GUARD_BYTES, bytes = per * (size_t)n;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "host executor: no memory for %d thread stacks", n);
    e->stacks = p;
    e->stacks_bytes = bytes;
    for (int i = 0; i < n; i++) mprotect(e->stacks + per * (size_t)i, HX_GUARD_BYTES, PROT_NONE);
    e->threads = calloc((size_t)n, sizeof *e->threads);
    e->warps = calloc((size_t)(n + 31) / 32, sizeof *e->warps);
    if (!e->threads || !e->warps) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "host executor: out of memory");
    e->nstacks = n;
    return TJ_OK;
}

static void run_block(tj_hx_exec *e)
{
    tj_hx_builtins *bi = e->m->bi;
    bi->block_idx = e->bidx;
    memset(e->m->smem, 0xff, e->smem_bytes); /* poison: NaN as fp16, bf16 and fp32 */
    memset(e->shadow, 0, (size_t)e->smem_bytes * sizeof *e->shadow);
    e->epoch = 1;
    e->ndone = e->bar_arrived = 0;
    for (int i = 0; i < HX_MAX_MBAR; i++) {
        e->mbar[i].used = 0;
        e->mbar[i].nbulk = 0;
        e->mbar[i].ndata = 0;
    }
    memset(e->wg, 0, sizeof e->wg);
    for (int w = 0; w < (e->nthreads + 31) / 32; w++) {
        memset(&e->warps[w], 0, sizeof e->warps[w]);
        e->warps[w].nlanes = e->nthreads - 32 * w < 32 ? e->nthreads - 32 * w : 32;
    }
    size_t per = HX_STACK_BYTES + HX_GUARD_BYTES;
    for (int i = 0; i < e->nthreads; i++) {
        hx_thread *t = &e->threads[i];
        char *stack = e->stacks + per * (size_t)i + HX_GUARD_BYTES;
        t->e = e;
        t->tid = i;
        t->lane = i % 32;
        t->warp = i / 32;
        t->state = T_RUN;
        t->stack_lo = (uintptr_t)stack;
        t->stack_hi = (uintptr_t)stack + HX_STACK_BYTES;
        t->ncp = t->cphead = 0;
        t->committed = 0;
        t->fences = 0;
        memset(t->mb_seen, 0, sizeof t->mb_seen);
        t->wg_acc_pending = 0;
        tj_hx_fiber_init(&t->fb, stack, HX_STACK_BYTES, thread_main, t);
    }
    e->stats.blocks++;
    e->stats.threads += e->nthreads;
    for (;;) {
        int progress = 0;
        for (int i = 0; i < e->nthreads; i++) {
            hx_thread *t = &e->threads[i];
            if (t->state != T_RUN) continue;
            e->cur = t;
            bi->thread_idx.x = (unsigned)i % e->block.x;
            bi->thread_idx.y = (unsigned)i / e->block.x % e->block.y;
            bi->thread_idx.z = (unsigned)i / (e->block.x * e->block.y);
            e->stats.switches++;
            tj_hx_fiber_switch(&e->sched, &t->fb, 0);
            e->cur = NULL;
            progress = 1;
            if (e->abort) return;
        }
        if (e->ndone == e->nthreads) return;
        if (!progress) {
            int bar = 0, coll = 0, mb = 0, wgc = 0;
            for (int i = 0; i < e->nthreads; i++) {
                bar += e->threads[i].state == T_BAR;
                coll += e->threads[i].state == T_WARP;
                wgc += e->threads[i].state == T_WG;
                if (e->threads[i].state == T_MBAR) mb++;
            }
            if (mb)
                report(e, R_FAULT, NULL, NULL,
                       "deadlock: %d thread(s) wait on an mbarrier phase that never completes (wrong parity, or "
                       "arrivals or transaction bytes missing), %d at __syncthreads, %d at warp collectives, %d at "
                       "warpgroup collectives, %d exited", mb, bar, coll, wgc, e->ndone);
            else
                report(e, R_FAULT, (void *)e->bar_pc, NULL,
                       "deadlock: %d thread(s) wait at __syncthreads (location), %d at warp collectives, %d at warpgroup "
                       "collectives, %d exited", bar, coll, wgc, e->ndone);
            e->abort = 1;
            return;
        }
    }
}

/* ---- formatting reports ---- */

/* "kernel.cu:123:5" in a symbolized frame → the template line with the same text (and the same
 * neighbours), e.g. "tiles_mma.cu:158"; else "line 123 of the emitted source". */
static void place_of_line(const tj_hx_exec *e, int line, char *out, size_t cap)
{
    const char *src = e->m->source;
    const char *lines[3] = {NULL, NULL, NULL};
    size_t lens[3] = {0, 0, 0};
    int cur = 1;
    for (const char *p = src; *p && cur <= line + 1; cur++) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        if (cur >= line - 1) {
            lines[cur - (line - 1)] = p;
            lens[cur - (line - 1)] = len;
        }
        if (!nl) break;
        p = nl + 1;
    }
    if (lines[1])
        for (int o = 0; o < e->norigins; o++) {
            const char *t = e->origin_texts[o];
            const char *prev = NULL;
            size_t prevlen = 0;
            int ln = 1;
            for (const char *p = t; *p; ln++) {
                const char *nl = strchr(p, '\n');
                size_t len = nl ? (size_t)(nl - p) : strlen(p);
                if (len == lens[1] && memcmp(p, lines[1], len) == 0) {
                    int ok = 1;
                    if (lines[0] && prev) ok &= prevlen == lens[0] && memcmp(prev, lines[0], prevlen) == 0;
                    if (lines[2] && nl) {
                        const char *q = nl + 1, *nl2 = strchr(q, '\n');
                        size_t l2 = nl2 ? (size_t)(nl2 - q) : strlen(q);
                        ok &= l2 == lens[2] && memcmp(q, lines[2], l2) == 0;
                    }
                    if (ok) {
                        snprintf(out, cap, "%s:%d", e->origin_names[o], ln);
                        return;
                    }
                }
                prev = p;
                prevlen = len;
                if (!nl) break;
                p = nl + 1;
            }
        }
    snprintf(out, cap, "emitted line %d", line);
}

/* Rewrites "func file:LINE:COL <- ..." with template places. */
static void describe_frames(const tj_hx_exec *e, const char *sym, tj_strbuf *sb)
{
    const char *p = sym;
    int first = 1;
    while (*p) {
        const char *arrow = strstr(p, " <- ");
        size_t len = arrow ? (size_t)(arrow - p) : strlen(p);
        char frame[512];
        snprintf(frame, sizeof frame, "%.*s", (int)len, p);
        char *sp = strrchr(frame, ' ');
        char *colon = sp ? strchr(sp, ':') : NULL;
        if (sp && colon) {
            int line = atoi(colon + 1);
            *sp = '\0';
            char place[160];
            place_of_line(e, line, place, sizeof place);
            tj_sb_printf(sb, "%s%s (%s)", first ? "" : " <- ", frame, place);
        } else {
            tj_sb_printf(sb, "%s%s", first ? "" : " <- ", frame);
        }
        first = 0;
        if (!arrow) break;
        p = arrow + 4;
    }
}

static void format_reports(tj_hx_exec *e)
{
    tj_sb_free(&e->text);
    tj_sb_init(&e->text);
    uintptr_t pcs[2 * HX_MAX_REPORTS];
    int npcs = 0;
    for (int i = 0; i < e->nrep; i++)
        for (int k = 0; k < e->rep[i].npc; k++) pcs[npcs++] = e->rep[i].pc[k];
    char *syms[2 * HX_MAX_REPORTS];
    if (npcs) hx_module_symbolize(e->m, pcs, npcs, syms);
    int s = 0;
    for (int i = 0; i < e->nrep; i++) {
        hx_report *r = &e->rep[i];
        tj_sb_printf(&e->text, "%s", r->msg ? r->msg : "(out of memory)");
        if (r->count > 1) tj_sb_printf(&e->text, " [%lld times]", (long long)r->count);
        for (int k = 0; k < r->npc; k++) {
            tj_sb_puts(&e->text, k ? "; second location: " : "; at ");
            describe_frames(e, syms[s] ? syms[s] : "?", &e->text);
            free(syms[s]);
            s++;
        }
        tj_sb_puts(&e->text, "\n");
    }
    if (e->nrep_total > 0) {
        int64_t shown = 0;
        for (int i = 0; i < e->nrep; i++) shown += e->rep[i].count;
        if (e->nrep_total > shown)
            tj_sb_printf(&e->text, "(%lld more reports not kept)\n", (long long)(e->nrep_total - shown));
    }
}

/* ---- the public side ---- */

tj_status tj_hx_exec_create(tj_hx_exec **out, tj_error *err)
{
    *out = NULL;
    tj_hx_exec *e = calloc(1, sizeof *e);
    if (!e) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "host executor: out of memory");
    e->shadow = calloc(HX_SMEM_CAPACITY, sizeof *e->shadow);
    if (!e->shadow) {
        free(e);
        return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "host executor: out of memory");
    }
    tj_sb_init(&e->text);
    tj_hx_fiber_init_main(&e->sched);
    tj_hx_api *a = &e->api;
    a->version = TJ_HX_API_VERSION;
    a->ctx = e;
    a->access = hx_access;
    a->copy = hx_copy;
    a->fill = hx_fill;
    a->bar_sync = hx_bar_sync;
    a->cvta_to_shared = hx_cvta_to_shared;
    a->cp_async = hx_cp_async;
    a->cp_async_commit_group = hx_cp_commit;
    a->cp_async_wait_group = hx_cp_wait;
    a->ldmatrix = hx_ldmatrix;
    a->mma_m16n8k16 = hx_mma;
    a->mbarrier_init = hx_mbar_init;
    a->mbarrier_arrive_expect_tx = hx_mbar_arrive;
    a->mbarrier_try_wait_parity = hx_mbar_try_wait;
    a->cp_async_bulk = hx_cp_bulk;
    a->fence_proxy_async = hx_fence_proxy_async;
    a->wgmma_fence = hx_wgmma_fence;
    a->wgmma_commit_group = hx_wgmma_commit;
    a->wgmma_wait_group = hx_wgmma_wait;
    a->wgmma_mma_async = hx_wgmma_mma;
    a->cvt_f32_f16 = cvt_f32_f16;
    a->cvt_rn_f16_f32 = cvt_rn_f16_f32;
    a->cvt_rn_bf16_f32 = cvt_rn_bf16_f32;
    a->cvt_rn_f16x2_f32 = cvt_rn_f16x2_f32;
    a->cvt_rn_bf16x2_f32 = cvt_rn_bf16x2_f32;
    *out = e;
    return TJ_OK;
}

void tj_hx_exec_destroy(tj_hx_exec *e)
{
    if (!e) return;
    tj_hx_buffers_clear(e);
    free(e->buf);
    if (e->stacks) munmap(e->stacks, e->stacks_bytes);
    if (e->threads)
        for (int i = 0; i < e->nstacks; i++) free(e->threads[i].cp);
    free(e->threads);
    free(e->warps);
    free(e->shadow);
    for (int i = 0; i < HX_MAX_MBAR; i++) {
        free(e->mbar[i].bulk);
        free(e->mbar[i].data);
    }
    for (int i = 0; i < e->nrep; i++) free(e->rep[i].msg);
    tj_sb_free(&e->text);
    free(e);
}

tj_status tj_hx_buffer_add(tj_hx_exec *e, const char *name, const void *p, size_t bytes, int writable, tj_error *err)
{
    if (!p || !bytes) return TJ_OK; /* NULL pointers of the ABI: nothing to access */
    if (e->nbuf == e->bufcap) {
        int cap = e->bufcap ? 2 * e->bufcap : 16;
        hx_buffer *n = realloc(e->buf, (size_t)cap * sizeof *n);
        if (!n) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "host executor: out of memory");
        e->buf = n;
        e->bufcap = cap;
    }
    hx_buffer *b = &e->buf[e->nbuf];
    memset(b, 0, sizeof *b);
    snprintf(b->name, sizeof b->name, "%s", name);
    b->lo = (uintptr_t)p;
    b->hi = (uintptr_t)p + bytes;
    b->writable = writable;
    if (writable) {
        b->shadow = calloc(bytes, sizeof *b->shadow);
        if (!b->shadow) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "host executor: out of memory");
    }
    e->nbuf++;
    return TJ_OK;
}

void tj_hx_buffers_clear(tj_hx_exec *e)
{
    for (int i = 0; i < e->nbuf; i++) free(e->buf[i].shadow);
    e->nbuf = 0;
}

void tj_hx_exec_set_origins(tj_hx_exec *e, const char *const *names, const char *const *texts, int n)
{
    e->origin_names = names;
    e->origin_texts = texts;
    e->norigins = n;
}

const char *tj_hx_exec_report(const tj_hx_exec *e) { return e->text.data ? e->text.data : ""; }

tj_status tj_hx_launch(tj_hx_exec *e, tj_hx_module *m, const char *kernel, tj_hx_dim3 grid, tj_hx_dim3 block,
                       unsigned smem_bytes, tj_hx_invoke invoke, const void *params, tj_hx_launch_stats *stats,
                       tj_error *err)
{
    for (int i = 0; i < e->nrep; i++) free(e->rep[i].msg);
    e->nrep = 0;
    e->nrep_total = 0;
    tj_sb_free(&e->text);
    tj_sb_init(&e->text);
    memset(&e->stats, 0, sizeof e->stats);
    if (stats) memset(stats, 0, sizeof *stats);
    int64_t nthreads = (int64_t)block.x * block.y * block.z;
    if (nthreads < 1 || nthreads > HX_MAX_THREADS || !grid.x || !grid.y || !grid.z)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "%s: block %ux%ux%u / grid %ux%ux%u is not a valid launch", kernel,
                       block.x, block.y, block.z, grid.x, grid.y, grid.z);
    if (smem_bytes > HX_SMEM_CAPACITY)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "%s: %u bytes of dynamic shared memory exceed %d", kernel, smem_bytes,
                       HX_SMEM_CAPACITY);
    void (*fn)(void) = tj_hx_module_kernel(m, kernel);
    if (!fn) return tj_fail(err, TJ_ERR_NOT_FOUND, "host executor: the module has no kernel '%s'", kernel);
    if (m->bind(&e->api) != TJ_HX_API_VERSION)
        return tj_fail(err, TJ_ERR_INTERNAL, "host executor: module built for another tj_hx_api version");
    TJ_TRY(ensure_threads(e, (int)nthreads, err));
    e->m = m;
    e->kernel = kernel;
    e->fn = fn;
    e->invoke = invoke;
    e->params = params;
    e->grid = grid;
    e->block = block;
    e->smem_bytes = smem_bytes;
    e->nthreads = (int)nthreads;
    e->abort = 0;
    e->launch_seq++;
    m->bi->block_dim = block;
    m->bi->grid_dim = grid;
    uint32_t linear = 0;
    for (unsigned z = 0; z < grid.z && !e->abort; z++)
        for (unsigned y = 0; y < grid.y && !e->abort; y++)
            for (unsigned x = 0; x < grid.x && !e->abort; x++) {
                e->bidx = (tj_hx_dim3){x, y, z};
                e->block_linear = linear++;
                run_block(e);
            }
    e->cur = NULL;
    if (e->abort) /* threads abandoned mid-call */
        for (int i = 0; i < e->nthreads; i++)
            tj_hx_fiber_forget(e->stacks + (HX_STACK_BYTES + HX_GUARD_BYTES) * (size_t)i + HX_GUARD_BYTES, HX_STACK_BYTES);
    if (stats) *stats = e->stats;
    if (!e->nrep_total) return TJ_OK;
    format_reports(e);
    const char *t = tj_hx_exec_report(e);
    int lines = 0;
    const char *end = t;
    while (*end && lines < HX_ERR_REPORTS) {
        const char *nl = strchr(end, '\n');
        end = nl ? nl + 1 : end + strlen(end);
        lines++;
    }
    return tj_fail(err, TJ_ERR_DEVICE, "%lld report(s)%s:\n%.*s", (long long)e->nrep_total, e->abort ? ", launch aborted" : "",
                   (int)(end - t), t);
}
