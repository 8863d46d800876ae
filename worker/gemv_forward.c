/* Products of a few rows through OpenBLAS's matrix-vector routine (worker/blas.py builds and preloads this).
 *
 * MLX's CPU backend sends every matrix product to cblas_sgemm, and OpenBLAS before 0.3.27 (Debian 12 ships 0.3.21)
 * packs the whole of B for it even when A has a single row: decoding one sequence, every weight matrix is copied
 * before it is read, and a step takes twice as long as reading the weights does. Preloaded ahead of OpenBLAS, this
 * cblas_sgemm sends a product of at most MAX_ROWS rows to cblas_sgemv, one call a row, and any other to OpenBLAS's
 * own cblas_sgemm (what newer OpenBLAS does itself for one row: GEMM_GEMV_FORWARD). The products are the same,
 * summed in another order: the last bits of a float32 result may differ.
 */
#define _GNU_SOURCE
#include <dlfcn.h>

enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };
enum { MAX_ROWS = 4 }; /* measured on the default model's shapes: 1 to 4 rows are faster as sgemv calls, 8 are not */

typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int, const float *, int, float, float *,
                         int);
typedef void (*sgemv_fn)(int, int, int, int, float, const float *, int, const float *, int, float, float *, int);

static sgemm_fn next_sgemm;
static sgemv_fn next_sgemv;
long onelane_gemv_rows; /* the rows sent to sgemv so far (the tests read it) */

__attribute__((constructor)) static void find_blas(void) {
    next_sgemm = (sgemm_fn)dlsym(RTLD_NEXT, "cblas_sgemm");
    next_sgemv = (sgemv_fn)dlsym(RTLD_NEXT, "cblas_sgemv");
}

void cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a, int lda,
                 const float *b, int ldb, float beta, float *c, int ldc) {
    if (order != ROW_MAJOR || m < 1 || m > MAX_ROWS || n < 1 || k < 1 || next_sgemv == 0) {
        next_sgemm(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
    }
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
