/* Test client for the shim: reaches the (fake) driver one of three ways, chosen at run time by
 * argv[1]: "linked" (direct calls), "dlsym" (dlopen libcuda.so.1 + dlsym, like JAX's plugin),
 * "procaddr" (dlsym cuGetProcAddress_v2 only, then everything through it, like the runtime).
 * The rest of argv is a script; each command prints "<command> rc=<result> [values]":
 *   init | ctx DEV | newctx DEV | info | total DEV | alloc BYTES | pitch W H | managed BYTES
 *   async BYTES | pool BYTES | create DEV BYTES | free-all | fork (child runs the rest, parent
 *   waits and prints "child exit=<status>") | exec (the same pid runs the rest as a fresh image
 *   of this program; its CUDA state is gone, as after any exec) | spawn (posix_spawn a new
 *   process of this program for the rest, wait, print "spawned exit=<status>") | vfork (the
 *   same through vfork + exec) | pause MS | ptsz-calls (how many calls
 *   reached the fake driver's _ptsz entry points) | exit
 * CLIENT_PER_THREAD_STREAM=1: "procaddr" asks for the per-thread-default-stream variants.
 * Build: cc client.c -L<fake dir> -l:libcuda.so.1 -ldl -o client */
#include <dlfcn.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

CUresult cuInit(unsigned);
CUresult cuDevicePrimaryCtxRetain(void **, int);
CUresult cuCtxSetCurrent(void *);
CUresult cuCtxCreate_v2(void **, unsigned, int);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuDeviceTotalMem_v2(size_t *, int);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemAllocPitch_v2(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
CUresult cuMemAllocManaged(CUdeviceptr *, size_t, unsigned);
CUresult cuMemAllocAsync(CUdeviceptr *, size_t, void *);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *, size_t, void *, void *);
CUresult cuMemCreate(unsigned long long *, size_t, const void *, unsigned long long);
CUresult cuMemRelease(unsigned long long);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemFreeAsync(CUdeviceptr, void *);
CUresult cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *);

static struct {
    CUresult (*init)(unsigned);
    CUresult (*retain)(void **, int);
    CUresult (*set_current)(void *);
    CUresult (*ctx_create)(void **, unsigned, int);
    CUresult (*info)(size_t *, size_t *);
    CUresult (*total)(size_t *, int);
    CUresult (*alloc)(CUdeviceptr *, size_t);
    CUresult (*pitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
    CUresult (*managed)(CUdeviceptr *, size_t, unsigned);
    CUresult (*async)(CUdeviceptr *, size_t, void *);
    CUresult (*pool)(CUdeviceptr *, size_t, void *, void *);
    CUresult (*create)(unsigned long long *, size_t, const void *, unsigned long long);
    CUresult (*release)(unsigned long long);
    CUresult (*free)(CUdeviceptr);
    CUresult (*free_async)(CUdeviceptr, void *);
} d;

static void *get(const char *how, void *lib, const char *versioned, const char *base) {
    void *fn = NULL;
    if (strcmp(how, "dlsym") == 0) fn = dlsym(lib, versioned);
    else {
        CUresult (*gpa)(const char *, void **, int, unsigned long long, int *) = dlsym(lib, "cuGetProcAddress_v2");
        /* CLIENT_PER_THREAD_STREAM=1: ask for the per-thread-default-stream variants, as code
         * built with --default-stream per-thread does. */
        unsigned long long flags = getenv("CLIENT_PER_THREAD_STREAM") ? 2 : 0;
        if (!gpa || gpa(base, &fn, 12080, flags, NULL)) fn = NULL;
    }
    if (!fn) { printf("missing %s\n", versioned); exit(65); }
    return fn;
}

static void load(const char *how) {
    if (strcmp(how, "linked") == 0) {
        d.init = cuInit; d.retain = cuDevicePrimaryCtxRetain; d.set_current = cuCtxSetCurrent;
        d.ctx_create = cuCtxCreate_v2; d.info = cuMemGetInfo_v2; d.total = cuDeviceTotalMem_v2;
        d.alloc = cuMemAlloc_v2; d.pitch = cuMemAllocPitch_v2; d.managed = cuMemAllocManaged;
        d.async = cuMemAllocAsync; d.pool = cuMemAllocFromPoolAsync; d.create = cuMemCreate;
        d.release = cuMemRelease; d.free = cuMemFree_v2; d.free_async = cuMemFreeAsync;
        return;
    }
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) { printf("dlopen failed\n"); exit(65); }
    d.init = get(how, lib, "cuInit", "cuInit");
    d.retain = get(how, lib, "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain");
    d.set_current = get(how, lib, "cuCtxSetCurrent", "cuCtxSetCurrent");
    d.ctx_create = get(how, lib, "cuCtxCreate_v2", "cuCtxCreate");
    d.info = get(how, lib, "cuMemGetInfo_v2", "cuMemGetInfo");
    d.total = get(how, lib, "cuDeviceTotalMem_v2", "cuDeviceTotalMem");
    d.alloc = get(how, lib, "cuMemAlloc_v2", "cuMemAlloc");
    d.pitch = get(how, lib, "cuMemAllocPitch_v2", "cuMemAllocPitch");
    d.managed = get(how, lib, "cuMemAllocManaged", "cuMemAllocManaged");
    d.async = get(how, lib, "cuMemAllocAsync", "cuMemAllocAsync");
    d.pool = get(how, lib, "cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync");
    d.create = get(how, lib, "cuMemCreate", "cuMemCreate");
    d.release = get(how, lib, "cuMemRelease", "cuMemRelease");
    d.free = get(how, lib, "cuMemFree_v2", "cuMemFree");
    d.free_async = get(how, lib, "cuMemFreeAsync", "cuMemFreeAsync");
}

int main(int argc, char **argv) {
    static CUdeviceptr live[1024];
    static unsigned long long handles[1024];
    int nlive = 0, nhandles = 0;
    setvbuf(stdout, NULL, _IOLBF, 0);
    load(argv[1]);
    for (int i = 2; i < argc; i++) {
        const char *c = argv[i];
        CUresult rc = 0;
        if (!strcmp(c, "init")) { rc = d.init(0); printf("init rc=%d\n", rc); }
        else if (!strcmp(c, "ctx") || !strcmp(c, "newctx")) {
            void *ctx = NULL;
            int dev = atoi(argv[++i]);
            rc = !strcmp(c, "ctx") ? d.retain(&ctx, dev) : d.ctx_create(&ctx, 0, dev);
            if (!rc) d.set_current(ctx);
            printf("%s rc=%d\n", c, rc);
        } else if (!strcmp(c, "info")) {
            size_t f = 0, t = 0;
            rc = d.info(&f, &t);
            printf("info rc=%d free=%zu total=%zu\n", rc, f, t);
        } else if (!strcmp(c, "total")) {
            size_t t = 0;
            rc = d.total(&t, atoi(argv[++i]));
            printf("total rc=%d %zu\n", rc, t);
        } else if (!strcmp(c, "alloc") || !strcmp(c, "managed") || !strcmp(c, "async") || !strcmp(c, "pool")) {
            CUdeviceptr p = 0;
            size_t n = strtoull(argv[++i], NULL, 10);
            if (!strcmp(c, "alloc")) rc = d.alloc(&p, n);
            else if (!strcmp(c, "managed")) rc = d.managed(&p, n, 1);
            else if (!strcmp(c, "async")) rc = d.async(&p, n, NULL);
            else rc = d.pool(&p, n, NULL, NULL);
            if (!rc) live[nlive++] = p;
            printf("%s rc=%d\n", c, rc);
        } else if (!strcmp(c, "pitch")) {
            CUdeviceptr p = 0;
            size_t pitch = 0, w = strtoull(argv[i + 1], NULL, 10), h = strtoull(argv[i + 2], NULL, 10);
            i += 2;
            rc = d.pitch(&p, &pitch, w, h, 4);
            if (!rc) live[nlive++] = p;
            printf("pitch rc=%d pitch=%zu\n", rc, pitch);
        } else if (!strcmp(c, "create")) {
            int prop[8] = {1, 0, 1, atoi(argv[i + 1]), 0, 0, 0, 0};
            unsigned long long h = 0;
            rc = d.create(&h, strtoull(argv[i + 2], NULL, 10), prop, 0);
            i += 2;
            if (!rc) handles[nhandles++] = h;
            printf("create rc=%d\n", rc);
        } else if (!strcmp(c, "free-all")) {
            for (int k = 0; k < nlive; k++) rc |= (k % 2 ? d.free_async(live[k], NULL) : d.free(live[k]));
            for (int k = 0; k < nhandles; k++) rc |= d.release(handles[k]);
            nlive = nhandles = 0;
            printf("free-all rc=%d\n", rc);
        } else if (!strcmp(c, "fork")) {
            pid_t pid = fork();
            if (pid == 0) continue;
            int status = 0;
            waitpid(pid, &status, 0);
            printf("child exit=%d\n", WEXITSTATUS(status));
            return 0;
        } else if (!strcmp(c, "spawn") || !strcmp(c, "vfork")) {
            char **rest = calloc(argc, sizeof *rest);
            rest[0] = argv[0];
            rest[1] = argv[1];
            for (int k = i + 1; k < argc; k++) rest[k - i + 1] = argv[k];
            pid_t pid = -1;
            if (!strcmp(c, "spawn")) {
                if (posix_spawn(&pid, "/proc/self/exe", NULL, NULL, rest, environ)) pid = -1;
            } else if ((pid = vfork()) == 0) {
                execve("/proc/self/exe", rest, environ);
                _exit(127);
            }
            int status = 0;
            if (pid > 0) waitpid(pid, &status, 0);
            printf("spawned exit=%d\n", pid > 0 ? WEXITSTATUS(status) : -1);
            return 0;
        } else if (!strcmp(c, "exec")) {
            char **rest = calloc(argc, sizeof *rest);
            rest[0] = argv[0];
            rest[1] = argv[1];
            for (int k = i + 1; k < argc; k++) rest[k - i + 1] = argv[k];
            execv("/proc/self/exe", rest);
            printf("exec failed\n");
            return 66;
        } else if (!strcmp(c, "pause")) {
            usleep(1000 * atoi(argv[++i]));
        } else if (!strcmp(c, "ptsz-calls")) {
            int *calls = dlsym(RTLD_DEFAULT, "ptsz_calls");
            printf("ptsz-calls %d\n", calls ? *calls : -1);
        } else if (!strcmp(c, "exit")) return 0;
        else { printf("bad command %s\n", c); return 64; }
    }
    return 0;
}
