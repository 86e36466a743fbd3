"""This CPU's measured fp32 peak: the yardstick for the GFLOP/s ``forgekit bench --profile`` prints.

    .venv/bin/python bench/cpu_peak.py [--threads 2] [--seconds 1]

A nominal peak needs the clock under load and the FMA width, which a VM hides (this one reports 2.6 GHz
and a Zen 4, whose 512-bit FMAs are two 256-bit halves).  Instead: gcc compiles a loop of 12 independent
``vfmadd`` chains (enough to cover the FMA latency on every pipe) for the widest vectors this CPU has
(AVX-512, else AVX2+FMA), one pthread per core, and the best of five runs is the peak.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
from pathlib import Path

SOURCE = r"""
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#ifdef __AVX512F__
typedef __m512 V; enum { LANES = 16 };
#define SET1 _mm512_set1_ps
#define FMA _mm512_fmadd_ps
#define ADD _mm512_add_ps
#define SUM(v) _mm512_reduce_add_ps(v)
#else
typedef __m256 V; enum { LANES = 8 };
#define SET1 _mm256_set1_ps
#define FMA _mm256_fmadd_ps
#define ADD _mm256_add_ps
static float SUM(__m256 v) { float t[8]; _mm256_storeu_ps(t, v); float s = 0; for (int i = 0; i < 8; i++) s += t[i]; return s; }
#endif
static long ITERS;
static void* work(void* out) {
  V a = SET1(0.999999f), b = SET1(1e-7f);
  V c0 = SET1(0), c1 = SET1(1), c2 = SET1(2), c3 = SET1(3), c4 = SET1(4), c5 = SET1(5);
  V c6 = SET1(6), c7 = SET1(7), c8 = SET1(8), c9 = SET1(9), c10 = SET1(10), c11 = SET1(11);
  for (long i = 0; i < ITERS; i++) {
    c0 = FMA(c0, a, b); c1 = FMA(c1, a, b); c2 = FMA(c2, a, b); c3 = FMA(c3, a, b);
    c4 = FMA(c4, a, b); c5 = FMA(c5, a, b); c6 = FMA(c6, a, b); c7 = FMA(c7, a, b);
    c8 = FMA(c8, a, b); c9 = FMA(c9, a, b); c10 = FMA(c10, a, b); c11 = FMA(c11, a, b);
  }
  V s = ADD(ADD(ADD(c0, c1), ADD(c2, c3)), ADD(ADD(c4, c5), ADD(c6, c7)));
  *(float*)out = SUM(ADD(s, ADD(ADD(c8, c9), ADD(c10, c11))));
  return NULL;
}
int main(int argc, char** argv) {
  int threads = atoi(argv[1]);
  ITERS = atol(argv[2]);
  pthread_t t[256]; float out[256];
  struct timespec s, e;
  clock_gettime(CLOCK_MONOTONIC, &s);
  for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, work, &out[i]);
  for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
  clock_gettime(CLOCK_MONOTONIC, &e);
  double sec = (e.tv_sec - s.tv_sec) + 1e-9 * (e.tv_nsec - s.tv_nsec);
  printf("%d %.3f %g\n", LANES, 2.0 * 12 * LANES * ITERS * threads / sec / 1e9, out[0]);
  return 0;
}
"""


def measure(threads: int, seconds: float) -> tuple[int, float]:
    """(vector lanes, best GFLOP/s of five runs) with ``threads`` threads."""
    with tempfile.TemporaryDirectory(prefix="forgekit-peak-") as tmp:
        src, exe = Path(tmp) / "peak.c", Path(tmp) / "peak"
        src.write_text(SOURCE)
        subprocess.run(["gcc", "-O2", "-march=native", "-pthread", str(src), "-o", str(exe)], check=True)
        iters = int(2e8 * seconds)
        best, lanes = 0.0, 0
        for _ in range(5):
            out = subprocess.run([str(exe), str(threads), str(iters)], capture_output=True, text=True, check=True)
            fields = out.stdout.split()
            lanes, best = int(fields[0]), max(best, float(fields[1]))
        return lanes, best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--seconds", type=float, default=1.0)
    args = parser.parse_args()
    for threads in sorted({1, args.threads}):
        lanes, gflops = measure(threads, args.seconds)
        print(f"fp32 peak, {threads} thread(s), {lanes}-lane FMA: {gflops:.1f} GFLOP/s")


if __name__ == "__main__":
    main()
