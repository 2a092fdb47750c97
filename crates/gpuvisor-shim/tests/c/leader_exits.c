/* The main thread allocates, starts a worker that keeps running for SECONDS, prints "ready"
 * and calls pthread_exit: /proc then shows the process as a zombie ('Z') although its worker
 * runs on and the allocation is still in use.   leader_exits BYTES SECONDS */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
CUresult cuInit(unsigned);
CUresult cuDevicePrimaryCtxRetain(void **, int);
CUresult cuCtxSetCurrent(void *);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);

static int seconds;
static void *worker(void *arg) { (void)arg; sleep(seconds); return NULL; }

int main(int argc, char **argv) {
    (void)argc;
    void *ctx;
    CUdeviceptr p;
    seconds = atoi(argv[2]);
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx) ||
        cuMemAlloc_v2(&p, strtoull(argv[1], NULL, 10))) { printf("setup failed\n"); return 1; }
    pthread_t t;
    pthread_create(&t, NULL, worker, NULL);
    printf("ready\n");
    fflush(stdout);
    pthread_exit(NULL);
}
