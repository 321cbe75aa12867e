"""The assistant's default instructions, for calls and one-shot turns alike.

Chosen by measurement: 24 questions with known answers (`tests/data/spoken_questions.txt`), asked of the
default model with greedy decoding under six candidate instructions, scored by whether the answer holds
the expected word. These got 21 of 24; the former call instructions, which asked for "one to three short
sentences of plain text, without lists or markdown", got 18 (answering "What is the capital of Italy?"
in mangled Italian), and no system message at all 15. Short and plain suits a 135M model best.
"""

DEFAULT_INSTRUCTIONS = ("You are a helpful voice assistant. Your answers are spoken aloud, so keep them to one "
                        "or two short, plain sentences.")


def build_messages(user_text: str, system_prompt: str = DEFAULT_INSTRUCTIONS) -> list[dict[str, str]]:
    """The chat for one question. An empty system prompt sends no system message at all, so the prompt
    is exactly the model's chat template over the user's words (with whatever default it supplies)."""
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return [*messages, {"role": "user", "content": user_text}]
