/* The machine's int8 dot-product peak, three ways, each thread running independent
 * chains so that the rate, not the latency, is measured:
 *   vnni     24 chains of 512-bit vpdpbusd (AVX512-VNNI), the instruction attend's
 *            int8 product multiplies with: 16 lanes x 4 byte products, 128 ops;
 *   avx2     attend's int8 step without VNNI (Simd::dot4 on AVX2): the bytes
 *            widened to 16 bits, even and odd apart, two vpmaddwd and two adds
 *            per 8 lanes x 4 products (64 ops), 8 chains;
 *   maddubs  the u8 x s8 pair that saturates (vpmaddubsw, vpmaddwd by ones,
 *            vpaddd: 64 ops per 256 bits), which ONNX Runtime's AVX2 kernels use,
 *            8 chains: the rate attend's exact widening gives up.
 * An op is a multiply or an add (a byte product and its sum: 2 ops), as a flop.
 *
 *   gcc -O2 -mavx512f -mavx512bw -mavx512vnni -mavx2 -pthread -o int8_peak int8_peak.c
 *   ./int8_peak vnni|avx2|maddubs [THREADS]
 *
 * Prints one JSON line: what, threads, GOP/s. */
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ITERS 100000000L

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

#define VNNI(x) x = _mm512_dpbusd_epi32(x, p, q);
static void *vnni(void *out) {
  __m512i p = _mm512_set1_epi32(0x01010101), q = p;
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0;
  __m512i a6 = a0, a7 = a0, a8 = a0, a9 = a0, a10 = a0, a11 = a0;
  __m512i b0 = a0, b1 = a0, b2 = a0, b3 = a0, b4 = a0, b5 = a0;
  __m512i b6 = a0, b7 = a0, b8 = a0, b9 = a0, b10 = a0, b11 = a0;
  for (long i = 0; i < ITERS / 2; i++) {
    VNNI(a0) VNNI(a1) VNNI(a2) VNNI(a3) VNNI(a4) VNNI(a5)
    VNNI(a6) VNNI(a7) VNNI(a8) VNNI(a9) VNNI(a10) VNNI(a11)
    VNNI(b0) VNNI(b1) VNNI(b2) VNNI(b3) VNNI(b4) VNNI(b5)
    VNNI(b6) VNNI(b7) VNNI(b8) VNNI(b9) VNNI(b10) VNNI(b11)
    __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5),
                     "+v"(a6), "+v"(a7), "+v"(a8), "+v"(a9), "+v"(a10), "+v"(a11));
    __asm__ volatile("" : "+v"(b0), "+v"(b1), "+v"(b2), "+v"(b3), "+v"(b4), "+v"(b5),
                     "+v"(b6), "+v"(b7), "+v"(b8), "+v"(b9), "+v"(b10), "+v"(b11));
  }
  __m512i s = _mm512_add_epi32(_mm512_add_epi32(a0, a11), _mm512_add_epi32(b5, b6));
  *(int *)out = _mm512_reduce_add_epi32(s);
  return NULL;
}

/* attend's AVX2 dot4: the broadcast row's bytes are widened once per step (shared
 * by the tile's panels), the panel's per product, as the kernel does. */
#define WIDEN(x)                                                                   \
  {                                                                                \
    __m256i be = _mm256_srai_epi16(_mm256_slli_epi16(w, 8), 8);                    \
    __m256i bo = _mm256_srai_epi16(w, 8);                                          \
    x = _mm256_add_epi32(x, _mm256_add_epi32(_mm256_madd_epi16(ae, be),            \
                                             _mm256_madd_epi16(ao, bo)));          \
  }
static void *avx2(void *out) {
  __m256i a = _mm256_set1_epi32(0x01010101), w = a;
  __m256i ae = _mm256_and_si256(a, _mm256_set1_epi16(0xFF)), ao = _mm256_srli_epi16(a, 8);
  __m256i c0 = _mm256_setzero_si256(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0;
  __m256i c6 = c0, c7 = c0;
  for (long i = 0; i < ITERS / 2; i++) {
    WIDEN(c0) WIDEN(c1) WIDEN(c2) WIDEN(c3) WIDEN(c4) WIDEN(c5) WIDEN(c6) WIDEN(c7)
    __asm__ volatile("" : "+x"(c0), "+x"(c1), "+x"(c2), "+x"(c3), "+x"(c4), "+x"(c5),
                     "+x"(c6), "+x"(c7), "+x"(w));
  }
  __m256i s = _mm256_add_epi32(_mm256_add_epi32(c0, c7), _mm256_add_epi32(c3, c4));
  *(int *)out = _mm256_extract_epi32(s, 0);
  return NULL;
}

#define PAIR(x) x = _mm256_add_epi32(x, _mm256_madd_epi16(_mm256_maddubs_epi16(a, w), ones));
static void *maddubs(void *out) {
  __m256i a = _mm256_set1_epi32(0x01010101), w = a, ones = _mm256_set1_epi16(1);
  __m256i c0 = _mm256_setzero_si256(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0;
  __m256i c6 = c0, c7 = c0;
  for (long i = 0; i < ITERS / 2; i++) {
    PAIR(c0) PAIR(c1) PAIR(c2) PAIR(c3) PAIR(c4) PAIR(c5) PAIR(c6) PAIR(c7)
    __asm__ volatile("" : "+x"(c0), "+x"(c1), "+x"(c2), "+x"(c3), "+x"(c4), "+x"(c5),
                     "+x"(c6), "+x"(c7), "+x"(w));
  }
  __m256i s = _mm256_add_epi32(_mm256_add_epi32(c0, c7), _mm256_add_epi32(c3, c4));
  *(int *)out = _mm256_extract_epi32(s, 0);
  return NULL;
}

int main(int argc, char **argv) {
  const char *what = argc > 1 ? argv[1] : "vnni";
  int threads = argc > 2 ? atoi(argv[2]) : 1;
  void *(*work)(void *);
  double ops_per_iter; /* per ITERS/2 loop trip */
  if (strcmp(what, "vnni") == 0) {
    work = vnni, ops_per_iter = 24 * 128.0;
  } else if (strcmp(what, "avx2") == 0) {
    work = avx2, ops_per_iter = 8 * 64.0;
  } else if (strcmp(what, "maddubs") == 0) {
    work = maddubs, ops_per_iter = 8 * 64.0;
  } else {
    fprintf(stderr, "error: unknown peak %s (vnni, avx2 or maddubs)\n", what);
    return 2;
  }
  if (threads < 1 || threads > 256) {
    fprintf(stderr, "error: threads must be 1 to 256\n");
    return 2;
  }
  pthread_t t[256];
  int sink[256];
  double t0 = now();
  for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, work, &sink[i]);
  for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
  double s = now() - t0;
  double ops = (double)threads * (ITERS / 2) * ops_per_iter;
  printf("{\"what\": \"int8_peak_%s\", \"threads\": %d, \"gops\": %.1f, \"seconds\": %.3f, \"sink\": %d}\n",
         what, threads, ops / s / 1e9, s, sink[0]);
  return 0;
}
