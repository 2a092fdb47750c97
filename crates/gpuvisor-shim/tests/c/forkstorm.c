/* Threads allocate and free through the driver while the main thread forks children that
 * allocate and free on their own: the shim's fork handler must leave each child a clean state
 * (its own slot, empty tables) whatever the other threads were doing at the fork.
 *   forkstorm THREADS FORKS BYTES   -> prints "ok" and exits 0, or names what failed. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
CUresult cuInit(unsigned);
CUresult cuDevicePrimaryCtxRetain(void **, int);
CUresult cuCtxSetCurrent(void *);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);

static _Atomic int stop, failures;
static size_t bytes;
static void *ctx;

static void *churn(void *arg) {
    (void)arg;
    cuCtxSetCurrent(ctx);
    while (!atomic_load(&stop)) {
        CUdeviceptr p;
        if (cuMemAlloc_v2(&p, bytes) || cuMemFree_v2(p)) atomic_fetch_add(&failures, 1);
    }
    return NULL;
}

int main(int argc, char **argv) {
    int threads = atoi(argv[1]), forks = atoi(argv[2]);
    bytes = strtoull(argv[3], NULL, 10);
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx)) { printf("setup failed\n"); return 1; }
    pthread_t t[64];
    for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, churn, NULL);
    for (int i = 0; i < forks; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            CUdeviceptr p[4];
            for (int k = 0; k < 4; k++) if (cuMemAlloc_v2(&p[k], bytes)) _exit(2);
            for (int k = 0; k < 4; k++) if (cuMemFree_v2(p[k])) _exit(3);
            /* Exits holding one allocation: reclaiming the dead child returns it. */
            if (cuMemAlloc_v2(&p[0], bytes)) _exit(4);
            _exit(0);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status)) { printf("child %d failed: %d\n", i, status); atomic_fetch_add(&failures, 1); }
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    if (atomic_load(&failures)) { printf("%d failures\n", atomic_load(&failures)); return 1; }
    printf("ok\n");
    return 0;
}
