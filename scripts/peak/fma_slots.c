/* Which AVX-512 operations take the FMA pipes' slots on this CPU.
 *
 * Eight independent chains of 512-bit FMAs run alone, then beside four
 * independent chains of another operation; the time per eight FMAs shows whether
 * that operation competes with the FMAs for their pipes (its time added) or runs
 * on other pipes (the time unchanged). docs/fused-forward.md uses it to count
 * what the online softmax costs the fused forward.
 *
 *   gcc -O2 -march=native -o target/fma_slots scripts/peak/fma_slots.c && target/fma_slots
 *
 * One thread; needs AVX-512F. */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

#define ITERS 25000000L

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

/* `EXTRA` updates b0..b3; the empty asm statements keep every chain live and
 * stop the compiler from folding the constant operands. */
#define RUN(name, EXTRA)                                                       \
  {                                                                            \
    __m512 a0 = _mm512_set1_ps(1), a1 = a0, a2 = a0, a3 = a0, a4 = a0,         \
           a5 = a0, a6 = a0, a7 = a0;                                          \
    __m512 b0 = _mm512_set1_ps(0.5f), b1 = b0, b2 = b0, b3 = b0;               \
    double t = now();                                                          \
    for (long i = 0; i < ITERS; i++) {                                         \
      a0 = _mm512_fmadd_ps(a0, m, c); a1 = _mm512_fmadd_ps(a1, m, c);          \
      a2 = _mm512_fmadd_ps(a2, m, c); a3 = _mm512_fmadd_ps(a3, m, c);          \
      a4 = _mm512_fmadd_ps(a4, m, c); a5 = _mm512_fmadd_ps(a5, m, c);          \
      a6 = _mm512_fmadd_ps(a6, m, c); a7 = _mm512_fmadd_ps(a7, m, c);          \
      EXTRA                                                                    \
      __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3),            \
                       "+v"(a4), "+v"(a5), "+v"(a6), "+v"(a7));                \
      __asm__ volatile("" : "+v"(b0), "+v"(b1), "+v"(b2), "+v"(b3),            \
                       "+v"(m), "+v"(c), "+v"(k), "+v"(tab));                  \
    }                                                                          \
    t = now() - t;                                                             \
    __m512 s = _mm512_add_ps(_mm512_add_ps(a0, a7), _mm512_add_ps(b0, b3));    \
    volatile float sink = _mm512_reduce_add_ps(s);                             \
    (void)sink;                                                                \
    double ns = t / ITERS * 1e9;                                               \
    if (base == 0) base = ns;                                                  \
    printf("%-30s %6.3f ns per 8 FMAs  (+%5.2f FMA slots per op)\n", name, ns, \
           (ns - base) / base * 8 / 4);                                        \
  }

#define FOUR(OP) b0 = OP(b0); b1 = OP(b1); b2 = OP(b2); b3 = OP(b3);
#define ADD(x) _mm512_add_ps(x, k)
#define MAX(x) _mm512_max_ps(x, k)
#define MUL(x) _mm512_mul_ps(x, k)
#define ROUND(x) _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define SCALEF(x) _mm512_scalef_ps(x, k)
#define PERM(x) _mm512_permutexvar_ps(_mm512_castps_si512(x), tab)
#define PADDD(x) _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(x), _mm512_castps_si512(k)))

int main(void) {
  __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
  __m512 k = _mm512_set1_ps(0.25f), tab = _mm512_set1_ps(1.0f);
  double base = 0;
  RUN("FMAs alone (warm-up)", )
  base = 0;
  RUN("FMAs alone", )
  RUN("+4 vaddps", FOUR(ADD))
  RUN("+4 vmaxps", FOUR(MAX))
  RUN("+4 vmulps", FOUR(MUL))
  RUN("+4 vrndscaleps", FOUR(ROUND))
  RUN("+4 vscalefps", FOUR(SCALEF))
  RUN("+4 vpermps", FOUR(PERM))
  RUN("+4 vpaddd", FOUR(PADDD))
  return 0;
}
