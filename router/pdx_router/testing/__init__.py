"""Fake engines that speak vLLM's P/D protocol payloads, for tests and the benchmark."""
