"""What the assistant says when no one else is talking: a re-prompt to a caller who has gone quiet (and
after enough of them, goodbye), and a filler while a function it called takes its time.

The nudge is a message read after the conversation for that one reply (never added to it), so the model
answers in the conversation's own voice and language and its prefix stays cached.
"""

from voicepipe.pipeline.events import IdleTimedOut
from voicepipe.pipeline.requests import ResponseRequested

REPROMPT = ("[The caller has said nothing for {seconds:g} seconds. In one short sentence, check that they are "
            "still there or invite them to go on.]")
GOODBYE = ("[The caller has not answered for {seconds:g} seconds. Say a short, friendly goodbye in one "
           "sentence; the call ends after it.]")


def filler_reply(phrase: str) -> ResponseRequested:
    """A set phrase while a function's result is on its way: no model step, so it is heard at once (the
    default model, asked for a few words of its own, spoke of "a function called weather")."""
    return ResponseRequested(say=phrase)


def idle_reply(event: IdleTimedOut, prompts: int | None, spoken: bool) -> ResponseRequested:
    """The reply to an idle timeout: a re-prompt, or the goodbye once `prompts` re-prompts went unanswered
    (`prompts` None: never)."""
    last = prompts is not None and event.unanswered >= prompts
    seconds = round((event.audio_end_ms - event.audio_start_ms) / 1000, 1)
    nudge = (GOODBYE if last else REPROMPT).format(seconds=seconds)
    return ResponseRequested(audio=spoken, pending=({"role": "user", "content": nudge},), last=last)
