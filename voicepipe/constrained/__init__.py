"""Constrained decoding on the call layer's side: function calls (tools) and structured outputs (response formats),
written so a call or an answer is always well formed."""
