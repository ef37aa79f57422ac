{#
  compare.cu: how far one output is from another, reduced on the device
  (the tuner checks every candidate against the default variant without
  copying outputs back).  out[0] += sum (a - b)^2, out[1] += sum b^2,
  out[2] += count of non-finite a.
#}
{% meta.symbol = "fj_compare"; meta.threads = 256; meta.smem_bytes = 0; meta.rows_per_block = 0 %}
// flashjit output comparison for {{ dtype }} on {{ arch }}; rendered by flashjit {{ version }}
#include <cuda_fp16.h>
#include <cuda_bf16.h>

{% if dtype == "f16" then %}
typedef __half elem_t;
__device__ __forceinline__ double to_double(elem_t x) { return (double)__half2float(x); }
{% else %}
typedef __nv_bfloat16 elem_t;
__device__ __forceinline__ double to_double(elem_t x) { return (double)__bfloat162float(x); }
{% end %}

extern "C" __global__ void __launch_bounds__(256)
fj_compare(const elem_t *a, const elem_t *b, unsigned long long n, double *out) {
  double d2 = 0, r2 = 0, bad = 0;
  for (unsigned long long i = blockIdx.x * 256ull + threadIdx.x; i < n; i += gridDim.x * 256ull) {
    const double x = to_double(a[i]), y = to_double(b[i]);
    if (!isfinite(x)) { bad += 1; continue; }
    d2 += (x - y) * (x - y);
    r2 += y * y;
  }
  for (int m = 16; m > 0; m >>= 1) {
    d2 += __shfl_xor_sync(0xffffffffu, d2, m);
    r2 += __shfl_xor_sync(0xffffffffu, r2, m);
    bad += __shfl_xor_sync(0xffffffffu, bad, m);
  }
  if (threadIdx.x % 32 == 0) {
    atomicAdd(&out[0], d2);
    atomicAdd(&out[1], r2);
    atomicAdd(&out[2], bad);
  }
}
