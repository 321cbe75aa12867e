"""Grammars: the token masks a constrained request samples through, compiled in a worker process under a budget and
cached by their text, and the limits on a schema checked before compiling."""
