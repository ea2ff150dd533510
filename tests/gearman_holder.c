/* A rogue Gearman worker made of libgearman alone (no gearfarm code): it takes one job of a
 * function, keeps its bytes, and holds it, sending WORK_STATUS every second as a live worker's
 * heartbeat would, for a given time; then it fails the job. What tests/farm/test_authority.py
 * attacks the farm's leases with: anything that reaches gearmand can do this.
 *
 *   gearman_holder HOST PORT FUNCTION SECONDS OUTFILE
 *
 * Built by the test: cc -std=c11 -Wall -Wextra -Werror gearman_holder.c -lgearman */

#define _POSIX_C_SOURCE 200809L
#include <libgearman/gearman.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static long hold_seconds;
static const char *out_path;

static void *hold(gearman_job_st *job, void *context, size_t *result_size, gearman_return_t *ret)
{
    (void)context;
    FILE *f = fopen(out_path, "wb");
    if (f != NULL) {
        fwrite(gearman_job_workload(job), 1, gearman_job_workload_size(job), f);
        fclose(f);
    }
    fprintf(stderr, "holding %s\n", gearman_job_handle(job));
    for (long i = 1; i <= hold_seconds; i++) {
        struct timespec second = {1, 0};
        nanosleep(&second, NULL);
        if (gearman_job_send_status(job, (uint32_t)i, 0) != GEARMAN_SUCCESS) {
            fprintf(stderr, "status failed at %ld\n", i);
            break;
        }
    }
    *result_size = 0;
    *ret = GEARMAN_WORK_FAIL;
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: %s HOST PORT FUNCTION SECONDS OUTFILE\n", argv[0]);
        return 2;
    }
    hold_seconds = atol(argv[4]);
    out_path = argv[5];
    gearman_worker_st *w = gearman_worker_create(NULL);
    if (w == NULL || gearman_worker_add_server(w, argv[1], (in_port_t)atoi(argv[2])) != GEARMAN_SUCCESS ||
        gearman_worker_add_function(w, argv[3], 0, hold, NULL) != GEARMAN_SUCCESS) {
        fprintf(stderr, "cannot set up the worker\n");
        return 2;
    }
    gearman_return_t rc = gearman_worker_work(w);
    gearman_worker_free(w);
    return rc == GEARMAN_SUCCESS || rc == GEARMAN_WORK_FAIL ? 0 : 1;
}
