/* Preloaded ahead of OpenBLAS into the worker (worker/blas/ builds it). Two things, both about the OpenBLAS that
 * Debian 12 ships (0.3.21):
 *
 * 1. Fork safety. OpenBLAS stops its thread pool before every fork() (a pthread_atfork handler), even while another
 *    thread is in the middle of a product that the pool is working on: that thread then waits for ever (seen: an
 *    MLX stream thread spinning in exec_blas_async; tests/test_blas.py forks under a running product). Every
 *    product here holds `products` for reading, and a fork holds it for writing: it waits for the products under
 *    way, and new ones wait for it. Our handler is registered after OpenBLAS's (on the first product, long after
 *    OpenBLAS's constructor), so it runs before OpenBLAS's at a fork. The child starts with the lock as new: unlocking
 *    there the parent's write lock, glibc (which tells a writer by its thread id, another in the child) took it for
 *    a reader's unlock, and the child's first product waited for ever.
 *
 * 2. Products by a kernel of our own, which reads the weights once for up to 64 rows and shares its work as it goes.
 *    MLX's CPU backend sends every matrix product to cblas_sgemm, with as many rows as tokens in the step (sequences
 *    x the tokens each verifies, or a prompt's chunk). OpenBLAS before 0.3.27 packs the whole of B for it even when
 *    A has a single row (a decode step copied every weight matrix before reading it), and its matrix-vector routine,
 *    one call a row, reads every weight matrix again for each row: a step of W tokens of one sequence cost about W
 *    steps of one token, which makes verifying several proposed tokens at once (speculative decoding) pay nothing.
 *    And it shares a product between its threads in fixed parts: beside other busy processes, each product waits for
 *    the part of a thread the system had set aside (a 604-token prompt read in chunks of 128 rows took 6-99 s there,
 *    4.7-5.7 s through this kernel; bench/busy_cpu.py). Every row-major product comes here instead
 *    (onelane_gemv_max_rows: all; 0 when ONELANE_GEMV is false), with B stored either way (a Linear's x W^T: B
 *    transposed, n x k; attention's scores V: k x n) and A either way (a transposed A is copied into rows first). The
 *    kernel takes a few rows of W (5 with AVX-512, 3 with AVX2; columns of B when it is not transposed) and multiplies
 *    a block of up to 64 rows of A by them while they are in the cache, holding a tile of outputs in registers (4 x 5
 *    with AVX-512) so that each load feeds several FMAs: W is read from memory once for the block whatever its rows (a
 *    prompt's chunk: once a block). The outputs are cut into panels (30 rows of W, 64 columns of B) that the calling
 *    thread and one helper thread of ours take one by one (both cores; a core slowed by another process takes fewer,
 *    and a product waits for at most one panel of it); a small product (under 65,536 multiply-adds) stays on the
 *    calling thread. The helper waits awake 200 us for the next product (a forward pass sends them one after another),
 *    then sleeps on a futex; a fork() finds no product under way, and the child starts a helper of its own.
 *
 *    Each output element is summed the same way whatever the number of rows, the tile or the thread that computes it,
 *    so that a sequence's logits are the same bits whether its row is multiplied alone or beside others:
 *    - B transposed (dot products along k): 16 partial sums, lane l taking k = l, l + 16, ... with an FMA each, up to
 *      the last multiple of 16; then lanes l + 8 added to lanes l, then + 4, + 2, + 1; then the last k % 16 terms one
 *      by one with an FMA. AVX-512 holds the 16 lanes in a register, AVX2 in two (lanes 0-7 and 8-15): the same
 *      bits. Without AVX2 and FMA (checked at run time) a portable C kernel sums the same lanes with a multiply and an
 *      add instead (other bits, the same whatever the rows). ONELANE_SHIM_KERNEL=avx2 or c picks a narrower kernel
 *      (the tests compare them).
 *    - B not transposed: each element sums its k terms in order, one FMA each (the C kernel: multiply and add).
 *    Then alpha and beta as cblas applies them (beta 0: C is not read). OpenBLAS sums in other orders: results differ
 *    from its sgemm and sgemv in the last bits of a float32. Everything else (column-major, double) goes to OpenBLAS.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/syscall.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };

typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int, const float *, int, float, float *,
                         int);
typedef void (*dgemm_fn)(int, int, int, int, int, int, double, const double *, int, const double *, int, double,
                         double *, int);
typedef void (*cgemm_fn)(int, int, int, int, int, int, const void *, const void *, int, const void *, int,
                         const void *, void *, int);

static sgemm_fn next_sgemm;
static dgemm_fn next_dgemm;
static cgemm_fn next_cgemm;
int onelane_gemv_max_rows = INT_MAX; /* rows a product may have to come here (0: none, ONELANE_GEMV=false) */
long onelane_gemv_rows;         /* the rows multiplied by the shim's kernel so far (the tests read it) */
long onelane_forks_held;        /* the forks that waited for products to finish (the tests read it) */
int onelane_threads = 2;        /* threads a product is shared between: the caller and one helper (1: the caller;
                                   ONELANE_GEMV_THREADS) */
long onelane_products_shared;   /* the products shared with the helper so far (the tests read it) */

static pthread_rwlock_t products = PTHREAD_RWLOCK_WRITER_NONRECURSIVE_INITIALIZER_NP; /* a fork is not starved */
static pthread_once_t fork_guard = PTHREAD_ONCE_INIT;

static void before_fork(void) {
    pthread_rwlock_wrlock(&products);
    __atomic_add_fetch(&onelane_forks_held, 1, __ATOMIC_RELAXED);
}
static void after_fork(void) { pthread_rwlock_unlock(&products); }
static void after_fork_child(void) { /* the lock as new: glibc would take the parent's unlock for a reader's here */
    pthread_rwlock_t fresh = PTHREAD_RWLOCK_WRITER_NONRECURSIVE_INITIALIZER_NP;
    memcpy(&products, &fresh, sizeof fresh);
}
static void guard_forks(void) { pthread_atfork(before_fork, after_fork, after_fork_child); }

static void begin(void) {
    pthread_once(&fork_guard, guard_forks);
    pthread_rwlock_rdlock(&products);
}
static void end(void) { pthread_rwlock_unlock(&products); }

static int use_avx2, use_avx512;

__attribute__((constructor)) static void find_blas(void) {
    next_sgemm = (sgemm_fn)dlsym(RTLD_NEXT, "cblas_sgemm");
    next_dgemm = (dgemm_fn)dlsym(RTLD_NEXT, "cblas_dgemm");
    next_cgemm = (cgemm_fn)dlsym(RTLD_NEXT, "cblas_cgemm");
#if defined(__x86_64__)
    __builtin_cpu_init();
    use_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    use_avx512 = use_avx2 && __builtin_cpu_supports("avx512f");
#endif
    const char *kernel = getenv("ONELANE_SHIM_KERNEL"); /* "avx2", "c": a narrower kernel (the tests compare them) */
    if (kernel != 0 && strcmp(kernel, "avx2") == 0)
        use_avx512 = 0;
    if (kernel != 0 && strcmp(kernel, "c") == 0)
        use_avx2 = use_avx512 = 0;
}

/* ---- the product ---------------------------------------------------------------------------------------------- */

typedef struct {
    int m, n, k, trans_b;
    float alpha, beta;
    const float *a, *b;
    long lda, ldb, ldc;
    float *c;
    int panel;  /* outputs (columns of C) a unit of work covers */
    int units;  /* ceil(n / panel) */
} product;

#define LANES 16
#define PANEL_T 30 /* B transposed: rows of W a unit covers (a multiple of the tiles' 6, 5 and 3) */
#define PANEL_N 64 /* B not transposed: columns of B a unit covers (8 registers of 8) */
#define BLOCK_ROWS 64 /* rows of A multiplied by one pass over W (a longer product: one pass per block) */

static inline void put(const product *p, int i, int j, float dot) {
    float r = p->alpha == 1.0f ? dot : p->alpha * dot;
    float *out = p->c + i * p->ldc + j;
    *out = p->beta == 0.0f ? r : r + p->beta * *out;
}

/* The portable kernels: the same order as the AVX2 ones, a multiply and an add for an FMA. */

static float dot_c(const float *x, const float *w, int k) {
    float lane[LANES] = {0};
    int k16 = k - k % LANES, i = 0;
    for (; i < k16; i += LANES)
        for (int l = 0; l < LANES; l++)
            lane[l] += x[i + l] * w[i + l];
    for (int half = LANES / 2; half >= 1; half /= 2)
        for (int l = 0; l < half; l++)
            lane[l] += lane[l + half];
    float s = lane[0];
    for (; i < k; i++)
        s += x[i] * w[i];
    return s;
}

static void unit_c(const product *p, int unit) {
    int j0 = unit * p->panel, j1 = j0 + p->panel < p->n ? j0 + p->panel : p->n;
    for (int i = 0; i < p->m; i++)
        for (int j = j0; j < j1; j++) {
            const float *x = p->a + i * p->lda;
            float s = 0;
            if (p->trans_b)
                s = dot_c(x, p->b + j * p->ldb, p->k);
            else
                for (int t = 0; t < p->k; t++)
                    s += x[t] * p->b[t * p->ldb + j];
            put(p, i, j, s);
        }
}

#if defined(__x86_64__)
#define AVX2 __attribute__((target("avx2,fma")))
#define INLINE __attribute__((always_inline)) inline

/* The 16 lanes of one element (lo: lanes 0..7, hi: 8..15) summed down, then its last k % 16 terms. */
AVX2 static INLINE float finish(__m256 lo, __m256 hi, const float *x, const float *w, int k16, int k) {
    __m256 s8 = _mm256_add_ps(lo, hi);
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    __m128 s1 = _mm_add_ss(s2, _mm_movehdup_ps(s2));
    for (int i = k16; i < k; i++)
        s1 = _mm_fmadd_ss(_mm_load_ss(x + i), _mm_load_ss(w + i), s1);
    return _mm_cvtss_f32(s1);
}

/* C[i0 .. i0+MB, j0 .. j0+NB] for B transposed: MB rows of A by NB rows of W, 2 x MB x NB accumulators. */
AVX2 static INLINE void tile_t(const product *p, int i0, int j0, const int MB, const int NB) {
    __m256 lo[3][6], hi[3][6];
    const float *x[3], *w[6];
#pragma GCC unroll 3
    for (int r = 0; r < MB; r++)
        x[r] = p->a + (i0 + r) * p->lda;
#pragma GCC unroll 6
    for (int c = 0; c < NB; c++)
        w[c] = p->b + (j0 + c) * p->ldb;
#pragma GCC unroll 3
    for (int r = 0; r < MB; r++)
#pragma GCC unroll 6
        for (int c = 0; c < NB; c++)
            lo[r][c] = hi[r][c] = _mm256_setzero_ps();
    int k = p->k, k16 = k - k % LANES;
    for (int t = 0; t < k16; t += LANES) {
#pragma GCC unroll 3
        for (int r = 0; r < MB; r++) {
            __m256 xl = _mm256_loadu_ps(x[r] + t), xh = _mm256_loadu_ps(x[r] + t + 8);
#pragma GCC unroll 6
            for (int c = 0; c < NB; c++) {
                lo[r][c] = _mm256_fmadd_ps(xl, _mm256_loadu_ps(w[c] + t), lo[r][c]);
                hi[r][c] = _mm256_fmadd_ps(xh, _mm256_loadu_ps(w[c] + t + 8), hi[r][c]);
            }
        }
    }
#pragma GCC unroll 3
    for (int r = 0; r < MB; r++)
#pragma GCC unroll 6
        for (int c = 0; c < NB; c++)
            put(p, i0 + r, j0 + c, finish(lo[r][c], hi[r][c], x[r], w[c], k16, k));
}

/* Rows j0 .. j1 of W by all the rows of A: tiles of 2 rows x 3 of W, a last row of A by 6 of W. */
AVX2 static void unit_t_avx2(const product *p, int j0, int j1) {
    int i = 0;
    for (; i + 2 <= p->m; i += 2) {
        int j = j0;
        for (; j + 3 <= j1; j += 3)
            tile_t(p, i, j, 2, 3);
        for (; j < j1; j++)
            tile_t(p, i, j, 2, 1);
    }
    if (i < p->m) {
        int j = j0;
        for (; j + 6 <= j1; j += 6)
            tile_t(p, i, j, 1, 6);
        for (; j + 3 <= j1; j += 3)
            tile_t(p, i, j, 1, 3);
        for (; j < j1; j++)
            tile_t(p, i, j, 1, 1);
    }
}

#define AVX512 __attribute__((target("avx512f,avx2,fma")))

/* The same for a CPU with AVX-512 (32 registers of 16 lanes): a register an element, the same lanes, the same sums. */
AVX512 static INLINE void tile_t512(const product *p, int i0, int j0, const int MB, const int NB) {
    __m512 acc[4][5], xr[4];
    const float *x[4], *w[5];
#pragma GCC unroll 4
    for (int r = 0; r < MB; r++)
        x[r] = p->a + (i0 + r) * p->lda;
#pragma GCC unroll 5
    for (int c = 0; c < NB; c++)
        w[c] = p->b + (j0 + c) * p->ldb;
#pragma GCC unroll 4
    for (int r = 0; r < MB; r++)
#pragma GCC unroll 5
        for (int c = 0; c < NB; c++)
            acc[r][c] = _mm512_setzero_ps();
    int k = p->k, k16 = k - k % LANES;
    for (int t = 0; t < k16; t += LANES) {
#pragma GCC unroll 4
        for (int r = 0; r < MB; r++)
            xr[r] = _mm512_loadu_ps(x[r] + t);
#pragma GCC unroll 5
        for (int c = 0; c < NB; c++) {
            __m512 wc = _mm512_loadu_ps(w[c] + t);
#pragma GCC unroll 4
            for (int r = 0; r < MB; r++)
                acc[r][c] = _mm512_fmadd_ps(xr[r], wc, acc[r][c]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < MB; r++)
#pragma GCC unroll 5
        for (int c = 0; c < NB; c++) {
            __m256 lo = _mm512_castps512_ps256(acc[r][c]);
            __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[r][c]), 1));
            put(p, i0 + r, j0 + c, finish(lo, hi, x[r], w[c], k16, k));
        }
}

#define TILES_512(MB)                                                                                                  \
    switch (nb) {                                                                                                      \
    case 5: tile_t512(p, i, j, MB, 5); break;                                                                          \
    case 4: tile_t512(p, i, j, MB, 4); break;                                                                          \
    case 3: tile_t512(p, i, j, MB, 3); break;                                                                          \
    case 2: tile_t512(p, i, j, MB, 2); break;                                                                          \
    default: tile_t512(p, i, j, MB, 1);                                                                                \
    }

/* Rows j0 .. j1 of W five at a time (while they are in the cache) by all the rows of A, four at a time. */
AVX512 static void unit_t_avx512(const product *p, int j0, int j1) {
    for (int j = j0, nb; j < j1; j += nb) {
        nb = j1 - j < 5 ? j1 - j : 5;
        for (int i = 0, mb; i < p->m; i += mb) {
            mb = p->m - i < 4 ? p->m - i : 4;
            if (mb == 4) {
                TILES_512(4)
            } else if (mb == 3) {
                TILES_512(3)
            } else if (mb == 2) {
                TILES_512(2)
            } else {
                TILES_512(1)
            }
        }
    }
}

/* C[i0 .. i0+MB, j0 .. j0+8 NV] for B not transposed: each element's k terms in order, one FMA each. */
AVX2 static INLINE void tile_n(const product *p, int i0, int j0, const int MB, const int NV) {
    __m256 acc[2][8];
#pragma GCC unroll 2
    for (int r = 0; r < MB; r++)
#pragma GCC unroll 8
        for (int v = 0; v < NV; v++)
            acc[r][v] = _mm256_setzero_ps();
    const float *x = p->a + i0 * p->lda, *w = p->b + j0;
    for (int t = 0; t < p->k; t++, w += p->ldb) {
#pragma GCC unroll 2
        for (int r = 0; r < MB; r++) {
            __m256 xr = _mm256_broadcast_ss(x + r * p->lda + t);
#pragma GCC unroll 8
            for (int v = 0; v < NV; v++)
                acc[r][v] = _mm256_fmadd_ps(xr, _mm256_loadu_ps(w + 8 * v), acc[r][v]);
        }
    }
    float out[8];
#pragma GCC unroll 2
    for (int r = 0; r < MB; r++)
#pragma GCC unroll 8
        for (int v = 0; v < NV; v++) {
            _mm256_storeu_ps(out, acc[r][v]);
            for (int l = 0; l < 8; l++)
                put(p, i0 + r, j0 + 8 * v + l, out[l]);
        }
}

AVX2 static void unit_n_avx2(const product *p, int j0, int j1) {
    for (int i = 0, rows; i < p->m; i += rows) {
        rows = p->m - i >= 2 ? 2 : 1;
        int j = j0;
        if (rows == 2) { /* two rows at a time: 4 registers of each */
            for (; j + 32 <= j1; j += 32)
                tile_n(p, i, j, 2, 4);
            for (; j + 8 <= j1; j += 8)
                tile_n(p, i, j, 2, 1);
        } else {
            for (; j + 64 <= j1; j += 64)
                tile_n(p, i, j, 1, 8);
            for (; j + 8 <= j1; j += 8)
                tile_n(p, i, j, 1, 1);
        }
        for (int r = i; r < i + rows; r++) /* the last n % 8 columns, each summed as a lane of a register is */
            for (int jj = j; jj < j1; jj++) {
                __m128 s = _mm_setzero_ps();
                for (int t = 0; t < p->k; t++)
                    s = _mm_fmadd_ss(_mm_load_ss(p->a + r * p->lda + t), _mm_load_ss(p->b + t * p->ldb + jj), s);
                put(p, r, jj, _mm_cvtss_f32(s));
            }
    }
}
#endif

static void run_unit(const product *p, int unit) {
    int j0 = unit * p->panel, j1 = j0 + p->panel < p->n ? j0 + p->panel : p->n;
#if defined(__x86_64__)
    if (use_avx2) {
        if (p->trans_b && use_avx512)
            unit_t_avx512(p, j0, j1);
        else if (p->trans_b)
            unit_t_avx2(p, j0, j1);
        else
            unit_n_avx2(p, j0, j1);
        return;
    }
#endif
    unit_c(p, unit);
}

/* ---- the helper thread ------------------------------------------------------------------------------------------
 * One product at a time shares its units with the helper (`sharing`; a product that finds it taken does its own).
 * The caller posts the product (`posted` counts them) and takes units from `next_unit` until none is left; the
 * helper, woken, claims the product (state POSTED -> TAKEN) and takes units too. The caller then withdraws it
 * (POSTED -> IDLE) if the helper has not claimed it, or waits for the helper to finish (DONE). The helper spins a
 * little between products (a forward pass sends them one after another) and then sleeps on a futex. */

enum { IDLE, POSTED, TAKEN, DONE };
static pthread_mutex_t sharing = PTHREAD_MUTEX_INITIALIZER;
static const product *shared;
static int next_unit, state, posted, sleeping, helper_started, helper_failed;
static pthread_once_t helper_forks = PTHREAD_ONCE_INIT;
long onelane_helper_spin_us = 200; /* how long the helper waits awake for the next product */

static void futex(int *word, int op, int value) { syscall(SYS_futex, word, op, value, 0, 0, 0); }

static void relax(void) {
#if defined(__x86_64__)
    _mm_pause();
#endif
}

static void take_units(const product *p) {
    for (int u; (u = __atomic_fetch_add(&next_unit, 1, __ATOMIC_RELAXED)) < p->units;)
        run_unit(p, u);
}

static long microseconds(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return now.tv_sec * 1000000L + now.tv_nsec / 1000;
}

/* Waits a little for `*word` to leave `value`, spinning; then gives the core to another thread each time round. */
static void await_change(const int *word, int value, long spin_us) {
    long until = microseconds() + spin_us;
    for (int round = 1; __atomic_load_n(word, __ATOMIC_ACQUIRE) == value; round++) {
        relax();
        if (round % 64 == 0 && microseconds() > until)
            sched_yield();
    }
}

static void *helper(void *unused) {
    (void)unused;
    int seen = __atomic_load_n(&posted, __ATOMIC_ACQUIRE);
    for (;;) {
        long until = microseconds() + onelane_helper_spin_us;
        for (int round = 1; __atomic_load_n(&posted, __ATOMIC_ACQUIRE) == seen; round++) {
            relax();
            if (round % 64 != 0 || microseconds() < until)
                continue;
            __atomic_store_n(&sleeping, 1, __ATOMIC_SEQ_CST);
            if (__atomic_load_n(&posted, __ATOMIC_SEQ_CST) == seen)
                futex(&posted, FUTEX_WAIT_PRIVATE, seen);
            __atomic_store_n(&sleeping, 0, __ATOMIC_RELAXED);
        }
        seen = __atomic_load_n(&posted, __ATOMIC_ACQUIRE);
        int expected = POSTED;
        if (__atomic_compare_exchange_n(&state, &expected, TAKEN, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            take_units(shared);
            __atomic_store_n(&state, DONE, __ATOMIC_RELEASE);
        }
    }
    return 0;
}

static void helper_gone(void) { helper_started = 0; } /* in a child after fork(): the helper thread is not there */
static void watch_forks(void) { pthread_atfork(0, 0, helper_gone); }

static int start_helper(void) {
    if (helper_started)
        return 1;
    if (helper_failed)
        return 0;
    pthread_once(&helper_forks, watch_forks);
    pthread_t thread;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old); /* signals go to the process's own threads, not to the helper */
    helper_failed = pthread_create(&thread, &attr, helper, 0) != 0;
    pthread_sigmask(SIG_SETMASK, &old, 0);
    pthread_attr_destroy(&attr);
    helper_started = !helper_failed;
    return helper_started;
}

static void multiply(const product *p) {
    long work = (long)p->m * p->n * p->k;
    if (onelane_threads < 2 || p->units < 2 || work < (1L << 16) || pthread_mutex_trylock(&sharing) != 0) {
        for (int u = 0; u < p->units; u++)
            run_unit(p, u);
        return;
    }
    if (!start_helper()) {
        pthread_mutex_unlock(&sharing);
        for (int u = 0; u < p->units; u++)
            run_unit(p, u);
        return;
    }
    shared = p;
    __atomic_add_fetch(&onelane_products_shared, 1, __ATOMIC_RELAXED);
    __atomic_store_n(&next_unit, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&state, POSTED, __ATOMIC_RELEASE);
    __atomic_add_fetch(&posted, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&sleeping, __ATOMIC_SEQ_CST))
        futex(&posted, FUTEX_WAKE_PRIVATE, 1);
    take_units(p);
    int expected = POSTED;
    if (!__atomic_compare_exchange_n(&state, &expected, IDLE, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        await_change(&state, TAKEN, 50); /* the helper's last unit */
    __atomic_store_n(&state, IDLE, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&sharing);
}

/* op(A) op(B) for a row-major product; 0 when this kernel does not take it (then OpenBLAS does). */
static int own_product(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a, int lda,
                       const float *b, int ldb, float beta, float *c, int ldc) {
    if (m < 1 || m > onelane_gemv_max_rows || n < 1 || k < 1 || (trans_a != NO_TRANS && trans_a != TRANS) ||
        (trans_b != NO_TRANS && trans_b != TRANS))
        return 0;
    float *rows = 0;
    if (trans_a == TRANS) { /* op(A) row i is column i of A: copied into rows, k long */
        rows = malloc(sizeof(float) * m * k);
        if (rows == 0)
            return 0;
        for (int t = 0; t < k; t++)
            for (int i = 0; i < m; i++)
                rows[(long)i * k + t] = a[(long)t * lda + i];
        a = rows;
        lda = k;
    }
    for (int i = 0; i < m; i += BLOCK_ROWS) { /* rows of A a block at a time: each block's rows stay in the cache */
        product p = {.m = m - i < BLOCK_ROWS ? m - i : BLOCK_ROWS, .n = n, .k = k, .trans_b = trans_b == TRANS,
                     .alpha = alpha, .beta = beta, .a = a + (long)i * lda, .b = b, .lda = lda, .ldb = ldb, .ldc = ldc,
                     .c = c + (long)i * ldc, .panel = trans_b == TRANS ? PANEL_T : PANEL_N};
        p.units = (n + p.panel - 1) / p.panel;
        multiply(&p);
    }
    free(rows);
    __atomic_add_fetch(&onelane_gemv_rows, m, __ATOMIC_RELAXED);
    return 1;
}

void cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a, int lda,
                 const float *b, int ldb, float beta, float *c, int ldc) {
    begin();
    if (order != ROW_MAJOR || !own_product(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc))
        next_sgemm(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    end();
}

void cblas_dgemm(int order, int trans_a, int trans_b, int m, int n, int k, double alpha, const double *a, int lda,
                 const double *b, int ldb, double beta, double *c, int ldc) {
    begin();
    next_dgemm(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    end();
}

void cblas_cgemm(int order, int trans_a, int trans_b, int m, int n, int k, const void *alpha, const void *a, int lda,
                 const void *b, int ldb, const void *beta, void *c, int ldc) {
    begin();
    next_cgemm(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    end();
}
