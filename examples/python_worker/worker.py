#!/usr/bin/env python3
"""A Ferry task worker that uses only the Python standard library.

It speaks Ferry's worker protocol (docs/workers.md):

  POST /api/v1/tasks/claim           long-poll for tasks of some types
  POST /api/v1/tasks/{id}/heartbeat  extend the lease; learn about cancellation
  POST /api/v1/tasks/{id}/complete   report a result
  POST /api/v1/tasks/{id}/fail       report an error, retryable or not

Run it with

  FERRY_API_KEY=... python3 worker.py --server http://127.0.0.1:8080 --types 'content.%'

Add your own handlers to HANDLERS below (or with the @handler decorator).
A handler receives a Task and returns a JSON-serialisable result, which
becomes the task's `result` (and `tasks.<step>.body` for a workflow step).
Raise NonRetryable for errors that another attempt cannot fix; any other
exception is retried with backoff by Ferry while attempts remain.

Execution is at least once: a task whose worker dies is handed out again
after its lease, so make handlers idempotent (the task id is a good key).
"""

import argparse
import http.client
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.request

log = logging.getLogger("ferry-worker")


# ---- what handlers see and raise ----


class NonRetryable(Exception):
    """A failure that retrying cannot fix: the task fails at once."""


class Cancelled(Exception):
    """Raised by Task.check()/Task.sleep() once the task was cancelled or
    its lease was lost; the worker then drops the attempt without reporting."""


class Task:
    """A claimed task, as handed to a handler."""

    def __init__(self, raw):
        self.id = raw["id"]
        self.type = raw["type"]
        self.payload = raw.get("payload")
        self.attempt = raw.get("attempt", 1)
        self.max_attempts = raw.get("max_attempts")
        self.run_id = raw.get("run_id")  # set for workflow `task` steps
        self.step = raw.get("step")
        self.lease_token = raw["lease_token"]
        # Set when Ferry asked to cancel the task or the lease was lost;
        # long handlers should look at it (or call check()/sleep()) often.
        self.cancelled = threading.Event()
        self.cancel_reason = ""

    def check(self):
        """Raise Cancelled if the task should stop."""
        if self.cancelled.is_set():
            raise Cancelled(self.cancel_reason)

    def sleep(self, seconds):
        """Sleep, but wake up and raise Cancelled as soon as the task is
        cancelled."""
        if self.cancelled.wait(seconds):
            raise Cancelled(self.cancel_reason)


# ---- handlers: task type -> function(task) -> result ----

HANDLERS = {}


def handler(task_type):
    """Register a handler for one versioned task type."""

    def register(fn):
        HANDLERS[task_type] = fn
        return fn

    return register


@handler("content.thumbnail.v1")
def thumbnail(task):
    payload = task.payload if isinstance(task.payload, dict) else {}
    image_id = payload.get("id")
    if not isinstance(image_id, str) or not image_id:
        raise NonRetryable('payload must be {"id": "<image id>"}')
    task.check()
    # A real worker would fetch the image, resize it and upload the result,
    # keyed by task.id so that a repeated attempt overwrites, not duplicates.
    return {"thumbnail": image_id + "-thumb.png"}


@handler("demo.fail.v1")
def always_fails(task):
    reason = "demo.fail.v1 always fails"
    if isinstance(task.payload, dict) and task.payload.get("reason"):
        reason = str(task.payload["reason"])
    raise NonRetryable(reason)


@handler("demo.sleep.v1")
def sleeper(task):
    """Sleeps payload.seconds (default 5), stopping early on cancellation."""
    seconds = 5.0
    if isinstance(task.payload, dict) and "seconds" in task.payload:
        seconds = float(task.payload["seconds"])
    task.sleep(seconds)
    return {"slept": seconds}


def echo(task):
    """Any type without its own handler: return the payload."""
    return {"echo": task.payload}


# ---- the protocol ----


class APIError(Exception):
    def __init__(self, status, body):
        self.status = status
        self.body = body
        err = body.get("error", {}) if isinstance(body, dict) else {}
        self.code = err.get("code", "")
        super().__init__("HTTP %d %s: %s" % (status, self.code, err.get("message", body)))


# The server could not be reached, or its answer was cut off or garbled.
TRANSPORT_ERRORS = (OSError, http.client.HTTPException, ValueError)


class Client:
    """The few calls a worker makes. Every call returns the `data` of the
    response, or raises APIError (an HTTP error status) or one of
    TRANSPORT_ERRORS."""

    def __init__(self, server, api_key):
        self.server = server.rstrip("/")
        self.api_key = api_key

    def call(self, method, path, body=None, timeout=30.0):
        data = None if body is None else json.dumps(body).encode("utf-8")
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Authorization", "Bearer " + self.api_key)
        req.add_header("User-Agent", "ferry-python-worker/1")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                raw = resp.read()
                return json.loads(raw)["data"] if raw else None
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                parsed = json.loads(raw)
            except ValueError:
                parsed = raw.decode("utf-8", "replace")
            raise APIError(e.code, parsed) from None

    def claim(self, types, worker_id, lease, max_tasks, wait):
        body = {"types": types, "worker_id": worker_id, "lease_seconds": lease,
                "max": max_tasks, "wait_seconds": wait}
        # The server may hold the request for `wait` seconds.
        return self.call("POST", "/api/v1/tasks/claim", body, timeout=wait + 30)

    def heartbeat(self, task, lease):
        # Give up on a slow answer well within the lease; the next beat retries.
        return self.call("POST", "/api/v1/tasks/%s/heartbeat" % task.id,
                         {"lease_token": task.lease_token, "lease_seconds": lease},
                         timeout=max(lease / 3.0, 1.0))

    def complete(self, task, result):
        return self.call("POST", "/api/v1/tasks/%s/complete" % task.id,
                         {"lease_token": task.lease_token, "result": result})

    def fail(self, task, error, retryable):
        return self.call("POST", "/api/v1/tasks/%s/fail" % task.id,
                         {"lease_token": task.lease_token, "error": error, "retryable": retryable})


class _StopClaiming(BaseException):
    """Raised by the signal handler to interrupt a long-poll claim."""


class Worker:
    def __init__(self, client, types, worker_id, concurrency=4, lease=30, wait=20,
                 once=False, max_tasks=0, grace=60.0):
        self.client = client
        self.types = types
        self.worker_id = worker_id
        self.concurrency = concurrency
        self.lease = lease
        self.wait = wait
        self.once = once
        self.max_tasks = max_tasks  # 0 = no limit
        self.grace = grace
        self.stopping = threading.Event()
        self.slots = threading.BoundedSemaphore(concurrency)
        self.threads = []
        self.claimed = 0
        self.exit_code = 0
        self._in_claim = False

    # -- shutdown --

    def install_signal_handlers(self):
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, signum, frame):
        if self.stopping.is_set():
            log.warning("second signal: exiting without waiting for in-flight tasks "
                        "(their leases will expire and other workers will redo them)")
            os._exit(1)
        log.info("%s: stop claiming, finishing in-flight tasks", signal.Signals(signum).name)
        self.stopping.set()
        if self._in_claim:
            # Abandon the long poll. Should the server have leased tasks to
            # this claim already, they come back when their lease expires.
            raise _StopClaiming()

    # -- main loop --

    def run(self):
        log.info("worker %s claiming %s (concurrency %d, lease %ss)",
                 self.worker_id, ", ".join(self.types), self.concurrency, self.lease)
        backoff = 1.0
        try:
            while not self.stopping.is_set():
                want = self._reserve_slots()
                if want == 0:
                    continue
                try:
                    self._in_claim = True
                    tasks = self.client.claim(self.types, self.worker_id, self.lease, want, self.wait)
                except _StopClaiming:
                    tasks = None
                except APIError as e:
                    if e.status < 500:  # a bad key or bad --types: retrying will not help
                        log.error("claim refused: %s", e)
                        self.exit_code = 2
                        break
                    tasks = None
                    log.warning("claim failed: %s; retrying in %.0fs", e, backoff)
                    self.stopping.wait(backoff)
                    backoff = min(backoff * 2, 30.0)
                except TRANSPORT_ERRORS as e:
                    tasks = None
                    if not self.stopping.is_set():
                        log.warning("claim failed: %s; retrying in %.0fs", e, backoff)
                        self.stopping.wait(backoff)
                        backoff = min(backoff * 2, 30.0)
                finally:
                    self._in_claim = False
                if tasks is None:
                    self._release(want)
                    continue
                backoff = 1.0
                self._release(want - len(tasks))
                for raw in tasks:
                    self._start(Task(raw))
                self.claimed += len(tasks)
                if self.max_tasks and self.claimed >= self.max_tasks:
                    log.info("claimed %d task(s), the --max-tasks limit", self.claimed)
                    break
                if self.once and not tasks:
                    log.info("no task ready; exiting (--once)")
                    break
        except _StopClaiming:
            pass
        self._drain()
        return self.exit_code

    def _reserve_slots(self):
        """Block until at least one handler slot is free; take every free
        slot (up to the --max-tasks budget). Returns how many were taken."""
        limit = min(self.concurrency, 100)  # the server hands out at most 100 per claim
        if self.max_tasks:
            limit = min(limit, self.max_tasks - self.claimed)
        while not self.slots.acquire(timeout=0.5):
            if self.stopping.is_set():
                return 0
        n = 1
        while n < limit and self.slots.acquire(blocking=False):
            n += 1
        return n

    def _release(self, n):
        for _ in range(n):
            self.slots.release()

    def _start(self, task):
        t = threading.Thread(target=self._execute, args=(task,), name="task-" + task.id, daemon=True)
        self.threads.append(t)
        t.start()

    def _drain(self):
        deadline = time.monotonic() + self.grace
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        alive = sum(t.is_alive() for t in self.threads)
        if alive:
            log.warning("%d task(s) still running after %.0fs; leaving them to lease expiry", alive, self.grace)

    # -- one task --

    def _execute(self, task):
        stop_heartbeat = threading.Event()
        hb = threading.Thread(target=self._heartbeat, args=(task, stop_heartbeat),
                              name="heartbeat-" + task.id, daemon=True)
        hb.start()
        try:
            log.info("task %s %s: attempt %s", task.id, task.type, task.attempt)
            fn = HANDLERS.get(task.type, echo)
            try:
                outcome = ("complete", fn(task))
            except Cancelled:
                outcome = None
            except NonRetryable as e:
                outcome = ("fail", str(e) or type(e).__name__, False)
            except Exception as e:  # any other error: let Ferry retry it
                outcome = ("fail", "%s: %s" % (type(e).__name__, e), True)
            if outcome and outcome[0] == "complete":
                try:
                    json.dumps(outcome[1])
                except (TypeError, ValueError) as e:
                    outcome = ("fail", "the handler's result is not JSON: %s" % e, False)
            stop_heartbeat.set()
            hb.join()
            if task.cancelled.is_set() or outcome is None:
                # Cancelled, or the lease was lost (another worker may own
                # the task now): the result must not be reported.
                log.info("task %s: dropped (%s)", task.id, task.cancel_reason or "cancelled")
                return
            self._report(task, outcome)
        finally:
            stop_heartbeat.set()
            self.slots.release()

    def _heartbeat(self, task, stop):
        """Extend the lease every lease/3 until stop is set. Flags the task
        (task.cancelled) when Ferry asks to cancel it or the lease is lost:
        a 409, or no successful heartbeat for a whole lease."""
        interval = max(self.lease / 3.0, 0.5)
        valid_until = time.monotonic() + self.lease
        while not stop.wait(interval):
            sent = time.monotonic()
            try:
                res = self.client.heartbeat(task, self.lease)
            except (APIError,) + TRANSPORT_ERRORS as e:
                if isinstance(e, APIError) and e.status == 409:  # stale_lease or task_finished
                    return self._lose(task, "lease lost (%s)" % e.code)
                if time.monotonic() >= valid_until:
                    return self._lose(task, "lease lost (no heartbeat got through for %ss)" % self.lease)
                log.warning("task %s: heartbeat: %s", task.id, e)
                continue
            if res.get("cancel_requested"):
                return self._lose(task, "cancel requested")
            valid_until = sent + self.lease

    @staticmethod
    def _lose(task, reason):
        log.info("task %s: %s; stopping it", task.id, reason)
        task.cancel_reason = reason
        task.cancelled.set()

    def _report(self, task, outcome):
        """Send the outcome, retrying while the server cannot be reached or
        answers 5xx."""
        for attempt in range(5):
            if attempt:
                time.sleep(2 ** attempt)
            try:
                if outcome[0] == "complete":
                    self.client.complete(task, outcome[1])
                    log.info("task %s: completed", task.id)
                else:
                    self.client.fail(task, outcome[1], outcome[2])
                    log.info("task %s: failed (retryable=%s): %s", task.id, outcome[2], outcome[1])
                return
            except TRANSPORT_ERRORS as e:
                log.warning("task %s: report: %s; retrying", task.id, e)
            except APIError as e:
                if e.status >= 500:
                    log.warning("task %s: report: %s; retrying", task.id, e)
                    continue
                if e.status == 409 and attempt > 0:
                    # Most likely an earlier try was recorded and only its
                    # response was lost.
                    log.info("task %s: %s after a retried report; assuming it was recorded", task.id, e.code)
                elif e.status == 409:
                    # stale_lease: the lease expired and the task was handed
                    # to another worker; task_finished: it was cancelled.
                    log.warning("task %s: report refused (%s); the result is dropped", task.id, e.code)
                elif outcome[0] == "complete":
                    # The result itself was refused (e.g. over 1 MiB).
                    log.error("task %s: result refused: %s", task.id, e)
                    outcome = ("fail", "result refused: %s" % e, False)
                    continue
                else:
                    log.error("task %s: report refused: %s", task.id, e)
                return
        log.error("task %s: could not report; the lease will expire and the task will be retried", task.id)


def main(argv=None):
    p = argparse.ArgumentParser(description="A Ferry task worker (Python standard library only).")
    p.add_argument("--server", default=os.environ.get("FERRY_SERVER", "http://127.0.0.1:8080"),
                   help="Ferry base URL (default $FERRY_SERVER or http://127.0.0.1:8080)")
    p.add_argument("--types", action="append", required=True,
                   help="task types or prefixes to claim, comma-separated or repeated: 'content.%%', 'billing.invoice.v1'")
    p.add_argument("--concurrency", type=int, default=4, help="tasks handled at once (default 4)")
    p.add_argument("--lease", type=float, default=30, help="lease in seconds; heartbeats every lease/3 (default 30)")
    p.add_argument("--wait", type=float, default=20, help="long-poll seconds per claim, at most 60 (default 20)")
    p.add_argument("--worker-id", default="py-%s-%d" % (socket.gethostname(), os.getpid()),
                   help="recorded on claims (default py-<host>-<pid>)")
    p.add_argument("--once", action="store_true", help="exit when a claim comes back empty")
    p.add_argument("--max-tasks", type=int, default=0, help="exit after handling this many tasks (0: no limit)")
    p.add_argument("--grace", type=float, default=60, help="seconds to wait for in-flight tasks at shutdown (default 60)")
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)

    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    api_key = os.environ.get("FERRY_API_KEY", "")
    if not api_key:
        p.error("set FERRY_API_KEY")
    types = [t.strip() for arg in args.types for t in arg.split(",") if t.strip()]
    if args.concurrency < 1 or not 1 <= args.lease <= 3600 or not 0 <= args.wait <= 60:
        p.error("--concurrency must be at least 1, --lease 1..3600, --wait 0..60")

    w = Worker(Client(args.server, api_key), types, args.worker_id, concurrency=args.concurrency,
               lease=args.lease, wait=args.wait, once=args.once, max_tasks=args.max_tasks, grace=args.grace)
    w.install_signal_handlers()
    return w.run()


if __name__ == "__main__":
    sys.exit(main())
