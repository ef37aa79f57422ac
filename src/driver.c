/*
 * driver.c -- the CUDA Driver API, reached through dlopen("libcuda.so.1")
 * so that compile-only use needs no driver at all.  Every call goes through
 * FJ_CU_TRY, which turns a failure into FJ_ERR_CUDA with the error's name,
 * the call and the place.  The library works in the device's primary
 * context, pushed around each use, so device pointers from the CUDA runtime
 * or PyTorch are valid here.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include <cuda.h>

#include "ctx.h"
#include "driver.h"
#include "kparams.h"
#include "util.h"

/* The entry points we use, by their ABI names (cuda.h maps several API names
 * to _v2 symbols with macros, so the table spells the symbols out). */
typedef struct cu_api {
  CUresult (*init)(unsigned);
  CUresult (*driverGetVersion)(int *);
  CUresult (*deviceGetCount)(int *);
  CUresult (*deviceGet)(CUdevice *, int);
  CUresult (*deviceGetName)(char *, int, CUdevice);
  CUresult (*deviceGetAttribute)(int *, CUdevice_attribute, CUdevice);
  CUresult (*primaryCtxRetain)(CUcontext *, CUdevice);
  CUresult (*primaryCtxRelease)(CUdevice);
  CUresult (*ctxPushCurrent)(CUcontext);
  CUresult (*ctxPopCurrent)(CUcontext *);
  CUresult (*ctxGetCurrent)(CUcontext *);
  CUresult (*ctxSynchronize)(void);
  CUresult (*moduleLoadData)(CUmodule *, const void *);
  CUresult (*moduleUnload)(CUmodule);
  CUresult (*moduleGetFunction)(CUfunction *, CUmodule, const char *);
  CUresult (*funcSetAttribute)(CUfunction, CUfunction_attribute, int);
  CUresult (*launchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned,
                           unsigned, unsigned, unsigned, CUstream, void **,
                           void **);
  CUresult (*memAlloc)(CUdeviceptr *, size_t);
  CUresult (*streamIsCapturing)(CUstream, CUstreamCaptureStatus *);
  CUresult (*memFree)(CUdeviceptr);
  CUresult (*memcpyDtoH)(void *, CUdeviceptr, size_t);
  CUresult (*memcpyHtoD)(CUdeviceptr, const void *, size_t);
  CUresult (*memsetD8)(CUdeviceptr, unsigned char, size_t);
  CUresult (*memsetD32Async)(CUdeviceptr, unsigned, size_t, CUstream);
  CUresult (*eventCreate)(CUevent *, unsigned);
  CUresult (*eventRecord)(CUevent, CUstream);
  CUresult (*eventSynchronize)(CUevent);
  CUresult (*eventElapsedTime)(float *, CUevent, CUevent);
  CUresult (*eventDestroy)(CUevent);
  CUresult (*pointerGetAttributes)(unsigned, CUpointer_attribute *, void **,
                                   CUdeviceptr);
  CUresult (*getErrorName)(CUresult, const char **);
  CUresult (*getErrorString)(CUresult, const char **);
} cu_api;

/* Tensor maps (CUDA 12.0 and newer drivers): looked up on its own, so that
 * an older driver still runs every family that does not use TMA. */
typedef CUresult (*tensor_map_fn)(CUtensorMap *, CUtensorMapDataType,
                                  cuuint32_t, void *, const cuuint64_t *,
                                  const cuuint64_t *, const cuuint32_t *,
                                  const cuuint32_t *, CUtensorMapInterleave,
                                  CUtensorMapSwizzle, CUtensorMapL2promotion,
                                  CUtensorMapFloatOOBfill);
static tensor_map_fn cu_tensor_map_encode;
/* Launches with attributes (CUDA 11.8 and newer drivers), for early starts;
 * looked up on its own like the tensor maps. */
typedef CUresult (*launch_ex_fn)(const CUlaunchConfig *, CUfunction, void **,
                                 void **);
static launch_ex_fn cu_launch_ex;
/* How many clusters of a kernel can be resident at once (CUDA 12.0 and
 * newer drivers), looked up on its own: the backward's rotation asks it
 * before it makes every pair of a head wait on the others. */
typedef CUresult (*max_clusters_fn)(int *, CUfunction, const CUlaunchConfig *);
static max_clusters_fn cu_max_clusters;

static cu_api cu;
static pthread_once_t cu_once = PTHREAD_ONCE_INIT;
static fj_status cu_status = FJ_ERR_NO_DEVICE;
static char cu_why[512];

static const struct {
  const char *symbol;
  size_t offset;
} cu_symbols[] = {
#define FJ_CU_SYM_(field, sym) {sym, offsetof(cu_api, field)}
    FJ_CU_SYM_(init, "cuInit"),
    FJ_CU_SYM_(driverGetVersion, "cuDriverGetVersion"),
    FJ_CU_SYM_(deviceGetCount, "cuDeviceGetCount"),
    FJ_CU_SYM_(deviceGet, "cuDeviceGet"),
    FJ_CU_SYM_(deviceGetName, "cuDeviceGetName"),
    FJ_CU_SYM_(deviceGetAttribute, "cuDeviceGetAttribute"),
    FJ_CU_SYM_(primaryCtxRetain, "cuDevicePrimaryCtxRetain"),
    FJ_CU_SYM_(primaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"),
    FJ_CU_SYM_(ctxPushCurrent, "cuCtxPushCurrent_v2"),
    FJ_CU_SYM_(ctxPopCurrent, "cuCtxPopCurrent_v2"),
    FJ_CU_SYM_(ctxGetCurrent, "cuCtxGetCurrent"),
    FJ_CU_SYM_(ctxSynchronize, "cuCtxSynchronize"),
    FJ_CU_SYM_(moduleLoadData, "cuModuleLoadData"),
    FJ_CU_SYM_(moduleUnload, "cuModuleUnload"),
    FJ_CU_SYM_(moduleGetFunction, "cuModuleGetFunction"),
    FJ_CU_SYM_(funcSetAttribute, "cuFuncSetAttribute"),
    FJ_CU_SYM_(launchKernel, "cuLaunchKernel"),
    FJ_CU_SYM_(memAlloc, "cuMemAlloc_v2"),
    FJ_CU_SYM_(streamIsCapturing, "cuStreamIsCapturing"),
    FJ_CU_SYM_(memFree, "cuMemFree_v2"),
    FJ_CU_SYM_(memcpyDtoH, "cuMemcpyDtoH_v2"),
    FJ_CU_SYM_(memcpyHtoD, "cuMemcpyHtoD_v2"),
    FJ_CU_SYM_(memsetD8, "cuMemsetD8_v2"),
    FJ_CU_SYM_(memsetD32Async, "cuMemsetD32Async"),
    FJ_CU_SYM_(eventCreate, "cuEventCreate"),
    FJ_CU_SYM_(eventRecord, "cuEventRecord"),
    FJ_CU_SYM_(eventSynchronize, "cuEventSynchronize"),
    /* the first version, which every driver since CUDA 4 exports */
    FJ_CU_SYM_(eventElapsedTime, "cuEventElapsedTime"),
    FJ_CU_SYM_(eventDestroy, "cuEventDestroy_v2"),
    FJ_CU_SYM_(pointerGetAttributes, "cuPointerGetAttributes"),
    FJ_CU_SYM_(getErrorName, "cuGetErrorName"),
    FJ_CU_SYM_(getErrorString, "cuGetErrorString"),
#undef FJ_CU_SYM_
};

static void cu_load(void)
{
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    snprintf(cu_why, sizeof cu_why,
             "no NVIDIA driver: dlopen(libcuda.so.1) failed: %s", dlerror());
    return;
  }
  for (size_t i = 0; i < FJ_ARRAY_LEN(cu_symbols); i++) {
    void *fn = dlsym(h, cu_symbols[i].symbol);
    if (!fn) {
      snprintf(cu_why, sizeof cu_why,
               "libcuda.so.1 lacks %s: the driver is too old",
               cu_symbols[i].symbol);
      return;
    }
    memcpy((char *)&cu + cu_symbols[i].offset, &fn, sizeof fn);
  }
  cu_tensor_map_encode = (tensor_map_fn)dlsym(h, "cuTensorMapEncodeTiled");
  cu_launch_ex = (launch_ex_fn)dlsym(h, "cuLaunchKernelEx");
  cu_max_clusters =
      (max_clusters_fn)dlsym(h, "cuOccupancyMaxActiveClusters");
  CUresult r = cu.init(0);
  if (r != CUDA_SUCCESS) {
    const char *name = "?";
    cu.getErrorName(r, &name);
    snprintf(cu_why, sizeof cu_why, "cuInit(0) failed: %s (%d)", name,
             (int)r);
    return;
  }
  cu_status = FJ_OK;
}

fj_status fj__cu_init(const fj_ctx *ctx)
{
  pthread_once(&cu_once, cu_load);
  if (cu_status != FJ_OK)
    return fj__fail(ctx, cu_status, "%s", cu_why);
  return FJ_OK;
}

static fj_status cu_fail(const fj_ctx *ctx, CUresult r, const char *call,
                         const char *file, int line)
{
  const char *name = "?", *text = "?";
  cu.getErrorName(r, &name);
  cu.getErrorString(r, &text);
  return fj__fail(ctx, FJ_ERR_CUDA, "%s failed: %s (%s) at %s:%d", call, name,
                  text, file, line);
}

#define FJ_CU_TRY(ctx, call)                                      \
  do {                                                            \
    CUresult r_ = (call);                                         \
    if (r_ != CUDA_SUCCESS)                                       \
      return cu_fail((ctx), r_, #call, __FILE__, __LINE__);       \
  } while (0)

static fj_status device_attr(const fj_ctx *ctx, CUdevice d,
                             CUdevice_attribute a, int *out)
{
  FJ_CU_TRY(ctx, cu.deviceGetAttribute(out, a, d));
  return FJ_OK;
}

static fj_status device_info(fj_ctx *ctx, CUdevice d)
{
  fj_device_info *info = &ctx->dev;
  FJ_CU_TRY(ctx, cu.deviceGetName(info->name, (int)sizeof info->name, d));
  FJ_CU_TRY(ctx, cu.driverGetVersion(&info->driver_version));
  fj_status st = device_attr(ctx, d,
                             CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                             &info->cc_major);
  if (st == FJ_OK)
    st = device_attr(ctx, d, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                     &info->cc_minor);
  if (st == FJ_OK)
    st = device_attr(ctx, d, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                     &info->sm_count);
  if (st == FJ_OK)
    st = device_attr(ctx, d,
                     CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                     &info->smem_optin_bytes);
  return st;
}

fj_status fj__cu_open_device(fj_ctx *ctx)
{
  fj_status st = fj__cu_init(ctx);
  if (st != FJ_OK)
    return st;
  int count = 0;
  FJ_CU_TRY(ctx, cu.deviceGetCount(&count));
  if (ctx->opts.device >= count)
    return fj__fail(ctx, FJ_ERR_NO_DEVICE,
                    "device %d does not exist: %d CUDA device(s) present",
                    ctx->opts.device, count);
  CUdevice d;
  FJ_CU_TRY(ctx, cu.deviceGet(&d, ctx->opts.device));
  ctx->dev.ordinal = ctx->opts.device;
  /* Fixed from cuInit on (CUDA_VISIBLE_DEVICES is read then). */
  ctx->devices = count;
  st = device_info(ctx, d);
  if (st != FJ_OK)
    return st;
  CUcontext pctx;
  FJ_CU_TRY(ctx, cu.primaryCtxRetain(&pctx, d));
  ctx->cu_ctx = pctx;
  return FJ_OK;
}

void fj__cu_close_device(fj_ctx *ctx)
{
  CUdevice d;
  if (ctx->cu_ctx && cu.deviceGet(&d, ctx->dev.ordinal) == CUDA_SUCCESS)
    cu.primaryCtxRelease(d);
  ctx->cu_ctx = NULL;
}

/* Whether each enter of this thread pushed the context (bit d of the
 * stack for nesting depth d): a thread whose current context is already
 * ours (PyTorch's threads, a caller's own) pushes and pops nothing. */
static _Thread_local uint64_t pushed_bits;
static _Thread_local int enter_depth;

fj_status fj__cu_enter(const fj_ctx *ctx)
{
  if (!ctx->has_device)
    return fj__fail(ctx, FJ_ERR_COMPILE_ONLY,
                    "this needs a GPU context; the context is compile-only "
                    "(arch %s)",
                    ctx->arch);
  CUcontext cur = NULL;
  int push = cu.ctxGetCurrent(&cur) != CUDA_SUCCESS ||
             cur != (CUcontext)ctx->cu_ctx || enter_depth >= 64;
  if (push)
    FJ_CU_TRY(ctx, cu.ctxPushCurrent((CUcontext)ctx->cu_ctx));
  if (enter_depth < 64)
    pushed_bits = (pushed_bits & ~(1ull << enter_depth)) |
                  ((uint64_t)push << enter_depth);
  enter_depth++;
  return FJ_OK;
}

void fj__cu_leave(const fj_ctx *ctx)
{
  CUcontext old;
  (void)ctx;
  enter_depth--;
  if (enter_depth >= 64 || (pushed_bits >> enter_depth) & 1)
    cu.ctxPopCurrent(&old);
}

fj_status fj__cu_module_load(const fj_ctx *ctx, const void *cubin,
                             void **module)
{
  CUmodule m;
  FJ_CU_TRY(ctx, cu.moduleLoadData(&m, cubin));
  *module = m;
  return FJ_OK;
}

fj_status fj__cu_function(const fj_ctx *ctx, void *module, const char *symbol,
                          unsigned smem_bytes, void **function)
{
  CUfunction f;
  FJ_CU_TRY(ctx, cu.moduleGetFunction(&f, (CUmodule)module, symbol));
  /* Above 48 KB a kernel must ask for its dynamic shared memory. */
  if (smem_bytes > 48 * 1024)
    FJ_CU_TRY(ctx, cu.funcSetAttribute(
                       f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                       (int)smem_bytes));
  *function = f;
  return FJ_OK;
}

void fj__cu_module_unload(void *module)
{
  if (module)
    cu.moduleUnload((CUmodule)module);
}

fj_status fj__cu_launch(const fj_ctx *ctx, const fj_launch *l)
{
  if (l->early && cu_launch_ex) {
    CUlaunchAttribute a;
    memset(&a, 0, sizeof a);
    a.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    a.value.programmaticStreamSerializationAllowed = 1;
    CUlaunchConfig c = {l->grid[0],  l->grid[1],  l->grid[2],
                        l->block[0], l->block[1], l->block[2],
                        l->smem_bytes, (CUstream)l->stream, &a, 1};
    FJ_CU_TRY(ctx, cu_launch_ex(&c, (CUfunction)l->function, l->args, NULL));
    return FJ_OK;
  }
  FJ_CU_TRY(ctx, cu.launchKernel((CUfunction)l->function, l->grid[0],
                                 l->grid[1], l->grid[2], l->block[0],
                                 l->block[1], l->block[2], l->smem_bytes,
                                 (CUstream)l->stream, l->args, NULL));
  return FJ_OK;
}

int fj__cu_resident_clusters(const fj_launch *l)
{
  if (!cu_max_clusters)
    return 0;
  CUlaunchConfig c = {l->grid[0],  l->grid[1],  l->grid[2],
                      l->block[0], l->block[1], l->block[2],
                      l->smem_bytes, (CUstream)l->stream, NULL, 0};
  int n = 0;
  return cu_max_clusters(&n, (CUfunction)l->function, &c) == CUDA_SUCCESS
             ? n
             : 0;
}

fj_status fj__cu_alloc(const fj_ctx *ctx, size_t bytes, uint64_t *dptr)
{
  CUdeviceptr p;
  FJ_CU_TRY(ctx, cu.memAlloc(&p, bytes));
  *dptr = (uint64_t)p;
  return FJ_OK;
}

void fj__cu_free(uint64_t dptr)
{
  if (dptr)
    cu.memFree((CUdeviceptr)dptr);
}

fj_status fj__cu_capturing(const fj_ctx *ctx, void *stream, int *capturing)
{
  CUstreamCaptureStatus s = CU_STREAM_CAPTURE_STATUS_NONE;
  FJ_CU_TRY(ctx, cu.streamIsCapturing((CUstream)stream, &s));
  *capturing = s != CU_STREAM_CAPTURE_STATUS_NONE;
  return FJ_OK;
}

fj_status fj__cu_copy_to_host(const fj_ctx *ctx, void *dst, uint64_t src,
                              size_t bytes)
{
  FJ_CU_TRY(ctx, cu.memcpyDtoH(dst, (CUdeviceptr)src, bytes));
  return FJ_OK;
}

fj_status fj__cu_copy_to_device(const fj_ctx *ctx, uint64_t dst,
                                const void *src, size_t bytes)
{
  FJ_CU_TRY(ctx, cu.memcpyHtoD((CUdeviceptr)dst, src, bytes));
  return FJ_OK;
}

fj_status fj__cu_sync(const fj_ctx *ctx)
{
  FJ_CU_TRY(ctx, cu.ctxSynchronize());
  return FJ_OK;
}

fj_status fj__cu_memset(const fj_ctx *ctx, uint64_t dst, unsigned char byte,
                        size_t bytes)
{
  FJ_CU_TRY(ctx, cu.memsetD8((CUdeviceptr)dst, byte, bytes));
  return FJ_OK;
}

fj_status fj__cu_memset32_async(const fj_ctx *ctx, uint64_t dst,
                                unsigned value, size_t words, void *stream)
{
  FJ_CU_TRY(ctx, cu.memsetD32Async((CUdeviceptr)dst, value, words,
                                   (CUstream)stream));
  return FJ_OK;
}

fj_status fj__cu_event_create(const fj_ctx *ctx, void **event)
{
  CUevent e;
  FJ_CU_TRY(ctx, cu.eventCreate(&e, CU_EVENT_DEFAULT));
  *event = e;
  return FJ_OK;
}

void fj__cu_event_destroy(void *event)
{
  if (event)
    cu.eventDestroy((CUevent)event);
}

fj_status fj__cu_event_record(const fj_ctx *ctx, void *event, void *stream)
{
  FJ_CU_TRY(ctx, cu.eventRecord((CUevent)event, (CUstream)stream));
  return FJ_OK;
}

fj_status fj__cu_event_ms(const fj_ctx *ctx, void *start, void *end, float *ms)
{
  FJ_CU_TRY(ctx, cu.eventSynchronize((CUevent)end));
  FJ_CU_TRY(ctx, cu.eventElapsedTime(ms, (CUevent)start, (CUevent)end));
  return FJ_OK;
}

fj_status fj__cu_memory(const fj_ctx *ctx, const void *ptr, fj_mem_info *info)
{
  /* One query for all five: the driver looks the address up once.  Each
   * value is zeroed first and wide enough for what the driver writes: a
   * pointer CUDA does not know gets "default NULL values" and success. */
  CUpointer_attribute attrs[] = {
      CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_IS_MANAGED,
      CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
      CU_POINTER_ATTRIBUTE_RANGE_SIZE};
  CUmemorytype type = (CUmemorytype)0;
  uint64_t managed = 0;  /* a boolean: written as 1 to 8 bytes */
  int ordinal = -1;
  CUdeviceptr start = 0;
  size_t bytes = 0;
  void *data[] = {&type, &managed, &ordinal, &start, &bytes};
  FJ_CU_TRY(ctx, cu.pointerGetAttributes((unsigned)FJ_ARRAY_LEN(attrs), attrs,
                                         data, (CUdeviceptr)(uintptr_t)ptr));
  memset(info, 0, sizeof *info);
  info->kind = managed                      ? FJ_MEM_MANAGED
               : type == CU_MEMORYTYPE_DEVICE ? FJ_MEM_DEVICE
               : type == CU_MEMORYTYPE_HOST   ? FJ_MEM_HOST
                                              : FJ_MEM_OTHER;
  info->ordinal = ordinal;
  info->start = (uint64_t)start;
  info->bytes = info->kind == FJ_MEM_OTHER ? 0 : (uint64_t)bytes;
  return FJ_OK;
}

fj_status fj__cu_tensor_map(const fj_ctx *ctx, const fj_tmap_desc *d,
                            fj_tmap *out)
{
  _Static_assert(sizeof(fj_tmap) == sizeof(CUtensorMap),
                 "fj_tmap must be a CUtensorMap");
  if (!cu_tensor_map_encode)
    return fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                    "the driver has no cuTensorMapEncodeTiled (TMA needs a "
                    "CUDA 12 driver)");
  cuuint64_t dims[5], strides[4];
  cuuint32_t box[5], ones[5] = {1, 1, 1, 1, 1};
  for (int i = 0; i < d->rank; i++) {
    dims[i] = (cuuint64_t)d->dims[i];
    box[i] = (cuuint32_t)d->box[i];
    if (i + 1 < d->rank)
      strides[i] = (cuuint64_t)d->strides[i];
  }
  CUtensorMapDataType type = d->dtype == FJ_BF16   ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                             : d->dtype == FJ_E4M3 ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                                   : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  CUtensorMapSwizzle sw = d->swizzle_bytes == 128  ? CU_TENSOR_MAP_SWIZZLE_128B
                          : d->swizzle_bytes == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
                                                   : CU_TENSOR_MAP_SWIZZLE_32B;
  /* Out-of-bounds elements (sequence tails) are filled with zeros. */
  FJ_CU_TRY(ctx, cu_tensor_map_encode(
                     (CUtensorMap *)out, type, (cuuint32_t)d->rank,
                     (void *)(uintptr_t)d->base, dims, strides, box, ones,
                     CU_TENSOR_MAP_INTERLEAVE_NONE, sw,
                     CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                     CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  return FJ_OK;
}
