"""OpenAI-compatible HTTP server over the speculative decoding engine (``verispec serve``)."""
