{#
  mma_frag.cuh: the mma.sync m16n8k16 fragment code shared by the layout
  probe (lut_probe.cu) and the mma attention family (attention_mma.cu), so
  that the tables the probe reads back describe exactly the loads and the
  instruction the kernels run.

  A "tile" here is 16x16 of 16-bit elements in shared memory, loaded with
  one ldmatrix.x4: four 8x8 matrices, lanes 8i..8i+7 naming the rows of
  matrix i.  As operands:
    A (m x k), stored row-major [m][k]:      a[0..3] feed one mma's A;
    B (k x n) from K stored n-major [n][k]:  b[0..1] feed the mma of columns
                                             n 0-7, b[2..3] of n 8-15;
    B (k x n) from V stored k-major [k][n]:  the same, through .trans.
  An accumulator tile c[8] is the two m16n8 results: c[0..3] for n 0-7,
  c[4..7] for n 8-15.  Which (row, col) each slot holds is what the probe
  measures; nothing in the kernels assumes it.
#}
namespace fj {

// Lane l's row and column in a stored 16x16 tile for ldmatrix.x4.
// Row-major operands (A, and V through .trans): matrices (0-7, 0-7),
// (8-15, 0-7), (0-7, 8-15), (8-15, 8-15).
__device__ __forceinline__ int ldm_row_rm(int lane) { return lane & 15; }
__device__ __forceinline__ int ldm_col_rm(int lane) { return (lane >> 4) << 3; }
// n-major B (K): matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7),
// (n 8-15, k 8-15).
__device__ __forceinline__ int ldm_row_nm(int lane) { return (lane & 7) | ((lane >> 4) << 3); }
__device__ __forceinline__ int ldm_col_nm(int lane) { return lane & 8; }

// Shared-space addresses (32-bit), so that the constant part of a fragment's
// position folds into the instruction's immediate offset.
__device__ __forceinline__ unsigned smem_addr(const void *p) {
  return (unsigned)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void ldsm_x4(unsigned r[4], unsigned a) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 { %0, %1, %2, %3 }, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
__device__ __forceinline__ void ldsm_x4_t(unsigned r[4], unsigned a) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 { %0, %1, %2, %3 }, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

{% for _, t in ipairs({ "f16", "bf16" }) do %}
// c[0..7] += A . B for a 16x16 accumulator tile, {{ t }} inputs.  Not
// volatile: a pure function of its registers, free to be scheduled.
__device__ __forceinline__ void mma_tile_{{ t }}(float c[8], const unsigned a[4], const unsigned b[4]) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.{{ t }}.{{ t }}.f32 "
               "{ %0, %1, %2, %3 }, { %4, %5, %6, %7 }, { %8, %9 }, { %0, %1, %2, %3 };\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  asm("mma.sync.aligned.m16n8k16.row.col.f32.{{ t }}.{{ t }}.f32 "
               "{ %0, %1, %2, %3 }, { %4, %5, %6, %7 }, { %8, %9 }, { %0, %1, %2, %3 };\n"
               : "+f"(c[4]), "+f"(c[5]), "+f"(c[6]), "+f"(c[7])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[2]), "r"(b[3]));
}
{% end %}

}  // namespace fj
