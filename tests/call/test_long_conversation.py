"""A call that piles up thousands of conversation items: its next prompt is built with a constant number
of whole-prompt renders (each message measured once, as it arrives), the conversation stays within its
bounds, and the event loop keeps running its other callbacks throughout. The real tokenizer and chat
template, counted; the fake engine answers."""

import asyncio
from contextlib import asynccontextmanager
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from support.fake_transport import QueueTransport
from support.fake_transport import realtime as realtime_line
from support.fakes import FakeASR, FakeEngine, FakeTTS

from voicepipe.call.limits import Limits
from voicepipe.call.runtime import Runtime
from voicepipe.call.session import Session
from voicepipe.pipeline.conversation import Conversation
from voicepipe.protocol import ClientEvent, ServerEvent
from voicepipe.server.heap import freeze_heap, thaw_heap
from voicepipe.server.loop_lag import LoopLag
from voicepipe.server.metrics import call_metrics

MAX_PROMPT = 2048


class CountingTokenizer:
    """The real tokenizer, counting each chat template rendered and how many messages it held; what the
    fake engine reads of a prompt (which question it answers) it does not need here."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.eos_token_id = tokenizer.eos_token_id
        self.renders: list[int] = []  # messages per render, in order

    def apply_chat_template(self, messages: list[dict[str, str]], **options: Any) -> list[int]:
        self.renders.append(len(messages))
        return self.tokenizer.apply_chat_template(messages, **options)

    def last_user_message(self, ids: list[int]) -> str:
        return ""

    def last_message(self, ids: list[int]) -> str:
        return ""


@pytest.fixture(scope="module")
def tokenizer():
    from voicepipe.backends.models import load_tokenizer

    return load_tokenizer()


def message(n: int) -> dict:
    """A short text message (~45 bytes as JSON text), as the hostile client sent them."""
    return {"type": ClientEvent.ITEM_CREATE, "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": f"note {n}"}]}}


@asynccontextmanager
async def realtime_call(tokenizer: CountingTokenizer, limits: Limits):
    engine = FakeEngine(tokenizer, asr=FakeASR(""), tts=FakeTTS())
    runtime = Runtime(engine, tokenizer, "fake-model", 16000, 16000)
    client = QueueTransport()
    call = Session(realtime_line(client, runtime, limits), runtime, limits)
    served = asyncio.create_task(call.run())
    try:
        await client.until(ServerEvent.SESSION_CREATED)
        yield client, call
    finally:
        client.leave()
        await asyncio.wait_for(served, 5)


@pytest.mark.parametrize("items", [600, 3000])
async def test_thousands_of_items_then_a_reply_render_each_message_once_and_never_block_the_loop(tokenizer, items):
    counting = CountingTokenizer(tokenizer)
    lag = LoopLag(call_metrics(CollectorRegistry()).loop_lag, interval_s=0.01)
    async with realtime_call(counting, Limits()) as (client, call):
        freeze_heap()  # as a server does once it has loaded everything: no full collection scans it all again
        lag.start()
        try:
            client.put(*(message(n) for n in range(items)))
            while len(client.events("conversation.item.added")) < items:  # not `until`: it reads all per event
                await asyncio.sleep(0.05)
            before = len(counting.renders)
            client.put({"type": ClientEvent.RESPONSE_CREATE})
            done = await client.until("response.done", timeout=30)
        finally:
            lag.stop()
            thaw_heap()
        prompt_renders = counting.renders[before:]
        kept = call.conversation.items
    assert done["response"]["status"] == "completed"
    # Measuring a message renders it beside one other; the reply's prompt is the frame (instructions), then
    # one render over what fits: not one render per dropped message.
    assert max(counting.renders[:before]) <= 2
    assert len(prompt_renders) <= 3, prompt_renders
    assert sum(counting.renders) <= 2 * items + 2 * len(kept) + 10  # linear in the call's length
    assert len(kept) < items and kept[-2]["content"] == f"note {items - 1}"  # the oldest went, the newest stayed
    prompt = call.conversation.prompt_ids(MAX_PROMPT)
    assert len(prompt) <= MAX_PROMPT
    # Every other callback ran on time meanwhile (the whole-template re-render per drop held it for minutes).
    assert lag.worst < 0.2, lag.worst


def test_the_prompt_keeps_exactly_the_newest_messages_that_fit(tokenizer):
    conversation = Conversation("Be brief.", tokenizer)
    for n in range(400):
        conversation.add("user" if n % 2 else "assistant", f"message {n} " + "word " * (n % 7))
    everything = [i.copy() for i in conversation.items]
    prompt = conversation.prompt_ids(300)
    kept = conversation.items
    assert len(prompt) <= 300 and prompt == tokenizer.apply_chat_template(
        conversation.messages(), add_generation_prompt=True, tokenize=True, return_dict=False)
    one_more = everything[len(everything) - len(kept) - 1]
    longer = [{"role": "system", "content": "Be brief."}, *({"role": i["role"], "content": i["content"]}
                                                           for i in [one_more, *kept])]
    assert len(tokenizer.apply_chat_template(longer, add_generation_prompt=True, tokenize=True,
                                             return_dict=False)) > 300  # it did not drop more than it had to


def test_a_conversation_holds_at_most_its_items_and_bytes_dropping_the_oldest(tokenizer):
    by_items = Conversation("", tokenizer, max_items=100)
    for n in range(300):
        by_items.add("user", f"item {n}", f"item_{n}")
    assert len(by_items.items) == 100 and by_items.items[0]["id"] == "item_200"
    assert by_items.get("item_199") is None and by_items.get("item_250")["content"] == "item 250"
    by_bytes = Conversation("", tokenizer, max_bytes=1000)
    for n in range(50):
        by_bytes.add("user", "x" * 99 + str(n % 10))
    assert sum(len(i["content"]) for i in by_bytes.items) <= 1000 and len(by_bytes.items) == 10


async def test_item_lookups_and_deletes_in_a_long_call_answer_by_id(tokenizer):
    async with realtime_call(CountingTokenizer(tokenizer), Limits(max_conversation_items=200)) as (client, call):
        client.put(*({**message(n), "item": {**message(n)["item"], "id": f"item_{n}"}} for n in range(500)))
        added = await client.until("conversation.item.added", 500)
        assert added["previous_item_id"] == "item_498"
        client.put({"type": ClientEvent.ITEM_RETRIEVE, "item_id": "item_450"},
                   {"type": ClientEvent.ITEM_DELETE, "item_id": "item_499"},
                   {"type": ClientEvent.ITEM_RETRIEVE, "item_id": "item_10"})
        retrieved = await client.until("conversation.item.retrieved")
        assert retrieved["item"]["id"] == "item_450"
        await client.until("conversation.item.deleted")
        error = await client.until(ServerEvent.ERROR)
        assert error["error"]["code"] == "item_not_found"  # dropped as the oldest, past the bound
        client.put(message(500))
        again = await client.until("conversation.item.added", 501)
        assert again["previous_item_id"] == "item_498"  # the deleted one no longer precedes anything
        assert len(call.conversation.items) == 200


def turns_that_kept_the_prefix(tokenizer, retention: float, turns: int = 40) -> int:
    """How many turns' prompts began with the whole prompt of the turn before (what the KV cache holds)."""
    conversation = Conversation("Be brief.", tokenizer)
    conversation.retention = retention
    kept, last = 0, None
    for n in range(turns):
        conversation.add("user", f"question {n} " + "word " * 20)
        prompt = conversation.prompt_ids(400)
        assert len(prompt) <= 400
        if last is not None and prompt[:len(last) - 8] == last[:len(last) - 8]:  # less its generation prompt
            kept += 1
        conversation.add("assistant", f"answer {n} " + "word " * 20)
        last = prompt
    return kept


def test_a_retention_ratio_cuts_deeper_once_so_the_next_turns_keep_their_cached_prefix(tokenizer):
    # Cutting only what must go changes the prompt's start at every turn once the budget is reached; cutting
    # to half of it leaves room for several turns that add to the same prefix.
    assert turns_that_kept_the_prefix(tokenizer, 0.5) >= turns_that_kept_the_prefix(tokenizer, 1.0) + 10
