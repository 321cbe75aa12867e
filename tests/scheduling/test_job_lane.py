"""The job lane's thread: once started it works through what waits without the engine's thread."""

from scheduler.job_lane import ThreadLane
from scheduler.jobs import JobHandler, JobQueue, make_job


def test_a_started_lane_takes_the_next_jobs_waiting_itself_most_urgent_first():
    queue, handlers = JobQueue(), {"echo": JobHandler(lambda n: n)}
    lane = ThreadLane()
    lane.refill = lambda: queue.take(handlers)
    try:
        for n, deadline in ((2, 20.0), (1, 10.0), (3, 30.0)):
            queue.push(make_job("echo", (n,), deadline=deadline))
        lane.start(*queue.take(handlers))
        lane.wait(10)
        assert not lane.busy and not len(queue)
        assert [r.value for r in lane.take()] == [1, 2, 3]
    finally:
        lane.close()
