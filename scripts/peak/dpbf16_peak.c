/* The machine's bf16 dot-product peak: each thread runs 24 independent chains of
 * 512-bit vdpbf16ps (AVX512-BF16), the instruction attend's bf16 kernels multiply
 * with. Each instruction does 2 multiply-adds in each of 16 lanes: 64 flops.
 * Twelve chains were enough on Zen 4; on Zen 5, whose 512-bit pipes are full
 * width, they left it latency-bound at 1.84-1.87x the f32 FMA peak (24: 2.00x,
 * as many chains as attend's bf16 register blocks have accumulators).
 *
 * With "amx" it measures AMX's tdpbf16ps instead (attend's amx level: the bf16
 * dense products), on four independent accumulator tiles of 16 rows x 16 f32 sums
 * fed by two tiles of rows and two of pairs already loaded: 16 x 16 x 32 products,
 * 16384 flops, an instruction.
 *
 *   gcc -O2 -mavx512f -mavx512bf16 -pthread -o dpbf16_peak dpbf16_peak.c && ./dpbf16_peak 2 [amx]
 *
 * Prints one JSON line: threads, GFLOP/s. Compare with scripts/peak/fma_peak.c (the
 * f32 FMA peak): bf16 is counted as twice that, which this measures. */
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

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
  __m512 b0 = a0, b1 = a0, b2 = a0, b3 = a0, b4 = a0, b5 = a0;
  __m512 b6 = a0, b7 = a0, b8 = a0, b9 = a0, b10 = a0, b11 = a0;
  for (long i = 0; i < ITERS / 2; i++) {
    STEP(a0) STEP(a1) STEP(a2) STEP(a3) STEP(a4) STEP(a5)
    STEP(a6) STEP(a7) STEP(a8) STEP(a9) STEP(a10) STEP(a11)
    STEP(b0) STEP(b1) STEP(b2) STEP(b3) STEP(b4) STEP(b5)
    STEP(b6) STEP(b7) STEP(b8) STEP(b9) STEP(b10) STEP(b11)
    __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5),
                     "+v"(a6), "+v"(a7), "+v"(a8), "+v"(a9), "+v"(a10), "+v"(a11));
    __asm__ volatile("" : "+v"(b0), "+v"(b1), "+v"(b2), "+v"(b3), "+v"(b4), "+v"(b5),
                     "+v"(b6), "+v"(b7), "+v"(b8), "+v"(b9), "+v"(b10), "+v"(b11));
  }
  __m512 s = _mm512_add_ps(_mm512_add_ps(a0, a11), _mm512_add_ps(b5, b6));
  *(float *)out = _mm512_reduce_add_ps(s);
  return NULL;
}

/* ldtilecfg's operand: palette 1, eight tiles of 16 rows x 64 bytes. */
struct tile_config {
  unsigned char palette, start_row, reserved[14];
  unsigned short bytes_per_row[16];
  unsigned char rows[16];
} __attribute__((aligned(64)));

/* ITERS / 8 trips of four tile products. */
static void *amx(void *out) {
  struct tile_config c = {.palette = 1};
  for (int i = 0; i < 8; i++) c.bytes_per_row[i] = 64, c.rows[i] = 16;
  __asm__ volatile("ldtilecfg %0" ::"m"(c));
  __asm__ volatile("tilezero %%tmm4\n\ttilezero %%tmm5\n\ttilezero %%tmm6\n\ttilezero %%tmm7" ::);
  for (long i = 0; i < ITERS / 8; i++)
    __asm__ volatile("tdpbf16ps %%tmm6, %%tmm4, %%tmm0\n\t"
                     "tdpbf16ps %%tmm7, %%tmm4, %%tmm1\n\t"
                     "tdpbf16ps %%tmm6, %%tmm5, %%tmm2\n\t"
                     "tdpbf16ps %%tmm7, %%tmm5, %%tmm3" ::);
  __asm__ volatile("tilerelease" ::);
  *(float *)out = 0;
  return NULL;
}

int main(int argc, char **argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 1;
  int tiles = argc > 2 && strcmp(argv[2], "amx") == 0;
  if (argc > 2 && !tiles) {
    fprintf(stderr, "error: unknown peak %s (only amx)\n", argv[2]);
    return 2;
  }
  /* The tile data state, which Linux grants a process only when asked
     (ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA). */
  if (tiles && syscall(SYS_arch_prctl, 0x1023, 18) != 0) {
    fprintf(stderr, "error: the kernel did not grant the AMX tile state\n");
    return 2;
  }
  if (threads < 1 || threads > 256) {
    fprintf(stderr, "error: threads must be 1 to 256\n");
    return 2;
  }
  pthread_t t[256];
  float sink[256];
  double t0 = now();
  for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, tiles ? amx : work, &sink[i]);
  for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
  double s = now() - t0;
  /* Per thread: ITERS / 2 trips of 24 vdpbf16ps (64 flops each), or ITERS / 8 of
     four tdpbf16ps (16384 each). */
  double flops = (double)threads * (tiles ? (ITERS / 8) * 4 * 16384.0 : (ITERS / 2) * 24 * 64.0);
  printf("{\"what\": \"%s\", \"threads\": %d, \"gflops\": %.1f, \"seconds\": %.3f, \"sink\": %g}\n",
         tiles ? "tdpbf16ps_peak" : "dpbf16_peak", threads, flops / s / 1e9, s, sink[0]);
  return 0;
}
