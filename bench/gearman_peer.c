/* libgearman's own client and worker: the floor bench/farm_speed.py measures gearfarm's Gearman
 * client and worker against, on the same gearmand.
 *
 *   gearman_peer worker HOST PORT FUNCTION JOBS   echo JOBS jobs of FUNCTION, then exit (0: forever)
 *   gearman_peer client HOST PORT FUNCTION JOBS   JOBS foreground jobs one by one; prints each
 *                                                 round trip in microseconds, one per line
 *
 * Built by the bench: cc -std=c11 -O2 -Wall -Wextra -Werror gearman_peer.c -lgearman */

#define _POSIX_C_SOURCE 200809L
#include <libgearman/gearman.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static long left_to_serve;

static void *echo(gearman_job_st *job, void *context, size_t *result_size, gearman_return_t *ret)
{
    (void)context;
    size_t n = gearman_job_workload_size(job);
    char *out = malloc(n ? n : 1);
    if (out == NULL) {
        *ret = GEARMAN_WORK_FAIL;
        return NULL;
    }
    memcpy(out, gearman_job_workload(job), n);
    *result_size = n;
    *ret = GEARMAN_SUCCESS;
    if (left_to_serve > 0)
        left_to_serve--;
    return out;
}

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int run_worker(const char *host, in_port_t port, const char *function, long jobs)
{
    gearman_worker_st *worker = gearman_worker_create(NULL);
    if (worker == NULL || gearman_worker_add_server(worker, host, port) != GEARMAN_SUCCESS ||
        gearman_worker_add_function(worker, function, 0, echo, NULL) != GEARMAN_SUCCESS) {
        fprintf(stderr, "gearman_peer worker: cannot set up: %s\n", worker ? gearman_worker_error(worker) : "");
        return 2;
    }
    left_to_serve = jobs > 0 ? jobs : -1;
    while (left_to_serve != 0) {
        gearman_return_t rc = gearman_worker_work(worker);
        if (rc != GEARMAN_SUCCESS) {
            fprintf(stderr, "gearman_peer worker: %s\n", gearman_worker_error(worker));
            gearman_worker_free(worker);
            return 1;
        }
    }
    gearman_worker_free(worker);
    return 0;
}

static int run_client(const char *host, in_port_t port, const char *function, long jobs)
{
    gearman_client_st *client = gearman_client_create(NULL);
    if (client == NULL || gearman_client_add_server(client, host, port) != GEARMAN_SUCCESS) {
        fprintf(stderr, "gearman_peer client: cannot set up\n");
        return 2;
    }
    char data[32], unique[48];
    for (long i = 0; i < jobs; i++) {
        int len = snprintf(data, sizeof data, "%ld", i);
        snprintf(unique, sizeof unique, "peer-%ld-%ld", (long)time(NULL), i);
        size_t size = 0;
        gearman_return_t rc;
        double t0 = now_us();
        void *result = gearman_client_do(client, function, unique, data, (size_t)len, &size, &rc);
        double t1 = now_us();
        if (rc != GEARMAN_SUCCESS || size != (size_t)len || memcmp(result, data, size) != 0) {
            fprintf(stderr, "gearman_peer client: job %ld: %s\n", i, gearman_client_error(client));
            free(result);
            gearman_client_free(client);
            return 1;
        }
        free(result);
        printf("%.1f\n", t1 - t0);
    }
    gearman_client_free(client);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: %s worker|client HOST PORT FUNCTION JOBS\n", argv[0]);
        return 2;
    }
    in_port_t port = (in_port_t)atoi(argv[3]);
    long jobs = atol(argv[5]);
    if (strcmp(argv[1], "worker") == 0)
        return run_worker(argv[2], port, argv[4], jobs);
    if (strcmp(argv[1], "client") == 0)
        return run_client(argv[2], port, argv[4], jobs);
    fprintf(stderr, "gearman_peer: unknown mode %s\n", argv[1]);
    return 2;
}
