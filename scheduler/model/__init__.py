"""The model the engine runs: the lean forward (`llama`), its runner over the paged KV pool, weight quantization,
the device and the KV cache's dtype."""
