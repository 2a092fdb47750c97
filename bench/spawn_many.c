/* Starts N copies of a program at once and waits for all of them: the start-up benchmark's
 * launcher (scripts/bench.py runs it with and without the shim, same program, same N).
 *
 * Usage: spawn_many N PROGRAM [ARGS...]
 * Prints one line: "processes=N seconds=S failed=F": S from the first spawn to the last exit,
 * F how many exited with a non-zero status (or could not be started). Exits 1 if F > 0.
 * Children are started with posix_spawn (vfork-like, cheap for the launcher) and inherit the
 * environment, LD_PRELOAD and LD_LIBRARY_PATH included. */
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>

extern char **environ;

int main(int argc, char **argv) {
    if (argc < 3 || atoi(argv[1]) < 1) {
        fprintf(stderr, "usage: spawn_many N PROGRAM [ARGS...]\n");
        return 64;
    }
    int count = atoi(argv[1]), failed = 0, started = 0;
    struct timespec start, end;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (int i = 0; i < count; i++) {
        pid_t pid;
        if (posix_spawn(&pid, argv[2], NULL, NULL, &argv[2], environ) != 0) failed++;
        else started++;
    }
    for (int i = 0; i < started; i++) {
        int status;
        if (wait(&status) < 0) break;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) failed++;
    }
    clock_gettime(CLOCK_MONOTONIC, &end);
    double seconds = (end.tv_sec - start.tv_sec) + (end.tv_nsec - start.tv_nsec) * 1e-9;
    printf("processes=%d seconds=%.4f failed=%d\n", count, seconds, failed);
    return failed ? 1 : 0;
}
