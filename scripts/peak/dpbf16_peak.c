/* The machine's bf16 dot-product peak: each thread runs 12 independent chains of
 * 512-bit vdpbf16ps (AVX512-BF16), the instruction attend's bf16 kernels multiply
 * with. Each instruction does 2 multiply-adds in each of 16 lanes: 64 flops.
 *
 *   gcc -O2 -mavx512f -mavx512bf16 -pthread -o dpbf16_peak dpbf16_peak.c && ./dpbf16_peak 2
 *
 * Prints one JSON line: threads, GFLOP/s. Compare with scripts/peak/fma_peak.c (the
 * f32 FMA peak): bf16 is counted as twice that, which this measures. */
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define ITERS 200000000L

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

/* One chain step; the asm barrier keeps each chain in its register. */
#define STEP(x) x = _mm512_dpbf16_ps(x, p, q);
static void *work(void *out) {
  __m512bh p = (__m512bh)_mm512_set1_epi32(0x3f803f80), q = p; /* pairs (1, 1) */
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0;
  __m512 a6 = a0, a7 = a0, a8 = a0, a9 = a0, a10 = a0, a11 = a0;
  for (long i = 0; i < ITERS; i++) {
    STEP(a0) STEP(a1) STEP(a2) STEP(a3) STEP(a4) STEP(a5)
    STEP(a6) STEP(a7) STEP(a8) STEP(a9) STEP(a10) STEP(a11)
    __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5),
                     "+v"(a6), "+v"(a7), "+v"(a8), "+v"(a9), "+v"(a10), "+v"(a11));
  }
  __m512 s = _mm512_add_ps(_mm512_add_ps(a0, a11), _mm512_add_ps(a5, a6));
  *(float *)out = _mm512_reduce_add_ps(s);
  return NULL;
}

int main(int argc, char **argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 1;
  if (threads < 1 || threads > 256) {
    fprintf(stderr, "error: threads must be 1 to 256\n");
    return 2;
  }
  pthread_t t[256];
  float sink[256];
  double t0 = now();
  for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, work, &sink[i]);
  for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
  double s = now() - t0;
  double flops = (double)threads * ITERS * 12 * 64;
  printf("{\"what\": \"dpbf16_peak\", \"threads\": %d, \"gflops\": %.1f, \"seconds\": %.3f, \"sink\": %g}\n",
         threads, flops / s / 1e9, s, sink[0]);
  return 0;
}
