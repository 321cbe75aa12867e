"""What the tests share: fake models and engines, a scripted call, helpers to drive a server."""
