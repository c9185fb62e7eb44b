"""The decoding loop (specui/engine.py) and replaying its stored steps (specui/replay.py)."""
