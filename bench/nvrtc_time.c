/*
 * nvrtc_time.c -- times NVRTC compiles of a rendered kernel, to see where
 * the JIT's time goes: with --gpu-architecture=sm_XY NVRTC runs the front
 * end, the optimiser and ptxas (a cubin); with compute_XY it stops at PTX,
 * so the difference is ptxas.  NVRTC's own --time table splits one
 * compile into its phases (front end, NVVM optimiser, PTX translation =
 * ptxas); -n with --phases gives the median of each.
 *
 *   cc -O2 bench/nvrtc_time.c -I/usr/local/cuda/include \
 *      -L/usr/local/cuda/lib64 -lnvrtc -o /tmp/nvrtc_time
 *   build/flashjit emit --shape 4,16,4096,128 --causal --dtype bf16 \
 *      --what source -o /tmp/k.cu
 *   /tmp/nvrtc_time [-n N] [--phases] [-o OUT.cubin] /tmp/k.cu \
 *      -default-device -std=c++17 -I/usr/local/cuda/include -lineinfo \
 *      --no-cache --gpu-architecture=sm_90a
 *
 * Each of the N compiles (default 1) is a fresh program.  Prints the
 * median, lowest and highest milliseconds of nvrtcCreateProgram +
 * nvrtcCompileProgram, the median of the process's CPU time over the same
 * span (steadier than the wall time on a shared machine; NVRTC compiles
 * on one thread unless told to split); with --phases also the median of
 * each phase NVRTC reported.  -o writes the last compile's cubin (for cuobjdump -sass).
 * The log and exit status 1 when a compile fails.
 */
#include <nvrtc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { MAX_RUNS = 64, MAX_PHASES = 8, MAX_ARGS = 64 };

static double clock_ms(clockid_t id)
{
  struct timespec t;
  clock_gettime(id, &t);
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

static int cmp(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n)
{
  qsort(v, (size_t)n, sizeof *v, cmp);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* The phases of NVRTC's --time table ("k.cu, NVVM Optimizer, 769, ms"). */
static char phase_name[MAX_PHASES][64];
static double phase_ms[MAX_PHASES][MAX_RUNS];
static int nphases;

static void read_phases(const char *path, int run)
{
  FILE *f = fopen(path, "r");
  char line[256];
  while (f && fgets(line, sizeof line, f)) {
    char name[64];
    double ms;
    if (sscanf(line, "%*[^,], %63[^,], %lf, ms", name, &ms) != 2)
      continue;
    int i = 0;
    while (i < nphases && strcmp(phase_name[i], name))
      i++;
    if (i == nphases && nphases < MAX_PHASES)
      snprintf(phase_name[nphases++], sizeof phase_name[0], "%s", name);
    if (i < nphases)
      phase_ms[i][run] = ms;
  }
  if (f)
    fclose(f);
  remove(path);
}

static int write_cubin(nvrtcProgram p, const char *path)
{
  size_t n = 0;
  if (nvrtcGetCUBINSize(p, &n) != NVRTC_SUCCESS || n == 0)
    return -1;
  char *c = malloc(n);
  FILE *f = c && nvrtcGetCUBIN(p, c) == NVRTC_SUCCESS ? fopen(path, "wb") : NULL;
  int bad = !f || fwrite(c, 1, n, f) != n;
  if (f)
    bad |= fclose(f) != 0;
  free(c);
  return bad ? -1 : 0;
}

/* One compile; its wall milliseconds (and the process's CPU milliseconds
 * in *cpu), or -1 after printing the log. */
static double compile_once(const char *src, int argc, const char **argv,
                           const char *cubin, double *cpu)
{
  nvrtcProgram p;
  double t0 = clock_ms(CLOCK_MONOTONIC), c0 = clock_ms(CLOCK_PROCESS_CPUTIME_ID);
  nvrtcCreateProgram(&p, src, "k.cu", 0, NULL, NULL);
  nvrtcResult r = nvrtcCompileProgram(p, argc, argv);
  double t1 = clock_ms(CLOCK_MONOTONIC);
  *cpu = clock_ms(CLOCK_PROCESS_CPUTIME_ID) - c0;
  if (r != NVRTC_SUCCESS) {
    size_t n = 0;
    nvrtcGetProgramLogSize(p, &n);
    char *log = malloc(n + 1);
    if (log && nvrtcGetProgramLog(p, log) == NVRTC_SUCCESS)
      fprintf(stderr, "%s\n", log);
    free(log);
    return -1;
  }
  if (cubin && write_cubin(p, cubin) != 0)
    fprintf(stderr, "nvrtc_time: no cubin written to %s\n", cubin);
  nvrtcDestroyProgram(&p);
  return t1 - t0;
}

int main(int argc, char **argv)
{
  int runs = 1, phases = 0, a = 1;
  const char *cubin = NULL;
  for (; a < argc && argv[a][0] == '-'; a++) {
    if (!strcmp(argv[a], "-n") && a + 1 < argc)
      runs = atoi(argv[++a]);
    else if (!strcmp(argv[a], "--phases"))
      phases = 1;
    else if (!strcmp(argv[a], "-o") && a + 1 < argc)
      cubin = argv[++a];
    else
      break;
  }
  if (a >= argc || runs < 1 || runs > MAX_RUNS || argc - a - 1 > MAX_ARGS - 1) {
    fprintf(stderr, "usage: nvrtc_time [-n N (1..64)] [--phases] "
                    "[-o OUT.cubin] FILE.cu [NVRTC options...]\n");
    return 2;
  }
  char *src = slurp(argv[a]);
  if (!src) {
    fprintf(stderr, "nvrtc_time: cannot read %s\n", argv[a]);
    return 2;
  }
  const char *opts[MAX_ARGS];
  int nopts = 0;
  for (int i = a + 1; i < argc; i++)
    opts[nopts++] = argv[i];
  char timefile[64], timeopt[80];
  snprintf(timefile, sizeof timefile, "/tmp/nvrtc_time.%ld.csv", (long)getpid());
  snprintf(timeopt, sizeof timeopt, "--time=%s", timefile);
  if (phases)
    opts[nopts++] = timeopt;
  double ms[MAX_RUNS], cpu[MAX_RUNS];
  for (int r = 0; r < runs; r++) {
    if ((ms[r] = compile_once(src, nopts, opts, r == runs - 1 ? cubin : NULL,
                              &cpu[r])) < 0)
      return 1;
    if (phases)
      read_phases(timefile, r);
  }
  double lo = ms[0], hi = ms[0];
  for (int r = 1; r < runs; r++) {
    lo = ms[r] < lo ? ms[r] : lo;
    hi = ms[r] > hi ? ms[r] : hi;
  }
  printf("%.1f ms (median of %d; %.1f-%.1f); cpu %.1f", median(ms, runs),
         runs, lo, hi, median(cpu, runs));
  for (int i = 0; i < nphases; i++)
    printf("; %s %.1f", phase_name[i], median(phase_ms[i], runs));
  printf("\n");
  free(src);
  return 0;
}
