/* SPDX-License-Identifier: MIT */
/*
 * Rank discovery and a small file-based allgather for the out-of-band
 * exchanges of mscx-perf (the NCCL unique id, timings, error counts), so the
 * benchmark needs no MPI library. Ranks come from --nproc (our own fork
 * launcher) or from the environment mpirun, PMI or Slurm set.
 *
 * The exchange directory must be shared by all ranks (one host: /tmp is).
 * Each exchange k writes "s<k>.r<rank>" atomically (write, then rename) and
 * reads every rank's file of that k. A rank that starts exchange k has seen
 * every file of k-1, so every rank finished k-2: its own file of k-2 can go.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>

#include "perf.h"

#define BOOT_TIMEOUT_S 300

static int env_int(const char *const *names, int def)
{
    for (; *names; names++) {
        const char *v = getenv(*names);
        if (v && *v)
            return atoi(v);
    }
    return def;
}

static const char *env_first(const char *const *names)
{
    for (; *names; names++) {
        const char *v = getenv(*names);
        if (v && *v)
            return v;
    }
    return NULL;
}

static int make_dir(const char *dir, char *err, size_t errlen)
{
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        snprintf(err, errlen, "cannot create bootstrap directory %s: %s", dir, strerror(errno));
        return -1;
    }
    return 0;
}

int mscx_perf_boot_init(struct perf_boot *b, const struct perf_opts *o, char *err, size_t errlen)
{
    static const char *const rank_vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID",
                                            NULL};
    static const char *const size_vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", NULL};
    static const char *const local_vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                             "PMI_LOCAL_RANK", "SLURM_LOCALID", NULL};
    static const char *const job_vars[] = {"OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_ess_jobid",
                                           "PMIX_NAMESPACE",          "PMI_KVSNAME",
                                           "SLURM_STEP_ID",           NULL};
    const char *job, *dir;

    memset(b, 0, sizeof(*b));
    b->rank = env_int(rank_vars, 0);
    b->nranks = env_int(size_vars, 1);
    b->local_rank = env_int(local_vars, b->rank);
    if (b->nranks < 1 || b->rank < 0 || b->rank >= b->nranks) {
        snprintf(err, errlen, "bad rank %d of %d from the launcher's environment", b->rank, b->nranks);
        return -1;
    }
    if (b->nranks == 1)
        return 0;
    dir = o->boot_dir ? o->boot_dir : getenv("MSCX_PERF_BOOTSTRAP_DIR");
    if (dir && *dir) {
        snprintf(b->dir, sizeof(b->dir), "%s", dir);
    } else if ((job = env_first(job_vars)) != NULL) {
        const char *jid = getenv("SLURM_JOB_ID");
        snprintf(b->dir, sizeof(b->dir), "/tmp/mscx-perf-%s%s%s", jid ? jid : "", jid ? "." : "", job);
        for (char *p = b->dir + 5; *p; p++)
            if (*p == '/' || *p == ':' || *p == ' ')
                *p = '_';
    } else {
        snprintf(err, errlen,
                 "%d ranks but no job id in the environment: pass --bootstrap-dir DIR (shared, empty)",
                 b->nranks);
        return -1;
    }
    return make_dir(b->dir, err, errlen);
}

static void boot_path(const struct perf_boot *b, unsigned seq, int rank, char *buf, size_t len)
{
    snprintf(buf, len, "%s/s%u.r%d", b->dir, seq, rank);
}

static int read_exact(const char *path, void *dst, size_t bytes)
{
    int fd = open(path, O_RDONLY);
    size_t got = 0;
    if (fd < 0)
        return -1;
    while (got < bytes) {
        ssize_t n = read(fd, (char *)dst + got, bytes - got);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    close(fd);
    return got == bytes ? 0 : -1;
}

int mscx_perf_allgather(struct perf_boot *b, const void *mine, void *all, size_t bytes)
{
    char path[600], tmp[640];
    unsigned seq = b->seq++;
    struct timespec nap = {0, 100000};
    time_t deadline;
    int fd;

    if (b->nranks == 1) {
        memcpy(all, mine, bytes);
        return 0;
    }
    boot_path(b, seq, b->rank, path, sizeof(path));
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || write(fd, mine, bytes) != (ssize_t)bytes || close(fd) != 0 || rename(tmp, path) != 0) {
        fprintf(stderr, "mscx-perf: rank %d: cannot write %s: %s\n", b->rank, path, strerror(errno));
        return -1;
    }
    if (seq >= 2) {
        boot_path(b, seq - 2, b->rank, tmp, sizeof(tmp));
        unlink(tmp);
    }
    deadline = time(NULL) + BOOT_TIMEOUT_S;
    for (int q = 0; q < b->nranks; q++) {
        boot_path(b, seq, q, path, sizeof(path));
        while (read_exact(path, (char *)all + (size_t)q * bytes, bytes) != 0) {
            if (time(NULL) > deadline) {
                fprintf(stderr, "mscx-perf: rank %d: rank %d did not reach exchange %u within %d s (%s)\n",
                        b->rank, q, seq, BOOT_TIMEOUT_S, b->dir);
                return -1;
            }
            nanosleep(&nap, NULL);
        }
    }
    return 0;
}

void mscx_perf_boot_fini(struct perf_boot *b)
{
    char path[600];
    int dummy = 0, *all;
    if (b->nranks <= 1)
        return;
    all = calloc((size_t)b->nranks, sizeof(int));
    /* After this exchange every rank has read every earlier file. */
    if (all && mscx_perf_allgather(b, &dummy, all, sizeof(int)) == 0) {
        for (unsigned k = b->seq >= 3 ? b->seq - 3 : 0; k + 1 < b->seq; k++) {
            boot_path(b, k, b->rank, path, sizeof(path));
            unlink(path);
        }
        /* The last file may still be read by a slower rank; give it time. */
        if (!b->owns_dir) {
            struct timespec grace = {0, 200000000};
            nanosleep(&grace, NULL);
            boot_path(b, b->seq - 1, b->rank, path, sizeof(path));
            unlink(path);
            if (b->rank == 0) {
                nanosleep(&grace, NULL);
                rmdir(b->dir);
            }
        }
    }
    free(all);
}

static void remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char path[1024];
    if (d == NULL)
        return;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == 's' || e->d_name[0] == '.') {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
            unlink(path);
        }
    }
    closedir(d);
    rmdir(dir);
}

int mscx_perf_boot_launch(struct perf_boot *b, const struct perf_opts *o, char *err, size_t errlen)
{
    pid_t *pids;
    int worst = 0, left = o->nproc;

    memset(b, 0, sizeof(*b));
    b->nranks = o->nproc;
    if (o->boot_dir) {
        snprintf(b->dir, sizeof(b->dir), "%s", o->boot_dir);
        if (make_dir(b->dir, err, errlen))
            return -1;
    } else {
        snprintf(b->dir, sizeof(b->dir), "/tmp/mscx-perf-XXXXXX");
        if (mkdtemp(b->dir) == NULL) {
            snprintf(err, errlen, "cannot create a bootstrap directory in /tmp: %s", strerror(errno));
            return -1;
        }
    }
    b->owns_dir = 1;
    pids = calloc((size_t)o->nproc, sizeof(*pids));
    if (pids == NULL) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    fflush(NULL);
    for (int r = 0; r < o->nproc; r++) {
        pid_t p = fork();
        if (p < 0) {
            snprintf(err, errlen, "fork: %s", strerror(errno));
            for (int k = 0; k < r; k++)
                kill(pids[k], SIGTERM);
            free(pids);
            return -1;
        }
        if (p == 0) {
            free(pids);
            b->rank = b->local_rank = r;
            return 0;
        }
        pids[r] = p;
    }
    while (left > 0) {
        int status, code;
        pid_t p = wait(&status);
        if (p < 0)
            break;
        left--;
        for (int k = 0; k < o->nproc; k++)
            if (pids[k] == p)
                pids[k] = 0; /* reaped: its pid may be reused, never signal it again */
        code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
        if (code != 0 && worst == 0) {
            worst = code;
            /* One rank failed: the others would wait for it until the exchange times out. */
            for (int k = 0; k < o->nproc; k++)
                if (pids[k] > 0)
                    kill(pids[k], SIGTERM);
        }
    }
    free(pids);
    remove_dir(b->dir);
    exit(worst);
}
