/* THREADS threads start together and each makes its first CUDA call at once: cuInit, then
 * (if that worked) a context and one allocation of BYTES. Prints how many cuInit calls were
 * refused (CUDA_ERROR_NO_DEVICE), how many allocations succeeded and how many were refused.
 *   racers THREADS BYTES */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
CUresult cuInit(unsigned);
CUresult cuDevicePrimaryCtxRetain(void **, int);
CUresult cuCtxSetCurrent(void *);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);

static pthread_barrier_t start;
static _Atomic int init_refused, allocated, alloc_refused;
static size_t bytes;

static void *racer(void *arg) {
    (void)arg;
    pthread_barrier_wait(&start);
    if (cuInit(0) == 100) { atomic_fetch_add(&init_refused, 1); return NULL; }
    void *ctx;
    CUdeviceptr p;
    if (cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx)) return NULL;
    CUresult rc = cuMemAlloc_v2(&p, bytes);
    if (rc == 0) atomic_fetch_add(&allocated, 1);
    else if (rc == 2) atomic_fetch_add(&alloc_refused, 1);
    return NULL;
}

int main(int argc, char **argv) {
    int threads = atoi(argv[1]);
    bytes = strtoull(argv[2], NULL, 10);
    pthread_t t[256];
    pthread_barrier_init(&start, NULL, threads);
    for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, racer, NULL);
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    printf("init_refused=%d allocated=%d alloc_refused=%d\n", atomic_load(&init_refused),
           atomic_load(&allocated), atomic_load(&alloc_refused));
    return 0;
}
