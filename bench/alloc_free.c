/* Cost of one cuMemAlloc_v2 + cuMemFree_v2 pair, per thread, through whatever libcuda.so.1 the
 * loader finds (the simulator) and whatever LD_PRELOAD adds (the shim, or nothing).
 * Usage: alloc_free THREADS ITERATIONS  ->  prints "ns_per_pair <float>" (mean over threads). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;
CUresult cuInit(unsigned int flags);
CUresult cuDeviceGet(CUdevice *device, int ordinal);
CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice device);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuMemAlloc_v2(CUdeviceptr *ptr, size_t bytes);
CUresult cuMemFree_v2(CUdeviceptr ptr);

static CUcontext context;
static long iterations;
static double seconds[64];

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void *worker(void *arg) {
    long index = (long)arg;
    if (cuCtxSetCurrent(context) != 0) { fprintf(stderr, "cuCtxSetCurrent failed\n"); exit(1); }
    CUdeviceptr ptr;
    for (long i = 0; i < iterations / 10; i++) { /* warm up */
        if (cuMemAlloc_v2(&ptr, 4096) != 0 || cuMemFree_v2(ptr) != 0) { fprintf(stderr, "warm-up failed\n"); exit(1); }
    }
    double start = now();
    for (long i = 0; i < iterations; i++) {
        if (cuMemAlloc_v2(&ptr, 4096) != 0) { fprintf(stderr, "alloc failed at %ld\n", i); exit(1); }
        if (cuMemFree_v2(ptr) != 0) { fprintf(stderr, "free failed at %ld\n", i); exit(1); }
    }
    seconds[index] = now() - start;
    return NULL;
}

int main(int argc, char **argv) {
    long threads = argc > 1 ? atol(argv[1]) : 1;
    iterations = argc > 2 ? atol(argv[2]) : 1000000;
    if (threads < 1 || threads > 64) { fprintf(stderr, "1 to 64 threads\n"); return 2; }
    CUdevice device;
    if (cuInit(0) != 0 || cuDeviceGet(&device, 0) != 0 || cuDevicePrimaryCtxRetain(&context, device) != 0) {
        fprintf(stderr, "driver set-up failed\n");
        return 1;
    }
    pthread_t ids[64];
    for (long t = 0; t < threads; t++) pthread_create(&ids[t], NULL, worker, (void *)t);
    double total = 0;
    for (long t = 0; t < threads; t++) { pthread_join(ids[t], NULL); total += seconds[t]; }
    printf("ns_per_pair %.2f\n", total / threads / iterations * 1e9);
    return 0;
}
