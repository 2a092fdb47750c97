/* Cost of one cuMemAlloc_v2 + cuMemFree_v2 pair, THREADS threads, each with the primary context
 * of device 0 current, through whatever libcuda.so.1 the loader finds (the simulator) and
 * whatever LD_PRELOAD adds (the shim, or nothing). scripts/bench.py runs it both ways.
 *
 * Usage: alloc_free THREADS ITERATIONS [SIZE]   (SIZE in bytes, default 1 MiB)
 * Prints one line: "threads=T iterations=N ns_per_pair=X cpu_ns_per_pair=Y" where
 *   X = wall time / pairs per thread (what one thread sees; includes waiting for a core), and
 *   Y = process CPU time / all pairs (the work done per pair; the figure to read when threads
 *       outnumber cores).
 * Each thread warms up with ITERATIONS/10 pairs (first-use registration, caches) before the
 * timed part starts; threads start together at a barrier.
 * Build: cc -O2 -pthread alloc_free.c -L<dir of libcuda.so.1> -l:libcuda.so.1 -o alloc_free */
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

#define MAX_THREADS 256

static CUcontext context;
static long iterations;
static size_t size = 1 << 20;
static pthread_barrier_t ready, go;

static double clock_ns(clockid_t clock) {
    struct timespec t;
    clock_gettime(clock, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static void pairs(long count) {
    for (long i = 0; i < count; i++) {
        CUdeviceptr ptr;
        CUresult rc = cuMemAlloc_v2(&ptr, size);
        if (rc) { fprintf(stderr, "alloc_free: cuMemAlloc_v2 failed (%d) at pair %ld\n", rc, i); exit(3); }
        rc = cuMemFree_v2(ptr);
        if (rc) { fprintf(stderr, "alloc_free: cuMemFree_v2 failed (%d) at pair %ld\n", rc, i); exit(4); }
    }
}

static void *worker(void *arg) {
    (void)arg;
    if (cuCtxSetCurrent(context)) { fprintf(stderr, "alloc_free: cuCtxSetCurrent failed\n"); exit(2); }
    pairs(iterations / 10);
    pthread_barrier_wait(&ready);
    pthread_barrier_wait(&go);
    pairs(iterations);
    return NULL;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    iterations = argc > 2 ? atol(argv[2]) : 1000000;
    if (argc > 3) size = strtoull(argv[3], NULL, 10);
    if (threads < 1 || threads > MAX_THREADS || iterations < 1 || size == 0) {
        fprintf(stderr, "usage: alloc_free THREADS(1-%d) ITERATIONS [SIZE]\n", MAX_THREADS);
        return 64;
    }
    CUdevice device;
    if (cuInit(0) || cuDeviceGet(&device, 0) || cuDevicePrimaryCtxRetain(&context, device)) {
        fprintf(stderr, "alloc_free: driver set-up failed\n");
        return 1;
    }
    pthread_t ids[MAX_THREADS];
    pthread_barrier_init(&ready, NULL, threads + 1);
    pthread_barrier_init(&go, NULL, threads + 1);
    for (int t = 0; t < threads; t++) pthread_create(&ids[t], NULL, worker, NULL);
    pthread_barrier_wait(&ready); /* every thread has warmed up */
    double start = clock_ns(CLOCK_MONOTONIC), cpu_start = clock_ns(CLOCK_PROCESS_CPUTIME_ID);
    pthread_barrier_wait(&go);
    for (int t = 0; t < threads; t++) pthread_join(ids[t], NULL);
    double elapsed = clock_ns(CLOCK_MONOTONIC) - start;
    double cpu = clock_ns(CLOCK_PROCESS_CPUTIME_ID) - cpu_start;
    printf("threads=%d iterations=%ld ns_per_pair=%.1f cpu_ns_per_pair=%.1f\n", threads, iterations,
           elapsed / iterations, cpu / ((double)iterations * threads));
    return 0;
}
