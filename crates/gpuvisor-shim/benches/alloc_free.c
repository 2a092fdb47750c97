/* Cost of one cuMemAlloc_v2 + cuMemFree_v2 pair, N threads, each with the primary context of
 * device 0 current. Run it against the driver directly and with the shim preloaded; the
 * difference is the shim's added cost. Usage: alloc_free THREADS ITERATIONS [SIZE]
 * Prints: "threads=T iterations=N ns_per_pair=X cpu_ns_per_pair=Y": X = wall time / pairs per
 * thread; Y = process CPU time / all pairs (meaningful when threads outnumber free cores).
 * Build: cc -O2 -pthread alloc_free.c -L<dir of libcuda.so.1> -l:libcuda.so.1 -o alloc_free */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
CUresult cuInit(unsigned int);
CUresult cuDevicePrimaryCtxRetain(void **, int);
CUresult cuCtxSetCurrent(void *);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);

static void *ctx;
static long iterations;
static size_t size = 1 << 20;
static pthread_barrier_t barrier;

static double clock_ns(clockid_t clock) {
    struct timespec t;
    clock_gettime(clock, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}
static double now(void) { return clock_ns(CLOCK_MONOTONIC); }

static void *worker(void *arg) {
    (void)arg;
    if (cuCtxSetCurrent(ctx)) { fprintf(stderr, "cuCtxSetCurrent failed\n"); exit(2); }
    pthread_barrier_wait(&barrier);
    for (long i = 0; i < iterations; i++) {
        CUdeviceptr p;
        if (cuMemAlloc_v2(&p, size)) { fprintf(stderr, "alloc failed at %ld\n", i); exit(3); }
        if (cuMemFree_v2(p)) { fprintf(stderr, "free failed\n"); exit(4); }
    }
    return NULL;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    iterations = argc > 2 ? atol(argv[2]) : 1000000;
    if (argc > 3) size = strtoull(argv[3], NULL, 10);
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0)) { fprintf(stderr, "init failed\n"); return 1; }
    pthread_t tid[256];
    pthread_barrier_init(&barrier, NULL, threads + 1);
    for (int t = 0; t < threads; t++) pthread_create(&tid[t], NULL, worker, NULL);
    pthread_barrier_wait(&barrier);
    double start = now(), cpu_start = clock_ns(CLOCK_PROCESS_CPUTIME_ID);
    for (int t = 0; t < threads; t++) pthread_join(tid[t], NULL);
    double elapsed = now() - start, cpu = clock_ns(CLOCK_PROCESS_CPUTIME_ID) - cpu_start;
    printf("threads=%d iterations=%ld ns_per_pair=%.1f cpu_ns_per_pair=%.1f\n", threads, iterations,
           elapsed / iterations, cpu / ((double)iterations * threads));
    return 0;
}
