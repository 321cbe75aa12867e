"""`voicepipe serve --replicas 2` on a Ray instance started by the command on this machine: calls spread
over the replicas, text requests reach both, a killed replica ends its calls with an error and comes back,
and shutdown leaves no Ray process behind. One server for the module (each replica loads the models)."""

import asyncio
import json
import os
import re
import signal
import socket
import sys
import time
from pathlib import Path

import psutil
import pytest
import pytest_asyncio
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from support.helpers import LONG_QUESTION, QUESTION, SAMPLE_RATE, Call

from voicepipe.audio import read_audio
from voicepipe.cluster.fleet_metrics import merge
from voicepipe.cluster.placement import Placement, PlacementError, place
from voicepipe.protocol import ServerEvent

pytest.importorskip("ray.serve")


def on_cluster(test):
    """A slow test against the module's server, on the module's event loop."""
    return pytest.mark.slow(pytest.mark.asyncio(loop_scope="module")(test))


REPLICA_HEADER = "x-voicepipe-replica"
START_TIMEOUT_S = 300  # Ray, then two replicas loading the models side by side on 2 cores
INFO = re.compile(r'voicepipe_replica_info\{host="[^"]*",pid="(\d+)",replica="([^"]+)"\}')


def ray_processes() -> set[int]:
    """Processes of any Ray instance: its daemons and its workers."""
    found = set()
    for proc in psutil.process_iter(["pid", "cmdline"]):
        line = " ".join(proc.info["cmdline"] or [])
        if line.startswith("ray::") or "site-packages/ray/" in line:
            found.add(proc.info["pid"])
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    def __init__(self, process: asyncio.subprocess.Process, port: int, log: Path, before: set[int]) -> None:
        self.process, self.port, self.log, self.before = process, port, log, before

    async def get(self, path: str, body: dict | None = None, headers: dict | None = None
                  ) -> tuple[int, dict[str, str], bytes]:
        """A plain HTTP/1.1 request through Ray's proxy (a GET, or a POST of `body` as JSON)."""
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        data = json.dumps(body).encode() if body is not None else b""
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        head = (f"{'POST' if body is not None else 'GET'} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{extra}"
                f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\nConnection: close\r\n\r\n")
        writer.write(head.encode() + data)
        raw = await asyncio.wait_for(reader.read(), 120)
        writer.close()
        top, _, payload = raw.partition(b"\r\n\r\n")
        status, *lines = top.decode("latin-1").split("\r\n")
        fields = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
        return int(status.split()[1]), fields, payload

    async def replica_pids(self) -> dict[str, int]:
        _, _, page = await self.get("/metrics")
        return {replica: int(pid) for pid, replica in INFO.findall(page.decode())}

    async def wait_ready(self, timeout: float = 240) -> None:
        end = time.monotonic() + timeout
        while (await self.get("/ready"))[0] != 200:
            assert time.monotonic() < end, "the replicas did not become ready"
            await asyncio.sleep(2)

    async def chat(self, text: str, headers: dict | None = None) -> str:
        """The replica that answered a short chat completion."""
        status, fields, payload = await self.get(
            "/v1/chat/completions", {"messages": [{"role": "user", "content": text}], "max_tokens": 4}, headers)
        assert status == 200, payload
        return fields[REPLICA_HEADER]


def test_replicas_take_one_gpu_each_or_a_share_of_the_cpus():
    assert place(2, "auto", {"CPU": 2.0}).actor_options == {"num_cpus": 1.0}
    assert place(3, "cpu", {"CPU": 16.0, "GPU": 4.0}) == Placement("cpu", {"num_cpus": 5.33})
    assert place(2, "auto", {"CPU": 16.0, "GPU": 2.0}) == Placement("cuda", {"num_gpus": 1, "num_cpus": 1})
    with pytest.raises(PlacementError, match="need 3 GPUs"):
        place(3, "cuda", {"CPU": 16.0, "GPU": 2.0})
    with pytest.raises(PlacementError, match="no GPUs"):
        place(1, "cuda", {"CPU": 16.0})


def test_fleet_metrics_label_each_replica_and_sum_what_adds_up():
    pages = {}
    for replica, (calls, usage) in {"a": (2, 0.25), "b": (3, 0.5)}.items():
        registry = CollectorRegistry()
        Counter("voicepipe_calls", "calls", ["api"], registry=registry).labels("native").inc(calls)
        Gauge("voicepipe_kv_cache_usage_ratio", "usage", registry=registry).set(usage)
        pages[replica] = generate_latest(registry).decode()
    page = merge(pages).decode()
    assert 'voicepipe_calls_total{api="native",replica="a"} 2.0' in page
    assert 'voicepipe_calls_total{api="native",replica="all"} 5.0' in page
    assert 'voicepipe_kv_cache_usage_ratio{replica="b"} 0.5' in page
    assert 'voicepipe_kv_cache_usage_ratio{replica="all"}' not in page


def test_a_choice_whose_request_was_never_routed_is_forgotten():
    from voicepipe.cluster.router import CHOSEN_TTL_S, CallRouter

    router = object.__new__(CallRouter)  # its state alone: no Ray cluster is needed to age a choice
    router.initialize_state()
    now = time.monotonic()
    router.chosen = {"gone": ("replica-1", now - CHOSEN_TTL_S - 1), "fresh": ("replica-1", now)}
    router.kinds = {"gone": "call", "fresh": "text"}
    router._forget_stale_choices()
    assert list(router.chosen) == ["fresh"] and list(router.kinds) == ["fresh"]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(tmp_path_factory):
    port, log = free_port(), tmp_path_factory.mktemp("cluster") / "serve.log"
    before = ray_processes()
    with open(log, "wb") as err:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "voicepipe", "serve", "--replicas", "2", "--port", str(port), "--max-tokens", "24",
            stdout=asyncio.subprocess.PIPE, stderr=err, start_new_session=True)
    try:
        line = await asyncio.wait_for(process.stdout.readline(), START_TIMEOUT_S)
        assert b"listening on" in line, f"serve did not start: {line!r}\n{log.read_text()[-3000:]}"
        yield Cluster(process, port, log, before)
    finally:
        if process.returncode is None:  # a test failed before the shutdown test: stop it anyway
            os.killpg(process.pid, signal.SIGTERM)
            await asyncio.wait_for(process.wait(), 120)


async def spoken(call: Call, audio, timeout: float = 180) -> tuple[str, int]:
    """Speak `audio` into `call` and wait for the reply: (what was heard, bytes of reply audio)."""
    await call.speak(audio)
    heard = (await call.wait(ServerEvent.TRANSCRIPT_COMPLETED, timeout=timeout))["transcript"]
    await call.wait(ServerEvent.RESPONSE_DONE, timeout=timeout)
    return heard, sum(len(frame) for _, frame in call.frames)


@on_cluster
async def test_two_calls_are_answered_on_different_replicas(cluster, speech_wav, words):
    question = read_audio(speech_wav(QUESTION), SAMPLE_RATE)
    first, second = await Call.open(cluster), await Call.open(cluster)
    try:
        places = {first.ws.response.headers[REPLICA_HEADER], second.ws.response.headers[REPLICA_HEADER]}
        assert places == set(await cluster.replica_pids()), "both calls went to one replica"
        for heard, audio_bytes in await asyncio.gather(spoken(first, question), spoken(second, question)):
            assert {"capital", "france"} <= words(heard)
            assert audio_bytes > 0
    finally:
        await first.close()
        await second.close()


@on_cluster
async def test_text_requests_reach_both_replicas(cluster):
    replicas = set(await cluster.replica_pids())
    assert len(replicas) == 2
    served = await asyncio.gather(*(cluster.chat(f"Say {n}.") for n in range(6)))
    assert set(served) == replicas
    status, _, body = await cluster.get("/ready")
    assert status == 200 and json.loads(body)["replicas"] == {"running": 2, "wanted": 2}
    pattern = r'voicepipe_api_requests_total\{endpoint="chat.completions",replica="all",status="200"\} (\S+)'
    counted = 0.0
    for _ in range(50):  # each replica's figures reach the sum within a couple of seconds
        _, _, page = await cluster.get("/metrics")
        total = re.search(pattern, page.decode())
        counted = float(total.group(1)) if total else 0.0
        if counted >= 6:
            break
        await asyncio.sleep(0.2)
    assert counted >= 6


@on_cluster
async def test_a_session_stays_on_its_replica(cluster):
    session = {"x-session-id": "conversation-1"}
    homes = [await cluster.chat(f"Turn {n}.", session) for n in range(6)]  # by chance: 1 in 32
    assert len(set(homes)) == 1


@on_cluster
async def test_a_killed_replica_ends_its_calls_and_comes_back(cluster, speech_wav, words):
    question = read_audio(speech_wav(QUESTION), SAMPLE_RATE)
    pids = await cluster.replica_pids()
    doomed, survivor = await Call.open(cluster), await Call.open(cluster)
    try:
        assert doomed.ws.response.headers[REPLICA_HEADER] != survivor.ws.response.headers[REPLICA_HEADER]
        await doomed.speak(read_audio(speech_wav(LONG_QUESTION), SAMPLE_RATE))
        await doomed.wait(ServerEvent.RESPONSE_CREATED, timeout=120)
        finishing = asyncio.create_task(spoken(survivor, question))
        os.kill(pids[doomed.ws.response.headers[REPLICA_HEADER]], signal.SIGKILL)
        error = await doomed.wait(ServerEvent.ERROR, timeout=30)
        assert error["error"]["code"] == "replica_lost"
        heard, audio_bytes = await finishing
        assert {"capital", "france"} <= words(heard) and audio_bytes > 0
    finally:
        await doomed.close()
        await survivor.close()
    await cluster.wait_ready()
    assert len(await cluster.replica_pids()) == 2
    late = await Call.open(cluster)
    try:
        heard, audio_bytes = await spoken(late, question)
        assert {"capital", "france"} <= words(heard) and audio_bytes > 0
    finally:
        await late.close()


@on_cluster
async def test_shutdown_leaves_no_ray_process(cluster):
    started = ray_processes() - cluster.before
    assert started, "no Ray process was found while serving"
    cluster.process.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(cluster.process.wait(), 120) == 0
    end = time.monotonic() + 30
    while (left := started & ray_processes()) and time.monotonic() < end:
        await asyncio.sleep(1)
    assert not left, f"Ray processes left behind: {left}"
