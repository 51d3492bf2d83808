/* The machine's int8 dot-product peak, several ways, each thread running
 * independent chains so that the rate, not the latency, is measured:
 *   vnni     24 chains of 512-bit vpdpbusd (AVX512-VNNI), the instruction attend's
 *            int8 product multiplies with: 16 lanes x 4 byte products, 128 ops;
 *   avxvnni  12 chains of 256-bit vpdpbusd (AVX-VNNI), attend's avx2vnni level:
 *            8 lanes x 4 byte products, 64 ops.
 * The AVX2 ways run in the shape of attend's 16-register tile (3 rows x the two
 * halves of a panel, 6 chains; STEP below), each product on its own inputs:
 *   avx2     attend's int8 step without VNNI (Simd::dot4 on AVX2): the bytes
 *            widened to 16 bits, even and odd apart, two vpmaddwd and two adds
 *            per 8 lanes x 4 products (64 ops);
 *   maddubs  the u8 x s8 pair (vpmaddubsw, vpmaddwd by ones, vpaddd), which
 *            saturates on bytes of 255 x 127 and which ONNX Runtime's AVX2 kernels
 *            use; attend's narrowed AVX2 step (Simd::dot4_narrow, weights of +-63,
 *            which cannot saturate) runs it in a 6-row tile;
 *   exact    the same pair kept exact: the unsigned bytes split into a >> 1 and
 *            a - (a >> 1) (each <= 128, so 2 x 128 x 127 fits i16), each half
 *            through vpmaddubsw and vpmaddwd, then two adds;
 *   avxvnni_tile  vpdpbusd (AVX-VNNI) in that tile: its 6 chains are fewer than
 *            the instruction's latency times its rate;
 *   pairs    attend's int8 step without VNNI since the weights are widened to
 *            16 bits at load: 6 rows (a pair of 16-bit inputs broadcast) x the two
 *            halves of a panel of 16-bit weight pairs, 12 chains of one vpmaddwd
 *            and one vpaddd per 8 lanes x 2 products (32 ops), nothing widened in
 *            the loop: measured level with avx2 (one vpmaddwd a cycle bounds
 *            both), so attend does not widen its weights at load;
 *   amx      AMX's tdpbusd on four independent accumulator tiles (16 rows x 16
 *            lanes x 64 byte products each, 32,768 ops), the tiles' operands
 *            already loaded: attend's amx level (Intel Sapphire Rapids on).
 * An op is a multiply or an add (a byte product and its sum: 2 ops), as a flop.
 *
 *   gcc -O2 -mavx512f -mavx512bw -mavx512vnni -mavxvnni -mavx2 -pthread -o int8_peak int8_peak.c
 *   ./int8_peak vnni|avxvnni|avx2|maddubs|exact|avxvnni_tile|pairs|amx [THREADS]
 *
 * Prints one JSON line: what, threads, GOP/s. */
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

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

#define AVXVNNI(x) x = _mm256_dpbusd_avx_epi32(x, p, q);
static void *avxvnni(void *out) {
  __m256i p = _mm256_set1_epi32(0x01010101), q = p;
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0;
  __m256i a6 = a0, a7 = a0, a8 = a0, a9 = a0, a10 = a0, a11 = a0;
  for (long i = 0; i < ITERS / 2; i++) {
    AVXVNNI(a0) AVXVNNI(a1) AVXVNNI(a2) AVXVNNI(a3) AVXVNNI(a4) AVXVNNI(a5)
    AVXVNNI(a6) AVXVNNI(a7) AVXVNNI(a8) AVXVNNI(a9) AVXVNNI(a10) AVXVNNI(a11)
    __asm__ volatile("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5),
                     "+x"(a6), "+x"(a7), "+x"(a8), "+x"(a9), "+x"(a10), "+x"(a11));
  }
  __m256i s = _mm256_add_epi32(_mm256_add_epi32(a0, a11), _mm256_add_epi32(a5, a6));
  *(int *)out = _mm256_extract_epi32(s, 0);
  return NULL;
}

/* The AVX2 steps as attend's tile runs them on 16 registers: 3 rows of x (each
 * quad broadcast) against the two halves of one 16-output panel, 6 accumulators;
 * a row's bytes are prepared once per step (shared by both halves) and a half's
 * once (shared by the 3 rows). The inputs pass an empty asm each step, so that no
 * product is computed once for several chains or hoisted out of the loop. */
#define STEP(PREP_ROW, PREP_HALF, PRODUCT)                                         \
  __m256i x0 = _mm256_set1_epi32(0x01010101), x1 = x0, x2 = x0;                    \
  __m256i w0 = x0, w1 = x0;                                                        \
  __m256i c00 = _mm256_setzero_si256(), c01 = c00, c10 = c00, c11 = c00;           \
  __m256i c20 = c00, c21 = c00;                                                    \
  for (long i = 0; i < ITERS / 2; i++) {                                           \
    __asm__ volatile("" : "+x"(x0), "+x"(x1), "+x"(x2), "+x"(w0), "+x"(w1));       \
    PREP_ROW(0) PREP_ROW(1) PREP_ROW(2) PREP_HALF(0) PREP_HALF(1)                  \
    PRODUCT(0, 0) PRODUCT(0, 1) PRODUCT(1, 0) PRODUCT(1, 1) PRODUCT(2, 0)          \
    PRODUCT(2, 1)                                                                  \
  }                                                                                \
  __m256i s = _mm256_add_epi32(_mm256_add_epi32(c00, c01),                         \
                               _mm256_add_epi32(_mm256_add_epi32(c10, c11),        \
                                                _mm256_add_epi32(c20, c21)));      \
  *(int *)out = _mm256_extract_epi32(s, 0);                                        \
  return NULL;
/* 6 accumulators x 8 lanes x 4 byte products x 2 ops per loop trip. */
#define STEP_OPS (6 * 64.0)

/* attend's AVX2 dot4: the bytes widened to 16 bits, even and odd apart, two
 * vpmaddwd and two adds per 8 lanes x 4 products. */
#define WIDEN_ROW(r)                                                               \
  __m256i xe##r = _mm256_and_si256(x##r, _mm256_set1_epi16(0xFF));                 \
  __m256i xo##r = _mm256_srli_epi16(x##r, 8);
#define WIDEN_HALF(h)                                                              \
  __m256i we##h = _mm256_srai_epi16(_mm256_slli_epi16(w##h, 8), 8);                \
  __m256i wo##h = _mm256_srai_epi16(w##h, 8);
#define WIDEN(r, h)                                                                \
  c##r##h = _mm256_add_epi32(c##r##h, _mm256_add_epi32(_mm256_madd_epi16(xe##r, we##h), \
                                                       _mm256_madd_epi16(xo##r, wo##h)));
static void *avx2(void *out) { STEP(WIDEN_ROW, WIDEN_HALF, WIDEN) }

/* ONNX Runtime's pair, which saturates: vpmaddubsw, vpmaddwd by ones, vpaddd. */
#define NONE(r)
#define PAIR(r, h)                                                                 \
  c##r##h = _mm256_add_epi32(c##r##h, _mm256_madd_epi16(_mm256_maddubs_epi16(x##r, w##h), \
                                                       _mm256_set1_epi16(1)));
static void *maddubs(void *out) { STEP(NONE, NONE, PAIR) }

/* The same pair kept exact: the row's bytes split once per step. */
#define SPLIT_ROW(r)                                                               \
  __m256i lo##r = _mm256_and_si256(_mm256_srli_epi16(x##r, 1), _mm256_set1_epi8(0x7F)); \
  __m256i hi##r = _mm256_sub_epi8(x##r, lo##r);
#define EXACT(r, h)                                                                \
  c##r##h = _mm256_add_epi32(                                                      \
      c##r##h,                                                                     \
      _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(lo##r, w##h), _mm256_set1_epi16(1)), \
                       _mm256_madd_epi16(_mm256_maddubs_epi16(hi##r, w##h), _mm256_set1_epi16(1))));
static void *exact(void *out) { STEP(SPLIT_ROW, NONE, EXACT) }

/* AVX-VNNI in the same tile: one vpdpbusd per 8 lanes x 4 products. */
#define DPBUSD(r, h) c##r##h = _mm256_dpbusd_avx_epi32(c##r##h, x##r, w##h);
static void *avxvnni_tile(void *out) { STEP(NONE, NONE, DPBUSD) }

/* 6 rows x 2 halves of 16-bit pairs: vpmaddwd and vpaddd, 12 chains. */
#define PAIRS(r) \
  c##r##0 = _mm256_add_epi32(c##r##0, _mm256_madd_epi16(x##r, w0)); \
  c##r##1 = _mm256_add_epi32(c##r##1, _mm256_madd_epi16(x##r, w1));
static void *pairs(void *out) {
  __m256i x0 = _mm256_set1_epi32(0x00010001), x1 = x0, x2 = x0, x3 = x0, x4 = x0, x5 = x0;
  __m256i w0 = x0, w1 = x0;
  __m256i c00 = _mm256_setzero_si256(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
  __m256i c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  for (long i = 0; i < ITERS / 2; i++) {
    __asm__ volatile("" : "+x"(x0), "+x"(x1), "+x"(x2), "+x"(w0), "+x"(w1));
    __asm__ volatile("" : "+x"(x3), "+x"(x4), "+x"(x5));
    PAIRS(0) PAIRS(1) PAIRS(2) PAIRS(3) PAIRS(4) PAIRS(5)
  }
  __m256i s = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(c00, c01), _mm256_add_epi32(c10, c11)),
                               _mm256_add_epi32(_mm256_add_epi32(c20, c21), _mm256_add_epi32(c30, c31)));
  s = _mm256_add_epi32(s, _mm256_add_epi32(_mm256_add_epi32(c40, c41), _mm256_add_epi32(c50, c51)));
  *(int *)out = _mm256_extract_epi32(s, 0);
  return NULL;
}
/* ldtilecfg's operand: palette 1, eight tiles of 16 rows x 64 bytes. */
struct tile_config {
  unsigned char palette, start_row, reserved[14];
  unsigned short bytes_per_row[16];
  unsigned char rows[16];
} __attribute__((aligned(64)));

static void *amx(void *out) {
  struct tile_config c = {.palette = 1};
  for (int i = 0; i < 8; i++) c.bytes_per_row[i] = 64, c.rows[i] = 16;
  __asm__ volatile("ldtilecfg %0" ::"m"(c));
  __asm__ volatile("tilezero %%tmm4\n\ttilezero %%tmm5\n\ttilezero %%tmm6\n\ttilezero %%tmm7" ::);
  for (long i = 0; i < ITERS / 8; i++)
    __asm__ volatile("tdpbusd %%tmm6, %%tmm4, %%tmm0\n\t"
                     "tdpbusd %%tmm7, %%tmm4, %%tmm1\n\t"
                     "tdpbusd %%tmm6, %%tmm5, %%tmm2\n\t"
                     "tdpbusd %%tmm7, %%tmm5, %%tmm3" ::);
  __asm__ volatile("tilerelease" ::);
  *(int *)out = 0;
  return NULL;
}

/* 12 accumulators x 8 lanes x 2 products x 2 ops per loop trip. */
#define PAIRS_OPS (12 * 32.0)

int main(int argc, char **argv) {
  const char *what = argc > 1 ? argv[1] : "vnni";
  int threads = argc > 2 ? atoi(argv[2]) : 1;
  void *(*work)(void *);
  double ops_per_iter; /* per ITERS/2 loop trip */
  if (strcmp(what, "vnni") == 0) {
    work = vnni, ops_per_iter = 24 * 128.0;
  } else if (strcmp(what, "avxvnni") == 0) {
    work = avxvnni, ops_per_iter = 12 * 64.0;
  } else if (strcmp(what, "avxvnni_tile") == 0) {
    work = avxvnni_tile, ops_per_iter = STEP_OPS;
  } else if (strcmp(what, "exact") == 0) {
    work = exact, ops_per_iter = STEP_OPS;
  } else if (strcmp(what, "avx2") == 0) {
    work = avx2, ops_per_iter = STEP_OPS;
  } else if (strcmp(what, "maddubs") == 0) {
    work = maddubs, ops_per_iter = STEP_OPS;
  } else if (strcmp(what, "pairs") == 0) {
    work = pairs, ops_per_iter = PAIRS_OPS;
  } else if (strcmp(what, "amx") == 0) {
    /* ITERS / 8 trips of four tile products: a quarter of the trips below. */
    work = amx, ops_per_iter = 4 * 32768.0 / 4;
    /* The tile data state, which Linux grants a process only when asked
       (ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA). */
    if (syscall(SYS_arch_prctl, 0x1023, 18) != 0) {
      fprintf(stderr, "error: the kernel did not grant the AMX tile state\n");
      return 2;
    }
  } else {
    fprintf(stderr, "error: unknown peak %s (vnni, avxvnni, avx2, maddubs, exact, avxvnni_tile, pairs or amx)\n", what);
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
