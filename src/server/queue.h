/*
 * queue.h - the request queue in front of the engine.
 *
 * Requests wait in a bounded FIFO for one of n_workers worker threads
 * (the server starts --max-running of them: each running request drives
 * its own sequence, and the engine's scheduler, session/sched.h, batches
 * their forwards into one step). A job is a struct the caller embeds in
 * its own request state:
 *
 *     struct my_req { struct ksv_job job; ... };
 *     r->job.run = my_run;                  // called on the worker thread
 *     if (ksv_queue_submit(s, &r->job)) ... // KV_ERR_FULL: queue bound hit
 *
 * Life of a job: QUEUED -> RUNNING -> DONE, or QUEUED -> CANCELLED when it
 * is cancelled before a worker took it (its run function is then never
 * called). ksv_queue_cancel also sets job->cancel, which a running job
 * polls between engine steps (prefill chunks, decode tokens), so a
 * disconnected client stops its generation within one step.
 *
 * Ownership: the queue never frees a job. The caller keeps it alive
 * until ksv_queue_wait() returned, its done callback ran, or
 * ksv_queue_cancel() returned 1 (removed before running). Thread-safe.
 */
#ifndef KV_SERVER_QUEUE_H
#define KV_SERVER_QUEUE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

enum ksv_job_state { KSV_JOB_NEW = 0, KSV_JOB_QUEUED, KSV_JOB_RUNNING, KSV_JOB_DONE, KSV_JOB_CANCELLED };

struct ksv_job {
	void (*run)(struct ksv_job *job); /* the work; runs on a worker thread */
	/* Optional: called on the worker thread after the job became DONE; the
	 * queue never touches the job again, so done may free it. */
	void (*done)(struct ksv_job *job);
	atomic_int cancel;                /* set by ksv_queue_cancel; run polls it */
	int state;                        /* enum ksv_job_state, under the queue lock */
	uint64_t t_submit_ns;             /* kv_now_ns at submit */
	uint64_t t_start_ns;              /* when a worker took it */
	struct ksv_job *next;             /* queue link, private */
};

struct ksv_queue;

/* max_queue: jobs allowed to wait (not counting running ones), >= 0. */
struct ksv_queue *ksv_queue_create(int n_workers, int max_queue);
/* Cancels every queued job, sets cancel on running ones, waits for the
 * workers to finish them and frees the queue. */
void ksv_queue_destroy(struct ksv_queue *s);

/* Queue a job. KV_ERR_FULL when max_queue jobs already wait, KV_ERR_CANCELLED
 * after ksv_queue_close. */
int ksv_queue_submit(struct ksv_queue *s, struct ksv_job *job);
/*
 * Cancel a job: a queued one is removed and marked CANCELLED (returns 1);
 * a running one gets job->cancel = 1 and finishes on its own (returns 0);
 * a finished one is left alone (returns 0).
 */
int ksv_queue_cancel(struct ksv_queue *s, struct ksv_job *job);
/* Block until the job is DONE or CANCELLED; returns its final state. */
int ksv_queue_wait(struct ksv_queue *s, struct ksv_job *job);
/* Like ksv_queue_wait with a timeout in ms: returns the state, which is
 * still QUEUED or RUNNING if the time ran out. */
int ksv_queue_wait_ms(struct ksv_queue *s, struct ksv_job *job, int ms);
/* Current state of a job (under the lock). */
int ksv_queue_state(struct ksv_queue *s, struct ksv_job *job);

/* Refuse new jobs and cancel the queued ones (shutdown); running jobs get
 * their cancel flag when `cancel_running` is set. */
void ksv_queue_close(struct ksv_queue *s, int cancel_running);

/* Jobs waiting / running right now. */
int ksv_queue_queued(struct ksv_queue *s);
int ksv_queue_running(struct ksv_queue *s);

#endif
