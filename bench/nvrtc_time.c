/*
 * nvrtc_time.c -- times one NVRTC compile of a rendered kernel, to see
 * where the JIT's time goes: with --gpu-architecture=sm_XY NVRTC runs the
 * front end, the optimiser and ptxas (a cubin); with compute_XY it stops at
 * PTX, so the difference is ptxas.
 *
 *   cc -O2 bench/nvrtc_time.c -I/usr/local/cuda/include \
 *      -L/usr/local/cuda/lib64 -lnvrtc -o /tmp/nvrtc_time
 *   build/flashjit emit --shape 4,16,4096,128 --causal --dtype bf16 \
 *      --what source -o /tmp/k.cu
 *   /tmp/nvrtc_time /tmp/k.cu -default-device -std=c++17 \
 *      -I/usr/local/cuda/include -lineinfo --gpu-architecture=sm_90a
 *
 * Prints the milliseconds of nvrtcCreateProgram + nvrtcCompileProgram, or
 * the log and exit status 1 when the compile fails.
 */
#include <nvrtc.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_ms(void)
{
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

static char *slurp(const char *path)
{
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  rewind(f);
  char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
  if (s && fread(s, 1, (size_t)n, f) == (size_t)n)
    s[n] = 0;
  else {
    free(s);
    s = NULL;
  }
  fclose(f);
  return s;
}

int main(int argc, char **argv)
{
  if (argc < 2) {
    fprintf(stderr, "usage: nvrtc_time FILE.cu [NVRTC options...]\n");
    return 2;
  }
  char *src = slurp(argv[1]);
  if (!src) {
    fprintf(stderr, "nvrtc_time: cannot read %s\n", argv[1]);
    return 2;
  }
  nvrtcProgram p;
  double t0 = now_ms();
  nvrtcCreateProgram(&p, src, "k.cu", 0, NULL, NULL);
  nvrtcResult r = nvrtcCompileProgram(p, argc - 2, (const char *const *)argv + 2);
  double t1 = now_ms();
  if (r != NVRTC_SUCCESS) {
    size_t n = 0;
    nvrtcGetProgramLogSize(p, &n);
    char *log = malloc(n + 1);
    if (log && nvrtcGetProgramLog(p, log) == NVRTC_SUCCESS)
      fprintf(stderr, "%s\n", log);
    return 1;
  }
  printf("%.1f ms\n", t1 - t0);
  nvrtcDestroyProgram(&p);
  free(src);
  return 0;
}
