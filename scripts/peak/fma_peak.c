/* The f32 fused multiply-add peak of this CPU: every thread runs independent chains
 * of vector FMAs (as wide as the compiler flags allow: AVX-512, else AVX2) for
 * a second or two; the peak is the FLOPs of all threads over the wall time.
 *
 *   gcc -O2 -march=native -pthread -o target/fma_peak scripts/peak/fma_peak.c
 *   target/fma_peak THREADS
 *
 * Prints one JSON line: {"what": "fma_peak", "threads", "lanes", "gflops", "seconds"}.
 * scripts/peak/fma-peak builds and runs it; the benchmarks quote shares of its figure.
 */
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#if defined(__AVX512F__)
typedef __m512 vec;
#define LANES 16
#define SPLAT _mm512_set1_ps
#define FMA _mm512_fmadd_ps
#define ADD _mm512_add_ps
#define FIRST(v) _mm512_cvtss_f32(v)
#elif defined(__FMA__)
typedef __m256 vec;
#define LANES 8
#define SPLAT _mm256_set1_ps
#define FMA _mm256_fmadd_ps
#define ADD _mm256_add_ps
#define FIRST(v) _mm256_cvtss_f32(v)
#else
#error "needs FMA: compile with -march=native on a CPU that has it"
#endif

/* Chains per thread: two FMA pipes with a latency of 4 cycles need 8 in flight;
 * 12 leave room for a CPU with a longer latency. */
#define CHAINS 12
#define ITERS 300000000L

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void *chains(void *out) {
    vec acc[CHAINS];
    const vec a = SPLAT(0.999999f), b = SPLAT(1e-7f);
    _Pragma("GCC unroll 16")
    for (int c = 0; c < CHAINS; c++) acc[c] = SPLAT((float)c);
    for (long i = 0; i < ITERS; i++) {
        /* Unrolled, the chains live in registers. Without -ffast-math the compiler
         * may not reassociate them, and their sum is stored below, so none is
         * merged or dropped. */
        _Pragma("GCC unroll 16")
        for (int c = 0; c < CHAINS; c++) acc[c] = FMA(acc[c], a, b);
    }
    vec sum = acc[0];
    _Pragma("GCC unroll 16")
    for (int c = 1; c < CHAINS; c++) sum = ADD(sum, acc[c]);
    *(float *)out = FIRST(sum);
    return NULL;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    if (threads < 1 || threads > 1024) {
        fprintf(stderr, "usage: fma_peak THREADS (1 to 1024)\n");
        return 2;
    }
    pthread_t *ts = malloc(sizeof *ts * threads);
    float *sink = malloc(sizeof *sink * threads);
    double t0 = now();
    for (int t = 0; t < threads; t++) pthread_create(&ts[t], NULL, chains, &sink[t]);
    for (int t = 0; t < threads; t++) pthread_join(ts[t], NULL);
    double secs = now() - t0;
    double flops = 2.0 * LANES * CHAINS * (double)ITERS * threads;
    printf("{\"what\": \"fma_peak\", \"threads\": %d, \"lanes\": %d, \"gflops\": %.1f, "
           "\"seconds\": %.3f}\n", threads, LANES, flops / secs / 1e9, secs);
    free(ts);
    free(sink);
    return 0;
}
