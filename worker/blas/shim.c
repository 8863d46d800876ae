/* Preloaded ahead of OpenBLAS into the worker (worker/blas/ builds it). Two things, both about the OpenBLAS that
 * Debian 12 ships (0.3.21):
 *
 * 1. Fork safety. OpenBLAS stops its thread pool before every fork() (a pthread_atfork handler), even while another
 *    thread is in the middle of a product that the pool is working on: that thread then waits for ever (seen: an
 *    MLX stream thread spinning in exec_blas_async; tests/test_blas.py forks under a running product). Every
 *    product here holds `products` for reading, and a fork holds it for writing: it waits for the products under
 *    way, and new ones wait for it. Our handler is registered after OpenBLAS's (on the first product, long after
 *    OpenBLAS's constructor), so it runs before OpenBLAS's at a fork.
 *
 * 2. Products of a few rows through the matrix-vector routine. MLX's CPU backend sends every matrix product to
 *    cblas_sgemm, and OpenBLAS before 0.3.27 packs the whole of B for it even when A has a single row: decoding one
 *    sequence, every weight matrix is copied before it is read, and a step takes twice as long as reading the weights
 *    does. A product of at most onelane_gemv_max_rows rows goes to cblas_sgemv, one call a row (what newer OpenBLAS
 *    does itself for one row: GEMM_GEMV_FORWARD). The same products, summed in another order: the last bits of a
 *    float32 result may differ. The worker sets the limit to 0 when ONELANE_GEMV is false.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>

enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };

typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int, const float *, int, float, float *,
                         int);
typedef void (*dgemm_fn)(int, int, int, int, int, int, double, const double *, int, const double *, int, double,
                         double *, int);
typedef void (*cgemm_fn)(int, int, int, int, int, int, const void *, const void *, int, const void *, int,
                         const void *, void *, int);
typedef void (*sgemv_fn)(int, int, int, int, float, const float *, int, const float *, int, float, float *, int);

static sgemm_fn next_sgemm;
static dgemm_fn next_dgemm;
static cgemm_fn next_cgemm;
static sgemv_fn next_sgemv;
int onelane_gemv_max_rows = 4; /* measured on the default model's shapes: 1 to 4 rows are faster as sgemv, 8 not */
long onelane_gemv_rows;        /* the rows sent to sgemv so far (the tests read it) */
long onelane_forks_held;       /* the forks that waited for products to finish (the tests read it) */

static pthread_rwlock_t products = PTHREAD_RWLOCK_WRITER_NONRECURSIVE_INITIALIZER_NP; /* a fork is not starved */
static pthread_once_t fork_guard = PTHREAD_ONCE_INIT;

static void before_fork(void) {
    pthread_rwlock_wrlock(&products);
    __atomic_add_fetch(&onelane_forks_held, 1, __ATOMIC_RELAXED);
}
static void after_fork(void) { pthread_rwlock_unlock(&products); }
static void guard_forks(void) { pthread_atfork(before_fork, after_fork, after_fork); }

static void begin(void) {
    pthread_once(&fork_guard, guard_forks);
    pthread_rwlock_rdlock(&products);
}
static void end(void) { pthread_rwlock_unlock(&products); }

__attribute__((constructor)) static void find_blas(void) {
    next_sgemm = (sgemm_fn)dlsym(RTLD_NEXT, "cblas_sgemm");
    next_dgemm = (dgemm_fn)dlsym(RTLD_NEXT, "cblas_dgemm");
    next_cgemm = (cgemm_fn)dlsym(RTLD_NEXT, "cblas_cgemm");
    next_sgemv = (sgemv_fn)dlsym(RTLD_NEXT, "cblas_sgemv");
}

static void rows_through_sgemv(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a, int lda,
                               const float *b, int ldb, float beta, float *c, int ldc) {
    for (int i = 0; i < m; i++) {
        /* row i of C = alpha * (row i of op(A)) op(B) + beta * (row i of C); op(A) row i is strided when A is stored
           transposed; op(B) stored k x n is read transposed, stored n x k (transposed) as it is */
        const float *x = trans_a == TRANS ? a + i : a + (long)i * lda;
        int incx = trans_a == TRANS ? lda : 1;
        if (trans_b == TRANS)
            next_sgemv(ROW_MAJOR, NO_TRANS, n, k, alpha, b, ldb, x, incx, beta, c + (long)i * ldc, 1);
        else
            next_sgemv(ROW_MAJOR, TRANS, k, n, alpha, b, ldb, x, incx, beta, c + (long)i * ldc, 1);
    }
    __atomic_add_fetch(&onelane_gemv_rows, m, __ATOMIC_RELAXED);
}

void cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a, int lda,
                 const float *b, int ldb, float beta, float *c, int ldc) {
    begin();
    if (order == ROW_MAJOR && m >= 1 && m <= onelane_gemv_max_rows && n >= 1 && k >= 1 && next_sgemv != 0)
        rows_through_sgemv(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    else
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
