/* Compiles one variant through an installed flashjit and prints its name
 * and register count. */
#include <stdio.h>

#include <flashjit.h>

int main(void)
{
  fj_ctx_opts o;
  fj_ctx_opts_init(&o);
  o.device = -1;
  o.arch = "sm_90a";
  o.disk_cache = 0;
  fj_ctx *ctx;
  if (fj_ctx_create(&ctx, &o) != FJ_OK)
    return fprintf(stderr, "%s\n", fj_errmsg(NULL)), 1;
  fj_variant v;
  fj_variant_default(&v, 64, FJ_F16, FJ_CAUSAL_NONE);
  fj_kernel *k;
  if (fj_kernel_get(ctx, &v, &k) != FJ_OK)
    return fprintf(stderr, "%s\n", fj_errmsg(ctx)), 1;
  fj_resources r;
  fj_kernel_resources(k, &r);
  printf("%s: %d registers\n", fj_kernel_name(k), r.registers);
  fj_ctx_destroy(ctx);
  return 0;
}
