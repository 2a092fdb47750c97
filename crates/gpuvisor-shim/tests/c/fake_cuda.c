/* A tiny fake libcuda.so.1 for the shim's own tests and its overhead benchmark: two 80 GiB
 * devices, lock-free (so the benchmark measures the shim, not the fake), addresses from an
 * atomic counter, per-device used bytes for cuMemGetInfo. Not the project's simulator (that is
 * gpuvisor-sim); just enough driver for the shim to sit on. */
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;

#define DEVICES 2
#define TOTAL (80ULL << 30)
#define TRACK 4096 /* allocation sizes by address slot, for cuMemFree accounting */

static _Atomic unsigned long long next_address = 1ULL << 32;
static _Atomic unsigned long long next_handle = 1000;
static _Atomic unsigned long long used[DEVICES];
static _Atomic unsigned long long sizes[TRACK];
static _Atomic int devices_of[TRACK];
static __thread int current = -1;
static int initialised;

/* Like a real driver, a freed range is handed out again: one cached range per thread. */
static __thread unsigned long long cached_address, cached_size;

static unsigned long long take(size_t size, int device) {
    unsigned long long a;
    if (cached_address && cached_size >= size) {
        a = cached_address;
        cached_address = 0;
    } else {
        a = atomic_fetch_add(&next_address, (size + 0xfff) & ~0xfffULL);
    }
    unsigned idx = (a >> 12) % TRACK;
    atomic_store(&sizes[idx], size);
    atomic_store(&devices_of[idx], device);
    atomic_fetch_add(&used[device], size);
    return a;
}

static CUresult give_back(unsigned long long a) {
    if (a == 0) return 1;
    unsigned idx = (a >> 12) % TRACK;
    unsigned long long s = atomic_exchange(&sizes[idx], 0);
    if (s == 0) return 1; /* not allocated (a double free): CUDA_ERROR_INVALID_VALUE */
    atomic_fetch_sub(&used[atomic_load(&devices_of[idx])], s);
    cached_address = a;
    cached_size = s;
    return 0;
}

CUresult cuInit(unsigned int flags) { (void)flags; initialised = 1; return 0; }
/* FAKE_DEVICES=1 shows one device (the shim then skips cuCtxGetDevice). */
CUresult cuDeviceGetCount(int *n) { *n = getenv("FAKE_DEVICES") ? atoi(getenv("FAKE_DEVICES")) : DEVICES; return initialised ? 0 : 3; }
CUresult cuDeviceGet(CUdevice *d, int ordinal) { if (ordinal < 0 || ordinal >= DEVICES) return 101; *d = ordinal; return 0; }
CUresult cuDeviceGetUuid(unsigned char *uuid, CUdevice d) {
    static const unsigned char base[16] = {0x51, 0x11, 0xa7, 0xed, 0, 0, 0x40, 0, 0x80, 0, 0, 0, 0, 0, 0, 0};
    if (d < 0 || d >= DEVICES) return 101;
    memcpy(uuid, base, 16);
    uuid[15] = (unsigned char)d;
    return 0;
}
CUresult cuDeviceGetUuid_v2(unsigned char *uuid, CUdevice d) { return cuDeviceGetUuid(uuid, d); } /* not hooked */
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d) { if (d < 0 || d >= DEVICES) return 101; *bytes = TOTAL; return 0; }
CUresult cuDevicePrimaryCtxRetain(void **ctx, CUdevice d) { if (!initialised) return 3; *ctx = (void *)(intptr_t)(d + 1); return 0; }
CUresult cuCtxSetCurrent(void *ctx) { current = (int)(intptr_t)ctx - 1; return 0; }
CUresult cuCtxCreate_v2(void **ctx, unsigned flags, CUdevice d) { (void)flags; if (!initialised) return 3; *ctx = (void *)(intptr_t)(d + 1); current = d; return 0; }
static CUresult create_here(void **ctx, CUdevice d) { if (!initialised) return 3; *ctx = (void *)(intptr_t)(d + 1); current = d; return 0; }
CUresult cuCtxCreate_v3(void **ctx, void *p, int n, unsigned flags, CUdevice d) { (void)p; (void)n; (void)flags; return create_here(ctx, d); }
CUresult cuCtxCreate_v4(void **ctx, void *p, unsigned flags, CUdevice d) { (void)p; (void)flags; return create_here(ctx, d); }
CUresult cuCtxGetDevice(CUdevice *d) { if (current < 0) return 201; *d = current; return 0; }
CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    if (current < 0) return 201;
    *total = TOTAL;
    *free_bytes = TOTAL - atomic_load(&used[current]);
    return 0;
}
/* Entry points share static helpers: calling another *exported* entry point would go through
 * the preloaded shim again (ELF interposition) and be charged twice. */
static CUresult alloc_here(CUdeviceptr *p, size_t size) { if (current < 0) return 201; if (size == 0) return 1; *p = take(size, current); return 0; }
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t size) { return alloc_here(p, size); }
CUresult cuMemAllocManaged(CUdeviceptr *p, size_t size, unsigned flags) { (void)flags; return alloc_here(p, size); }
CUresult cuMemAllocAsync(CUdeviceptr *p, size_t size, void *s) { (void)s; return alloc_here(p, size); }
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t size, void *pool, void *s) { (void)pool; (void)s; return alloc_here(p, size); }
CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned e) {
    (void)e;
    if (current < 0) return 201;
    *pitch = (w + 511) & ~(size_t)511;
    *p = take(*pitch * h, current);
    return 0;
}
/* Per-thread-default-stream twins: count calls so tests can see which one the shim reached. */
_Atomic int ptsz_calls;
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t size, void *s) { (void)s; atomic_fetch_add(&ptsz_calls, 1); return alloc_here(p, size); }
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t size, void *pool, void *s) { (void)pool; (void)s; atomic_fetch_add(&ptsz_calls, 1); return alloc_here(p, size); }
CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, void *s) { (void)s; atomic_fetch_add(&ptsz_calls, 1); return give_back(p); }
CUresult cuMemFree_v2(CUdeviceptr p) { return give_back(p); }
CUresult cuMemFreeAsync(CUdeviceptr p, void *s) { (void)s; return give_back(p); }
CUresult cuMemCreate(unsigned long long *h, size_t size, const int *prop, unsigned long long flags) {
    (void)flags;
    int device = prop[3];
    if (device < 0 || device >= DEVICES) return 101;
    atomic_fetch_add(&used[device], size);
    *h = atomic_fetch_add(&next_handle, 1);
    return 0;
}
CUresult cuMemRelease(unsigned long long h) { return h >= 1000 ? 0 : 1; }

CUresult cuGetProcAddress_v2(const char *name, void **fn, int version, unsigned long long flags, int *status);
static CUresult lookup(const char *name, void **fn, unsigned long long flags, int *status);
CUresult cuGetProcAddress(const char *name, void **fn, int version, unsigned long long flags) {
    (void)version;
    return lookup(name, fn, flags, NULL);
}

/* Base name -> newest entry point (all versions here are >= 3020/12000). */
static const struct { const char *name; void *fn; } table[] = {
    {"cuInit", (void *)cuInit},
    {"cuDeviceGetCount", (void *)cuDeviceGetCount},
    {"cuDeviceGet", (void *)cuDeviceGet},
    {"cuDeviceGetUuid", (void *)cuDeviceGetUuid_v2},
    {"cuDeviceTotalMem", (void *)cuDeviceTotalMem_v2},
    {"cuDevicePrimaryCtxRetain", (void *)cuDevicePrimaryCtxRetain},
    {"cuCtxSetCurrent", (void *)cuCtxSetCurrent},
    {"cuCtxCreate", (void *)cuCtxCreate_v4},
    {"cuCtxGetDevice", (void *)cuCtxGetDevice},
    {"cuMemGetInfo", (void *)cuMemGetInfo_v2},
    {"cuMemAlloc", (void *)cuMemAlloc_v2},
    {"cuMemAllocManaged", (void *)cuMemAllocManaged},
    {"cuMemAllocAsync", (void *)cuMemAllocAsync},
    {"cuMemAllocFromPoolAsync", (void *)cuMemAllocFromPoolAsync},
    {"cuMemAllocPitch", (void *)cuMemAllocPitch_v2},
    {"cuMemFree", (void *)cuMemFree_v2},
    {"cuMemFreeAsync", (void *)cuMemFreeAsync},
    {"cuMemCreate", (void *)cuMemCreate},
    {"cuMemRelease", (void *)cuMemRelease},
    {"cuGetProcAddress", (void *)cuGetProcAddress_v2},
};

CUresult cuGetProcAddress_v2(const char *name, void **fn, int version, unsigned long long flags, int *status) {
    (void)version;
    return lookup(name, fn, flags, status);
}

/* CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM (2): the _ptsz twins where they exist. */
static const struct { const char *name; void *fn; } per_thread[] = {
    {"cuMemAllocAsync", (void *)cuMemAllocAsync_ptsz},
    {"cuMemAllocFromPoolAsync", (void *)cuMemAllocFromPoolAsync_ptsz},
    {"cuMemFreeAsync", (void *)cuMemFreeAsync_ptsz},
};

/* With FAKE_INTERNAL_ENTRY_POINTS set, cuGetProcAddress hands out internal functions instead
 * of the exported ones (as a real driver may), so the shim cannot recognise them by address. */
static CUresult internal_alloc(CUdeviceptr *p, size_t size) { return alloc_here(p, size); }
static CUresult internal_free(CUdeviceptr p) { return give_back(p); }
static CUresult internal_info(size_t *f, size_t *t) { return cuMemGetInfo_v2(f, t); }

static CUresult lookup(const char *name, void **fn, unsigned long long flags, int *status) {
    if (flags & 2) {
        for (size_t i = 0; i < sizeof per_thread / sizeof per_thread[0]; i++) {
            if (strcmp(per_thread[i].name, name) == 0) {
                *fn = per_thread[i].fn;
                if (status) *status = 0;
                return 0;
            }
        }
    }
    if (getenv("FAKE_INTERNAL_ENTRY_POINTS")) {
        void *internal = !strcmp(name, "cuMemAlloc") ? (void *)internal_alloc
                       : !strcmp(name, "cuMemFree") ? (void *)internal_free
                       : !strcmp(name, "cuMemGetInfo") ? (void *)internal_info : NULL;
        if (internal) {
            *fn = internal;
            if (status) *status = 0;
            return 0;
        }
    }
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        if (strcmp(table[i].name, name) == 0) {
            *fn = table[i].fn;
            if (status) *status = 0;
            return 0;
        }
    }
    *fn = NULL;
    if (status) *status = 1;
    return 500;
}
