/* Refusals under contention: N processes of one budget group, all registered and alive, each
 * try K allocations of 1 MiB that the group's budget refuses, all at once.
 * Usage: refusals N K. Prints one line:
 *   processes=N refusals=R refused=D wall_s=W cpu_ns_per_refusal=C max_cpu_ns_per_refusal=M
 * R = N*K attempts, D = those refused (rc 2); W = from the start signal to the last child done;
 * C = total CPU time (user+system) of the children's refusal loops / R; M = the worst child's.
 * Every child stays alive until all are done, so the group has N live processes throughout.
 * Each child makes one warm-up attempt before the start signal (not counted).
 * Build: cc -O2 refusals.c -L<fake dir> -l:libcuda.so.1 -o refusals */
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
CUresult cuInit(unsigned);
CUresult cuDevicePrimaryCtxRetain(void **, int);
CUresult cuCtxSetCurrent(void *);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: refusals N K\n"); return 64; }
    int n = atoi(argv[1]), k = atoi(argv[2]);
    int ready[2], go[2], done[2], results[2];
    if (pipe(ready) || pipe(go) || pipe(done) || pipe(results)) { perror("pipe"); return 1; }
    for (int i = 0; i < n; i++) {
        pid_t pid = fork();
        if (pid < 0) { perror("fork"); return 1; }
        if (pid == 0) {
            close(ready[0]); close(go[1]); close(done[1]); close(results[0]);
            void *ctx = NULL;
            if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx)) _exit(3);
            /* Warm up (first touch of the shim's pointer table, first refusal): not measured. */
            CUdeviceptr warm = 0;
            if (cuMemAlloc_v2(&warm, 1 << 20) == 0) cuMemFree_v2(warm);
            char c = 1, buf;
            if (write(ready[1], &c, 1) != 1) _exit(4);
            if (read(go[0], &buf, 1) != 0) _exit(5); /* EOF = start */
            long refused = 0;
            double cpu0 = cpu_ns();
            for (int j = 0; j < k; j++) {
                CUdeviceptr p = 0;
                CUresult rc = cuMemAlloc_v2(&p, 1 << 20);
                if (rc == 2) refused++;
                else if (rc == 0) cuMemFree_v2(p);
            }
            double cpu = cpu_ns() - cpu0;
            char line[128];
            int len = snprintf(line, sizeof line, "%ld %.0f\n", refused, cpu);
            if (write(results[1], line, len) != len) _exit(6);
            if (read(done[0], &buf, 1) != 0) _exit(7); /* stay alive until every child is done */
            _exit(0);
        }
    }
    close(ready[1]); close(go[0]); close(done[0]); close(results[1]);
    for (int i = 0; i < n; i++) {
        char c;
        if (read(ready[0], &c, 1) != 1) { fprintf(stderr, "a child failed to start\n"); return 1; }
    }
    double start = now();
    close(go[1]);
    FILE *in = fdopen(results[0], "r");
    long refused = 0, got = 0;
    double cpu = 0, worst = 0;
    long r; double c;
    while (got < n && fscanf(in, "%ld %lf", &r, &c) == 2) {
        refused += r; cpu += c; got++;
        if (c / k > worst) worst = c / k;
    }
    double wall = now() - start;
    close(done[1]);
    int failed = 0, status;
    while (wait(&status) > 0) if (!WIFEXITED(status) || WEXITSTATUS(status)) failed++;
    printf("processes=%d refusals=%ld refused=%ld wall_s=%.3f cpu_ns_per_refusal=%.0f max_cpu_ns_per_refusal=%.0f failed=%d\n",
           n, (long)n * k, refused, wall, got ? cpu / ((double)got * k) : 0, worst, failed);
    return got == n && !failed ? 0 : 1;
}
